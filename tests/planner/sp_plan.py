#!/usr/bin/env python3
"""--sp on (sequence parallelism, issue 18): QWen-VAL on 64 A800 (the
bundled a800-8x8 cluster) with --algo sequential --tp 2, planned with
--sp off and --sp on (one schedule either way: sequential has a single
candidate, and sp is decided after the degrees). Asserts:

  * sp 1 exactly on the split (tp > 1) transformer slices whose seq the
    degree divides, and on some;
  * every device's predicted activations (mem[acts] of its plan record,
    bytes) fall by exactly what this file's own formula says, summed over
    the device's FWDs of sequence-parallel slices: layers x samples x
    (saved per sample of a plain shard - of a sequence-parallel one) x
    dtype bytes, the shard's 4 s h + 4 s + (4 s h + 2 s f + a s^2) / t and
    the sequence-parallel one's 2 s h + (s / t)(2 h + 4) + s (4 h + 2 f) / t
    + (a / t) s^2 (runtime/layers_sp.c's layout), and the others' stay;
  * --sp auto plans too (exit 0: verified).
Environment: SPINDLE_PLAN, SPINDLE_SHOW, SPINDLE_ROOT (test_env). Exit 0
pass, 1 fail.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]
SHOW = os.environ["SPINDLE_SHOW"]
MODEL = os.path.join(ROOT, "plans", "qwen-val", "model.json")
CLUSTER = os.path.join(ROOT, "plans", "clusters", "a800-8x8.json")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def plan(tmp, sp):
    out = os.path.join(tmp, f"sp-{sp}.bin")
    r = subprocess.run([PLAN, MODEL, CLUSTER, "--algo", "sequential", "--tp", "2", "--sp", sp,
                        "-o", out], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"FAIL --sp {sp}: exit {r.returncode}\n{r.stderr}")
    v = subprocess.run([SHOW, out, "--json", "--programs"], capture_output=True, text=True,
                       timeout=120, check=True)
    return out, json.loads(v.stdout)


def device_acts(path):
    """mem[acts] (bytes) of every device record (section 17, 96-byte
    records, mem[acts] at 32)."""
    b = open(path, "rb").read()
    hs, n = struct.unpack_from("<I", b, 16)[0], struct.unpack_from("<I", b, 28)[0]
    for i in range(n):
        sid, _, off, _, cnt = struct.unpack_from("<IIQQQ", b, hs + 40 * i)
        if sid == 17:
            return [struct.unpack_from("<q", b, off + 96 * k + 32)[0] for k in range(cnt)]
    raise SystemExit("FAIL no devices section")


def shapes(model):
    """MetaOp name -> (type, seq, hidden, heads, ffn) of its first node."""
    out = {}
    for t in model["tasks"]:
        for n in t["graph"]:
            c = model["components"][n["component"]]
            out[f"{t['name']}/{n['id']}"] = (c["type"], n.get("seq", 0), c.get("hidden", 0),
                                              c.get("heads", 0), c.get("ffn", 0))
    return out


def first_node(metaop):
    return metaop.split("..")[0]


def saved(shape, t, sp):
    _, s, h, a, f = shape
    if sp:
        return 2 * s * h + (s // t) * (2 * h + 4) + s * (4 * (h // t) + 2 * (f // t)) + \
            (a // t) * s * s
    return 4 * s * h + 4 * s + (4 * s * h + 2 * s * f + a * s * s) // t


def main():
    model = json.load(open(MODEL))
    sh = shapes(model)
    db = DTYPE_BYTES[model.get("dtype", "bf16")]
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        p_off, v_off = plan(tmp, "off")
        p_on, v_on = plan(tmp, "on")
        plan(tmp, "auto")
        slices = [s for w in v_on["waves"] for s in w["slices"]]
        n_sp = 0
        for s in slices:
            ty, seq = sh[first_node(s["metaop"])][:2]
            want = int(s["tp"] > 1 and ty == "transformer" and seq % s["tp"] == 0)
            n_sp += s["sp"]
            if s["sp"] != want:
                fails.append(f"slice {s['metaop']} layers {s['layers']} tp {s['tp']}: sp "
                             f"{s['sp']}, want {want}")
        if n_sp == 0:
            fails.append("no slice is sequence parallel")
        if [(s["metaop"], s["layers"], s["devices"], s["tp"]) for s in slices] != \
                [(s["metaop"], s["layers"], s["devices"], s["tp"])
                 for w in v_off["waves"] for s in w["slices"]]:
            fails.append("--sp on changed the schedule: the memory check needs the same one")
        spset = {(s["metaop"], tuple(s["layers"]), d): s["tp"] for s in slices if s["sp"]
                 for d in s["devices"]}
        a_off, a_on = device_acts(p_off), device_acts(p_on)
        for dv in v_on["devices"]:
            d = dv["device"]
            want = 0
            for ins in dv["program"]:
                key = (ins.get("metaop"), tuple(ins.get("layers", ())), d)
                if ins["op"] != "fwd" or key not in spset:
                    continue
                t, shp = spset[key], sh[first_node(ins["metaop"])]
                n = ins["samples"][1] - ins["samples"][0]
                L = ins["layers"][1] - ins["layers"][0]
                want += L * n * (saved(shp, t, 0) - saved(shp, t, 1)) * db
            if a_off[d] - a_on[d] != want:
                fails.append(f"device {d}: activations {a_off[d]} -> {a_on[d]} bytes, "
                             f"saving {a_off[d] - a_on[d]}, want {want}")
        print(f"{n_sp} of {sum(s['tp'] > 1 for s in slices)} split slices sequence parallel; "
              f"activations of all devices {sum(a_off) / 2**30:.3f} -> {sum(a_on) / 2**30:.3f} "
              f"GiB, busiest {max(a_off) / 2**30:.3f} -> {max(a_on) / 2**30:.3f} GiB")
    for f in fails[:10]:
        print("FAIL " + f)
    print(f"{len(fails)} failure(s)" if fails else "all passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
