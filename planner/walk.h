/*
 * walk.h — ours' candidate walk, shared by plan.c's three files: plan.c
 * (the pipeline: every algorithm in order, the table sets compared, the
 * certificate, micro-batches), walk.c (one algorithm's walk over its
 * candidates: lowering, the bounds that skip simulations, the judge) and
 * walk_jobs.c (the walk's jobs on worker threads with --jobs, and
 * layout_refine as jobs: the sequential plan's beside ours' walk, a last
 * trial beside the others; top_choose: ours' choice among the walk's
 * candidates on refined iterations). Nothing outside them includes it; the entry
 * point is planner_run in planner.h.
 */
#ifndef SPINDLE_WALK_H
#define SPINDLE_WALK_H

#include "planner.h"

/* The schedules plan_one lowered (copies on the heap), to know a
 * candidate that schedules what an earlier one did. */
typedef struct {
	sched_t *s;
	int n, cap;
} seen_t;

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
	int idx;  /* 2 x its table row + variant: the order of ties */
	sim_result_t r;
	double f;
	/* --jobs: the candidate's jobs (NULL: none) and which variant p is:
	 * held_simulate takes the simulation a job ran ahead */
	struct par_cand *spec;
	int k;
	struct held_ahead *ahead; /* its simulation queued by held_ahead_start */
} held_t;

/* A held plan's simulation run as a job ahead of plan_walk's last loop
 * (--jobs): held_ahead_*, walk_jobs.c. */
typedef struct held_ahead {
	sp_job_t job;
	held_t *h;
	struct par_walk *w;
	int queued, ran; /* ran: the job simulated h->p into r, f */
	sim_result_t r;
	double f;
} held_ahead_t;

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

/* Priorities: a set's jobs at prio0 + 4 x its candidates' rows; every
 * allotment job PAR_FIRST before any other. */
enum { PAR_FIRST = 1 << 20 };

typedef struct {
	sp_job_t job;
	layout_last_t t;
	int tables; /* the table set it simulates on: its caller's */
	double ms;  /* the job's wall-clock time (the report's) */
} refine_last_t;

typedef struct seq_refine {
	sp_job_t job;   /* layout_refine_head; its last trial: last's job */
	refine_last_t last;
	sp_plan_t *p;   /* seq's plan, refined in place: read by no one else
			 * until seq_wait */
	sim_result_t r; /* in: the unrefined result; out: the refined one */
	double over, ms; /* ms: the jobs' wall-clock times (the report's) */
	int taken, rc;   /* rc: what seq_wait returned first, returned again */
} seq_refine_t;

/* A candidate's lowered plan kept by the walk for top_choose (ours): lbr
 * bounds its refined iteration; ready: p is as plan_simulated leaves it
 * and r, f its result (else p is the lowered plan, simulated there);
 * known: r, f are its result even where not ready (sim_memo's: an equal
 * plan simulated). */
typedef struct {
	const sched_cand_t *c;
	sp_plan_t p;
	double lb, lbr;
	int idx, ready, known;
	sim_result_t r;
	double f;
} top_ent_t;

/* The walk's kept plans (top_ent_t) and its choice's row (idx), for
 * top_choose; peak: the most plans held at once (the choice's included),
 * refined: how many top_choose refined (the choice's included). */
typedef struct {
	top_ent_t *e;
	int n, cap, peak, refined;
	int idx, set;
	double unref; /* the choice's unrefined iteration (--refine-within) */
} top_t;

/* plan_lowered_cut's early bounds (bound_sync_early) of each variant
 * k: early[k] the bound, lb[k] its bound_sync in the walk's own mode
 * (any_layout: trial; 0: not known, the caller computes it), known where
 * layout_fit changed nothing that bound_sync reads and the modes agree. w
 * (NULL: none, no record yet): a variant whose early bound settles it
 * against w's record (walk.c walk_settles) is lowered no further: released,
 * gone[k] set. */
typedef struct {
	const struct walk *w;
	int trial;
	int gone[2];
	double early[2], lb[2];
} lower_cut_t;

/* ---- walk.c ---------------------------------------------------------------- */

void seen_release(seen_t *v);
int seen_has(const seen_t *v, const sched_t *s);
int seen_add(seen_t *v, const sched_t *s);
int plan_lowered(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
		 place_kind_t kind, seen_t *seen, sp_plan_t *out, sp_plan_t *aligned,
		 int *n_aligned);
int plan_lowered_cut(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
		     place_kind_t kind, seen_t *seen, sp_plan_t *out, sp_plan_t *aligned,
		     int *n_aligned, lower_cut_t *cut);
int walk_lb(planner_t *pl, const lower_cut_t *cut, int k, const sched_cand_t *c,
	    const sp_plan_t *p, double *lb);
int plan_simulated(planner_t *pl, int ours, sp_plan_t *out, sim_result_t *res,
		   double *over);
int plan_better(int found, const sim_result_t *r, double f, const sim_result_t *res,
		double over);
int refined_bound(planner_t *pl, const sp_plan_t *p, int trial, double lb, double *out);
const sim_result_t *seq_coming_last(const planner_t *pl, const sim_result_t *seq_res,
				    double seq_over);
int plan_one(planner_t *pl, algo_t a, cand_state_t *st, place_kind_t kind,
	     sp_plan_t *out, sim_result_t *res, double *over, const sched_cand_t **chosen,
	     const sim_result_t *seq_res, double seq_over, int *use_seq,
	     const sim_result_t *bar, par_walk_t *par, top_t *top);
int top_choose(planner_t *pl, top_t *t, sp_plan_t *p, sim_result_t *r, double *over,
	       const sched_cand_t **chosen, int *use_seq);
void top_release(top_t *t);
void planner_note_top(planner_t *pl, const top_t *t);

/* ---- walk_jobs.c ----------------------------------------------------------- */

int par_take(planner_t *pl, par_walk_t *w, int v, seen_t *seen, held_t var[2],
	     int *n_var);
int par_simulated(planner_t *pl, held_t *h, int *rc);
int par_start(planner_t *pl, par_walk_t *w, int set, cand_state_t *st,
	      place_kind_t kind, const sim_result_t *seq_res, double seq_over, int prio0,
	      const sp_job_t *gate);
void par_bar(par_walk_t *w, double iteration_ms);
int held_ahead_start(planner_t *pl, par_walk_t *w, held_t *h, int n);
int held_ahead_next(planner_t *pl, held_t *h, int n, double limit);
int held_ahead_take(planner_t *pl, held_t *h, int *rc);
void held_ahead_drop(held_t *h, int n);
void par_end(par_walk_t *w, cand_state_t *st);
int refine_over(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over);
int refine_checked(planner_t *pl, sp_plan_t *p, sim_result_t *r, double *over);
int seq_start(planner_t *pl, seq_refine_t *sr);
int seq_wait(planner_t *pl);
void seq_cancel(planner_t *pl);

#endif
