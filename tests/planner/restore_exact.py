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
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import untimed  # noqa: E402  (the report without its timings)

PLAN = os.environ["SPINDLE_PLAN"]
ROOT = os.environ["SPINDLE_ROOT"]
SKIPPED = re.compile(r"sim stats: event programs restored without a rewrite +(\d+) times")


def plan(model, cluster, out, jobs, check):
    env = dict(os.environ)
    env.pop("SPINDLE_CHECK_RESTORE", None)
    if check:
        env.update(SPINDLE_CHECK_RESTORE="1", SPINDLE_SIM_STATS="1")
    p = subprocess.run([PLAN, model, cluster, "--compare", "--json", "--jobs", str(jobs),
                        "-o", out], capture_output=True, text=True, timeout=600, env=env)
    skipped = sum(int(n) for n in SKIPPED.findall(p.stderr))
    if p.returncode != 0:
        return p.returncode, p.stderr.strip()[-300:], None, None, skipped
    return 0, "", untimed(json.loads(p.stdout)), open(out, "rb").read(), skipped


def case(model, cluster, jobs, tmp, tag):
    a = plan(model, cluster, os.path.join(tmp, tag + ".a"), jobs, True)
    b = plan(model, cluster, os.path.join(tmp, tag + ".b"), jobs, False)
    if a[0] or b[0]:
        return False, f"exit {a[0]} / {b[0]}: {a[1] or b[1]}", a[4]
    if a[3] != b[3]:
        return False, "plan files differ with the check on", a[4]
    if a[2] != b[2]:
        return False, "reports differ with the check on", a[4]
    return True, f"same plan, {a[4]} restores without a rewrite checked", a[4]


def main():
    jobs = []
    for m in sorted(glob.glob(os.path.join(ROOT, "plans", "*", "model.json"))):
        own = os.path.join(os.path.dirname(m), "cluster.json")
        for c in ([own] if os.path.exists(own) else []) + \
                [os.path.join(ROOT, "plans", "clusters", "a800-8x8.json")]:
            for j in (1, 2):
                jobs.append((m, c, j))
    fails = skipped = 0
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        futs = [ex.submit(case, m, c, j, tmp, str(i)) for i, (m, c, j) in enumerate(jobs)]
        for (m, c, j), f in zip(jobs, futs):
            ok, why, n = f.result()
            fails += not ok
            skipped += n
            print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(os.path.dirname(m))} on "
                  f"{os.path.basename(c)} --jobs {j}: {why}")
    print(f"{len(jobs) - fails} of {len(jobs)} cases pass the check; "
          f"{skipped} restores without a rewrite in all")
    if not skipped:
        print("FAIL no restore skipped its rewrite: the check tested nothing")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
