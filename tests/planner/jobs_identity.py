#!/usr/bin/env python3
"""--jobs N evaluates ours' candidates on worker threads (planner/jobs.c,
plan.c's parallel walk): the plan must not depend on N. Plans bundled
workloads on their own cluster and on 64-GPU clusters, with --compare, with
a candidate left out (--exclude milp-list: the separable allotment then
comes before the MILP's, which the jobs must reproduce), under
--simulate-all, and two of tools/bench-plan's synthetic CLIP-like
workloads at 128 GPUs with 8 NICs per node (the generator of the 1024-GPU
scaling inputs, made smaller to run fast), with --jobs 1, 2 and 3 (with
more than one, layout_refine's last trial runs as a job beside the
others, judged after them: layout_last_*): the
plan files equal byte for byte and the --json reports equal but for their
planning times. Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env).
Exit 0 pass, 1 fail.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import ROOT, plan, synthetic  # noqa: E402 (same environment)

JOBS = (1, 2, 3)


def case(model, cluster, opts, tmp, tag):
    runs = [plan(model, cluster, os.path.join(tmp, f"{tag}.{j}"), opts + ["--jobs", str(j)])
            for j in JOBS]
    a = runs[0]
    for j, b in zip(JOBS[1:], runs[1:]):
        if a[0] or b[0]:
            if a[:2] != b[:2]:
                return False, f"exit {a[0]} / {b[0]} with --jobs {j}: {a[1] or b[1]}"
            continue
        if a[3] != b[3]:
            return False, f"plan file with --jobs {j} differs from --jobs 1's"
        if a[2] != b[2]:
            keys = [k for k in set(a[2]) | set(b[2]) if a[2].get(k) != b[2].get(k)]
            return False, f"report with --jobs {j} differs in {sorted(keys)}"
    if a[0]:
        return True, f"exit {a[0]} with every --jobs"
    return True, f"same plan ({a[2]['algorithms']['spindle']['iteration_ms']:.3f} ms)"


def main():
    pl = os.path.join(ROOT, "plans")
    cl = os.path.join(pl, "clusters")
    cases = [
        (f"{pl}/clip-10/model.json", f"{pl}/clip-10/cluster.json", []),
        (f"{pl}/clip-10/model.json", f"{cl}/h100-8x8-8nic.json", ["--compare"]),
        # layout_refine's last trial kept: by the sequential plan (a job
        # beside ours' walk with --jobs) and by spindle-paper's (refine_par)
        (f"{pl}/clip-10/model.json", f"{cl}/a800-4x8.json", ["--compare"]),
        (f"{pl}/qwen-val/model.json", f"{cl}/a800-8x8.json", []),
        (f"{pl}/vit-bigg-4res/model.json", f"{cl}/a800-8x8-4nic.json", []),
        (f"{pl}/clip-7/model.json", f"{cl}/a800-8x8.json", ["--exclude", "milp-list"]),
        (f"{pl}/clip-4/model.json", f"{cl}/h100-8x8-8nic.json", ["--simulate-all"]),
    ]
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases += [(m, c, []) for m, c in synthetic(
            tmp, ((16, 128, "h100-8x8-8nic"), (32, 128, "h100-8x8-8nic")))]
        for i, (m, c, opts) in enumerate(cases):
            ok, why = case(m, c, opts, tmp, str(i))
            fails += not ok
            name = os.path.basename(os.path.dirname(m)) if m.startswith(ROOT) else \
                os.path.basename(m)
            print(f"{'ok  ' if ok else 'FAIL'} {name} on {os.path.basename(c)} "
                  f"{' '.join(opts)}: {why}", flush=True)
    print(f"{len(cases) - fails} of {len(cases)} cases plan alike with --jobs "
          f"{', '.join(map(str, JOBS))}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
