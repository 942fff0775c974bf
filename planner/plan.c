/*
 * plan.c — the planner pipeline: every pass in order, for every algorithm
 * asked for, then the certificate of the chosen plan and its verification.
 * Under --tp auto ours plans on two table sets (cost.c: the auto one and
 * whole layers, where they differ) and keeps the better plan, each set's
 * refined (layout_refine) before they are compared (plan_whole).
 * Ours simulates only the candidates that can change its choice (plan_one,
 * walk.c: a sync bound of each lowered plan, bound.c), and the same plan
 * comes out as simulating them all would make (--simulate-all;
 * tests/planner/prune_exact.py). With --jobs N, worker threads (jobs.c)
 * lower and simulate ours' candidates ahead of the walk, which takes their
 * results in table order (walk_jobs.c, par_start): the same plan for every
 * N; the sequential plan's layout_refine and every refine's last trial
 * run there as jobs too (seq_start, refine_par). What lives where:
 * walk.h.
 * Wall-clock planning times go to the report only, never into the plan
 * (same inputs and options must give the same bytes).
 */
#include "tp.h"
#include "walk.h"

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
	top_t top = {0};
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
			   !rc && *over <= 0 ? r : NULL, par, &top);
	cost_use(pl, COST_AUTO);
	if (!wrc) /* refined, and the kept candidates that may refine faster */
		wrc = top_choose(pl, &top, &w, &wr, &wo, &wc, &wseq);
	top_release(&top);
	planner_note_top(pl, &top);
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
			top_t top = {0};
			rc = plan_one(pl, ALGO_SPINDLE, &cands[t], pl->opts->placement, p, r, over,
				      chosen, seq_res, seq_over, use_seq, NULL, &par[t], &top);
			if (!rc) /* refined, and the kept candidates that may refine faster */
				rc = top_choose(pl, &top, p, r, over, chosen, use_seq);
			top_release(&top);
			planner_note_top(pl, &top);
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
	if (getenv("SPINDLE_TOP_STATS")) /* a diagnostic for benchmarks */
		fprintf(stderr, "top_choose: at most %d plans kept, %d refined (one walk)\n",
			pl->top_peak, pl->top_refined);
	if (getenv("SPINDLE_TOP_STATS"))
		fprintf(stderr, "lowering: %d of %d variants settled by the early bound\n",
			pl->low_cut, pl->low_all);
	if (getenv("SPINDLE_TOP_STATS")) {
		uint64_t hits, misses;
		coll_memo_counts(pl, &hits, &misses);
		fprintf(stderr, "sync bounds: %llu collectives from the memo, %llu computed\n",
			(unsigned long long)hits, (unsigned long long)misses);
	}
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
					    have_seq ? &seq_res : NULL, seq_over, &use_seq, NULL, NULL,
					    NULL);
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
	sim_stats_print(); /* SPINDLE_SIM_STATS */
	free(pl.ins_spare);
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
