#!/usr/bin/env python3
"""top_choose's shortcuts in readying the plans the walk kept (walk_jobs.c
top_ready): a kept plan whose iteration is above the refinement limit is
never refined, so its other times are not computed (sim_complete), and
where its result is known already (sim_memo: an equal plan simulated in
the walk) it is not simulated again either. They must be exact: for every
bundled workload (plans/*/model.json) on its own cluster, on a800-4x8 and
on a800-8x8, with --compare, with one thread and with two, the plan files
and the --json reports (but for their planning times) equal those made
with the shortcuts off (SPINDLE_TOP_READY_ALL=1: every plan top_choose
reaches readied in full), and so do the results each kept plan top_choose
refines (SPINDLE_SIM_STATS=1 prints them). They must also be taken: SPINDLE_SIM_STATS=1
makes the planner print how many plans top_ready simulated, and some case
must simulate fewer with the shortcuts on (else the comparison tests
nothing). Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0
pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import PLAN, bundled, run_cases, untimed  # noqa: E402 (same environment)


def run(model, cluster, opts, off, out):
    """One planning run, the shortcuts on or off: what the test compares."""
    env = {k: v for k, v in os.environ.items() if k != "SPINDLE_TOP_READY_ALL"}
    env.update({"SPINDLE_SIM_STATS": "1"}, **({"SPINDLE_TOP_READY_ALL": "1"} if off else {}))
    argv = [PLAN, model, cluster, "--compare", "--json"] + opts + ["-o", out]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    err = done.stderr
    got = {"exit": done.returncode,
           "top_ready": sum(map(int, re.findall(r"top_ready +(\d+) simulations", err))),
           "refined": re.findall(r"sim stats: top_choose row .*", err)}
    if done.returncode:
        got["error"] = err.strip()[-300:]
    else:
        got["report"] = untimed(json.loads(done.stdout))
        with open(out, "rb") as fh:
            got["plan"] = fh.read()
    return got


WHAT = [("exit", "exit statuses"), ("error", "errors"), ("plan", "plan files"),
        ("report", "reports"), ("refined", "results of the kept plans top_choose refines")]


def case(model, cluster, opts, tmp, tag):
    on = run(model, cluster, opts, False, os.path.join(tmp, tag + ".on"))
    off = run(model, cluster, opts, True, os.path.join(tmp, tag + ".off"))
    saved = max(off["top_ready"] - on["top_ready"], 0)
    bad = [name for key, name in WHAT if on.get(key) != off.get(key)]
    if bad:
        return False, "differ from the shortcuts off: " + ", ".join(bad), saved
    return True, (f"same plan, {len(on['refined'])} kept plans refined alike, top_ready "
                  f"simulated {on['top_ready']} plans ({off['top_ready']} with them off)"), saved


def main():
    todo = [(m, c, ["--jobs", j]) for m, c in bundled(["a800-4x8", "a800-8x8"])
            for j in ("1", "2")]
    fails, saved = run_cases(todo, case, "plan as with the shortcuts off",
                             "top_ready simulations saved")
    if not saved:
        print("FAIL no case skipped a simulation in top_ready: the comparison tested nothing")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
