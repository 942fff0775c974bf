#!/usr/bin/env python3
"""tools/make-dataset and plans/digits/: the small dataset (--small) is
made twice, byte for byte the same, passes spindle-run's strict reading and
the digits workload trains on it (one device, 40 steps: each task's mean
loss over the last 10 steps below that of the first 10). Skips (77) where
the Debian packages it reads (python3-sklearn, espeak-ng) are missing."""
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402

TOOL = os.path.join(R.ROOT, "tools", "make-dataset")
DIGITS_CSV = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
STEPS = 40


def same_tree(a, b):
    c = filecmp.dircmp(a, b)
    if c.left_only or c.right_only or c.diff_files or c.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, c.common_files, shallow=False)
    return not mismatch and not errors and all(
        same_tree(os.path.join(a, d), os.path.join(b, d)) for d in c.common_dirs)


def main():
    if not os.path.exists(DIGITS_CSV) or not shutil.which("espeak-ng"):
        print("skip: python3-sklearn or espeak-ng is not installed")
        return 77
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"digits{k}") for k in range(2)]
        for o in outs:
            p = subprocess.run([sys.executable, TOOL, o, "--small"], capture_output=True,
                               text=True, timeout=120)
            if not F.check(p.returncode == 0, f"make-dataset {o} --small", p.stderr):
                return F.exit()
        F.check(same_tree(*outs), "make-dataset is deterministic (two runs byte-identical)")
        model = json.load(open(os.path.join(R.ROOT, "plans", "digits", "model.json")))
        plan = R.make_plan(tmp, model, "digits", 1)
        log = os.path.join(tmp, "digits.csv")
        r = R.run(plan, 1, "--steps", STEPS, "--quiet", "--log", log, "--data",
                  os.path.join(outs[0], "train"))
        if not F.check(r.rc == 0, "the digits workload trains on the small train split",
                       r.describe()):
            return F.exit()
        rows = R.read_log(log)
        for task in dict.fromkeys(x["task"] for x in rows):
            xs = [float(x["loss"]) for x in rows if x["task"] == task]
            a, b = sum(xs[:10]) / 10, sum(xs[-10:]) / 10
            F.check(b < a, f"{task}: mean loss of the last 10 steps below the first 10's",
                    f"{a:.4f} -> {b:.4f}")
        r = R.run(plan, 1, "--steps", 1, "--quiet", "--data", os.path.join(outs[0], "heldout"))
        F.check(r.rc == 2 and "fewer than one batch" in r.err,
                "the small held-out split has fewer clips than a batch: refused", r.describe())
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
