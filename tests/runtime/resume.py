#!/usr/bin/env python3
"""Resume is exact. For the demo model with AdamW and with SGD:

  * same plan (4 ranks): 6 steps in one run, against 3 steps, save, stop,
    load, 3 more steps. The losses (from --log), the parameter hash column
    and the --dump-params file are BIT-identical, and the resumed log
    continues at step 4 (spindle-run's --steps counts steps after the
    loaded one).
  * another plan: the checkpoint saved under the 4-rank 'spindle' plan is
    resumed under a 2-rank 'sequential' and a 3-rank 'distmm-mt' plan; the
    result equals the 6-step 4-rank run within the tolerance of
    tests/runtime/equivalence.py (SGD: relative 1e-4 + 1e-7, the tight
    check; AdamW: its floor 1e-2 * lr), which is how much two plans of the
    same model may differ at all.

Checkpoints outlive state layouts (AdamW, whose m and v are what zero-1
shards): saved under a 4-rank plan with every bucket zero-1, resumed under
the same plan (bit-identical) and under a 2-rank replicated plan; saved
under the 2-rank replicated plan, resumed under the 4-rank zero-1 plan
(both within tolerance of the uninterrupted run of the saving plan); the
same with zero-2 and with zero-3 (whose weights are sharded too: the
checkpoint all-gathers them whole, a resume keeps each rank's shard), and
with a 4-rank plan that mixes zero-3 buckets with zero-0/1/2 ones
(tests/lib/mixed.py). A 4-rank zero-1 plan with deferred all-gathers
saves with its last step's gathers in flight; resumed on 2 replicated
ranks it continues the uninterrupted run.

Checkpoints stay whole under tensor parallelism: saved under a 4-rank plan
with --tp 4, resumed under it (bit-identical) and under the one-device
plan, and the other way round.

Checkpoints do not depend on micro-batches per task: saved and resumed
under plans with the same per-task counts on 3 and 2 ranks.

Also: --save-every keeps the newest snapshot and the one before; a run
trained with --seed 7 resumes without --seed on seed 7's data stream (bit-
identical to 6 uninterrupted steps with --seed 7).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402
import mixed as MX  # noqa: E402  (tests/lib, on rtlib's path)

STEPS = 6
HALF = 3


def outputs(tmp, tag):
    return os.path.join(tmp, f"{tag}.csv"), os.path.join(tmp, f"{tag}.dump")


def train(plan, ranks, tmp, tag, *extra):
    log, dump = outputs(tmp, tag)
    R.must(R.run(plan, ranks, "--quiet", "--timeout", "60", "--log", log, "--dump-params",
                 dump, *extra), tag)
    return R.read_log(log), open(dump, "rb").read()


def check_optimizer(F, tmp, opt):
    kind = opt["type"]
    model = R.demo_model(opt)
    p4 = R.make_plan(tmp, model, kind, 4, "spindle")
    p2 = R.make_plan(tmp, model, kind, 2, "sequential")
    p3 = R.make_plan(tmp, model, kind, 3, "distmm-mt")
    ck = os.path.join(tmp, f"ck-{kind}")

    ref_log, ref_dump = train(p4, 4, tmp, f"{kind}-ref", "--steps", STEPS)
    train(p4, 4, tmp, f"{kind}-first", "--steps", HALF, "--save", ck)
    F.check(open(os.path.join(ck, "LATEST")).read() == f"step-{HALF:08d}\n",
            f"{kind}: LATEST names step-{HALF:08d}")

    # same plan: bit-identical
    log, dump = train(p4, 4, tmp, f"{kind}-resumed", "--steps", STEPS - HALF, "--load", ck)
    steps = sorted({int(r["step"]) for r in log})
    F.check(steps == list(range(HALF + 1, STEPS + 1)),
            f"{kind}: the resumed log continues at step {HALF + 1}", f"steps {steps}")
    tail = [r for r in ref_log if int(r["step"]) > HALF]
    key = [(r["step"], r["task"], r["loss"], r["param_hash"]) for r in tail]
    got = [(r["step"], r["task"], r["loss"], r["param_hash"]) for r in log]
    F.check(key == got, f"{kind}: same plan: losses and parameter hashes bit-identical",
            f"uninterrupted {key}\nresumed      {got}")
    F.check(dump == ref_dump, f"{kind}: same plan: --dump-params bit-identical")

    # other plans, other algorithms: within equivalence.py's tolerance
    ref = (R.load_dump(outputs(tmp, f"{kind}-ref")[1]), tail)
    for plan, ranks, algo in ((p2, 2, "sequential"), (p3, 3, "distmm-mt")):
        tag = f"{kind}-resumed-{ranks}"
        log, _ = train(plan, ranks, tmp, tag, "--steps", STEPS - HALF, "--load", ck)
        got = (R.load_dump(outputs(tmp, tag)[1]), log)
        err = R.compare(ref, got, R.FLOOR[kind],
                        f"{kind}: saved on 4 ranks (spindle), resumed on {ranks} ({algo})")
        F.check(err is None, f"{kind}: saved on 4 ranks (spindle), resumed on {ranks} ranks "
                f"({algo}) within tolerance (floor {R.FLOOR[kind]:g})", err or "")


def across_plans(F, tmp, tag, big, nb, small, ns, names):
    """Saved under plan big (nb ranks), resumed under the same plan
    (bit-identical) and under plan small (ns ranks); saved under small,
    resumed under big (both within tolerance of the uninterrupted run of
    the saving plan)."""
    refs = {sr: train(plan, sr, tmp, f"{tag}-ref-{sr}", "--steps", STEPS)
            for plan, sr in ((big, nb), (small, ns))}
    for src, sr, dst, dr in ((big, nb, big, nb), (big, nb, small, ns), (small, ns, big, nb)):
        what = f"adamw: saved on {sr} ranks ({names[src]}), resumed on {dr} ({names[dst]})"
        ck = os.path.join(tmp, f"ck-{tag}-{sr}-{dr}")
        ref_log, ref_dump = refs[sr]
        train(src, sr, tmp, f"{tag}-first-{sr}-{dr}", "--steps", HALF, "--save", ck)
        run = f"{tag}-resumed-{sr}-{dr}"
        log, dump = train(dst, dr, tmp, run, "--steps", STEPS - HALF, "--load", ck)
        if src == dst:
            F.check(dump == ref_dump, what + ": --dump-params bit-identical")
            continue
        tail = [r for r in ref_log if int(r["step"]) > HALF]
        ref = (R.load_dump(outputs(tmp, f"{tag}-ref-{sr}")[1]), tail)
        err = R.compare(ref, (R.load_dump(outputs(tmp, run)[1]), log), R.FLOOR["adamw"], what)
        F.check(err is None, what + " within tolerance", err or "")


def check_zero(F, tmp, z):
    """z = 1, 2 or 3: the 4-rank plan with every bucket zero-z against the
    2-rank replicated one (zero-2 shards the gradients too, which a
    checkpoint does not hold: the same AdamW state as zero-1; zero-3 the
    weights too)."""
    model = R.demo_model(R.ADAMW)
    tag = f"z{z}"
    mpath = R.W.write_json(tmp, f"{tag}.model.json", model)
    p4 = os.path.join(tmp, f"{tag}.4.bin")
    R.W.plan(mpath, R.W.write_json(tmp, "cpu-4.json", R.W.cluster(4)), p4, "spindle",
             ("--zero", str(z)))
    p2 = R.make_plan(tmp, model, tag, 2, "spindle")
    across_plans(F, tmp, tag, p4, 4, p2, 2, {p4: f"zero-{z}", p2: "replicated"})


def check_defer(F, tmp):
    """A checkpoint saved by a 4-rank zero-1 plan with deferred all-gathers
    (--defer-gather on), the saving run unlogged (no per-step digest, so
    the last step's all-gathers are still in flight when the save starts
    and the save must complete them), resumed under the 2-rank replicated
    plan: within tolerance of the uninterrupted 4-rank run. The saving run
    and the uninterrupted one run with --check-deferred (the weights
    outside a rank's shard NaN until their gather is waited for: a save or
    a use before the wait spoils the result); the saving run also without
    it, whose checkpoint must be byte-identical (the normal path)."""
    model = R.demo_model(R.ADAMW)
    mpath = R.W.write_json(tmp, "defer.model.json", model)
    p4 = os.path.join(tmp, "defer.4.bin")
    R.W.plan(mpath, R.W.write_json(tmp, "cpu-4.json", R.W.cluster(4)), p4, "spindle",
             ("--zero", "1", "--defer-gather", "on"))
    view = subprocess.run([os.environ["SPINDLE_SHOW"], p4, "--json"], capture_output=True,
                          text=True, timeout=60, check=True)
    nd = sum(b["defer"] for b in json.loads(view.stdout)["buckets"])
    F.check(nd > 0, f"defer: the 4-rank plan defers {nd} buckets' all-gathers",
            "no bucket is deferred")
    p2 = R.make_plan(tmp, model, "defer", 2, "spindle")
    ref_log, _ = train(p4, 4, tmp, "defer-ref", "--steps", STEPS, "--check-deferred")
    ck, plain = os.path.join(tmp, "ck-defer"), os.path.join(tmp, "ck-defer-plain")
    R.must(R.run(p4, 4, "--quiet", "--timeout", "60", "--steps", HALF, "--save", ck,
                 "--check-deferred"), "defer-first")
    R.must(R.run(p4, 4, "--quiet", "--timeout", "60", "--steps", HALF, "--save", plain),
           "defer-first-plain")
    F.check(R.snapshot_listing(ck) == R.snapshot_listing(plain),
            "defer: the checkpoint saved with --check-deferred equals the one saved without",
            "they differ")
    log, dump = train(p2, 2, tmp, "defer-resumed", "--steps", STEPS - HALF, "--load", ck)
    what = "adamw: saved on 4 ranks (zero-1, deferred all-gathers), resumed on 2 (replicated)"
    tail = [r for r in ref_log if int(r["step"]) > HALF]
    ref = (R.load_dump(outputs(tmp, "defer-ref")[1]), tail)
    err = R.compare(ref, (R.load_dump(outputs(tmp, "defer-resumed")[1]), log),
                    R.FLOOR["adamw"], what)
    F.check(err is None, what + " within tolerance", err or "")


def check_mixed(F, tmp):
    """A plan mixing zero-3 buckets with zero-0/1/2 ones (tests/lib/mixed.py:
    --zero auto at the smallest memory that fits, 4 ranks) against the
    2-rank replicated plan of the same model (--zero 0), both ways."""
    model = MX.model(dict(R.W.ADAMW))  # equivalence.py's
    mpath = R.W.write_json(tmp, "mixed.model.json", model)
    mib, _, p4 = MX.smallest_fit(mpath, tmp, "mixed.4", 4)
    mix = MX.mixing_devices(p4)
    F.check(bool(mix), f"mixed: the 4-rank plan at {mib} MiB mixes zero-3 with other layouts",
            "no device holds a zero-3 bucket and one of another layout")
    if not mix:
        return
    p2 = os.path.join(tmp, "mixed.2.bin")
    R.W.plan(mpath, R.W.write_json(tmp, "cpu-2.json", R.W.cluster(2)), p2, "spindle",
             ("--zero", "0"))
    across_plans(F, tmp, "mixed", p4, 4, p2, 2, {p4: "mixed zero-3", p2: "replicated"})


def check_tp(F, tmp, vocab=None):
    """Checkpoints stay whole under tensor parallelism: saved under a 4-rank
    plan whose transformer slices are split 4 ways (--tp 4), resumed under
    the same plan (bit-identical) and under the 1-rank plan; saved under
    the 1-rank plan, resumed under the --tp 4 plan (within tolerance of the
    uninterrupted run of the saving plan). The --tp 4 plan also splits the
    embeddings and the LM head by vocabulary (asserted), so their shards
    are joined into whole tables and cut again. vocab (e.g. 11): that
    vocabulary, split unevenly (vocab_shard: 3, 3, 3, 2 ids)."""
    model = R.demo_model(R.ADAMW)
    tag = "tp"
    if vocab:
        model, tag = R.W.with_vocab(model, vocab), f"tpv{vocab}"
    # sequential: every slice on the 4 devices, so every transformer splits
    p4 = R.make_plan(tmp, model, tag, 4, "sequential", ("--tp", "4"))
    v = subprocess.run([os.environ["SPINDLE_SHOW"], p4, "--json"], capture_output=True,
                       text=True, timeout=60, check=True)
    kinds = {f"{t['name']}/{n['id']}": model["components"][n["component"]]["type"]
             for t in model["tasks"] for n in t["graph"]}
    split = {kinds[s["metaop"]] for w in json.loads(v.stdout)["waves"] for s in w["slices"]
             if s["tp"] == 4}
    F.check({"embedding", "lm_head"} <= split,
            f"{tag}: the --tp 4 plan splits an embedding and an LM head 4 ways", str(split))
    p1 = R.make_plan(tmp, model, tag, 1, "spindle")
    across_plans(F, tmp, tag, p4, 4, p1, 1, {p4: "--tp 4", p1: "one device"})


def check_save_every(F, tmp):
    model = R.demo_model(R.SGD)
    p2 = R.make_plan(tmp, model, "every", 2, "spindle")
    ck = os.path.join(tmp, "ck-every")
    R.must(R.run(p2, 2, "--quiet", "--steps", 5, "--save", ck, "--save-every", 2), "save-every")
    names = sorted(os.listdir(ck))
    F.check(names == ["LATEST", "step-00000004", "step-00000005"],
            "--save-every 2 for 5 steps keeps step 4 and step 5, LATEST names 5",
            f"found {names}")
    F.check(open(os.path.join(ck, "LATEST")).read() == "step-00000005\n", "LATEST is step 5")


def check_seed(F, tmp):
    model = R.demo_model(R.SGD)
    p2 = R.make_plan(tmp, model, "seed", 2, "spindle")
    ck = os.path.join(tmp, "ck-seed")
    ref_log, ref_dump = train(p2, 2, tmp, "seed-ref", "--steps", 4, "--seed", 7)
    train(p2, 2, tmp, "seed-first", "--steps", 2, "--seed", 7, "--save", ck)
    log, dump = train(p2, 2, tmp, "seed-resumed", "--steps", 2, "--load", ck)
    F.check(dump == ref_dump and [r["loss"] for r in log] ==
            [r["loss"] for r in ref_log if int(r["step"]) > 2],
            "a checkpoint trained with --seed 7 resumes on seed 7's data (bit-identical)")


def check_microtask(F, tmp):
    """Checkpoints do not depend on micro-batches per task: saved under a
    3-rank plan with --microbatches match=2,caption=4, resumed under it
    (bit-identical) and under a 2-rank plan with the same counts (another
    schedule), and the other way round (within tolerance). The counts stay
    the same: contrastive negatives come from the micro-batch."""
    model = R.demo_model(R.ADAMW)
    opt = ("--microbatches", "match=2,caption=4")
    p3 = R.make_plan(tmp, model, "mbt", 3, "spindle", opt)
    p2 = R.make_plan(tmp, model, "mbt", 2, "sequential", opt)
    across_plans(F, tmp, "mbt", p3, 3, p2, 2, {p3: "spindle, per task", p2: "sequential, "
                                                                           "per task"})


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        if os.environ.get("RESUME_ONLY") == "zero3":  # the zero-3 case alone
            check_zero(F, tmp, 3)
            return F.exit()
        if os.environ.get("RESUME_ONLY") == "defer":  # the deferred all-gathers alone
            check_defer(F, tmp)
            return F.exit()
        if os.environ.get("RESUME_ONLY") == "mixed":  # the mixed-layout case alone
            check_mixed(F, tmp)
            return F.exit()
        if os.environ.get("RESUME_ONLY") == "tp":  # the tensor-parallel cases alone
            check_tp(F, tmp)
            check_tp(F, tmp, vocab=11)
            return F.exit()
        check_optimizer(F, tmp, R.SGD)
        check_optimizer(F, tmp, R.ADAMW)
        check_zero(F, tmp, 1)
        check_zero(F, tmp, 2)
        check_zero(F, tmp, 3)
        check_defer(F, tmp)
        check_mixed(F, tmp)
        check_tp(F, tmp)
        check_tp(F, tmp, vocab=11)
        check_microtask(F, tmp)
        check_save_every(F, tmp)
        check_seed(F, tmp)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
