#!/usr/bin/env python3
"""The report's per-algorithm figures and the cost table out.

usage: report_costs.py CASE   (CASE: report-fields, costs-schema, costs-values)
  report-fields  --compare --json on bundled workloads: every algorithm has
                 transfer_ms, sync_ms and mfu; compute + transfer + sync make
                 the iteration; mfu x iteration is the same for every
                 algorithm and equals --inspect's model FLOPs over devices x
                 peak; the text report shows the same numbers.
  costs-schema   --costs validates against schemas/costs.schema.json (our own
                 checker of the keywords it uses, and jsonschema when there),
                 the schema is not vacuous, and two runs print the same bytes;
                 tests/planner/encdec's decoders show mem_seq, mem_width and
                 their memory's MetaOp.
  costs-values   the numbers: T(1) equals the report's MetaOp view, widths
                 1..min(batch, devices), the contrastive loss is the same at
                 every width, times never grow with n and do shrink for a
                 transformer, profiled times are the profile's points and
                 their interpolation, transfer and all-reduce prices against
                 the link figures printed beside them.
Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def close(a, b, rel=1e-6, abs_=1e-9):
    return abs(a - b) <= abs_ + rel * abs(b)


def workload(name, cluster=None):
    d = os.path.join(ROOT, "plans", name)
    return [os.path.join(d, "model.json"), cluster or os.path.join(d, "cluster.json")]


def plan(args):
    p = subprocess.run([PLAN] + args, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, "spindle-plan %s: exit %d: %s" % (" ".join(args), p.returncode,
                                                                p.stderr))
    return p.stdout


# ---- report-fields -------------------------------------------------------------

def inspect_tflop(args):
    m = re.search(r"per iteration \(all tasks' batches\): ([0-9.]+) TFLOP", plan(args + ["--inspect"]))
    check(m, "--inspect prints no FLOPs per iteration")
    return float(m.group(1))


def case_report_fields():
    for wl in ("clip-4", "qwen-val", "demo"):
        args = workload(wl)
        j = json.loads(plan(args + ["--compare", "--json"]))
        cl = json.load(open(args[1]))
        peak = cl["gpu"]["peak_tflops"] * 1e12 * j["devices"]
        algos = j["algorithms"]
        check(len(algos) >= 5, "%s: --compare ran %d algorithms" % (wl, len(algos)))
        flops = set()
        for name, a in algos.items():
            for k in ("transfer_ms", "sync_ms", "mfu"):
                check(k in a, "%s/%s: no %s in --json" % (wl, name, k))
                check(a[k] >= 0, "%s/%s: %s = %g < 0" % (wl, name, k, a[k]))
            parts = a["compute_ms"] + a["transfer_ms"] + a["sync_ms"]
            check(close(parts, a["iteration_ms"], 1e-5, 1e-5),
                  "%s/%s: compute %g + transfer %g + sync %g = %g, iteration %g" %
                  (wl, name, a["compute_ms"], a["transfer_ms"], a["sync_ms"], parts,
                   a["iteration_ms"]))
            check(0 < a["mfu"] < 1, "%s/%s: mfu %g outside (0, 1)" % (wl, name, a["mfu"]))
            # MFU counts no busy time the plan adds: it is below utilisation
            check(a["mfu"] <= a["utilisation"] + 1e-6, "%s/%s: mfu %g > utilisation %g" %
                  (wl, name, a["mfu"], a["utilisation"]))
            flops.add(round(a["mfu"] * peak * a["iteration_ms"] * 1e-3 / 1e12, 3))
        # the model's FLOPs do not depend on the algorithm
        want = inspect_tflop(args)
        check(max(abs(f - want) for f in flops) <= 2e-3 + 2e-5 * want,
              "%s: mfu x devices x peak x iteration gives %s TFLOP, --inspect says %.3f" %
              (wl, sorted(flops), want))
        # the chosen plan's certificate agrees with its row
        ch = algos[j["chosen"]]
        check(close(ch["sync_ms"], j["sync_ms"]) and close(ch["transfer_ms"], j["transfer_ms"]),
              "%s: chosen row's sync/transfer %g/%g, certificate %g/%g" %
              (wl, ch["sync_ms"], ch["transfer_ms"], j["sync_ms"], j["transfer_ms"]))
        # the text report shows the same numbers
        text = plan(args + ["--compare"])
        for name, a in algos.items():
            row = re.search(r"^  %s +([0-9.]+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +[0-9.]+x +"
                            r"[0-9.]+%% +([0-9.]+)%%" % re.escape(name), text, re.M)
            check(row, "%s: no text row for %s" % (wl, name))
            got = [float(x) for x in row.groups()]
            exp = [a["iteration_ms"], a["compute_ms"], a["transfer_ms"], a["sync_ms"],
                   100 * a["mfu"]]
            check(all(abs(g - e) <= 0.051 for g, e in zip(got, exp)),
                  "%s/%s: text row %s, --json %s" % (wl, name, got, exp))


# ---- costs-schema ----------------------------------------------------------------

def validate(v, s, defs, path="$"):
    """Errors of v against schema s: the keywords costs.schema.json uses."""
    if "$ref" in s:
        s = defs[s["$ref"].split("/")[-1]]
    errs = []
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    t = s.get("type")
    if t in types and not isinstance(v, types[t]):
        return ["%s: not a %s" % (path, t)]
    if t in ("integer", "number"):
        if isinstance(v, bool) or not isinstance(v, int if t == "integer" else (int, float)):
            return ["%s: not a %s" % (path, t)]
        if "minimum" in s and v < s["minimum"]:
            errs.append("%s: %r below %r" % (path, v, s["minimum"]))
    if "const" in s and v != s["const"]:
        errs.append("%s: %r is not %r" % (path, v, s["const"]))
    if "enum" in s and v not in s["enum"]:
        errs.append("%s: %r not in %r" % (path, v, s["enum"]))
    if isinstance(v, dict):
        props = s.get("properties", {})
        errs += ["%s: no %s" % (path, k) for k in s.get("required", []) if k not in v]
        if s.get("additionalProperties") is False:
            errs += ["%s: unknown key %s" % (path, k) for k in v if k not in props]
        for k, x in v.items():
            if k in props:
                errs += validate(x, props[k], defs, path + "." + k)
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0):
            errs.append("%s: fewer than %d items" % (path, s["minItems"]))
        for i, x in enumerate(v):
            errs += validate(x, s.get("items", {}), defs, "%s[%d]" % (path, i))
    return errs


def schema_errors(out):
    schema = json.load(open(os.path.join(ROOT, "schemas", "costs.schema.json")))
    errs = validate(out, schema, schema["$defs"])
    try:
        import jsonschema
    except ImportError:
        return errs
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    return errs + [e.message for e in v.iter_errors(out)]


def case_costs_schema():
    for wl, cl in (("demo", None), ("clip-4", None),
                   ("clip-10", os.path.join(ROOT, "plans", "clusters", "a800-4x8.json"))):
        text = plan(workload(wl, cl) + ["--costs"])
        check(text == plan(workload(wl, cl) + ["--costs"]), "%s: two runs differ" % wl)
        out = json.loads(text)
        errs = schema_errors(out)
        check(not errs, "%s: --costs does not validate: %s" % (wl, errs[:3]))
        # every ms figure has the fixed 9 decimals
        check(not re.search(r"_ms\": \[?[0-9]+(\.[0-9]{0,8})?[,\]}]", text),
              "%s: a time without 9 decimals" % wl)
    # a decoder (issue #20): its shape has the memory's mem_seq and
    # mem_width, and its memory is named apart from its inputs
    d = os.path.join(ROOT, "tests", "planner", "encdec")
    out = json.loads(plan([os.path.join(d, "model.json"), os.path.join(d, "cluster-2x4.json"),
                           "--costs"]))
    errs = schema_errors(out)
    check(not errs, "encdec: --costs does not validate: %s" % errs[:3])
    dec = {m["name"]: (m["shape"].get("mem_seq"), m["shape"].get("mem_width"), m.get("memory"),
                       m["predecessors"]) for m in out["metaops"] if "mem_seq" in m["shape"]}
    want = {"caption/dec": (16, 64, "caption/img", ["caption/txt_in"]),
            "summarize/dec_lo..dec_hi": (24, 64, "summarize/mem", ["summarize/txt_in"])}
    check(dec == want, "encdec: decoders %s, expected %s" % (dec, want))
    check(all("memory" not in m for m in out["metaops"] if m["name"] not in want),
          "encdec: a MetaOp that is no decoder names a memory")
    # the schema is not vacuous
    for bad in (lambda o: o["metaops"][0].pop("bwd_ms"),
                lambda o: o["metaops"][0].update(scales="yes"),
                lambda o: o["all_reduce"][0].update(devices=1),
                lambda o: o.update(extra=1)):
        o = json.loads(text)
        bad(o)
        check(schema_errors(o), "the schema accepts a broken cost table")


# ---- costs-values ------------------------------------------------------------------

def report_t1(args):
    """MetaOp name -> T(1) fwd+bwd per layer (4 decimals) from --report."""
    t1 = {}
    for line in plan(args + ["--report"]).splitlines():
        m = re.match(r"^  (\S+/\S+) +\d+ .* (analytic|profile) +([0-9.]+)$", line)
        if m:
            t1[m.group(1)] = float(m.group(3))
    return t1


def check_metaops(wl, out):
    t1 = report_t1(workload(wl))
    names = [m["name"] for m in out["metaops"]]
    check(sorted(names) == sorted(t1), "%s: MetaOps %s, the report has %s" %
          (wl, names, sorted(t1)))
    check(len(set(names)) == len(names), "%s: MetaOp names repeat" % wl)
    for m in out["metaops"]:
        n = m["name"]
        check(all(p in names[:names.index(n)] for p in m["predecessors"]),
              "%s: %s's predecessors %s do not come before it" % (wl, n, m["predecessors"]))
        # past its batch only by tensor parallelism: transformers, t <= a node
        tmax = out["gpus_per_node"] if m["shape"]["type"] == "transformer" else 1
        check(min(m["batch"], out["devices"]) <= m["nmax"] <=
              min(m["batch"] * tmax, out["devices"]),
              "%s: %s nmax %d, batch %d, devices %d" % (wl, n, m["nmax"], m["batch"],
                                                       out["devices"]))
        for k in ("fwd_ms", "bwd_ms"):
            t = m[k]
            check(len(t) == m["nmax"], "%s: %s has %d %s for nmax %d" % (wl, n, len(t), k,
                                                                      m["nmax"]))
            check(all(b <= a for a, b in zip(t, t[1:])), "%s: %s %s grows with n: %s" %
                  (wl, n, k, t))
            if not m["scales"]:
                check(len(set(t)) == 1, "%s: %s does not scale, yet %s = %s" % (wl, n, k, t))
        got = m["fwd_ms"][0] + m["bwd_ms"][0]
        check(abs(got - t1[n]) <= 0.00006, "%s: %s T(1) %.6f, the report says %.4f" %
              (wl, n, got, t1[n]))
        if m["shape"]["type"] == "transformer" and m["nmax"] > 1:
            check(m["fwd_ms"][-1] < m["fwd_ms"][0], "%s: %s does not get faster: %s" %
                  (wl, n, m["fwd_ms"]))
    kinds = {m["shape"]["type"]: m["scales"] for m in out["metaops"]}
    return kinds


def check_prices(wl, out):
    L = out["links"]
    sizes = out["sizes_bytes"]
    for p in out["p2p"]:
        # one message: latency + bytes / bandwidth of the link it crosses
        gbs, lat = ((L["intra_node_gbs"], L["intra_node_latency_us"]) if p["path"] == "intra-node"
                    else (L["inter_node_gbs"], L["inter_node_latency_us"]))
        for s, ms in zip(sizes, p["ms"]):
            want = lat * 1e-3 + s / (gbs * 1e6)
            check(close(ms, want, 1e-6, 2e-9), "%s: %s p2p of %d bytes %.9f ms, by hand %.9f" %
                  (wl, p["path"], s, ms, want))
    for a in out["all_reduce"]:
        n = a["devices"]
        check(n == a["nodes"] * a["gpus_per_node"], "%s: all-reduce group size" % wl)
        check(all(y > x for x, y in zip(a["ms"], a["ms"][1:])),
              "%s: all-reduce price does not grow with bytes: %s" % (wl, a["ms"]))
        # each member sends at least 2 (n-1)/n of the bytes through its one
        # link: NVLink inside a node, the NIC with one GPU per node
        if a["nodes"] > 1 and a["gpus_per_node"] > 1:
            continue
        bw = L["intra_node_gbs"] if a["nodes"] == 1 else L["inter_node_gbs"]
        for s, ms in zip(sizes, a["ms"]):
            floor = 2 * (n - 1) / n * s / (bw * 1e6)
            check(ms >= floor * (1 - 1e-9), "%s: all-reduce of %d bytes over %dx%d: %.6f ms, "
                  "below the bandwidth floor %.6f" % (wl, s, a["nodes"], a["gpus_per_node"],
                                                      ms, floor))


def case_costs_values():
    out = demo = json.loads(plan(workload("demo") + ["--costs"]))
    kinds = check_metaops("demo", out)
    check(kinds.get("contrastive") is False and kinds.get("embedding") is True,
          "demo: contrastive/embedding scaling flags %s" % kinds)
    check_prices("demo", out)
    shapes = {(a["nodes"], a["gpus_per_node"]) for a in out["all_reduce"]}
    check(shapes == {(1, 2), (1, 4)}, "demo on 1x4: all-reduce shapes %s" % shapes)
    out = json.loads(plan(workload("clip-4") + ["--costs"]))
    check_metaops("clip-4", out)
    check_prices("clip-4", out)
    check({p["path"] for p in out["p2p"]} == {"intra-node", "cross-node"},
          "clip-4 on 2 nodes: p2p paths %s" % out["p2p"])
    # a profiled shape: the profile's points where the local batch is one,
    # linear between them (demo's match/img: batch 32 on 4 devices, local
    # batches 32, 16, 11, 8); at n > 1 the table may take a tensor-parallel
    # (d, t) instead when the model prices it faster, never a slower one
    img = next(m for m in demo["metaops"] if m["name"] == "match/img")
    cl = json.load(open(workload("demo")[1]))
    cl["profile"] = [{"op": img["shape"], "points": [
        {"batch": 8, "fwd_ms": 1.0, "bwd_ms": 2.0}, {"batch": 32, "fwd_ms": 3.0, "bwd_ms": 6.0}]}]
    with tempfile.TemporaryDirectory() as tmp:
        cp = os.path.join(tmp, "cluster.json")
        json.dump(cl, open(cp, "w"))
        prof = json.loads(plan(workload("demo", cp) + ["--costs"]))
    m = next(m for m in prof["metaops"] if m["name"] == "match/img")
    check(m["profiled"], "match/img not profiled with a profile entry of its shape")
    for n, b in ((1, 32), (2, 16), (3, 11), (4, 8)):
        want_f = 1.0 + 2.0 * (b - 8) / 24
        got = m["fwd_ms"][n - 1] + m["bwd_ms"][n - 1]
        dp = close(m["fwd_ms"][n - 1], want_f) and close(m["bwd_ms"][n - 1], 2 * want_f)
        check(dp or (n > 1 and got < 3 * want_f),
              "profiled match/img at n=%d (local batch %d): %.9f/%.9f ms, by hand %.9f/%.9f" %
              (n, b, m["fwd_ms"][n - 1], m["bwd_ms"][n - 1], want_f, 2 * want_f))
    others = [x for x in prof["metaops"] if x["name"] != "match/img" and x["shape"] != img["shape"]]
    check(not any(x["profiled"] for x in others), "MetaOps of other shapes marked profiled")


CASES = {"report-fields": case_report_fields, "costs-schema": case_costs_schema,
         "costs-values": case_costs_values}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        sys.exit("usage: report_costs.py %s" % "|".join(CASES))
    try:
        CASES[sys.argv[1]]()
    except Fail as e:
        print("FAIL %s: %s" % (sys.argv[1], e))
        sys.exit(1)
    print("ok %s" % sys.argv[1])
