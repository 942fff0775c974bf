"""Plans that mix bucket layouts (issue #17): a workload with one large
component and the device memory at which spindle-plan's --zero auto
lowers that component's buckets in zero-3 and leaves the others zero-0, 1
or 2, through the planner's own path (planner/layout.c layout_zero3), not
a forcing option.

layout_zero3 runs only for a model with a large component (its replicated
parameter state above a quarter of a device) and only when the chosen plan
does not fit with zero-1/2 and recomputation; it then lowers the large
components' buckets of 2+ devices in zero-3 and keeps that plan when it
fits. So the memory that gives a mixed plan is the smallest at which the
planner plans at all (with one micro-batch: under --microbatches auto more
micro-batches would be tried after zero-3 and could fit lower), found by
bisection; the callers check that the plan there does mix layouts on some
device, else their check would be void.

The model: 'enc', 16 transformer layers of hidden 128 (198k parameters
each: 50 MiB of AdamW state, 25 MiB with SGD, against caps of 80-110 MiB,
64 of them the plan's fixed library workspace), used by the classify task
alone (its full gradients are then live one bucket at a time, so zero-3's
sharded weights are a saving even on 2 devices); a one-layer 'txt'
encoder shared by both tasks; a patch, an embedding, a contrastive loss
and a classifier."""
import json
import os
import subprocess

import workloads as W


def model(optimizer, layers=16, hidden=128, batch=8):
    """The mixed-layout workload (pure function of its arguments)."""
    H = hidden
    return {"format": "spindle.model/1", "name": "mixed-layouts", "dtype": "fp32",
            "optimizer": optimizer, "seed": 1,
            "components": {
                "img": {"type": "patch", "in": 16, "hidden": H, "max_seq": 8},
                "enc": {"type": "transformer", "layers": layers, "hidden": H, "heads": 4,
                        "ffn": 4 * H},
                "tok": {"type": "embedding", "vocab": 32, "hidden": H, "max_seq": 8},
                "txt": {"type": "transformer", "layers": 1, "hidden": H, "heads": 4,
                        "ffn": 4 * H, "causal": True},
                "align": {"type": "contrastive", "temperature": 0.1},
                "cls": {"type": "classifier", "hidden": H, "classes": 4}},
            "tasks": [
                {"name": "match", "batch": batch, "graph": [
                    {"id": "i_in", "component": "img", "seq": 4},
                    {"id": "i", "component": "txt", "seq": 4, "inputs": ["i_in"]},
                    {"id": "t_in", "component": "tok", "seq": 4},
                    {"id": "t", "component": "txt", "seq": 4, "inputs": ["t_in"]},
                    {"id": "loss", "component": "align", "inputs": ["i", "t"]}]},
                {"name": "classify", "batch": batch, "graph": [
                    {"id": "i_in", "component": "img", "seq": 4},
                    {"id": "i", "component": "enc", "seq": 4, "inputs": ["i_in"]},
                    {"id": "loss", "component": "cls", "inputs": ["i"]}]}]}


def _plan(model_path, cluster_path, out, algo, opts):
    cmd = [os.environ["SPINDLE_PLAN"], model_path, cluster_path, "--algo", algo, "-o", out,
           *opts]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    # no fit: exit 1, or 2 where the advice needs an option forced here
    if p.returncode != 0 and "no plan fits" not in p.stderr:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stderr}")
    return p.returncode == 0


def smallest_fit(model_path, tmp, tag, ranks, algo="spindle", opts=(), lo=64.0, hi=512.0,
                 nodes=1):
    """The smallest device memory (MiB, to 1/4 MiB, bisected between lo,
    which must not fit, and hi) at which spindle-plan plans model_path on
    `ranks` devices of `nodes` nodes with one micro-batch and opts (--zero
    auto unless opts say otherwise): (MiB, cluster path, plan path)."""
    opts = ("--microbatches", "1") + tuple(opts)
    out = os.path.join(tmp, f"{tag}.bin")
    cpath = os.path.join(tmp, f"{tag}.cluster.json")

    def fits(mib):
        W.write_json(tmp, os.path.basename(cpath),
                     W.cluster(ranks, nodes, name=f"cpu-{nodes}x{ranks // nodes}-{mib}MiB",
                               memory_gib=mib / 1024))
        return _plan(model_path, cpath, out, algo, opts)

    if not fits(hi):
        raise RuntimeError(f"{tag}: no plan fits {ranks} devices of {hi} MiB")
    if fits(lo):
        raise RuntimeError(f"{tag}: a plan fits {ranks} devices of {lo} MiB already: "
                           "the bisection needs a lower end that does not fit")
    while hi - lo > 0.25:
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    if not fits(hi):  # re-plan at hi: the last try may have been a lower mid
        raise RuntimeError(f"{tag}: the plan at {hi} MiB no longer fits")
    return hi, cpath, out


def buckets(plan_path):
    """The plan's buckets as spindle-show --json lists them (layout,
    devices, params)."""
    v = subprocess.run([os.environ["SPINDLE_SHOW"], plan_path, "--json"], capture_output=True,
                       text=True, timeout=60, check=True)
    return json.loads(v.stdout)["buckets"]


def mixing_devices(plan_path):
    """{device: sorted layouts} for the devices that hold a zero-3 bucket
    and a bucket of another layout."""
    per = {}
    for b in buckets(plan_path):
        for d in b["devices"]:
            per.setdefault(d, set()).add(b["layout"])
    return {d: sorted(s) for d, s in sorted(per.items()) if "zero-3" in s and len(s) > 1}


def main(argv):
    """mixed.py PLANNER SHOW OUT_DIR sgd|adamw N...: writes OUT_DIR/mixed-OPT.json
    (the model), mixed-OPT-1.bin (one device) and mixed-OPT-N.bin for each
    N (the smallest memory that fits N devices, --zero auto); exit 1 when
    one of them mixes no zero-3 bucket with another layout (tools/gpu-check
    --pack makes its mixed-layout plans so)."""
    import sys
    if len(argv) < 6 or argv[4] not in ("sgd", "adamw"):
        print("usage: mixed.py PLANNER SHOW OUT_DIR sgd|adamw N...", file=sys.stderr)
        return 2
    os.environ["SPINDLE_PLAN"], os.environ["SPINDLE_SHOW"] = argv[1], argv[2]
    out, kind = argv[3], argv[4]
    opt = {"type": "sgd", "lr": 0.05} if kind == "sgd" else \
        dict(W.ADAMW)
    mpath = W.write_json(out, f"mixed-{kind}.json", model(opt))
    one = os.path.join(out, f"mixed-{kind}-1.bin")
    if not _plan(mpath, W.write_json(out, "mixed-cluster-1.json", W.cluster(1)), one,
                 "spindle", ()):
        print(f"mixed.py: no one-device plan of {mpath}", file=sys.stderr)
        return 1
    for n in map(int, argv[5:]):
        mib, _, pp = smallest_fit(mpath, out, f"mixed-{kind}-{n}", n)
        mix = mixing_devices(pp)
        print(f"mixed.py: {pp}: {n} devices of {mib} MiB, mixing layouts {mix}")
        if not mix:
            print(f"mixed.py: {pp} mixes no zero-3 bucket with another layout", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv))
