#!/usr/bin/env python3
"""tools/gpu-check --dry-run on the CPU machine, with this build's binaries
(SPINDLE_GPU_BUILD): the whole check walks its paths with the GPU steps
stubbed, so a wrong path or a missing file fails here, not in the GPU slot.

Asserts: exit 0; the output folder holds only what the device returns
(at most 8 plain files, summary.txt, results.md and results.tgz); the
tarball holds every step's log, the demo's CSV log and trace, and the
equivalence runs' dumps (the decoder workload's too); the summary records
every required step, the 2- and 4-rank equivalence lines, the decoder
workload's 2-rank lines and the final line. A second run with a
budget already spent must skip the optional steps by the deadline.

  test_gpu_check.py GPU_CHECK BUILD_DIR
Exits 77 when mpirun is missing (the equivalence step needs it).
"""
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mpi_session  # noqa: E402

mpi_session.private()

REQUIRED = ["gpu_layers", "gpu_step_demo", "gpu_step_demo-sgd", "gpu_step_encdec-sgd",
            "demo_train", "equiv_1", "equiv_2", "equiv_4", "equiv_compare", "equiv_encdec_1",
            "equiv_encdec_2", "equiv_encdec_seq-2", "equiv_encdec_compare", "equiv_mixed_1",
            "equiv_mixed_2", "equiv_mixed_4", "equiv_mixed_compare"]
OPTIONAL = ["profile_clip-4", "profile_qwen-val", "bench_ours"]


def run(tool, build, out, budget=None):
    env = dict(os.environ, SPINDLE_GPU_BUILD=build)
    env.pop("OUT", None)
    if budget is not None:
        env["GPU_CHECK_BUDGET"] = str(budget)
    return subprocess.run([tool, "--dry-run", out], capture_output=True, text=True,
                          env=env, timeout=300)


def main():
    tool, build = sys.argv[1], sys.argv[2]
    if not shutil.which("mpirun"):
        print("SKIP no mpirun")
        return 77
    failed = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failed.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        p = run(tool, build, out)
        check(p.returncode == 0, f"dry run exits 0 (got {p.returncode})\n{p.stdout}{p.stderr}")
        names = sorted(os.listdir(out))
        check(names == ["results.md", "results.tgz", "summary.txt"],
              f"the output folder holds summary.txt, results.md, results.tgz: {names}")
        check(all(os.path.isfile(os.path.join(out, n)) for n in names) and len(names) <= 8,
              "only plain files, at most 8 (what the device returns)")
        summary = open(os.path.join(out, "summary.txt")).read()
        for s in REQUIRED:
            line = [l for l in summary.splitlines() if l.startswith(s + " ")]
            check(len(line) == 1 and ("PASS" in line[0] or "SKIP" in line[0]),
                  f"summary: step {s} passed or skipped: {line}")
        for n in (2, 4):
            check(f"ok   demo-sgd-on-{n}-ranks" in summary, f"summary: {n} ranks equal 1")
            check(f"ok   demo-sgd-tp2-vocab-on-{n}-ranks" in summary,
                  f"summary: {n} ranks with the vocabulary split equal 1")
            check(f"ok   mixed-sgd-on-{n}-ranks" in summary,
                  f"summary: {n} ranks mixing zero-3 with other layouts equal 1")
            check(f"  rank {n - 1} zero-3 full weights" in summary,
                  f"summary: every rank's memory of the {n}-rank mixed plan (--memory-all)")
        for what in ("", "sequential-"):
            check(f"ok   encdec-sgd-{what}on-2-ranks" in summary,
                  f"summary: the decoder workload on 2 ranks ({what or 'as planned'}) equals 1")
        check("0 failure(s)" in summary.splitlines()[-1], "summary ends with 0 failure(s)")
        with tarfile.open(os.path.join(out, "results.tgz")) as t:
            members = set(m.name.lstrip("./") for m in t.getmembers())
        for s in REQUIRED + OPTIONAL:
            check(f"logs/{s}.log" in members, f"results.tgz holds logs/{s}.log")
        for f in ["summary.txt", "results.md", "demo-log.csv", "demo-trace.json",
                  "runs/demo-sgd-1.dump", "runs/demo-sgd-4.csv", "plans/cluster-4.json",
                  "runs/encdec-sgd-2.dump", "runs/demo-sgd-tv-2.dump"]:
            check(f in members, f"results.tgz holds {f}")

        out2 = os.path.join(tmp, "late")
        p = run(tool, build, out2, budget=1)
        summary = open(os.path.join(out2, "summary.txt")).read()
        for s in OPTIONAL:
            line = [l for l in summary.splitlines() if l.startswith(s + " ")]
            check(len(line) == 1 and "SKIP (deadline" in line[0],
                  f"past the deadline, optional step {s} is skipped: {line}")
        check(os.path.isfile(os.path.join(out2, "results.tgz")),
              "past the deadline, results are still packed")
    print(f"{len(failed)} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
