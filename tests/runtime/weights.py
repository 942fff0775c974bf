#!/usr/bin/env python3
"""Weights in and out (spindle-run --init, --init-map, --export,
--export-dtype; README "Weights in and out"), checked without Spindle's
code (struct and json only):

  * an export after 2 steps is a standard safetensors file (framing as in
    ckpt_format.py, tensors named component.layer.tensor, __metadata__
    with format, model, step, dtype) whose data is, bit for bit, the
    --dump-params of the same run in canonical order;
  * --init of that export, then --steps 0 --export, on 1 and on 2 ranks,
    gives the same tensors byte for byte (export then init is exact);
  * --export-dtype bf16 holds the fp32 values rounded to nearest even, and
    loads back as exactly those values;
  * a file written here (F16 tensors under other names, one extra tensor
    mapped to null) loads through a rename map, as the F16 values;
  * a wrong shape, a missing tensor, an unknown name, a truncated file, a
    map naming a tensor the model lacks, and a file that is no safetensors
    at all each stop the run with exit status 2 before step 1, one message
    naming the file and the tensor (2 ranks: reported once);
  * a plan with a component no task uses (issue 19 item 7) trains, saves a
    checkpoint without it, resumes from it, and exports without it;
  * a model with a cross-attention decoder (issue 20; equivalence.py's
    random workload 1 with its encoder-decoder task, memory width 12 on a
    hidden of 8): the export holds each decoder layer's cross-attention
    tensors (lnc_g, lnc_b, w_q, b_q, w_kv [W, 2h], b_kv, w_oc, b_oc) with
    layers.h's shapes, its data is the run's --dump-params; --init of it
    then --export on another plan gives it back byte for byte; the
    checkpoint saved with it (2 ranks) holds them with their AdamW state,
    and loaded on 1 rank exports the same bytes.
"""
import json
import math
import os
import struct
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402


def write_safetensors(path, tensors, meta=None):
    """A minimal writer: tensors is a list of (name, dtype, shape, raw bytes)."""
    header, blobs, o = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [o, o + len(raw)]}
        blobs.append(raw)
        o += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    header, data = R.read_safetensors(path)
    meta = header.pop("__metadata__", {})
    out = {k: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
           for k, t in header.items()}
    return meta, out, header


def data_in_order(header, data_of):
    return b"".join(data_of[k][2] for k in sorted(header, key=lambda k: header[k]
                                                   ["data_offsets"][0]))


def dump_bytes(path):
    b = open(path, "rb").read()
    o, out = 8, []
    while o < len(b):
        _, _, n = struct.unpack_from("<iiq", b, o)
        out.append(b[o + 16:o + 16 + 4 * n])
        o += 16 + 4 * n
    return b"".join(out)


def bf16_round(raw):
    """fp32 bytes -> the BF16 bytes of round-to-nearest-even (no NaN here)."""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        out += struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return bytes(out)


def bf16_to_f32(raw):
    return b"".join(struct.pack("<I", h << 16) for (h,) in struct.iter_unpack("<H", raw))


def f16_bytes(raw):
    return b"".join(struct.pack("<e", v) for (v,) in struct.iter_unpack("<f", raw))


def f16_to_f32(raw):
    return b"".join(struct.pack("<f", v) for (v,) in struct.iter_unpack("<e", raw))


def round_trip(F, tmp, p1, p2):
    a, dump = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "a.dump")
    R.must(R.run(p1, 1, "--quiet", "--steps", 2, "--export", a, "--dump-params", dump),
           "training with --export")
    meta, ta, ha = tensors(a)
    F.check(meta == {"format": "spindle.weights/1", "model": "demo", "step": "2",
                     "dtype": "F32"}, "export: __metadata__", repr(meta))
    model = R.demo_model()
    comps = [c for c, v in model["components"].items() if v["type"] != "contrastive"]
    names_ok = all(k.split(".")[0] in comps and k.split(".")[1].isdigit() for k in ta)
    F.check(names_ok and "img_patch.0.w" in ta and all(t[0] == "F32" for t in ta.values()),
            "export: F32 tensors named component.layer.tensor", repr(sorted(ta)[:6]))
    F.check(data_in_order(ha, ta) == dump_bytes(dump),
            "export: the data is the run's --dump-params, bit for bit")
    for ranks, plan in ((1, p1), (2, p2)):
        b = os.path.join(tmp, f"b{ranks}.safetensors")
        r = R.run(plan, ranks, "--quiet", "--steps", 0, "--init", a, "--export", b)
        if not F.check(r.rc == 0, f"--init then --export on {ranks} rank(s)", r.describe()):
            continue
        _, tb, _ = tensors(b)
        F.check(tb == ta, f"... gives the same tensors byte for byte ({ranks} rank(s))")
    return a, ta


def bf16(F, tmp, p1, a, ta):
    h = os.path.join(tmp, "h.safetensors")
    R.must(R.run(p1, 1, "--quiet", "--steps", 0, "--init", a, "--export", h,
                 "--export-dtype", "bf16"), "--export-dtype bf16")
    meta, th, _ = tensors(h)
    want = {k: ("BF16", s, bf16_round(raw)) for k, (_, s, raw) in ta.items()}
    F.check(meta.get("dtype") == "BF16" and th == want,
            "bf16 export: the fp32 values rounded to nearest even")
    g = os.path.join(tmp, "g.safetensors")
    R.must(R.run(p1, 1, "--quiet", "--steps", 0, "--init", h, "--export", g),
           "--init of a BF16 file")
    _, tg, _ = tensors(g)
    F.check(tg == {k: ("F32", s, bf16_to_f32(raw)) for k, (_, s, raw) in th.items()},
            "... loads back as exactly the BF16 values")


def python_file(F, tmp, p1, ta):
    f = os.path.join(tmp, "their.safetensors")
    items = [("model." + k.replace(".", "/"), "F16", s, f16_bytes(raw))
             for k, (_, s, raw) in sorted(ta.items())]
    items.append(("optimizer.step", "F32", [1], struct.pack("<f", 7.0)))
    write_safetensors(f, items, {"source": "a test"})
    m = os.path.join(tmp, "map.json")
    rename = {"model." + k.replace(".", "/"): k for k in ta}
    rename["optimizer.step"] = None
    json.dump(rename, open(m, "w"))
    out = os.path.join(tmp, "from-their.safetensors")
    r = R.run(p1, 1, "--quiet", "--steps", 0, "--init", f, "--init-map", m, "--export", out)
    if F.check(r.rc == 0, "a file written in Python (F16, other names) loads through a map",
               r.describe()):
        _, to, _ = tensors(out)
        F.check(to == {k: ("F32", s, f16_to_f32(f16_bytes(raw))) for k, (_, s, raw)
                       in ta.items()}, "... as exactly its F16 values")
    return f, m


def bad_files(F, tmp, p1, p2, a, ta, their, their_map):
    def variant(name, fn):
        items = [(k, dt, s, raw) for k, (dt, s, raw) in sorted(ta.items())]
        path = os.path.join(tmp, name)
        write_safetensors(path, fn(items))
        return path

    shape = variant("shape.safetensors", lambda it: [
        (k, dt, [s[0] + 1] + s[1:] if k == "img_patch.0.b" else s,
         raw + b"\0" * 4 * (math.prod(s[1:]) if k == "img_patch.0.b" else 0))
        for k, dt, s, raw in it])
    missing = variant("missing.safetensors",
                      lambda it: [x for x in it if x[0] != "img_enc.1.w_qkv"])
    unknown = variant("unknown.safetensors",
                      lambda it: it + [("img_enc.9.w_qkv", "F32", [1], b"\0" * 4)])
    trunc = os.path.join(tmp, "trunc.safetensors")
    open(trunc, "wb").write(open(a, "rb").read()[:-100])
    junk = os.path.join(tmp, "junk.safetensors")
    open(junk, "wb").write(b"\xff" * 64)
    bad_map = os.path.join(tmp, "badmap.json")
    m = json.load(open(their_map))
    m["model.img_patch/0/b"] = "img_patch.0.bias"
    json.dump(m, open(bad_map, "w"))
    dup = os.path.join(tmp, "dup.safetensors")  # one name twice: json.dumps can't
    write_safetensors(dup, [(k, dt, s, raw) for k, (dt, s, raw) in sorted(ta.items())])
    b = open(dup, "rb").read()
    hl = struct.unpack_from("<Q", b)[0]
    h = b[8:8 + hl].rstrip()
    entry = json.dumps(dict(json.loads(h)["img_patch.0.b"]))
    h = h[:-1] + b', "img_patch.0.b": ' + entry.encode() + b"}"
    h += b" " * (-len(h) % 8)
    open(dup, "wb").write(struct.pack("<Q", len(h)) + h + b[8 + hl:])
    meta = os.path.join(tmp, "meta.safetensors")
    write_safetensors(meta, [(k, dt, s, raw) for k, (dt, s, raw) in sorted(ta.items())],
                      {"step": 2})
    dup_map = os.path.join(tmp, "dupmap.json")
    open(dup_map, "w").write('{"img_patch.0.b": "img_patch.0.b", "img_patch.0.b": null}')
    cases = [
        ("a tensor named twice", [dup], ["dup.safetensors", "duplicate", "'\"img_patch.0.b\"'"]),
        ("__metadata__ of a number", [meta], ["meta.safetensors", "__metadata__"]),
        ("a map naming a tensor twice", [a, "--init-map", dup_map],
         ["dupmap.json", "duplicate", "'\"img_patch.0.b\"'"]),
        ("a map that is a directory", [a, "--init-map", tmp], [tmp, "is a directory"]),
        ("a wrong shape", [shape], ["shape.safetensors", "'img_patch.0.b'", "has shape"]),
        ("a missing tensor", [missing], ["missing.safetensors", "'img_enc.1.w_qkv' is missing"]),
        ("an unknown name", [unknown], ["unknown.safetensors", "'img_enc.9.w_qkv'",
                                        "not one of the model's"]),
        ("a truncated file", [trunc], ["trunc.safetensors", "tensor '", "truncated"]),
        ("no safetensors file", [junk], ["junk.safetensors", "not a safetensors file"]),
        ("a map naming a tensor the model lacks", [their, "--init-map", bad_map],
         ["badmap.json", "'model.img_patch/0/b'", "'img_patch.0.bias'"]),
    ]
    for what, args, texts in cases:
        for ranks, plan in ((1, p1),) + (((2, p2),) if what == "a wrong shape" else ()):
            r = R.run(plan, ranks, "--steps", 1, "--init", *args, "--timeout", 30)
            first = r.err.splitlines()[0] if r.err else ""
            ok = (r.rc == 2 and all(t in first for t in texts) and "step   1" not in r.out
                  and r.err.count(texts[0]) == 1)
            F.check(ok, f"{what} ({ranks} rank(s)): exit 2 before step 1, file and tensor "
                    "named once", r.describe())


def bad_export(F, tmp, p1):
    """--export onto a directory (or a name ending in '/', or nothing):
    refused before step 1, not after the last one."""
    d = os.path.join(tmp, "export-dir")
    os.makedirs(d, exist_ok=True)
    for path in (d, os.path.join(tmp, "nowhere") + "/", ""):
        r = R.run(p1, 1, "--steps", 1, "--export", path, "--timeout", 30)
        want = "directory" if path else "is empty"
        F.check(r.rc == 2 and "step   1" not in r.out and want in r.err,
                f"--export '{path}': exit 2 before step 1", r.describe())


def unused_component(F, tmp):
    model = R.demo_model()
    model["components"]["spare"] = {"type": "linear", "in": 8, "out": 8}
    p2 = R.make_plan(tmp, model, "spare", 2)
    ck, e = os.path.join(tmp, "ck-spare"), os.path.join(tmp, "spare.safetensors")
    r = R.run(p2, 2, "--quiet", "--steps", 2, "--save", ck, "--export", e)
    if not F.check(r.rc == 0, "a plan with an unused component trains, saves and exports",
                   r.describe()):
        return
    _, te, _ = tensors(e)
    F.check(not any(k.startswith("spare.") for k in te) and "img_patch.0.w" in te,
            "... its export leaves the unused component out")
    snap = R.latest_snapshot(ck)
    F.check(not os.path.exists(os.path.join(snap, "spare.safetensors")),
            "... and so does its checkpoint")
    r = R.run(p2, 2, "--quiet", "--steps", 1, "--load", ck)
    F.check(r.rc == 0, "... which it resumes from", r.describe())
    r = R.run(p2, 2, "--quiet", "--steps", 0, "--init", e)
    F.check(r.rc == 0, "... and its export loads back", r.describe())


def decoder(F, tmp):
    model = R.equivalence.random_workload(1, optimizer=R.ADAMW, with_decoder=True)
    dec = model["components"]["xdec"]
    h, w, f = dec["hidden"], dec.get("memory_width", dec["hidden"]), dec["ffn"]
    p1, p2 = R.make_plan(tmp, model, "xd", 1), R.make_plan(tmp, model, "xd", 2)
    a, dump = os.path.join(tmp, "xd-a.safetensors"), os.path.join(tmp, "xd-a.dump")
    ck = os.path.join(tmp, "ck-xd")
    r = R.run(p2, 2, "--quiet", "--steps", 2, "--export", a, "--dump-params", dump,
              "--save", ck)
    if not F.check(r.rc == 0, "decoder model: 2 ranks train, export and save", r.describe()):
        return
    _, ta, ha = tensors(a)
    want = {"ln1_g": [h], "w_qkv": [h, 3 * h], "w_2": [f, h], "lnc_g": [h], "lnc_b": [h],
            "w_q": [h, h], "b_q": [h], "w_kv": [w, 2 * h], "b_kv": [2 * h],
            "w_oc": [h, h], "b_oc": [h]}
    got = {k: ta.get(f"xdec.{ly}.{k}", (None, None))[1]
           for ly in range(dec["layers"]) for k in want}
    F.check(all(ta.get(f"xdec.{ly}.{k}", (None, None))[1] == s
                for ly in range(dec["layers"]) for k, s in want.items())
            and len([k for k in ta if k.startswith("xdec.0.")]) == 20,
            f"decoder export: the 20 tensors of each of {dec['layers']} layer(s), "
            f"cross-attention ones with W = {w}, h = {h}", repr(got))
    F.check(data_in_order(ha, ta) == dump_bytes(dump),
            "... its data is the run's --dump-params, bit for bit")
    b = os.path.join(tmp, "xd-b.safetensors")
    r = R.run(p1, 1, "--quiet", "--steps", 0, "--init", a, "--export", b)
    if F.check(r.rc == 0, "decoder: --init of the 2-rank export on 1 rank", r.describe()):
        F.check(tensors(b)[1] == ta, "... exports the same tensors byte for byte")
    header, _ = R.read_safetensors(os.path.join(R.latest_snapshot(ck), "xdec.safetensors"))
    F.check(all(f"l0.{k}{s}" in header for k in ("w_kv", "b_oc", "lnc_g")
                for s in ("", ".adam_m", ".adam_v")),
            "decoder checkpoint: xdec.safetensors holds the cross-attention tensors and "
            "their AdamW state", repr(sorted(header)[:8]))
    c = os.path.join(tmp, "xd-c.safetensors")
    r = R.run(p1, 1, "--quiet", "--steps", 0, "--load", ck, "--export", c)
    if F.check(r.rc == 0, "decoder: the 2-rank checkpoint loads on 1 rank", r.describe()):
        F.check(tensors(c)[1] == ta, "... and exports the same tensors byte for byte")


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        p1 = R.make_plan(tmp, R.demo_model(), "demo", 1)
        p2 = R.make_plan(tmp, R.demo_model(), "demo", 2)
        a, ta = round_trip(F, tmp, p1, p2)
        bf16(F, tmp, p1, a, ta)
        their, their_map = python_file(F, tmp, p1, ta)
        bad_files(F, tmp, p1, p2, a, ta, their, their_map)
        bad_export(F, tmp, p1)
        unused_component(F, tmp)
        decoder(F, tmp)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
