#!/usr/bin/env python3
"""--tp N forces tensor parallelism (issue 18; tp-format.txt) wherever a
slice allows it (tp_assign: a class of MetaOps sharing components takes N
when each of its slices can run N, else 1). On the demo (one node of 4
devices; transformers of 4 heads, ffn 256), with the sequential algorithm
(every slice on all 4 devices, so every transformer can be split; ours
picks 1-device lanes on this cluster, which no degree splits):

  * --tp 2 plans (exit 0: the planner verified the plan, TP rules included)
    and its view shows: tp 1 or 2 only; tp 2 only on transformer slices of
    even width; one degree for every slice of a component (one sharding
    per layer); at least one slice split;
  * memory per the formula: a split layer's shard buckets hold
    comp_layer_params_tp = (4h^2 + 2hf + 3h + f)/t + 6h elements each, one
    bucket per shard (t of them), where the whole layer has
    4h^2 + 2hf + 9h + f;
  * the options string says tp=2; under the default (auto) no slice is split;
  * --tp 3 (3 does not divide 4 heads) exits 2 naming the component, with
    a hint, and writes no plan.
Environment: SPINDLE_PLAN, SPINDLE_SHOW, SPINDLE_ROOT (test_env). Exit 0
pass, 1 fail.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]
SHOW = os.environ["SPINDLE_SHOW"]
MODEL = os.path.join(ROOT, "plans", "demo", "model.json")
CLUSTER = os.path.join(ROOT, "plans", "demo", "cluster.json")


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def view(tmp, tp):
    out = os.path.join(tmp, "tp%s.bin" % tp)
    args = [PLAN, MODEL, CLUSTER, "-o", out, "--algo", "sequential"] + \
        (["--tp", tp] if tp else [])
    r = run(args, tmp)
    if r.returncode != 0:
        return r, None
    v = run([SHOW, out, "--json"], tmp)
    return r, json.loads(v.stdout)


def report(results):
    """Prints (passed, what, detail) results; 1 when one failed, else 0."""
    for ok, what, detail in results:
        print("%s %s%s" % ("ok  " if ok else "FAIL", what, "" if ok else "\n     " + detail))
    failed = sum(not ok for ok, _, _ in results)
    print("%d failed" % failed if failed else "all passed")
    return 1 if failed else 0


def main():
    results = []  # (passed, what, detail), printed at the end

    def check(ok, what, detail=""):
        results.append((bool(ok), what, detail))

    model = json.load(open(MODEL))
    comps = model["components"]
    comp_of = {}  # "task/node" -> component
    for task in model["tasks"]:
        for node in task["graph"]:
            comp_of[task["name"] + "/" + node["id"]] = node["component"]

    def slice_comp(s):
        return comp_of.get(s["metaop"].split("..")[0])

    with tempfile.TemporaryDirectory() as tmp:
        r, v = view(tmp, "2")
        check(r.returncode == 0, "--tp 2 plans and verifies (exit 0)", r.stderr)
        if v is None:
            print("FAIL --tp 2 plans\n     " + r.stderr)
            return 1
        check("tp=2" in v["options"], "the options say tp=2", v["options"])
        slices = [s for w in v["waves"] for s in w["slices"]]
        check(all(s["tp"] in (1, 2) for s in slices), "degrees are 1 or 2")
        splits = ("transformer", "embedding", "lm_head")  # vocabulary parallel: 64 / 2
        bad = [s["metaop"] for s in slices if s["tp"] == 2 and
               (comps[slice_comp(s)]["type"] not in splits or s["n_dev"] % 2)]
        check(not bad, "tp 2 only on transformer, embedding and LM head slices of even "
              "width", repr(bad))
        by_comp = {}
        for s in slices:
            by_comp.setdefault(slice_comp(s), set()).add(s["tp"])
        mixed = {c: t for c, t in by_comp.items() if len(t) > 1}
        check(not mixed, "one degree per component (one sharding per layer)", repr(mixed))
        split = [c for c, t in by_comp.items() if t == {2}]
        check(len(split) >= 1, "at least one component is split", repr(by_comp))
        kinds = {comps[c]["type"] for c in split}
        check({"transformer", "embedding", "lm_head"} <= kinds,
              "transformers, an embedding and an LM head are split", repr(kinds))
        for c in split:
            cp = comps[c]
            h = cp["hidden"]
            if cp["type"] == "embedding":  # token rows V/2, positions whole
                whole = (cp["vocab"] + cp["max_seq"]) * h
                shard = (cp["vocab"] // 2 + cp["max_seq"]) * h
            elif cp["type"] == "lm_head":  # LayerNorm whole, logit columns V/2
                whole = 2 * h + h * cp["vocab"]
                shard = 2 * h + h * cp["vocab"] // 2
            else:
                f = cp["ffn"]
                whole = 4 * h * h + 2 * h * f + 9 * h + f
                shard = (4 * h * h + 2 * h * f + 3 * h + f) // 2 + 6 * h
            bks = [b for b in v["buckets"] if any(p["component"] == c for p in b["params"])]
            ranks = sorted(p["tp_rank"] for b in bks for p in b["params"]
                           if p["component"] == c and p["layer"] == 0)
            per = [b["elems"] // len(b["params"]) for b in bks]
            check(ranks == [0, 1] and all(e == shard for e in per) and shard < whole,
                  "'%s': one bucket per shard of %d elements (whole layer %d)"
                  % (c, shard, whole), repr((ranks, per)))
        # member j of a split slice holds shard (2, j) of its layers (the
        # view lists a device's held params when it holds a shard)
        held = {d["device"]: d.get("held", []) for d in v["devices"]}
        wrong = []
        for s in slices:
            if s["tp"] != 2:
                continue
            for j, d in enumerate(s["devices"]):
                mine = [(p["tp"], p["tp_rank"]) for p in held[d]
                        if p["component"] == slice_comp(s)]
                if not mine or any(m != (2, j % 2) for m in mine):
                    wrong.append((s["metaop"], d, mine))
        check(not wrong, "member j of a split slice holds shard j of 2", repr(wrong))
        r0, v0 = view(tmp, None)
        check(r0.returncode == 0 and v0 is not None and
              all(s["tp"] == 1 for w in v0["waves"] for s in w["slices"]) and
              "tp=auto" in v0["options"], "the default (auto) splits nothing here")
        r3 = run([PLAN, MODEL, CLUSTER, "-o", "tp3.bin", "--tp", "3"], tmp)
        lines = r3.stderr.splitlines()
        check(r3.returncode == 2 and len(lines) == 2 and
              lines[0] == MODEL + ": components.img_enc: --tp 3 does not divide "
                          "the heads (4) and ffn (256) of transformer 'img_enc'" and lines[1].startswith("hint: ") and
              not os.path.exists(os.path.join(tmp, "tp3.bin")),
              "--tp 3 exits 2 naming the component, with a hint, no plan written",
              repr((r3.returncode, r3.stderr)))
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
