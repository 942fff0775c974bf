#!/usr/bin/env python3
"""--tp auto never plans worse than whole layers (issue 18; plan.c
plan_whole): for every bundled workload (plans/*/model.json) on a800-8x8
(64 GPUs), a 16-node copy of it (128 GPUs) and a 16-node copy of
h100-8x8-8nic (128 H100), ours under --tp auto predicts an iteration no
slower than under --tp 1 (the simulator's figure, --json), and both plans
fit memory or neither does; nor slower than under --tp auto --tp-vocab
whole (embeddings and LM heads whole: plan.c also plans that table set
and keeps the better). The iterations compared are after layout_refine
(zero-1 buckets chosen on the chosen plan): clip-7 on 128 H100 is a case
where the two table sets' plans rank one way before it and the other way
after (auto planned 26.74 ms against --tp 1's 25.33 before plan_ours
refined each set's plan before comparing them). Every run is
independent: they go in parallel, so the whole test takes a few seconds.
Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]


def spindle(model, cluster, tp):
    vocab = ["--tp-vocab", "whole"] if tp == "auto-vw" else []
    p = subprocess.run([PLAN, model, cluster, "--tp", tp.split("-")[0], "--json"] + vocab,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return None, p.stderr.strip()
    return json.loads(p.stdout)["algorithms"]["spindle"], None


def main():
    base = os.path.join(ROOT, "plans", "clusters", "a800-8x8.json")
    models = sorted(glob.glob(os.path.join(ROOT, "plans", "*", "model.json")))
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        clusters = [(base, "64 GPUs")]
        for name, label in (("a800-8x8", "128 GPUs"), ("h100-8x8-8nic", "128 H100")):
            c = json.load(open(os.path.join(ROOT, "plans", "clusters", name + ".json")))
            c["nodes"] = 16
            big = os.path.join(tmp, f"{name}-16.json")
            json.dump(c, open(big, "w"))
            clusters.append((big, label))
        jobs = [(m, cl, tp) for m in models for cl, _ in clusters
                for tp in ("1", "auto", "auto-vw")]
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 4) as ex:
            res = dict(zip(jobs, ex.map(lambda j: spindle(*j), jobs)))
        for m in models:
            for cl, gpus in clusters:
                name = f"{os.path.basename(os.path.dirname(m))} on {gpus}"
                (one, e1), (auto, e2) = res[(m, cl, "1")], res[(m, cl, "auto")]
                if e1 or e2:
                    print(f"FAIL {name}: planner failed: {e1 or e2}")
                    fails += 1
                    continue
                ok = auto["iteration_ms"] <= one["iteration_ms"] * (1 + 1e-9) and \
                    (auto["fits_memory"] or not one["fits_memory"])
                print(f"{'ok  ' if ok else 'FAIL'} {name}: --tp 1 {one['iteration_ms']:.3f} ms, "
                      f"auto {auto['iteration_ms']:.3f} ms")
                fails += not ok
                vw, e3 = res[(m, cl, "auto-vw")]
                ok = not e3 and auto["iteration_ms"] <= vw["iteration_ms"] * (1 + 1e-9) and \
                    (auto["fits_memory"] or not vw["fits_memory"])
                print(f"{'ok  ' if ok else 'FAIL'} {name}: --tp-vocab whole "
                      f"{vw['iteration_ms'] if vw else float('nan'):.3f} ms, auto "
                      f"{auto['iteration_ms']:.3f} ms" + (f": {e3}" if e3 else ""))
                fails += not ok
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
