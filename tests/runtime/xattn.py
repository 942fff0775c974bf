#!/usr/bin/env python3
"""Cross-attention decoders end to end on one device (issue 20): the
gradient that reaches the encoder through the decoder's memory is the
loss's, by finite differences of spindle-run's own losses.

equivalence.py shows that N ranks equal one device, which a mistake made
the same way on one device (a memory gradient never added, never sent
back, or sent to the wrong value) would pass. Here the model is one
captioning task alone (equivalence.add_decoder: patch -> encoder -> linear
projection to width 12 -> the memory of a causal decoder of hidden 8 ->
LM head), so the encoder and the projection learn only through the
memory. Under SGD with lr 1 and no weight decay one step moves each
weight by minus its gradient g (of weight x the task's mean loss); for
the weight of largest |g| in the encoder's w_qkv, the projection's w and
the decoder's w_kv, the central difference of the step-1 loss (the loss
before the update, from --init files with that weight moved by +-eps)
must match g within 1% (fp32 losses printed to 9 digits; eps 0.05 makes
the difference ~1e-4, 300x the rounding). Also 2 micro-batches: the same
gradients (SGD, means over samples: accumulation is exact up to order).

On a dataset (dataset_gen: tokens and features, some samples padded),
2 ranks (the paper's plan, which moves the memory between devices) train to the one-device
parameters and losses (equivalence.py's SGD tolerance) and --eval scores
the held-out loss of the same samples the same way (relative 1e-5).

A plan whose decoder's memory disagrees with the model (mem_seq one more
than the memory node's seq, the checksum made right again) is refused
before step 1 with exit status 2, naming the memory.
"""
import json
import os
import struct
import sys
import tempfile
import zlib

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import dataset_gen as DG  # noqa: E402
import rtlib as R  # noqa: E402
import weights as WT  # noqa: E402

EPS = 0.01
TOL = 0.01
SCALE = 8.0


def caption_model():
    m = {"format": "spindle.model/1", "name": "caption", "dtype": "fp32",
         "optimizer": {"type": "sgd", "lr": 1.0, "weight_decay": 0.0}, "seed": 3,
         "components": {"txt_embed": {"type": "embedding", "vocab": 16, "hidden": 8,
                                      "max_seq": 8}},
         "tasks": []}
    m = R.equivalence.add_decoder(m, 1)
    assert "mem_proj" in m["components"], "seed 1 no longer projects the memory"
    return m


def floats(raw):
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


def step1_loss(p1, tmp, init, tag):
    log = os.path.join(tmp, f"{tag}.csv")
    R.must(R.run(p1, 1, "--quiet", "--steps", 1, "--init", init, "--log", log), tag)
    rows = R.read_log(log)
    assert len(rows) == 1, rows
    return float(rows[0]["loss"])


def start_weights(plan, tmp):
    """The plan's initial weights with every matrix scaled by SCALE: at
    spindle's small initialisation the cross-attention is nearly uniform and
    the gradients reaching the encoder (~1e-5) are too small to difference
    against fp32 losses."""
    a = os.path.join(tmp, "init.safetensors")
    R.must(R.run(plan, 1, "--quiet", "--steps", 0, "--export", a), "export of the start")
    _, t0, _ = WT.tensors(a)
    out = []
    for k, (dt, s, raw) in sorted(t0.items()):
        if len(s) == 2 and k.split(".")[2].startswith("w"):
            raw = struct.pack("<%df" % (len(raw) // 4), *[SCALE * x for x in floats(raw)])
        out.append((k, dt, s, raw))
    w0 = os.path.join(tmp, "w0.safetensors")
    WT.write_safetensors(w0, out)
    return w0


def check_gradients(F, tmp, plan, what, extra=()):
    a, b = start_weights(plan, tmp), os.path.join(tmp, f"w1{what}.safetensors")
    R.must(R.run(plan, 1, "--quiet", "--steps", 1, "--init", a, "--export", b, *extra),
           "one SGD step")
    _, t0, _ = WT.tensors(a)
    _, t1, _ = WT.tensors(b)
    weight = caption_model()["tasks"][0]["weight"]
    for name in ("img_enc.0.w_qkv", "mem_proj.0.w", "xdec.0.w_kv"):
        w0, w1 = floats(t0[name][2]), floats(t1[name][2])
        g = [x - y for x, y in zip(w0, w1)]
        i = max(range(len(g)), key=lambda k: abs(g[k]))
        losses = []
        for sgn in (1, -1):
            moved = dict(t0)
            w = list(w0)
            w[i] += sgn * EPS
            moved[name] = ("F32", t0[name][1], struct.pack("<%df" % len(w), *w))
            path = os.path.join(tmp, f"moved{sgn}.safetensors")
            WT.write_safetensors(path, [(k, dt, s, raw) for k, (dt, s, raw)
                                        in sorted(moved.items())])
            losses.append(step1_loss(plan, tmp, path, f"fd{what}{sgn}"))
        fd = weight * (losses[0] - losses[1]) / (2 * EPS)
        ok = g[i] != 0 and abs(fd - g[i]) <= TOL * abs(g[i])
        F.check(ok, f"{what}: {name}[{i}] gradient {g[i]:.6g}, finite difference {fd:.6g}")


def wrong_memory(F, tmp, plan):
    b = bytearray(open(plan, "rb").read())
    (n_sec,) = struct.unpack_from("<I", b, 28)
    secs = [struct.unpack_from("<IIQQQ", b, 40 + 40 * k) for k in range(n_sec)]
    _, _, off, size, count = next(s for s in secs if s[0] == 8)  # metaops
    rec = size // count
    at = next(off + i * rec + 124 for i in range(count)
              if struct.unpack_from("<q", b, off + i * rec + 124)[0] > 0)
    struct.pack_into("<q", b, at, struct.unpack_from("<q", b, at)[0] + 1)
    (hsize,) = struct.unpack_from("<I", b, 16)
    struct.pack_into("<I", b, 32, zlib.crc32(bytes(b[hsize:])) & 0xFFFFFFFF)
    bad = os.path.join(tmp, "wrong-memory.bin")
    open(bad, "wb").write(bytes(b))
    r = R.run(bad, 1, "--steps", 1, "--timeout", 30)
    F.check(r.rc == 2 and "memory" in r.err and "step   1" not in r.out,
            "a plan whose decoder memory disagrees with the model: exit 2 before step 1",
            r.describe())


def dataset_and_eval(F, tmp):
    m = caption_model()
    m["optimizer"] = dict(R.SGD)
    ds = os.path.join(tmp, "ds")
    DG.make(m, ds, {m["tasks"][0]["name"]: 8 * m["tasks"][0]["batch"]})
    got = {}
    for ranks in (1, 2):
        plan = R.make_plan(tmp, m, "caption-sgd", ranks, "spindle-paper")
        dump, log = os.path.join(tmp, f"ds{ranks}.dump"), os.path.join(tmp, f"ds{ranks}.csv")
        js = os.path.join(tmp, f"ds{ranks}.json")
        r = R.run(plan, ranks, "--quiet", "--steps", 3, "--data", ds, "--eval", ds,
                  "--eval-json", js, "--dump-params", dump, "--log", log)
        if not F.check(r.rc == 0, f"decoder on a dataset, --eval: {ranks} rank(s)",
                       r.describe()):
            return
        got[ranks] = (R.load_dump(dump), R.read_log(log), json.load(open(js))["tasks"][0])
    F.check(R.equivalence.memory_moves(plan) > 0, "... the 2-rank plan moves the memory")
    err = R.compare(got[1][:2], got[2][:2], R.FLOOR["sgd"], "2 ranks against 1 on a dataset")
    F.check(err is None, "... 2 ranks train as 1 on the dataset", err or "")
    e1, e2 = got[1][2], got[2][2]
    F.check(e1["samples"] == e2["samples"] > 0 and
            abs(e1["loss"] - e2["loss"]) <= 1e-5 * abs(e1["loss"]),
            f"... and score the same held-out loss ({e1['loss']:.9g} on {e1['samples']} "
            f"samples, {e2['loss']:.9g} on {e2['samples']})")


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        m = caption_model()
        p1 = R.make_plan(tmp, m, "caption", 1)
        check_gradients(F, tmp, p1, "one device")
        wrong_memory(F, tmp, p1)
        dataset_and_eval(F, tmp)
        m["tasks"][0]["batch"] += m["tasks"][0]["batch"] % 2
        p1m = R.make_plan(tmp, m, "caption-mb2", 1, extra=("--microbatches", "2"))
        check_gradients(F, tmp, p1m, "2 micro-batches")
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
