#!/usr/bin/env python3
"""No hangs: a rank that dies or stalls ends the whole job, non-zero and
in bounded time, with a message naming it. Every run has --timeout 3 and a
hard wall-clock bound (HARD_LIMIT) that must not be hit; afterwards no rank
process may be left (a stopped one is continued and killed in cleanup).

  * SIGSTOP from the test in the middle of a long run (once its log shows
    training has begun: MPI_Init's own watchdog bound is 30 s, not 3, and
    is checked by hand, not here): the ranks time out
    ("rank R: instruction K (... peer rank P): timed out after 3 s" inside a
    step, or the watchdog's "rank R: step S: <what>: timed out after 3 s"
    when they wait in a collective between steps).
  * SPINDLE_FAULT=stop-at:3:2 (rank 2 stops at the start of step 3): a rank
    that receives from rank 2 reports exactly
    "rank R: instruction K (recv peer rank 2): timed out after 3 s ...".
  * SPINDLE_FAULT=stop-at:3:1:end (rank 1 stops after its step-3 program,
    before the losses are summed): the others wait in the all-reduce and the
    watchdog reports "rank R: step 3: summing the losses: timed out after 3 s".
  * SIGKILL from the test in the middle of a run, and --fault-exit-at 3
    --fault-rank 1: mpirun notices, names the rank and ends the job.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(__file__))
import rtlib as R  # noqa: E402

TIMEOUT = 3
# after the timeout fires, mpirun needs a moment to tear the job down; under
# ASan on 2 busy cores start-up alone can take a few seconds
BOUND = 40
INSIDE = re.compile(r"rank (\d+): instruction (\d+) \((recv peer rank|send peer rank|sync) "
                    r"(\d+)\): timed out after 3 s")
WATCHDOG = re.compile(r"rank (\d+): step (\d+): [a-z ]+: timed out after 3 s")


def background(plan, *args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    cmd = R.command(plan, 4, *args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=e), cmd


def finish(p, cmd, t0):
    try:
        out, err = p.communicate(timeout=R.HARD_LIMIT)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        rc = None
    return R.Result(rc, out, err, time.monotonic() - t0, cmd)


def wait_ranks(plan, n, limit=30):
    t = time.monotonic()
    while time.monotonic() - t < limit:
        pids = R.rank_pids(plan)
        if len(pids) == n:
            return pids
        time.sleep(0.1)
    return R.rank_pids(plan)


def training(log, steps, limit=60):
    """Waits until the run's log holds `steps` steps: past start-up."""
    t = time.monotonic()
    while time.monotonic() - t < limit:
        if os.path.exists(log) and len(open(log).read().splitlines()) > 3 * steps:
            return True
        time.sleep(0.05)
    return False


def external(F, plan, sig, victim):
    name = signal.Signals(sig).name
    log = plan + f".{name}.csv"
    p, cmd = background(plan, "--quiet", "--steps", 1000000, "--timeout", TIMEOUT, "--log", log)
    pids = wait_ranks(plan, 4)
    if not F.check(len(pids) == 4 and training(log, 5), f"{name}: the 4 ranks are training",
                   str(pids)):
        p.kill()
        R.reap(plan)
        return
    time.sleep(0.3)          # in the middle of some step
    t0 = time.monotonic()
    os.kill(pids[victim], sig)
    r = finish(p, cmd, t0)
    left = R.reap(plan)
    F.check(r.rc not in (0, None) and r.secs < BOUND,
            f"{name} rank {victim}: mpirun exits non-zero in {r.secs:.1f} s (bound {BOUND} s)",
            r.describe())
    F.check(not left, f"{name} rank {victim}: no rank process is left", f"left: {left}")
    if sig == signal.SIGKILL:
        F.check(re.search(rf"process rank {victim} .*signal 9", r.text, re.S) is not None,
                f"SIGKILL rank {victim}: mpirun names the killed rank", r.describe())
    else:
        # (the victim itself may print its own watchdog's message when
        # mpirun's teardown continues it before killing it: not counted; a
        # rank may also time out waiting for another waiting rank)
        inside = [m for m in INSIDE.finditer(r.err) if int(m.group(1)) != victim]
        dog = [m for m in WATCHDOG.finditer(r.err) if int(m.group(1)) != victim]
        F.check(bool(inside or dog), f"SIGSTOP rank {victim}: the other ranks report a "
                f"timeout ({len(inside)} inside a step, {len(dog)} between steps)",
                r.describe())


def stop_hook(F, plan, spec, pattern, what):
    """Runs with SPINDLE_FAULT=spec; returns whether stderr matches."""
    t0 = time.monotonic()
    p, cmd = background(plan, "--quiet", "--steps", 50, "--timeout", TIMEOUT,
                        env={"SPINDLE_FAULT": spec})
    r = finish(p, cmd, t0)
    left = R.reap(plan)
    F.check(r.rc not in (0, None) and r.secs < BOUND,
            f"{spec}: mpirun exits non-zero in {r.secs:.1f} s (bound {BOUND} s)", r.describe())
    F.check(not left, f"{spec}: no rank process is left", f"left: {left}")
    if what is None:
        return re.search(pattern, r.err) is not None, r
    F.check(re.search(pattern, r.err) is not None, f"{spec}: {what}", r.describe())
    return True, r


def main():
    F = R.Failures()
    with tempfile.TemporaryDirectory() as tmp:
        plan = R.make_plan(tmp, R.demo_model(R.ADAMW), "hang", 4)
        # which rank first waits on the stopped one depends on the plan: a
        # receive names its peer, an all-reduce (sync) cannot. Stop ranks in
        # turn until a receiving rank names the stopped one.
        seen = []
        for v in (2, 1, 3, 0):
            ok, r = stop_hook(F, plan, f"stop-at:3:{v}",
                              rf"rank [0-3]: instruction \d+ \(recv peer rank {v}\): "
                              r"timed out after 3 s waiting for rank " + str(v), None)
            seen.append(r.err)
            if ok:
                break
        F.check(ok, "stop-at:3:V: a rank receiving from the stopped rank V reports exactly "
                "'rank R: instruction K (recv peer rank V): timed out after 3 s waiting for "
                "rank V'", "\n".join(seen))
        stop_hook(F, plan, "stop-at:3:1:end",
                  r"rank [023]: step 3: summing the losses: timed out after 3 s",
                  "the watchdog names the rank, the step and the collective")
        external(F, plan, signal.SIGSTOP, 1)
        external(F, plan, signal.SIGKILL, 2)
        t0 = time.monotonic()
        r = R.run(plan, 4, "--quiet", "--steps", 10, "--timeout", TIMEOUT, "--fault-exit-at", 3,
                  "--fault-rank", 1)
        F.check(r.rc not in (0, None) and r.secs < BOUND and
                "rank 1: exiting at step 3" in r.err and not R.reap(plan),
                f"--fault-exit-at 3 --fault-rank 1: the job ends non-zero in "
                f"{time.monotonic() - t0:.1f} s", r.describe())
    return F.exit()


if __name__ == "__main__":
    sys.exit(main())
