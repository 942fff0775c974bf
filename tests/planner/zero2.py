#!/usr/bin/env python3
"""Zero-2 in the planner (issue 17): gradients sharded as the optimizer
state, a full gradient live from its first write until its reduce-scatter
completes (schemas/plan_mem.c's walk).

  * qwen-val-7b on its 8x8 H100 cluster: --zero 2 puts every bucket of two
    or more devices in zero-2 and lowers every device's peak; it moves the
    bytes of --zero 1 but predicts a longer iteration: the runtime
    completes each reduce-scatter before it places the next full gradient,
    so the backward waits for it (plan_z2_walk's done, sim.c); auto, which
    fits there without zero-2, keeps zero-1 and is no slower than either;
  * --rs-overlap on (each reduce-scatter completes one full-gradient
    placement later, beside the next bucket's backward) is faster than
    --rs-overlap off there, at a peak no lower, and every zero-2 bucket
    carries the flag; --zero 2 alone (overlap auto) takes it;
  * on 8x8 A800 (less memory) zero-1 needs more recomputation than
    zero-2: auto tries both ways to fit and is no slower than either
    forced layout;
  * on the same cluster with 42.5 GiB GPUs auto takes zero-2, no slower
    than --zero 1 there (whose schedule changes to fit; its report names each
    bucket's layout and the gradient bytes zero-2 saves beyond zero-1's,
    > 0), and its plan is byte-identical when planned twice;
  * with 2 micro-batches a full gradient stays live across the
    micro-steps, so zero-2 saves nothing: auto leaves every bucket zero-1;
  * --zero 2 where every sync group has one device exits 2 and writes no
    plan;
  * the layout trial is every algorithm's, not ours' alone: the bundled
    qwen-val on 8 A800 (one node) planned with --algo sequential shards
    every bucket of 2+ devices (kept there because not slower: the
    sharded step saves more than the all-gathers over NVLink cost), and
    predicts no more than with --zero 0. (On 64 A800 with one NIC per
    node the trial now keeps the buckets memory does not shard
    replicated: with the all-gathers sharing the NICs with the
    reduce-scatters, as the runtime runs them, all zero-1 is slower
    there, 832.13 against 808.58 ms.)
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
FAILS = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else f": {detail}"),
          flush=True)
    if not ok:
        FAILS.append(what)


def plan(tmp, tag, model, cluster, *opts):
    out = os.path.join(tmp, tag + ".bin")
    p = subprocess.run([PLAN, model, cluster, "-o", out, "--json", *opts],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{tag}: exit {p.returncode}: {p.stderr.strip()}")
    view = json.loads(subprocess.run([SHOW, out, "--json"], capture_output=True, text=True,
                                     timeout=60).stdout)
    return out, json.loads(p.stdout), view


def peaks(view):
    return [d["peak_gib"] for d in view["devices"]]


def one_device_refused(tmp, level):
    """--zero level on one device (no group to shard): exit 2 with the
    message, no plan written."""
    one = os.path.join(tmp, "one.json")
    c = json.load(open(os.path.join(ROOT, "plans/demo/cluster.json")))
    c["nodes"], c["gpus_per_node"] = 1, 1
    json.dump(c, open(one, "w"))
    out = os.path.join(tmp, "one.bin")
    p = subprocess.run([PLAN, os.path.join(ROOT, "plans/demo/model.json"), one, "-o", out,
                        "--zero", level], capture_output=True, text=True, timeout=120)
    check(p.returncode == 2 and f"--zero {level}: every sync group of the plan has a single "
          "device" in p.stderr and not os.path.exists(out),
          f"--zero {level} on one device: exit 2, no plan written",
          f"exit {p.returncode}: {p.stderr.strip()}")


def main():
    m7 = os.path.join(ROOT, "plans/qwen-val-7b/model.json")
    c7 = os.path.join(ROOT, "plans/qwen-val-7b/cluster.json")
    with tempfile.TemporaryDirectory() as tmp:
        _, r1, v1 = plan(tmp, "z1", m7, c7, "--zero", "1")
        b2, r2, v2 = plan(tmp, "z2", m7, c7, "--zero", "2", "--rs-overlap", "off")
        _, ro, vo = plan(tmp, "z2on", m7, c7, "--zero", "2", "--rs-overlap", "on")
        _, rz, vz = plan(tmp, "z2auto", m7, c7, "--zero", "2")
        _, rh, vh = plan(tmp, "autoh", m7, c7)
        multi = [b for b in r2["buckets"] if b["devices"] >= 2]
        check(multi and all(b["layout"] == "zero-2" for b in multi) and
              all(b["layout"] == "replicated" for b in r2["buckets"] if b["devices"] < 2),
              f"--zero 2: all {len(multi)} buckets of 2+ devices are zero-2")
        it1, it2 = v1["predicted"]["iteration_ms"], v2["predicted"]["iteration_ms"]
        check(it2 > it1, f"--zero 2 waits for its reduce-scatters: {it2:.2f} ms against "
              f"--zero 1's {it1:.2f}", f"{it2} against {it1}")
        ito, itz = vo["predicted"]["iteration_ms"], vz["predicted"]["iteration_ms"]
        flags = [b["overlap"] for b in ro["buckets"] if b["layout"] == "zero-2"]
        check(flags and all(flags) and ito < it2 and max(peaks(vo)) >= max(peaks(v2)),
              f"--rs-overlap on: {ito:.2f} ms against off's {it2:.2f}, peak "
              f"{max(peaks(vo)):.2f} against {max(peaks(v2)):.2f} GiB",
              f"flags {flags}, {ito} against {it2}")
        check(itz == ito and all(b["overlap"] for b in rz["buckets"] if b["layout"] == "zero-2"),
              f"--zero 2 with overlap auto takes it ({itz:.2f} ms)", f"{itz} against {ito}")
        p1, p2 = peaks(v1), peaks(v2)
        check(len(p1) == len(p2) and all(b < a for a, b in zip(p1, p2)),
              f"--zero 2 lowers every device's peak (max {max(p1):.2f} -> {max(p2):.2f} GiB)",
              f"{p1} -> {p2}")
        lh = [b["layout"] for b in rh["buckets"]]
        ith = vh["predicted"]["iteration_ms"]
        check("zero-2" not in lh and ith <= min(it1, it2),
              f"auto on H100 fits without zero-2 and keeps zero-1 ({ith:.2f} ms)",
              f"layouts {lh}, {ith} against {it1} / {it2}")
        # less memory: zero-2 needed
        ca = os.path.join(ROOT, "plans/clusters/a800-8x8.json")
        _, rb, vb = plan(tmp, "a800", m7, ca)
        _, ra1, va1 = plan(tmp, "a800z1", m7, ca, "--zero", "1")
        _, ra2, va2 = plan(tmp, "a800z2", m7, ca, "--zero", "2")
        itb = vb["predicted"]["iteration_ms"]
        itf = [v["predicted"]["iteration_ms"] for v in (va1, va2)]
        check(itb <= min(itf), f"auto on A800 ({itb:.2f} ms) is no slower than --zero 1 "
              f"({itf[0]:.2f}) and --zero 2 ({itf[1]:.2f})", f"{itb} against {itf}")
        small = json.load(open(ca))
        small["gpu"]["memory_gib"] = 42.5
        ca = os.path.join(tmp, "a800-42.json")
        with open(ca, "w") as f:
            json.dump(small, f)
        _, rr, vr = plan(tmp, "z1small", m7, ca, "--zero", "1", "--microbatches", "1")
        ba, ra, va = plan(tmp, "auto", m7, ca, "--microbatches", "1")
        its, ita = vr["predicted"]["iteration_ms"], va["predicted"]["iteration_ms"]
        check(ita <= its, f"42.5 GiB: auto ({ita:.2f} ms) is no slower than --zero 1 "
              f"({its:.2f} ms, a schedule that fits zero-1)", f"{ita} against {its}")
        za = [b["layout"] for b in ra["buckets"]]
        saved = ra.get("zero2_grad_saved_bytes", 0)
        check("zero-2" in za and saved > 0,
              f"auto on 42.5 GiB A800s takes zero-2 ({za.count('zero-2')} buckets) and reports "
              f"{saved / 2**30:.2f} GiB saved beyond zero-1 on device "
              f"{ra.get('zero2_grad_saved_device')}", f"layouts {za}, saved {saved}")
        again = os.path.join(tmp, "auto2.bin")
        subprocess.run([PLAN, m7, ca, "-o", again, "--microbatches", "1"], capture_output=True,
                       timeout=300)
        check(open(ba, "rb").read() == open(again, "rb").read(),
              "auto with zero-2: the same inputs give a byte-identical plan")
        # k = 2: full gradients live across micro-steps, zero-2 saves nothing
        _, rk, _ = plan(tmp, "k2", m7, c7, "--microbatches", "2")
        lk = [b["layout"] for b in rk["buckets"]]
        check("zero-2" not in lk and "zero-1" in lk,
              f"auto with 2 micro-batches keeps zero-1 ({lk.count('zero-1')} buckets), "
              "no zero-2", f"layouts {lk}")
        one_device_refused(tmp, "2")
        # the baselines get the same layout trial as ours
        mq = os.path.join(ROOT, "plans/qwen-val/model.json")
        cq = os.path.join(ROOT, "plans/clusters/a800-1x8.json")
        _, rs, vs = plan(tmp, "seq", mq, cq, "--algo", "sequential")
        _, r0, v0 = plan(tmp, "seq0", mq, cq, "--algo", "sequential", "--zero", "0")
        ls = [b["layout"] for b in rs["buckets"] if b["devices"] >= 2]
        its, it0 = vs["predicted"]["iteration_ms"], v0["predicted"]["iteration_ms"]
        check(ls and "replicated" not in ls and its <= it0,
              f"sequential gets the layout trial: {len(ls) - ls.count('replicated')} of "
              f"{len(ls)} buckets sharded, {its:.2f} ms against {it0:.2f} replicated",
              f"layouts {ls}, {its} against {it0}")
    print(f"{len(FAILS)} failure(s)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
