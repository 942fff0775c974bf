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


def plan(model, cluster, out, jobs, shortcuts):
    env = dict(os.environ, SPINDLE_SIM_STATS="1")
    env.pop("SPINDLE_TOP_READY_ALL", None)
    if not shortcuts:
        env["SPINDLE_TOP_READY_ALL"] = "1"
    p = subprocess.run([PLAN, model, cluster, "--compare", "--json", "--jobs", str(jobs),
                        "-o", out], capture_output=True, text=True, timeout=600, env=env)
    sims = sum(int(n) for n in re.findall(r"sim stats: top_ready +(\d+) simulations",
                                          p.stderr))
    refined = re.findall(r"sim stats: top_choose row .*", p.stderr)
    if p.returncode != 0:
        return p.returncode, p.stderr.strip()[-300:], None, None, sims, refined
    return 0, "", untimed(json.loads(p.stdout)), open(out, "rb").read(), sims, refined


def case(model, cluster, jobs, tmp, tag):
    a = plan(model, cluster, os.path.join(tmp, tag + ".a"), jobs, True)
    b = plan(model, cluster, os.path.join(tmp, tag + ".b"), jobs, False)
    saved = b[4] - a[4]
    if a[0] or b[0]:
        return a[:2] == b[:2], f"exit {a[0]} / {b[0]}: {a[1] or b[1]}", saved
    if a[3] != b[3]:
        return False, "plan files differ from those with the shortcuts off", saved
    if a[2] != b[2]:
        keys = [k for k in set(a[2]) | set(b[2]) if a[2].get(k) != b[2].get(k)]
        return False, f"reports differ from those with the shortcuts off in {sorted(keys)}", \
            saved
    if a[5] != b[5]:
        return False, "kept plans refine to other results than with the shortcuts off", saved
    return True, (f"same plan, {len(a[5])} kept plans refined alike, top_ready simulated "
                  f"{a[4]} plans ({b[4]} with them off)"), saved


def main():
    jobs = []
    for m in sorted(glob.glob(os.path.join(ROOT, "plans", "*", "model.json"))):
        own = os.path.join(os.path.dirname(m), "cluster.json")
        for c in ([own] if os.path.exists(own) else []) + \
                [os.path.join(ROOT, "plans", "clusters", n + ".json")
                 for n in ("a800-4x8", "a800-8x8")]:
            for j in (1, 2):
                jobs.append((m, c, j))
    fails = saved = 0
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        futs = [ex.submit(case, m, c, j, tmp, str(i)) for i, (m, c, j) in enumerate(jobs)]
        for (m, c, j), f in zip(jobs, futs):
            ok, why, s = f.result()
            fails += not ok
            saved += max(s, 0)
            print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(os.path.dirname(m))} on "
                  f"{os.path.basename(c)} --jobs {j}: {why}")
    print(f"{len(jobs) - fails} of {len(jobs)} cases plan as with the shortcuts off; "
          f"{saved} top_ready simulations saved in all")
    if not saved:
        print("FAIL no case skipped a simulation in top_ready: the comparison tested nothing")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
