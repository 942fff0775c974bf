"""Writes small "spindle.dataset/1" directories (schemas/DATASET-FORMAT.md)
for a model dict, with the standard library only: random token ids,
features, labels and lengths (some samples padded), a task's samples split
over two shards. Used by tests/runtime/data.py; it does not make learnable
or realistic data (tools/make-dataset does)."""
import importlib.machinery
import importlib.util
import json
import os
import random

FORMATS = {"I32": "<%di", "F32": "<%df"}


def _make_dataset():
    """tools/make-dataset as a module (its safetensors writer is the one)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "make-dataset")
    loader = importlib.machinery.SourceFileLoader("make_dataset", path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


write_safetensors = _make_dataset().write_safetensors


def columns(model, task):
    """[(tensor prefix, kind, seq, width, bound)] a task's shards hold."""
    comps = model["components"]
    out = []
    for n in task["graph"]:
        c = comps[n["component"]]
        if c["type"] == "embedding":
            out.append((n["id"], "tokens", n["seq"], 1, c["vocab"]))
        elif c["type"] == "patch":
            out.append((n["id"], "features", n["seq"], c["in"], None))
        elif c["type"] == "classifier":
            out.append((n["id"], "labels", 1, 1, c["classes"]))
    return out


def shard_tensors(model, task, n, rng):
    t = {}
    for node, kind, seq, width, bound in columns(model, task):
        if kind == "labels":
            t[f"{node}.labels"] = ("I32", [n], [rng.randrange(bound) for _ in range(n)])
            continue
        lens = [seq if rng.random() < 0.5 else rng.randint(1, seq) for _ in range(n)]
        flat = []
        for ln in lens:
            for q in range(seq):
                for _ in range(width):
                    if kind == "tokens":
                        flat.append(rng.randrange(bound) if q < ln else 0)
                    else:
                        flat.append(rng.uniform(-1, 1) if q < ln else 0.0)
        shape = [n, seq] if kind == "tokens" else [n, seq, width]
        t[f"{node}.{kind}"] = ("I32" if kind == "tokens" else "F32", shape, flat)
        t[f"{node}.length"] = ("I32", [n], lens)
    return t


def make(model, d, samples, seed=7):
    """Writes a dataset for every task of `model` into directory d:
    samples[task name] samples each, in two shards. Returns the index."""
    os.makedirs(d, exist_ok=True)
    rng = random.Random(seed)
    index = {"format": "spindle.dataset/1", "tasks": {}}
    for task in model["tasks"]:
        n = samples[task["name"]]
        parts = [n // 2, n - n // 2]
        shards = []
        for k, m in enumerate(parts):
            f = f"{task['name']}-{k:05d}.safetensors"
            write_safetensors(os.path.join(d, f), shard_tensors(model, task, m, rng))
            shards.append({"file": f, "samples": m})
        index["tasks"][task["name"]] = {"samples": n, "shards": shards}
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return index
