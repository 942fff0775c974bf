#!/usr/bin/env python3
"""
launch_counts.py: recounts, from the CUDA backend's sources, the kernels one
layer issues per pass, and fails when planner/cost.c's LAUNCHES table says
otherwise (the analytic layer model charges gpu.launch_us per kernel); and
likewise its XATTN_LAUNCHES row, a decoder layer's launches beyond the
transformer's (cu_xblock_fwd / cu_xblock_bwd less cu_tblock_fwd /
cu_tblock_bwd).

Counting rule (cost.c's comment): in the layer function's body and,
recursively, in every function of runtime/cuda/*.cu it calls, each <<<>>>
launch, cu_gemm / cu_gemm_batched call, and cudaMemcpyAsync /
cudaMemsetAsync / cudaMemset2DAsync / cudaMemcpy2DAsync counts one; each
gemm_grid call counts one per head loop; cu_shadow counts nothing (once
per step, not per layer). Every statement counts once: branches as taken
with all arguments present, loops as one pass; the sequence-parallel
block's own functions (APART) are counted apart. It does not run anything
and does not check runtime/interp.c's extras (INTERP_EXTRA).
"""
import os
import re
import sys

ROOT = os.environ.get("SPINDLE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
CUDA = os.path.join(ROOT, "runtime", "cuda")

LAYER_FUNCS = {
    "EMBEDDING": ("cu_embedding_fwd", "cu_embedding_bwd"),
    "PATCH": ("cu_patch_fwd", "cu_patch_bwd"),
    "TRANSFORMER": ("cu_tblock_fwd", "cu_tblock_bwd"),
    "LINEAR": ("cu_linear_fwd", "cu_linear_bwd"),
    "LM_HEAD": ("cu_lm_head_loss", None),
    "CLASSIFIER": ("cu_classifier_loss", None),
    "CONTRASTIVE": ("cu_contrastive_loss", None),
}
LEAF_ONE = {"cu_gemm", "cu_gemm_batched", "cudaMemcpyAsync", "cudaMemsetAsync",
            "cudaMemset2DAsync", "cudaMemcpy2DAsync"}
LEAF_ZERO = {"cu_shadow"}
PER_HEAD = {"gemm_grid"}
XATTN_FUNCS = ("cu_xblock_fwd", "cu_xblock_bwd")
# the sequence-parallel block (cu_sp.cu), another path out of cu_tblock_fwd
# and cu_tblock_bwd: left out of the transformer's row (cost.c prices a
# sequence-parallel layer with that row too) and printed alone
APART = ("cu_tblock_sp_fwd", "cu_tblock_sp_bwd")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def definitions():
    """name -> body of every function defined at column 0 in runtime/cuda/*.cu"""
    defs = {}
    head = re.compile(r"^(?:template\s*<[^>]*>\s*)?[A-Za-z_][\w:<>\*\s]*?\b(\w+)\s*\(([^;{}]*)\)\s*\{",
                      re.M)
    for f in sorted(os.listdir(CUDA)):
        if not f.endswith(".cu"):
            continue
        text = strip_comments(open(os.path.join(CUDA, f)).read())
        for m in head.finditer(text):
            if "__global__" in text[max(0, m.start() - 40):m.start(1)]:
                continue
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            defs.setdefault(m.group(1), text[m.end():i - 1])
    return defs


def count(defs, name, stack=()):
    """(fixed, per_head) launches of function name"""
    body = defs[name]
    fixed, per_head = body.count("<<<"), 0
    for m in re.finditer(r"\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", body):
        callee = m.group(1)
        if callee in LEAF_ONE:
            fixed += 1
        elif callee in PER_HEAD:
            per_head += 1
        elif callee in LEAF_ZERO or callee == name or callee in stack or \
                (callee in APART and name not in APART):
            continue
        elif callee in defs:
            f, h = count(defs, callee, stack + (name,))
            fixed, per_head = fixed + f, per_head + h
    return fixed, per_head


def table():
    text = open(os.path.join(ROOT, "planner", "cost.c")).read()
    block = re.search(r"LAUNCHES\[COMP__COUNT\]\s*=\s*\{(.*?)\};", text, re.S).group(1)
    rows = {}
    for m in re.finditer(r"\[COMP_(\w+)\]\s*=\s*\{([^}]*)\}", block):
        rows[m.group(1)] = [int(x) for x in m.group(2).split(",")]
    return rows


def xattn_row():
    text = open(os.path.join(ROOT, "planner", "cost.c")).read()
    m = re.search(r"XATTN_LAUNCHES\s*=\s*\{([^}]*)\}", text)
    return [int(x) for x in m.group(1).split(",")] if m else None


def main():
    defs, rows, bad = definitions(), table(), 0
    for comp, (fwd, bwd) in sorted(LAYER_FUNCS.items()):
        got = list(count(defs, fwd)) + (list(count(defs, bwd)) if bwd else [0, 0])
        want = rows.get(comp)
        status = "ok" if got == want else "MISMATCH"
        print(f"{comp:12s} sources {got} cost.c {want} {status}")
        bad += got != want
    tf, tb = LAYER_FUNCS["TRANSFORMER"]
    base = list(count(defs, tf)) + list(count(defs, tb))
    dec = list(count(defs, XATTN_FUNCS[0])) + list(count(defs, XATTN_FUNCS[1]))
    got, want = [d - b for d, b in zip(dec, base)], xattn_row()
    status = "ok" if got == want else "MISMATCH"
    print(f"{'XATTN':12s} sources {got} cost.c {want} {status} (decoder {dec} less "
          f"transformer {base})")
    bad += got != want
    if all(f in defs for f in APART):
        sp = list(count(defs, APART[0])) + list(count(defs, APART[1]))
        print(f"{'(SP block)':12s} sources {sp} (not in cost.c: priced with the "
              f"transformer's row)")
    if set(rows) != set(LAYER_FUNCS):
        print(f"cost.c lists {sorted(rows)}, the check knows {sorted(LAYER_FUNCS)}")
        bad += 1
    if bad:
        print("planner/cost.c's LAUNCHES or XATTN_LAUNCHES no longer matches runtime/cuda: "
              "recount, update the table and its comment")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
