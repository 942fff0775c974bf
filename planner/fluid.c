/*
 * fluid.c — the simulator's network: transfers and all-reduces in flight at
 * the same time share the links they cross. It times jobs whose prices and
 * per-link loads net.c gives; it knows nothing of programs (sim.c feeds it
 * jobs as the devices issue them and asks when they finish).
 *
 * A job is a sequence of phases (a transfer: one; an all-reduce: one for a
 * ring, three for the hierarchical algorithm); a phase puts bytes_r on each
 * link r it crosses, then waits its latency. The phase drains at a rate x
 * (bytes per ms on its most loaded link, V = max_r bytes_r), loading link r
 * with x * bytes_r / V; alone on the network it takes max_r bytes_r / cap_r,
 * net.c's price.
 *
 * Sharing is max-min fair, by progressive filling: raise the rate of every
 * job not yet frozen together; when a link is full, freeze the jobs on it;
 * repeat until all are frozen. It is recomputed at every event where a
 * phase starts or stops draining, so a job speeds up when a competitor
 * leaves. Why this rule: InfiniBand and NVLink arbitrate per queue pair /
 * channel in round robin, which gives competing long flows equal shares of
 * a bottleneck and lets a flow limited elsewhere leave its unused share to
 * the others; that is max-min fairness (Bertsekas & Gallager, Data
 * Networks, 6.5.2). Equal shares per job rather than per NCCL channel: a
 * collective runs as many channels as a transfer has queue pairs, to first
 * order.
 *
 * All-reduces run one at a time per device (the runtime issues them on one
 * stream): one that is ready waits until none of its members is in another;
 * waiting ones start in the order they became ready (ties: first added).
 */
#include "planner.h"

#include <math.h>
#include <string.h>

enum { J_PENDING, J_WAITING, J_DRAIN, J_DELAY, J_DONE };

/* Relative tolerance under which two event times are one event. */
#define SAME_TIME 1e-12

int fl_init(fl_net_t *out, const sp_cluster_t *c, sp_arena_t *a, int max_jobs)
{
	memset(out, 0, sizeof *out);
	out->c = c;
	out->a = a;
	out->cap_jobs = max_jobs;
	int nr = net_n_res(c), N = c->nodes * c->gpus_per_node;
	size_t nj = (size_t)max_jobs + 1;
	out->jobs = sp_arena_calloc(a, nj, sizeof *out->jobs);
	out->pending = sp_arena_calloc(a, nj, sizeof(int));
	out->active = sp_arena_calloc(a, nj, sizeof(int));
	out->waiting = sp_arena_calloc(a, nj, sizeof(int));
	out->frozen = sp_arena_calloc(a, nj, sizeof(char));
	out->busy = sp_arena_calloc(a, (size_t)N + 1, sizeof(char));
	out->used = sp_arena_calloc(a, (size_t)nr + 1, sizeof(double));
	out->sum = sp_arena_calloc(a, (size_t)nr + 1, sizeof(double));
	if (!out->jobs || !out->pending || !out->active || !out->waiting || !out->frozen ||
	    !out->busy || !out->used || !out->sum)
		return SP_ENOMEM;
	return 0;
}

/* ---- the pending heap, by (start, job) ------------------------------------- */

static int before(const fl_net_t *n, int i, int j)
{
	double a = n->jobs[i].start, b = n->jobs[j].start;
	return a < b || (a == b && i < j);
}

static void heap_push(fl_net_t *n, int j)
{
	int k = n->n_pending++;
	n->pending[k] = j;
	while (k > 0 && before(n, n->pending[k], n->pending[(k - 1) / 2])) {
		int p = (k - 1) / 2, t = n->pending[p];
		n->pending[p] = n->pending[k];
		n->pending[k] = t;
		k = p;
	}
}

static int heap_pop(fl_net_t *n)
{
	int top = n->pending[0];
	n->pending[0] = n->pending[--n->n_pending];
	for (int k = 0;;) {
		int l = 2 * k + 1, r = l + 1, m = k;
		if (l < n->n_pending && before(n, n->pending[l], n->pending[m]))
			m = l;
		if (r < n->n_pending && before(n, n->pending[r], n->pending[m]))
			m = r;
		if (m == k)
			break;
		int t = n->pending[m];
		n->pending[m] = n->pending[k];
		n->pending[k] = t;
		k = m;
	}
	return top;
}

/* ---- adding jobs ------------------------------------------------------------ */

static int new_job(fl_net_t *n, double start)
{
	if (n->n_jobs >= n->cap_jobs)
		return SP_EINTERNAL;
	int j = n->n_jobs++;
	fl_job_t *jb = &n->jobs[j];
	memset(jb, 0, sizeof *jb);
	jb->start = fmax(start, n->now); /* sim.c never adds one in the past */
	jb->done = -1;
	jb->state = J_PENDING;
	heap_push(n, j);
	return j;
}

int fl_xfer(fl_net_t *n, double start, int a, int b, int64_t bytes)
{
	int j = new_job(n, start);
	if (j < 0)
		return j;
	fl_job_t *jb = &n->jobs[j];
	int res[2];
	net_xfer_loads(n->c, a, b, res);
	jb->xl[0] = (net_load_t){res[0], (double)bytes};
	jb->xl[1] = (net_load_t){res[1], (double)bytes};
	jb->co.n_phase = 1;
	jb->co.ph[0] = (net_phase_t){.lat_ms = dev_node(n->c, a) == dev_node(n->c, b)
						       ? n->c->intra_lat_us * 1e-3
						       : n->c->inter_lat_us * 1e-3,
				     .n_load = 2, .load = jb->xl};
	return j;
}

int fl_allreduce(fl_net_t *n, double ready, const int32_t *devs, int nd, int64_t bytes)
{
	int j = new_job(n, ready);
	if (j < 0)
		return j;
	fl_job_t *jb = &n->jobs[j];
	jb->coll = 1;
	jb->devs = devs;
	jb->n_dev = nd;
	return bytes > 0 ? net_allreduce_phases(&jb->co, n->c, devs, nd, bytes, n->a) : 0;
}

/* ---- events ----------------------------------------------------------------- */

static void set_active(fl_net_t *n, int j)
{
	n->active[n->n_active++] = j;
}

/* Starts phase jb->phase at n->now, skipping empty ones; 1 when the job is
 * done. */
static int enter_phase(fl_net_t *n, fl_job_t *jb)
{
	for (; jb->phase < jb->co.n_phase; jb->phase++) {
		const net_phase_t *ph = &jb->co.ph[jb->phase];
		double v = 0;
		for (int i = 0; i < ph->n_load; i++)
			v = fmax(v, ph->load[i].bytes);
		jb->vol = jb->rem = v;
		if (v > 0) {
			jb->state = J_DRAIN;
			n->changed = 1;
			return 0;
		}
		if (ph->lat_ms > 0) {
			jb->state = J_DELAY;
			jb->t_end = n->now + ph->lat_ms;
			return 0;
		}
	}
	jb->state = J_DONE;
	jb->done = n->now;
	return 1;
}

static void finish(fl_net_t *n, int j)
{
	fl_job_t *jb = &n->jobs[j];
	if (!jb->coll) {
		n->arrived = 1;
		return;
	}
	for (int i = 0; i < jb->n_dev; i++)
		n->busy[jb->devs[i]] = 0;
	n->freed = 1;
}

/* Waiting all-reduces whose members are all free start, in order; one that
 * finishes at once frees its members for the rest. */
static void start_waiting(fl_net_t *n)
{
	while (n->freed) {
		n->freed = 0;
		int kept = 0;
		for (int w = 0; w < n->n_waiting; w++) {
			int j = n->waiting[w];
			fl_job_t *jb = &n->jobs[j];
			int free = 1;
			for (int i = 0; i < jb->n_dev && free; i++)
				free = !n->busy[jb->devs[i]];
			if (!free) {
				n->waiting[kept++] = j;
				continue;
			}
			for (int i = 0; i < jb->n_dev; i++)
				n->busy[jb->devs[i]] = 1;
			if (enter_phase(n, jb))
				finish(n, j);
			else
				set_active(n, j);
		}
		n->n_waiting = kept;
	}
}

static double end_of(const fl_net_t *n, const fl_job_t *jb)
{
	return jb->state == J_DRAIN ? n->now + jb->rem / jb->rate : jb->t_end;
}

/* Max-min fair rates of the draining phases (progressive filling). */
static void share(fl_net_t *n)
{
	const sp_cluster_t *c = n->c;
	int left = 0;
	for (int k = 0; k < n->n_active; k++) {
		fl_job_t *jb = &n->jobs[n->active[k]];
		n->frozen[k] = jb->state != J_DRAIN;
		left += !n->frozen[k];
		const net_phase_t *ph = &jb->co.ph[jb->phase];
		for (int i = 0; i < ph->n_load; i++)
			n->used[ph->load[i].res] = 0;
	}
	while (left > 0) {
		for (int k = 0; k < n->n_active; k++) {
			const fl_job_t *jb = &n->jobs[n->active[k]];
			const net_phase_t *ph = &jb->co.ph[jb->phase];
			for (int i = 0; i < ph->n_load; i++)
				n->sum[ph->load[i].res] = 0;
		}
		for (int k = 0; k < n->n_active; k++) {
			const fl_job_t *jb = &n->jobs[n->active[k]];
			const net_phase_t *ph = &jb->co.ph[jb->phase];
			for (int i = 0; i < ph->n_load && !n->frozen[k]; i++)
				n->sum[ph->load[i].res] += ph->load[i].bytes / jb->vol;
		}
		/* the level at which the first link fills */
		double lvl = HUGE_VAL;
		for (int k = 0; k < n->n_active; k++) {
			const fl_job_t *jb = &n->jobs[n->active[k]];
			const net_phase_t *ph = &jb->co.ph[jb->phase];
			for (int i = 0; i < ph->n_load && !n->frozen[k]; i++) {
				int r = ph->load[i].res;
				lvl = fmin(lvl, (net_res_gbs(c, r) * 1e6 - n->used[r]) / n->sum[r]);
			}
		}
		/* freeze the jobs on the links that filled, then charge them */
		int first = n->n_active;
		for (int k = 0; k < n->n_active; k++) {
			fl_job_t *jb = &n->jobs[n->active[k]];
			const net_phase_t *ph = &jb->co.ph[jb->phase];
			int full = 0;
			for (int i = 0; i < ph->n_load && !n->frozen[k] && !full; i++) {
				int r = ph->load[i].res;
				full = (net_res_gbs(c, r) * 1e6 - n->used[r]) / n->sum[r] <=
				       lvl * (1 + 1e-9);
			}
			if (full) {
				jb->rate = lvl;
				n->frozen[k] = 2;
				first = SP_MIN(first, k);
			}
		}
		for (int k = first; k < n->n_active; k++) {
			if (n->frozen[k] != 2)
				continue;
			const fl_job_t *jb = &n->jobs[n->active[k]];
			const net_phase_t *ph = &jb->co.ph[jb->phase];
			for (int i = 0; i < ph->n_load; i++)
				n->used[ph->load[i].res] += lvl * ph->load[i].bytes / jb->vol;
			n->frozen[k] = 1;
			left--;
		}
	}
}

/* Moves the clock to t and handles every event at t. */
static void step_to(fl_net_t *n, double t)
{
	for (int k = 0; k < n->n_active; k++) {
		fl_job_t *jb = &n->jobs[n->active[k]];
		if (jb->state == J_DRAIN)
			jb->rem = end_of(n, jb) <= t * (1 + SAME_TIME) ? 0
								     : jb->rem - jb->rate * (t - n->now);
	}
	n->now = t;
	int kept = 0, n0 = n->n_active;
	for (int k = 0; k < n0; k++) {
		int j = n->active[k];
		fl_job_t *jb = &n->jobs[j];
		int next = 0;
		if (jb->state == J_DRAIN && jb->rem <= 0) {
			n->changed = 1;
			double lat = jb->co.ph[jb->phase].lat_ms;
			jb->state = J_DELAY;
			jb->t_end = t + lat;
			next = lat <= 0;
		} else if (jb->state == J_DELAY && jb->t_end <= t * (1 + SAME_TIME)) {
			next = 1;
		}
		if (next) {
			jb->phase++;
			if (enter_phase(n, jb)) {
				finish(n, j);
				continue;
			}
		}
		n->active[kept++] = j;
	}
	/* jobs activated above by nobody; keep the list compact */
	n->n_active = kept;
	while (n->n_pending > 0 && n->jobs[n->pending[0]].start <= t * (1 + SAME_TIME)) {
		int j = heap_pop(n);
		fl_job_t *jb = &n->jobs[j];
		if (jb->coll) {
			jb->state = J_WAITING;
			n->waiting[n->n_waiting++] = j;
			n->freed = 1;
		} else if (enter_phase(n, jb)) {
			finish(n, j);
		} else {
			set_active(n, j);
		}
	}
	start_waiting(n);
}

int fl_advance(fl_net_t *n, int until_arrival)
{
	for (;;) {
		if (n->changed) {
			n->changed = 0;
			share(n);
		}
		double t = n->n_pending > 0 ? n->jobs[n->pending[0]].start : HUGE_VAL;
		for (int k = 0; k < n->n_active; k++)
			t = fmin(t, end_of(n, &n->jobs[n->active[k]]));
		if (t == HUGE_VAL)
			return 0;
		n->arrived = 0;
		step_to(n, fmax(t, n->now));
		if (until_arrival && n->arrived)
			return 1;
	}
}

double fl_done(const fl_net_t *n, int j)
{
	return n->jobs[j].done;
}
