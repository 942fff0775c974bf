#!/usr/bin/env python3
"""Encoder-decoder plans through the files (issue #20): tests/planner/encdec
(a captioning task whose text decoder attends to an image encoder, and a
summarising task whose decoder, the same component, attends to a projected
text encoder; memory width 64 against decoder hidden 32, mem_seq 16 and 24
against decoder seq 8 and 6) on 2 nodes x 4 devices.

For every algorithm, with the default options and with --tp 2
--microbatches 2 --recompute all together:
  * spindle-plan -o exits 0 (it verified the plan) and a second run writes
    the same bytes;
  * the view (spindle-show --json) gives every decoder slice its memory
    (seq, width, producer) and tp 1;
  * the programs (spindle-show --programs): on every device holding slots
    of a decoder C, the lines that write act(C, mem) (a recv, or a copy
    where the producer's output is on the device) cover each sample of the
    union of its slots' ranges exactly once, all before its first fwd of C;
    the lines that move grad(C, mem) out come after its last bwd of C and
    cover the same samples; a device without slots of C has neither.
A forced --tp 2 names the decoder component whole (stderr and --report),
and --tp 4 plans a variant whose decoder has 2 heads (not refused).
Prints ours' and the sequential iteration (ms) of each run.
Environment: SPINDLE_PLAN, SPINDLE_SHOW, SPINDLE_ROOT (test_env). Exit 0
pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]
SHOW = os.environ["SPINDLE_SHOW"]
DIR = os.path.join(ROOT, "tests", "planner", "encdec")
MODEL = os.path.join(DIR, "model.json")
CLUSTER = os.path.join(DIR, "cluster-2x4.json")
ALGOS = ["spindle", "spindle-paper", "sequential", "task-level", "distmm-mt"]
OPTSETS = [[], ["--tp", "2", "--microbatches", "2", "--recompute", "all"]]
INS = re.compile(r"^\s+(\d+) (\w+)\s+(.*)$")
SAMPLES = re.compile(r"samples (\d+)-(\d+)")


def run(args):
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def sample_range(batch, i, n):
    return batch * i // n, batch * (i + 1) // n


def programs(text):
    """device -> [(index, op, operands)] from spindle-show --programs."""
    progs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^program of device (\d+) ", line)
        if m:
            cur = progs.setdefault(int(m.group(1)), [])
            continue
        m = INS.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1)), m.group(2), m.group(3)))
    return progs


def check_plan(name, view, progs, batches, fails):
    """The memory's lines on every device for every decoder."""
    slices = [s for w in view["waves"] for s in w["slices"]]
    decoders = {s["metaop"]: s for s in slices if s.get("memory")}
    if sorted(decoders) != ["caption/dec", "summarize/dec_lo..dec_hi"]:
        fails.append(f"{name}: decoders {sorted(decoders)}")
        return
    for s in slices:
        if s["metaop"] in decoders and s["tp"] != 1:
            fails.append(f"{name}: decoder slice of {s['metaop']} at tp {s['tp']}")
    want_mem = {"caption/dec": (16, 64, "caption/img"),
                "summarize/dec_lo..dec_hi": (24, 64, "summarize/mem")}
    for c, s in decoders.items():
        got = (s["memory"]["seq"], s["memory"]["width"], s["memory"]["from"])
        if got != want_mem[c]:
            fails.append(f"{name}: {c}'s memory {got}, expected {want_mem[c]}")
    for c in decoders:
        batch = batches[c.split("/")[0]]
        for d, prog in sorted(progs.items()):
            union = set()
            for s in slices:
                if s["metaop"] == c and d in s["devices"]:
                    q = s["devices"].index(d)
                    a, b = sample_range(batch, q, s["n_dev"])
                    union |= set(range(a, b))
            mem_in, mem_out, fwd, bwd = [], [], [], []
            for k, op, rest in prog:
                if op in ("fwd", "bwd") and rest.startswith(c + " "):
                    (fwd if op == "fwd" else bwd).append(k)
                m = SAMPLES.search(rest)
                if op in ("recv", "copy") and f"-> act({c}, mem)" in rest or \
                        op == "recv" and rest.startswith(f"act({c}, mem)"):
                    mem_in.append((k, range(int(m.group(1)), int(m.group(2)))))
                if op in ("send", "copy") and rest.startswith(f"grad({c}, mem)"):
                    mem_out.append((k, range(int(m.group(1)), int(m.group(2)))))
            where = f"{name}: device {d}, {c}"
            if not union:
                if mem_in or mem_out:
                    fails.append(f"{where}: moves the memory without a slot of it")
                continue
            seen = [x for _, r in mem_in for x in r]
            if sorted(seen) != sorted(union):
                fails.append(f"{where}: memory in for samples {sorted(seen)}, its slots "
                             f"hold {sorted(union)} (each once)")
            if any(k > min(fwd) for k, _ in mem_in):
                fails.append(f"{where}: memory arrives after its first fwd")
            # every holder of the producer's samples gets its part back
            if not set(x for _, r in mem_out for x in r) == union:
                fails.append(f"{where}: memory gradient out for samples "
                             f"{sorted(set(x for _, r in mem_out for x in r))}")
            if any(k < max(bwd) for k, _ in mem_out):
                fails.append(f"{where}: memory gradient leaves before its last bwd")


def check_tp(tmp, model, fails):
    """A forced --tp names the decoder component whole, on stderr and in
    --report; a degree that does not divide a decoder's heads is no refusal
    (decoders stay whole anyway)."""
    line = ("--tp 2 leaves transformer 'dec' whole (MetaOps caption/dec, "
            "summarize/dec_lo..dec_hi): caption/dec is a decoder (cross-attention): "
            "decoders are never split")
    r = run([PLAN, MODEL, CLUSTER, "--tp", "2", "--report"])
    if r.returncode or "spindle-plan: " + line not in r.stderr.splitlines() or \
            "  " + line not in r.stdout.splitlines():
        fails.append(f"--tp 2: no line naming the decoder whole (exit {r.returncode}):\n"
                     f"{r.stderr}")
    m = json.loads(json.dumps(model))
    m["components"]["dec"]["heads"] = 2
    path = os.path.join(tmp, "dec-heads-2.json")
    json.dump(m, open(path, "w"))
    r = run([PLAN, path, CLUSTER, "--tp", "4"])
    if r.returncode != 0 or "'dec' whole" not in r.stderr:
        fails.append(f"--tp 4 with a 2-head decoder: exit {r.returncode}: {r.stderr.strip()}")
    else:
        print("--tp 4, decoder of 2 heads: planned, decoder whole")


def main():
    fails = []
    model = json.load(open(MODEL))
    with tempfile.TemporaryDirectory() as tmp:
        for algo in ALGOS:
            for opts in OPTSETS:
                name = " ".join([algo] + opts)
                k = int(opts[opts.index("--microbatches") + 1]) if opts else 1
                batches = {t["name"]: t["batch"] // k for t in model["tasks"]}
                out = [os.path.join(tmp, f"p{i}.bin") for i in range(2)]
                r = [run([PLAN, MODEL, CLUSTER, "-o", o, "--algo", algo] + opts) for o in out]
                if any(x.returncode for x in r):
                    fails.append(f"{name}: exit {r[0].returncode} {r[1].returncode}: "
                                 f"{r[0].stderr.strip()}")
                    continue
                if open(out[0], "rb").read() != open(out[1], "rb").read():
                    fails.append(f"{name}: two runs write different bytes")
                m = re.search(r"predicted ([0-9.]+) ms .* sequential ([0-9.]+) ms", r[0].stdout)
                print(f"{name:50s} iteration {m.group(1):>8s} ms, sequential {m.group(2):>8s} ms")
                view = json.loads(run([SHOW, out[0], "--json"]).stdout)
                progs = programs(run([SHOW, out[0], "--programs"]).stdout)
                if len(progs) != 8:
                    fails.append(f"{name}: {len(progs)} programs in the view")
                check_plan(name, view, progs, batches, fails)
        check_tp(tmp, model, fails)
    for f in fails:
        print("FAIL", f)
    print("%d failed" % len(fails) if fails else "all passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
