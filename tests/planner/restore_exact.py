#!/usr/bin/env python3
"""A rejected layout trial's programs given back without a rewrite
(planner/layout_trial.c trial_restore: the saved instruction array taken back
from regather's spare; layout_refine.c layout_last_join: a rejected last
trial leaves the plan as it is). That is exact only where the programs
kept are the ones regather would write for the plan's layouts, byte for
byte; SPINDLE_CHECK_RESTORE=1 makes the planner check exactly that at
each such restore (layout_trial.c trial_check_programs) and fail with an
internal error where they are not. For every bundled workload
(plans/*/model.json) on its own cluster and on a800-8x8, with --compare
(every algorithm, their layout trials and refinements), with one thread
and with two, the run must succeed with the check on, and its plan file
and --json report (but for the planning times) must equal the run's
without it. Some restore must skip its rewrite (SPINDLE_SIM_STATS=1's
"programs restored without a rewrite"), else the check tested nothing.
Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import PLAN, bundled, run_cases, untimed  # noqa: E402 (same environment)

SKIPPED = re.compile(r"sim stats: event programs restored without a rewrite +(\d+) times")


def plan(model, cluster, out, opts, check):
    env = dict(os.environ)
    env.pop("SPINDLE_CHECK_RESTORE", None)
    if check:
        env.update(SPINDLE_CHECK_RESTORE="1", SPINDLE_SIM_STATS="1")
    p = subprocess.run([PLAN, model, cluster, "--compare", "--json"] + opts + ["-o", out],
                       capture_output=True, text=True, timeout=600, env=env)
    skipped = sum(int(n) for n in SKIPPED.findall(p.stderr))
    if p.returncode != 0:
        return p.returncode, p.stderr.strip()[-300:], None, None, skipped
    return 0, "", untimed(json.loads(p.stdout)), open(out, "rb").read(), skipped


def case(model, cluster, opts, tmp, tag):
    a = plan(model, cluster, os.path.join(tmp, tag + ".a"), opts, True)
    b = plan(model, cluster, os.path.join(tmp, tag + ".b"), opts, False)
    if a[0] or b[0]:
        return False, f"exit {a[0]} / {b[0]}: {a[1] or b[1]}", a[4]
    if a[3] != b[3]:
        return False, "plan files differ with the check on", a[4]
    if a[2] != b[2]:
        return False, "reports differ with the check on", a[4]
    return True, f"same plan, {a[4]} restores without a rewrite checked", a[4]


def main():
    todo = [(m, c, ["--jobs", j]) for m, c in bundled(["a800-8x8"]) for j in ("1", "2")]
    fails, skipped = run_cases(todo, case, "pass the check", "restores without a rewrite")
    if not skipped:
        print("FAIL no restore skipped its rewrite: the check tested nothing")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
