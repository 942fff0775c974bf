#!/usr/bin/env python3
"""spindle-plan --only NAME (ours with one candidate alone), on clip-4 over
16 and 8 A800 (a800-2x8, a800-1x8):
  * with --refine-within all (ours refines every candidate that may win:
    an exact minimum), ours' iteration is the least of the candidates'
    --only iterations, and ours' plan is byte-identical to the plan of
    --only that candidate;
  * every --only plan has a compute time at least the compute bound and an
    iteration at least ours';
  * the best candidate's plan alone is the same with --jobs 2;
  * no candidate's plan alone is data-parallel's (seq's plan, which the
    walk takes without scheduling: left out under --only), though on 8
    A800 some candidates alone are slower than it;
  * an unknown name exits 2 naming it; a candidate that makes no plan for
    the inputs (list-homes needs 4 nodes) exits 1 naming it, no plan file.
  * --only beside --exclude or beside --algo other than spindle exits 2.
"""
import json
import os
import subprocess
import sys
import tempfile

PLAN = os.environ["SPINDLE_PLAN"]
ROOT = os.environ["SPINDLE_ROOT"]
MODEL = os.path.join(ROOT, "plans", "clip-4", "model.json")
CLUSTERS = [os.path.join(ROOT, "plans", "clusters", c + ".json")
            for c in ("a800-2x8", "a800-1x8")]
failures = []


def fail(msg):
    print("FAIL " + msg, flush=True)
    failures.append(msg)


def run(args, cluster=CLUSTERS[0]):
    return subprocess.run([PLAN, MODEL, cluster, *args], capture_output=True, text=True,
                          timeout=300)


def ours(path, args, cluster):
    p = run(["--json", "-o", path, "--refine-within", "all", "--jobs", "1", *args], cluster)
    if p.returncode:
        return None, p
    return json.loads(p.stdout), p


def main():
    for cluster in CLUSTERS:
        print(os.path.basename(cluster))
        one_cluster(cluster)
    p = run(["--only", "no-such-candidate"])
    if p.returncode != 2 or "no-such-candidate" not in p.stderr:
        fail(f"--only no-such-candidate: exit {p.returncode}, {p.stderr!r}")
    p = run(["--only", "list-homes"])
    if p.returncode != 1 or "'list-homes' makes no plan" not in p.stderr:
        fail(f"--only list-homes on 2 nodes: exit {p.returncode}, {p.stderr!r}")
    for extra in (["--exclude", "lanes"], ["--exclude", "data-parallel"],
                  ["--algo", "sequential"]):
        p = run(["--only", "lanes", *extra])
        if p.returncode != 2 or "--only cannot be combined with " + extra[0] not in p.stderr:
            fail(f"--only lanes {' '.join(extra)}: exit {p.returncode}, {p.stderr!r}")


def one_cluster(cluster):
    names = run(["--candidates"], cluster).stdout.split()
    if len(names) < 2 or "data-parallel" not in names:
        fail(f"--candidates lists {names!r}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        whole, p = ours(os.path.join(tmp, "all.bin"), [], cluster)
        if whole is None:
            fail(f"ours: exit {p.returncode}: {p.stderr}")
            return
        it = whole["algorithms"]["spindle"]["iteration_ms"]
        best = None
        for n in names:
            d, p = ours(os.path.join(tmp, n + ".bin"), ["--only", n], cluster)
            if d is None:
                if p.returncode != 1 or f"'{n}'" not in p.stderr or \
                        os.path.exists(os.path.join(tmp, n + ".bin")):
                    fail(f"--only {n}: exit {p.returncode}, {p.stderr!r}")
                print(f"{n}: no plan ({p.stderr.strip().splitlines()[0]})")
                continue
            a = d["algorithms"]["spindle"]
            print(f"{n}: iteration {a['iteration_ms']:.3f} compute {a['compute_ms']:.3f} ms")
            if a["compute_ms"] < d["lower_bound_ms"] * (1 - 1e-9):
                fail(f"--only {n}: compute {a['compute_ms']} below the bound "
                     f"{d['lower_bound_ms']}")
            if a["iteration_ms"] < it * (1 - 1e-9):
                fail(f"--only {n}: iteration {a['iteration_ms']} below ours' {it} "
                     "with every candidate")
            if best is None or a["iteration_ms"] < best[0]:
                best = (a["iteration_ms"], n)
        if best is None:
            fail("no candidate made a plan alone")
            return
        if abs(best[0] - it) > 1e-9 * it:
            fail(f"ours' iteration {it} is not the least --only one {best}")
        elif open(os.path.join(tmp, "all.bin"), "rb").read() != \
                open(os.path.join(tmp, best[1] + ".bin"), "rb").read():
            fail(f"ours' plan differs from --only {best[1]}'s")
        j2 = os.path.join(tmp, "jobs2.bin")
        p = run(["-o", j2, "--refine-within", "all", "--jobs", "2", "--only", best[1]],
                cluster)
        if p.returncode or open(j2, "rb").read() != \
                open(os.path.join(tmp, best[1] + ".bin"), "rb").read():
            fail(f"--only {best[1]} --jobs 2: exit {p.returncode}, not the --jobs 1 plan")
        dp = open(os.path.join(tmp, "data-parallel.bin"), "rb").read()
        for n in names:
            f = os.path.join(tmp, n + ".bin")
            if n != "data-parallel" and os.path.exists(f) and open(f, "rb").read() == dp:
                fail(f"--only {n} planned data-parallel's plan")


if __name__ == "__main__":
    main()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
