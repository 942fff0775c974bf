#!/usr/bin/env python3
"""tools/gpu-check's equivalence step: runs of one plan family on 1, 2 and
4 ranks (`spindle-run --dump-params --log`) compared against the 1-rank run,
element by element, with a tolerance chosen by the backend:

  fp32  (cpu backend, gpu-check --dry-run): relative 1e-4 (as
        tests/runtime/equivalence.py's SGD bar) plus an absolute floor of
        2e-7 (equivalence.py: 1e-7): with --tp 2 on 4 ranks a bias element
        of layer 1 ends at 1.2022e-05 against 1.2135e-05 on one rank, 1.13e-7
        apart (its gradient sums many cancelling terms in another order);
        deterministic, but OpenBLAS picks its kernels (and their
        summation order) by CPU, so the margin differs between machines;
  bf16  (cuda backend): relative 1e-2 plus an absolute floor of 1e-4 on
        parameters, relative 1e-2 plus 1e-4 on losses. The large products
        read bf16 operands (8 significant bits: one ulp is 2^-7 = 7.8e-3
        relative) and accumulate in fp32; a split over ranks changes the
        GEMM shapes and the summation order, and an fp32 value that moves
        by one fp32 ulp can round to a neighbouring bf16 value, so activations
        and gradients differ by up to about one bf16 ulp. With SGD (lr 0.1)
        over 3 steps a parameter then moves by lr * g * (1 +- 1e-2): well
        inside 1e-2 relative or 1e-4 absolute. A real error (a missing or
        doubled all-reduce, a wrong staging copy) changes updates by tens
        of percent and whole parameters by far more than the floor.

  equiv_ranks.py fp32|bf16 REF.dump REF.csv [N.dump N.csv LABEL]...

Prints one line per comparison (ok / FAIL with the worst element) and
exits 1 on any failure. It does not run anything itself.
"""
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
os.environ.setdefault("SPINDLE_ROOT", "")
os.environ.setdefault("SPINDLE_RUN", "")
from equivalence import load_dump  # noqa: E402  (the dump format's one reader)

TOL = {"fp32": (1e-4, 2e-7, 1e-4, 1e-6), "bf16": (1e-2, 1e-4, 1e-2, 1e-4)}


def compare(ref, got, tol, what):
    (pa, la), (pb, lb) = ref, got
    rel, floor, lrel, lfloor = tol
    if pa.keys() != pb.keys():
        return f"{what}: parameter sets differ"
    worst, where, n = 0.0, None, 0
    for k in sorted(pa):
        if len(pa[k]) != len(pb[k]):
            return f"{what}: parameter {k} has {len(pb[k])} elements, not {len(pa[k])}"
        for i, (x, y) in enumerate(zip(pa[k], pb[k])):
            excess = abs(x - y) / (rel * abs(x) + floor)
            n += 1
            if excess > worst:
                worst, where = excess, (k, i, x, y)
    if len(la) != len(lb) or not la:
        return f"{what}: the logs hold {len(la)} and {len(lb)} rows"
    lworst, lwhere = 0.0, None
    for ra, rb in zip(la, lb):
        if ra["task"] != rb["task"] or ra["step"] != rb["step"]:
            return f"{what}: log rows differ"
        x, y = float(ra["loss"]), float(rb["loss"])
        excess = abs(x - y) / (lrel * abs(x) + lfloor)
        if excess > lworst:
            lworst, lwhere = excess, (ra["step"], ra["task"], x, y)
    detail = (f"{n} parameters, worst at {worst:.3f} of the tolerance; "
              f"losses worst at {lworst:.3f}")
    if worst > 1:
        return (f"{what}: parameter {where[0]}[{where[1]}] {where[2]:.9g} vs "
                f"{where[3]:.9g} ({detail})")
    if lworst > 1:
        return (f"{what}: step {lwhere[0]} task {lwhere[1]} loss {lwhere[2]:.9g} vs "
                f"{lwhere[3]:.9g} ({detail})")
    return "ok   " + what + ": " + detail


def load(dump, log):
    return load_dump(dump), list(csv.DictReader(open(log)))


def main(argv):
    if len(argv) < 4 or argv[1] not in TOL or (len(argv) - 4) % 3:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    tol = TOL[argv[1]]
    ref = load(argv[2], argv[3])
    failed = 0
    for i in range(4, len(argv), 3):
        line = compare(ref, load(argv[i], argv[i + 1]), tol, argv[i + 2])
        failed += not line.startswith("ok")
        print(line if line.startswith("ok") else "FAIL " + line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
