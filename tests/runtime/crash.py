#!/usr/bin/env python3
"""Crash safety of checkpoints.

  * A rank killed (SIGKILL) in the middle of a save, through the testing
    hook SPINDLE_FAULT=kill-in-save:STEP (rank 0 kills itself after writing
    every file of the new snapshot under its temporary name, before the
    publishing rename) or kill-in-save:STEP:latest (after the rename, before
    LATEST is replaced): the run fails, LATEST still names the previous
    snapshot, and resuming from the directory continues from it, bit-
    identical to an uninterrupted run. The next save removes the leftovers
    and never reuses the name of an unpublished snapshot.
  * A torn or corrupted checkpoint (a file truncated at several lengths, a
    byte flipped in the data, in a header, in the manifest; a file missing;
    LATEST garbled) is refused with exit status 2 and a message naming the
    file, and no step is trained: it is never loaded silently.
"""
import json
import os
import shutil
import sys
import tempfile
import zlib

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402


def kill_in_save(F, tmp, p4, ref, latest):
    tag = "latest" if latest else "files"
    ck = os.path.join(tmp, f"ck-kill-{tag}")
    fault = "kill-in-save:3" + (":latest" if latest else "")
    r = R.run(p4, 4, "--quiet", "--timeout", "20", "--steps", 4, "--save", ck,
              "--save-every", 1, env={"SPINDLE_FAULT": fault})
    F.check(r.rc not in (0, None) and "killing itself in a checkpoint save" in r.err,
            f"{fault}: the run dies in the save of step 3", r.describe())
    F.check(not R.reap(p4), f"{fault}: no rank is left behind")
    names = sorted(os.listdir(ck))
    left = "step-00000003" if latest else "step-00000003.tmp"
    F.check(open(os.path.join(ck, "LATEST")).read() == "step-00000002\n" and left in names,
            f"{fault}: LATEST still names step 2; '{left}' is left unpublished", str(names))
    # resume: continues after step 2, saves 3 and 4, bit-identical to 4 steps
    dump = os.path.join(tmp, f"kill-{tag}.dump")
    log = os.path.join(tmp, f"kill-{tag}.csv")
    r = R.must(R.run(p4, 4, "--quiet", "--timeout", "60", "--load", ck, "--steps", 2,
                     "--save", ck, "--save-every", 1, "--dump-params", dump, "--log", log),
               "resume after the kill")
    steps = sorted({int(x["step"]) for x in R.read_log(log)})
    F.check(steps == [3, 4] and open(dump, "rb").read() == ref,
            f"{fault}: the last complete checkpoint (step 2) loads; steps 3-4 equal an "
            "uninterrupted run bit for bit", f"steps {steps}")
    names = sorted(os.listdir(ck))
    want = ["LATEST", "step-00000003-2", "step-00000004"] if latest else \
        ["LATEST", "step-00000003", "step-00000004"]
    F.check(names == want, f"{fault}: the next saves remove the leftovers"
            + (" and do not reuse the unpublished name" if latest else ""), str(names))


def flip(path, offset):
    b = bytearray(open(path, "rb").read())
    b[offset % len(b)] ^= 0x20
    open(path, "wb").write(bytes(b))


def truncate(path, n):
    b = open(path, "rb").read()
    open(path, "wb").write(b[:n])


def corruptions(F, tmp, p1, p4, good):
    snap = os.path.basename(R.latest_snapshot(good))
    small = "cls.safetensors"
    size = os.path.getsize(os.path.join(R.latest_snapshot(good), small))
    hdr = int.from_bytes(open(os.path.join(R.latest_snapshot(good), small), "rb").read(8),
                         "little")
    cases = []
    for n in sorted({0, 1, 7, 8, 9, 8 + hdr - 1, 8 + hdr, 8 + hdr + 1, size // 2, size - 1}):
        cases.append((f"{small} truncated to {n} of {size} bytes", small,
                      lambda p, n=n: truncate(p, n), "corrupt or torn"))
    cases += [
        ("a byte flipped in the data of img_enc.safetensors", "img_enc.safetensors",
         lambda p: flip(p, os.path.getsize(p) // 2), "corrupt or torn"),
        ("a byte flipped in the header of lm.safetensors", "lm.safetensors",
         lambda p: flip(p, 40), "corrupt or torn"),
        ("the header length of txt_embed.safetensors changed", "txt_embed.safetensors",
         lambda p: flip(p, 1), "corrupt or torn"),
        ("the manifest's step changed (still valid JSON)", "manifest.json",
         lambda p: R.edit(p, lambda t: t.replace('"step": 2', '"step": 3')),
         "manifest is corrupt (crc32"),
        ("a CRC in the manifest changed", "manifest.json", _edit_crc,
         "manifest is corrupt (crc32"),
        ("the manifest truncated", "manifest.json",
         lambda p: truncate(p, os.path.getsize(p) // 2), "manifest is corrupt or torn"),
        ("fuse.safetensors missing", "fuse.safetensors", os.unlink, "cannot open file"),
    ]
    for what, fname, mutate, expect in cases:
        d = os.path.join(tmp, "bad")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        target = os.path.join(d, snap, fname)
        mutate(target)
        r = R.run(p1, 1, "--timeout", "20", "--steps", 1, "--load", d)
        F.check(r.rc == 2 and target in r.err and expect in r.err and "step " not in r.out,
                f"{what}: refused (exit 2), the file named, nothing trained", r.describe())
    # LATEST garbled or naming nothing
    for what, text, expect in (("LATEST garbled", "../../etc\n", "does not name a snapshot"),
                               ("LATEST names a missing snapshot", "step-00000009\n",
                                "cannot open file")):
        d = os.path.join(tmp, "bad")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        open(os.path.join(d, "LATEST"), "w").write(text)
        r = R.run(p1, 1, "--timeout", "20", "--steps", 1, "--load", d)
        F.check(r.rc == 2 and expect in r.err and "step " not in r.out,
                f"{what}: refused (exit 2)", r.describe())
    # a step near 2^63 under a valid manifest CRC: refused, not overflowed
    # (step + 1 is signed overflow; UBSan stops at it)
    for step in (2**63 - 2, 2**63 - 1):
        d = os.path.join(tmp, "bad")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        mp = os.path.join(d, snap, "manifest.json")
        man = json.load(open(mp))
        man.update(step=step, data_position=min(step + 1, 2**63 - 1))
        del man["manifest_crc32"]
        canon = json.dumps(man, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        man["manifest_crc32"] = "%08x" % zlib.crc32(canon.encode())
        json.dump(man, open(mp, "w"))
        r = R.run(p1, 1, "--timeout", "20", "--steps", 1, "--load", d)
        F.check(r.rc == 2 and mp in r.err and "out of range" in r.err and "step " not in r.out,
                f"manifest step {step}: refused (exit 2), the manifest named", r.describe())
    # the same under mpirun: every rank refuses; mpirun returns 2; one message
    d = os.path.join(tmp, "bad")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(good, d)
    target = os.path.join(d, snap, "img_patch.safetensors")
    flip(target, 100)
    r = R.run(p4, 4, "--timeout", "20", "--steps", 1, "--load", d)
    F.check(r.rc == 2 and r.err.count(target) == 1 and "step " not in r.out,
            "4 ranks: a corrupt file is refused by every rank (mpirun exit 2, named once)",
            r.describe())


def _edit_crc(p):
    def change(text):
        i = text.index('"crc32": "') + len('"crc32": "')
        return text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1:]
    R.edit(p, change)


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        model = R.demo_model(R.ADAMW)
        p4 = R.make_plan(tmp, model, "crash", 4)
        p1 = R.make_plan(tmp, model, "crash", 1)
        ref = os.path.join(tmp, "ref.dump")
        R.must(R.run(p4, 4, "--quiet", "--timeout", "60", "--steps", 4, "--dump-params", ref),
               "reference run")
        ref = open(ref, "rb").read()
        kill_in_save(F, tmp, p4, ref, latest=False)
        kill_in_save(F, tmp, p4, ref, latest=True)
        good = os.path.join(tmp, "ck-good")
        R.must(R.run(p1, 1, "--quiet", "--steps", 2, "--save", good), "a good checkpoint")
        corruptions(F, tmp, p1, p4, good)
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
