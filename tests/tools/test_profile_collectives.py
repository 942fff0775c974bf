#!/usr/bin/env python3
"""spindle-profile --collectives, briefly: 2 MPI ranks, two tiny sizes, into
a copy of plans/clusters/cpu-4.json. Asserts: exit 0; the written cluster
loads in spindle-plan (--inspect on the demo); every key but
"collectives" is the input's; the section holds each op (all_reduce,
all_gather, reduce_scatter, p2p) at 2 ranks on 1 node for both sizes with
ms > 0, in the loader's order. Refusal: one rank (no mpirun) gives exit
2 and the message, and writes nothing. --backend cuda on 2 ranks (NCCL):
where two GPUs are visible and the build has CUDA and NCCL, the same
checks of the written cluster; elsewhere exit 2 with the reason (no GPU,
fewer GPUs than ranks, a build without CUDA/NCCL) and nothing written.
Skips (77) where this build has no MPI or no mpirun.
Environment: SPINDLE_PROFILE, SPINDLE_PLAN, SPINDLE_ROOT.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mpi_session  # noqa: E402

mpi_session.private()

PROFILE = os.environ["SPINDLE_PROFILE"]
PLAN = os.environ["SPINDLE_PLAN"]
ROOT = os.environ.get("SPINDLE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
CLUSTER = os.path.join(ROOT, "plans", "clusters", "cpu-4.json")
OPS = ["all_reduce", "all_gather", "reduce_scatter", "p2p"]
SIZES = [4096, 16384]


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def check_points(out):
    """The cluster written to out: loads, keeps every other key, and holds
    each op at 2 ranks on 1 node for both sizes, sorted, ms > 0."""
    q = subprocess.run([PLAN, os.path.join(ROOT, "plans", "demo", "model.json"), out,
                        "--inspect"], capture_output=True, text=True, timeout=60)
    check(q.returncode == 0, f"the written cluster loads: {q.stderr}")
    got, want = json.load(open(out)), json.load(open(CLUSTER))
    pts = got.pop("collectives")
    check(got == want, "every other key as in the input")
    keys = [(OPS.index(x["op"]), x["ranks"], x["nodes"], x["bytes"]) for x in pts]
    check(keys == sorted(set(keys)), "sorted by (op, ranks, nodes, bytes), no repeats")
    check(sorted(keys) == [(o, 2, 1, s) for o in range(4) for s in SIZES],
          f"each op at 2 ranks on 1 node for both sizes: {keys}")
    check(all(x["ms"] > 0 for x in pts), "times are positive")


def main():
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        base = [PROFILE, "--collectives", "--sizes", ",".join(map(str, SIZES)), "--reps", "3",
                "--warmup", "1", "--cluster", CLUSTER, "-o", out]
        p = subprocess.run(base, capture_output=True, text=True, timeout=60)
        if "built without MPI" in p.stderr:
            print("skip: built without MPI")
            return 77
        check(p.returncode == 2 and "needs two or more ranks" in p.stderr
              and not os.path.exists(out), f"one rank is refused: {p.returncode} {p.stderr}")
        mpi = ["mpirun", "--oversubscribe", "-np", "2"]
        p = subprocess.run(mpi + base, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"2 ranks: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        check_points(out)
        os.remove(out)
        p = subprocess.run(mpi + base + ["--backend", "cuda"], capture_output=True, text=True,
                           timeout=120)
        if p.returncode == 0:
            check_points(out)
            print("ok: --backend cuda measured NCCL on 2 GPUs")
        else:
            why = ("no GPU visible", "built without the CUDA backend and NCCL",
                   "NCCL needs one GPU per rank")
            check(p.returncode == 2 and any(w in p.stderr for w in why)
                  and not os.path.exists(out),
                  f"--backend cuda without 2 GPUs is refused: {p.returncode} {p.stderr}")
            print("ok: --backend cuda refused here: " +
                  next(ln for ln in p.stderr.splitlines() if "spindle-profile:" in ln))
    print("ok: spindle-profile --collectives on 2 ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
