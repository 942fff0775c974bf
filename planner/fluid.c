/*
 * fluid.c — the simulator's network: transfers and all-reduces in flight at
 * the same time share the links they cross. It times jobs whose prices and
 * per-link loads net.c gives; it knows nothing of programs (sim.c feeds it
 * jobs as the devices issue them and asks when they finish).
 *
 * A job is a sequence of phases (a transfer: one; an all-reduce: one for a
 * ring, three for the hierarchical algorithm; a reduce-scatter: one, or
 * two hierarchical); a phase puts bytes_r on each
 * link r it crosses, then waits its latency. The phase drains at a rate x
 * (bytes per ms on its most loaded link, V = max_r bytes_r), loading link r
 * with x * bytes_r / V; alone on the network it takes max_r bytes_r / cap_r,
 * net.c's price.
 *
 * Sharing is max-min fair, by progressive filling: raise the rate of every
 * job not yet frozen together; when a link is full, freeze the jobs on it;
 * repeat until all are frozen. It is recomputed at every event where a
 * phase starts or stops draining, so a job speeds up when a competitor
 * leaves; only for the jobs connected to that phase through shared links
 * (max-min rates of unconnected jobs are independent). Why this rule:
 * InfiniBand and NVLink arbitrate per queue pair / channel in round robin,
 * which gives competing long flows equal shares of a bottleneck and lets a
 * flow limited elsewhere leave its unused share to the others; that is
 * max-min fairness (Bertsekas & Gallager, Data Networks, 6.5.2). Equal
 * shares per job rather than per NCCL channel: a collective runs as many
 * channels as a transfer has queue pairs, to first order.
 *
 * All-reduces run one at a time per device (the runtime issues them on one
 * stream): one that is ready waits until none of its members is in another;
 * waiting ones start in the order they became ready (ties: first added).
 *
 * Jobs start in (start, job) order, taken from three places, each in that
 * order: a list (jobs added in order), one queue per sender (transfers
 * added out of the list's order, most of m32's: a device's clock never
 * goes back) and a heap (the rest); where a job waits never changes when
 * it starts (tests/unit/test_net send_queues_exact).
 */
#include "planner.h"

#include <limits.h>
#include <math.h>
#include <string.h>

enum { J_PENDING, J_WAITING, J_DRAIN, J_DELAY, J_DONE };

/* Relative tolerance under which two event times are one event. */
#define SAME_TIME 1e-12

/* fmax and fmin as glibc's x86-64 libm computes them (maxsd / minsd: the
 * second argument when they compare equal, so +0 and -0 come out alike;
 * the other one when an argument is NaN), inline: the libm call cost more
 * than the comparison on the simulator's paths (enter_phase per load). */
static inline double max2(double a, double b)
{
	return a > b || isnan(b) ? a : b;
}

static inline double min2(double a, double b)
{
	return a < b || isnan(b) ? a : b;
}

int fl_init(fl_net_t *out, const sp_cluster_t *c, sp_arena_t *a, int max_jobs)
{
	memset(out, 0, sizeof *out);
	out->c = c;
	out->a = a;
	out->cap_jobs = max_jobs;
	size_t nr = (size_t)net_n_res(c) + 1, nj = (size_t)max_jobs + 1;
	int **per_link[] = {&out->ln,       &out->lcap,  &out->lmark,   &out->cnt,
			    &out->unfrozen, &out->links, &out->changed, &out->oncap,
			    &out->lv.pos,   &out->seeded, &out->seeds};
	/* per job (or component slot), written before read: new_job sets a
	 * job's ev.pos, share a slot's comp and frozen, the heaps and
	 * lists their entries below their counts. Not zeroed: a simulation
	 * sized for every transfer of m32 touches only the pages its jobs use */
	int **per_job[] = {&out->comp, &out->waiting, &out->ev.pos};
	for (size_t i = 0; i < sizeof per_link / sizeof *per_link; i++)
		if (!(*per_link[i] = sp_arena_calloc(a, nr, sizeof(int))))
			return SP_ENOMEM;
	for (size_t i = 0; i < sizeof per_job / sizeof *per_job; i++)
		if (!(*per_job[i] = sp_arena_array(a, nj, sizeof(int))))
			return SP_ENOMEM;
	/* new_job writes each job whole; job 0 zeroed, as the index a caller's
	 * zeroed job array holds before it names a job (fl_done reads it) */
	if ((out->jobs = sp_arena_array(a, nj + 1, sizeof *out->jobs))) {
		/* aligned to its type's 64 bytes: a job's first line is its
		 * sharing's (the arena aligns less) */
		uintptr_t at = (uintptr_t)out->jobs, al = _Alignof(fl_job_t);
		out->jobs = (fl_job_t *)((at + al - 1) / al * al);
		memset(out->jobs, 0, sizeof *out->jobs);
	}
	/* at most one entry per job or link: the heaps never grow */
	out->pending.e = sp_arena_array(a, nj, sizeof(fl_ev_t));
	out->in_order = sp_arena_array(a, nj, sizeof(fl_ev_t));
	out->ev.e = sp_arena_array(a, nj, sizeof(fl_ev_t));
	out->fresh = sp_arena_array(a, nj, sizeof(fl_ev_t));
	out->lv.e = sp_arena_calloc(a, nr, sizeof(fl_ev_t));
	out->touched = sp_arena_calloc(a, nr, sizeof(char));
	out->lj = sp_arena_calloc(a, nr, sizeof *out->lj);
	out->on = sp_arena_calloc(a, nr, sizeof *out->on);
	out->frozen = sp_arena_array(a, nj, sizeof(char));
	size_t nd = (size_t)c->nodes * c->gpus_per_node + 1;
	out->src.e = sp_arena_array(a, nd, sizeof(fl_ev_t));
	out->fhead = sp_arena_array(a, nd, sizeof(int));
	out->ftail = sp_arena_array(a, nd, sizeof(int));
	for (size_t d = 0; out->fhead && out->ftail && d < nd; d++)
		out->fhead[d] = out->ftail[d] = -1;
	out->queues = 1;
	out->busy = sp_arena_calloc(a, (size_t)c->nodes * c->gpus_per_node + 1, sizeof(char));
	out->whead = sp_arena_array(a, nd, sizeof(int));
	out->wtail = sp_arena_array(a, nd, sizeof(int));
	out->wtail_i = sp_arena_array(a, nd, sizeof(int));
	for (size_t d = 0; out->whead && d < nd; d++)
		out->whead[d] = -1;
	out->left = sp_arena_calloc(a, nr, sizeof(double));
	out->sum = sp_arena_calloc(a, nr, sizeof(double));
	out->cap = sp_arena_calloc(a, nr, sizeof(double));
	for (size_t r = 0; out->cap && r + 1 < nr; r++)
		out->cap[r] = net_res_gbs(c, (int)r) * 1e6;
	if (!out->jobs || !out->lj || !out->on || !out->frozen || !out->busy || !out->whead ||
	    !out->wtail || !out->wtail_i || !out->left || !out->sum || !out->cap ||
	    !out->pending.e || !out->in_order || !out->ev.e || !out->fresh || !out->lv.e ||
	    !out->touched ||
	    !out->src.e || !out->fhead || !out->ftail)
		return SP_ENOMEM;
	return 0;
}

/* ---- adding jobs ------------------------------------------------------------ */

/* A job that starts at start (a transfer: sent by device src, else -1). */
static int new_job(fl_net_t *n, double start, int src)
{
	if (n->n_jobs >= n->cap_jobs)
		return SP_EINTERNAL;
	int j = n->n_jobs++;
	fl_job_t *jb = &n->jobs[j];
	memset(jb, 0, sizeof *jb);
	jb->start = max2(start, n->now); /* sim.c never adds one in the past */
	jb->done = -1;
	jb->state = J_PENDING;
	jb->src = src;
	jb->fnext = -1;
	jb->ev_slot = -1;
	n->ev.pos[j] = -1;
	/* jmark 0: below every sharing's epoch */
	/* j exceeds every job's id: after the list's last, else its sender's
	 * last, when it starts no earlier */
	if (n->in_head == n->in_n || jb->start >= n->in_order[n->in_n - 1].t) {
		n->in_order[n->in_n++] = (fl_ev_t){jb->start, j, 0};
	} else if (src < 0 || !n->queues) {
		heap_push(&n->pending, (fl_ev_t){jb->start, j, 0});
	} else if (n->fhead[src] < 0) {
		n->fhead[src] = n->ftail[src] = j;
		heap_push(&n->src, (fl_ev_t){jb->start, j, 0});
	} else if (jb->start >= n->jobs[n->ftail[src]].start) {
		n->jobs[n->ftail[src]].fnext = j;
		n->ftail[src] = j;
	} else {
		heap_push(&n->pending, (fl_ev_t){jb->start, j, 0});
	}
	return j;
}

enum { PEND_NONE, PEND_LIST, PEND_HEAP, PEND_SRC };

static int ev_before(fl_ev_t a, fl_ev_t b)
{
	return a.t < b.t || (a.t == b.t && a.id < b.id);
}

/* Where the next job to start is, the least (start, job) of the in-order
 * list, the pending heap and the senders' queues (by the heap of their
 * firsts). */
static inline int pend_least(const fl_net_t *n, fl_ev_t *out)
{
	int from = PEND_NONE;
	if (n->in_head < n->in_n) {
		*out = n->in_order[n->in_head];
		from = PEND_LIST;
	}
	if (n->pending.n > 0 && (from == PEND_NONE || ev_before(n->pending.e[0], *out))) {
		*out = n->pending.e[0];
		from = PEND_HEAP;
	}
	if (n->src.n > 0 && (from == PEND_NONE || ev_before(n->src.e[0], *out))) {
		*out = n->src.e[0];
		from = PEND_SRC;
	}
	return from;
}

/* When the next job starts; HUGE_VAL when none waits to. */
static double pend_next(const fl_net_t *n)
{
	fl_ev_t x = {0, 0, 0};
	return pend_least(n, &x) == PEND_NONE ? HUGE_VAL : x.t;
}

/* The next job to start, taken out (one must wait to). */
static int pend_pop(fl_net_t *n)
{
	fl_ev_t x = {0, 0, 0};
	int from = pend_least(n, &x);
	if (from == PEND_LIST)
		return n->in_order[n->in_head++].id;
	if (from == PEND_HEAP)
		return heap_pop(&n->pending).id;
	/* its sender's next takes its place */
	fl_job_t *jb = &n->jobs[x.id];
	n->fhead[jb->src] = jb->fnext;
	if (jb->fnext >= 0)
		heap_replace_top(&n->src, (fl_ev_t){n->jobs[jb->fnext].start, jb->fnext, 0});
	else
		heap_pop(&n->src);
	return x.id;
}

int fl_xfer(fl_net_t *n, double start, int a, int b, int64_t bytes)
{
	int j = new_job(n, start, a);
	if (j < 0)
		return j;
	fl_job_t *jb = &n->jobs[j];
	int res[2];
	net_xfer_loads(n->c, a, b, res);
	/* measured p2p points: bytes and latency scaled so that, alone, the
	 * transfer takes the measured time (1 without points) */
	double scale = net_xfer_scale(n->c, a, b, bytes);
	jb->u.x.res[0] = res[0];
	jb->u.x.res[1] = res[1];
	jb->u.x.bytes = (double)bytes * scale;
	jb->u.x.lat_ms = scale * (dev_node(n->c, a) == dev_node(n->c, b)
					  ? n->c->intra_lat_us * 1e-3
					  : n->c->inter_lat_us * 1e-3);
	return j;
}

int fl_coll(fl_net_t *n, double ready, const int32_t *devs, int nd, int64_t bytes,
	    sp_coll_op_t op)
{
	int j = new_job(n, ready, -1);
	if (j < 0)
		return j;
	fl_job_t *jb = &n->jobs[j];
	jb->coll = 1;
	fl_cjob_t *cj = jb->u.c = sp_arena_calloc(n->a, 1, sizeof *cj);
	if (!cj)
		return SP_ENOMEM;
	cj->devs = devs;
	cj->n_dev = nd;
	if (nd > 0 && !(cj->wnext = sp_arena_array(n->a, (size_t)nd, sizeof(int))))
		return SP_ENOMEM;
	if (bytes <= 0)
		return j; /* nothing to move: done when ready */
	int rc = op == COLL_ALL_REDUCE ? net_allreduce_phases(&cj->co, n->c, devs, nd, bytes, 0, n->a)
				       : net_half_phases(&cj->co, n->c, op, devs, nd, bytes, n->a),
	    most = 0;
	for (int p = 0; p < cj->co.n_phase; p++)
		most = SP_MAX(most, cj->co.ph[p].n_load);
	if (!rc && most > 2 && !(cj->ldbuf = sp_arena_calloc(n->a, (size_t)most, sizeof(fl_ld_t))))
		rc = SP_ENOMEM;
	return rc ? rc : j;
}

/* ---- links in use --------------------------------------------------------------- */

/* Per link, the jobs draining through it; every link whose set changed is
 * a seed of the next sharing (epoch + 1), once: sharing joins the seeds
 * in the order of their first time. Once per link: fl_init's room for
 * every link holds them (inlined: every load of a phase that starts or
 * ends seeds its link, most of them a seed already). */
static inline void seed(fl_net_t *n, int r)
{
	if (n->seeded[r] != n->epoch + 1) {
		n->seeded[r] = n->epoch + 1;
		n->seeds[n->n_seeds++] = r;
	}
}

static int drain_begin(fl_net_t *n, int j)
{
	fl_job_t *jb = &n->jobs[j];
	fl_ld_t *ld = fl_loads(jb);
	jb->state = J_DRAIN;
	jb->rate = 0;
	jb->t_ref = n->now;
	for (int i = 0; i < jb->n_ld; i++) {
		int r = ld[i].res;
		if (n->ln[r] >= n->lcap[r] &&
		    sp_arena_grow(n->a, (void **)&n->lj[r], &n->lcap[r], n->ln[r] + 1,
				  sizeof(struct fl_on)))
			return SP_ENOMEM;
		seed(n, r);
		ld[i].slot = n->ln[r];
		n->lj[r][n->ln[r]++] = (struct fl_on){j, i};
	}
	return 0;
}

static void drain_end(fl_net_t *n, int j)
{
	fl_job_t *jb = &n->jobs[j];
	const fl_ld_t *ld = fl_loads(jb);
	for (int i = 0; i < jb->n_ld; i++) {
		/* the link's last load takes its place */
		int r = ld[i].res, q = ld[i].slot;
		struct fl_on last = n->lj[r][--n->ln[r]];
		n->lj[r][q] = last;
		fl_loads(&n->jobs[last.job])[last.load].slot = q;
		seed(n, r);
	}
}

/* ---- events: phase ends and latencies, least (time, job) first ------------- */

/*
 * A sharing gives most of its jobs their first time, many of them alike
 * (most of m32's start together, of one size), so its new times go into
 * the heap ev by group: the jobs of one time in increasing order in gm,
 * one entry for the group holding its next job (aux: where that job is
 * in gm), which takes the job after it when it leaves the top. A job
 * whose time changes leaves its group: at once when it is the group's
 * entry, else it is skipped there later (its ev_slot no longer names
 * that place). Each entry holds its group's least job, the heap the
 * least of the entries: the events come out in (time, job) order, as
 * from one entry per job, at a fraction of the heap's moves.
 */

/* Entry k's next job, a later one of its group, or the entry gone. */
static void ev_next_of(fl_net_t *n, int k)
{
	fl_ev_t e = n->ev.e[k];
	if (e.aux >= 0)
		for (int i = e.aux + 1; n->gm[i] >= 0; i++)
			if (n->jobs[n->gm[i]].ev_slot == i) {
				if (k == 0)
					heap_replace_top(&n->ev, (fl_ev_t){e.t, n->gm[i], i});
				else
					heap_replace(&n->ev, k, (fl_ev_t){e.t, n->gm[i], i});
				return;
			}
	heap_del(&n->ev, k);
}

/* The next event's time, HUGE_VAL when none. */
static double ev_next(const fl_net_t *n)
{
	return n->ev.n > 0 ? n->ev.e[0].t : HUGE_VAL;
}

/* The most ints gm holds: a few per job the network can hold. */
#define GM_MAX(n) (4 * (n)->cap_jobs + 1024)

/* Job j's event at t, an entry of its own (j has none). */
static void ev_set(fl_net_t *n, int j, double t)
{
	heap_push(&n->ev, (fl_ev_t){t, j, -1});
}

/* The sharing's new times (fresh, their jobs' ev_slot -1) into ev, their
 * old ones out first. A group is a run of fresh with one time and
 * increasing jobs, as most come (the component's jobs in the order
 * found); groups of one time need not be whole, the heap merges them:
 * no sort. SP_ENOMEM. */
static int ev_flush(fl_net_t *n)
{
	const fl_ev_t *f = n->fresh;
	int m = n->n_fresh;
	n->n_fresh = 0;
	for (int i = 0; i < m; i++)
		if (n->ev.pos[f[i].id] >= 0)
			ev_next_of(n, n->ev.pos[f[i].id]);
	if (n->ev.n == 0)
		n->gm_n = 0; /* no entry reads gm */
	/* gm is only reset when ev empties: past GM_MAX ints the times go in
	 * one entry each (the same order of pops), so gm stays bounded. */
	int group = n->gm_n + 2 * m <= GM_MAX(n);
	if (group && m > 0 &&
	    sp_arena_grow(n->a, (void **)&n->gm, &n->gm_cap, n->gm_n + 2 * m, sizeof(int)))
		return SP_ENOMEM;
	for (int i = 0; i < m;) {
		int e = i + 1;
		while (group && e < m && f[e].t == f[i].t && f[e].id > f[e - 1].id)
			e++;
		if (e == i + 1) {
			ev_set(n, f[i].id, f[i].t);
			i++;
			continue;
		}
		heap_push(&n->ev, (fl_ev_t){f[i].t, f[i].id, n->gm_n});
		for (; i < e; i++) {
			n->jobs[f[i].id].ev_slot = n->gm_n;
			n->gm[n->gm_n++] = f[i].id;
		}
		n->gm[n->gm_n++] = -1;
	}
	return 0;
}

/* ---- phases ------------------------------------------------------------------------ */

/* Starts phase jb->phase at n->now, skipping empty ones: 1 when the job is
 * done, 0 when it runs, SP_ENOMEM. */
static int enter_phase(fl_net_t *n, int j)
{
	fl_job_t *jb = &n->jobs[j];
	/* a transfer's phase as a collective's */
	net_load_t xl[2] = {{0, 0}, {0, 0}};
	net_phase_t xph = {0, 2, xl};
	int n_phase = 1;
	if (jb->coll) {
		n_phase = jb->u.c->co.n_phase;
	} else {
		xl[0] = (net_load_t){jb->u.x.res[0], jb->u.x.bytes};
		xl[1] = (net_load_t){jb->u.x.res[1], jb->u.x.bytes};
		xph.lat_ms = jb->u.x.lat_ms;
	}
	for (; jb->phase < n_phase; jb->phase++) {
		const net_phase_t *ph = jb->coll ? &jb->u.c->co.ph[jb->phase] : &xph;
		double v = 0;
		for (int i = 0; i < ph->n_load; i++)
			v = max2(v, ph->load[i].bytes);
		jb->rem = v;
		if (v > 0) {
			jb->n_ld = ph->n_load;
			if (jb->n_ld > 2)
				jb->ld.p = jb->u.c->ldbuf;
			fl_ld_t *ld = fl_loads(jb);
			for (int i = 0; i < ph->n_load; i++) /* sharing's weights, once */
				ld[i] = (fl_ld_t){ph->load[i].res, 0, ph->load[i].bytes / v};
			return drain_begin(n, j);
		}
		if (ph->lat_ms > 0 && (jb->coll || jb->phase + 1 < n_phase)) {
			jb->state = J_DELAY;
			ev_set(n, j, n->now + ph->lat_ms);
			return 0;
		}
	}
	/* a transfer's last latency needs no event: it arrives that much later,
	 * and nothing waits for it before then */
	jb->state = J_DONE;
	jb->done = n->now + (jb->coll ? 0 : jb->u.x.lat_ms);
	return 1;
}

static void finish(fl_net_t *n, int j)
{
	fl_job_t *jb = &n->jobs[j];
	n->arrived |= jb->wake;
	if (!jb->coll)
		return;
	for (int i = 0; i < jb->u.c->n_dev; i++)
		n->busy[jb->u.c->devs[i]] = 0;
	n->freed = 1;
}

/* Phase p of job j is through (its bytes and its latency): the next one. */
static int next_phase(fl_net_t *n, int j)
{
	n->jobs[j].phase++;
	int rc = enter_phase(n, j);
	if (rc == 1)
		finish(n, j);
	return rc < 0 ? rc : 0;
}

/* All-reduce j is ready: it waits behind those ready before it on each
 * of its members. */
static void wait_join(fl_net_t *n, int j)
{
	fl_job_t *jb = &n->jobs[j];
	jb->state = J_WAITING;
	n->waiting[n->n_waiting++] = j;
	n->freed = 1;
	fl_cjob_t *cj = jb->u.c;
	for (int i = 0; i < cj->n_dev; i++) {
		int d = cj->devs[i];
		cj->wnext[i] = -1;
		if (n->whead[d] < 0)
			n->whead[d] = j;
		else
			n->jobs[n->wtail[d]].u.c->wnext[n->wtail_i[d]] = j;
		n->wtail[d] = j;
		n->wtail_i[d] = i;
	}
}

/* Waiting all-reduces whose members are all free start, in order; one
 * that waits holds its members for the later ones (each member's queue:
 * one starts when it is first on every member's, so a device runs its
 * all-reduces in the order they became ready; the queues cost a job's
 * members once, not once per scan); one that finishes at once frees its
 * members for the rest. */
static int start_waiting(fl_net_t *n)
{
	while (n->freed) {
		n->freed = 0;
		int kept = 0, rc = 0, n_waiting = n->n_waiting;
		for (int w = 0; w < n_waiting; w++) {
			int j = n->waiting[w];
			fl_job_t *jb = &n->jobs[j];
			const fl_cjob_t *cj = jb->u.c;
			int free = rc >= 0;
			for (int i = 0; i < cj->n_dev && free; i++)
				free = !n->busy[cj->devs[i]] && n->whead[cj->devs[i]] == j;
			if (!free) {
				n->waiting[kept++] = j;
				continue;
			}
			for (int i = 0; i < cj->n_dev; i++) {
				n->busy[cj->devs[i]] = 1;
				n->whead[cj->devs[i]] = cj->wnext[i];
			}
			if ((rc = enter_phase(n, j)) == 1)
				finish(n, j);
		}
		n->n_waiting = kept;
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* ---- sharing ------------------------------------------------------------------ */

/*
 * Max-min fair rates of the draining phases, by progressive filling: every
 * unfrozen job's rate is the common level x; link r fills at
 *   x_r = left_r / sum_r,  left_r = cap_r - what frozen jobs use,
 *                          sum_r  = sum of unfrozen jobs' bytes_r / V;
 * the link with the least (x_r, r) fills first, its jobs freeze at x_r,
 * and the links they also cross lose their use. A link takes part while an
 * unfrozen job crosses it and its level is a number (0 / 0: it never
 * fills, as no job's rate is bounded by it).
 *
 * The first SCAN_ROUNDS rounds find the least level by a scan of the
 * links that take part (those without unfrozen jobs leave the scan for
 * good): most sharings end within a few rounds (an all-reduce's phase
 * crosses many links and freezes at the first of them to fill), and a
 * scan costs no upkeep. Rounds after that take the links from a heap,
 * each link once with its current level, moved once per round in which
 * its level changed. Both take the same link each round (the least
 * (level, id), levels computed alike), so the rates are the same as with
 * either alone: O(loads + SCAN_ROUNDS * links + links changed per later
 * round * log links) per event.
 *
 * The round that freezes the component's last unfrozen jobs (all on its
 * link; most sharings have no other round) only sets their rates: what
 * the others read (left, sum, unfrozen, the levels) has no reader left,
 * and no scan follows to find that no link takes part. The rates and the
 * order of their events are those of the full rounds.
 */
#define SCAN_ROUNDS 8

/* Link r's level changed. The heap's key of a link that takes part is at
 * most its level, not always equal: a key that would go down moves at
 * once (up the heap, cheap), one that would go up (most: a level rises
 * as the jobs that freeze below it leave) stays, and a link that no
 * longer takes part stays in; lv_least mends them when they reach the
 * top. */
static void lv_update(fl_net_t *n, int r)
{
	double t = n->left[r] / n->sum[r];
	if (n->unfrozen[r] <= 0 || isnan(t))
		return;
	int k = n->lv.pos[r];
	if (k < 0 || t < n->lv.e[k].t)
		heap_set(&n->lv, r, t);
}

/* The least (level, id) of the links that take part, from the heap: -1
 * when none. Every other entry's key is at most its link's level (or its
 * link no longer takes part), so a top whose key is its level is the
 * least, the same link and level as a heap of exact keys would give; a
 * top that is stale is mended (moved down, or out) first. */
static int lv_least(fl_net_t *n, double *level)
{
	while (n->lv.n > 0) {
		int r = n->lv.e[0].id;
		double t = n->left[r] / n->sum[r];
		if (n->unfrozen[r] <= 0 || isnan(t)) {
			heap_pop(&n->lv);
		} else if (t != n->lv.e[0].t) {
			heap_set(&n->lv, r, t);
		} else {
			heap_pop(&n->lv);
			*level = t;
			return r;
		}
	}
	return -1;
}

/* Link r joins the component: full capacity, nothing on it yet, room in
 * on[r] for every load draining through it (the component takes them
 * all). SP_ENOMEM. */
static inline int link_join(fl_net_t *n, int r, int *nl)
{
	if (n->ln[r] > n->oncap[r] &&
	    sp_arena_grow(n->a, (void **)&n->on[r], &n->oncap[r], n->ln[r], sizeof(int)))
		return SP_ENOMEM;
	n->lmark[r] = n->epoch;
	n->links[(*nl)++] = r;
	n->left[r] = n->cap[r];
	n->sum[r] = 0;
	n->cnt[r] = 0;
	return 0;
}

/* The least (level, id) of the na links in act that take part, by scan;
 * links without unfrozen jobs leave act. -1 when none. The first scan
 * (first) sets each link's unfrozen count: all its loads' jobs. */
static inline int lv_scan(fl_net_t *n, int *act, int *na, double *level, int first)
{
	/* locals: the stores to act do not make the compiler reload them */
	int *unfrozen = n->unfrozen;
	const int *cnt = n->cnt;
	const double *left = n->left, *sum = n->sum;
	/* (HUGE_VAL, INT_MAX) after every (level, link): the least (t, r)
	 * without a test for none yet; a NaN level compares false, so it
	 * never takes part */
	int best = INT_MAX, m = *na;
	double lv = HUGE_VAL;
	for (int i = 0; i < m;) {
		int r = act[i];
		if (first)
			unfrozen[r] = cnt[r];
		if (unfrozen[r] == 0) {
			act[i] = act[--m];
			continue;
		}
		double t = left[r] / sum[r];
		if (t < lv || (t == lv && r < best)) {
			best = r;
			lv = t;
		}
		i++;
	}
	*na = m;
	if (best == INT_MAX)
		return -1;
	*level = lv;
	return best;
}

/* The scan's links that take part into the heap (indexed: every link of
 * act gets a position, -1 when out). */
static void lv_build(fl_net_t *n, const int *act, int na)
{
	n->lv.n = 0;
	for (int i = 0; i < na; i++) {
		int r = act[i];
		double t = n->left[r] / n->sum[r];
		n->lv.pos[r] = -1;
		if (n->unfrozen[r] > 0 && !isnan(t))
			n->lv.e[n->lv.n++] = (fl_ev_t){t, r, 0};
	}
	heap_build(&n->lv);
}

/* Whether every one of the component's n_left unfrozen jobs crosses link
 * r (a job's loads on r lie next to each other in on[r]: counted once). */
static int holds_rest(const fl_net_t *n, int r, int n_left)
{
	if (n->unfrozen[r] < n_left)
		return 0;
	const int *on = n->on[r];
	int m = 0;
	for (int q = 0; q < n->cnt[r]; q++)
		m += !n->frozen[on[q]] && (q == 0 || on[q] != on[q - 1]);
	return m == n_left;
}

/* Link r fills at level x: its unfrozen jobs freeze at x; how many. With
 * the heap (heap), the links whose level changed are moved in it. The
 * last round (last: they are all that is left) only sets their rates. */
static inline int freeze_link(fl_net_t *n, int r, double x, int heap, int last)
{
	int n_changed = 0, n_frozen = 0;
	for (int q = 0; q < n->cnt[r]; q++) {
		int k = n->on[r][q];
		if (n->frozen[k])
			continue;
		fl_job_t *jb = &n->jobs[n->comp[k]];
		n->frozen[k] = 1;
		n_frozen++;
		/* what it drained at its old rate, then the new one; at the
		 * same rate its end event stands */
		if (x != jb->rate) {
			jb->rem = max2(0, jb->rem - jb->rate * (n->now - jb->t_ref));
			jb->t_ref = n->now;
			jb->rate = x;
			jb->ev_slot = -1;
			n->fresh[n->n_fresh++] = (fl_ev_t){n->now + jb->rem / x, n->comp[k], 0};
		}
		if (last)
			continue;
		const fl_ld_t *ld = fl_loads(jb);
		for (int i = 0; i < jb->n_ld; i++) {
			int r2 = ld[i].res;
			double w = ld[i].w;
			n->left[r2] -= x * w;
			n->sum[r2] -= w;
			n->unfrozen[r2]--;
			if (heap && !n->touched[r2]) {
				n->touched[r2] = 1;
				n->changed[n_changed++] = r2;
			}
		}
	}
	n->unfrozen[r] = 0;
	for (int i = 0; i < n_changed; i++) {
		n->touched[n->changed[i]] = 0;
		lv_update(n, n->changed[i]);
	}
	return n_frozen;
}

static int share(fl_net_t *n)
{
	int nl = 0, nc = 0, ep = ++n->epoch;
	/* the component of the seeds: links and the jobs draining through them,
	 * closed under "crosses"; rates elsewhere do not change. Jobs are
	 * numbered k in the order found; each link lists its loads' k in
	 * on[r], increasing, and sums their weights bytes_r / V in that order */
	for (int i = 0; i < n->n_seeds; i++)
		if (n->lmark[n->seeds[i]] != ep && link_join(n, n->seeds[i], &nl))
			return SP_ENOMEM;
	n->n_seeds = 0;
	for (int q = 0; q < nl; q++) {
		int r = n->links[q];
		for (int e = 0; e < n->ln[r]; e++) {
			int j = n->lj[r][e].job, k = nc;
			fl_job_t *jb = &n->jobs[j];
			if (jb->jmark == ep)
				continue;
			jb->jmark = ep;
			n->comp[nc++] = j;
			n->frozen[k] = 0;
			const fl_ld_t *ld = fl_loads(jb);
			for (int i = 0; i < jb->n_ld; i++) {
				int r2 = ld[i].res;
				if (n->lmark[r2] != ep && link_join(n, r2, &nl))
					return SP_ENOMEM;
				n->on[r2][n->cnt[r2]++] = k;
				n->sum[r2] += ld[i].w;
			}
		}
	}
	/* n->links, the scan's links, loses those that leave it; the first
	 * scan sets every link's unfrozen count before any freezes */
	double x = 0;
	for (int round = 0, na = nl, n_left = nc; n_left > 0; round++) {
		double t = 0;
		int r;
		if (round == SCAN_ROUNDS)
			lv_build(n, n->links, na);
		if (round < SCAN_ROUNDS) {
			/* two calls: each inlined with its first */
			r = round == 0 ? lv_scan(n, n->links, &na, &t, 1)
				       : lv_scan(n, n->links, &na, &t, 0);
			if (r < 0)
				break;
		} else if ((r = lv_least(n, &t)) < 0) {
			break;
		}
		x = max2(t, x); /* levels only grow; keeps rounding from going back */
		int last = holds_rest(n, r, n_left);
		/* four calls: each inlined with its heap and last */
		if (round >= SCAN_ROUNDS)
			n_left -= last ? freeze_link(n, r, x, 1, 1) : freeze_link(n, r, x, 1, 0);
		else
			n_left -= last ? freeze_link(n, r, x, 0, 1) : freeze_link(n, r, x, 0, 0);
	}
	return ev_flush(n);
}

/* Moves the clock to t and handles every event at t. */
static int step_to(fl_net_t *n, double t)
{
	int rc = 0;
	n->now = t;
	while (!rc && ev_next(n) <= t * (1 + SAME_TIME)) {
		int j = n->ev.e[0].id;
		ev_next_of(n, 0);
		fl_job_t *jb = &n->jobs[j];
		jb->ev_slot = -1;
		if (jb->state == J_DELAY) {
			rc = next_phase(n, j);
			continue;
		}
		/* its bytes are through */
		double lat = jb->coll ? jb->u.c->co.ph[jb->phase].lat_ms : jb->u.x.lat_ms;
		drain_end(n, j);
		if (lat <= 0 || !jb->coll) { /* a transfer's one phase is its last */
			rc = next_phase(n, j);
		} else {
			jb->state = J_DELAY;
			ev_set(n, j, t + lat);
		}
	}
	while (!rc && pend_next(n) <= t * (1 + SAME_TIME)) {
		int j = pend_pop(n);
		fl_job_t *jb = &n->jobs[j];
		if (jb->coll) {
			wait_join(n, j);
		} else if ((rc = enter_phase(n, j)) == 1) {
			finish(n, j);
			rc = 0;
		}
	}
	return rc ? rc : start_waiting(n);
}

int fl_advance(fl_net_t *n, int until_arrival)
{
	int rc;
	for (;;) {
		if (n->n_seeds > 0 && (rc = share(n)))
			return rc;
		double t = pend_next(n);
		t = min2(t, ev_next(n));
		if (t == HUGE_VAL)
			return 0;
		n->arrived = 0;
		if ((rc = step_to(n, max2(t, n->now))))
			return rc;
		if (until_arrival && n->arrived)
			return 1;
	}
}

void fl_await(fl_net_t *n, int j)
{
	n->jobs[j].wake = 1;
}
