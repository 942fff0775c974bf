#!/usr/bin/env python3
"""Golden plans: every bundled workload is re-planned and its canonical text
view (spindle-show) compared with the checked-in plans/<name>/plan.txt. A
planner change that alters a plan fails here until tools/regen-golden is
run and the new views are committed with the change."""
import difflib
import os
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN, SHOW = os.environ["SPINDLE_PLAN"], os.environ["SPINDLE_SHOW"]
bad = 0
with tempfile.TemporaryDirectory() as tmp:
    for n in sorted(os.listdir(os.path.join(ROOT, "plans"))):
        d = os.path.join(ROOT, "plans", n)
        if not os.path.exists(os.path.join(d, "model.json")):
            continue
        out = os.path.join(tmp, n + ".bin")
        p = subprocess.run([PLAN, os.path.join(d, "model.json"),
                            os.path.join(d, "cluster.json"), "-o", out],
                           capture_output=True, text=True)
        if p.returncode:
            print(f"FAIL {n}: planning failed: {p.stderr.strip()}")
            bad += 1
            continue
        view = subprocess.run([SHOW, out], capture_output=True, text=True, check=True).stdout
        gold_path = os.path.join(d, "plan.txt")
        gold = open(gold_path).read() if os.path.exists(gold_path) else ""
        if view != gold:
            bad += 1
            print(f"FAIL {n}: the plan differs from plans/{n}/plan.txt "
                  "(run tools/regen-golden and commit the new view):")
            for line in list(difflib.unified_diff(gold.splitlines(), view.splitlines(),
                                                  "plan.txt", "new", lineterm=""))[:40]:
                print("  " + line)
        else:
            print(f"ok   {n}")
print(f"{bad} failure(s)")
sys.exit(1 if bad else 0)
