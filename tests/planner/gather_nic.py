#!/usr/bin/env python3
"""Zero-1 all-gathers share the NICs (sim.c finish_steps_net): with one
NIC per node, every collective of a bucket whose devices lie on m >= 2
nodes moves at least (m - 1) / m of its S bytes through each of those
nodes' NICs each way, whatever NCCL's algorithm (net.c: hierarchical
2 (m-1)/m S per all-reduce, the flat ring 2 (n-1)/n S with n >= m, the
tree 2 S / 0.9; a zero-1 reduce-scatter and all-gather are each half an
all-reduce). A zero-1 bucket's reduce-scatter and all-gather both run in
the iteration, so the iteration is at least, on every node v, the sum over
v's cross-node buckets of 2 (m - 1) / m S / B_x. The sequential plan of
qwen-val on 64 A800 with one 50 GB/s NIC per node, all zero-1 (--zero 1:
every slice on every device, tensor-parallel pairs, each layer's two
shards in buckets of their own), must predict no less. Before the
all-gathers went through the network (each priced alone, beside the
reduce-scatters and the other shard's all-gathers on the same NIC) it
predicted 516 ms against this bound of 614.
Needs SPINDLE_PLAN, SPINDLE_SHOW and SPINDLE_ROOT (test_env); exits 0 on
pass, 1 on failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

PLAN, SHOW, ROOT = (os.environ[k] for k in ("SPINDLE_PLAN", "SPINDLE_SHOW", "SPINDLE_ROOT"))
# the layout, then its flags (" overlapped", " deferred": deferred all-gathers
# run in the iteration too, from its start: sim.c)
BUCKET = re.compile(r"^bucket \d+\s+devices (\S+)\s.*?; (\d+) elements, (\S+)[^,]*,")


def devices(spec):
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def main():
    model = os.path.join(ROOT, "plans", "qwen-val", "model.json")
    cpath = os.path.join(ROOT, "plans", "clusters", "a800-8x8.json")
    cl = json.load(open(cpath))
    G, bx = cl["gpus_per_node"], cl["links"]["inter_node_gbs"] * 1e6  # bytes per ms
    db = 2  # bf16 (the model's dtype)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "seq.bin")
        rep = subprocess.run([PLAN, model, cpath, "--algo", "sequential", "--zero", "1", "-o", out,
                              "--json"], capture_output=True, text=True, check=True).stdout
        it = json.loads(rep)["algorithms"]["sequential"]["iteration_ms"]
        view = subprocess.run([SHOW, out], capture_output=True, text=True, check=True).stdout
    nic = {}
    n_cross = 0
    for line in view.splitlines():
        m = BUCKET.match(line)
        if not m:
            continue
        nodes = {d // G for d in devices(m.group(1))}
        if len(nodes) < 2:
            continue
        n_cross += 1
        k = len(nodes)
        for v in nodes:
            nic[v] = nic.get(v, 0.0) + 2 * (k - 1) / k * int(m.group(2)) * db / bx
    bound = max(nic.values()) if nic else 0.0
    ok = n_cross > 0 and it >= bound * (1 - 1e-6)
    print(f"{'ok  ' if ok else 'FAIL'} sequential --zero 1 on a800-8x8: {it:.2f} ms predicted, "
          f"NIC work of the busiest node {bound:.2f} ms ({n_cross} cross-node buckets)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
