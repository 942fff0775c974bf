#!/usr/bin/env python3
"""A component no node uses is a warning, not an error (issue 19 item 7: a
component library shared by several task sets is normal):

  * spindle-plan exits 0, writes the plan, and prints one warning on
    stderr naming the component where it was written
    (model.json:L:C: components.spare: warning: ...), the summary on stdout;
  * the unused components change nothing the planner predicts: --json of
    the model with them equals --json of the model without them, but for
    hashes and the *planning_ms fields (wall-clock time of planning).
The runtime side (such a plan runs, checkpoints, exports and resumes) is in
tests/runtime/weights.py.
Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env). Exit 0 pass, 1 fail.
"""
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.environ["SPINDLE_ROOT"]
PLAN = os.environ["SPINDLE_PLAN"]


def plan(tmp, model, out):
    with open(os.path.join(tmp, "model.json"), "w") as f:
        json.dump(model, f, indent=1)
    cluster = os.path.join(ROOT, "plans", "demo", "cluster.json")
    return subprocess.run([PLAN, "model.json", cluster, "-o", out, "--json"], cwd=tmp,
                          capture_output=True, text=True, timeout=120)


def main():
    failed = []

    def check(ok, what, detail=""):
        print(("ok   " if ok else "FAIL ") + what + ("" if ok else "\n     " + detail))
        if not ok:
            failed.append(what)

    base = json.load(open(os.path.join(ROOT, "plans", "demo", "model.json")))
    spare = copy.deepcopy(base)
    spare["components"]["spare"] = {"type": "linear", "in": 8, "out": 8}
    spare["components"]["spare_enc"] = {"type": "transformer", "layers": 2, "hidden": 8,
                                        "heads": 2, "ffn": 16}
    with tempfile.TemporaryDirectory() as tmp:
        r = plan(tmp, spare, "spare.bin")
        check(r.returncode == 0, "a model with unused components plans (exit 0)", r.stderr)
        check(os.path.getsize(os.path.join(tmp, "spare.bin")) > 0
              if os.path.exists(os.path.join(tmp, "spare.bin")) else False,
              "... and the plan is written")
        lines = r.stderr.splitlines()
        pat = (r"^model\.json:\d+:\d+: components\.%s: warning: component '%s' is not used "
               r"by any node: it is neither planned nor trained$")
        check(len(lines) == 2 and re.match(pat % ("spare", "spare"), lines[0]) and
              re.match(pat % ("spare_enc", "spare_enc"), lines[1]),
              "one warning per unused component on stderr, located", repr(r.stderr))
        r0 = plan(tmp, base, "base.bin")
        check(r0.returncode == 0 and r0.stderr == "", "the model without them: no warning",
              r0.stderr)
        try:
            a, b = json.loads(r.stdout), json.loads(r0.stdout)
        except ValueError as e:
            check(False, "--json output parses", str(e))
            return 1

        def strip(d):
            # the model's hash and the time planning took differ by design
            if isinstance(d, dict):
                return {k: strip(v) for k, v in d.items()
                        if "hash" not in k and "planning_ms" not in k}
            return [strip(v) for v in d] if isinstance(d, list) else d
        check(strip(a) == strip(b), "the unused components change no predicted figure",
              json.dumps(a)[:400] + "\n     " + json.dumps(b)[:400])
    print(f"{len(failed)} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
