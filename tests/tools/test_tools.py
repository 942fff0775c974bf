#!/usr/bin/env python3
"""tests/tools: properties of spindle-show and spindle-diff on fresh plans.

usage: test_tools.py CASE SPINDLE_SHOW SPINDLE_DIFF [XATTN_WRITER]
Plans are made with $SPINDLE_PLAN from the bundled workloads under
$SPINDLE_ROOT/plans; the show-memory case's encoder-decoder plan by
XATTN_WRITER --write-xattn PATH (test_plan_io's hand-built plan). Exit 0
pass, 1 fail, 77 skip (meson's convention).
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

ROOT = os.environ.get("SPINDLE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
PLAN = os.environ.get("SPINDLE_PLAN", "spindle-plan")
SHOW = DIFF = XATTN = None
TMP = None


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def run(argv, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(argv, capture_output=True, env=e, timeout=300)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def make_plan(workload, algo="spindle", name=None):
    out = os.path.join(TMP, name or "%s-%s.plan.bin" % (workload, algo))
    d = os.path.join(ROOT, "plans", workload)
    rc, _, err = run([PLAN, os.path.join(d, "model.json"), os.path.join(d, "cluster.json"),
                      "--algo", algo, "-o", out])
    check(rc == 0, "spindle-plan %s --algo %s failed (%d): %s" % (workload, algo, rc, err))
    return out


def show(*args, env=None, expect=0):
    rc, out, err = run([SHOW] + list(args), env=env)
    check(rc == expect, "spindle-show %s: exit %d, expected %d: %s" % (" ".join(args), rc, expect, err))
    return out, err


def view_json(plan):
    out, _ = show(plan, "--json")
    return json.loads(out)


# ---- cases -------------------------------------------------------------------

def case_show_deterministic():
    a = make_plan("clip-4")
    b = make_plan("clip-4", name="again.plan.bin")
    t1, _ = show(a)
    t2, _ = show(a)
    check(t1 == t2, "two runs of spindle-show on one plan differ")
    # another process, another locale, another file of the same plan: same bytes
    t3, _ = show(b, env={"LC_ALL": "de_DE.UTF-8", "LC_NUMERIC": "de_DE.UTF-8"})
    check(t1 == t3, "spindle-show of a re-planned identical plan (other locale) differs")
    text = t1.decode()
    check("\t" not in text and "-0.00" not in text, "tabs or negative zeros in the view")
    j = view_json(a)
    n_slices = j["size"]["slices"]
    slice_lines = [l for l in text.splitlines() if re.match(r"^  w\d+ +\S+/\S+ +layers \d+-\d+ ", l)]
    check(len(slice_lines) == n_slices,
          "%d slice lines for %d slices" % (len(slice_lines), n_slices))
    wave_lines = [l for l in text.splitlines() if re.match(r"^wave \d+ ", l)]
    check(len(wave_lines) == j["size"]["waves"], "not one line per wave")
    # waves in order, slices sorted by MetaOp name within each
    waves = [int(re.match(r"^  w(\d+)", l).group(1)) for l in slice_lines]
    check(waves == sorted(waves), "slice lines are not in wave order")
    for w in set(waves):
        names = [l.split()[1] for l in slice_lines if l.startswith("  w%d " % w)]
        check(names == sorted(names), "wave %d: slices not sorted by MetaOp: %s" % (w, names))
    for key in ("model ", "cluster ", "algorithm ", "planner ", "options ", "inputs ",
                "iteration ", "compute ", "lower bound ", "gap ", "transfers ", "sync ",
                "memory ", "baselines "):
        check(re.search("^" + key, text, re.M), "header has no '%s' line" % key.strip())
    check(re.search(r"^iteration +%.2f ms" % j["predicted"]["iteration_ms"], text, re.M),
          "text and JSON disagree on the iteration time")
    # --programs: one line per instruction
    p, _ = show(a, "--programs")
    ins = [l for l in p.decode().splitlines() if re.match(r"^ +\d+ (fwd|bwd|send|recv|copy|loss|sync|step|gather|pgather|pfree)\b", l)]
    check(len(ins) == j["size"]["instructions"],
          "%d instruction lines for %d instructions" % (len(ins), j["size"]["instructions"]))
    check(p.decode().startswith(text), "--programs does not extend the plain view")


def case_show_json():
    a = make_plan("clip-4")
    for extra in ([], ["--programs"]):
        out, _ = show(a, "--json", *extra)
        j = json.loads(out)
        out2, _ = show(a, "--json", *extra)
        check(out == out2, "--json is not deterministic")
        check(j["format"] == "spindle.plan-view/1", "wrong format tag")
        check(len(j["waves"]) == j["size"]["waves"], "waves array length")
        check(sum(len(w["slices"]) for w in j["waves"]) == j["size"]["slices"], "slice count")
        check(len(j["devices"]) == j["size"]["devices"], "device count")
        for w in j["waves"]:
            names = [(s["metaop"], s["layers"]) for s in w["slices"]]
            check(names == sorted(names), "JSON slices not sorted by MetaOp")
            for s in w["slices"]:
                check(len(s["devices"]) == s["n_dev"], "n_dev and devices disagree")
        if extra:
            n = sum(len(d["program"]) for d in j["devices"])
            check(n == j["size"]["instructions"], "programs hold %d instructions" % n)
        else:
            check(all("program" not in d for d in j["devices"]), "program without --programs")
        try:
            import jsonschema
        except ImportError:
            print("python3-jsonschema is not installed: schema validation skipped")
            continue
        schema = json.load(open(os.path.join(ROOT, "schemas", "plan-view.schema.json")))
        jsonschema.Draft202012Validator.check_schema(schema)
        v = jsonschema.Draft202012Validator(schema)
        errors = sorted(v.iter_errors(j), key=str)
        check(not errors, "view does not validate: %s" % (errors[:1],))
        # the schema is not vacuous
        bad = dict(j)
        del bad["waves"]
        check(list(v.iter_errors(bad)), "schema accepts a view without waves")
        bad = json.loads(out)
        bad["waves"][0]["slices"][0]["layers"] = [0]
        check(list(v.iter_errors(bad)), "schema accepts a one-number layer range")
    # zero-1 programs (gather instructions) validate too
    z = os.path.join(TMP, "clip-4-zero1.plan.bin")
    d = os.path.join(ROOT, "plans", "clip-4")
    rc, _, err = run([PLAN, os.path.join(d, "model.json"), os.path.join(d, "cluster.json"),
                      "--zero", "1", "-o", z])
    check(rc == 0, "spindle-plan --zero 1 failed (%d): %s" % (rc, err))
    j = json.loads(show(z, "--json", "--programs")[0])
    ops = {i["op"] for dv in j["devices"] for i in dv["program"]}
    check("gather" in ops, "a zero-1 plan without gather instructions: %s" % sorted(ops))
    try:
        import jsonschema
    except ImportError:
        return
    errors = sorted(v.iter_errors(j), key=str)
    check(not errors, "zero-1 view does not validate: %s" % (errors[:1],))


def case_diff_self():
    a = make_plan("clip-4")
    b = make_plan("clip-4", name="again.plan.bin")
    for x, y in ((a, a), (a, b)):
        rc, out, err = run([DIFF, x, y])
        check(rc == 0, "diff of equal plans: exit %d: %s%s" % (rc, out.decode(), err))
        check("plans are equal" in out.decode(), "diff of equal plans does not say so")
        rc2, out2, _ = run([DIFF, x, y])
        check(out == out2, "spindle-diff is not deterministic")


def case_defer():
    """The deferred all-gather flag (plan format 8) in every view: the demo
    on its cluster with --zero 1, --defer-gather off and on: the text view
    marks each zero-1 bucket "deferred" only when on, the JSON view's
    defer is true on exactly the zero-1/2 buckets, the report's layout
    table says it, and spindle-diff names the change."""
    d = os.path.join(ROOT, "plans", "demo")
    plans, reports = {}, {}
    for v in ("off", "on"):
        plans[v] = os.path.join(TMP, "demo-defer-%s.plan.bin" % v)
        rc, out, err = run([PLAN, os.path.join(d, "model.json"), os.path.join(d, "cluster.json"),
                            "--zero", "1", "--defer-gather", v, "--report", "-o", plans[v]])
        check(rc == 0, "spindle-plan --defer-gather %s failed (%d): %s" % (v, rc, err))
        reports[v] = out.decode()
    views = {v: view_json(p) for v, p in plans.items()}
    z = [b["layout"] in ("zero-1", "zero-2") for b in views["on"]["buckets"]]
    check(any(z), "the demo plan with --zero 1 has no zero-1 bucket")
    check([b["defer"] for b in views["on"]["buckets"]] == z,
          "--defer-gather on: defer is not set on exactly the zero-1/2 buckets")
    check(not any(b["defer"] for b in views["off"]["buckets"]), "--defer-gather off defers")
    text = {v: show(p)[0].decode() for v, p in plans.items()}
    n = sum(1 for x in text["on"].splitlines() if x.startswith("bucket") and "deferred" in x)
    check(n == sum(z), "text view: %d buckets marked deferred, %d expected" % (n, sum(z)))
    check("deferred" not in text["off"], "text view of the plan without deferral says deferred")
    check("deferred" in reports["on"] and "deferred" not in reports["off"],
          "the report's layout table does not show the deferred all-gathers")
    rc, out, err = run([DIFF, plans["off"], plans["on"]])
    check("deferred all-gathers: 0 -> %d buckets" % sum(z) in out.decode(),
          "spindle-diff does not name the deferred all-gathers: %s" % out.decode())


def case_diff_algos():
    a = make_plan("clip-4", "spindle")
    b = make_plan("clip-4", "sequential")
    rc, out, err = run([DIFF, a, b])
    text = out.decode()
    check(rc == 1, "diff of spindle and sequential plans: exit %d (want 1): %s" % (rc, err))
    check(re.search(r"^  algorithm +spindle -> sequential$", text, re.M), "algorithm change not reported")
    check(re.search(r"^waves: \d+ -> \d+; [1-9]\d* changed", text, re.M), "changed waves not reported")
    check(re.search(r"^  [~+-] wave \d+", text, re.M), "no wave listed as changed")
    check(re.search(r"^slices: ", text, re.M), "slices not reported")
    check(re.search(r"^  iteration ms +[\d.]+ -> [\d.]+ +[+-][\d.]+ \([+-][\d.]+%\)$", text, re.M),
          "iteration time delta not reported")
    check(re.search(r"^device time per MetaOp", text, re.M), "device time per MetaOp not reported")
    check(re.search(r"^plans differ: \d+ difference", text, re.M), "no summary line")
    rc2, out2, _ = run([DIFF, a, b])
    check(out == out2, "spindle-diff is not deterministic")
    # the other way round mirrors the change
    rc, out, _ = run([DIFF, b, a])
    check(rc == 1 and "sequential -> spindle" in out.decode(), "reverse diff")
    # trouble is 2, like diff(1)
    bad = os.path.join(TMP, "bad.plan.bin")
    with open(bad, "wb") as f:
        f.write(b"not a plan")
    rc, out, err = run([DIFF, a, bad])
    check(rc == 2 and err.strip(), "diff with a corrupt plan: exit %d (want 2), stderr %r" % (rc, err))
    rc, _, _ = run([DIFF, a])
    check(rc == 2, "diff with one argument: exit %d (want 2)" % rc)


def case_trace():
    a = make_plan("clip-4")
    j = view_json(a)
    path = os.path.join(TMP, "trace.json")
    show(a, "--trace", path)
    with open(path) as f:
        tr = json.load(f)
    ev = tr["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    check(x, "no complete events")
    n = j["size"]["devices"]
    check({e["pid"] for e in x} <= set(range(n)), "pids outside the devices")
    check({e["tid"] for e in x} <= {0, 1}, "tids other than 0 (compute) and 1 (communication)")
    busy = {s_dev for w in j["waves"] for s in w["slices"] for s_dev in s["devices"]}
    check({e["pid"] for e in x if e["tid"] == 0} == busy, "a device with slices has no compute events")
    check(any(e["tid"] == 1 for e in x) == bool(j["buckets"]), "sync events missing")
    names = {m["args"]["name"] for m in ev if m.get("ph") == "M" and m.get("name") == "thread_name"}
    check(names == {"compute", "communication"}, "thread names %s" % names)
    env = {}
    for w in j["waves"]:
        for s in w["slices"]:
            key = "%s layers %d-%d" % (s["metaop"], s["layers"][0], s["layers"][1])
            env[(key, "fwd")] = env[(key, "loss")] = (s["start_ms"], s["start_ms"] + s["fwd_ms"])
            env[(key, "bwd")] = (s["bwd_start_ms"], s["bwd_start_ms"] + s["bwd_ms"])
    lanes = {}
    for e in x:
        check(isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)), "ts/dur not numbers")
        check(e["ts"] >= 0 and e["dur"] >= 0, "negative ts or dur")
        lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        if e["tid"] == 0:
            m = re.match(r"^(.+/.+ layers \d+-\d+) (fwd|bwd|loss)$", e["name"])
            check(m, "compute event name %r" % e["name"])
            lo, hi = env[(m.group(1), m.group(2))]
            # inside the slice's predicted envelope (ms, rounded to 0.01 in the view)
            check(e["ts"] / 1e3 >= lo - 0.011 and (e["ts"] + e["dur"]) / 1e3 <= hi + 0.011,
                  "%s at %.3f+%.3f ms outside its slice [%.2f, %.2f]" %
                  (e["name"], e["ts"] / 1e3, e["dur"] / 1e3, lo, hi))
        else:
            check(re.match(r"^sync bucket \d+$", e["name"]), "comm event name %r" % e["name"])
    for k, v in lanes.items():
        v.sort()
        for p, q in zip(v, v[1:]):
            check(p[1] <= q[0] + 1e-6, "overlapping events on device %d thread %d: %s, %s" % (k[0], k[1], p, q))
    end = max(e["ts"] + e["dur"] for e in x) / 1e3
    check(end <= j["predicted"]["iteration_ms"] * 1.5 + 1, "events end at %.2f ms, long after the iteration" % end)


def case_gantt():
    for wl in ("clip-4", "demo"):
        a = make_plan(wl)
        j = view_json(a)
        path = os.path.join(TMP, wl + ".svg")
        show(a, "--gantt", path)
        data = open(path, "rb").read()
        show(a, "--gantt", path + ".2")
        check(data == open(path + ".2", "rb").read(), "Gantt SVG is not deterministic")
        root = ET.fromstring(data)
        ns = "{http://www.w3.org/2000/svg}"
        check(root.tag == ns + "svg", "root element is %s" % root.tag)
        texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
        alltext = "\n".join(texts)
        check(j["model"] in alltext and j["cluster"]["name"] in alltext and j["algorithm"] in alltext,
              "title lacks model, cluster or algorithm")
        check("%.2f ms" % j["predicted"]["iteration_ms"] in alltext, "title lacks the predicted time")
        for t in j["tasks"]:
            check(t in texts, "legend lacks task %s" % t)
        for d in range(j["size"]["devices"]):
            check("gpu %d" % d in texts or j["size"]["devices"] > 40, "no row label for device %d" % d)
        check("time (ms)" in texts, "no time axis title")
        bars = [r for g in root.iter(ns + "g") if g.get("id") in ("forward", "backward")
                for r in g.iter(ns + "rect") if r.find(ns + "title") is not None]
        check(len(bars) >= j["size"]["slices"] // 2, "only %d bars" % len(bars))
        check(not [f for f in os.listdir(TMP) if ".tmp." in f], "temporary files left behind")


def case_corrupt():
    a = make_plan("demo")
    data = open(a, "rb").read()
    cases = {
        "truncated": (data[: len(data) // 2], "truncated"),
        "empty": (b"", ""),
        "flipped": (data[:-16] + bytes([data[-16] ^ 0x5A]) + data[-15:], ""),
        "magic": (b"XXXXXXX" + data[7:], ""),
    }
    for name, (blob, word) in cases.items():
        bad = os.path.join(TMP, name + ".plan.bin")
        with open(bad, "wb") as f:
            f.write(blob)
        for extra in ([], ["--json"], ["--gantt", bad + ".svg", "--trace", bad + ".json"]):
            rc, out, err = run([SHOW, bad] + extra)
            check(rc == 2, "%s plan %s: exit %d (want 2)" % (name, extra, rc))
            check(not out, "%s plan: output on stdout" % name)
            check(err.startswith("spindle-show: ") and bad in err, "%s: message %r lacks the file" % (name, err))
            check(word in err, "%s: message %r does not say %r" % (name, word, word))
            check(not os.path.exists(bad + ".svg") and not os.path.exists(bad + ".json"),
                  "%s plan: output file written" % name)
    rc, _, err = run([SHOW, os.path.join(TMP, "missing.plan.bin")])
    check(rc == 2 and "missing.plan.bin" in err, "missing plan: exit %d, %r" % (rc, err))
    rc, _, _ = run([SHOW, a, "--frobnicate"])
    check(rc == 2, "unknown option: exit %d (want 2)" % rc)
    rc, _, _ = run([SHOW])
    check(rc == 2, "no argument: exit %d (want 2)" % rc)


def patch_u32(src, dst, section, rec_size, rec, at, value):
    """A copy of plan src with one u32 field of one record set, the CRC
    redone (PLAN-FORMAT.md: header 40 bytes, 40-byte table entries)."""
    b = bytearray(open(src, "rb").read())
    nsec = struct.unpack_from("<I", b, 28)[0]
    for e in range(nsec):
        sid, _, off, size, count = struct.unpack_from("<IIQQQ", b, 40 + 40 * e)
        if sid == section:
            check(size == rec_size * count, "section %d: not %d-byte records" % (sid, rec_size))
            struct.pack_into("<I", b, off + rec_size * rec + at, value)
    struct.pack_into("<I", b, 32, zlib.crc32(bytes(b[40:])) & 0xFFFFFFFF)
    open(dst, "wb").write(b)


def case_show_memory():
    """A decoder's memory in every view: the slice line ("mem S x W from P"),
    the JSON slice's "memory" and a value layer -1, the programs' "mem"
    values, the Gantt's bar titles, spindle-diff's instruction keys."""
    if not XATTN:
        print("no plan writer (cmocka missing): skipped")
        sys.exit(77)
    a = os.path.join(TMP, "xattn.plan.bin")
    rc, _, err = run([XATTN, "--write-xattn", a])
    check(rc == 0, "writing the encoder-decoder plan failed (%d): %s" % (rc, err))
    text = show(a)[0].decode()
    mem = [l for l in text.splitlines() if re.search(r"  mem \d+ x \d+ from ", l)]
    check(len(mem) == 1, "%d slice lines with a memory, expected 1 (cap/dec):\n%s" % (len(mem), text))
    check(re.match(r"^  w3 +cap/dec +layers 0-2 .*  mem 6 x 12 from cap/mem$", mem[0]),
          "decoder slice line %r" % mem[0])
    prog = show(a, "--programs")[0].decode()
    for want in ("recv act(cap/dec, mem) tokens 0+6 samples 0-4 from 0 tag 1",
                 "send grad(cap/dec, mem) tokens 0+6 samples 0-4 to 0 tag 2",
                 "send act(cap/mem, 1) tokens 0+6 samples 0-4 to 1 tag 1"):
        check(want in prog, "--programs lacks %r" % want)
    out = show(a, "--json", "--programs")[0]
    j = json.loads(out)
    slices = [s for w in j["waves"] for s in w["slices"]]
    withmem = [s for s in slices if "memory" in s]
    check([s["metaop"] for s in withmem] == ["cap/dec"], "JSON slices with a memory: %s" % withmem)
    check(withmem[0]["memory"] == {"seq": 6, "width": 12, "from": "cap/mem"},
          "JSON memory %s" % withmem[0]["memory"])
    vrefs = [i.get("dst", i.get("src")) for d in j["devices"] for i in d["program"]
             if i["op"] in ("send", "recv")]
    check(sum(v["layer"] == -1 for v in vrefs) == 2, "JSON values of layer -1: %s" % vrefs)
    try:
        import jsonschema
        schema = json.load(open(os.path.join(ROOT, "schemas", "plan-view.schema.json")))
        v = jsonschema.Draft202012Validator(schema)
        errors = sorted(v.iter_errors(j), key=str)
        check(not errors, "view does not validate: %s" % (errors[:1],))
        bad = json.loads(out)
        next(s for w in bad["waves"] for s in w["slices"] if "memory" in s)["memory"]["seq"] = 0
        check(list(v.iter_errors(bad)), "schema accepts a memory of 0 tokens")
    except ImportError:
        print("python3-jsonschema is not installed: schema validation skipped")
    svg = os.path.join(TMP, "xattn.svg")
    show(a, "--gantt", svg)
    titles = ["".join(t.itertext()) for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}title")]
    check(sum("mem 6 x 12 from cap/mem" in t for t in titles) == 2,
          "Gantt bar titles with the memory: %s" % [t for t in titles if "cap/dec" in t])
    # spindle-diff names the memory values: device 1's RECV of act(dec, -1)
    # (instruction 10; s1 at 12 of a 60-byte record) over fewer samples
    b = os.path.join(TMP, "xattn-b.plan.bin")
    patch_u32(a, b, 18, 60, 10, 12, 2)
    rc, out, err = run([DIFF, a, a])
    check(rc == 0, "diff of a plan with itself: exit %d: %s" % (rc, err))
    rc, out, err = run([DIFF, a, b])
    check(rc == 1, "diff of plans that differ: exit %d: %s" % (rc, err))
    check("recv act(cap/dec, mem) tokens 0+6 samples 0-4 from 0 tag 1 -> "
          "recv act(cap/dec, mem) tokens 0+6 samples 0-2 from 0 tag 1" in out.decode(),
          "diff does not name the memory values:\n%s" % out.decode())
    # a planned encoder-decoder (tests/planner/encdec): every decoder slice
    # line carries its memory, the programs move it as layer "mem"
    d = os.path.join(ROOT, "tests", "planner", "encdec")
    e = os.path.join(TMP, "encdec.plan.bin")
    rc, _, err = run([PLAN, os.path.join(d, "model.json"), os.path.join(d, "cluster-2x4.json"),
                      "-o", e])
    check(rc == 0, "spindle-plan encdec failed (%d): %s" % (rc, err))
    text = show(e)[0].decode()
    j = view_json(e)
    dec = [s for w in j["waves"] for s in w["slices"] if "memory" in s]
    lines = [l for l in text.splitlines() if re.search(r"  mem \d+ x \d+ from \S+$", l)]
    check(dec and len(lines) == len(dec),
          "%d slice lines with a memory, %d decoder slices in the JSON" % (len(lines), len(dec)))
    for s in dec:
        m = s["memory"]
        check(any(l.split()[1] == s["metaop"] and
                  l.endswith("mem %d x %d from %s" % (m["seq"], m["width"], m["from"]))
                  for l in lines), "no text line for decoder slice %s" % s["metaop"])
    prog = show(e, "--programs")[0].decode()
    moves = re.findall(r"^ +\d+ (recv|copy|send) (act|grad)\(\S+, mem\)", prog, re.M)
    check(("recv", "act") in moves or ("copy", "act") in moves, "no memory received or copied")
    check(("send", "grad") in moves or ("copy", "grad") in moves, "no memory gradient sent back")


CASES = {
    "show-deterministic": case_show_deterministic,
    "show-json": case_show_json,
    "diff-self": case_diff_self,
    "diff-algos": case_diff_algos,
    "defer": case_defer,
    "trace": case_trace,
    "gantt": case_gantt,
    "corrupt": case_corrupt,
    "show-memory": case_show_memory,
}


def main():
    global SHOW, DIFF, XATTN, TMP
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in CASES:
        print(__doc__, file=sys.stderr)
        print("cases: " + ", ".join(CASES), file=sys.stderr)
        return 2
    SHOW, DIFF = sys.argv[2], sys.argv[3]
    XATTN = sys.argv[4] if len(sys.argv) == 5 else None
    with tempfile.TemporaryDirectory(prefix="spindle-tools-") as TMP:
        try:
            CASES[sys.argv[1]]()
        except Fail as e:
            print("FAIL: %s: %s" % (sys.argv[1], e))
            return 1
    print("ok: %s" % sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
