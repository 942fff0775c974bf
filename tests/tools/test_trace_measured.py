#!/usr/bin/env python3
"""spindle-run --trace of a tensor-parallel plan: the demo planned with
--algo sequential --tp 2 on 2 CPU ranks (every transformer slice split in
2, the others whole), trained 2 steps. Asserts: one process per rank with
compute events; every FWD/BWD event of a split slice (tp > 1 in
spindle-show --json), and the LOSS of a split LM head, carries args
{compute_ms, tp_allreduce_ms} with both >= 0 and their sum its dur (to the
printed precision), some all-reduce time > 0; no other event carries args. Skips (77) without MPI or mpirun.
Environment: SPINDLE_PLAN, SPINDLE_RUN, SPINDLE_SHOW, SPINDLE_ROOT.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.environ.get("SPINDLE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import workloads as W  # noqa: E402
import mpi_session  # noqa: E402

mpi_session.private()


def check(cond, what):
    if not cond:
        raise SystemExit("FAIL: " + what)  # exit status 1


def main(tmp):
    cpath = W.write_json(tmp, "cluster.json", W.cluster(2))
    plan = os.path.join(tmp, "plan.bin")
    W.plan(os.path.join(ROOT, "plans", "demo", "model.json"), cpath, plan,
           algo="sequential", extra=("--tp", "2"))
    view = json.loads(subprocess.run([os.environ["SPINDLE_SHOW"], plan, "--json"],
                                     check=True, capture_output=True, text=True,
                                     timeout=60).stdout)
    split = {"%s layers %d-%d" % (s["metaop"], s["layers"][0], s["layers"][1])
             for w in view["waves"] for s in w["slices"] if s["tp"] > 1}
    check(split, "the plan splits a slice")
    trace = os.path.join(tmp, "trace.json")
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", os.environ["SPINDLE_RUN"],
                        plan, "--steps", "2", "--quiet", "--trace", trace],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "without MPI" in p.stderr:
        print("skip: built without MPI")
        return 77
    check(p.returncode == 0, f"spindle-run: exit {p.returncode}\n{p.stderr}")
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    check({e["pid"] for e in ev if e["tid"] == 0} == {0, 1}, "compute events on both ranks")
    n_split, tp_total = 0, 0.0
    for e in ev:
        m = re.match(r"(.*) (fwd|bwd|loss)$", e["name"])
        if not (m and m.group(1) in split):
            check("args" not in e, f"args on an event of no split FWD/BWD/LOSS: {e}")
            continue
        n_split += 1
        a = e.get("args", {})
        c, t = a.get("compute_ms"), a.get("tp_allreduce_ms")
        check(c is not None and t is not None, f"split event without the args: {e}")
        check(c >= 0 and t >= 0, f"negative time: {e}")
        # dur is in us with 3 decimals, the args in ms with 3: 0.5 us each
        check(abs((c + t) * 1e3 - e["dur"]) <= 1.5, f"compute + all-reduce != dur: {e}")
        tp_total += t
    check(n_split >= 2 * len(split), f"{n_split} split events, want both directions of each")
    check(tp_total > 0, "the split events' all-reduces took no time")
    print("ok")
    return 0


if __name__ == "__main__":
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as d:
        sys.exit(main(d))
