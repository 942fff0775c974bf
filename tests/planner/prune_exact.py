#!/usr/bin/env python3
"""Ours skips simulating candidates that a lower bound shows cannot be
chosen (walk.c plan_one, bound.c bound_sync) and simulates the chosen one's
compute and transfer passes last (sim.c sim_complete): the plan must be
the one simulating every candidate in full makes (--simulate-all). For
every bundled workload (plans/*/model.json) on its own cluster, on
a800-8x8 and on h100-8x8-8nic, and for two of tools/bench-plan's synthetic
CLIP-like workloads (where the sequential plan wins and the whole-layer
pass has a bar to beat), the plan files are equal byte for byte and the
--json reports equal but for their planning times. Under --simulate-all
the planner also checks the bound the skips rest on: every candidate's
simulated iteration is at least its bound_sync (else exit 1, which fails
the case); so is every layout_refine last trial's (layout_refine.c
trial_doomed: by default a trial whose bound shows it cannot be kept is
not simulated). --simulate-all also simulates every candidate whose lowered
plan equals one simulated before, where the default takes the earlier
result (planner/sim_memo.c): the case checks that memo too. bundled and
run_cases also run the other tests that compare two planner runs on every
bundled workload (pass_memo, restore_exact, prebound, top_ready). Environment:
SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import concurrent.futures
import glob
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]
TIMING = {"planning_ms", "total_planning_ms"}


def untimed(x):
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


def plan(model, cluster, out, extra):
    p = subprocess.run([PLAN, model, cluster, "--json", "-o", out] + extra,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return p.returncode, p.stderr.strip(), None, None
    return 0, "", untimed(json.loads(p.stdout)), open(out, "rb").read()


def case(model, cluster, opts, tmp, tag):
    a = plan(model, cluster, os.path.join(tmp, tag + ".a"), opts)
    b = plan(model, cluster, os.path.join(tmp, tag + ".b"), opts + ["--simulate-all"])
    if a[0] or b[0]:
        return a[:2] == b[:2], f"exit {a[0]} / {b[0]} with --simulate-all: {a[1] or b[1]}"
    if a[3] != b[3]:
        return False, "plan files differ from --simulate-all's"
    if a[2] != b[2]:
        keys = [k for k in set(a[2]) | set(b[2]) if a[2].get(k) != b[2].get(k)]
        return False, f"reports differ from --simulate-all's in {sorted(keys)}"
    return True, f"same plan ({a[2]['algorithms']['spindle']['iteration_ms']:.3f} ms)"


def cluster_path(name):
    return os.path.join(ROOT, "plans", "clusters", name + ".json")


def bundled(clusters):
    """(model, cluster) for every bundled workload (plans/*/model.json) on
    its own cluster where it has one, then on each of clusters (names in
    plans/clusters)."""
    for m in sorted(glob.glob(os.path.join(ROOT, "plans", "*", "model.json"))):
        own = os.path.join(os.path.dirname(m), "cluster.json")
        for c in ([own] if os.path.exists(own) else []) + [cluster_path(n) for n in clusters]:
            yield m, c


def run_cases(todo, case, what, counted=None, tmp=None):
    """case(model, cluster, opts, tmp, tag) -> (ok, why[, n]) for every
    (model, cluster, opts) of todo, on a thread pool: one line printed per
    case in todo's order, then "K of N cases WHAT" (and the n summed, as
    "; T COUNTED in all"). Returns the number of cases failed and the n
    summed: the caller's guard that the cases tested something."""
    fails = total = 0
    with tempfile.TemporaryDirectory() as own, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        futs = [ex.submit(case, m, c, o, tmp or own, str(i)) for i, (m, c, o) in enumerate(todo)]
        for (m, c, o), f in zip(todo, futs):
            ok, why, *n = f.result()
            fails += not ok
            total += sum(n)
            name = os.path.basename(os.path.dirname(m)) if m.startswith(ROOT) else \
                os.path.basename(m)
            print(f"{'ok  ' if ok else 'FAIL'} {name} on {os.path.basename(c)}"
                  f"{' ' + ' '.join(o) if o else ''}: {why}", flush=True)
    print(f"{len(todo) - fails} of {len(todo)} cases {what}" +
          (f"; {total} {counted} in all" if counted else ""))
    return fails, total


def synthetic(tmp, shapes=((8, 64, "h100-8x8-8nic"), (32, 256, "a800-8x8"))):
    """tools/bench-plan's generator: (model, cluster) paths, one per
    (tasks, GPUs, base cluster) of shapes."""
    loader = importlib.machinery.SourceFileLoader(
        "bench_plan", os.path.join(ROOT, "tools", "bench-plan"))
    spec = importlib.util.spec_from_loader("bench_plan", loader)
    bp = importlib.util.module_from_spec(spec)
    loader.exec_module(bp)
    out = []
    for n_tasks, gpus, base in shapes:
        m = os.path.join(tmp, f"syn{n_tasks}.json")
        c = os.path.join(tmp, f"{base}-{gpus}.json")
        json.dump(bp.synthetic(n_tasks, n_tasks * 7 + gpus), open(m, "w"))
        json.dump(bp.cluster(gpus, base), open(c, "w"))
        out.append((m, c))
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(m, c, []) for m, c in bundled(["a800-8x8", "h100-8x8-8nic"])] + \
            [(m, c, []) for m, c in synthetic(tmp)]
        fails, _ = run_cases(todo, case, "plan as with --simulate-all", tmp=tmp)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
