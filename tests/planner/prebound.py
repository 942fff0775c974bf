#!/usr/bin/env python3
"""Ours' walk lowers a candidate no further than lower_run once its early
sync bound settles it against the walk's record (walk.c plan_lowered_cut,
bound.c bound_sync_early; with --jobs 1: the workers of --jobs 2+ lower
before any record exists): such a candidate must be one the walk would
neither have simulated nor kept for top_choose. For every bundled workload
(plans/*/model.json) on 64 A800s and on its own cluster, with --jobs 1,
with --compare and (on 64 A800s) with --zero 1 (no top_choose: the walk
cuts only what it would not simulate) and --defer-gather off (top_drops
decides what top_choose keeps), the plan files and the --json reports (but for their
planning times) must be those of the walk that lowers every candidate in
full (SPINDLE_NO_PREBOUND), and so must SPINDLE_TOP_STATS' top_choose line
(the plans kept and refined): a cut of a plan the walk would have kept
shows there even where it does not change the choice. The cut must fire
somewhere (its lowering line), so that this keeps testing it.
Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import PLAN, bundled, cluster_path, run_cases, untimed  # noqa: E402


def run(model, cluster, out, opts, full):
    env = dict(os.environ, SPINDLE_TOP_STATS="1")
    if full:
        env["SPINDLE_NO_PREBOUND"] = "1"
    p = subprocess.run([PLAN, model, cluster, "--json", "-o", out, "--jobs", "1"] + opts,
                       capture_output=True, text=True, timeout=600, env=env)
    err = p.stderr.splitlines()
    top = [x for x in err if x.startswith("top_choose:")]
    low = [x for x in err if x.startswith("lowering:")]
    cut = int(low[-1].split()[1]) if low else 0
    if p.returncode:
        return p.returncode, p.stderr.strip(), top, cut, None
    return 0, "", top, cut, (untimed(json.loads(p.stdout)), open(out, "rb").read())


def case(model, cluster, opts, tmp, tag):
    a = run(model, cluster, os.path.join(tmp, tag + ".a"), opts, False)
    b = run(model, cluster, os.path.join(tmp, tag + ".b"), opts, True)
    if b[3]:
        return False, f"{b[3]} lowerings cut under SPINDLE_NO_PREBOUND", a[3]
    if a[0] or b[0]:
        return a[:2] == b[:2], f"exit {a[0]} / {b[0]}: {a[1] or b[1]}", a[3]
    if a[4][1] != b[4][1]:
        return False, "plan files differ from the full lowering's", a[3]
    if a[4][0] != b[4][0]:
        return False, "reports differ from the full lowering's", a[3]
    if a[2] != b[2]:
        return False, f"top_choose differs: {a[2]}, in full {b[2]}", a[3]
    return True, f"same plan, {a[3]} lowerings cut", a[3]


def main():
    a800 = cluster_path("a800-8x8")
    todo = [(m, c, o) for m, c in bundled(["a800-8x8"])
            for o in ([], ["--compare"]) + ((["--zero", "1"], ["--defer-gather", "off"])
                                            if c == a800 else ())]
    fails, cuts = run_cases(todo, case, "as in full", "lowerings cut")
    if not cuts:
        print("FAIL no lowering was cut: the test no longer tests the cut")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
