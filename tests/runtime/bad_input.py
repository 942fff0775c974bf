#!/usr/bin/env python3
"""Bad input at the runtime: a clear message, exit status 2 (bad input) or
1 (an I/O failure while running), and no partial checkpoint left behind.

  * a plan for 4 devices started on 2 ranks (and on 1, without mpirun)
  * a checkpoint of another model (other components; same components of
    other sizes; another optimizer), from a newer format version, with a
    --seed other than the one it was trained with
  * a program that issues one sync bucket's all-reduce twice and another's
    never (the step updates bucket by bucket after each all-reduce)
  * a BWD over more samples than its FWD kept activations for (with and
    without recomputation); a RECV over fewer samples than its SEND sends
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


def edit_instructions(src, dst, fn):
    """Instructions: 60 bytes each; op at 0, s0 at 8, s1 at 12, peer at 52."""
    edit_records(src, dst, 18, 60, fn)


def edit_slices(src, dst, fn):
    """Slices: 64 bytes each; n_dev at 16, tp at 60."""
    edit_records(src, dst, 12, 64, fn)


def split_none(b, ats):
    """Every split slice claims whole layers, while its devices hold shards:
    the layers would read a shard as a whole layer (past its end)."""
    for at in ats:
        if struct.unpack_from("<i", b, at + 60)[0] > 1:
            struct.pack_into("<i", b, at + 60, 1)


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
    for name, tp, fn, what in (("tp2", "2", lambda s, d: edit_slices(s, d, split_none),
                                "split slices made whole"),
                               ("tp1", "1", split_first, "a whole slice made split")):
        src = R.make_plan(tmp, model, f"bad-{name}", 4, "sequential", ("--tp", tp))
        bad = src + ".mismatch.bin"
        fn(src, bad)
        r = R.run(bad, 4, "--steps", 1, "--timeout", 20)
        expect(F, r, 2, ["split", "ways, but the rank holds shard"], what)


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


def sync_before_bwd(src, dst):
    """A zero-2 plan whose first BWD followed by the SYNC of a zero-2 bucket
    (layout 2: bucket records of 44 bytes, layout at 32) runs the SYNC
    first: the BWD would write into a full gradient the SYNC has freed."""
    z2 = []
    edit_records(src, dst, 14, 44, lambda b, ats: z2.extend(
        struct.unpack_from("<I", b, a + 32)[0] == 2 for a in ats))

    def fn(b, ats):
        op = [struct.unpack_from("<i", b, a)[0] for a in ats]
        k = next(k for k in range(1, len(ats)) if op[k - 1] == 2 and op[k] == 7 and
                 z2[struct.unpack_from("<i", b, ats[k] + 52)[0]])
        first, second = bytes(b[ats[k - 1]:ats[k - 1] + 60]), bytes(b[ats[k]:ats[k] + 60])
        b[ats[k - 1]:ats[k - 1] + 60], b[ats[k]:ats[k] + 60] = second, first
    edit_instructions(src, dst, fn)


def misc(F, tmp, p1):
    bad = p1 + ".sync-twice.bin"
    edit_instructions(p1, bad, retarget_sync)
    r = R.run(bad, 1, "--steps", 1)
    expect(F, r, 2, ["the plan's parameters, buckets and programs do not agree"],
           "a program that issues one bucket's all-reduce twice and another's never")
    for name, extra in (("keep", ()), ("recompute", ("--recompute", "all"))):
        src = R.make_plan(tmp, R.demo_model(R.ADAMW), f"bad-{name}", 1, extra=extra)
        bad = src + ".short-fwd.bin"
        edit_instructions(src, bad, halve_last_fwd)
        r = R.run(bad, 1, "--steps", 1)
        expect(F, r, 2, ["the plan's parameters, buckets and programs do not agree"],
               f"a BWD over more samples than its FWD kept ({name})")
    shards_mismatch(F, tmp)
    src = R.make_plan(tmp, R.demo_model(R.ADAMW), "bad-z2", 2, extra=("--zero", "2"))
    bad = src + ".sync-early.bin"
    sync_before_bwd(src, bad)
    r = R.run(bad, 2, "--steps", 1, "--timeout", 20)
    expect(F, r, 2, ["writes gradients of a zero-2 bucket after its SYNC"],
           "a zero-2 SYNC moved before a BWD that writes into its bucket")
    r = R.run(p1, 1, "--steps", 1, env={"SPINDLE_FAULT": "kill-everything"})
    expect(F, r, 2, ["SPINDLE_FAULT: invalid fault 'kill-everything'"],
           "an unknown SPINDLE_FAULT")


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
        full_disk(F, tmp, p4, good)
        misc(F, tmp, p1)
        bad = p4 + ".short-recv.bin"
        edit_instructions(p4, bad, halve_first_recv)
        r = R.run(bad, 4, "--steps", 1, "--timeout", 20)
        expect(F, r, 2, ["the plan's parameters, buckets and programs do not agree"],
               "a RECV over fewer samples than its SEND")
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
