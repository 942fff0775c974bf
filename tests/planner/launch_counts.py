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
with all arguments present, loops as one pass. The sequence-parallel
block (APART: cu_sp.cu), which branches on the layer's place in its
slice, is counted along the path of a layer inside its slice instead
(sp_counts below), with its collectives, and with runtime/exec.c's
sp_ln_add, and checked against cost.c's SP_LAUNCHES, SP_COLLECTIVES and
SP_BWD_EXTRA. It does not run anything and does not check
the runtime's other extras (cost.c's interp_extra).
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
# and cu_tblock_bwd: left out of the transformer's row (cost.c prices it
# with SP_LAUNCHES, counted by sp_counts)
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

# ---- the sequence-parallel block, along the path a layer takes ----
#
# cu_tblock_sp_fwd / cu_tblock_sp_bwd branch on the layer's place in its
# slice (rt_tp_t.whole_in: the slice's first layer, whole_out: its last)
# and on ln_grads (set by runtime/exec.c exec_bwd for every sequence-
# parallel BWD), so they are counted along one path: the statements of
# cu_sp.cu's functions (and of runtime/exec.c's sp_ln_add, the per-layer
# extra of a sequence-parallel BWD) are executed symbolically with those
# flags, everything else they call counted by count() above. Conditions:
# an error check (rc < 0, a workspace overflow, a call's return) is false;
# the flags whole_in, whole_out and ln_grads (acc) are as given; any other
# name is a size or a present buffer (non-zero; nullptr is zero). A loop
# `for (int q = 0; q < N; q++)` with a literal N runs N times, any other
# loop once (per layer). Each call of the group hooks (tp->allgather,
# tp->reduce_scatter, tp->allreduce) is one collective, counted apart.

SP_FILE = "cu_sp.cu"
HOOKS = {"allgather", "reduce_scatter", "allreduce"}
FLAGS = {"whole_in", "whole_out", "ln_grads"}


def split_top(text, sep=","):
    """text split at sep outside (), [], {} and strings"""
    out, depth, cur, i = [], 0, [], 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = text.index('"', i + 1)
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(c, 0)
        if c == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


def closing(text, i):
    """index just past the bracket that closes text[i]"""
    pairs = {"(": ")", "{": "}", "[": "]"}
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            j = text.index('"', j + 1)
        elif c in pairs:
            depth += 1
        elif c in pairs.values():
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError("unbalanced: " + text[i:i + 60])


def parse(text):
    """statements of a body: ('block', [...]), ('if', cond, then, else),
    ('for', header, body), ('return', expr), ('expr', text)"""
    out, i = [], 0
    while True:
        while i < len(text) and text[i] in " \t\n;":
            i += 1
        if i >= len(text):
            return out
        st, i = parse_one(text, i)
        out.append(st)


def parse_one(text, i):
    while text[i] in " \t\n":
        i += 1
    if text[i] == "{":
        j = closing(text, i)
        return ("block", parse(text[i + 1:j - 1])), j
    m = re.compile(r"(if|for|while)\s*\(").match(text, i)
    if m:
        j = closing(text, m.end() - 1)
        head = text[m.end():j - 1]
        body, k = parse_one(text, j)
        if m.group(1) != "if":
            return ("for" if m.group(1) == "for" else "while", head, body), k
        e = re.compile(r"\s*else\b").match(text, k)
        other = None
        if e:
            other, k = parse_one(text, e.end())
        return ("if", head, body, other), k
    # a simple statement: up to ';' outside brackets
    j, depth = i, 0
    while True:
        c = text[j]
        if c == '"':
            j = text.index('"', j + 1)
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ";" and depth == 0:
            break
        j += 1
    st = text[i:j].strip()
    if re.match(r"return\b", st):
        return ("return", st[6:].strip()), j + 1
    return ("expr", st), j + 1


class Path:
    """launches along one path: [kernels, per_head, collectives]"""

    def __init__(self, defs, local, flags, backend):
        self.defs, self.local, self.flags, self.backend = defs, local, flags, backend

    def value(self, expr, env):
        """an expression's truth as an int, by the rules above"""
        e = expr.strip()
        if re.search(r"\brc\b", e) or "overflow" in e:
            return 0  # an error check
        e = re.sub(r"\b(?:d\.)?tp->(\w+)", r"\1", e)
        if re.search(r"\w\s*\(", e):
            return 0  # a call's return: an error check
        e = e.replace("nullptr", "0").replace("NULL", "0")
        e = re.sub(r"!(?!=)", " not ", e).replace("||", " or ").replace("&&", " and ")
        e = re.sub(r"(\w+)(?:\.|->)(\w+)", r"\1_\2", e)

        class Names(dict):
            def __missing__(_, k):
                if k in self.flags:
                    return self.flags[k]
                return 1
        return int(bool(eval(e, {"__builtins__": {}}, Names(env))))

    def calls(self, text, env):
        got = [text.count("<<<"), 0, 0]
        for m in re.finditer(r"(->|\.)?\b(\w+)\s*(?:<[^<>()]*>)?\s*\(", text):
            arrow, callee = m.group(1), m.group(2)
            if arrow == "->" and callee in HOOKS:
                got[2] += 1
                continue
            if arrow and callee in self.backend:
                callee = self.backend[callee]
            elif arrow:
                continue
            if callee in self.local:
                args = split_top(text[m.end():closing(text, m.end() - 1) - 1])
                sub = self.run_func(callee, [self.value_or_one(a, env) for a in args])
            elif callee in LEAF_ONE:
                sub = [1, 0, 0]
            elif callee in PER_HEAD:
                sub = [0, 1, 0]
            elif callee in self.defs and callee not in LEAF_ZERO:
                sub = list(count(self.defs, callee)) + [0]
            else:
                continue
            got = [a + b for a, b in zip(got, sub)]
        return got

    def value_or_one(self, expr, env):
        try:
            return self.value(expr, env)
        except Exception:
            return 1

    def run_func(self, name, args):
        params, body = self.local[name]
        env = {p: a for p, a in zip(params, args)}
        got, _ = self.run(parse(body), env)
        return got

    def run(self, stmts, env):
        """([kernels, per_head, collectives], returned)"""
        got = [0, 0, 0]

        def add(sub):
            for q in range(3):
                got[q] += sub[q]
        for st in stmts:
            kind = st[0]
            if kind == "block":
                sub, ret = self.run(st[1], env)
                add(sub)
                if ret:
                    return got, True
            elif kind == "expr":
                add(self.calls(st[1], env))
                m = re.match(r"^(?:const\s+)?[\w:]+[\s\*]+(\w+)\s*=\s*([\w\.\->\s]+)$", st[1])
                if m:
                    env[m.group(1)] = self.value_or_one(m.group(2), env)
            elif kind == "return":
                e = st[1]
                parts = split_top(e, "?")
                if len(parts) == 2:
                    add(self.calls(parts[0], env))
                    yes, no = split_top(parts[1], ":")
                    add(self.calls(yes if self.value(parts[0], env) else no, env))
                else:
                    add(self.calls(e, env))
                return got, True
            elif kind == "if":
                add(self.calls(st[1], env))
                branch = st[2] if self.value(st[1], env) else st[3]
                if branch is not None:
                    sub, ret = self.run([branch], env)
                    add(sub)
                    if ret:
                        return got, True
            else:  # for / while: a literal count from 0, else one pass
                m = re.match(r"\s*int\s+\w+\s*=\s*0\s*;\s*\w+\s*<\s*(\d+)\s*;", st[1])
                for _ in range(int(m.group(1)) if m else 1):
                    sub, ret = self.run([st[2]], env)
                    add(sub)
                    if ret:
                        return got, True
        return got, False


def local_functions(path):
    """name -> (parameter names, body) of the functions defined in path"""
    text = strip_comments(open(path).read())
    head = re.compile(r"^[A-Za-z_][\w:<>\*\s&]*?\b(\w+)\s*\(([^;{}]*)\)\s*\{", re.M)
    out = {}
    for m in head.finditer(text):
        if m.group(1) in ("if", "for", "while", "switch"):
            continue
        params = [re.findall(r"\w+", p)[-1] for p in split_top(m.group(2)) if p.strip()]
        out[m.group(1)] = (params, text[m.end():closing(text, m.end() - 1) - 1])
    return out


def backend_table():
    """rt_backend_t field -> the CUDA backend's function (runtime/backend_cuda.c)"""
    text = open(os.path.join(ROOT, "runtime", "backend_cuda.c")).read()
    return dict(re.findall(r"\.(\w+)\s*=\s*(cu_\w+)", text))


def sp_counts(defs, flags):
    """(fwd, bwd, bwd_extra) launches [kernels, per_head, collectives] of a
    sequence-parallel layer with these flags; bwd_extra: exec.c's sp_ln_add
    per layer"""
    local = local_functions(os.path.join(CUDA, SP_FILE))
    execf = local_functions(os.path.join(ROOT, "runtime", "exec.c"))
    for name in ("cu_copy_rows",):
        local[name] = local_functions(os.path.join(CUDA, "cu_runtime.cu"))[name]
    local["sp_ln_add"] = execf["sp_ln_add"]
    p = Path(defs, local, flags, backend_table())
    fwd = p.run_func(APART[0], [1] * len(local[APART[0]][0]))
    bwd = p.run_func(APART[1], [1] * len(local[APART[1]][0]))
    extra = p.run_func("sp_ln_add", [1] * len(local["sp_ln_add"][0]))
    return fwd, bwd, extra


def sp_row(name):
    text = open(os.path.join(ROOT, "planner", "cost.c")).read()
    m = re.search(name + r"\s*=\s*\{([^}]*)\}", text)
    return [int(x) for x in m.group(1).split(",")] if m else None



def sp_define(name):
    text = open(os.path.join(ROOT, "planner", "cost.c")).read()
    m = re.search(r"#define\s+" + name + r"\s+(\d+)", text)
    return int(m.group(1)) if m else None


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
    # a layer inside its slice, as cost.c prices every sequence-parallel layer
    fwd, bwd, extra = sp_counts(defs, {"whole_in": 0, "whole_out": 0, "ln_grads": 1})
    checks = [("SP", fwd[:2] + bwd[:2], sp_row(r"SP_LAUNCHES")),
              ("SP coll.", [fwd[2], bwd[2]], [sp_define("SP_COLLECTIVES")] * 2),
              ("SP bwd ext.", [sum(extra)], [sp_define("SP_BWD_EXTRA")])]
    for name, got, want in checks:
        status = "ok" if got == want else "MISMATCH"
        print(f"{name:12s} sources {got} cost.c {want} {status}")
        bad += got != want
    for where, flags in (("first", {"whole_in": 1, "whole_out": 0, "ln_grads": 1}),
                         ("last", {"whole_in": 0, "whole_out": 1, "ln_grads": 1})):
        f, b, _ = sp_counts(defs, flags)
        print(f"  (a slice's {where} SP layer, not priced: fwd {f}, bwd {b} "
              f"[kernels, per head, collectives])")
    if set(rows) != set(LAYER_FUNCS):
        print(f"cost.c lists {sorted(rows)}, the check knows {sorted(LAYER_FUNCS)}")
        bad += 1
    if bad:
        print("planner/cost.c's LAUNCHES, XATTN_LAUNCHES or SP_* no longer matches runtime/cuda: "
              "recount, update the table and its comment")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
