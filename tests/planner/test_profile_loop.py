#!/usr/bin/env python3
"""The measured-cost loop, end to end: spindle-profile measures the demo's
operators on the CPU into a copy of the demo cluster, spindle-plan prices
every MetaOp from that profile (none analytic), and the plan trains for two
steps under mpirun.

Checks on the profile: one entry per distinct operator shape of the model
(computed here independently from model.json, in order of first
appearance), the cluster's other keys unchanged and in order, default
batches 1, 2, 4, ... up to min(largest batch of a task using the shape,
64), times finite and positive (losses: the whole loss call in fwd_ms and
bwd_ms 0), and "monotone-ish": no point below a quarter of an earlier one,
and transformer blocks clearly slower at their largest batch than at 1.
The bounds are loose and a profile that misses them is measured again (3
tries) because CI machines are shared: other load only ever inflates a
point, which can make a later one look like a drop.

Environment: SPINDLE_PROFILE, SPINDLE_PLAN, SPINDLE_RUN, SPINDLE_ROOT.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mpi_session  # noqa: E402

mpi_session.private()

ROOT = os.environ["SPINDLE_ROOT"]
PROFILE = os.environ["SPINDLE_PROFILE"]
PLAN = os.environ["SPINDLE_PLAN"]
RUN = os.environ["SPINDLE_RUN"]
MODEL = os.path.join(ROOT, "plans", "demo", "model.json")
CLUSTER = os.path.join(ROOT, "plans", "demo", "cluster.json")
LOSSES = {"lm_head", "classifier", "contrastive"}


def sh(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Noisy(Exception):
    """Times out of shape: on a loaded machine, worth one more measurement."""


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def check_timing(cond, msg):
    if not cond:
        raise Noisy(msg)


def out_width(c):
    return c["out"] if c["type"] == "linear" else c.get("hidden", 0)


def expected_shapes(model):
    """(op dict, largest task batch) per distinct shape, first appearance first;
    mirrors op_shape() in schemas/arith.c and the cluster schema's keys."""
    comps = model["components"]
    shapes = []
    for t in model["tasks"]:
        nodes = {n["id"]: n for n in t["graph"]}
        for n in t["graph"]:
            c = comps[n["component"]]
            ty = c["type"]
            ins = n.get("inputs", [])
            seq = n.get("seq")
            if seq is None and ins:  # loss nodes: their input's seq
                seq = nodes[ins[0]]["seq"]
            if ty == "embedding":
                op = {"type": ty, "vocab": c["vocab"], "hidden": c["hidden"], "seq": seq}
            elif ty == "patch":
                op = {"type": ty, "in": c["in"], "hidden": c["hidden"], "seq": seq}
            elif ty == "transformer":
                op = {"type": ty, "hidden": c["hidden"], "heads": c["heads"],
                      "ffn": c["ffn"], "seq": seq, "causal": bool(c.get("causal", False))}
            elif ty == "linear":
                op = {"type": ty, "in": c["in"], "out": c["out"], "seq": seq}
            elif ty == "lm_head":
                op = {"type": ty, "hidden": c["hidden"], "vocab": c["vocab"], "seq": seq}
            elif ty == "classifier":
                op = {"type": ty, "hidden": c["hidden"], "classes": c["classes"]}
            else:
                src = comps[nodes[ins[0]]["component"]]
                op = {"type": ty, "hidden": out_width(src)}
            for s in shapes:
                if s[0] == op:
                    s[1] = max(s[1], t["batch"])
                    break
            else:
                shapes.append([op, t["batch"]])
    return shapes


def check_points(op, pts, cap=None, batches=None, timing=True):
    name = json.dumps(op)
    bs = [p["batch"] for p in pts]
    check(bs == sorted(set(bs)), f"{name}: batches not strictly increasing: {bs}")
    if batches is not None:
        check(bs == batches, f"{name}: batches {bs}, expected {batches}")
    if cap is not None:
        want = sorted({b for b in [1 << i for i in range(7)] if b <= cap} | {cap})
        check(bs[:len(want)] == want, f"{name}: batches {bs}, expected {want}")
    tot = []
    for p in pts:
        check(set(p) == {"batch", "fwd_ms", "bwd_ms"}, f"{name}: point keys {sorted(p)}")
        f, b = p["fwd_ms"], p["bwd_ms"]
        check(math.isfinite(f) and 0 < f < 1000, f"{name}: fwd_ms {f} at batch {p['batch']}")
        if op["type"] in LOSSES:
            check(b == 0, f"{name}: a loss reports its whole call as fwd_ms; bwd_ms {b}")
        else:
            check(math.isfinite(b) and 0 < b < 1000,
                  f"{name}: bwd_ms {b} at batch {p['batch']}")
        tot.append(f + b)
    if not timing:
        return
    for i in range(1, len(tot)):
        check_timing(tot[i] >= 0.25 * max(tot[:i]),
              f"{name}: time drops from {max(tot[:i]):.4g} to {tot[i]:.4g} ms "
              f"at batch {bs[i]}")
    if op["type"] == "transformer" and bs[-1] >= 8 * bs[0]:
        check_timing(tot[-1] >= 1.5 * tot[0],
              f"{name}: batch {bs[-1]} ({tot[-1]:.4g} ms) not slower than batch "
              f"{bs[0]} ({tot[0]:.4g} ms)")


def profile_into(prof_cluster, cluster_in, want):
    """Profiles the demo into a copy of its cluster and checks it; returns
    the file's text. Raises Noisy when only the timings' shape is off."""
    t0 = time.monotonic()
    rc, out, err = sh([PROFILE, MODEL, "--backend", "cpu", "--cluster", CLUSTER,
                       "-o", prof_cluster])
    secs = time.monotonic() - t0
    print(out, end="")
    check(rc == 0, f"spindle-profile exit {rc}\n{err}")
    print(f"profiling took {secs:.2f} s")
    text = open(prof_cluster).read()
    got = json.loads(text)
    keys_in = [k for k in cluster_in if k != "profile"]
    check(list(got)[:len(keys_in)] == keys_in and list(got)[-1] == "profile",
          f"cluster keys {list(got)}, expected {keys_in} + profile")
    for k in keys_in:
        check(got[k] == cluster_in[k], f"cluster key {k} changed: {got[k]!r}")
    ops = [e["op"] for e in got["profile"]]
    check(ops == [w[0] for w in want],
          "profile shapes differ from the model's distinct shapes:\n"
          f"  got      {ops}\n  expected {[w[0] for w in want]}")
    for e, (op, maxb) in zip(got["profile"], want):
        check(set(e) == {"op", "points"}, f"entry keys {sorted(e)}")
        check_points(op, e["points"], cap=min(maxb, 64), timing=False)
    for num in re.findall(r'"(?:fwd|bwd)_ms": ([^,}]+)', text):
        digits = num.split("e")[0].replace("-", "").replace(".", "").lstrip("0")
        check(len(digits) <= 6,
              f"time {num} printed with more than 6 significant digits")
    for e in got["profile"]:
        check_points(e["op"], e["points"])
    return text


def main():
    model = json.load(open(MODEL))
    cluster_in = json.load(open(CLUSTER))
    want = expected_shapes(model)
    with tempfile.TemporaryDirectory() as tmp:
        # bad input: the loader's message, exit 2
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            json.dump({"format": "spindle.model/1"}, f)
        rc, out, err = sh([PROFILE, bad, "-o", os.path.join(tmp, "x.json")])
        check(rc == 2 and "bad.json" in err, f"bad model: exit {rc}, stderr {err!r}")
        check(not os.path.exists(os.path.join(tmp, "x.json")), "bad model: output written")

        # bare profile with explicit batches
        bare = os.path.join(tmp, "profile.json")
        rc, out, err = sh([PROFILE, MODEL, "--backend", "cpu", "-o", bare,
                           "--batches", "2,1", "--reps", "1", "--warmup", "0"])
        check(rc == 0, f"spindle-profile (bare) exit {rc}\n{out}{err}")
        doc = json.load(open(bare))
        check(list(doc) == ["profile"], f"bare output keys {list(doc)}")
        check([e["op"] for e in doc["profile"]] == [w[0] for w in want],
              "bare output: shapes differ from the model's")
        for e in doc["profile"]:  # one rep, no warm-up: the format only
            check_points(e["op"], e["points"], batches=[1, 2], timing=False)

        # the loop: profile into a cluster ...
        prof_cluster = os.path.join(tmp, "cluster.json")
        for attempt in range(1, 4):
            try:
                text = profile_into(prof_cluster, cluster_in, want)
                break
            except Noisy as e:
                print(f"attempt {attempt}: timings out of shape: {e}")
                check(attempt < 3, "timings out of shape in 3 profiles")
        # ... plan with it: every MetaOp priced from the profile ...
        rc, out, err = sh([PLAN, MODEL, prof_cluster, "--json"])
        check(rc == 0, f"spindle-plan --json exit {rc}\n{err}")
        rep = json.loads(out)
        algos = rep["algorithms"]
        check(len(algos) > 0, "no algorithms in the report")
        for name, a in algos.items():
            it = a["iteration_ms"]
            check(isinstance(it, (int, float)) and math.isfinite(it) and it > 0,
                  f"{name}: iteration_ms {it}")
        plan = os.path.join(tmp, "plan.bin")
        rc, out, err = sh([PLAN, MODEL, prof_cluster, "--report", "-o", plan])
        check(rc == 0, f"spindle-plan --report exit {rc}\n{err}")
        m = re.search(r"MetaOps: (\d+) \((\d+) from the cluster profile", out)
        check(m is not None, f"no MetaOps line in the report:\n{out}")
        n, k = int(m.group(1)), int(m.group(2))
        print(m.group(0) + ")")
        check(n > 0 and k == n, f"{n - k} of {n} MetaOps priced analytically")

        # ... and run it
        if not shutil.which("mpirun"):
            print("SKIP: mpirun not found; the run step needs it")
            return 77
        ranks = rep["devices"]
        rc, out, err = sh(["mpirun", "-np", str(ranks), "--oversubscribe", RUN, plan,
                           "--steps", "2", "--timeout", "120"], timeout=600)
        check(rc == 0, f"spindle-run on {ranks} ranks exit {rc}\n{out}{err}")
        print(out.strip().splitlines()[-1] if out.strip() else "(no output)")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
