"""Random small workloads and clusters for property tests.

Every generator is a pure function of its seed, so a failing case can be
reproduced by its number. Workloads have 2-4 tasks drawn from templates
(contrastive pairs, language modelling over a concatenation of modalities,
classification), share encoders between tasks, and sometimes split one
transformer's layers over two chained nodes.
"""
import json
import os
import random
import subprocess
import tempfile

# AdamW for runs compared element by element with the one-device run
# (tests/runtime/equivalence.py explains the floor): an element whose
# gradient is below eps in size moves by lr * g / eps per step, so eps sets
# how much the rounding noise of another summation order is amplified.
ADAMW = {"type": "adamw", "lr": 0.01, "eps": 1e-4}


def cluster(n_devices, nodes=1, name=None, memory_gib=2.0):
    """A CPU-like cluster of n_devices processes on `nodes` machines."""
    assert n_devices % nodes == 0
    return {
        "format": "spindle.cluster/1",
        "name": name or f"cpu-{nodes}x{n_devices // nodes}",
        "nodes": nodes,
        "gpus_per_node": n_devices // nodes,
        "gpu": {"name": "cpu-process", "memory_gib": memory_gib,
                "peak_tflops": 0.02, "mem_bandwidth_gbs": 10},
        "links": {"intra_node_gbs": 4, "intra_node_latency_us": 5,
                  "inter_node_gbs": 1, "inter_node_latency_us": 50},
    }


def random_workload(seed, optimizer=None, max_tasks=4):
    r = random.Random(seed)
    H = r.choice([8, 16])
    comps = {}

    def enc(name, layers=None, causal=False):
        if name not in comps:
            comps[name] = {"type": "transformer", "layers": layers or r.randint(1, 3),
                           "hidden": H, "heads": 2, "ffn": 2 * H, "causal": causal}
        return name

    comps["img_patch"] = {"type": "patch", "in": r.choice([4, 6]), "hidden": H, "max_seq": 8}
    comps["txt_embed"] = {"type": "embedding", "vocab": r.choice([16, 24]), "hidden": H,
                          "max_seq": 8}
    enc("img_enc")
    enc("txt_enc", causal=True)
    tasks = []
    n_tasks = r.randint(2, max_tasks)
    kinds = ["contrastive", "lm", "classify", "contrastive", "lm_fused"]
    for t in range(n_tasks):
        kind = r.choice(kinds) if t > 0 else "contrastive"
        B = r.randint(4, 12)
        si, st = r.randint(2, 5), r.randint(2, 6)
        g = []
        if kind == "contrastive":
            comps.setdefault("proj", {"type": "linear", "in": H, "out": H})
            comps.setdefault("align", {"type": "contrastive", "temperature": 0.1})
            g += [{"id": "i_in", "component": "img_patch", "seq": si},
                  {"id": "i", "component": "img_enc", "seq": si, "inputs": ["i_in"]},
                  {"id": "ip", "component": "proj", "seq": si, "inputs": ["i"]},
                  {"id": "t_in", "component": "txt_embed", "seq": st}]
            L = comps["txt_enc"]["layers"]
            if L >= 2 and r.random() < 0.5:   # split the stack over two nodes
                k = r.randint(1, L - 1)
                g += [{"id": "t0", "component": "txt_enc", "seq": st, "inputs": ["t_in"],
                       "layers": [0, k]},
                      {"id": "t", "component": "txt_enc", "seq": st, "inputs": ["t0"],
                       "layers": [k, L]}]
            else:
                g += [{"id": "t", "component": "txt_enc", "seq": st, "inputs": ["t_in"]}]
            g += [{"id": "loss", "component": "align", "inputs": ["ip", "t"]}]
        elif kind in ("lm", "lm_fused"):
            comps.setdefault("lm", {"type": "lm_head", "hidden": H,
                                    "vocab": comps["txt_embed"]["vocab"]})
            g += [{"id": "t_in", "component": "txt_embed", "seq": st},
                  {"id": "t", "component": "txt_enc", "seq": st, "inputs": ["t_in"]}]
            if kind == "lm_fused":
                enc("fuse", layers=r.randint(1, 2), causal=True)
                g += [{"id": "i_in", "component": "img_patch", "seq": si},
                      {"id": "i", "component": "img_enc", "seq": si, "inputs": ["i_in"]},
                      {"id": "f", "component": "fuse", "seq": si + st, "inputs": ["i", "t"]},
                      {"id": "loss", "component": "lm", "inputs": ["f"]}]
            else:
                g += [{"id": "loss", "component": "lm", "inputs": ["t"]}]
        else:
            comps.setdefault("cls", {"type": "classifier", "hidden": H,
                                     "classes": r.choice([3, 4])})
            g += [{"id": "i_in", "component": "img_patch", "seq": si},
                  {"id": "i", "component": "img_enc", "seq": si, "inputs": ["i_in"]},
                  {"id": "loss", "component": "cls", "inputs": ["i"]}]
        tasks.append({"name": f"t{t}-{kind}", "batch": B,
                      "weight": r.choice([0.5, 1.0, 2.0]), "graph": g})
    used = {n["component"] for t in tasks for n in t["graph"]}
    comps = {k: v for k, v in comps.items() if k in used}
    return {"format": "spindle.model/1", "name": f"random-{seed}", "dtype": "fp32",
            "optimizer": optimizer or {"type": "adamw", "lr": 0.01, "eps": 1e-6},
            "seed": seed, "components": comps, "tasks": tasks}


def op_shapes(model):
    """The profile keys ("op" objects) of every operator in model, once each."""
    comps, seen = model["components"], {}
    for t in model["tasks"]:
        nodes = {n["id"]: n for n in t["graph"]}
        for n in t["graph"]:
            c = comps[n["component"]]
            ty = c["type"]
            if ty in ("embedding", "patch", "transformer", "linear"):
                keys = {"embedding": ("vocab", "hidden"), "patch": ("in", "hidden"),
                        "transformer": ("hidden", "heads", "ffn", "causal"),
                        "linear": ("in", "out")}[ty]
                s = {"type": ty, "seq": n["seq"], **{k: c[k] for k in keys if k in c}}
            elif ty == "classifier":
                s = {"type": ty, "hidden": c["hidden"], "classes": c["classes"]}
            elif ty == "contrastive":
                src = comps[nodes[n["inputs"][0]]["component"]]
                s = {"type": ty, "hidden": src.get("out", src.get("hidden"))}
            else:
                continue
            seen[json.dumps(s, sort_keys=True)] = s
    return [seen[k] for k in sorted(seen)]


def write_json(dirpath, name, obj):
    path = os.path.join(dirpath, name)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
    return path


def plan(model_path, cluster_path, out, algo="spindle", extra=()):
    cmd = [os.environ["SPINDLE_PLAN"], model_path, cluster_path, "--algo", algo,
           "-o", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stderr}")
    return p.stdout


def with_vocab(model, vocab):
    """A copy of the model with every embedding's and LM head's vocabulary
    set to vocab."""
    import copy
    m = copy.deepcopy(model)
    for c in m["components"].values():
        if "vocab" in c:
            c["vocab"] = vocab
    return m
