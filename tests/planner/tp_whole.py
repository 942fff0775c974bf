#!/usr/bin/env python3
"""A forced --tp N says which transformers, embeddings and LM heads it
leaves whole, and why (issue 18 review; tp_cost.c tp_whole): one stderr
line per class of such MetaOps (sharing components) that no slice splits,
and the same lines in --report. Not under --tp auto, nor where every class
splits.

The case: the demo (one node of 4 devices, 3 transformer components, an
embedding and an LM head of vocabulary 64) under --tp 2 with ours, which
picks 1-device lanes for the encoders and the text embedding and 3
devices for the fused decoder here, so only the LM head splits (by
vocabulary): four lines, each naming a component, its MetaOps and the
slice that cannot run 2 (1 device: narrower than 2; 3 devices: not a
multiple of 2), and each claim holds in the plan's view (a slice of that
MetaOp on that many devices, tp 1). The sequential algorithm (every slice
on all 4 devices) splits every class: no line. --tp-vocab whole leaves the
embedding unnamed. ofasys under --tp 2: its odd vocabulary (59457) is no
reason (uneven shards, vocab_shard); a vocabulary of 3 under --tp 4 is
(fewer ids than members), for the embedding and the LM head.
Not covered: the node-alignment and one-sharding reasons (they need
placements these small clusters do not make).
Needs SPINDLE_PLAN, SPINDLE_SHOW and SPINDLE_ROOT (test_env); exits 0 on
pass, 1 on failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

PLAN, SHOW = (os.environ[k] for k in ("SPINDLE_PLAN", "SPINDLE_SHOW"))
DEMO = os.path.join(os.environ["SPINDLE_ROOT"], "plans", "demo")
MODEL, CLUSTER = (os.path.join(DEMO, f) for f in ("model.json", "cluster.json"))
LINE = re.compile(r"--tp (\d+) leaves (?:transformer|embedding|LM head) '([^']+)' whole \(MetaOps ([^)]*)\): "
                  r"(\S+) runs a slice on (\d+) devices?, "
                  r"(narrower than|not a multiple of) (\d+)$")


def run(args):
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def plan(tmp, name, extra):
    out = os.path.join(tmp, name + ".bin")
    r = run([PLAN, MODEL, CLUSTER, "-o", out] + extra)
    if r.returncode != 0:
        raise SystemExit(f"FAIL {name}: exit {r.returncode}\n{r.stderr}")
    v = json.loads(run([SHOW, out, "--json"]).stdout)
    return r, [s for w in v["waves"] for s in w["slices"]]


def whole_lines(text, lead):
    return [x[len(lead):] for x in text.splitlines() if x.startswith(lead + "--tp ")]


def main():
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        r, slices = plan(tmp, "ours-tp2", ["--tp", "2"])
        lines = whole_lines(r.stderr, "spindle-plan: ")
        print("\n".join(lines))
        if any(s["tp"] > 1 and not s["metaop"].endswith("/loss") for s in slices) or \
                not any(s["tp"] > 1 for s in slices):
            fails.append("ours under --tp 2 on the demo now splits another slice than "
                         "the LM head, or not it: construct another case")
        comps = []
        for x in lines:
            m = LINE.match(x)
            if not m:
                fails.append(f"line not in the expected form: {x}")
                continue
            t, comp, mops, mop, n, why, t2 = m.groups()
            comps.append(comp)
            n, t = int(n), int(t)
            if t != 2 or int(t2) != 2 or mop not in mops.split(", "):
                fails.append(f"wrong degree or MetaOp: {x}")
            if why != ("narrower than" if n < t else "not a multiple of") or n % t == 0:
                fails.append(f"wrong reason: {x}")
            if not any(s["metaop"] == mop and s["n_dev"] == n and s["tp"] == 1
                       for s in slices):
                fails.append(f"no whole slice of {mop} on {n} devices in the plan: {x}")
        if sorted(comps) != ["fuse", "img_enc", "txt_embed", "txt_enc"]:
            fails.append(f"one line per transformer and embedding component expected, "
                         f"got {comps}")
        rw = run([PLAN, MODEL, CLUSTER, "--tp", "2", "--tp-vocab", "whole", "-o",
                  os.path.join(tmp, "w.bin")])
        lw = [LINE.match(x) for x in whole_lines(rw.stderr, "spindle-plan: ")]
        if rw.returncode != 0 or sorted(m.group(2) for m in lw if m) != \
                ["fuse", "img_enc", "txt_enc"]:
            fails.append(f"--tp-vocab whole: the transformers alone expected:\n{rw.stderr}")
        # an odd vocabulary splits unevenly (vocab_shard): ofasys' 59457 is
        # no reason any more; fewer ids than members is (a demo whose
        # vocabulary is 3, --tp 4 on its 4 devices, every slice on all 4)
        ofa = os.path.join(os.environ["SPINDLE_ROOT"], "plans", "ofasys")
        ro = run([PLAN, os.path.join(ofa, "model.json"), os.path.join(ofa, "cluster.json"),
                  "--tp", "2", "-o", os.path.join(tmp, "ofa.bin")])
        if ro.returncode != 0 or "its vocab" in ro.stderr:
            fails.append(f"ofasys --tp 2: exit {ro.returncode} or a vocabulary named as "
                         f"the reason:\n{ro.stderr}")
        with open(MODEL) as f:
            small = json.load(f)
        vocabs = [c for c in small["components"].values() if "vocab" in c]
        for c in vocabs:
            c["vocab"] = 3
        sm = os.path.join(tmp, "vocab3.json")
        with open(sm, "w") as f:
            json.dump(small, f)
        r3 = run([PLAN, sm, CLUSTER, "--tp", "4", "--algo", "sequential", "-o",
                  os.path.join(tmp, "v3.bin")])
        want = re.compile(r"--tp 4 leaves (embedding|LM head) '[^']+' whole \(MetaOps "
                          r"[^)]*\): its vocab \(3\) has fewer ids than 4 members$")
        got = [x for x in whole_lines(r3.stderr, "spindle-plan: ") if want.match(x)]
        if r3.returncode != 0 or len(vocabs) != 2 or len(got) != 2:
            fails.append(f"vocabulary 3 under --tp 4: exit {r3.returncode}, want a line on "
                         f"the embedding and the LM head with their 3 ids:\n{r3.stderr}")
        rep = run([PLAN, MODEL, CLUSTER, "--tp", "2", "--report"])
        if whole_lines(rep.stdout, "  ") != lines:
            fails.append("--report does not list the same classes left whole")
        for name, extra in (("auto", []), ("seq-tp2", ["--algo", "sequential", "--tp", "2"])):
            r2 = run([PLAN, MODEL, CLUSTER, "--report"] + extra)
            if r2.returncode != 0 or whole_lines(r2.stderr, "spindle-plan: ") or \
                    whole_lines(r2.stdout, "  "):
                fails.append(f"{name}: exit {r2.returncode} or a line about a class left "
                             f"whole:\n{r2.stderr}")
    for f in fails:
        print("FAIL " + f)
    print("ok" if not fails else f"{len(fails)} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
