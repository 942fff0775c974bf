#!/usr/bin/env python3
"""The simulator's pass memo (planner/sim_memo.c sim_pass_*, sim.c run): a
pass with sync of a plan state passed before in the run takes the
recorded result and times instead of running. It must be exact: for
every bundled workload (plans/*/model.json) on its own cluster and on
a800-8x8, with --compare (every algorithm, their layout trials and
refinements), with one thread and with two, the plan files and the --json
reports (but for their planning times) equal those made with the memo
off (SPINDLE_NO_PASS_MEMO=1, which runs every pass). The memo must also
be used: SPINDLE_PASS_MEMO_STATS=1 makes the planner print how many
passes it took from the memo, and some case must take one (else the
comparison tests nothing). Environment: SPINDLE_PLAN, SPINDLE_ROOT
(test_env). Exit 0 pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import PLAN, bundled, run_cases, untimed  # noqa: E402 (same environment)


def plan(model, cluster, out, opts, memo):
    env = dict(os.environ, SPINDLE_PASS_MEMO_STATS="1")
    env.pop("SPINDLE_NO_PASS_MEMO", None)
    if not memo:
        env["SPINDLE_NO_PASS_MEMO"] = "1"
    p = subprocess.run([PLAN, model, cluster, "--compare", "--json"] + opts + ["-o", out],
                       capture_output=True, text=True, timeout=600, env=env)
    hits = sum(int(h) for h in re.findall(r"pass memo: (\d+) of", p.stderr))
    if p.returncode != 0:
        return p.returncode, p.stderr.strip()[-300:], None, None, hits
    return 0, "", untimed(json.loads(p.stdout)), open(out, "rb").read(), hits


def case(model, cluster, opts, tmp, tag):
    a = plan(model, cluster, os.path.join(tmp, tag + ".a"), opts, True)
    b = plan(model, cluster, os.path.join(tmp, tag + ".b"), opts, False)
    if b[4]:
        return False, f"memo off, yet {b[4]} passes taken from it", 0
    if a[0] or b[0]:
        return a[:2] == b[:2], f"exit {a[0]} / {b[0]}: {a[1] or b[1]}", a[4]
    if a[3] != b[3]:
        return False, "plan files differ from the memo-less run's", a[4]
    if a[2] != b[2]:
        keys = [k for k in set(a[2]) | set(b[2]) if a[2].get(k) != b[2].get(k)]
        return False, f"reports differ from the memo-less run's in {sorted(keys)}", a[4]
    return True, f"same plan, {a[4]} passes from the memo", a[4]


def main():
    todo = [(m, c, ["--jobs", j]) for m, c in bundled(["a800-8x8"]) for j in ("1", "2")]
    fails, hits = run_cases(todo, case, "plan as with the memo off", "passes taken from the memo")
    if not hits:
        print("FAIL no case took a pass from the memo: the comparison tested nothing")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
