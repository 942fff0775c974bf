/*
 * walk_jobs.c — with --jobs, the walk's work on worker threads (jobs.c):
 * ours' candidates lowered and simulated ahead of the walk (par_*), and
 * layout_refine as jobs: its last trial beside the others (refine_par)
 * and the sequential plan's refinement beside ours' walk (seq_*); and
 * top_choose, ours' choice on refined iterations, whose kept candidates
 * are refined as jobs beside each other. The walk itself is walk.c's, the
 * pipeline plan.c's (walk.h).
 */
#include "walk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
	sim_stats_note("walk job", &pc->p[k]);
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
	/* no record here to cut on (cut.w NULL): every variant lowered */
	lower_cut_t cut = {.trial = w->trial};
	int rc = plan_lowered_cut(pl, w->a, &pc->st, pc->c, w->kind, &pc->sched, &pc->p[0],
				  &pc->p[1], &pc->n_var, &cut);
	for (int k = 0; !rc && k <= pc->n_var; k++)
		rc = walk_lb(pl, &cut, k, pc->c, &pc->p[k], &pc->lb[k]);
	for (int k = 0; !rc && k <= pc->n_var; k++) {
		pc->sim[k] = (sp_job_t){.run = par_sim_run, .arg = pc, .prio = pc->prio + 2 + k,
					.after = {w->gate}};
		if (jobs_add(w->jobs, &pc->sim[k]))
			break; /* no guess: the walk simulates it */
		pc->n_sim = k + 1;
	}
	return rc;
}

/* Queues the jobs of ours' walk over the table on table set `set` (st:
 * its allotments so far; seq_res as plan_walk's): allotment, lowering and
 * (queued by the lowering) simulation jobs, in table order by priority,
 * after those of earlier sets (prio0). */
int par_start(planner_t *pl, par_walk_t *w, int set, cand_state_t *st,
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
int par_take(planner_t *pl, par_walk_t *w, int v, seen_t *seen, held_t var[2],
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
void par_bar(par_walk_t *w, double iteration_ms)
{
	jobs_lock(w->jobs);
	w->best = fmin(w->best, iteration_ms);
	jobs_unlock(w->jobs);
}

/* ---- the held plans simulated ahead of the walk's last loop (--jobs) ----- */

/*
 * plan_walk's last loop judges the held plans in table order (walk_held),
 * simulating each one unless the record by then shows it cannot win; the
 * walk's jobs skipped them on their guess of the record (w->best, which
 * the bar lowers: held plans are judged unrefined, against a record among
 * them), so the loop simulated them one after another on one thread. Now
 * the next ones it may simulate are simulated as jobs meanwhile
 * (held_ahead_next, prio: their candidates' simulation jobs'); the loop
 * takes a job's result where walk_held simulates (held_ahead_take, waited
 * for, as par_simulated's) and drops the job unread where it does not
 * (held_ahead_drop). A job simulates the plan the loop would
 * (plan_simulated reads only the plan and the run's constants), so the
 * loop decides and chooses what it does without them. The loop touches a
 * held plan only after its job is taken or dropped.
 */
static int held_ahead_run(planner_t *pl, sp_job_t *job)
{
	held_ahead_t *a = job->arg;
	par_tables(pl, a->w);
	sim_stats_note("walk ahead", &a->h->p);
	int rc = plan_simulated(pl, 1, &a->h->p, &a->r, &a->f);
	a->ran = 1;
	return rc;
}

int held_ahead_start(planner_t *pl, par_walk_t *w, held_t *h, int n)
{
	held_ahead_t *a = sp_arena_calloc(&pl->arena, (size_t)n, sizeof *a);
	if (!a)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int i = 0; i < n; i++) {
		if (h[i].simulated || h[i].from_seq || !h[i].spec || h[i].spec->ran[h[i].k])
			continue; /* simulated, or a walk job's simulation (par_simulated) */
		a[i] = (held_ahead_t){.h = &h[i], .w = w};
		a[i].job = (sp_job_t){.run = held_ahead_run, .arg = &a[i],
				      .prio = h[i].spec->prio + 2 + h[i].k};
		h[i].ahead = &a[i];
	}
	return 0;
}

/*
 * Before the loop judges h[0] (the next held plan): the jobs of the next
 * held plans it may still simulate, those with lb below limit (the
 * record's iteration x FASTER once it has one that fits: walk_held skips
 * the others, and the record only gets faster), queued until as many are
 * queued as the worker threads (pl->opts->jobs - 1), h[0]'s not counted:
 * the loop simulates that one itself unless its job is queued already.
 */
int held_ahead_next(planner_t *pl, held_t *h, int n, double limit)
{
	int want = SP_MIN(pl->opts->jobs, n_sched_cands) - 1, have = 0;
	for (int i = 1; i < n && have < want; i++) {
		held_ahead_t *a = h[i].ahead;
		if (!a || h[i].lb >= limit)
			continue;
		have++;
		if (a->queued)
			continue;
		if (jobs_add(a->w->jobs, &a->job))
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		a->queued = 1;
	}
	return 0;
}

/* 1 when h's job simulated its plan (waited for here, or run here when no
 * thread took it): its result in h->r and h->f, its code in *rc (its
 * error into pl->err). */
int held_ahead_take(planner_t *pl, held_t *h, int *rc)
{
	held_ahead_t *a = h->ahead;
	h->ahead = NULL;
	if (!a || !a->queued)
		return 0;
	jobs_wait(a->w->jobs, &a->job); /* under the jobs' lock, as in last_join */
	int done = a->job.state == JOB_DONE;
	jobs_drop(a->w->jobs, &a->job);
	a->queued = 0;
	if (!done || !a->ran)
		return 0;
	h->r = a->r;
	h->f = a->f;
	*rc = a->job.rc;
	if (*rc)
		err_take(pl->err, &a->job.err);
	sim_stats_event("walk ahead taken");
	return 1;
}

/* The jobs of h[0..n) off the queue (waited for where a thread runs one:
 * it writes into the plan), their results unread. */
void held_ahead_drop(held_t *h, int n)
{
	for (int i = 0; i < n; i++) {
		held_ahead_t *a = h[i].ahead;
		if (a && a->queued) {
			jobs_drop(a->w->jobs, &a->job);
			a->queued = 0;
		}
		h[i].ahead = NULL;
	}
}

/* 1 when a job simulated h's plan: its result in h->r and h->f, its code
 * in *rc (its error into pl->err). */
int par_simulated(planner_t *pl, held_t *h, int *rc)
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
void par_end(par_walk_t *w, cand_state_t *st)
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
		/* jobs_wait reads the state under the jobs' lock (a worker writes
		 * it there); after it the job is done or was never picked */
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
	int rc = last_start(pl, &lt, p, r, pl->tables, -3 * PAR_FIRST + 2);
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
static int refine_here(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over, int par)
{
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	int rc = par ? refine_par(pl, p, r) : layout_refine(pl, p, r);
	sp_arena_reset(&pl->scratch, mark);
	if (!rc && p->n_devices)
		*over = plan_over(pl, p);
	return rc;
}

int refine_over(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over)
{
	return refine_here(pl, p, r, over, pl->jobs != NULL);
}

/* refine_checked's check of p refined (r): refined_bound no more than the
 * refined iteration (--simulate-all only). */
static int refine_check(planner_t *pl, const sp_plan_t *p, const sim_result_t *r)
{
	double lbr = 0;
	int rc;
	if (!pl->opts->simulate_all || pl->opts->zero >= 0)
		return 0;
	if ((rc = refined_bound(pl, p, 0, 0, &lbr)))
		return rc;
	if (lbr > r->iteration_ms)
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "sync bound %.6f ms above the refined iteration %.6f ms", lbr,
				  r->iteration_ms);
	return 0;
}

/*
 * refine_over on a choice of ours' walk (plan_ours refines each table
 * set's choice before comparing them). With --simulate-all, also checks
 * the bound plan_walk prunes on against the bar (refined_bound: bound_sync
 * with either layout) against the refined iteration.
 */
int refine_checked(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over)
{
	int rc = refine_over(pl, p, r, over);
	return rc ? rc : refine_check(pl, p, r);
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
 * taken now), then the rest's, both first (they take longest; the rest's
 * job alone with the least prio of the run). */
int seq_start(planner_t *pl, seq_refine_t *sr)
{
	int rc = last_start(pl, &sr->last, sr->p, &sr->r, COST_AUTO, -3 * PAR_FIRST + 1);
	if (rc)
		return rc;
	sr->job = (sp_job_t){.run = seq_refine_run, .arg = sr, .prio = -3 * PAR_FIRST};
	if (jobs_add(pl->jobs, &sr->job)) {
		last_cancel(pl, &sr->last);
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
	return 0;
}

/* The refined result in pl->seq_refine (NULL: nothing to wait for): once
 * its job is done, or refined here when the job never ran. */
int seq_wait(planner_t *pl)
{
	seq_refine_t *sr = pl->seq_refine;
	if (!sr)
		return 0;
	if (sr->taken)
		return sr->rc;
	sr->taken = 1;
	if (pl->jobs) /* under the jobs' lock, as in last_join */
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
void seq_cancel(planner_t *pl)
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


/* ---- ours' choice on refined iterations (top_choose) --------------------- */

static int top_before(const void *a, const void *b)
{
	const top_ent_t *x = a, *y = b;
	if (x->lbr != y->lbr)
		return x->lbr < y->lbr ? -1 : 1;
	return (x->idx > y->idx) - (x->idx < y->idx);
}

/*
 * Kept plan e as the walk's choice is before refine_checked: simulated on
 * the walk's tables (set) unless it is already, its other times too, where
 * top_step refines it: its iteration within limit. Above it, e is never
 * read again (top_choose skips a plan top_step did not refine), so its
 * other times are left (sim_complete leaves the iteration as it is), and
 * so is its simulation where its result is known (e->known: sim_memo's,
 * which the simulation gives again, bit for bit). all (the debug env
 * SPINDLE_TOP_READY_ALL, for the test that the plans are the same): every
 * plan readied in full, as before these two shortcuts.
 */
static int top_ready(planner_t *pl, int set, top_ent_t *e, double limit, int all)
{
	int rc = 0, was = pl->tables;
	if (!all && !e->ready && e->known && e->r.iteration_ms > limit)
		return 0;
	if (was != set)
		cost_use(pl, set);
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	if (!e->ready) {
		sim_stats_note("top_ready", &e->p);
		rc = plan_simulated(pl, 1, &e->p, &e->r, &e->f);
	}
	sp_arena_reset(&pl->scratch, mark);
	if (!rc && e->r.partial && (all || e->r.iteration_ms <= limit)) {
		rc = sim_complete(pl, &e->p, &e->r);
		sp_arena_reset(&pl->scratch, mark);
	}
	if (was != set)
		cost_use(pl, was);
	return rc;
}

/* One kept plan's work in top_choose: readied (top_ready) and, when its
 * iteration is within the limit, refined on the caller's tables. With
 * --jobs, a job on any thread (then its last trial is not a job of its
 * own: layout_refine gives the same plan and result either way). */
typedef struct {
	sp_job_t job;
	top_ent_t *e;
	int set, tables; /* e's walk's tables (top_ready); the caller's */
	double limit;
	int all;     /* top_ready's */
	int dup;     /* an earlier kept plan equal to e (top_same), or -1 */
	int queued;  /* job queued (--jobs) */
	int refined; /* e refined: readied within the limit, no error */
} top_job_t;

static int top_step(planner_t *pl, top_job_t *tj, int par)
{
	top_ent_t *e = tj->e;
	int rc = top_ready(pl, tj->set, e, tj->limit, tj->all), was = pl->tables;
	if (rc || e->r.iteration_ms > tj->limit)
		return rc;
	if (was != tj->tables)
		cost_use(pl, tj->tables);
	rc = refine_here(pl, &e->p, &e->r, &e->f, par);
	if (was != tj->tables)
		cost_use(pl, was);
	tj->refined = !rc;
	return rc;
}

static int top_run(planner_t *pl, sp_job_t *job)
{
	return top_step(pl, job->arg, 0);
}

/* Field by field: memcmp would read the struct's padding. A field added
 * to sim_result_t must be added here (the assertion notices). */
_Static_assert(sizeof(sim_result_t) == 9 * sizeof(double) + 2 * sizeof(int),
	       "result_same compares every field of sim_result_t");
static int result_same(const sim_result_t *a, const sim_result_t *b)
{
	return a->iteration_ms == b->iteration_ms && a->compute_ms == b->compute_ms &&
	       a->utilisation == b->utilisation && a->transfer_ms == b->transfer_ms &&
	       a->sync_ms == b->sync_ms && a->step_ms == b->step_ms &&
	       a->xfer_iteration_ms == b->xfer_iteration_ms &&
	       a->xfer_last_ms == b->xfer_last_ms && a->busy_before == b->busy_before &&
	       a->partial == b->partial;
}

/* 1 when kept plans a and b refine to the same plan and result: equal in
 * every array the simulator and layout_refine read (sim_memo_same), in
 * their results and in being simulated already (top_ready then does the
 * same to both). */
static int top_same(const top_ent_t *a, const top_ent_t *b)
{
	return a->ready == b->ready && a->f == b->f && result_same(&a->r, &b->r) &&
	       sim_memo_same(&a->p, &b->p);
}

/* The queued jobs of tj[from..n) off the queue (waited for where a thread
 * runs one: it writes into t's plans), their results unread. */
static void top_drop(planner_t *pl, top_job_t *tj, int from, int n)
{
	for (int i = from; tj && i < n; i++)
		if (tj[i].queued) {
			jobs_drop(pl->jobs, &tj[i].job);
			tj[i].queued = 0;
		}
}

/*
 * Ours' choice on refined iterations: the walk's choice p (r, over; seq's
 * when *use_seq, refined already) refined (refine_checked), then each plan
 * the walk kept (t) in the order of lbr (ties by row) while its lbr leaves
 * it able to beat or equal the choice so far: simulated (top_ready) and
 * refined as the choice was; it replaces the choice when plan_better says
 * it is better, or when it fits with the same iteration and an earlier row.
 * So the choice is the least refined iteration of all candidates, ties to
 * the earlier (a plan the walk dropped, or one skipped here, has lbr above
 * the choice's refined iteration by the slack), and the order is fixed by
 * the lowered plans alone: the same for any --jobs. Frees t's plans.
 *
 * Two exact savings: a kept plan equal to an earlier one of an earlier
 * row that was refined here (top_same) is skipped, as it refines to that
 * one's result, which did not replace the choice or did with its earlier
 * row: it cannot beat or tie-break it. With --jobs, every kept plan that
 * may be refined (lb within the limit, no equal one before it) is readied
 * and refined as a job, queued before the choice is refined, so they run
 * beside it and beside each other; the loop takes their results in its
 * order where it would have computed them, and drops the jobs it never
 * reaches (a job's error counts only where the loop takes it).
 */
int top_choose(planner_t *pl, top_t *t, sp_plan_t *p, sim_result_t *r, double *over,
	       const sched_cand_t **chosen, int *use_seq)
{
	int rc = 0, best = t->idx;
	double within = pl->opts->refine_within ? pl->opts->refine_within : 0.10;
	double limit = within < 0 ? HUGE_VAL : t->unref * (1 + within);
	int all = getenv("SPINDLE_TOP_READY_ALL") != NULL; /* top_ready's */
	top_job_t *tj = NULL;
	if (t->n > 1)
		qsort(t->e, (size_t)t->n, sizeof *t->e, top_before);
	if (t->n && !(tj = calloc((size_t)t->n, sizeof *tj))) {
		rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto done;
	}
	for (int i = 0; i < t->n; i++) {
		tj[i] = (top_job_t){.e = &t->e[i], .set = t->set, .tables = pl->tables,
				    .limit = limit, .all = all, .dup = -1};
		for (int j = 0; j < i && tj[i].dup < 0; j++)
			if (t->e[j].idx < t->e[i].idx && top_same(&t->e[j], &t->e[i]))
				tj[i].dup = j;
	}
	/* then the jobs (they write into the plans top_same reads) */
	for (int i = 0; i < t->n; i++) {
		if (!pl->jobs || t->e[i].lb > limit || tj[i].dup >= 0)
			continue;
		tj[i].job = (sp_job_t){.run = top_run, .arg = &tj[i], .prio = -2 * PAR_FIRST + i};
		if (jobs_add(pl->jobs, &tj[i].job)) {
			rc = sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
			goto done;
		}
		tj[i].queued = 1;
	}
	if (!*use_seq && (rc = refine_checked(pl, p, r, over)))
		goto done;
	t->refined = !*use_seq;
	for (int i = 0; i < t->n; i++) {
		top_ent_t *e = &t->e[i];
		if (*over <= 0 && r->iteration_ms < e->lbr * FASTER)
			break; /* and every later one, of lbr no less */
		if (e->lb > limit) /* and its unrefined iteration, no less */
			continue;
		if (tj[i].dup >= 0 && tj[tj[i].dup].refined)
			continue;
		int done = 0;
		if (tj[i].queued) { /* under the jobs' lock, as in last_join */
			jobs_wait(pl->jobs, &tj[i].job);
			done = tj[i].job.state == JOB_DONE;
			jobs_drop(pl->jobs, &tj[i].job);
			tj[i].queued = 0;
			if (done && (rc = tj[i].job.rc)) {
				err_take(pl->err, &tj[i].job.err);
				goto done;
			}
		}
		if (!done && (rc = top_step(pl, &tj[i], pl->jobs != NULL)))
			goto done;
		if (!tj[i].refined) /* its iteration above the limit */
			continue;
		if ((rc = refine_check(pl, &e->p, &e->r)))
			goto done;
		sim_stats_refined(e->idx, &e->r, e->f);
		t->refined++;
		int tie = e->f <= 0 && *over <= 0 && e->r.iteration_ms == r->iteration_ms &&
			  e->idx < best;
		if (!tie && !plan_better(1, &e->r, e->f, r, *over))
			continue;
		plan_release(p);
		*p = e->p;
		memset(&e->p, 0, sizeof e->p);
		*r = e->r;
		*over = e->f;
		best = e->idx;
		*use_seq = 0;
		if (chosen)
			*chosen = e->c;
	}
done:
	top_drop(pl, tj, 0, t->n);
	free(tj);
	top_release(t);
	return rc;
}

/* The run's top_choose figures (planner_t): the largest of each walk's. */
void planner_note_top(planner_t *pl, const top_t *t)
{
	pl->top_peak = t->peak > pl->top_peak ? t->peak : pl->top_peak;
	pl->top_refined = t->refined > pl->top_refined ? t->refined : pl->top_refined;
}
