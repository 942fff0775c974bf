"""Helpers shared by the runtime resilience tests (resume, checkpoint
format, crashes, hangs, bad input): planning the demo model for a number
of ranks, running spindle-run under mpirun with a hard wall-clock bound,
reading logs, dumps and safetensors files, and finding the rank processes
of a run. Binaries come from SPINDLE_PLAN / SPINDLE_RUN / SPINDLE_ROOT
(set by tests/meson.build)."""
import copy
import csv
import json
import os
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import workloads as W  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import equivalence  # noqa: E402  (its tolerances and dump reader)
from equivalence import load_dump  # noqa: E402,F401

ROOT = os.environ["SPINDLE_ROOT"]
RUN = os.environ["SPINDLE_RUN"]
ADAMW = {"type": "adamw", "lr": 0.01, "eps": 1e-6}   # as tests/runtime/equivalence.py
SGD = {"type": "sgd", "lr": 0.05}
# the absolute floors of tests/runtime/equivalence.py (see its docstring)
FLOOR = {"adamw": 1e-2 * 0.01, "sgd": 1e-7}
HARD_LIMIT = 120   # seconds: a run that takes longer hangs


class Failures:
    """Collects failed checks; prints one line per check."""

    def __init__(self):
        self.failed = []

    def check(self, ok, what, detail=""):
        print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else
                                                       "\n     " + detail.replace("\n", "\n     ")),
              flush=True)
        if not ok:
            self.failed.append(what)
        return ok

    def exit(self):
        print(f"{len(self.failed)} failure(s)")
        return 1 if self.failed else 0


def demo_model(opt=None):
    m = json.load(open(os.path.join(ROOT, "plans", "demo", "model.json")))
    m["optimizer"] = copy.deepcopy(opt or ADAMW)
    return m


def make_plan(tmp, model, name, ranks, algo="spindle", extra=()):
    """Plans `model` (a dict) for a CPU cluster of `ranks` processes (extra:
    more planner options)."""
    mpath = W.write_json(tmp, f"{name}.model.json", model)
    cpath = W.write_json(tmp, f"cpu-{ranks}.json", W.cluster(ranks))
    out = os.path.join(tmp, f"{name}.{ranks}.{algo}.bin")
    W.plan(mpath, cpath, out, algo, extra)
    return out


class Result:
    def __init__(self, rc, out, err, secs, cmd):
        self.rc, self.out, self.err, self.secs, self.cmd = rc, out, err, secs, cmd

    @property
    def text(self):
        return self.out + self.err

    def describe(self):
        return (f"{' '.join(self.cmd)}\n-> exit {self.rc} after {self.secs:.1f} s\n"
                f"stdout: {self.out[-1500:]}\nstderr: {self.err[-2500:]}")


def command(plan, ranks, *args, np=None):
    cmd = [RUN, plan, *[str(a) for a in args]]
    if ranks > 1 or np is not None:
        cmd = ["mpirun", "--oversubscribe", "-np", str(np or ranks)] + cmd
    return cmd


def run(plan, ranks, *args, env=None, np=None, limit=HARD_LIMIT):
    """Runs spindle-run (under mpirun when ranks > 1); never waits longer
    than `limit` seconds (then rc is None)."""
    cmd = command(plan, ranks, *args, np=np)
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=e)
        return Result(p.returncode, p.stdout, p.stderr, time.monotonic() - t0, cmd)
    except subprocess.TimeoutExpired as x:
        out = x.stdout.decode() if isinstance(x.stdout, bytes) else (x.stdout or "")
        err = x.stderr.decode() if isinstance(x.stderr, bytes) else (x.stderr or "")
        return Result(None, out, err, time.monotonic() - t0, cmd)


def must(r, what):
    if r.rc != 0:
        raise RuntimeError(f"{what} failed:\n{r.describe()}")
    return r


def read_log(path):
    return list(csv.DictReader(open(path)))


def compare(ref, got, floor, what):
    """Parameters and losses within the tolerance of equivalence.py (its
    own compare: relative 1e-4 plus `floor` per element, losses relative
    1e-4 + 1e-6). Returns None or a message."""
    if len(ref[1]) != len(got[1]):
        return f"{what}: {len(ref[1])} vs {len(got[1])} log rows"
    return equivalence.compare(ref, got, floor, what)


def snapshot_listing(d):
    """Every entry of a checkpoint directory (recursively) with its bytes."""
    out = {}
    for base, dirs, files in os.walk(d):
        for n in dirs:
            out[os.path.relpath(os.path.join(base, n), d) + "/"] = None
        for n in files:
            p = os.path.join(base, n)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def edit(path, fn):
    """Replaces a text file's content by fn(content)."""
    text = open(path).read()
    open(path, "w").write(fn(text))


def latest_snapshot(d):
    return os.path.join(d, open(os.path.join(d, "LATEST")).read().strip())


def read_safetensors(path):
    """An independent reader of the safetensors layout: returns (header
    dict, data bytes) after checking the framing rules of the format."""
    b = open(path, "rb").read()
    assert len(b) >= 8, f"{path}: shorter than 8 bytes"
    (n,) = struct.unpack_from("<Q", b, 0)
    assert 8 + n <= len(b), f"{path}: header length {n} runs past the file"
    raw = b[8:8 + n]
    assert raw[:1] == b"{", f"{path}: header does not start with '{{'"
    text = raw.decode("utf-8")
    body = text.rstrip(" ")
    assert body.endswith("}"), f"{path}: header padding is not spaces"
    header = json.loads(body)
    return header, b[8 + n:]


def rank_pids(marker):
    """{rank: pid} of live spindle-run processes whose command line holds
    `marker` (the run's plan path)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        if not cmd or not cmd[0].endswith(b"spindle-run") or marker.encode() not in cmd:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(e.split(b"=")[1])] = int(d)
    return out


def reap(marker, grace=10):
    """Continues and kills every rank of a run still alive `grace` seconds
    after mpirun returned (processes being torn down take a moment,
    longer under ASan); returns their ranks (an empty list when the run
    cleaned up after itself)."""
    t = time.monotonic()
    left = rank_pids(marker)
    while left and time.monotonic() - t < grace:
        time.sleep(0.1)
        left = rank_pids(marker)
    for pid in left.values():
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return sorted(left)
