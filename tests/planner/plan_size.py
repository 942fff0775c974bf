#!/usr/bin/env python3
"""How large a plan the planner takes on, and what it needs for it:

  * --max-instructions is a guard at an exact count: the demo's plans
    (the sequential baseline's transfers, the largest) pass at the count
    the refusal names and are refused one below it, with exit status 2,
    the slice named, no plan written; 0 means no limit;
  * past 256 k instructions the transfers are collected twice (counted
    and stored up to 256 k, then all stored when within the limit): clip-10
    with batches x4 on 128 A800s (665,600) plans at its exact count and is
    refused one below it; on 256 (2,050,048) --max-instructions 2000000
    refuses it with exit 2 in 96 MiB of address space (a single storing
    pass held ~115 MB first and ran out of memory, exit 1);
  * the verifier's memory does not grow with the batch: plans/ofasys with
    every task's batch x128 on 256 GPUs plans (verified) under a 1 GiB
    address-space limit (and x4). The verifier's per-sample tables made
    x128 take 1.7 GB (RSS) before they became runs (planner/verify_counts.c),
    so the test fails with them. Skipped under a sanitizer (its shadow
    memory takes the address space).
Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]
CAP = 1 << 30


def run(args, cwd, cap=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return subprocess.run([PLAN] + args, cwd=cwd, capture_output=True, text=True,
                          timeout=300, preexec_fn=limit if cap else None)


def main():
    failed = []

    def check(ok, what, detail=""):
        print(("ok   " if ok else "FAIL ") + what + ("" if ok else "\n     " + detail),
              flush=True)
        if not ok:
            failed.append(what)

    demo = os.path.join(ROOT, "plans", "demo")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "p.bin")
        base = [os.path.join(demo, "model.json"), os.path.join(demo, "cluster.json"),
                "-o", out]
        r = run(base + ["--max-instructions", "1"], tmp)
        m = re.match(r"the sequential plan's transfers alone would be (\d+) instructions, "
                     r"more than --max-instructions 1; (\d+) of them move the inputs of "
                     r"the slice of '([^']+)'", r.stderr)
        check(r.returncode == 2 and m is not None and not os.path.exists(out),
              "--max-instructions 1: exit 2, the count and the slice named, no plan",
              r.stderr)
        if m:
            n = int(m.group(1))
            check(0 < int(m.group(2)) <= n, f"the slice's share ({m.group(2)}) is in the "
                  f"total ({n})")
            r = run(base + ["--max-instructions", str(n - 1)], tmp)
            check(r.returncode == 2 and f"would be {n} instructions" in r.stderr,
                  f"--max-instructions {n - 1}: refused", r.stderr)
            r = run(base + ["--max-instructions", str(n)], tmp)
            check(r.returncode == 0 and os.path.exists(out),
                  f"--max-instructions {n}: planned", r.stderr)
        r = run(base + ["--max-instructions", "0"], tmp)
        check(r.returncode == 0, "--max-instructions 0: no limit", r.stderr)

        clip = json.load(open(os.path.join(ROOT, "plans", "clip-10", "model.json")))
        for t in clip["tasks"]:
            t["batch"] *= 4
        json.dump(clip, open(os.path.join(tmp, "clip.json"), "w"))
        a800 = json.load(open(os.path.join(ROOT, "plans", "clusters", "a800-4x8.json")))
        for nodes in (16, 32):
            a800["nodes"] = nodes
            json.dump(a800, open(os.path.join(tmp, f"a800-{nodes}.json"), "w"))
        wide = ["clip.json", "a800-16.json", "-o", out]
        r = run(wide + ["--max-instructions", "1"], tmp)
        m = re.search(r"would be (\d+) instructions", r.stderr)
        n = int(m.group(1)) if m else 0
        check(r.returncode == 2 and n > 1 << 18,
              f"clip-10 x4 on 128 A800: refused at 1, {n} instructions (past 256 k)", r.stderr)
        if n > 1 << 18:
            r = run(wide + ["--max-instructions", str(n - 1)], tmp)
            check(r.returncode == 2 and f"would be {n} instructions" in r.stderr,
                  f"clip-10 x4 on 128 A800, --max-instructions {n - 1}: refused", r.stderr)
            if os.path.exists(out):
                os.remove(out)
            r = run(wide + ["--max-instructions", str(n)], tmp)
            check(r.returncode == 0 and os.path.exists(out),
                  f"clip-10 x4 on 128 A800, --max-instructions {n}: planned (stored in a "
                  "second pass)", r.stderr[-2000:])

        sanitized = b"__asan_init" in open(PLAN, "rb").read()
        if sanitized:
            print("skip the memory cap: a sanitizer build")
        else:
            model = json.load(open(os.path.join(ROOT, "plans", "ofasys", "model.json")))
            cluster = json.load(open(os.path.join(ROOT, "plans", "ofasys", "cluster.json")))
            cluster["nodes"] = 256 // cluster["gpus_per_node"]
            json.dump(cluster, open(os.path.join(tmp, "c.json"), "w"))
            for mult in (4, 128):
                m2 = json.loads(json.dumps(model))
                for t in m2["tasks"]:
                    t["batch"] *= mult
                json.dump(m2, open(os.path.join(tmp, "m.json"), "w"))
                r = run(["m.json", "c.json", "-o", out], tmp, CAP)
                check(r.returncode == 0,
                      f"ofasys, batches x{mult}, 256 GPUs: plans and verifies in 1 GiB of "
                      "address space", r.stderr[-2000:])
            r = run(["clip.json", "a800-32.json", "-o", out, "--max-instructions", "2000000",
                     "--jobs", "1"], tmp, 96 << 20)
            check(r.returncode == 2 and "would be 2050048 instructions" in r.stderr,
                  "clip-10 x4 on 256 A800, --max-instructions 2000000: refused (exit 2) in "
                  "96 MiB of address space", r.stderr[-2000:])
    print(f"{len(failed)} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
