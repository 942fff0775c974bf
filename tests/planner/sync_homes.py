#!/usr/bin/env python3
"""Sync homes (sched_list.c homes_sync, candidate list-homes): on the
bundled qwen-val over 4 A800 nodes with one NIC each, the candidate holds
the LLM on homes of half the nodes (two segments of 16 layers) instead of
syncing every layer across all four nodes. Checked against the same run
without the candidate (--exclude list-homes):
  * the chosen plan's 'llm' sync buckets each span at most 16 devices (a
    home of 2 nodes x 8 GPUs), where without the candidate some bucket of
    'llm' is wider;
  * the placement's communication bound (gradient bytes over the busiest
    node's NIC) is lower: the point of the trade;
  * the iteration is not slower (the walk keeps the fastest), and faster
    here (the simulator judges it so on this row);
  * on one node (a800-1x8) the candidate is not run: the plan is the same
    with and without it (min_nodes);
  * with 65 and 70 GiB of each A800 reserved, a sync segment of the LLM
    no longer holds its state and activations, and homes_fit would grow it
    to 3 and 4 segments of 16 devices on 32, two of them on the same
    devices: it gives the LLM back to its memory home instead, and the
    plan is made (homes_lay_out refuses overlapping sync homes of one
    component with an internal error, which fails the run).
Needs SPINDLE_PLAN and SPINDLE_ROOT (test_env); exits 0 on pass, 1 on
failure.
"""
import json
import os
import subprocess
import sys

PLAN = os.environ["SPINDLE_PLAN"]
ROOT = os.environ["SPINDLE_ROOT"]
MODEL = os.path.join(ROOT, "plans", "qwen-val", "model.json")


def plan(cluster, *extra):
    out = subprocess.run([PLAN, MODEL, os.path.join(ROOT, "plans", "clusters", cluster),
                          "--json", "--jobs", "1", *extra],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def ours(d):
    return d["algorithms"]["spindle"]


def llm_groups(d):
    return [b["devices"] for b in d["buckets"] if b["parameters"].startswith("llm ")]


def main():
    fails = []
    with_h = plan("a800-4x8.json")
    without = plan("a800-4x8.json", "--exclude", "list-homes")
    gw, go = llm_groups(with_h), llm_groups(without)
    if not gw or max(gw) > 16:
        fails.append(f"with list-homes the llm buckets span {gw} devices, want <= 16")
    if not go or max(go) <= 16:
        fails.append(f"without list-homes the llm buckets span {go}: the case tests nothing")
    cw, co = with_h["placement_comm_bound_ms"], without["placement_comm_bound_ms"]
    if not cw < co:
        fails.append(f"placement comm bound {cw} ms with list-homes, {co} without: not lower")
    iw, io = ours(with_h)["iteration_ms"], ours(without)["iteration_ms"]
    if not iw < io:
        fails.append(f"iteration {iw} ms with list-homes, {io} without: not faster")
    one = ours(plan("a800-1x8.json"))["iteration_ms"]
    one_x = ours(plan("a800-1x8.json", "--exclude", "list-homes"))["iteration_ms"]
    if one != one_x:
        fails.append(f"one node: {one} ms with list-homes, {one_x} without: it ran")
    for reserve in ("65", "70"):
        r = subprocess.run([PLAN, MODEL, os.path.join(ROOT, "plans", "clusters", "a800-4x8.json"),
                            "--jobs", "1", "--mem-reserve", reserve],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fails.append(f"--mem-reserve {reserve}: exit {r.returncode}, {r.stderr.strip()!r}")
    for f in fails:
        print("FAIL:", f)
    print(f"sync-homes: llm groups {sorted(set(gw))} vs {sorted(set(go))}, comm bound "
          f"{cw:.2f} vs {co:.2f} ms, iteration {iw:.2f} vs {io:.2f} ms")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
