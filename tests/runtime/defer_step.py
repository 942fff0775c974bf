#!/usr/bin/env python3
"""The waits for deferred all-gather pieces that no layer reads before the
STEP (runtime/defer.c; PLAN-FORMAT.md, bucket defer: "at the latest at
its STEP"), which no planned plan exercises: each member of a planner's
bucket runs each of its layers in every step, so each piece is waited
for before its first layer. Usage: defer_step.py DEFER_MEMBER (the
helper tests/runtime/defer_member.c; meson passes it).

The demo with an image encoder of 8 layers shared by its three tasks (3,
5 and 8 of them run) is planned on 4 ranks with zero-1 and zero-2 and
deferred all-gathers; defer-member then makes device 0 a member of a
deferred bucket of other devices, cut into a piece per layer (2 or more):
device 0 holds the bucket's params and a shard of their optimizer state
and runs none of its layers, so its only waits for those pieces are its
next STEP's (before the update writes its part of them) and the landing
before an export and at the end. Its gradients of them are zero, so
every result is the original plan's. Per layout, 3 steps, unlogged (no
per-step digest, which would land the pieces between steps):
  * with --check-deferred (the whole bucket, the rank's own part too, NaN
    until a piece's wait: a STEP without its wait updates NaN), the
    parameters bit-identical to the original plan's run;
  * rank 0's deferred pieces each land exactly once: those completed in
    a later step plus those at the end equal steps x pieces (a STEP
    without its wait would start a piece still in flight);
  * with --check-deferred and --export alone (no dump, no log, no
    checkpoint: the landing at the end of the run is the only one
    before the export), the exported tensors are the dump's, bit for bit;
  * without --check-deferred, the parameters of the run with it.
"""
import copy
import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402
import weights  # noqa: E402  (its safetensors and dump readers)

STEPS = 3
RANKS = 4


def model():
    """The demo, its image encoder 8 layers deep, run whole by classify and
    in part by match ([0, 3)) and caption ([0, 5))."""
    m = R.demo_model()
    m["components"]["img_enc"]["layers"] = 8
    for t in m["tasks"]:
        for n in t["graph"]:
            if n["component"] == "img_enc" and t["name"] in ("match", "caption"):
                n["layers"] = [0, 3] if t["name"] == "match" else [0, 5]
    return m


def pieces_line(text):
    """(completed in a later step, at the end, pieces) of rank 0's line."""
    m = re.search(r"rank 0 deferred all-gathers: (\d+) completed in the next step, (\d+) "
                  r"before .*\(pieces; \d+ buckets in (\d+) pieces\)", text)
    return tuple(int(x) for x in m.groups()) if m else None


def finite(dump):
    return all(x == x for v in dump.values() for x in v)  # NaN != NaN


def case(F, tmp, helper, z):
    what = f"zero-{z} on {RANKS} ranks"
    orig = R.make_plan(tmp, copy.deepcopy(model()), f"z{z}", RANKS,
                       extra=("--zero", z, "--defer-gather", "on", "--microbatches", "2"))
    plan = os.path.join(tmp, f"z{z}.member.bin")
    h = subprocess.run([helper, orig, plan], capture_output=True, text=True, timeout=60)
    m = re.match(r"bucket (\d+): (\d+) pieces, device 0 added", h.stdout)
    if not F.check(h.returncode == 0 and m and int(m.group(2)) >= 2,
                   f"{what}: device 0 joins a deferred bucket of several pieces",
                   h.stdout + h.stderr):
        return
    what += f" (device 0 in bucket {m.group(1)}, {m.group(2)} pieces, none of whose layers " \
            "it runs)"
    out = {}
    for tag, p, args in (("orig", orig, ("--check-deferred", "--dump-params")),
                         ("checked", plan, ("--check-deferred", "--dump-params")),
                         ("export", plan, ("--check-deferred", "--export")),
                         ("plain", plan, ("--dump-params",))):
        whose = "the original plan" if p == orig else "device 0's plan"
        path = os.path.join(tmp, f"z{z}.{tag}." + ("safetensors" if "--export" in args
                                                   else "dump"))
        r = R.run(p, RANKS, "--steps", STEPS, "--timeout", 60, *args, path)
        out[tag] = (r, path)
        if not F.check(r.rc == 0, f"{what}: spindle-run {' '.join(args)} on {whose} runs",
                       r.describe()):
            return
    ref, got = R.load_dump(out["orig"][1]), R.load_dump(out["checked"][1])
    F.check(finite(got) and got == ref,
            f"{what}, --check-deferred: the parameters are the original plan's, bit for bit",
            "NaN in them (a piece used or updated before its wait)" if not finite(got) else
            f"{sum(a != b for k in ref for a, b in zip(ref[k], got.get(k, ())))} values differ")
    counts = pieces_line(out["checked"][0].out)
    F.check(counts is not None and counts[0] + counts[1] == STEPS * counts[2],
            f"{what}: rank 0's deferred pieces each land once (later + at the end = "
            f"{STEPS} steps x pieces)",
            f"got {counts} (later, at the end, pieces)")
    _, ta, ha = weights.tensors(out["export"][1])
    F.check(weights.data_in_order(ha, ta) == weights.dump_bytes(out["checked"][1]),
            f"{what}, --check-deferred --export alone: the export is the dump, bit for bit",
            "the export differs (NaN: a piece not landed before the export)")
    F.check(R.load_dump(out["plain"][1]) == got,
            f"{what}: without --check-deferred the parameters of the run with it")


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        for z in ("1", "2"):
            case(F, tmp, sys.argv[1], z)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
