#!/usr/bin/env python3
"""Checkpoint files are what they claim to be, read without Spindle's code:

  * every <component>.safetensors follows the safetensors layout (8-byte
    little-endian header length, a JSON header starting with '{' and padded
    with spaces only, __metadata__ mapping strings to strings, dtype F32,
    shape * 4 == data_offsets[1] - data_offsets[0], offsets relative to the
    data start, tensors contiguous without holes or overlaps and covering
    the data exactly);
  * its tensors, unpacked with struct (no numpy), equal --dump-params of the
    same run bit for bit: a layer's weight tensors, in data order, are its
    record in the dump; AdamW runs also hold .adam_m and .adam_v of every
    tensor;
  * manifest.json: each file's size and CRC-32 (zlib) match, and
    manifest_crc32 is the CRC-32 of the compact key-sorted JSON of the
    manifest without that member; LATEST names the snapshot, and no
    temporary file is left.
"""
import json
import math
import os
import struct
import sys
import tempfile
import zlib

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402


def check_file(F, path, comp_index, dump, adam):
    name = os.path.basename(path)
    try:
        header, data = R.read_safetensors(path)
    except (AssertionError, ValueError) as e:
        F.check(False, f"{name}: safetensors framing", str(e))
        return
    meta = header.pop("__metadata__", {})
    F.check(all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()),
            f"{name}: __metadata__ maps strings to strings")
    spans, problems = [], []
    for key, t in header.items():
        if t.get("dtype") != "F32":
            problems.append(f"{key}: dtype {t.get('dtype')}")
            continue
        a, b = t["data_offsets"]
        if b - a != 4 * math.prod(t["shape"]):
            problems.append(f"{key}: shape {t['shape']} vs {b - a} bytes")
        spans.append((a, b, key))
    spans.sort()
    pos = 0
    for a, b, key in spans:
        if a != pos:
            problems.append(f"{key}: starts at {a}, expected {pos} (hole or overlap)")
        pos = b
    if pos != len(data):
        problems.append(f"tensors end at {pos} of {len(data)} data bytes")
    F.check(not problems, f"{name}: dtypes, shapes and offsets are valid safetensors",
            "\n".join(problems[:5]))

    # weights of layer l, in data order, equal the dump's record (comp, l)
    layers = sorted({int(k.split(".")[0][1:]) for k in header})
    mismatch = []
    for layer in layers:
        mine = sorted((t["data_offsets"][0], t["data_offsets"][1], k) for k, t in header.items()
                      if k.startswith(f"l{layer}.") and not k.endswith((".adam_m", ".adam_v")))
        vals = []
        for a, b, _ in mine:
            vals.extend(struct.unpack_from("<%df" % ((b - a) // 4), data, a))
        want = dump.get((comp_index, layer))
        if want is None or tuple(vals) != tuple(want):
            mismatch.append(f"layer {layer}: {len(vals)} floats, dump has "
                            f"{None if want is None else len(want)}")
        if adam:
            for _, _, k in mine:
                for sfx in (".adam_m", ".adam_v"):
                    if k + sfx not in header or header[k + sfx]["shape"] != header[k]["shape"]:
                        mismatch.append(f"{k}{sfx} missing or of another shape")
    F.check(bool(layers) and not mismatch,
            f"{name}: {len(layers)} layer(s) equal --dump-params bit for bit"
            + (" (with AdamW m and v)" if adam else ""), "\n".join(mismatch[:5]))


def check_run(F, tmp, opt, ranks):
    kind = opt["type"]
    model = R.demo_model(opt)
    plan = R.make_plan(tmp, model, f"fmt-{kind}", ranks)
    ck, dump = os.path.join(tmp, f"ck-{kind}"), os.path.join(tmp, f"{kind}.dump")
    R.must(R.run(plan, ranks, "--quiet", "--timeout", "60", "--steps", 3, "--save", ck,
                 "--dump-params", dump), f"{kind} run")
    F.check(sorted(os.listdir(ck)) == ["LATEST", "step-00000003"],
            f"{kind}: the checkpoint directory holds LATEST and step-00000003 only",
            str(sorted(os.listdir(ck))))
    snap = R.latest_snapshot(ck)
    man = json.load(open(os.path.join(snap, "manifest.json")))
    rest = {k: v for k, v in man.items() if k != "manifest_crc32"}
    canon = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    F.check(man.get("manifest_crc32") == "%08x" % zlib.crc32(canon.encode()),
            f"{kind}: manifest_crc32 is the CRC-32 of the canonical manifest")
    F.check(man["step"] == 3 and man["data_position"] == 4 and man["seed"] == model["seed"]
            and man["optimizer"] == kind and man["format"] == "spindle.checkpoint/1",
            f"{kind}: manifest step 3, data position 4, seed, optimizer, format")
    comps = [c for c, v in model["components"].items() if v["type"] != "contrastive"]
    F.check(sorted(f["component"] for f in man["files"]) == sorted(comps),
            f"{kind}: one file per component with parameters")
    bad = []
    for f in man["files"]:
        b = open(os.path.join(snap, f["file"]), "rb").read()
        if len(b) != f["bytes"] or "%08x" % zlib.crc32(b) != f["crc32"]:
            bad.append(f["file"])
    F.check(not bad, f"{kind}: sizes and CRC-32s in the manifest match the files", str(bad))
    d = R.load_dump(dump)
    index = {c: i for i, c in enumerate(model["components"])}
    for f in man["files"]:
        check_file(F, os.path.join(snap, f["file"]), index[f["component"]], d,
                   kind == "adamw")


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        check_run(F, tmp, R.ADAMW, 3)
        check_run(F, tmp, R.SGD, 1)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
