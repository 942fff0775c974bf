#!/usr/bin/env python3
"""The planner findings of the tensor-parallel review (issue 18), on a
representative subset of the sweep "every bundled workload x {A800, H100}
x {8, 16 nodes} x --tp {1, 2, 4, 8, auto}" that runs in seconds. It does
not re-check what the verifier checks inside spindle-plan (exit 0 means the
plan verified, TP rules included); it checks what the verifier cannot see.

  * A: clip-7 on 16 H100 nodes with --tp 2 plans (a chained value was
    written twice on a device that was a member of the producer group:
    lower_xfer.c); so do the other runs of the subset;
  * B: no slice at tp 1 is wider than its batch per micro-step (qwen-val
    on 16 A800 nodes with --tp 4 had text/llm x64 at batch 32), also with
    --microbatches 2;
  * D: --tp 8 on clip-7 names only the heads (12; 8 divides ffn 3072),
    located at the model file and components.audio.heads;
  * E: qwen-val-7b on 16 A800 nodes with --tp 2 plans (a rejected zero-1
    trial of layout.c restored stale program ranges: "the programs
    deadlock", exit 1).
The subset's clusters are 16-node copies of plans/clusters/*.json made in
a temporary directory. Environment: SPINDLE_PLAN, SPINDLE_SHOW,
SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_forced import report  # noqa: E402

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]
SHOW = os.environ["SPINDLE_SHOW"]


def model(w):
    return os.path.join(ROOT, "plans", w, "model.json")


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def main():
    results = []

    def check(ok, what, detail=""):
        results.append((bool(ok), what, detail))

    with tempfile.TemporaryDirectory() as tmp:
        clusters = {}
        for c in ("a800-8x8", "h100-8x8-8nic"):
            d = json.load(open(os.path.join(ROOT, "plans", "clusters", c + ".json")))
            clusters[c] = os.path.join(ROOT, "plans", "clusters", c + ".json")
            d["nodes"] = 16
            clusters[c + "-16"] = os.path.join(tmp, c + "-16.json")
            with open(clusters[c + "-16"], "w") as f:
                json.dump(d, f)
        # (workload, cluster, --tp, extra options)
        runs = [("clip-7", "h100-8x8-8nic-16", "2", []),
                ("qwen-val", "a800-8x8-16", "4", []),
                ("qwen-val", "a800-8x8-16", "4", ["--microbatches", "2"]),
                ("qwen-val", "h100-8x8-8nic", "auto", []),
                ("clip-10", "a800-8x8-16", "2", []),
                ("clip-4", "h100-8x8-8nic-16", "4", []),
                ("vit-bigg-4res", "a800-8x8", "2", []),
                ("demo", "h100-8x8-8nic-16", "4", []),
                # E: a rejected zero-1 trial (layout.c try_shard_all) put
                # back the devices' old program ranges into the instruction
                # array its regather had rebuilt: garbled programs, exit 1
                ("qwen-val-7b", "a800-8x8-16", "2", [])]

        def plan(k):
            w, c, t, extra = runs[k]
            out = os.path.join(tmp, "p%d.bin" % k)
            r = run([PLAN, model(w), clusters[c], "--tp", t, "-o", out] + extra, tmp)
            v = None
            if r.returncode == 0:
                v = json.loads(run([SHOW, out, "--json"], tmp).stdout)
            return r, v

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
            done = list(ex.map(plan, range(len(runs))))
        for (w, c, t, extra), (r, v) in zip(runs, done):
            name = "%s on %s --tp %s%s" % (w, c, t, "".join(" " + e for e in extra))
            check(r.returncode == 0, name + " plans and verifies", r.stderr.strip())
            if v is None:
                continue
            md = json.load(open(model(w)))
            batch = {tk["name"]: tk["batch"] // v["microbatches"] for tk in md["tasks"]}
            wide = [(s["metaop"], s["n_dev"], batch[s["task"]])
                    for wv in v["waves"] for s in wv["slices"]
                    if s["tp"] == 1 and s["n_dev"] > batch[s["task"]]]
            check(not wide, name + ": no slice at tp 1 wider than its batch per micro-step",
                  repr(wide[:4]))
        r = run([PLAN, model("clip-7"), clusters["a800-8x8"], "--tp", "8", "-o", "t8.bin"], tmp)
        lines = r.stderr.splitlines()
        want = (model("clip-7") + ": components.audio.heads: --tp 8 does not divide the heads "
                "(12) of transformer 'audio'")
        check(r.returncode == 2 and lines[:1] == [want] and len(lines) == 2,
              "--tp 8 on clip-7 names only the heads, located", repr((r.returncode, r.stderr)))
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
