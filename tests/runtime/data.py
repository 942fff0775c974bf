#!/usr/bin/env python3
"""Training on a dataset (--data, schemas/DATASET-FORMAT.md) on the demo
workload, with a small generated dataset (dataset_gen.py; variable lengths,
two shards per task, sizes chosen so 3 steps cross an epoch):

  * equivalence on real data: plans on 2 and 3 ranks give the losses and
    parameters of the one-device plan after 3 steps (tolerances of
    equivalence.py), and the data is really used (losses differ from the
    synthetic run's); the log's epoch column follows N / batch; so do 3
    ranks with 2 micro-batches (the dataset's steps are then micro-steps),
    whose epochs are the step batch's; without the contrastive task, under
    SGD, 2 micro-batches train what one batch does across an epoch's end;
    a dataset under one step batch is refused with 2 micro-batches too, and
    --eval scores the same samples with 2 micro-batches as with 1
  * resume: 2 steps, checkpoint, 3 more steps on the 2-rank plan equal 5
    steps straight (the same sample order continues, across epochs 1 and 2)
  * strict reading: each kind of bad dataset stops with exit 2 before step 1
    and a message naming the file, the tensor and, for content, the sample
    (headers and lengths always; the other values with --data-check full);
    so does every truncation of a shard (8 cuts)
  * streaming: a token id past the vocabulary in a row only step 3 reads
    (found with this file's copy of the documented order) stops the run
    after step 2 with exit 2, naming file, tensor, sample and step, on 1
    and 2 ranks and with 2 micro-batches (reported once, no hang); the rows resident are two steps'
    (the figure the run prints), the same for a dataset 10 times larger; a
    shard truncated while a run reads it (after step 1) stops the run with
    exit 2, naming the file
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import dataset_gen as G  # noqa: E402
import rtlib as R  # noqa: E402

# per task: 2.5 batches (match 32, caption 16, classify 8): 2 steps an epoch
SAMPLES = {"match": 80, "caption": 40, "classify": 20}
STEPS = 3


def train(plan, ranks, tmp, tag, data, *extra):
    dump, log = os.path.join(tmp, f"{tag}.dump"), os.path.join(tmp, f"{tag}.csv")
    args = ["--dump-params", dump, "--log", log, "--quiet", "--timeout", 60]
    if data:
        args += ["--data", data]
    R.must(R.run(plan, ranks, *args, *extra), tag)
    return R.load_dump(dump), R.read_log(log)


def equivalence(F, tmp, plans, ds):
    ref = train(plans[1], 1, tmp, "data-1", ds, "--steps", STEPS)
    for n in (2, 3):
        got = train(plans[n], n, tmp, f"data-{n}", ds, "--steps", STEPS)
        msg = R.compare(ref, got, R.FLOOR["adamw"], f"{n} ranks against 1 on real data")
        F.check(msg is None, f"{n} ranks equal one device on real data", msg or "")
    syn = train(plans[1], 1, tmp, "synthetic-1", None, "--steps", STEPS)
    F.check(all(a["loss"] != b["loss"] for a, b in zip(ref[1], syn[1])),
            "the dataset's samples are trained on (losses differ from synthetic data)")
    mb = {n: R.make_plan(tmp, R.demo_model(), "demo-mb2", n, "spindle",
                         ("--microbatches", "2")) for n in (1, 3)}
    mref = train(mb[1], 1, tmp, "data-mb2-1", ds, "--steps", STEPS)
    got = train(mb[3], 3, tmp, "data-mb2-3", ds, "--steps", STEPS)
    msg = R.compare(mref, got, R.FLOOR["adamw"], "3 ranks against 1, 2 micro-batches")
    F.check(msg is None, "3 ranks equal one device on real data with 2 micro-batches",
            msg or "")
    mep = [(r["step"], r["epoch"]) for r in mref[1] if r["task"] == "match"]
    F.check(mep == [("1", "0"), ("2", "0"), ("3", "1")],
            "the log's epoch with 2 micro-batches: the step batch's", str(mep))
    # --eval scores one pass of whole step batches whatever k: 64 of match's
    # 80 samples, not 80 (5 micro-batches of 16)
    # micro-batches per task (caption 2 of 8, classify 4 of 2, match 1):
    # 3 ranks equal one device
    mbt_opt = ("--microbatches", "caption=2,classify=4")
    mbt = {n: R.make_plan(tmp, R.demo_model(), "demo-mbt", n, "spindle", mbt_opt)
           for n in (1, 3)}
    tref = train(mbt[1], 1, tmp, "data-mbt-1", ds, "--steps", STEPS)
    got = train(mbt[3], 3, tmp, "data-mbt-3", ds, "--steps", STEPS)
    msg = R.compare(tref, got, R.FLOOR["adamw"], "3 ranks against 1, per-task micro-batches")
    F.check(msg is None, "3 ranks equal one device on real data with micro-batches per task",
            msg or "")
    scored = {}
    for k, plan in ((1, plans[1]), (2, mb[1]), ("per-task", mbt[1])):
        js = os.path.join(tmp, f"eval-k{k}.json")
        R.must(R.run(plan, 1, "--steps", 0, "--quiet", "--eval", ds, "--eval-json", js),
               f"--eval with {k} micro-batch(es)")
        scored[k] = {t["task"]: t["samples"] for t in json.load(open(js))["tasks"]}
    F.check(scored[1] == scored[2] == scored["per-task"] ==
            {"match": 64, "caption": 32, "classify": 16},
            "--eval with 2 micro-batches, and per task, scores the samples of 1", str(scored))
    # 6 samples fill no step batch of 8, though they fill a micro-batch of 4
    few = os.path.join(tmp, "few-mb2")
    G.make(R.demo_model(), few, dict(SAMPLES, classify=6))
    r = R.run(mb[1], 1, "--steps", 1, "--data", few)
    F.check(r.rc == 2 and "task 'classify' has 6 samples, fewer than one batch (8)" in r.err,
            "2 micro-batches: fewer samples than one step batch, exit 2", r.describe())
    # caption's step 3 is in epoch 1 of its step batch of 16 (40 = 2.5
    # batches): its 2 micro-batches of 8 are positions 0-7 and 8-15 of that
    # step, not micro-steps 5 and 6 of an epoch of 8s (which would train
    # samples 32-39 of epoch 0, left out with one micro-batch); without the
    # contrastive task (its negatives come from the micro-batch) and under
    # SGD, 2 micro-batches equal one whole batch
    m = R.demo_model()
    m["tasks"] = [t for t in m["tasks"] if t["name"] != "match"]
    m["optimizer"] = {"type": "sgd", "lr": 0.05}
    one, two = (train(R.make_plan(tmp, m, f"nomatch-k{k}", 1, "spindle",
                                  ("--microbatches", str(k))), 1, tmp, f"data-nm-k{k}",
                      ds, "--steps", STEPS) for k in (1, 2))
    msg = R.compare(one, two, R.FLOOR["sgd"], "2 micro-batches against 1")
    F.check(msg is None, "2 micro-batches train the samples of 1 on real data "
            "(across an epoch's end)", msg or "")
    # per task: caption's micro-batches are positions of its step batch,
    # classify's samples unchanged (1 micro-batch) and then in 4 of 2
    for opt in ("caption=2", "caption=2,classify=4"):
        pt = train(R.make_plan(tmp, m, f"nomatch-{opt}", 1, "spindle", ("--microbatches", opt)),
                   1, tmp, f"data-nm-{opt}", ds, "--steps", STEPS)
        msg = R.compare(one, pt, R.FLOOR["sgd"], f"--microbatches {opt} against 1")
        F.check(msg is None, f"--microbatches {opt} trains the samples of 1 on real data",
                msg or "")
    epochs = [(r["step"], r["task"], r["epoch"]) for r in ref[1] if r["task"] == "match"]
    F.check(epochs == [("1", "match", "0"), ("2", "match", "0"), ("3", "match", "1")],
            "the log's epoch: 2 steps an epoch for 80 samples in batches of 32",
            str(epochs))


def resume(F, tmp, plans, ds):
    straight = train(plans[1], 1, tmp, "straight", ds, "--steps", 2 + STEPS)
    ck = os.path.join(tmp, "ck")
    train(plans[1], 1, tmp, "first-half", ds, "--steps", 2, "--save", ck)
    tail = train(plans[2], 2, tmp, "second-half", ds, "--steps", STEPS, "--load", ck)
    ref = (straight[0], [r for r in straight[1] if int(r["step"]) > 2])
    msg = R.compare(ref, tail, R.FLOOR["adamw"], "resumed against straight")
    F.check(msg is None, "a run resumed on another plan continues the same sample order",
            msg or "")


# ---- strict reading: one bad dataset each --------------------------------

def shard(ds, task, k=0):
    return os.path.join(ds, f"{task}-{k:05d}.safetensors")


def rewrite(path, fn):
    """Applies fn to the shard's {name: (dtype, shape, flat)} and writes it."""
    header, data = R.read_safetensors(path)
    t = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        fmt = G.FORMATS[e["dtype"]] % ((b - a) // 4)
        t[name] = (e["dtype"], e["shape"], list(struct.unpack(fmt, data[a:b])))
    fn(t)
    G.write_safetensors(path, t)


def edit_index(ds, fn):
    p = os.path.join(ds, "index.json")
    idx = json.load(open(p))
    fn(idx)
    json.dump(idx, open(p, "w"))


def set_at(t, name, i, v):
    t[name][2][i] = v


def as_f32(t, name):
    t[name] = ("F32", t[name][1], [float(x) for x in t[name][2]])


def drop(t, name):
    del t[name]


def truncate(path):
    b = open(path, "rb").read()
    open(path, "wb").write(b[:-100])


def corrupt(path):
    b = bytearray(open(path, "rb").read())
    b[8:12] = b"#!x?"
    open(path, "wb").write(bytes(b))


def fewer(idx):
    idx["tasks"]["classify"] = {"samples": 7, "shards": [{"file": "classify-00000.safetensors",
                                                          "samples": 7}]}


# values inside rows: found at start-up with --data-check full
VALUE_CASES = [
    # (what, edit of the dataset directory, texts the message must hold)
    ("a token id past the vocabulary",
     lambda d: rewrite(shard(d, "caption", 1), lambda t: set_at(t, "txt_in.tokens", 12 * 3, 64)),
     ["caption-00001.safetensors", "'txt_in.tokens'", "row 3 (sample 23 of task 'caption')",
      "token id 64", "vocabulary"]),
    ("a label past the classes",
     lambda d: rewrite(shard(d, "classify"), lambda t: set_at(t, "loss.labels", 2, 4)),
     ["classify-00000.safetensors", "'loss.labels'", "row 2", "label 4"]),
    ("a feature that is not finite",
     lambda d: rewrite(shard(d, "classify", 1), lambda t: set_at(t, "img_in.features", 0,
                                                                 float("nan"))),
     ["classify-00001.safetensors", "'img_in.features'", "row 0 (sample 10", "not finite"]),
]

# headers, shapes, the index and the lengths tables: always at start-up
CASES = [
    ("a length past the node's seq",
     lambda d: rewrite(shard(d, "match"), lambda t: set_at(t, "img_in.length", 5, 9)),
     ["match-00000.safetensors", "'img_in.length'", "row 5 (sample 5 of task 'match')",
      "length 9 is not in [1, 8]"]),
    ("token ids of the wrong dtype",
     lambda d: rewrite(shard(d, "caption"), lambda t: as_f32(t, "txt_in.tokens")),
     ["caption-00000.safetensors", "'txt_in.tokens' has dtype F32, not I32"]),
    ("features of the wrong shape",
     lambda d: rewrite(shard(d, "match"), lambda t: t.update(
         {"img_in.features": ("F32", [40, 8, 16], t["img_in.features"][2][:40 * 8 * 16])})),
     ["match-00000.safetensors", "'img_in.features' has another shape than [40, 8, 32]"]),
    ("a node's tensor missing",
     lambda d: rewrite(shard(d, "match", 1), lambda t: drop(t, "txt_in.length")),
     ["match-00001.safetensors", "'txt_in.length' is missing"]),
    ("a truncated shard",
     lambda d: truncate(shard(d, "classify")),
     ["classify-00000.safetensors", "is the file truncated?"]),
    ("a corrupt shard header",
     lambda d: corrupt(shard(d, "caption")),
     ["caption-00000.safetensors", "bad safetensors header"]),
    ("a task missing from the index",
     lambda d: edit_index(d, lambda i: i["tasks"].pop("caption")),
     ["index.json", "task 'caption' is missing"]),
    ("fewer samples than one batch",
     lambda d: edit_index(d, fewer),
     ["index.json", "task 'classify' has 7 samples, fewer than one batch (8)"]),
    ("a missing shard file",
     lambda d: os.remove(shard(d, "match", 1)),
     ["match-00001.safetensors", "cannot open file"]),
]


def strict(F, tmp, plans, ds):
    cases = [(c, []) for c in CASES] + [(c, ["--data-check", "full"]) for c in VALUE_CASES]
    for k, ((what, fn, texts), check) in enumerate(cases):
        bad = os.path.join(tmp, f"bad{k}")
        shutil.copytree(ds, bad)
        fn(bad)
        r = R.run(plans[1], 1, "--steps", 1, "--data", bad, *check)
        ok = r.rc == 2 and all(t in r.err for t in texts) and "step   1" not in r.out
        F.check(ok, f"{what}: exit 2 before step 1, naming it {' '.join(check)}",
                r.describe())
    # every truncation of a shard (8 cuts from inside the length field to
    # one byte short) is refused up front
    src = shard(ds, "caption", 1)
    size = os.path.getsize(src)
    cuts = sorted({4, 8, 40, size // 4, size // 2, 3 * size // 4, size - 4, size - 1})
    bad = os.path.join(tmp, "cut")
    shutil.copytree(ds, bad)
    refused = []
    for cut in cuts:
        with open(src, "rb") as f, open(shard(bad, "caption", 1), "wb") as g:
            g.write(f.read(cut))
        r = R.run(plans[1], 1, "--steps", 1, "--data", bad)
        refused.append(r.rc == 2 and "caption-00001.safetensors" in r.err)
    F.check(all(refused), f"every truncation of a shard ({len(cuts)} cuts of {size} bytes) "
            "is refused with exit 2, naming the file", str(list(zip(cuts, refused))))
    # on 2 ranks, the rank whose share holds the bad row reports it once
    bad = os.path.join(tmp, "bad-2ranks")
    shutil.copytree(ds, bad)
    rewrite(shard(bad, "match", 1), lambda t: set_at(t, "txt_in.tokens", 12 * 30, 99))
    r = R.run(plans[2], 2, "--steps", 1, "--data", bad, "--data-check", "full")
    F.check(r.rc == 2 and r.err.count("token id 99") == 1 and "sample 70" in r.err,
            "2 ranks: a bad row is reported once, exit 2", r.describe())


# ---- streaming -----------------------------------------------------------

def mix64(x):
    """sp_mix64 (schemas/common.h)."""
    m = (1 << 64) - 1
    x = (x + 0x9e3779b97f4a7c15) & m
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & m
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & m
    return x ^ (x >> 31)


def permutation(n, seed, task, e):
    """The epoch shuffle of schemas/DATASET-FORMAT.md ("Order")."""
    h = 0xcbf29ce484222325
    for b in task.encode():
        h = ((h ^ b) * 0x100000001b3) & ((1 << 64) - 1)
    key = mix64(seed ^ 0x64617461) ^ h
    key = mix64(key ^ mix64(e))
    out = list(range(n))
    for i in range(n - 1, 0, -1):
        j = mix64((key + i) & ((1 << 64) - 1)) % (i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def step_samples(model, task, step):
    """The samples of a task's step (1-based), as the runtime orders them."""
    t = next(t for t in model["tasks"] if t["name"] == task)
    n, b = SAMPLES[task], t["batch"]
    spe = n // b
    e, j = (step - 1) // spe, (step - 1) % spe
    return permutation(n, model["seed"], task, e)[j * b:(j + 1) * b]


def streaming(F, tmp, model, plans, ds):
    # a caption sample step 3 reads and steps 1 and 2 do not
    early = set(step_samples(model, "caption", 1) + step_samples(model, "caption", 2))
    s = next(x for x in step_samples(model, "caption", 3) if x not in early)
    k, row = (0, s) if s < SAMPLES["caption"] // 2 else (1, s - SAMPLES["caption"] // 2)
    bad = os.path.join(tmp, "late")
    shutil.copytree(ds, bad)
    rewrite(shard(bad, "caption", k), lambda t: set_at(t, "txt_in.tokens", 12 * row, 64))
    want = [f"caption-{k:05d}.safetensors", "'txt_in.tokens'",
            f"row {row} (sample {s} of task 'caption'), read for step 3", "token id 64"]
    # with 2 micro-batches the message names the step too, not the micro-step
    mb2 = R.make_plan(tmp, model, "demo-mb2", 1, "spindle", ("--microbatches", "2"))
    for n, plan, what in ((1, plans[1], ""), (2, plans[2], ""),
                          (1, mb2, ", 2 micro-batches")):
        r = R.run(plan, n, "--steps", 4, "--data", bad, "--timeout", 60)
        ok = (r.rc == 2 and all(w in r.err for w in want) and r.err.count("token id") == 1
              and "step   2" in r.out and "step   3" not in r.out)
        F.check(ok, f"{n} rank(s){what}: a bad row only step 3 reads stops the run after "
                "step 2 with exit 2, naming file, tensor, sample and step, once",
                r.describe())
    # a shard truncated while the run reads: the first step read after the
    # cut stops it (the log, written each step, says when step 1 is done)
    cut = os.path.join(tmp, "cut-live")
    shutil.copytree(ds, cut)
    log = os.path.join(tmp, "cut-live.csv")
    p = subprocess.Popen(R.command(plans[1], 1, "--steps", 30, "--data", cut, "--log", log,
                                   "--quiet", "--timeout", 60),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < 60 and not (
            os.path.exists(log) and len(open(log).read().splitlines()) > 3):
        time.sleep(0.002)
    truncate(shard(cut, "caption", 1))
    out, err = p.communicate(timeout=120)
    steps = {r["step"] for r in R.read_log(log)}
    F.check(p.returncode == 2 and "caption-00001.safetensors" in err
            and "changed on disk after start-up" in err and "1" in steps
            and "30" not in steps and err.count("changed on disk") == 1,
            "a shard truncated mid-run stops it with exit 2, naming the file "
            f"(after steps {sorted(steps, key=int)})", f"rc {p.returncode}\n{err}")

    # two steps' rows resident, whatever the dataset's size
    step_bytes = sum(t["batch"] * sum((seq * width + 1) * 4
                                      for _, _, seq, width, _ in G.columns(model, t))
                     for t in model["tasks"])
    big = os.path.join(tmp, "big")
    G.make(model, big, {k: 10 * v for k, v in SAMPLES.items()})
    size = sum(os.path.getsize(os.path.join(big, f)) for f in os.listdir(big))
    for d in (ds, big):
        r = R.run(plans[1], 1, "--steps", 2, "--data", d)
        got = [int(w.split()[3]) for w in r.out.splitlines() if w.startswith("rank 0 data:")]
        F.check(r.rc == 0 and got == [2 * step_bytes] and 2 * step_bytes < size / 4,
                f"rows resident: two steps' ({2 * step_bytes} bytes; the larger dataset "
                f"has {size})", r.describe())


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        model = R.demo_model()
        plans = {n: R.make_plan(tmp, model, "demo", n) for n in (1, 2, 3)}
        ds = os.path.join(tmp, "ds")
        G.make(model, ds, SAMPLES)
        equivalence(F, tmp, plans, ds)
        resume(F, tmp, plans, ds)
        strict(F, tmp, plans, ds)
        streaming(F, tmp, model, plans, ds)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
