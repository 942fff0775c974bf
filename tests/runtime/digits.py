#!/usr/bin/env python3
"""tools/make-dataset and plans/digits/: the small dataset (--small) is
made twice, byte for byte the same, passes spindle-run's strict reading and
the digits workload trains on it (one device, 40 steps: each task's mean
loss over the last 10 steps below that of the first 10). Skips (77) where
the Debian packages it reads (python3-sklearn, espeak-ng) are missing.

The held-out evaluation (spindle-run --eval, runtime/eval.c), on "tiny":
one batch per task cut from the small train split:
  * its loss is the training loss of the same batch before any update (an
    untrained model: --eval only vs --steps 1 --log);
  * its retrieval chance is the one recomputed here from the shards (a
    candidate counts as right when its caption or its image/clip equals
    the partner's), and classification chance is 1/10;
  * a model trained to fit tiny scores 1.0 on it in classification and
    retrieval (a known answer), the untrained one below 0.5;
  * 1 and 2 ranks score the small train split alike: the same counts, the
    loss to 1e-6."""
import filecmp
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402

TOOL = os.path.join(R.ROOT, "tools", "make-dataset")
DIGITS_CSV = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
STEPS = 40
FIT_STEPS = 60


def same_tree(a, b):
    c = filecmp.dircmp(a, b)
    if c.left_only or c.right_only or c.diff_files or c.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, c.common_files, shallow=False)
    return not mismatch and not errors and all(
        same_tree(os.path.join(a, d), os.path.join(b, d)) for d in c.common_dirs)


def cut(src, dst, n):
    """dst: a dataset of the first n samples of each task of src."""
    sys.path.insert(0, os.path.dirname(__file__))
    import dataset_gen  # noqa: E402
    os.makedirs(dst)
    index = json.load(open(os.path.join(src, "index.json")))
    rows = {}
    for task, t in index["tasks"].items():
        f = t["shards"][0]["file"]
        header, data = R.read_safetensors(os.path.join(src, f))
        out = {}
        for name, h in header.items():
            if name == "__metadata__":
                continue
            per = math.prod(h["shape"][1:])
            a, _ = h["data_offsets"]
            fmt = "<%di" if h["dtype"] == "I32" else "<%df"
            flat = list(struct.unpack_from(fmt % (n * per), data, a))
            out[name] = (h["dtype"], [n] + h["shape"][1:], flat)
            rows[task, name] = [tuple(flat[i * per:(i + 1) * per]) for i in range(n)]
        dataset_gen.write_safetensors(os.path.join(dst, f), out)
        t["samples"] = n
        t["shards"] = [{"file": f, "samples": n}]
    with open(os.path.join(dst, "index.json"), "w") as fh:
        json.dump(index, fh)
    return rows


def retrieval_chance(rows, task, a, b):
    """Mean over the batch of the share of candidates counted right."""
    xa, xb = rows[task, a], rows[task, b]
    n = len(xa)
    return sum(sum(i == j or xa[i] == xa[j] or xb[i] == xb[j] for j in range(n)) / n
               for i in range(n)) / n


def check_eval(F, tmp, model, small):
    tiny = os.path.join(tmp, "tiny")
    rows = cut(small, tiny, 32)
    plan1 = R.make_plan(tmp, model, "digits", 1)
    plan2 = R.make_plan(tmp, model, "digits", 2)
    log, js = os.path.join(tmp, "tiny.csv"), os.path.join(tmp, "tiny.json")

    def scores(plan, ranks, *args):
        r = R.run(plan, ranks, "--quiet", "--eval-json", js, *args)
        if not F.check(r.rc == 0, f"--eval {' '.join(map(str, args))} on {ranks} rank(s)",
                       r.describe()):
            return None
        return {t["task"]: t for t in json.load(open(js))["tasks"]}

    s0 = scores(plan1, 1, "--steps", 0, "--eval", tiny)
    r = R.run(plan1, 1, "--steps", 1, "--quiet", "--log", log, "--data", tiny)
    if s0 is None or not F.check(r.rc == 0, "one step on tiny", r.describe()):
        return
    for x in R.read_log(log):
        got = s0[x["task"]]["loss"]
        F.check(abs(got - float(x["loss"])) <= 1e-6 * abs(got), f"{x['task']}: held-out "
                "loss of an untrained model equals the training loss of the same batch",
                f"{got} vs {x['loss']}")
    expect = {"image_text": retrieval_chance(rows, "image_text", "img_in.features",
                                             "txt_in.tokens"),
              "audio_text": retrieval_chance(rows, "audio_text", "aud_in.features",
                                             "txt_in.tokens"),
              "classify": 0.1}
    for task, c in expect.items():
        F.check(abs(s0[task]["chance"] - c) < 1e-9 and s0[task]["scored"] ==
                (32 if task == "classify" else 64), f"{task}: chance level and count",
                f"{s0[task]} vs chance {c}")
    fit = scores(plan1, 1, "--steps", FIT_STEPS, "--data", tiny, "--eval", tiny)
    for task, t in (fit or {}).items():
        F.check(t["accuracy"] == 1.0 and s0[task]["accuracy"] < 0.5,
                f"{task}: a model fit to tiny scores 1.0 on it (untrained: below 0.5)",
                f"{t}\n{s0[task]}")
    one = scores(plan1, 1, "--steps", 20, "--data", small, "--eval", small)
    two = scores(plan2, 2, "--steps", 20, "--data", small, "--eval", small)
    for task in (one or {}) if two else {}:
        a, b = one[task], two[task]
        F.check(all(a[k] == b[k] for k in ("samples", "scored", "right", "chance")) and
                abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]),
                f"{task}: 1 and 2 ranks score alike", f"{a}\n{b}")


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
        r = R.run(plan, 1, "--steps", 1, "--quiet", "--eval", os.path.join(outs[0], "heldout"))
        F.check(r.rc == 2 and "fewer than one batch" in r.err and "step 1" not in r.out,
                "--eval: the same strict reading, before step 1", r.describe())
        check_eval(F, tmp, model, os.path.join(outs[0], "train"))
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
