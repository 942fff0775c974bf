/*
 * plan.c — the planner pipeline: every pass in order, for every algorithm
 * asked for, then the certificate of the chosen plan and its verification.
 * Under --tp auto ours plans on two table sets (cost.c: the auto one and
 * whole layers, where they differ) and keeps the better plan, each set's
 * refined (layout_refine) before they are compared (plan_whole).
 * Ours simulates only the candidates that can change its choice (plan_one:
 * a sync bound of each lowered plan, bound.c), and the same plan comes out
 * as simulating them all would make (--simulate-all; tests/planner/
 * prune_exact.py). With --jobs N, worker threads (jobs.c) lower and
 * simulate ours' candidates ahead of the walk, which takes their results in
 * table order (par_start): the same plan for every N.
 * Wall-clock planning times go to the report only, never into the plan
 * (same inputs and options must give the same bytes).
 */
#include "planner.h"
#include "tp.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Planning times: with one thread (--jobs 1) the process's CPU time, its
 * wall time on an idle machine that other load does not inflate; with
 * more, the wall-clock time (CPU time would add the threads' up). */
static double now_ms(const plan_opts_t *o)
{
	struct timespec ts;
	clock_gettime(o->jobs > 1 ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Bytes sent between devices of different nodes. */
static int64_t xnode_bytes(const sp_plan_t *p)
{
	int64_t total = 0;
	int db = dtype_bytes(p->model.dtype);
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *dv = &p->devices[d];
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *in = &p->ins[dv->first_ins + k];
			if (in->op != INS_SEND || p->devices[in->peer].node == dv->node)
				continue;
			int32_t seq, width;
			plan_value_shape(p, in->src.metaop, in->src.layer, &seq, &width);
			total += (int64_t)(in->s1 - in->s0) * in->seq_len * width * db;
		}
	}
	return total;
}

/* The schedules plan_one lowered (copies on the heap), to know a
 * candidate that schedules what an earlier one did. */
typedef struct {
	sched_t *s;
	int n, cap;
} seen_t;

static void seen_release(seen_t *v)
{
	for (int i = 0; v && i < v->n; i++) {
		free(v->s[i].s);
		free(v->s[i].devs);
	}
	if (v)
		free(v->s);
}

/* 1 when a and b are the same schedule: slices (every field), devices
 * (planner.h; plan.c's candidate dedup uses it). */
int sched_same(const sched_t *a, const sched_t *b)
{
	if (a->algo != b->algo || a->n != b->n || a->n_waves != b->n_waves ||
	    a->n_devs != b->n_devs || a->bwd_eager != b->bwd_eager ||
	    (a->n_devs && memcmp(a->devs, b->devs, sizeof *a->devs * (size_t)a->n_devs)))
		return 0;
	for (int i = 0; i < a->n; i++) {
		const sslice_t *x = &a->s[i], *y = &b->s[i];
		if (x->metaop != y->metaop || x->lf != y->lf || x->lt != y->lt || x->n != y->n ||
		    x->wave != y->wave || x->t0 != y->t0 || x->t1 != y->t1 ||
		    x->chunk != y->chunk || x->dev_off != y->dev_off || x->tp != y->tp)
			return 0;
	}
	return 1;
}

static int seen_has(const seen_t *v, const sched_t *s)
{
	for (int i = 0; i < v->n; i++)
		if (sched_same(&v->s[i], s))
			return 1;
	return 0;
}

static int seen_add(seen_t *v, const sched_t *s)
{
	sched_t c = *s;
	c.arena = NULL;
	c.s = malloc(sizeof *s->s * (size_t)s->n + 1);
	c.devs = malloc(sizeof *s->devs * (size_t)s->n_devs + 1);
	if (!c.s || !c.devs || sp_grow((void **)&v->s, &v->cap, v->n + 1, sizeof *v->s)) {
		free(c.s);
		free(c.devs);
		return SP_ENOMEM;
	}
	if (s->n)
		memcpy(c.s, s->s, sizeof *s->s * (size_t)s->n);
	if (s->n_devs)
		memcpy(c.devs, s->devs, sizeof *s->devs * (size_t)s->n_devs);
	v->s[v->n++] = c;
	return 0;
}

/* schedule → placement → tensor-parallel degrees → programs → memory →
 * layouts that fit (the auto choices of zero-1 and recompute), for one
 * algorithm (ours: candidate c). With aligned (ours), also the same
 * schedule on the node-aligned renumbering of its placement (align.c) into
 * *aligned, *n_aligned 1, when that differs (0: none, or it did not lower
 * within memory). Leaves the schedule and placement in pl->scratch for the
 * caller to reset; SCHED_NOTHING_NEW passed up. The lowered plan needs
 * nothing of them: plan_simulated may run later. seen (NULL: none):
 * SCHED_NOTHING_NEW for a schedule in it, and the schedule joins it when
 * lowered. Every pass after the scheduler (the alignment included) reads
 * only the schedule and the run's constants, so a schedule seen lowers to
 * the plans lowered then. */
static int plan_lowered(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
			place_kind_t kind, seen_t *seen, sp_plan_t *out, sp_plan_t *aligned,
			int *n_aligned)
{
	sched_t s;
	place_t pc, pa;
	int rc, changed = 0;
	if (n_aligned)
		*n_aligned = 0;
	if ((rc = sched_run(pl, a, st, c, &s)))
		return rc;
	if (seen && seen_has(seen, &s))
		return SCHED_NOTHING_NEW;
	if ((rc = place_run(pl, &s, kind, &pc)) || (rc = tp_run(pl, &s, &pc)))
		return rc;
	if (aligned && kind == PLACE_SPINDLE) {
		size_t total = 0;
		for (int i = 0; i < s.n; i++)
			total += (size_t)s.s[i].n;
		pa.devs = sp_arena_calloc(&pl->scratch, total + 1, sizeof(int32_t));
		pa.off = sp_arena_calloc(&pl->scratch, (size_t)s.n + 1, sizeof(int32_t));
		if (!pa.devs || !pa.off)
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		memcpy(pa.devs, pc.devs, sizeof(int32_t) * total);
		memcpy(pa.off, pc.off, sizeof(int32_t) * (size_t)s.n);
		if ((rc = place_align(pl, &s, &pa, &changed)))
			return sp_err_set(pl->err, rc, NULL, 0, 0, NULL, "out of memory");
	}
	if ((rc = lower_run(pl, &s, &pc, out)) || (rc = memplan_run(pl, out, 0)) ||
	    (rc = layout_fit(pl, out)))
		return rc;
	if (changed) {
		if ((rc = lower_run(pl, &s, &pa, aligned)) || (rc = memplan_run(pl, aligned, 0)) ||
		    (rc = layout_fit(pl, aligned))) {
			plan_release(aligned);
			memset(aligned, 0, sizeof *aligned);
			if (rc != SP_EINFEAS)
				return rc;
			memset(pl->err, 0, sizeof *pl->err);
		} else {
			*n_aligned = 1;
		}
	}
	if (seen && seen_add(seen, &s))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return 0;
}

/* Lowered plan out → simulation (ours: sim_iteration) → zero-1 where not
 * slower (layout_trial: every algorithm's plan, so that a comparison
 * measures the schedules, not a layout only ours may choose); *over: the worst device's bytes over the cap
 * (<= 0 when the plan fits). Reads only out and the planning run's
 * constants (the cost model, the cluster), so it gives the same result
 * whenever it runs. */
static int plan_simulated(planner_t *pl, int ours, sp_plan_t *out, sim_result_t *res,
			  double *over)
{
	int rc;
	/* ours judges many: the rest of the times only for the chosen one
	 * (plan_one's sim_complete) */
	if ((rc = ours && !pl->opts->simulate_all ? sim_iteration(pl, out, res)
						  : sim_run(pl, out, 1, res)) ||
	    (rc = layout_trial(pl, out, res)))
		return rc;
	*over = -HUGE_VAL;
	for (int d = 0; d < out->n_devices; d++)
		*over = fmax(*over, (double)out->devices[d].mem_peak - pl->mem_cap);
	return 0;
}

/* The sequential plan becomes ours (the candidate that reuses it). */
static void adopt_sequential(sp_plan_t *p)
{
	snprintf(p->algo, sizeof p->algo, "%s", algo_name(ALGO_SPINDLE));
	char *opt = strstr(p->options, "algo=sequential");
	if (opt) {
		char rest[256];
		snprintf(rest, sizeof rest, "%s", opt + strlen("algo=sequential"));
		snprintf(opt, sizeof p->options - (size_t)(opt - p->options), "algo=spindle%s",
			 rest);
	}
}

/* Judges a plan (its result r, worst bytes over the cap f) against the
 * best so far (res, over; none when !found): fitting beats not fitting;
 * then faster, or closer to fitting. */
static int plan_better(int found, const sim_result_t *r, double f, const sim_result_t *res,
		       double over)
{
	int fits = f <= 0;
	if (!found)
		return 1;
	if (fits != (over <= 0))
		return fits;
	return fits ? r->iteration_ms < res->iteration_ms * (1 - 1e-9) : f < over;
}

/* plan_one's answer besides 0 and the errors, when it has a bar: no
 * candidate beats the bar (the caller keeps its plan). */
#define PLAN_NO_BETTER 3

/* The float slack of plan_better's "faster": 1 - 1e-9 of the best. */
#define FASTER (1 - 1e-9)

/* A candidate lowered and held back (plan_one): lb bounds its simulated
 * iteration (bound_sync); lbr, set where the walk has a bar (see
 * plan_walk), bounds its iteration once refined too (layout_refine); once
 * simulated, r and f are its result. */
typedef struct {
	const sched_cand_t *c;
	sp_plan_t p;
	double lb, lbr;
	int simulated, from_seq; /* from_seq: seq's plan, r and f */
	int memo; /* r and f from sim_memo: p is the lowered plan, not simulated */
	sim_result_t r;
	double f;
	/* --jobs: the candidate's jobs (NULL: none) and which variant p is:
	 * held_simulate takes the simulation a job ran ahead */
	struct par_cand *spec;
	int k;
} held_t;

/* The record of plan_one's walk: the best plan so far (none: !found). */
typedef struct {
	sp_plan_t *out;
	sim_result_t *res;
	double *over;
	const sched_cand_t **chosen;
	int *use_seq, found;
	int memo; /* the record's result came from sim_memo (held_t's memo) */
} walk_t;

/* Candidate c's simulated plan p (r, f) judged against the record. */
static void walk_judge(walk_t *w, const sched_cand_t *c, sp_plan_t *p, const sim_result_t *r,
		       double f, int from_seq, int memo)
{
	if (plan_better(w->found, r, f, w->res, *w->over)) {
		plan_release(w->out);
		*w->out = *p;
		*w->res = *r;
		*w->over = f;
		w->found = 1;
		w->memo = memo;
		if (w->chosen)
			*w->chosen = c;
		if (w->use_seq)
			*w->use_seq = from_seq;
	} else {
		plan_release(p);
	}
	memset(p, 0, sizeof *p);
}

static int par_simulated(planner_t *pl, held_t *h, int *rc);

/* Simulates held candidate h (ours) in a scope of pl->scratch, or takes
 * the result of a plan equal to it simulated before (sim_memo.c; not with
 * --simulate-all, which simulates every candidate). */
static int held_simulate(planner_t *pl, held_t *h)
{
	int spec_rc, memo = !pl->opts->simulate_all;
	sim_memo_key_t key = {0};
	if (par_simulated(pl, h, &spec_rc)) { /* a job simulated it already */
		h->simulated = !spec_rc;
		return spec_rc;
	}
	int found = memo ? sim_memo_find(pl, &h->p, &key, &h->r, &h->f) : 0;
	if (found < 0)
		return sp_err_set(pl->err, found, NULL, 0, 0, NULL, "out of memory");
	if (found) {
		h->simulated = h->memo = 1;
		return 0;
	}
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	int rc = plan_simulated(pl, 1, &h->p, &h->r, &h->f);
	sp_arena_reset(&pl->scratch, mark);
	int mrc = memo ? sim_memo_add(pl, &key, rc ? NULL : &h->r, h->f) : 0;
	if (!rc && mrc)
		rc = sp_err_set(pl->err, mrc, NULL, 0, 0, NULL, "out of memory");
	h->simulated = !rc;
	return rc;
}

/*
 * Held candidate h judged against the record (ours), simulated first
 * unless it is already, or unless the record fits and h's lb >= its
 * iteration x FASTER: then so is the simulated iteration, and plan_better
 * says no whether h fits or not (a plan that does not fit never beats one
 * that does), so the record stays as the simulation would leave it.
 */
static int walk_held(walk_t *w, planner_t *pl, held_t *h)
{
	int rc;
	if (!h->simulated && w->found && *w->over <= 0 && !pl->opts->simulate_all &&
	    h->lb >= w->res->iteration_ms * FASTER) {
		plan_release(&h->p);
		return 0;
	}
	if (!h->simulated && (rc = held_simulate(pl, h)))
		return rc;
	/* the bound the skips rest on, checked where every plan is simulated */
	if (pl->opts->simulate_all && h->c && !h->from_seq && h->lb > h->r.iteration_ms)
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "candidate '%s': sync bound %.6f ms above its simulated "
				  "iteration %.6f ms",
				  h->c->name, h->lb, h->r.iteration_ms);
	walk_judge(w, h->c, &h->p, &h->r, h->f, h->from_seq, h->memo);
	return 0;
}

/* The least iteration any held plan that fits may have: a simulated one's
 * own (those that do not fit left out), else its lb; HUGE_VAL if none. */
static double held_floor(const held_t *h, int n)
{
	double m = HUGE_VAL;
	for (int i = 0; i < n; i++)
		if (!h[i].simulated)
			m = fmin(m, h[i].lb);
		else if (h[i].f <= 0)
			m = fmin(m, h[i].r.iteration_ms);
	return m;
}

/* 1 when no held plan, once refined, beats bar (a refined result that
 * fits): each takes at least bar x FASTER refined (lbr), or is seq's
 * plan, refined already, and does not beat it. */
static int held_lose_to(const held_t *h, int n, const sim_result_t *bar)
{
	for (int i = 0; i < n; i++)
		if (h[i].from_seq ? plan_better(1, &h[i].r, h[i].f, bar, 0)
				  : h[i].lbr < bar->iteration_ms * FASTER)
			return 0;
	return 1;
}

/*
 * *out, a lower bound of plan p's iteration after layout_refine (where
 * the walk has a bar: it is compared with the bar refined). layout_refine
 * turns replicated buckets into zero-1 and simulates the sync pass again;
 * bound_sync with any_layout bounds every simulated iteration of p with
 * its buckets in either layout (bound.c), so it bounds the refined one.
 * lb is bound_sync's in the walk's own terms (any_layout: trial): the same
 * figure when the walk's lb already takes either layout, or when zero is
 * forced (layout_refine then changes nothing).
 */
static int refined_bound(planner_t *pl, const sp_plan_t *p, int trial, double lb, double *out)
{
	*out = lb;
	if (trial || pl->opts->zero >= 0)
		return 0;
	return bound_sync(pl, p, 1, out);
}

static void held_release(held_t *h, int n)
{
	for (int i = 0; i < n; i++)
		plan_release(&h[i].p);
}

/* seq, when it fits and is the table's last candidate (ours): it beats
 * every held one slower than it by the slack. NULL otherwise. */
static const sim_result_t *seq_coming_last(const planner_t *pl, const sim_result_t *seq_res,
					   double seq_over)
{
	const sched_cand_t *last = &sched_cands[n_sched_cands - 1];
	return seq_res && seq_over <= 0 && last->reuses_baseline &&
			       !(pl->opts->exclude && !strcmp(last->name, pl->opts->exclude))
		       ? seq_res
		       : NULL;
}

/* ---- ours' candidates on worker threads (--jobs N > 1) ------------------- */

/*
 * With pl->jobs, ours' walk (plan_walk) lowers and simulates no candidate
 * itself: jobs (jobs.c) do, ahead of it and on every thread, and the walk
 * takes their results in table order where it would have computed them.
 * So it makes every decision the sequential walk makes on the same
 * numbers, and chooses the same plan, byte for byte, for any thread count:
 *  - plan_lowered, bound_sync and plan_simulated read only their plan, the
 *    schedule's allotments and the run's constants (a cost memo returns the
 *    bits its caller would compute), so a job computes what the walk would;
 *  - allotments: cand_schedule computes each on first use, and the
 *    separable one is nothing new when it equals one computed before it
 *    (widths_known). A candidate's job gets exactly those the sequential
 *    walk holds at its turn (its own and those of the candidates before
 *    it), each computed once by an allotment job;
 *  - plan_lowered's seen: each job keeps its schedule, and the walk checks
 *    it against seen in table order; a schedule lowers to the same plans
 *    whenever it is lowered, so one seen already lowered as the earlier;
 *  - simulations run ahead as a guess only: a job simulates a variant
 *    unless its lb shows it cannot beat the best fitting plan simulated so
 *    far by any job (or seq coming last, or the bar) — a weaker record than
 *    the walk's, which holds the best in table order. The walk alone
 *    decides which plans are simulated: held_simulate takes a job's result
 *    where there is one and simulates the plan itself where there is none,
 *    and a job's failure counts only where the walk simulates that plan.
 * The allotments end in st as the sequential walk leaves them.
 */
typedef struct par_cand {
	struct par_walk *w;
	const sched_cand_t *c;
	int v, prio;
	unsigned need;   /* the allotments (bits) the walk holds at its turn */
	cand_state_t st; /* their widths, for its job */
	sp_job_t low, sim[2];
	int n_sim;
	seen_t sched;    /* its schedule, once lowered (plan_lowered's seen) */
	sp_plan_t p[2];
	int n_var;
	double lb[2];
	int ran[2];      /* sim[k] simulated p[k]: r[k], f[k], sim[k].rc */
	sim_result_t r[2];
	double f[2];
} par_cand_t;

typedef struct par_walk {
	jobs_t *jobs;
	int set; /* its table set (cost.c), made active on a job's thread */
	algo_t a;
	place_kind_t kind;
	int trial;
	sp_job_t allot[CAND_ALLOT__COUNT];
	int queued[CAND_ALLOT__COUNT];
	int *widths[CAND_ALLOT__COUNT]; /* the allotment jobs' results */
	par_cand_t *pc;
	double best; /* under jobs_lock: the least fitting iteration simulated */
	/* done: marked when this walk has chosen; gate (NULL: none): the
	 * previous set's, which its simulations wait for (that walk's choice
	 * is the bar this one's guesses then test against) */
	sp_job_t done;
	const sp_job_t *gate;
} par_walk_t;

_Static_assert(CAND_ALLOT__COUNT - 1 <= JOB_MAX_AFTER, "a candidate waits for every allotment");

/* The error of a job where the walk's would have been: into dst unless it
 * holds one already (sp_err_set's rule); dst's warn function stays. */
static void err_take(sp_err_t *dst, const sp_err_t *src)
{
	if (dst->code || !src->code)
		return;
	sp_err_t keep = *dst;
	*dst = *src;
	dst->warn = keep.warn;
	dst->warn_ctx = keep.warn_ctx;
}

/* The walk's table set active on a job's thread (its MetaOps). */
static void par_tables(planner_t *pl, const par_walk_t *w)
{
	if (pl->tables != w->set)
		cost_use(pl, w->set);
}

static int par_allot_run(planner_t *pl, sp_job_t *job)
{
	par_walk_t *w = job->arg;
	par_tables(pl, w);
	cand_allot_t kind = (cand_allot_t)(job - w->allot);
	cand_state_t st = {{0}};
	int rc = cand_allot(pl, &st, kind);
	w->widths[kind] = st.widths[kind]; /* NULL when it failed: each
					    * candidate's job tries again */
	return rc;
}

static int par_sim_run(planner_t *pl, sp_job_t *job)
{
	par_cand_t *pc = job->arg;
	par_walk_t *w = pc->w;
	int k = (int)(job - pc->sim), rc;
	par_tables(pl, w);
	jobs_lock(w->jobs);
	double best = w->best;
	jobs_unlock(w->jobs);
	if (!pl->opts->simulate_all && pc->lb[k] >= best * FASTER)
		return 0; /* the walk would hardly simulate it */
	rc = plan_simulated(pl, 1, &pc->p[k], &pc->r[k], &pc->f[k]);
	pc->ran[k] = 1;
	if (!rc && pc->f[k] <= 0) {
		jobs_lock(w->jobs);
		w->best = fmin(w->best, pc->r[k].iteration_ms);
		jobs_unlock(w->jobs);
	}
	return rc;
}

static int par_lower_run(planner_t *pl, sp_job_t *job)
{
	par_cand_t *pc = job->arg;
	par_walk_t *w = pc->w;
	par_tables(pl, w);
	for (int k = 0; k < CAND_ALLOT__COUNT; k++)
		if (pc->need & 1u << k)
			pc->st.widths[k] = w->widths[k];
	int rc = plan_lowered(pl, w->a, &pc->st, pc->c, w->kind, &pc->sched, &pc->p[0],
			      &pc->p[1], &pc->n_var);
	for (int k = 0; !rc && k <= pc->n_var; k++)
		rc = bound_sync(pl, &pc->p[k], w->trial, &pc->lb[k]);
	for (int k = 0; !rc && k <= pc->n_var; k++) {
		pc->sim[k] = (sp_job_t){.run = par_sim_run, .arg = pc, .prio = pc->prio + 2 + k,
					.after = {w->gate}};
		if (jobs_add(w->jobs, &pc->sim[k]))
			break; /* no guess: the walk simulates it */
		pc->n_sim = k + 1;
	}
	return rc;
}

/* Priorities: a set's jobs at prio0 + 4 x its candidates' rows; every
 * allotment job PAR_FIRST before any other. */
enum { PAR_FIRST = 1 << 20 };

/* Queues the jobs of ours' walk over the table on table set `set` (st:
 * its allotments so far; seq_res as plan_walk's): allotment, lowering and
 * (queued by the lowering) simulation jobs, in table order by priority,
 * after those of earlier sets (prio0). */
static int par_start(planner_t *pl, par_walk_t *w, int set, cand_state_t *st,
		     place_kind_t kind, const sim_result_t *seq_res, double seq_over, int prio0,
		     const sp_job_t *gate)
{
	const sim_result_t *seq_last = seq_coming_last(pl, seq_res, seq_over);
	unsigned need = 0;
	int rc;
	memset(w, 0, sizeof *w);
	w->jobs = pl->jobs;
	w->set = set;
	w->gate = gate;
	w->a = ALGO_SPINDLE;
	w->kind = kind;
	w->trial = pl->opts->zero < 0 && pl->lay_large;
	w->best = seq_last ? seq_last->iteration_ms : HUGE_VAL;
	if (!(w->pc = calloc((size_t)n_sched_cands, sizeof *w->pc)))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int k = 0; k < CAND_ALLOT__COUNT; k++)
		w->widths[k] = st->widths[k];
	for (int v = 0; v < n_sched_cands; v++) {
		par_cand_t *pc = &w->pc[v];
		const sched_cand_t *c = &sched_cands[v];
		cand_allot_t own = cand_allot_kind(pl, c);
		pc->w = w;
		pc->c = c;
		pc->v = v;
		if ((pl->opts->exclude && !strcmp(c->name, pl->opts->exclude)) ||
		    (c->reuses_baseline && seq_res))
			continue; /* as plan_walk: left out, or seq's plan */
		if (own != CAND_ALLOT_NONE && !st->widths[own] && !w->queued[own]) {
			/* every set's allotments first: the candidates wait for them */
			w->allot[own] = (sp_job_t){
				.run = par_allot_run, .arg = w, .prio = prio0 + 4 * v - PAR_FIRST};
			if ((rc = jobs_add(w->jobs, &w->allot[own])))
				return sp_err_set(pl->err, rc, NULL, 0, 0, NULL, "out of memory");
			w->queued[own] = 1;
		}
		if (own != CAND_ALLOT_NONE)
			need |= 1u << own;
		pc->need = own != CAND_ALLOT_NONE ? need : 0; /* none read, none awaited */
		pc->prio = prio0 + 4 * v;
		pc->low = (sp_job_t){.run = par_lower_run, .arg = pc, .prio = pc->prio + 1};
		for (int k = 0, n = 0; own != CAND_ALLOT_NONE && k < CAND_ALLOT__COUNT; k++)
			if ((need & 1u << k) && w->queued[k])
				pc->low.after[n++] = &w->allot[k];
		if ((rc = jobs_add(w->jobs, &pc->low)))
			return sp_err_set(pl->err, rc, NULL, 0, 0, NULL, "out of memory");
	}
	return 0;
}

/* Candidate v's lowered plans into var (lb, and the job's guesses), as
 * plan_lowered (seen) and bound_sync would have made them at the walk's
 * turn: its code, its error into pl->err. */
static int par_take(planner_t *pl, par_walk_t *w, int v, seen_t *seen, held_t var[2],
		    int *n_var)
{
	par_cand_t *pc = &w->pc[v];
	jobs_wait(w->jobs, &pc->low);
	for (int k = 0; k < pc->n_sim; k++)
		jobs_wait(w->jobs, &pc->sim[k]);
	*n_var = pc->n_var;
	for (int k = 0; k < 2; k++) {
		var[k].p = pc->p[k];
		memset(&pc->p[k], 0, sizeof pc->p[k]);
		var[k].lb = pc->lb[k];
		var[k].spec = pc;
		var[k].k = k;
	}
	if (pc->low.rc) {
		err_take(pl->err, &pc->low.err);
		return pc->low.rc;
	}
	if (seen && seen_has(seen, pc->sched.s))
		return SCHED_NOTHING_NEW;
	if (seen && seen_add(seen, pc->sched.s))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return 0;
}

/* A plan that fits, of iteration_ms, made already: the walk's jobs need
 * not simulate what cannot beat it (a guess, as w->best). */
static void par_bar(par_walk_t *w, double iteration_ms)
{
	jobs_lock(w->jobs);
	w->best = fmin(w->best, iteration_ms);
	jobs_unlock(w->jobs);
}

/* 1 when a job simulated h's plan: its result in h->r and h->f, its code
 * in *rc (its error into pl->err). */
static int par_simulated(planner_t *pl, held_t *h, int *rc)
{
	par_cand_t *pc = h->spec;
	if (!pc || !pc->ran[h->k])
		return 0;
	h->r = pc->r[h->k];
	h->f = pc->f[h->k];
	*rc = pc->sim[h->k].rc;
	if (*rc)
		err_take(pl->err, &pc->sim[h->k].err);
	return 1;
}

/* Stops the walk's jobs and frees what they hold; st gets the allotments
 * they computed (those the sequential walk computes). */
static void par_end(par_walk_t *w, cand_state_t *st)
{
	if (!w->pc)
		return;
	for (int v = 0; v < n_sched_cands; v++) {
		jobs_drop(w->jobs, &w->pc[v].low); /* then no sim job is added */
		for (int k = 0; k < w->pc[v].n_sim; k++)
			jobs_drop(w->jobs, &w->pc[v].sim[k]);
	}
	for (int k = 0; k < CAND_ALLOT__COUNT; k++)
		jobs_drop(w->jobs, &w->allot[k]);
	for (int v = 0; v < n_sched_cands; v++) {
		plan_release(&w->pc[v].p[0]);
		plan_release(&w->pc[v].p[1]);
		seen_release(&w->pc[v].sched);
	}
	for (int k = 0; k < CAND_ALLOT__COUNT; k++)
		if (!st->widths[k])
			st->widths[k] = w->widths[k];
	free(w->pc);
	w->pc = NULL;
}

/* ---- layout_refine's last trial as a job (--jobs) ------------------------- */

/*
 * With pl->jobs, layout_refine's last trial (layout_last_*: simulated on a
 * copy of the plan taken first) is a job that runs beside the trials
 * before it, and is judged after them as layout_refine judges it: the same
 * plan and result for every thread count.
 */
typedef struct {
	sp_job_t job;
	layout_last_t t;
	int tables; /* the table set it simulates on: its caller's */
	double ms;  /* the job's wall-clock time (the report's) */
} refine_last_t;

static int last_run(planner_t *pl, sp_job_t *job)
{
	refine_last_t *lt = job->arg;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	if (pl->tables != lt->tables)
		cost_use(pl, lt->tables);
	int rc = layout_last_run(pl, &lt->t);
	clock_gettime(CLOCK_MONOTONIC, &b);
	lt->ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	return rc;
}

/* lt's copy of plan p (result r, on table set `tables`) and, when
 * layout_refine tries a last trial on it, its job queued (prio). */
static int last_start(planner_t *pl, refine_last_t *lt, const sp_plan_t *p,
		      const sim_result_t *r, int tables, int prio)
{
	int rc = layout_last_init(pl, &lt->t, p, r);
	lt->tables = tables;
	if (rc || !lt->t.tried)
		return rc;
	lt->job = (sp_job_t){.run = last_run, .arg = lt, .prio = prio};
	if (jobs_add(pl->jobs, &lt->job)) {
		layout_last_release(&lt->t);
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
	return 0;
}

/* lt's job off the queue (waited for when a thread runs it: it writes
 * into lt) and its copy freed, its result unread. */
static void last_cancel(planner_t *pl, refine_last_t *lt)
{
	if (lt->t.tried)
		jobs_drop(pl->jobs, &lt->job);
	layout_last_release(&lt->t);
}

/* After layout_refine_head on p (r): the last trial's result joined
 * (layout_last_join), its job waited for, or run here (on its tables)
 * when it never ran. */
static int last_join(planner_t *pl, refine_last_t *lt, sp_plan_t *p, sim_result_t *r)
{
	int done = 0;
	if (lt->t.tried) {
		if (lt->job.state == JOB_PENDING || lt->job.state == JOB_RUNNING)
			jobs_wait(pl->jobs, &lt->job);
		done = lt->job.state == JOB_DONE;
		jobs_drop(pl->jobs, &lt->job);
		if (!done) {
			int was = pl->tables;
			if (was != lt->tables)
				cost_use(pl, lt->tables);
			sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
			layout_last_run(pl, &lt->t);
			sp_arena_reset(&pl->scratch, mark);
			if (was != lt->tables)
				cost_use(pl, was);
		}
	}
	int rc = layout_last_join(pl, &lt->t, p, r);
	if (rc && done && rc == lt->t.rc) /* the job's error */
		err_take(pl->err, &lt->job.err);
	layout_last_release(&lt->t);
	return rc;
}

/* layout_refine on p (r), its last trial a job beside the others. */
static int refine_par(planner_t *pl, sp_plan_t *p, sim_result_t *r)
{
	refine_last_t lt = {0};
	int rc = last_start(pl, &lt, p, r, pl->tables, -3 * PAR_FIRST);
	if (!rc)
		rc = layout_refine_head(pl, p, r);
	if (rc) {
		last_cancel(pl, &lt);
		return rc;
	}
	return last_join(pl, &lt, p, r);
}

/* The worst device's bytes over the memory cap. */
static double plan_over(const planner_t *pl, const sp_plan_t *p)
{
	double over = -HUGE_VAL;
	for (int d = 0; d < p->n_devices; d++)
		over = d ? fmax(over, (double)p->devices[d].mem_peak - pl->mem_cap)
			 : (double)p->devices[d].mem_peak - pl->mem_cap;
	return over;
}

/* ---- the sequential plan's layout_refine beside ours' walk (--jobs) ------ */

/*
 * layout_refine on plan p (not ours adopting seq's: its caller skips
 * that; with pl->jobs, refine_par), then *over from p's devices: zero-1
 * only frees memory, so the fit as plan_simulated takes it.
 */
static int refine_over(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	int rc = pl->jobs ? refine_par(pl, p, r) : layout_refine(pl, p, r);
	sp_arena_reset(&pl->scratch, mark);
	if (!rc && p->n_devices)
		*over = plan_over(pl, p);
	return rc;
}

/*
 * refine_over on a choice of ours' walk (plan_ours refines each table
 * set's choice before comparing them). With --simulate-all, also checks
 * the bound plan_walk prunes on against the bar (refined_bound: bound_sync
 * with either layout) against the refined iteration.
 */
static int refine_checked(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over)
{
	double lbr = 0;
	int rc = refine_over(pl, p, r, over);
	if (rc || !pl->opts->simulate_all || pl->opts->zero >= 0)
		return rc;
	if ((rc = bound_sync(pl, p, 1, &lbr)))
		return rc;
	if (lbr > r->iteration_ms)
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "sync bound %.6f ms above the refined iteration %.6f ms", lbr,
				  r->iteration_ms);
	return 0;
}

/*
 * With --jobs, the sequential plan's refinement (one more simulation of a
 * plan that puts every slice on every device: the largest of the run) is
 * a job that runs beside ours' walk instead of before it. The walk reads
 * the refined result (r, over) only where the data-parallel candidate
 * takes seq's plan (seq_wait first); before that it reads the unrefined
 * one, whose iteration and bytes over the cap are no less than the refined
 * ones (layout_refine keeps a layout only when it is faster, and zero-1
 * only frees memory). The walk uses seq's result before that only to skip
 * work: seq_coming_last's doomed test (a candidate whose lb x FASTER
 * exceeds seq's iteration) holds for the refined iteration whenever it
 * holds for the larger one, and the jobs' w->best is a guess. So the walk
 * chooses what it chooses with the refined result throughout, and the
 * sequential plan, its row and its result are those of --jobs 1, for runs
 * that succeed: before seq_wait the doomed test may skip fewer candidates
 * than --jobs 1 does, so an error inside one of those extra simulations
 * would fail only with --jobs.
 */
typedef struct seq_refine {
	sp_job_t job;   /* layout_refine_head; its last trial: last's job */
	refine_last_t last;
	sp_plan_t *p;   /* seq's plan, refined in place: read by no one else
			 * until seq_wait */
	sim_result_t r; /* in: the unrefined result; out: the refined one */
	double over, ms; /* ms: the jobs' wall-clock times (the report's) */
	int taken, rc;   /* rc: what seq_wait returned first, returned again */
} seq_refine_t;

static int seq_refine_run(planner_t *pl, sp_job_t *job)
{
	seq_refine_t *sr = job->arg;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	if (pl->tables != COST_AUTO) /* seq's plan was made on the auto tables */
		cost_use(pl, COST_AUTO);
	int rc = layout_refine_head(pl, sr->p, &sr->r);
	clock_gettime(CLOCK_MONOTONIC, &b);
	sr->ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	return rc;
}

/* seq's refinement queued: its last trial's job (on a copy of seq's plan
 * taken now), then the rest's, both first (they take longest). */
static int seq_start(planner_t *pl, seq_refine_t *sr)
{
	int rc = last_start(pl, &sr->last, sr->p, &sr->r, COST_AUTO, -3 * PAR_FIRST);
	if (rc)
		return rc;
	sr->job = (sp_job_t){.run = seq_refine_run, .arg = sr, .prio = -2 * PAR_FIRST};
	if (jobs_add(pl->jobs, &sr->job)) {
		last_cancel(pl, &sr->last);
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
	return 0;
}

/* The refined result in pl->seq_refine (NULL: nothing to wait for): once
 * its job is done, or refined here when the job never ran. */
static int seq_wait(planner_t *pl)
{
	seq_refine_t *sr = pl->seq_refine;
	if (!sr)
		return 0;
	if (sr->taken)
		return sr->rc;
	sr->taken = 1;
	if (sr->job.state == JOB_PENDING || sr->job.state == JOB_RUNNING)
		jobs_wait(pl->jobs, &sr->job);
	int done = sr->job.state == JOB_DONE;
	/* off the queue: sr lives in run_algos' frame, and jobs_clear (at
	 * jobs_free) reads every job still queued */
	if (pl->jobs)
		jobs_drop(pl->jobs, &sr->job);
	if (!done) { /* never queued, or dropped: here, on the auto tables */
		int was = pl->tables;
		if (was != COST_AUTO)
			cost_use(pl, COST_AUTO);
		sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
		sr->rc = layout_refine_head(pl, sr->p, &sr->r);
		sp_arena_reset(&pl->scratch, mark);
		if (was != COST_AUTO)
			cost_use(pl, was);
	} else {
		err_take(pl->err, &sr->job.err);
		sr->rc = sr->job.rc;
	}
	if (sr->rc) {
		last_cancel(pl, &sr->last);
	} else {
		sr->rc = last_join(pl, &sr->last, sr->p, &sr->r);
		sr->ms += sr->last.ms;
	}
	if (!sr->rc && sr->p->n_devices)
		sr->over = plan_over(pl, sr->p);
	return sr->rc;
}

/* Ours failed: the refinement in pl->seq_refine (NULL: none) is not
 * wanted. Taken off the queue without running it, here or on the caller's
 * thread (jobs_wait would run it, and other queued jobs, while it waits);
 * waited for only when a thread runs it already (it writes into sr, in
 * run_algos' frame). Its result and error are left unread. */
static void seq_cancel(planner_t *pl)
{
	seq_refine_t *sr = pl->seq_refine;
	if (!sr || sr->taken)
		return;
	sr->taken = 1;
	if (pl->jobs) {
		jobs_drop(pl->jobs, &sr->job);
		last_cancel(pl, &sr->last);
	}
}

/*
 * One algorithm; for ours, every candidate of the table (but the one
 * o->exclude names), judged by the simulator: the fastest plan that fits
 * memory, or if none fits the one that comes closest (the error message
 * then says what that one lacks). A candidate that reuses the sequential
 * plan takes the one made already (seq) when there is one: when that one
 * wins, *use_seq is set and out is left empty for the caller to take seq.
 * *over is the chosen plan's worst device's bytes over the memory cap
 * (<= 0: it fits). Each candidate's temporaries are freed (pl->scratch
 * reset) once it is judged. bar (NULL: none), a refined result
 * (layout_refine) that fits: the caller refines this walk's choice and
 * keeps its own plan unless plan_better says the refined choice beats
 * bar; PLAN_NO_BETTER when that is known not to happen. The walk chooses
 * on unrefined results (as without a bar), so a candidate whose unrefined
 * iteration is above the bar may still refine to below it: the bar prunes
 * only on lbr (refined_bound), which bounds the refined iteration, never
 * on an unrefined result (but seq's, which is refined).
 *
 * Ours simulates only what can change the choice, and chooses what
 * simulating every candidate and judging them in table order would (the
 * walk). plan_simulated reads only the lowered plan and the run's
 * constants, so a plan simulated later, or never, is what it would have
 * been at its turn. Every lowered plan gets lb, a lower bound of its
 * simulated iteration (bound_sync). Once the walk has a record, a
 * candidate is simulated unless lb shows it cannot beat it (walk_held).
 * Before that (the first candidates) they are held: the walk's record is
 * then one of the held ones, unknown, and each of them, if it fits, takes
 * at least held_floor. A candidate that fits and is faster than the floor
 * by plan_better's slack beats whichever one that is (and one that does
 * not fit loses to it): it becomes the record and the held ones never
 * matter again. Only a candidate whose lb leaves that possible is
 * simulated to find out, and not one that is doomed anyway: one that seq,
 * when it fits and comes last, beats (lb x FASTER > seq's iteration), or
 * that cannot beat the bar (lb >= bar x FASTER); the others are held too.
 * So when seq comes and beats them all it is the record (as above); with a bar, if the held
 * ones are left at the end and none can beat it (held_lose_to), neither
 * can the record among them: PLAN_NO_BETTER, as the caller would have
 * concluded from the walk. Otherwise the held ones are judged in table
 * order as the walk would have (walk_held). The sequential plan (seq, the
 * last candidate) is one more candidate, simulated already. A simulator
 * failure (out of memory, an internal error) of a plan that is never
 * simulated goes unseen.
 */
static int plan_walk(planner_t *pl, algo_t a, cand_state_t *st, place_kind_t kind,
		     sp_plan_t *out, sim_result_t *res, double *over, const sched_cand_t **chosen,
		     const sim_result_t *seq_res, double seq_over, int *use_seq,
		     const sim_result_t *bar, seen_t *seen, par_walk_t *par)
{
	int nc = a == ALGO_SPINDLE ? n_sched_cands : 1, rc = 0, n_held = 0;
	int ours = a == ALGO_SPINDLE, trial = pl->opts->zero < 0 && pl->lay_large;
	held_t *held = sp_arena_calloc(&pl->arena, 2 * (size_t)nc, sizeof *held);
	walk_t w = {.out = out, .res = res, .over = over, .chosen = chosen, .use_seq = use_seq};
	const sim_result_t *seq_last = ours ? seq_coming_last(pl, seq_res, seq_over) : NULL;
	memset(out, 0, sizeof *out);
	if (use_seq)
		*use_seq = 0;
	if (!held)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int v = 0; v < nc; v++) {
		const sched_cand_t *c = ours ? &sched_cands[v] : NULL;
		int from_seq = c && c->reuses_baseline && seq_res, n_var = 0;
		/* the candidate's plan and (ours) its node-aligned variant */
		held_t var[2] = {{.c = c, .from_seq = from_seq}, {.c = c}};
		if (c && pl->opts->exclude && !strcmp(c->name, pl->opts->exclude))
			continue;
		sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
		if (from_seq) {
			/* seq's result is refined (layout_refine, seq_refine_t),
			 * ours' other candidates are not until one is chosen
			 * (plan_ours refines the choice): the walk weighs
			 * unrefined plans against refined seq, so it may adopt
			 * seq where a refined candidate of ours would have won.
			 * A bias against ours, never a wrong result: each plan
			 * is judged by its own simulation. Kept: refining
			 * every candidate costs a simulation per layout tried */
			if ((rc = seq_wait(pl)))
				goto fail;
			var[0].r = pl->seq_refine ? pl->seq_refine->r : *seq_res;
			var[0].f = pl->seq_refine ? pl->seq_refine->over : seq_over;
			var[0].simulated = 1;
		} else if (par) {
			rc = par_take(pl, par, v, seen, var, &n_var);
		} else {
			rc = plan_lowered(pl, a, st, c, kind, seen, &var[0].p,
					  ours ? &var[1].p : NULL, &n_var);
			for (int k = 0; !rc && ours && k <= n_var; k++)
				rc = bound_sync(pl, &var[k].p, trial, &var[k].lb);
		}
		sp_arena_reset(&pl->scratch, mark);
		for (int k = 0; !rc && ours && bar && !from_seq && k <= n_var; k++)
			rc = refined_bound(pl, &var[k].p, trial, var[k].lb, &var[k].lbr);
		/* a held plan would have been the record: the walk has found one */
		if (rc == SCHED_NOTHING_NEW ||
		    (rc == SP_EINFEAS && (v + 1 < nc || w.found || n_held))) {
			/* nothing new, or no schedule in memory: others may have one */
			plan_release(&var[0].p);
			plan_release(&var[1].p);
			memset(pl->err, 0, sizeof *pl->err);
			continue;
		}
		/* in table order, the original first: on a tie it stays */
		for (int k = 0; k <= n_var; k++) {
			held_t y = var[k];
			memset(&var[k].p, 0, sizeof var[k].p);
			if (!rc && !ours) {
				mark = sp_arena_mark(&pl->scratch);
				rc = plan_simulated(pl, 0, &y.p, &y.r, &y.f);
				sp_arena_reset(&pl->scratch, mark);
				y.simulated = 1;
			}
			if (rc) {
				plan_release(&y.p);
				held_release(var, 2);
				goto fail;
			}
			if (!ours || w.found || pl->opts->simulate_all) {
				if ((rc = walk_held(&w, pl, &y))) {
					plan_release(&y.p);
					held_release(var, 2);
					goto fail;
				}
				continue;
			}
			/* no record yet: the first is held; one that may beat every
			 * held one is simulated, and if it does, it is the record; not
			 * one that loses to seq coming last, or to the bar, anyway */
			double floor = held_floor(held, n_held);
			int doomed = (seq_last && y.lb * FASTER > seq_last->iteration_ms) ||
				     (bar && y.lbr >= bar->iteration_ms * FASTER);
			if (n_held && !y.simulated && !doomed && y.lb < floor * FASTER &&
			    (rc = held_simulate(pl, &y))) {
				plan_release(&y.p);
				held_release(var, 2);
				goto fail;
			}
			if (n_held && y.simulated && y.f <= 0 && y.r.iteration_ms < floor * FASTER) {
				held_release(held, n_held);
				n_held = 0;
				walk_judge(&w, c, &y.p, &y.r, y.f, y.from_seq, y.memo);
				continue;
			}
			held[n_held++] = y;
		}
	}
	if (n_held && bar && held_lose_to(held, n_held, bar)) {
		held_release(held, n_held);
		return PLAN_NO_BETTER; /* every candidate loses to the bar */
	}
	for (int h = 0; h < n_held; h++) {
		if ((rc = walk_held(&w, pl, &held[h]))) {
			held_release(held + h, n_held - h);
			plan_release(out);
			return rc;
		}
	}
	/* a choice that cannot beat the bar even refined is dropped by the
	 * caller as it is: its other times are never read (seq's is refined:
	 * plan_better reads the iteration and the fit, which it has) */
	if (w.found && bar) {
		double lbr = 0;
		if ((use_seq && *use_seq) || pl->opts->zero >= 0) /* refined as it is */
			lbr = plan_better(1, res, *over, bar, 0) ? 0 : HUGE_VAL;
		else if ((rc = refined_bound(pl, out, 0, 0, &lbr))) {
			plan_release(out);
			return rc;
		}
		if (lbr >= bar->iteration_ms * FASTER) {
			plan_release(out);
			return PLAN_NO_BETTER;
		}
	}
	if (w.found && w.memo) { /* the chosen plan as its simulation leaves it */
		sim_result_t r;
		double f;
		sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
		rc = plan_simulated(pl, 1, out, &r, &f);
		sp_arena_reset(&pl->scratch, mark);
		if (!rc && (r.iteration_ms != res->iteration_ms || f != *over))
			rc = sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					"the chosen plan simulates to %.6f ms, its equal "
					"simulated earlier to %.6f ms",
					r.iteration_ms, res->iteration_ms);
		if (rc) {
			plan_release(out);
			return rc;
		}
		*res = r;
	}
	if (w.found && res->partial) { /* the chosen plan's other times */
		sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
		rc = sim_complete(pl, out, res);
		sp_arena_reset(&pl->scratch, mark);
		if (rc) {
			plan_release(out);
			return rc;
		}
	}
	if (!w.found) /* every candidate left out or adding nothing */
		return sp_err_set(pl->err, SP_EINFEAS, NULL, 0, 0, NULL,
				  "%s: no candidate made a schedule", algo_name(a));
	return 0;
fail:
	held_release(held, n_held);
	plan_release(out);
	return rc;
}

/* plan_walk, where ours skips a candidate that schedules what an earlier
 * one did (plan_lowered's seen): it would lower and simulate to that one's
 * plan and result, and so never be chosen (plan_better is strict, and the
 * record only gets better: a plan no better than a record is no better
 * than a later one); the walk goes on as without it, the earlier one
 * standing for both. Not with --simulate-all, which simulates them all. */
static int plan_one(planner_t *pl, algo_t a, cand_state_t *st, place_kind_t kind,
		    sp_plan_t *out, sim_result_t *res, double *over, const sched_cand_t **chosen,
		    const sim_result_t *seq_res, double seq_over, int *use_seq,
		    const sim_result_t *bar, par_walk_t *par)
{
	seen_t seen = {0};
	int dedup = a == ALGO_SPINDLE && !pl->opts->simulate_all;
	int rc = plan_walk(pl, a, st, kind, out, res, over, chosen, seq_res, seq_over, use_seq,
			   bar, dedup ? &seen : NULL, par && par->pc ? par : NULL);
	seen_release(&seen);
	return rc;
}

/*
 * Model FLOPs utilisation of an iteration of iteration_ms on n_dev devices:
 * the model's FLOPs of one iteration / (devices x peak FLOP/s x time). The
 * FLOPs are inspect_model's (model.h arithmetic): forward and backward of
 * every layer of every task at its batch (k_t micro-batches: k_t times the
 * micro-batch pl->model holds), once each; no recomputation, no
 * communication, no optimizer step, so the figure does not reward work a
 * plan adds.
 */
static double mfu(const planner_t *pl, double iteration_ms)
{
	const sp_model_t *m = pl->model;
	double peak = (double)pl->N * pl->cluster->peak_tflops * 1e12;
	int64_t flops = 0;
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		int64_t f = 0;
		for (int i = 0; i < t->n_nodes; i++) {
			inspect_node_t n;
			inspect_node(&n, m, t, &t->nodes[i]);
			f += (n.fwd_flops + n.bwd_flops) * t->batch;
		}
		flops += f * (t->microbatches > 0 ? t->microbatches : pl->k);
	}
	return iteration_ms > 0 ? (double)flops / (peak * iteration_ms * 1e-3) : 0;
}

/* Algorithm a's row of the summary; the figures the plan file does not
 * hold (sync, transfers, MFU) go to sum->extra. */
static void record_algo(const planner_t *pl, plan_summary_t *sum, algo_t a,
			const sim_result_t *r, double over, double planning_ms)
{
	sp_algo_result_t *ar = &sum->algos[a];
	snprintf(ar->name, sizeof ar->name, "%s", algo_name(a));
	ar->iteration_ms = r->iteration_ms;
	ar->compute_ms = r->compute_ms;
	ar->utilisation = r->utilisation;
	ar->planning_ms = planning_ms;
	ar->fits_memory = over <= 0;
	sum->extra[a] = (algo_extra_t){.sync_ms = r->sync_ms, .transfer_ms = r->transfer_ms,
				       .mfu = mfu(pl, r->iteration_ms)};
	sum->ran[a] = 1;
}

/* *same = 1 when the sequential algorithm schedules the same slices
 * (MetaOp, layers, width, degree, wave, in order) on the auto tables and
 * on set `set`: then its plan on the auto tables simulates as the other
 * set's (one slice after another either way, so placement decides alike;
 * the nominal times differ only in the slices' reported start and
 * length). Leaves the auto tables active. */
static int seq_same(planner_t *pl, int set, int *same)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	sched_t a, w;
	int rc;
	*same = 0;
	cost_use(pl, set);
	rc = sched_run(pl, ALGO_SEQUENTIAL, NULL, NULL, &w);
	cost_use(pl, COST_AUTO);
	if (!rc && !(rc = sched_run(pl, ALGO_SEQUENTIAL, NULL, NULL, &a)) && a.n == w.n) {
		*same = 1;
		for (int i = 0; i < a.n && *same; i++) {
			const sslice_t *x = &a.s[i], *y = &w.s[i];
			*same = x->metaop == y->metaop && x->lf == y->lf && x->lt == y->lt &&
				x->n == y->n && SP_MAX(x->tp, 1) == SP_MAX(y->tp, 1) &&
				x->wave == y->wave && x->chunk == y->chunk;
		}
	}
	sp_arena_reset(&pl->scratch, mark);
	return rc;
}

/*
 * Ours on table set `alt` (COST_WHOLE: pl->has_whole, --tp auto and the
 * whole-layer tables differ from the auto ones; COST_VOCAB_WHOLE:
 * pl->has_vocab_whole, the same with embeddings and LM heads whole),
 * after its plan p so far (rc its code; refined: layout_refine), refined
 * too: the better of the two refined plans by plan_one's judge goes to p,
 * r, over, *chosen and *use_seq, *set its table set. Whole layers are
 * exactly what --tp 1 plans (its walk, then layout_refine on its choice,
 * as run_algos refines every algorithm's), the other set what --tp-vocab
 * whole plans, so auto never loses to them: the walk prunes against the
 * refined bar only what cannot beat it refined (plan_walk). The
 * data-parallel candidate reuses the sequential plan (seq_res, seq_over;
 * NULL: none) where seq_same says it is the one on `alt` (same, the
 * caller's), else plans afresh. par: the walk's jobs (NULL: none). Leaves
 * the auto tables active.
 */
static int plan_whole(planner_t *pl, cand_state_t *cands, int alt, int rc, sp_plan_t *p,
		      sim_result_t *r, double *over, const sched_cand_t **chosen, int *use_seq,
		      int *set, const sim_result_t *seq_res, double seq_over, int same,
		      par_walk_t *par)
{
	sp_plan_t w = {0};
	sim_result_t wr = {0};
	double wo = 0;
	const sched_cand_t *wc = NULL;
	sp_err_t keep = *pl->err;
	int wseq = 0;
	if (rc && rc != SP_EINFEAS)
		return rc;
	memset(pl->err, 0, sizeof *pl->err);
	pl->err->warn = keep.warn;
	pl->err->warn_ctx = keep.warn_ctx;
	/* the plan so far, when it fits, is the bar the other one must beat */
	cost_use(pl, alt);
	int wrc = plan_one(pl, ALGO_SPINDLE, &cands[alt], pl->opts->placement, &w, &wr,
			   &wo, &wc, same ? seq_res : NULL, seq_over, &wseq,
			   !rc && *over <= 0 ? r : NULL, par);
	cost_use(pl, COST_AUTO);
	if (!wrc && !wseq) /* seq's is refined already */
		wrc = refine_checked(pl, &w, &wr, &wo);
	if (wrc == PLAN_NO_BETTER) { /* as when the whole-layer plan loses below */
		plan_release(&w);
		*pl->err = keep;
		return rc;
	}
	if (wrc && (wrc != SP_EINFEAS || rc)) {
		plan_release(&w);
		if (wrc == SP_EINFEAS) /* neither made a plan: the auto one's reason */
			*pl->err = keep;
		return wrc;
	}
	if (wrc || !plan_better(!rc, &wr, wo, r, *over)) {
		plan_release(&w);
		*pl->err = keep;
		return rc;
	}
	plan_release(p);
	*p = w;
	*r = wr;
	*over = wo;
	if (chosen)
		*chosen = wc;
	*use_seq = wseq;
	*set = alt;
	return 0;
}

/*
 * Ours: plan_one on the auto tables, then plan_whole on each other table
 * set cost_build made. With pl->jobs, the jobs of every set's walk are
 * queued at once (a later set's candidates start while an earlier walk
 * still takes its results), and each walk takes its own; par (the
 * caller's): the walks, the auto set's maybe queued already (early_start).
 */
static int plan_ours(planner_t *pl, cand_state_t *cands, sp_plan_t *p, sim_result_t *r,
		     double *over, const sched_cand_t **chosen, int *use_seq, int *set,
		     const sim_result_t *seq_res, double seq_over, par_walk_t par[COST__SETS])
{
	const int has[COST__SETS] = {[COST_AUTO] = 1,
				     [COST_WHOLE] = pl->has_whole,
				     [COST_VOCAB_WHOLE] = pl->has_vocab_whole};
	int same[COST__SETS] = {0}, rc = 0, prev = -1;
	for (int t = 0; t < COST__SETS; t++)
		if (t != COST_AUTO && has[t] && seq_res && (rc = seq_same(pl, t, &same[t])))
			return rc;
	if (pl->jobs && !par[COST_AUTO].pc) /* else synced before seq's plan (run_algos) */
		jobs_sync(pl->jobs, pl);
	if (pl->jobs && pl->seq_refine && (rc = seq_start(pl, pl->seq_refine)))
		return rc; /* first: it takes longest */
	for (int t = 0; pl->jobs && t < COST__SETS && !rc; t++)
		if (has[t] && par[t].pc) { /* started early (run_algos) */
			prev = t;
		} else if (has[t]) {
			rc = par_start(pl, &par[t], t, &cands[t], pl->opts->placement,
				       t == COST_AUTO || same[t] ? seq_res : NULL, seq_over,
				       1000 * t, prev < 0 ? NULL : &par[prev].done);
			prev = t;
		}
	for (int t = 0; t < COST__SETS; t++) {
		if (!has[t])
			continue;
		if (t == COST_AUTO && !rc) {
			rc = plan_one(pl, ALGO_SPINDLE, &cands[t], pl->opts->placement, p, r, over,
				      chosen, seq_res, seq_over, use_seq, NULL, &par[t]);
			if (!rc && !*use_seq) /* seq's is refined already */
				rc = refine_checked(pl, p, r, over);
		}
		else if (t != COST_AUTO)
			rc = plan_whole(pl, cands, t, rc, p, r, over, chosen, use_seq, set, seq_res,
					seq_over, same[t], &par[t]);
		/* the plan so far is the later walks' bar: their guesses' too */
		for (int u = t + 1; pl->jobs && !rc && *over <= 0 && u < COST__SETS; u++)
			if (par[u].pc)
				par_bar(&par[u], r->iteration_ms);
		if (par[t].pc)
			jobs_mark_done(pl->jobs, &par[t].done);
	}
	for (int t = 0; t < COST__SETS; t++)
		par_end(&par[t], &cands[t]);
	return rc;
}

/*
 * With threads (and seq's plan kept for ours: o->algo is not sequential),
 * the jobs of ours' walk on the auto tables are queued before seq's plan is
 * made, so its allotments and lowerings run beside it. They read nothing
 * of seq's: par_start reads seq's result only for whether the data-parallel
 * candidate takes seq's plan (it does: seq_res is set whenever ours runs,
 * or the run has failed) and for the jobs' first guess of the record
 * (w->best, HUGE_VAL here until early_seq_made); the walk itself starts
 * after seq's plan, as without this. The simulation jobs wait for
 * seq_made, marked once seq's plan is made, so they skip what seq dooms as
 * before. The threads' planners are synced here, before anything is
 * queued: seq's plan changes none of the state thread_copy takes (its
 * tables stay the auto ones; a job makes its own set active), so
 * plan_ours' sync is skipped then.
 */
static int early_start(planner_t *pl, par_walk_t par[COST__SETS], cand_state_t *st,
		       const sim_result_t *seq_res, sp_job_t *seq_made)
{
	jobs_sync(pl->jobs, pl);
	return par_start(pl, &par[COST_AUTO], COST_AUTO, st, pl->opts->placement, seq_res,
			 HUGE_VAL, 0, seq_made);
}

/* Seq's plan is made: the early walk's first guess as par_start would have
 * set it, then its simulations may start. */
static void early_seq_made(planner_t *pl, par_walk_t *w, const sim_result_t *seq_res,
			   double seq_over, sp_job_t *seq_made)
{
	const sim_result_t *seq_last = seq_coming_last(pl, seq_res, seq_over);
	if (seq_last)
		par_bar(w, seq_last->iteration_ms);
	jobs_mark_done(pl->jobs, seq_made);
}

/*
 * Every algorithm asked for: the chosen one (o->algo), the sequential one
 * (ours may reuse its plan), and all of them with --compare. Each gets its
 * row in sum; the chosen one's plan goes to out, its simulated result to
 * *chosen_res and, for ours, its candidate to *chosen_cand and its table
 * set to *chosen_set (cands: the candidates' state per table set); the
 * chosen one's tables are left active.
 */
static int run_algos(planner_t *pl, cand_state_t *cands, sp_plan_t *out,
		     sim_result_t *chosen_res, const sched_cand_t **chosen_cand,
		     int *chosen_set, plan_summary_t *sum)
{
	const plan_opts_t *o = pl->opts;
	int want[ALGO__COUNT] = {0};
	for (int a = 0; a < ALGO__COUNT; a++)
		want[a] = o->compare;
	want[o->algo] = 1;
	want[ALGO_SEQUENTIAL] = 1;
	/* sequential first: ours reuses it (the candidate data-parallel) */
	static const algo_t run_order[ALGO__COUNT] = {ALGO_SEQUENTIAL, ALGO_SPINDLE, ALGO_PAPER,
						      ALGO_TASK_LEVEL, ALGO_DISTMM,
						      ALGO_SEQUENTIAL_PAPER};
	sp_plan_t seq_plan = {0};
	sim_result_t seq_res = {0};
	double seq_over = 0, seq_ms = 0;
	int have_seq = 0;
	seq_refine_t sr = {0};
	par_walk_t par[COST__SETS] = {{0}};
	sp_job_t seq_made = {0};
	pl->seq_refine = NULL;
	/* with threads, ours' walk on the auto tables starts before seq's plan
	 * is made (see early_start) */
	if (pl->jobs && want[ALGO_SPINDLE] && o->algo != ALGO_SEQUENTIAL) {
		int rc = early_start(pl, par, &cands[COST_AUTO], &seq_res, &seq_made);
		if (rc) {
			par_end(&par[COST_AUTO], &cands[COST_AUTO]);
			return rc;
		}
	}
	for (int ai = 0; ai < ALGO__COUNT; ai++) {
		int a = run_order[ai];
		if (!want[a])
			continue;
		sp_plan_t p = {0};
		sim_result_t r = {0};
		double over = 0, t0 = now_ms(o);
		int use_seq = 0, mine = a == (int)o->algo, set = COST_AUTO;
		int rc = a == ALGO_SPINDLE
				 ? plan_ours(pl, cands, &p, &r, &over, mine ? chosen_cand : NULL,
					     &use_seq, &set, have_seq ? &seq_res : NULL, seq_over, par)
				 : plan_one(pl, (algo_t)a, &cands[COST_AUTO], o->placement, &p, &r,
					    &over, mine ? chosen_cand : NULL,
					    have_seq ? &seq_res : NULL, seq_over, &use_seq, NULL, NULL);
		/* seq's kept for ours, with threads: refined beside ours' walk */
		int later = !rc && a == ALGO_SEQUENTIAL && a != (int)o->algo && pl->jobs &&
			    want[ALGO_SPINDLE];
		/* ours adopting seq's: refined as seq's; ours' refined by plan_ours */
		if (!rc && !use_seq && !later && a != ALGO_SPINDLE)
			rc = refine_over(pl, &p, &r, &over);
		if (a == ALGO_SPINDLE && pl->seq_refine && rc) {
			seq_cancel(pl); /* the run fails: seq's plan is not read */
			pl->seq_refine = NULL;
		} else if (a == ALGO_SPINDLE && pl->seq_refine) {
			int wrc = seq_wait(pl); /* before anything reads seq's plan */
			rc = rc ? rc : wrc;
			seq_res = sr.r;
			seq_over = sr.over;
			pl->seq_refine = NULL;
			if (!wrc)
				record_algo(pl, sum, ALGO_SEQUENTIAL, &seq_res, seq_over,
					    seq_ms + sr.ms);
		}
		double t1 = now_ms(o);
		if (rc) {
			for (int t = 0; t < COST__SETS; t++)
				par_end(&par[t], &cands[t]);
			plan_release(&p);
			plan_release(&seq_plan);
			return rc;
		}
		if (later) {
			seq_ms = t1 - t0;
			sr.r = r;
			sr.over = over;
		} else {
			record_algo(pl, sum, (algo_t)a, &r, over, t1 - t0);
		}
		if (use_seq) { /* ours is the sequential plan */
			p = seq_plan;
			memset(&seq_plan, 0, sizeof seq_plan);
			adopt_sequential(&p);
		}
		if (a == ALGO_SEQUENTIAL && a != (int)o->algo) {
			seq_plan = p; /* kept for ours */
			seq_res = r;
			seq_over = over;
			have_seq = 1;
			if (later) {
				sr.p = &seq_plan;
				pl->seq_refine = &sr;
			}
			if (par[COST_AUTO].pc)
				early_seq_made(pl, &par[COST_AUTO], &seq_res, seq_over, &seq_made);
		} else if (mine) {
			*out = p;
			*chosen_res = r;
			*chosen_set = set;
		} else {
			plan_release(&p);
		}
	}
	plan_release(&seq_plan);
	sum->chosen = o->algo;
	cost_use(pl, *chosen_set);
	return 0;
}

/* The certificate of plan p: its simulated times (res) beside the lower
 * bounds, and the bytes it sends between nodes (the naive placement's
 * figures come later, from naive_compare). */
static void write_cert(sp_plan_t *p, const sim_result_t *res, const bounds_t *b)
{
	p->cert = (sp_cert_t){
		.iteration_ms = res->iteration_ms,
		.compute_ms = res->compute_ms,
		.transfer_ms = res->transfer_ms,
		.sync_ms = res->sync_ms,
		.area_bound_ms = b->area_ms,
		.cp_bound_ms = b->cp_ms,
		.paper_bound_ms = b->paper_ms,
		.lower_bound_ms = b->lower_ms,
		.allot_bound_ms = b->allot_ms,
		.gap = b->lower_ms > 0 ? res->compute_ms / b->lower_ms - 1 : 0,
		.xnode_bytes = xnode_bytes(p),
		.xfer_pred_ms = res->transfer_ms,
	};
}

/* The certificate's comparison: the same schedule (candidate c of the
 * chosen algorithm) placed naively, its bytes between nodes and transfer
 * time. */
static int naive_compare(planner_t *pl, cand_state_t *cands, const sched_cand_t *c,
			 sp_cert_t *ct)
{
	sp_plan_t naive = {0};
	sim_result_t nr = {0};
	/* its transfers do not depend on bucket layouts: no zero-1 trial, and
	 * of the simulation only the passes that time compute and transfers */
	int rc = plan_lowered(pl, pl->opts->algo, cands, c, PLACE_NAIVE, NULL, &naive, NULL,
			      NULL);
	if (!rc)
		rc = sim_transfers(pl, &naive, &nr);
	if (!rc) {
		ct->naive_xnode_bytes = xnode_bytes(&naive);
		ct->naive_xfer_pred_ms = nr.transfer_ms;
	}
	plan_release(&naive);
	return rc;
}

/* The plan's table of the algorithms that ran, without their planning
 * times (not deterministic). */
static int algo_table(sp_plan_t *p, const plan_summary_t *sum, sp_err_t *err)
{
	p->n_algos = 0;
	p->algos = calloc(ALGO__COUNT, sizeof *p->algos);
	if (!p->algos)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int a = 0; a < ALGO__COUNT; a++)
		if (sum->ran[a]) {
			p->algos[p->n_algos] = sum->algos[a];
			p->algos[p->n_algos].planning_ms = 0;
			p->n_algos++;
		}
	return 0;
}

/* The planning run for k micro-batches: m holds the micro-batch already. */
static int plan_micro(const plan_opts_t *o, const sp_model_t *m, int k, const sp_cluster_t *c,
		      sp_plan_t *out, plan_summary_t *sum, sp_err_t *err)
{
	planner_t pl = {.model = m, .cluster = c, .opts = o, .err = err, .k = k};
	sim_result_t chosen_res = {0};
	const sched_cand_t *chosen_cand = NULL;
	/* our allotments, shared by the candidates, per table set */
	cand_state_t cands[COST__SETS] = {{{0}}};
	int rc = 0, chosen_set = COST_AUTO;
	double t_start = now_ms(o);
	memset(out, 0, sizeof *out);
	memset(sum, 0, sizeof *sum);
	sp_arena_init(&pl.arena);
	sp_arena_init(&pl.scratch);
	pl.N = c->nodes * c->gpus_per_node;
	pl.mem_cap = (c->memory_gib - o->mem_reserve_gib) * 1024.0 * 1024.0 * 1024.0;
	if (pl.mem_cap <= 0) {
		rc = sp_err_set(err, SP_EINPUT, o->cluster_path, 0, 0, "gpu.memory_gib",
				"%.1f GiB of memory leaves nothing after the %.1f GiB reserve",
				c->memory_gib, o->mem_reserve_gib);
		sp_err_hint(err, "lower --mem-reserve");
		goto cleanup;
	}
	/* model → MetaOps → costs → layout estimates → bounds */
	if ((rc = graph_build(&pl)) || (rc = cost_build(&pl)) || (rc = layout_prepare(&pl)))
		goto cleanup;
	/* K micro-steps one after another, each a pass over its tasks: the
	 * bounds of each distinct set of active tasks, times its micro-steps */
	for (int j = 0, next; j < k; j = next) {
		bounds_t bj, *b = &sum->bounds;
		next = plan_micro_next(m, k, j);
		pl.micro = j;
		bound_compute(&pl, &bj);
		b->area_ms += bj.area_ms * (next - j);
		b->cp_ms += bj.cp_ms * (next - j);
		b->paper_ms += bj.paper_ms * (next - j);
		b->lower_ms += bj.lower_ms * (next - j);
		b->allot_ms += bj.allot_ms * (next - j);
	}
	pl.micro = 0;
	if ((rc = bound_comm_any(&pl, &sum->bounds.comm_any_ms))) {
		rc = sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	/* ours' candidates on o->jobs threads in all (jobs.c) */
	if (o->jobs > 1 && (o->algo == ALGO_SPINDLE || o->compare) &&
	    (rc = jobs_start(&pl.jobs, &pl, SP_MIN(o->jobs, n_sched_cands), err)))
		goto cleanup;
	/* every algorithm asked for; the chosen plan's final memory, verified */
	if ((rc = run_algos(&pl, cands, out, &chosen_res, &chosen_cand, &chosen_set, sum)))
		goto cleanup;
	/* --zero auto: the chosen schedule with its large components in zero-3,
	 * kept when faster or when only it fits (the algorithm's row follows) */
	if ((rc = layout_zero3(&pl, out, &chosen_res)) < 0)
		goto cleanup;
	if (rc) {
		double over = -HUGE_VAL, ms = sum->algos[o->algo].planning_ms;
		for (int d = 0; d < out->n_devices; d++)
			over = fmax(over, (double)out->devices[d].mem_peak - pl.mem_cap);
		record_algo(&pl, sum, o->algo, &chosen_res, over, ms);
	}
	if ((rc = memplan_run(&pl, out, 1))) {
		if (rc == SP_EINFEAS) /* nothing fits: what would */
			rc = layout_advise(&pl, out);
		goto cleanup;
	}
	if ((rc = layout_forced_check(&pl, out)) || (rc = verify_plan(out, pl.mem_cap, err)))
		goto cleanup;
	write_cert(out, &chosen_res, &sum->bounds);
	sum->mb_earlier_ms = chosen_res.xfer_iteration_ms - chosen_res.xfer_last_ms;
	if (bound_comm(&sum->bounds.comm_ms, out, c)) {
		rc = sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	out->cert.comm_lower_bound_ms = sum->bounds.comm_ms;
	if ((rc = naive_compare(&pl, &cands[chosen_set], chosen_cand, &out->cert)) ||
	    (rc = algo_table(out, sum, err)))
		goto cleanup;
	sum->total_ms = now_ms(o) - t_start;
cleanup:
	jobs_free(pl.jobs); /* the allotments in its arenas are read last above */
	sim_memo_release(&pl);
	sp_arena_release(&pl.scratch);
	sp_arena_release(&pl.arena);
	if (rc)
		plan_release(out);
	return rc;
}

/* ---- micro-batches ------------------------------------------------------- */

/* The greatest common divisor of the tasks' batches: k must divide it. */
static int64_t batch_gcd(const sp_model_t *m)
{
	int64_t g = 0;
	for (int t = 0; t < m->n_tasks; t++) {
		int64_t a = m->tasks[t].batch;
		while (a) {
			int64_t r = g % a;
			g = a;
			a = r;
		}
	}
	return g;
}

/* Plans with k[t] micro-batches for task t (each divides its batch): the
 * model with task t's batch / k[t] and microbatches k[t], K the most. */
static int plan_k(const plan_opts_t *o, const sp_model_t *m, const int *k,
		  const sp_cluster_t *c, sp_plan_t *out, plan_summary_t *sum, sp_err_t *err)
{
	sp_model_t mm = {0};
	int K = 1, set = 0;
	for (int t = 0; t < m->n_tasks; t++) {
		K = SP_MAX(K, k[t]);
		set |= m->tasks[t].microbatches != 0;
	}
	if (K == 1 && !set)
		return plan_micro(o, m, 1, c, out, sum, err);
	if (model_copy(&mm, m))
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int t = 0; t < mm.n_tasks; t++) {
		mm.tasks[t].batch /= k[t];
		mm.tasks[t].microbatches = k[t];
	}
	int rc = plan_micro(o, &mm, K, c, out, sum, err);
	model_release(&mm);
	return rc;
}

/* Room for every divisor of a batch: no number up to SP_MAX_BATCH (2^22)
 * has more than 360 (3603600 has; counted by a sieve over 1..2^22). */
enum { MAX_DIVISORS = 360 };

/* The divisors of g up to SP_MAX_MICROBATCHES, ascending, into d[]. */
static int divisors(int64_t g, int *d, int max)
{
	int n = 0;
	for (int64_t i = 1; i <= g && i <= SP_MAX_MICROBATCHES && n < max; i++)
		if (g % i == 0)
			d[n++] = (int)i;
	return n;
}

/* The predicted iteration (ms) with k[t] micro-batches per task; HUGE_VAL
 * when they do not plan or fit. */
static double iteration_k(const plan_opts_t *o, const sp_model_t *m, const int *k,
			  const sp_cluster_t *c)
{
	plan_opts_t q = *o;
	sp_err_t e = {0};
	sp_plan_t p = {0};
	plan_summary_t s;
	q.no_advice = 1;
	q.compare = 0;
	q.mb_tasks = NULL;
	q.microbatches = 1;
	for (int t = 0; t < m->n_tasks; t++)
		q.microbatches = SP_MAX(q.microbatches, k[t]);
	double it = plan_k(&q, m, k, c, &p, &s, &e) ? HUGE_VAL : p.cert.iteration_ms;
	plan_release(&p);
	return it;
}

/* 1 when the inputs plan (and fit) with k[t] micro-batches per task. */
static int fits_k(const plan_opts_t *o, const sp_model_t *m, const int *k,
		  const sp_cluster_t *c)
{
	return iteration_k(o, m, k, c) < HUGE_VAL;
}

/* The next divisor of b above k, at most SP_MAX_MICROBATCHES; 0 none. */
static int next_divisor(int64_t b, int k)
{
	for (int64_t d = (int64_t)k + 1; d <= b && d <= SP_MAX_MICROBATCHES; d++)
		if (b % d == 0)
			return (int)d;
	return 0;
}

/*
 * Step i of auto's sequence of per-task counts into k (n_tasks entries):
 * from one micro-batch each, every step gives the task whose micro-batch
 * holds the most activations (saved bytes for backward per sample x
 * batch / k_t; ties to the first task) its next number of micro-batches
 * (the next divisor of its batch), so each step frees the most
 * activation memory one step can. Returns the steps taken: i, or fewer
 * when every task is at its last divisor (k then the last element).
 */
static int mb_sequence(const sp_model_t *m, int i, int *k)
{
	double *act = calloc((size_t)m->n_tasks + 1, sizeof *act);
	int s = 0;
	for (int t = 0; t < m->n_tasks; t++) {
		const sp_task_t *tk = &m->tasks[t];
		k[t] = 1;
		for (int q = 0; act && q < tk->n_nodes; q++) {
			inspect_node_t n;
			inspect_node(&n, m, tk, &tk->nodes[q]);
			act[t] += (double)n.saved_bytes * (double)tk->batch;
		}
	}
	for (; act && s < i; s++) {
		int best = -1, nd = 0;
		for (int t = 0; t < m->n_tasks; t++) {
			int d = next_divisor(m->tasks[t].batch, k[t]);
			if (d && (best < 0 || act[t] / k[t] > act[best] / k[best])) {
				best = t;
				nd = d;
			}
		}
		if (best < 0)
			break;
		k[best] = nd;
	}
	free(act);
	return s;
}

int microbatch_fit(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c, int *k)
{
	/* the first step that fits (fewer micro-steps are faster: each
	 * repeats the per-step fixed costs, and a task alone in a micro-step
	 * leaves the others' devices idle): steps 1, 2, 4, ... until one
	 * fits, then bisection below it; the sequence's end has the least
	 * activation memory, so when it does not fit nothing does. Step 0,
	 * one micro-batch each, is the caller's (it did not fit). */
	int end = mb_sequence(m, INT_MAX, k), lo = 1, hi = 0;
	for (int i = 1; i < end && !hi; i *= 2) {
		mb_sequence(m, i, k);
		if (fits_k(o, m, k, c))
			hi = i;
		else
			lo = i + 1;
	}
	if (!hi) {
		if (end < 1)
			return 0;
		mb_sequence(m, end, k);
		if (!fits_k(o, m, k, c))
			return 0;
		hi = end;
	}
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		mb_sequence(m, mid, k);
		if (fits_k(o, m, k, c))
			hi = mid;
		else
			lo = mid + 1;
	}
	mb_sequence(m, hi, k);
	return hi;
}

/* Auto's micro-batch counts once step hi of mb_sequence is the first that
 * fits (k holds it): the fewest micro-batches are not always the fastest
 * (a smaller micro-batch leaves memory for fewer sharded buckets and
 * recomputing slices, and lets waves pack differently), so the next
 * MB_MORE steps of the sequence and the uniform counts (every task the
 * same K, the smallest MB_MORE divisors of every batch at or above the
 * most of k) are planned too, and the fastest predicted iteration is
 * kept; ties keep the earlier (fewer micro-steps). Each try is a whole
 * planning run, made only when nothing fits with one micro-batch. */
enum { MB_MORE = 2 };

static void microbatch_fastest(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
			       int hi, int *k)
{
	int n = m->n_tasks, *t = calloc((size_t)n + 1, sizeof *t);
	if (!t)
		return; /* k stays the first that fits */
	double best = iteration_k(o, m, k, c);
	int kmax = 1, tried = 0;
	for (int i = 0; i < n; i++)
		kmax = SP_MAX(kmax, k[i]);
	for (int step = hi + 1; step <= hi + MB_MORE; step++) {
		if (mb_sequence(m, step, t) < step)
			break; /* the sequence's end */
		double it = iteration_k(o, m, t, c);
		if (it < best) {
			best = it;
			memcpy(k, t, sizeof *k * (size_t)n);
		}
	}
	int64_t g = batch_gcd(m);
	for (int K = kmax; K <= g && K <= SP_MAX_MICROBATCHES && tried < MB_MORE; K++) {
		if (g % K)
			continue;
		int same = 1;
		for (int i = 0; i < n; i++)
			same &= k[i] == K;
		if (same)
			continue;
		for (int i = 0; i < n; i++)
			t[i] = K;
		tried++;
		double it = iteration_k(o, m, t, c);
		if (it < best) {
			best = it;
			memcpy(k, t, sizeof *k * (size_t)n);
		}
	}
	free(t);
}

/* The divisors of b (up to SP_MAX_MICROBATCHES) as "1, 2, 4" into buf. */
static void divisor_list(char *buf, size_t cap, int64_t b)
{
	int d[MAX_DIVISORS], n = divisors(b, d, MAX_DIVISORS);
	buf[0] = 0;
	for (int i = 0, len = 0; i < n && len < (int)cap - 12; i++)
		len += snprintf(buf + len, cap - (size_t)len, "%s%d", i ? ", " : "", d[i]);
}

/* The per-task form NAME=K[,NAME=K...] of --microbatches into k (tasks
 * not named: 1); exit-2 errors name the item. */
static int mb_parse(const char *spec, const sp_model_t *m, int *k, sp_err_t *err)
{
	char item[SP_NAME_MAX + 32];
	for (int t = 0; t < m->n_tasks; t++)
		k[t] = 0;
	for (const char *p = spec;;) {
		size_t n = strcspn(p, ",");
		snprintf(item, sizeof item, "%.*s", (int)SP_MIN(n, sizeof item - 1), p);
		char *eq = strchr(item, '='), *end = NULL;
		long v = eq ? strtol(eq + 1, &end, 10) : 0;
		int t = -1;
		if (eq) {
			*eq = 0;
			for (int q = 0; q < m->n_tasks && t < 0; q++)
				if (!strcmp(m->tasks[q].name, item))
					t = q;
		}
		if (!eq || n >= sizeof item || !end || *end || eq[1] < '0' || eq[1] > '9' ||
		    v < 1 || v > SP_MAX_MICROBATCHES) {
			sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
				   "--microbatches: '%.*s' is not TASK=COUNT", (int)SP_MIN(n, 80), p);
			sp_err_hint(err, "use a number for every task, or TASK=COUNT,... with "
					 "counts from 1 to %d (tasks not named: 1)",
				    SP_MAX_MICROBATCHES);
			return SP_EINPUT;
		}
		if (t < 0) {
			char names[200] = "";
			for (int q = 0, len = 0; q < m->n_tasks && len < (int)sizeof names - 70; q++)
				len += snprintf(names + len, sizeof names - (size_t)len, "%s'%s'",
						q ? ", " : "", m->tasks[q].name);
			sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
				   "--microbatches: unknown task '%s'", item);
			sp_err_hint(err, "the model's tasks are %s", names);
			return SP_EINPUT;
		}
		if (k[t])
			return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
					  "--microbatches: task '%s' is named twice", item);
		if (m->tasks[t].batch % v) {
			char list[160];
			divisor_list(list, sizeof list, m->tasks[t].batch);
			sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
				   "--microbatches %s=%ld does not divide the batch of task '%s' "
				   "(%lld)",
				   item, v, item, (long long)m->tasks[t].batch);
			sp_err_hint(err, "use a number that divides it: %s", list);
			return SP_EINPUT;
		}
		k[t] = (int)v;
		if (!p[n])
			break;
		p += n + 1;
	}
	for (int t = 0; t < m->n_tasks; t++)
		k[t] = SP_MAX(k[t], 1);
	return 0;
}

int mb_describe(char *buf, size_t cap, const sp_model_t *m, const int *k, int *uniform)
{
	int len = 0;
	*uniform = 1;
	for (int t = 1; t < m->n_tasks; t++)
		*uniform &= k[t] == k[0];
	buf[0] = 0;
	if (*uniform)
		return snprintf(buf, cap, "%d", k[0]);
	for (int t = 0; t < m->n_tasks && len < (int)cap; t++)
		if (k[t] > 1)
			len += snprintf(buf + len, cap - (size_t)len, "%s%s=%d", len ? "," : "",
					m->tasks[t].name, k[t]);
	return len;
}

int planner_run(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
		sp_plan_t *out, plan_summary_t *sum, sp_err_t *err)
{
	double t_start = now_ms(o); /* every planning run below, auto's tries too */
	int64_t g = batch_gcd(m);
	int K = o->microbatches, rc;
	int *k = calloc((size_t)m->n_tasks + 1, sizeof *k);
	if (!k)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	plan_opts_t q = *o;
	q.mb_tasks = NULL;
	if (tp_check(o, m, c, err)) {
		rc = SP_EINPUT;
		goto done;
	}
	if (o->mb_tasks) { /* per task, forced */
		if ((rc = mb_parse(o->mb_tasks, m, k, err)))
			goto done;
		q.microbatches = 1;
		for (int t = 0; t < m->n_tasks; t++)
			q.microbatches = SP_MAX(q.microbatches, k[t]);
		rc = plan_k(&q, m, k, c, out, sum, err);
		goto done;
	}
	if (K > 0 && g % K) {
		int t = 0;
		while (t < m->n_tasks - 1 && m->tasks[t].batch % K == 0)
			t++;
		char list[160];
		divisor_list(list, sizeof list, g);
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "--microbatches %d does not divide the batch of task '%s' (%lld)", K,
			   m->tasks[t].name, (long long)m->tasks[t].batch);
		sp_err_hint(err, "use a number that divides every task's batch: %s (or auto, "
				 "or TASK=COUNT,... per task)",
			    list);
		rc = SP_EINPUT;
		goto done;
	}
	for (int t = 0; t < m->n_tasks; t++)
		k[t] = SP_MAX(K, 1);
	if (K > 0) {
		rc = plan_k(&q, m, k, c, out, sum, err);
		goto done;
	}
	/* auto: one micro-batch unless nothing fits with it, then the first
	 * counts of mb_sequence that fit; when none do, one again with its
	 * advice */
	q.microbatches = 1;
	q.no_advice = 1;
	rc = plan_k(&q, m, k, c, out, sum, err);
	if (rc != SP_EINFEAS)
		goto done;
	sp_err_t keep = *err;
	memset(err, 0, sizeof *err);
	err->warn = keep.warn;
	err->warn_ctx = keep.warn_ctx;
	int found = microbatch_fit(&q, m, c, k);
	if (found)
		microbatch_fastest(&q, m, c, found, k);
	q.microbatches = 0; /* 0: the advice knows none fits */
	for (int t = 0; t < m->n_tasks; t++) {
		k[t] = found ? k[t] : 1;
		q.microbatches = found ? SP_MAX(q.microbatches, k[t]) : 0;
	}
	q.no_advice = o->no_advice;
	rc = plan_k(&q, m, k, c, out, sum, err);
done:
	if (!rc)
		sum->total_ms = now_ms(o) - t_start;
	free(k);
	return rc;
}
