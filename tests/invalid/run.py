#!/usr/bin/env python3
"""Runs spindle-plan on every bad input under tests/invalid/ and checks that
it is rejected the way the design says: exit status 2, the expected first
line of stderr (and the `hint:` line when the case's `error` file has two
lines), nothing on stdout, and no file written.

A case is a directory <case>/ holding
  error      the exact expected first line of stderr (second line: the hint)
  model.json / cluster.json
             the inputs; when one is left out, plans/demo's is used
  args       optional: the arguments instead of
             `model.json cluster.json --inspect` (shell-style words)
  setup.sh   optional: run with sh in the case's directory before the test;
             exit status 77 skips the case (e.g. chmod cannot block root)
Each case runs in a fresh temporary directory holding copies of its files,
with relative file names, so the messages are stable.

usage: run.py [--only PREFIX] [--skip PREFIX] [--show] [CASE...]
  --only PREFIX   run only the cases whose names start with PREFIX
  --skip PREFIX   leave out the cases whose names start with PREFIX
  --show          print what spindle-plan wrote for each case (for writing
                  a new case's `error`; check it by hand before you copy it)
Environment: SPINDLE_PLAN (the program, required), SPINDLE_ROOT (the source
tree; default: two directories up from this file).
Exit status: 0 all passed (or skipped), 1 a case failed, 2 usage error.
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASE_FILES = ("error", "args", "setup.sh")
TIMEOUT_S = 60


def child_env():
    env = dict(os.environ)
    # Under ASan, look for leaks too: spindle-plan does not load MPI, whose
    # plugins are why the suite's default turns leak detection off.
    asan = env.get("ASAN_OPTIONS", "")
    opts = [o for o in asan.split(":") if o and not o.startswith("detect_leaks=")]
    if env.get("SPINDLE_LEAK_CHECK", "1") != "0":
        opts.append("detect_leaks=1")
    else:
        opts.append("detect_leaks=0")
    env["ASAN_OPTIONS"] = ":".join(opts)
    env["LC_ALL"] = "C"
    return env


def output_paths(args):
    """Paths given to -o/--output (which must not exist afterwards)."""
    out = []
    for i, a in enumerate(args):
        if a in ("-o", "--output") and i + 1 < len(args):
            out.append(args[i + 1])
    return out


def snapshot(d):
    found = set()
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), d))
    return found


def run_case(plan, root, name, show):
    """Returns (status, lines) with status 'ok', 'FAIL' or 'skip'."""
    src = os.path.join(HERE, name)
    err_path = os.path.join(src, "error")
    if not os.path.isfile(err_path):
        return "FAIL", ["no 'error' file in the case directory"]
    with open(err_path, encoding="utf-8") as f:
        want = f.read().splitlines()
    if not 1 <= len(want) <= 2 or not want[0]:
        return "FAIL", ["'error' must hold one line, or two (the second the hint)"]
    if len(want) == 2 and not want[1].startswith("hint: "):
        return "FAIL", ["the second line of 'error' must start with 'hint: '"]
    args = ["model.json", "cluster.json", "--inspect"]
    if os.path.isfile(os.path.join(src, "args")):
        with open(os.path.join(src, "args"), encoding="utf-8") as f:
            args = shlex.split(f.read())
    with tempfile.TemporaryDirectory(prefix="spindle-invalid-") as tmp:
        for entry in sorted(os.listdir(src)):
            if entry in CASE_FILES:
                continue
            p = os.path.join(src, entry)
            if os.path.isdir(p):
                shutil.copytree(p, os.path.join(tmp, entry))
            else:
                shutil.copy(p, os.path.join(tmp, entry))
        for default in ("model.json", "cluster.json"):
            if not os.path.lexists(os.path.join(tmp, default)):
                shutil.copy(os.path.join(root, "plans", "demo", default),
                            os.path.join(tmp, default))
        if os.path.isfile(os.path.join(src, "setup.sh")):
            r = subprocess.run(["sh", os.path.join(src, "setup.sh")], cwd=tmp,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=TIMEOUT_S)
            text = r.stdout.decode("utf-8", "replace").strip()
            if r.returncode == 77:
                return "skip", [text or "setup.sh asked to skip"]
            if r.returncode != 0:
                return "FAIL", ["setup.sh failed (%d): %s" % (r.returncode, text)]
        before = snapshot(tmp)
        try:
            r = subprocess.run([plan] + args, cwd=tmp, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=TIMEOUT_S,
                               env=child_env())
        except subprocess.TimeoutExpired:
            return "FAIL", ["spindle-plan ran for more than %d s" % TIMEOUT_S]
        after = snapshot(tmp)
        # let the case's files be removed even when setup.sh made them unreadable
        for d, dirs, files in os.walk(tmp):
            for x in dirs + files:
                try:
                    os.chmod(os.path.join(d, x), 0o700)
                except OSError:
                    pass
    out = r.stdout.decode("utf-8", "replace")
    err = r.stderr.decode("utf-8", "replace")
    got = err.splitlines()
    if show:
        sys.stdout.write("---- %s: exit %d\n%s" % (name, r.returncode, err))
    problems = []
    if r.returncode != 2:
        problems.append("exit status %d, expected 2" % r.returncode)
    if got[:len(want)] != want:
        for i, w in enumerate(want):
            g = got[i] if i < len(got) else "(no line)"
            if g != w:
                problems.append("stderr line %d differs" % (i + 1))
                problems.append("  expected: %s" % w)
                problems.append("  got:      %s" % g)
    if len(want) == 1 and len(got) > 1 and got[1].startswith("hint: "):
        problems.append("stderr has a hint the case does not check: %s" % got[1])
    if out:
        problems.append("stdout is not empty: %s" % out.splitlines()[0])
    for p in output_paths(args):
        if p in after:
            problems.append("output file '%s' was written" % p)
    new = sorted(after - before)
    if new:
        problems.append("files appeared: %s" % ", ".join(new))
    if problems:
        if len(got) > len(want):
            problems.append("rest of stderr: %s" % " | ".join(got[len(want):len(want) + 4]))
        return "FAIL", problems
    return "ok", []


def main(argv):
    only, skip, show, names = [], [], False, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--only", "--skip") and i + 1 < len(argv):
            (only if a == "--only" else skip).append(argv[i + 1])
            i += 2
            continue
        if a == "--show":
            show = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        elif a.startswith("-"):
            print("run.py: unknown option '%s'" % a, file=sys.stderr)
            return 2
        else:
            names.append(a.rstrip("/"))
        i += 1
    plan = os.environ.get("SPINDLE_PLAN")
    if not plan:
        print("run.py: SPINDLE_PLAN is not set (run through meson test)", file=sys.stderr)
        return 2
    plan = os.path.abspath(plan)
    root = os.environ.get("SPINDLE_ROOT") or os.path.dirname(os.path.dirname(HERE))
    if not names:
        names = sorted(d for d in os.listdir(HERE)
                       if os.path.isdir(os.path.join(HERE, d)) and not d.startswith(("_", ".")))
    names = [n for n in names
             if (not only or n.startswith(tuple(only))) and not n.startswith(tuple(skip))]
    if not names:
        print("run.py: no cases selected", file=sys.stderr)
        return 1
    counts = {"ok": 0, "FAIL": 0, "skip": 0}
    for name in names:
        status, lines = run_case(plan, root, name, show)
        counts[status] += 1
        print("%-4s %s%s" % (status, name, (": " + lines[0]) if status == "skip" else ""))
        if status == "FAIL":
            for line in lines:
                print("       " + line)
    print("%d passed, %d failed, %d skipped (of %d cases)"
          % (counts["ok"], counts["FAIL"], counts["skip"], len(names)))
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
