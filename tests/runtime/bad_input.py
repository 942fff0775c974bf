#!/usr/bin/env python3
"""Bad input at the runtime: a clear message, exit status 2 (bad input) or
1 (an I/O failure while running), and no partial checkpoint left behind.

  * a plan for 4 devices started on 2 ranks (and on 1, without mpirun)
  * a checkpoint of another model (other components; same components of
    other sizes; another optimizer), from a newer format version, with a
    --seed other than the one it was trained with
  * crafted plans that pass the reader but not the plan verifier, which
    every rank runs before step 1 (the instructions patched, the checksum
    made right again): each is refused with exit 2 and the verifier's
    message naming the device and instruction, once, before step 1, on
    every rank (4 ranks: no hang). Those the runtime's own checks also
    catch are run again with --no-verify, which must reach those checks:
    a program that issues one sync bucket's all-reduce twice and another's
    never (the step updates bucket by bucket after each all-reduce); a BWD
    over more samples than its FWD kept activations for (with and without
    recomputation); a RECV over fewer samples than its SEND sends; slices
    whose split disagrees with the shards their devices hold; a BWD before
    its FWD; a RECV whose tag no SEND uses (its SEND never received). Those
    only the verifier catches: a decoder's memory-gradient COPY emptied
    (with --no-verify it trains, wrong, to exit 0: the verifier is what
    stops it), a plan whose memory exceeds its own cluster's (patched
    memory_gib; with --no-verify it runs)
  * an unusable --save directory, refused at start-up before any step: a
    path under a regular file (ENOTDIR), a path that is a regular file, a
    missing parent. As root, chmod does not stop writes and no read-only
    mount can be made here, so EACCES/EROFS themselves are not simulated;
    they take the same path (mkdir or the probe file fails).
  * a full disk, simulated by SPINDLE_FAULT=enospc-in-save:BYTES (every
    write of a save fails with ENOSPC after BYTES bytes): early in a
    component file, in the manifest, and in LATEST itself (after the new
    snapshot was renamed into place). Each time the run exits 1 naming the
    file and "No space left on device", and the checkpoint directory is
    byte for byte as before: no step-*/ directory, no temporary, the same
    LATEST, which still loads.
"""
import os
import shutil
import struct
import sys
import tempfile
import zlib

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402


def expect(F, r, rc, texts, what):
    ok = r.rc == rc and all(t in r.err for t in texts)
    return F.check(ok, f"{what}: exit {rc}", r.describe())


def wrong_np(F, p4):
    r = R.run(p4, 4, "--steps", 1, "--timeout", 20, np=2)
    expect(F, r, 2, ["the plan is for 4 devices but 2 ranks were started",
                     "hint: run: mpirun -np 4"], "a 4-device plan on 2 ranks")
    F.check(r.err.count("the plan is for 4 devices") == 1, "... reported once, by rank 0",
            r.describe())
    r = R.run(p4, 1, "--steps", 1)
    expect(F, r, 2, ["the plan is for 4 devices but 1 rank was started"],
           "a 4-device plan without mpirun")


def other_checkpoints(F, tmp, p1, good):
    # another model altogether
    rnd = R.W.random_workload(3, optimizer=R.ADAMW)
    pr = R.make_plan(tmp, rnd, "random3", 1)
    ck = os.path.join(tmp, "ck-random")
    R.must(R.run(pr, 1, "--quiet", "--steps", 1, "--save", ck), "random workload")
    r = R.run(p1, 1, "--steps", 1, "--load", ck)
    expect(F, r, 2, ["a checkpoint resumes only a model with the same components"],
           "a checkpoint of another model")
    F.check("which the model 'demo' lacks" in r.err or "has no file for component" in r.err,
            "... names the component that differs", r.describe())
    # the same components, one of another size
    m = R.demo_model(R.ADAMW)
    m["components"]["cls"]["classes"] = 5
    p5 = R.make_plan(tmp, m, "classes5", 1)
    r = R.run(p5, 1, "--steps", 1, "--load", good)
    expect(F, r, 2, ["cls.safetensors", "component 'cls' in the checkpoint",
                     "differs from the model's"], "a component of another size")
    # another optimizer
    ps = R.make_plan(tmp, R.demo_model(R.SGD), "sgd", 1)
    r = R.run(ps, 1, "--steps", 1, "--load", good)
    expect(F, r, 2, ["checkpoint optimizer 'adamw' differs from the model's 'sgd'"],
           "a checkpoint of another optimizer")
    # a newer format version (checked before the manifest's checksum)
    d = os.path.join(tmp, "ck-v2")
    shutil.copytree(good, d)
    man = os.path.join(R.latest_snapshot(d), "manifest.json")
    R.edit(man, lambda t: t.replace("spindle.checkpoint/1", "spindle.checkpoint/2"))
    r = R.run(p1, 1, "--steps", 1, "--load", d)
    expect(F, r, 2, [man, "checkpoint format 'spindle.checkpoint/2' is newer than this build",
                     "hint:"], "a checkpoint from a newer format version")
    # not a checkpoint at all
    r = R.run(p1, 1, "--steps", 1, "--load", tmp)
    expect(F, r, 2, ["no checkpoint here"], "a directory without a checkpoint")
    # another seed
    r = R.run(p1, 1, "--steps", 1, "--load", good, "--seed", 99)
    expect(F, r, 2, ["the checkpoint was trained with seed 1, not 99", "hint: omit --seed"],
           "--seed other than the checkpoint's")


def bad_save_dirs(F, tmp, p1, p4):
    f = os.path.join(tmp, "a-file")
    open(f, "w").write("not a directory\n")
    log = os.path.join(tmp, "never.csv")
    for what, path, text in (
            ("--save under a regular file", os.path.join(f, "ckpt"), "Not a directory"),
            ("--save naming a regular file", f, "not a directory"),
            ("--save with a missing parent", os.path.join(tmp, "no", "such", "dir"),
             "hint: create its parent directory first")):
        r = R.run(p1, 1, "--steps", 3, "--save", path, "--log", log)
        expect(F, r, 2, [path, text], what)
        F.check("step " not in r.out and not os.path.exists(log),
                f"{what}: refused at start-up, before any step", r.describe())
    r = R.run(p4, 4, "--steps", 3, "--timeout", 20, "--save", os.path.join(f, "ckpt"))
    expect(F, r, 2, ["Not a directory"], "4 ranks: --save under a regular file (all ranks)")
    F.check("step " not in r.out and r.err.count("Not a directory") == 1,
            "4 ranks: refused at start-up, reported once", r.describe())


def bad_late_outputs(F, tmp, p1, p4):
    # files written after the last step (trace, parameter dump, export):
    # a directory, an empty name or a missing directory is refused before
    # step 1 (the trace and dump once failed at the end with exit 1)
    d = os.path.join(tmp, "a-dir")
    os.makedirs(d, exist_ok=True)
    log = os.path.join(tmp, "late.csv")
    for opt in ("--trace", "--dump-params", "--export"):
        for what, path, text in ((f"{opt} naming a directory", d, "is a directory"),
                                 (f"{opt} ''", "", "the output file name is empty"),
                                 (f"{opt} in a missing directory",
                                  os.path.join(tmp, "no", "x"), "No such file or directory")):
            r = R.run(p1, 1, "--steps", 2, opt, path, "--log", log)
            expect(F, r, 2, [text], what)
            F.check("step " not in r.out and not os.path.exists(log),
                    f"{what}: refused at start-up, before any step", r.describe())
    r = R.run(p4, 4, "--steps", 2, "--timeout", 20, "--trace", d)
    expect(F, r, 2, ["is a directory"], "4 ranks: --trace naming a directory")
    F.check("step " not in r.out and r.err.count("is a directory") == 1,
            "4 ranks: --trace naming a directory refused at start-up, reported once",
            r.describe())


def full_disk(F, tmp, p4, good):
    snap = R.latest_snapshot(good)
    files = sorted(os.listdir(snap))
    total = sum(os.path.getsize(os.path.join(snap, n)) for n in files)
    man = os.path.getsize(os.path.join(snap, "manifest.json"))
    for what, budget, where in (
            ("early in a component file", 1000, ".safetensors"),
            ("in the manifest", total - man + 10, "manifest.json"),
            ("in LATEST, after the snapshot's rename", total + 5, "LATEST")):
        d = os.path.join(tmp, "ck-full")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        before = R.snapshot_listing(d)
        r = R.run(p4, 4, "--steps", 2, "--timeout", 20, "--load", d, "--save", d,
                  env={"SPINDLE_FAULT": f"enospc-in-save:{budget}"})
        line = [x for x in r.err.splitlines() if "No space left on device" in x]
        F.check(r.rc == 1 and len(line) == 1 and where in line[0],
                f"ENOSPC {what}: exit 1, the file named once", r.describe())
        after = R.snapshot_listing(d)
        F.check(after == before, f"ENOSPC {what}: the checkpoint directory is unchanged",
                f"before {sorted(before)}\nafter  {sorted(after)}")
        r = R.run(p4, 4, "--quiet", "--steps", 1, "--timeout", 20, "--load", d)
        F.check(r.rc == 0, f"ENOSPC {what}: the previous checkpoint still loads", r.describe())


def edit_records(src, dst, section, rec, fn):
    """A copy of plan src with fn(b, ats) applied, ats the byte offsets of
    the records (rec bytes each) of section id `section`, and the CRC
    redone: still valid for the reader."""
    b = bytearray(open(src, "rb").read())
    hsize, nsec = struct.unpack_from("<I", b, 16)[0], struct.unpack_from("<I", b, 28)[0]
    for e in range(nsec):
        sid, _, off, size, count = struct.unpack_from("<IIQQQ", b, hsize + 40 * e)
        if sid == section:
            assert size == rec * count, \
                f"section {sid}: {size} bytes are not {count} records of {rec} " \
                "(the plan format changed: update the record sizes here)"
            fn(b, [off + rec * k for k in range(count)])
            break
    struct.pack_into("<I", b, 32, zlib.crc32(bytes(b[hsize:])) & 0xFFFFFFFF)
    open(dst, "wb").write(b)


def edit_provenance(src, dst, fn):
    """Provenance: one 64-byte record; memory_gib f64 at 44, mem_reserve_gib
    at 52."""
    edit_records(src, dst, 2, 64, fn)


def edit_instructions(src, dst, fn):
    """Instructions: 60 bytes each; op at 0, s0 at 8, s1 at 12, peer at 52."""
    edit_records(src, dst, 18, 60, fn)


def edit_slices(src, dst, fn):
    """Slices: 68 bytes each; n_dev at 16, tp at 60, sp at 64."""
    edit_records(src, dst, 12, 68, fn)


def split_none(b, ats):
    """Every split slice claims whole layers, while its devices hold shards:
    the layers would read a shard as a whole layer (past its end). Sequence
    parallelism, which needs a split, goes with it."""
    for at in ats:
        if struct.unpack_from("<i", b, at + 60)[0] > 1:
            struct.pack_into("<i", b, at + 60, 1)
            struct.pack_into("<i", b, at + 64, 0)


def split_first(src, dst):
    """The first transformer slice (type 2 in the metaops section, 140-byte
    records (format 4), shape.type at 4) of even width claims to be split 2 ways while
    its devices hold whole layers: it would train wrong numbers without a
    word."""
    mops = []
    edit_records(src, dst, 8, 140, lambda b, ats: mops.extend(
        struct.unpack_from("<I", b, a + 4)[0] for a in ats))

    def fn(b, ats):
        at = next(a for a in ats if mops[struct.unpack_from("<i", b, a + 4)[0]] == 2 and
                  struct.unpack_from("<i", b, a + 16)[0] % 2 == 0)
        struct.pack_into("<i", b, at + 60, 2)
    edit_slices(src, dst, fn)


def shards_mismatch(F, tmp):
    """A crafted plan whose slices' split disagrees with the shards their
    devices hold is refused (exit 2, naming the instruction and the shard)
    before anything runs."""
    model = R.demo_model(R.ADAMW)
    for name, tp, fn, what, verifier in (
            ("tp2", "2", lambda s, d: edit_slices(s, d, split_none), "split slices made whole",
             ["(fwd): size mismatch: samples", "are not this device's range of the slice"]),
            ("tp1", "1", split_first, "a whole slice made split",
             ["tensor parallelism:", "is split 1 ways in slice"])):
        src = R.make_plan(tmp, model, f"bad-{name}", 4, "sequential", ("--tp", tp))
        bad = src + ".mismatch.bin"
        fn(src, bad)
        refused(F, bad, 4, verifier, ["split", "ways, but the rank holds shard"], what)


def retarget_sync(b, ats):
    """The first SYNC names the bucket of the second one, so one bucket's
    all-reduce is issued twice and another's never."""
    syncs = [at for at in ats if struct.unpack_from("<i", b, at)[0] == 7]
    peers = [struct.unpack_from("<i", b, at + 52)[0] for at in syncs]
    k = next(i for i in range(1, len(peers)) if peers[i] != peers[0])
    struct.pack_into("<i", b, syncs[0] + 52, peers[k])


def halve_last_fwd(b, ats):
    """The last FWD keeps half its samples' activations while its BWD (same
    slice, same first sample) still runs all of them: the BWD would read
    saved activations (and, recomputing, scratch) past the FWD's block."""
    at = [a for a in ats if struct.unpack_from("<i", b, a)[0] == 1][-1]
    s0, s1 = struct.unpack_from("<ii", b, at + 8)
    struct.pack_into("<i", b, at + 12, s0 + (s1 - s0) // 2)


def halve_first_recv(b, ats):
    """The first RECV takes half the samples its SEND sends: the transport
    would write the whole message into a buffer sized for half."""
    at = next(a for a in ats if struct.unpack_from("<i", b, a)[0] == 4)
    s0, s1 = struct.unpack_from("<ii", b, at + 8)
    struct.pack_into("<i", b, at + 8, s0 + (s1 - s0) // 2)


def bwd_first(b, ats):
    """The first FWD and the BWD of its slice trade places: the BWD runs
    before its activations are saved."""
    ops = [struct.unpack_from("<ii", b, a) for a in ats]
    f = next(i for i, o in enumerate(ops) if o[0] == 1)
    k = next(i for i, o in enumerate(ops) if o[0] == 2 and o[1] == ops[f][1])
    fwd, bwd = bytes(b[ats[f]:ats[f] + 60]), bytes(b[ats[k]:ats[k] + 60])
    b[ats[f]:ats[f] + 60], b[ats[k]:ats[k] + 60] = bwd, fwd


def retag_first_recv(b, ats, tag=None):
    """The first RECV waits for a tag no SEND uses (the next free one, or
    `tag`): its SEND is never received, the RECV never completes."""
    tags = [struct.unpack_from("<i", b, a + 56)[0] for a in ats]
    at = next(a for a in ats if struct.unpack_from("<i", b, a)[0] == 4)
    struct.pack_into("<i", b, at + 56, max(tags) + 1 if tag is None else tag)


def empty_memory_grad_copy(b, ats):
    """The COPY that returns a decoder's memory gradient grad(c, -1) to its
    producer's output gradient covers no sample: as if dropped."""
    at = next(a for a in ats if struct.unpack_from("<i", b, a)[0] == 5 and
              struct.unpack_from("<ii", b, a + 24) == (-1, 1))
    struct.pack_into("<i", b, at + 12, struct.unpack_from("<i", b, at + 8)[0])


RUNTIME_SAYS = "the plan's parameters, buckets and programs do not agree"
VERIFIER_SAYS = "plan verification failed: "


def refused(F, bad, ranks, verifier, runtime, what):
    """The verifier refuses plan `bad` before step 1 (exit 2, its message
    with the texts `verifier`, reported once); with --no-verify the
    runtime's own checks refuse it (`runtime`), or with runtime None it
    runs one step."""
    args = ("--steps", 1, "--timeout", 20)
    r = R.run(bad, ranks, *args)
    expect(F, r, 2, [bad + ": " + VERIFIER_SAYS, "hint: "] + verifier, f"{what}: the verifier")
    F.check("step " not in r.out and r.err.count(VERIFIER_SAYS) == 1,
            f"{what}: refused before step 1, reported once", r.describe())
    r = R.run(bad, ranks, *args, "--no-verify")
    if runtime is None:
        F.check(r.rc == 0 and "step   1" in r.out and VERIFIER_SAYS not in r.err,
                f"{what}: --no-verify skips the verifier (one step runs)", r.describe())
    else:
        expect(F, r, 2, runtime, f"{what}: --no-verify, the runtime's own check")
        F.check(VERIFIER_SAYS not in r.err, f"{what}: --no-verify skips the verifier",
                r.describe())


def swap_first(src, dst, pair):
    """Plan src with its first two consecutive instructions for which
    pair(b, ats, k, op) holds (op: every op code; k the second's index)
    swapped."""
    def fn(b, ats):
        op = [struct.unpack_from("<i", b, a)[0] for a in ats]
        k = next(k for k in range(1, len(ats)) if pair(b, ats, k, op))
        first, second = bytes(b[ats[k - 1]:ats[k - 1] + 60]), bytes(b[ats[k]:ats[k] + 60])
        b[ats[k - 1]:ats[k - 1] + 60], b[ats[k]:ats[k] + 60] = second, first
    edit_instructions(src, dst, fn)


def sync_before_bwd(src, dst):
    """A zero-2 plan whose first BWD followed by the SYNC of a zero-2 bucket
    (layout 2: bucket records of 52 bytes, layout at 32) runs the SYNC
    first: the BWD would write into a full gradient the SYNC has freed."""
    z2 = []
    edit_records(src, dst, 14, 52, lambda b, ats: z2.extend(
        struct.unpack_from("<I", b, a + 32)[0] == 2 for a in ats))
    swap_first(src, dst, lambda b, ats, k, op: op[k - 1] == 2 and op[k] == 7 and
               z2[struct.unpack_from("<i", b, ats[k] + 52)[0]])


def free_before_use(src, dst):
    """A zero-3 plan whose first PFREE (op 11) right after a FWD (op 1) is
    moved before it: the FWD reads weights already given back."""
    swap_first(src, dst, lambda b, ats, k, op: op[k - 1] == 1 and op[k] == 11)


def misc(F, tmp, p1):
    bad = p1 + ".sync-twice.bin"
    edit_instructions(p1, bad, retarget_sync)
    refused(F, bad, 1, ["(step): deadlock: waits for a sync some member never starts"],
            [RUNTIME_SAYS], "a program that issues one bucket's all-reduce twice and "
            "another's never")
    for name, extra in (("keep", ()), ("recompute", ("--recompute", "all"))):
        src = R.make_plan(tmp, R.demo_model(R.ADAMW), f"bad-{name}", 1, extra=extra)
        bad = src + ".short-fwd.bin"
        edit_instructions(src, bad, halve_last_fwd)
        refused(F, bad, 1, ["(fwd): size mismatch: samples",
                            "are not this device's range of the slice"], [RUNTIME_SAYS],
                f"a BWD over more samples than its FWD kept ({name})")
    bad = p1 + ".bwd-first.bin"
    edit_instructions(p1, bad, bwd_first)
    refused(F, bad, 1, ["device 0 instruction 0 (bwd): missing input: backward of slice",
                        "without its forward's saved activations"], [RUNTIME_SAYS],
            "a BWD before its FWD")
    shards_mismatch(F, tmp)
    # micro-batches per task: a task record claiming more micro-batches
    # than the step's micro-steps (tasks: 32-byte records, microbatches at
    # 28), and every task fewer than them: refused before step 1
    src = R.make_plan(tmp, R.demo_model(R.ADAMW), "bad-mbt", 2, "spindle",
                      ("--microbatches", "match=2,caption=4"))
    for name, ks, text in (("over", (2, 5, 1), "tasks[1].microbatches: 5 is outside [1, 4]"),
                           ("under", (2, 2, 1), "provenance.microbatches: 4 micro-steps, "
                                                "but no task has more than 2")):
        bad = f"{src}.{name}.bin"
        edit_records(src, bad, 5, 32, lambda b, ats: [struct.pack_into("<i", b, a + 28, k)
                                                      for a, k in zip(ats, ks)])
        r = R.run(bad, 2, "--steps", 1, "--timeout", 20)
        expect(F, r, 2, [text], f"a task's micro-batches {name} the step's")
    src = R.make_plan(tmp, R.demo_model(R.ADAMW), "bad-z2", 2, extra=("--zero", "2"))
    bad = src + ".sync-early.bin"
    sync_before_bwd(src, bad)
    refused(F, bad, 2, ["zero-2 gradient used after it was freed: writes gradients of bucket"],
            ["writes gradients of a zero-2 bucket after its SYNC"],
            "a zero-2 SYNC moved before a BWD that writes into its bucket")
    src = R.make_plan(tmp, R.demo_model(R.ADAMW), "bad-z3", 2, extra=("--zero", "3"))
    bad = src + ".free-early.bin"
    free_before_use(src, bad)
    refused(F, bad, 2, ["(fwd): zero-3: the instruction uses zero-3 weights not gathered"],
            ["uses zero-3 weights not gathered (before their PGATHER or after their PFREE)"],
            "a zero-3 PFREE moved before the FWD that uses the weights")
    r = R.run(p1, 1, "--steps", 1, env={"SPINDLE_FAULT": "kill-everything"})
    expect(F, r, 2, ["SPINDLE_FAULT: invalid fault 'kill-everything'"],
           "an unknown SPINDLE_FAULT")
    r = R.run(p1, 1, "--steps", 1, "--backend", "cuda", "--check-deferred")
    expect(F, r, 2, ["--check-deferred is only built for the cpu backend"],
           "--check-deferred with the cuda backend")


def small_gpu(b, ats):
    """The plan's GPU has 1 MiB of memory beyond its reserve."""
    reserve = struct.unpack_from("<d", b, ats[0] + 52)[0]
    struct.pack_into("<d", b, ats[0] + 44, reserve + 1 / 1024)


def verifier_only(F, tmp, p4):
    """Plans only the verifier refuses, and a RECV no SEND answers."""
    bad = p4 + ".retag-recv.bin"
    edit_instructions(p4, bad, retag_first_recv)
    refused(F, bad, 4, ["(recv): deadlock: waits for tag", "which never sends it"],
            [RUNTIME_SAYS], "a RECV whose tag no SEND uses")
    bad = p4 + ".huge-tag.bin"
    edit_instructions(p4, bad, lambda b, ats: retag_first_recv(b, ats, 2**31 - 1))
    refused(F, bad, 4, ["(recv): unmatched transfer: tag 2147483647, but a plan of"],
            [RUNTIME_SAYS], "a RECV whose tag is 2^31 - 1 (the verifier's tables stay "
            "the plan's size)")
    m = R.equivalence.add_decoder(R.demo_model(R.SGD), 1)
    src = R.make_plan(tmp, m, "encdec", 1)
    bad = src + ".no-memory-grad.bin"
    edit_instructions(src, bad, empty_memory_grad_copy)
    refused(F, bad, 1, ["(bwd): memory gradient never sent:", "no later send or copy returns"],
            None, "a decoder's memory-gradient COPY dropped")
    bad = p4 + ".small-gpu.bin"
    edit_provenance(p4, bad, small_gpu)
    refused(F, bad, 4, ["out of memory: device 0 needs", "more than its 1.0 MiB"], None,
            "a plan over its own cluster's memory")


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        model = R.demo_model(R.ADAMW)
        p4 = R.make_plan(tmp, model, "bad", 4)
        p1 = R.make_plan(tmp, model, "bad", 1)
        good = os.path.join(tmp, "ck-good")
        R.must(R.run(p1, 1, "--quiet", "--steps", 2, "--save", good), "a good checkpoint")
        wrong_np(F, p4)
        other_checkpoints(F, tmp, p1, good)
        bad_save_dirs(F, tmp, p1, p4)
        bad_late_outputs(F, tmp, p1, p4)
        full_disk(F, tmp, p4, good)
        misc(F, tmp, p1)
        bad = p4 + ".short-recv.bin"
        edit_instructions(p4, bad, halve_first_recv)
        refused(F, bad, 4, ["(recv): size mismatch: transfer tag", "differs from its send"],
                [RUNTIME_SAYS], "a RECV over fewer samples than its SEND")
        verifier_only(F, tmp, p4)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
