#!/usr/bin/env python3
"""--jobs N evaluates ours' candidates on worker threads (planner/jobs.c,
plan.c's parallel walk): the plan must not depend on N. Plans bundled
workloads on their own cluster and on 64-GPU clusters, with --compare, with
a candidate left out (--exclude milp-list: the separable allotment then
comes before the MILP's, which the jobs must reproduce), under
--simulate-all, and two of tools/bench-plan's synthetic CLIP-like
workloads at 128 GPUs with 8 NICs per node (the generator of the 1024-GPU
scaling inputs, made smaller to run fast), with --jobs 1, 2 and 3 (with
more than one, layout_refine's last trial runs as a job beside the
others, judged after them: layout_last_*): the
plan files equal byte for byte and the --json reports equal but for their
planning times. Ours chooses on refined iterations (walk_jobs.c
top_choose): one case, clip-4 on 64 A800s, where a candidate other than
the walk's unrefined choice wins once refined, plans alike with
--refine-within all too, and there ours must be no slower than ours
without any one candidate (--exclude each in turn): an exact minimum over
all candidates is no more than one over fewer. A walk that refined only
its choice fails that (SPINDLE_TEST_REFINE=0.000001, near none beside the
choice, shows it). With --jobs 2+, top_choose readies and refines the
kept candidates as jobs beside the choice's refinement and each other:
clip-4 on 64 A800s under the default --refine-within refines several
(SPINDLE_TOP_STATS says how many; the case asks for 3 or more, so that it
keeps exercising those jobs), one of which wins, and plans alike with
--jobs 1, 2 and 3 (jobs that skipped their refinement fail it). ofasys on
64 A800s has the walk's last loop simulate held plans as jobs ahead of it
(walk.c held_ahead_*: SPINDLE_SIM_STATS' "walk ahead", asked for once or
more) and take their results (clip-4's did until bound_sync took release
times and links: its held plans are now skipped). Environment: SPINDLE_PLAN, SPINDLE_ROOT (test_env).
Exit 0 pass, 1 fail.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prune_exact import PLAN, ROOT, plan, synthetic  # noqa: E402 (same environment)

JOBS = (1, 2, 3)


def case(model, cluster, opts, tmp, tag):
    runs = [plan(model, cluster, os.path.join(tmp, f"{tag}.{j}"), opts + ["--jobs", str(j)])
            for j in JOBS]
    a = runs[0]
    for j, b in zip(JOBS[1:], runs[1:]):
        if a[0] or b[0]:
            if a[:2] != b[:2]:
                return False, f"exit {a[0]} / {b[0]} with --jobs {j}: {a[1] or b[1]}"
            continue
        if a[3] != b[3]:
            return False, f"plan file with --jobs {j} differs from --jobs 1's"
        if a[2] != b[2]:
            keys = [k for k in set(a[2]) | set(b[2]) if a[2].get(k) != b[2].get(k)]
            return False, f"report with --jobs {j} differs in {sorted(keys)}"
    if a[0]:
        return True, f"exit {a[0]} with every --jobs"
    return True, f"same plan ({a[2]['algorithms']['spindle']['iteration_ms']:.3f} ms)"


def refined_many(model, cluster, opts, least=3):
    """How many plans top_choose refined with --jobs 3 (SPINDLE_TOP_STATS):
    at least `least`, so that their jobs ran beside each other."""
    env = dict(os.environ, SPINDLE_TOP_STATS="1")
    p = subprocess.run([PLAN, model, cluster, "-o", os.devnull, "--jobs", "3"] + opts,
                       capture_output=True, text=True, timeout=600, env=env)
    line = [x for x in p.stderr.splitlines() if x.startswith("top_choose:")]
    if p.returncode or not line:
        return False, f"exit {p.returncode}, no top_choose figures: {p.stderr.strip()}"
    n = int(line[-1].split(",")[1].split()[0])
    if n < least:
        return False, f"{n} plans refined, expected {least} or more (no refinement jobs)"
    return True, f"{n} plans refined"


def walked_ahead(model, cluster, opts, least=1):
    """How many held plans plan_walk's last loop had simulated as jobs
    (held_ahead_*, SPINDLE_SIM_STATS' "walk ahead") with --jobs 2, and how
    many of those results it took (the event "walk ahead taken"; a job
    whose result were thrown away would leave the plans the same): at
    least `least` of each, so that the case keeps exercising them."""
    env = dict(os.environ, SPINDLE_SIM_STATS="1")
    p = subprocess.run([PLAN, model, cluster, "-o", os.devnull, "--jobs", "2"] + opts,
                       capture_output=True, text=True, timeout=600, env=env)
    line = [x for x in p.stderr.splitlines() if x.startswith("sim stats: walk ahead ")]
    if p.returncode:
        return False, f"exit {p.returncode}: {p.stderr.strip()}"
    n = int(line[0].split()[4]) if line else 0
    if n < least:
        return False, f"{n} held plans simulated ahead, expected {least} or more"
    taken = [x for x in p.stderr.splitlines() if x.startswith("sim stats: event walk ahead taken ")]
    k = int(taken[0].split()[-2]) if taken else 0
    if k < least:
        return False, f"{k} of {n} results simulated ahead taken, expected {least} or more"
    return True, f"{n} held plans simulated ahead, {k} taken"


def fewer_never_faster(model, cluster, opts, tmp):
    """Ours with every candidate against ours without each one."""
    full = plan(model, cluster, os.path.join(tmp, "all"), opts)
    if full[0]:
        return False, f"exit {full[0]}: {full[1]}"
    best = full[2]["algorithms"]["spindle"]["iteration_ms"]
    names = subprocess.run([PLAN, model, cluster, "--candidates"], capture_output=True,
                           text=True, timeout=60).stdout.split()
    if len(names) < 2:
        return False, f"--candidates listed {names}"
    for n in names:
        r = plan(model, cluster, os.path.join(tmp, "ex"), opts + ["--exclude", n])
        if r[0]:
            continue  # nothing planned without it: nothing to compare
        it = r[2]["algorithms"]["spindle"]["iteration_ms"]
        if it < best * (1 - 1e-6):
            return False, (f"without '{n}' ours plans {it:.3f} ms, with every candidate "
                           f"{best:.3f} ms: the choice is not the least refined iteration")
    return True, f"{best:.3f} ms, no faster without any of {len(names)} candidates"


def main():
    pl = os.path.join(ROOT, "plans")
    cl = os.path.join(pl, "clusters")
    cases = [
        (f"{pl}/clip-10/model.json", f"{pl}/clip-10/cluster.json", []),
        (f"{pl}/clip-10/model.json", f"{cl}/h100-8x8-8nic.json", ["--compare"]),
        # layout_refine's last trial kept: by the sequential plan (a job
        # beside ours' walk with --jobs) and by spindle-paper's (refine_par)
        (f"{pl}/clip-10/model.json", f"{cl}/a800-4x8.json", ["--compare"]),
        (f"{pl}/qwen-val/model.json", f"{cl}/a800-8x8.json", []),
        (f"{pl}/vit-bigg-4res/model.json", f"{cl}/a800-8x8-4nic.json", []),
        (f"{pl}/clip-7/model.json", f"{cl}/a800-8x8.json", ["--exclude", "milp-list"]),
        (f"{pl}/clip-4/model.json", f"{cl}/h100-8x8-8nic.json", ["--simulate-all"]),
    ]
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases += [(m, c, []) for m, c in synthetic(
            tmp, ((16, 128, "h100-8x8-8nic"), (32, 128, "h100-8x8-8nic")))]
        for i, (m, c, opts) in enumerate(cases):
            ok, why = case(m, c, opts, tmp, str(i))
            fails += not ok
            name = os.path.basename(os.path.dirname(m)) if m.startswith(ROOT) else \
                os.path.basename(m)
            print(f"{'ok  ' if ok else 'FAIL'} {name} on {os.path.basename(c)} "
                  f"{' '.join(opts)}: {why}", flush=True)
        # several kept candidates refined as jobs beside each other
        m, c = f"{pl}/clip-4/model.json", f"{cl}/a800-8x8.json"
        ok, why = refined_many(m, c, [])
        if ok:
            ok2, why2 = case(m, c, [], tmp, "beside")
            ok, why = ok2, f"{why}; {why2}"
        fails += not ok
        cases.append((m, c, []))
        print(f"{'ok  ' if ok else 'FAIL'} clip-4 on a800-8x8.json (refinements as jobs): "
              f"{why}", flush=True)
        # held plans simulated as jobs ahead of the walk's last loop, taken
        m, c = f"{pl}/ofasys/model.json", f"{cl}/a800-8x8.json"
        ok, why = walked_ahead(m, c, [])
        if ok:
            ok2, why2 = case(m, c, [], tmp, "ahead")
            ok, why = ok2, f"{why}; {why2}"
        fails += not ok
        cases.append((m, c, []))
        print(f"{'ok  ' if ok else 'FAIL'} ofasys on a800-8x8.json (held plans ahead): "
              f"{why}", flush=True)
        # a candidate beside the walk's choice wins once refined (top_choose)
        m, c = f"{pl}/clip-4/model.json", f"{cl}/a800-8x8.json"
        refine = ["--refine-within", os.environ.get("SPINDLE_TEST_REFINE", "all")]
        ok, why = case(m, c, refine, tmp, "refine")
        if ok:
            ok, why = fewer_never_faster(m, c, refine + ["--jobs", "2"], tmp)
        fails += not ok
        cases.append((m, c, refine))
        print(f"{'ok  ' if ok else 'FAIL'} clip-4 on a800-8x8.json {' '.join(refine)}: {why}",
              flush=True)
    print(f"{len(cases) - fails} of {len(cases)} cases plan alike with --jobs "
          f"{', '.join(map(str, JOBS))}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
