/*
 * walk.c — one algorithm's walk over its candidates (plan_one; plan.c
 * calls it per algorithm and table set): each lowered (plan_lowered),
 * bounded (bound_sync) and simulated only where it can change the choice,
 * judged in table order (plan_better). The jobs that lower and simulate
 * ahead of it with --jobs are in walk_jobs.c (walk.h).
 */
#include "tp.h"
#include "walk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void seen_release(seen_t *v)
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

int seen_has(const seen_t *v, const sched_t *s)
{
	for (int i = 0; i < v->n; i++)
		if (sched_same(&v->s[i], s))
			return 1;
	return 0;
}

int seen_add(seen_t *v, const sched_t *s)
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

static int walk_settles(const struct walk *w, double early);

/* What bound_sync reads that layout_fit may change: every bucket's layout
 * and deferral, every slice's recompute flag (bound_sync_early's header). */
static int32_t *fit_marks(planner_t *pl, const sp_plan_t *q)
{
	size_t n = 2 * (size_t)q->n_buckets + (size_t)q->n_slices;
	int32_t *m = sp_arena_calloc(&pl->scratch, n + 1, sizeof *m);
	for (int b = 0; m && b < q->n_buckets; b++) {
		m[2 * b] = q->buckets[b].layout;
		m[2 * b + 1] = q->buckets[b].defer;
	}
	for (int i = 0; m && i < q->n_slices; i++)
		m[2 * q->n_buckets + i] = q->slices[i].recompute;
	return m;
}

static int fit_marks_same(const sp_plan_t *q, const int32_t *m)
{
	for (int b = 0; b < q->n_buckets; b++)
		if (m[2 * b] != (int32_t)q->buckets[b].layout || m[2 * b + 1] != q->buckets[b].defer)
			return 0;
	for (int i = 0; i < q->n_slices; i++)
		if (m[2 * q->n_buckets + i] != q->slices[i].recompute)
			return 0;
	return 1;
}

/* Variant k (plan q as lower_run left it) of plan_lowered_cut, to its
 * end: its early bound, then released (cut->gone[k]) where that settles it,
 * else its memory and layouts (memplan_run, layout_fit), and its
 * bound_sync taken from the early one's where layout_fit changed nothing
 * it reads. */
static int lower_rest(planner_t *pl, lower_cut_t *cut, int k, sp_plan_t *q)
{
	int rc;
	double raw;
	int32_t *m = NULL;
	if (cut) {
		cut->lb[k] = 0;
		pl->low_all++;
		if ((rc = bound_sync_early(pl, q, &raw, &cut->early[k])))
			return sp_err_set(pl->err, rc, NULL, 0, 0, NULL, "out of memory");
		if (cut->w && walk_settles(cut->w, cut->early[k])) {
			plan_release(q);
			memset(q, 0, sizeof *q);
			cut->gone[k] = 1;
			pl->low_cut++;
			return 0;
		}
		if (cut->trial == (pl->opts->zero < 0) && !(m = fit_marks(pl, q)))
			return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
	if ((rc = memplan_run(pl, q, 0)) || (rc = layout_fit(pl, q)))
		return rc;
	if (m && fit_marks_same(q, m))
		cut->lb[k] = raw;
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
 * the plans lowered then. cut (NULL: none, plan_lowered): each variant's
 * early bound, and its bound_sync where known (lower_cut_t); one that the
 * early bound settles right after lower_run is not lowered further: its
 * memory and layouts (memplan_run, layout_fit) are skipped, and with them
 * any allocation failure they would have met. */
int plan_lowered_cut(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
		     place_kind_t kind, seen_t *seen, sp_plan_t *out, sp_plan_t *aligned,
		     int *n_aligned, lower_cut_t *cut)
{
	sched_t s;
	place_t pc, pa;
	int rc, changed = 0;
	if (n_aligned)
		*n_aligned = 0;
	if (cut) {
		cut->gone[0] = cut->gone[1] = 0;
		cut->lb[0] = cut->lb[1] = 0;
	}
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
	if ((rc = lower_run(pl, &s, &pc, out)) || (rc = lower_rest(pl, cut, 0, out)))
		return rc;
	if (changed) {
		if ((rc = lower_run(pl, &s, &pa, aligned)) || (rc = lower_rest(pl, cut, 1, aligned))) {
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

int plan_lowered(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
		 place_kind_t kind, seen_t *seen, sp_plan_t *out, sp_plan_t *aligned,
		 int *n_aligned)
{
	return plan_lowered_cut(pl, a, st, c, kind, seen, out, aligned, n_aligned, NULL);
}

/* Lowered plan out → simulation (ours: sim_iteration) → zero-1 where not
 * slower (layout_trial: every algorithm's plan, so that a comparison
 * measures the schedules, not a layout only ours may choose); *over: the worst device's bytes over the cap
 * (<= 0 when the plan fits). Reads only out and the planning run's
 * constants (the cost model, the cluster), so it gives the same result
 * whenever it runs. */
int plan_simulated(planner_t *pl, int ours, sp_plan_t *out, sim_result_t *res,
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

/* Judges a plan (its result r, worst bytes over the cap f) against the
 * best so far (res, over; none when !found): fitting beats not fitting;
 * then faster, or closer to fitting. */
int plan_better(int found, const sim_result_t *r, double f, const sim_result_t *res,
		double over)
{
	int fits = f <= 0;
	if (!found)
		return 1;
	if (fits != (over <= 0))
		return fits;
	return fits ? r->iteration_ms < res->iteration_ms * (1 - 1e-9) : f < over;
}

/* The record of plan_one's walk: the best plan so far (none: !found). */
typedef struct walk {
	sp_plan_t *out;
	sim_result_t *res;
	double *over;
	const sched_cand_t **chosen;
	int *use_seq, found;
	int memo; /* the record's result came from sim_memo (held_t's memo) */
	int idx, ready; /* the record's row (held_t's idx); ready: top_ent_t's */
	double lb, lbr; /* the record's lb and lbr (0: not computed) */
	top_t *top;     /* NULL: the plans that lose are released */
	const sim_result_t *bar;
	sp_err_t *err;
	planner_t *pl;
	int trial;      /* plan_walk's: bound_sync's any_layout */
	double within;  /* --refine-within (< 0: all) */
} walk_t;

/* ---- the plans kept for top_choose ---------------------------------------- */

/*
 * top_choose takes the least refined iteration among the candidates; the
 * walk chooses on unrefined ones, so it keeps every plan that might refine
 * to that: those whose lbr (refined_bound) leaves them able to beat or
 * equal the record's iteration, which bounds the refined choice's (the
 * record's refined iteration is no more than its unrefined one, and
 * top_choose replaces its choice only by a faster plan or an equal one of
 * an earlier row). So a plan dropped here is one top_choose would skip,
 * and what it refines does not depend on when the walk dropped it. With a
 * bar, a plan that cannot beat it refined is dropped too (the caller keeps
 * its own plan then, whatever this walk chooses).
 */
static int top_drops(const walk_t *w, double lbr)
{
	if (w->bar && lbr >= w->bar->iteration_ms * FASTER)
		return 1;
	return w->found && *w->over <= 0 && w->res->iteration_ms < lbr * FASTER;
}

/* With --refine-within, top_choose skips a plan whose lb is above the
 * choice's unrefined iteration x (1 + within): that iteration is no more
 * than a record's that fits (records only get faster), so such a plan is
 * dropped at once, before its lbr is computed. */
static int top_outside(const walk_t *w, double lb)
{
	return w->within >= 0 && w->found && *w->over <= 0 &&
	       lb > w->res->iteration_ms * (1 + w->within);
}

/*
 * 1 when a variant whose early bound is early (bound_sync_early: no more
 * than its lb, and than its lbr where refined_bound counts the gathers,
 * under --defer-gather off) would, judged now by walk_held, be neither
 * simulated (the record fits and lb >= its iteration x FASTER) nor kept
 * for top_choose (no top; top_outside on lb; top_drops on lbr): it leaves
 * the walk as if never lowered. Each test holds for a larger bound, and
 * for a later record, which only gets faster and keeps fitting: the
 * aligned variant, judged after the original one, is settled too.
 */
static int walk_settles(const walk_t *w, double early)
{
	if (!w->found || *w->over > 0 || w->pl->opts->simulate_all ||
	    early < w->res->iteration_ms * FASTER)
		return 0;
	return !w->top || top_outside(w, early) ||
	       (w->pl->opts->defer_gather == 0 && top_drops(w, early));
}

/* Keeps plan p of held h (w->top), or releases it; p is left empty. lbr
 * <= 0: not computed yet (refined_bound here, where it is needed). */
static int top_keep(walk_t *w, const held_t *h, sp_plan_t *p, int ready, double lbr, int idx)
{
	top_t *t = w->top;
	int rc = 0, keep = t && p->n_devices && !top_outside(w, h->lb);
	if (keep && lbr <= 0 && (rc = refined_bound(w->pl, p, w->trial, h->lb, &lbr)))
		keep = 0;
	if (keep && !top_drops(w, lbr) && sp_grow((void **)&t->e, &t->cap, t->n + 1, sizeof *t->e))
		rc = sp_err_set(w->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	if (!keep || rc || top_drops(w, lbr)) {
		plan_release(p);
		memset(p, 0, sizeof *p);
		return rc;
	}
	t->e[t->n++] = (top_ent_t){.c = h->c, .p = *p, .lb = h->lb, .lbr = lbr, .idx = idx,
				   .ready = ready, .known = h->simulated, .r = h->r, .f = h->f};
	t->peak = t->n + 1 > t->peak ? t->n + 1 : t->peak;
	memset(p, 0, sizeof *p);
	return 0;
}

/* Drops the kept plans the record now rules out (top_drops). */
static void top_trim(walk_t *w)
{
	top_t *t = w->top;
	int n = 0;
	for (int i = 0; t && i < t->n; i++)
		if (top_drops(w, t->e[i].lbr) || top_outside(w, t->e[i].lb))
			plan_release(&t->e[i].p);
		else
			t->e[n++] = t->e[i];
	if (t)
		t->n = n;
}

void top_release(top_t *t)
{
	for (int i = 0; t && i < t->n; i++)
		plan_release(&t->e[i].p);
	if (t) {
		free(t->e);
		t->e = NULL;
		t->n = t->cap = 0;
	}
}

/* Candidate h's simulated plan judged against the record; the one that
 * loses is kept for top_choose or released. */
static int walk_judge(walk_t *w, held_t *h)
{
	int rc = 0;
	if (plan_better(w->found, &h->r, h->f, w->res, *w->over)) {
		const sched_cand_t *was = w->chosen ? *w->chosen : NULL;
		sp_plan_t old = *w->out;
		held_t prev = {.c = was, .r = *w->res, .f = *w->over, .lb = w->lb,
			       .simulated = 1};
		int old_ready = w->ready, old_idx = w->idx, had = w->found;
		double old_lbr = w->lbr;
		*w->out = h->p;
		*w->res = h->r;
		*w->over = h->f;
		w->found = 1;
		w->memo = h->memo;
		w->ready = !h->memo;
		w->idx = h->idx;
		w->lb = h->lb;
		w->lbr = h->lbr;
		if (w->chosen)
			*w->chosen = h->c;
		if (w->use_seq)
			*w->use_seq = h->from_seq;
		if (had)
			rc = top_keep(w, &prev, &old, old_ready, old_lbr, old_idx);
		top_trim(w);
	} else {
		rc = top_keep(w, h, &h->p, !h->memo, h->lbr, h->idx);
	}
	memset(&h->p, 0, sizeof h->p);
	return rc; /* its error set */
}

/* Simulates held candidate h (ours) in a scope of pl->scratch, or takes
 * the result of a plan equal to it simulated before (sim_memo.c; not with
 * --simulate-all, which simulates every candidate). */
static int held_simulate(planner_t *pl, held_t *h)
{
	int spec_rc, memo = !pl->opts->simulate_all;
	sim_memo_key_t key = {0};
	if (par_simulated(pl, h, &spec_rc) || held_ahead_take(pl, h, &spec_rc)) {
		/* a job simulated it already */
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
	sim_stats_note("walk", &h->p);
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
		held_ahead_drop(h, 1); /* its job's result unread */
		return top_keep(w, h, &h->p, 0, h->lbr, h->idx); /* top_choose may refine it */
	}
	if (!h->simulated && (rc = held_simulate(pl, h)))
		return rc;
	/* the bound the skips rest on, checked where every plan is simulated */
	if (pl->opts->simulate_all && h->c && !h->from_seq && h->lb > h->r.iteration_ms)
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "candidate '%s': sync bound %.6f ms above its simulated "
				  "iteration %.6f ms",
				  h->c->name, h->lb, h->r.iteration_ms);
	return walk_judge(w, h);
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
int refined_bound(planner_t *pl, const sp_plan_t *p, int trial, double lb, double *out)
{
	int any = pl->opts->zero < 0, gathers = pl->opts->defer_gather == 0;
	*out = lb;
	if (gathers && any == trial) /* lb is this very bound */
		return 0;
	return bound_sync(pl, p, any, gathers, out);
}

/* Variant k's lb (bound_sync in the walk's mode) after plan_lowered_cut:
 * cut's where known, else computed; under --simulate-all both, checked
 * equal, and the early bound checked no more than it (the cuts rest on
 * it). */
int walk_lb(planner_t *pl, const lower_cut_t *cut, int k, const sched_cand_t *c,
	    const sp_plan_t *p, double *lb)
{
	int rc = 0, all = pl->opts->simulate_all;
	*lb = cut->lb[k];
	if ((!*lb || all) && (rc = bound_sync(pl, p, cut->trial, 1, lb)))
		return rc;
	if (all && cut->lb[k] && cut->lb[k] != *lb)
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "candidate '%s': sync bound %.6f ms before layout_fit, "
				  "%.6f ms after it, which changed nothing it reads",
				  c ? c->name : "?", cut->lb[k], *lb);
	if (all && cut->early[k] > *lb)
		return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "candidate '%s': early sync bound %.6f ms above its "
				  "sync bound %.6f ms",
				  c ? c->name : "?", cut->early[k], *lb);
	return 0;
}

static void held_release(held_t *h, int n)
{
	for (int i = 0; i < n; i++)
		plan_release(&h[i].p);
}

/* seq, when it fits and is the table's last candidate (ours): it beats
 * every held one slower than it by the slack. NULL otherwise. */
const sim_result_t *seq_coming_last(const planner_t *pl, const sim_result_t *seq_res,
					   double seq_over)
{
	const sched_cand_t *last = &sched_cands[n_sched_cands - 1];
	return seq_res && seq_over <= 0 && last->reuses_baseline &&
			       !(pl->opts->exclude && !strcmp(last->name, pl->opts->exclude))
		       ? seq_res
		       : NULL;
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
		     const sim_result_t *bar, seen_t *seen, par_walk_t *par, top_t *top)
{
	int nc = a == ALGO_SPINDLE ? n_sched_cands : 1, rc = 0, n_held = 0;
	int ours = a == ALGO_SPINDLE, trial = pl->opts->zero < 0 && pl->lay_large;
	held_t *held = sp_arena_calloc(&pl->arena, 2 * (size_t)nc, sizeof *held);
	walk_t w = {.out = out, .res = res, .over = over, .chosen = chosen, .use_seq = use_seq,
		    .top = ours && pl->opts->zero < 0 ? top : NULL, .bar = bar, .err = pl->err,
		    .pl = pl, .trial = trial,
		    .within = pl->opts->refine_within ? pl->opts->refine_within : 0.10};
	const sim_result_t *seq_last = ours ? seq_coming_last(pl, seq_res, seq_over) : NULL;
	int no_cut = getenv("SPINDLE_NO_PREBOUND") != NULL; /* a reference for tests */
	memset(out, 0, sizeof *out);
	if (use_seq)
		*use_seq = 0;
	if (!held)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int v = 0; v < nc; v++) {
		const sched_cand_t *c = ours ? &sched_cands[v] : NULL;
		int from_seq = c && c->reuses_baseline && seq_res, n_var = 0;
		/* the candidate's plan and (ours) its node-aligned variant */
		held_t var[2] = {{.c = c, .from_seq = from_seq, .idx = 2 * v},
				 {.c = c, .idx = 2 * v + 1}};
		lower_cut_t cut = {.trial = trial};
		if (c && pl->opts->exclude && !strcmp(c->name, pl->opts->exclude))
			continue;
		sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
		if (from_seq) {
			/* seq's result is refined (layout_refine, seq_refine_t),
			 * ours' other candidates are not until the walk has
			 * chosen: the walk weighs unrefined plans against
			 * refined seq, so it may adopt seq where a refined
			 * candidate of ours would win; top_choose then refines
			 * the plans the walk kept and takes such a one */
			if ((rc = seq_wait(pl)))
				goto fail;
			var[0].r = pl->seq_refine ? pl->seq_refine->r : *seq_res;
			var[0].f = pl->seq_refine ? pl->seq_refine->over : seq_over;
			var[0].simulated = 1;
		} else if (par) {
			rc = par_take(pl, par, v, seen, var, &n_var);
		} else {
			/* once the walk has a record, a variant that the early bound
			 * settles is lowered no further (walk_settles) */
			cut.w = ours && w.found && !no_cut ? &w : NULL;
			rc = plan_lowered_cut(pl, a, st, c, kind, seen, &var[0].p,
					      ours ? &var[1].p : NULL, &n_var, ours ? &cut : NULL);
			for (int k = 0; !rc && ours && k <= n_var; k++)
				if (!cut.gone[k])
					rc = walk_lb(pl, &cut, k, c, &var[k].p, &var[k].lb);
		}
		sp_arena_reset(&pl->scratch, mark);
		for (int k = 0; !rc && ours && bar && !from_seq && k <= n_var; k++)
			if (!cut.gone[k])
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
			if (cut.gone[k]) /* settled: as if never lowered */
				continue;
			memset(&var[k].p, 0, sizeof var[k].p);
			if (!rc && !ours) {
				mark = sp_arena_mark(&pl->scratch);
				sim_stats_note("walk (not ours)", &y.p);
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
				rc = walk_judge(&w, &y);
				for (int h = 0; h < n_held; h++) /* top_choose may refine them */
					if (!rc)
						rc = top_keep(&w, &held[h], &held[h].p,
							      held[h].simulated && !held[h].memo,
							      held[h].lbr, held[h].idx);
				held_release(held, n_held);
				n_held = 0;
				if (rc) {
					held_release(var, 2);
					goto fail;
				}
				continue;
			}
			held[n_held++] = y;
		}
	}
	if (n_held && bar && held_lose_to(held, n_held, bar)) {
		held_release(held, n_held);
		return PLAN_NO_BETTER; /* every candidate loses to the bar */
	}
	/* with --jobs, the next held plans' simulations run as jobs meanwhile
	 * (held_ahead_next): the loop takes their results in its order where
	 * it simulates them */
	if (par && n_held > 1 && (rc = held_ahead_start(pl, par, held, n_held))) {
		held_release(held, n_held);
		return rc;
	}
	for (int h = 0; h < n_held; h++) {
		double limit = w.found && *w.over <= 0 && !pl->opts->simulate_all
				       ? w.res->iteration_ms * FASTER
				       : HUGE_VAL;
		if ((par && (rc = held_ahead_next(pl, held + h, n_held - h, limit))) ||
		    (rc = walk_held(&w, pl, &held[h]))) {
			held_ahead_drop(held + h, n_held - h);
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
		if (lbr >= bar->iteration_ms * FASTER && !(w.top && w.top->n)) {
			plan_release(out);
			return PLAN_NO_BETTER; /* and no kept plan can (top_drops) */
		}
	}
	if (w.found && w.memo) { /* the chosen plan as its simulation leaves it */
		sim_result_t r;
		double f;
		sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
		sim_stats_note("walk's memo'd choice", out);
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
	if (top) {
		top->idx = w.idx;
		top->set = pl->tables;
		top->unref = res->iteration_ms;
	}
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
int plan_one(planner_t *pl, algo_t a, cand_state_t *st, place_kind_t kind,
	     sp_plan_t *out, sim_result_t *res, double *over, const sched_cand_t **chosen,
	     const sim_result_t *seq_res, double seq_over, int *use_seq,
	     const sim_result_t *bar, par_walk_t *par, top_t *top)
{
	seen_t seen = {0};
	int dedup = a == ALGO_SPINDLE && !pl->opts->simulate_all;
	int rc = plan_walk(pl, a, st, kind, out, res, over, chosen, seq_res, seq_over, use_seq,
			   bar, dedup ? &seen : NULL, par && par->pc ? par : NULL, top);
	seen_release(&seen);
	return rc;
}

