/*
 * sched.c — the schedule structure every algorithm produces (waves of
 * slices with layer ranges, device counts and nominal times), its checker,
 * and the three baselines computed with the same cost model:
 *
 *  sequential  each task in turn, each MetaOp on min(N, B) devices
 *              (data parallel on the whole cluster: Megatron-LM/DeepSpeed),
 *              sync overlapped with backward: our strong baseline.
 *  sequential-paper  the same schedule as the paper's baseline runs it
 *              (Spindle §6.1: Megatron-LM/DeepSpeed, gradients accumulated
 *              task by task): no chunks, one sync after the last backward.
 *  task-level  each task on its own fixed group, tasks concurrent; group
 *              sizes by Optimus-style marginal gain: start every task at one
 *              device, then give each further device to the task whose
 *              completion time drops most from it. With more tasks than
 *              devices, tasks go longest-first onto single devices.
 *  distmm-mt   tasks in turn; inside a task the MetaOps of one level run in
 *              parallel, devices split so that they finish together (the
 *              relaxed C* of that level, rounded down, leftovers to the
 *              MetaOp with most time left), then the next level.
 *
 * Nominal times (t0, t1) are each algorithm's own estimate; the simulator
 * (sim.c) judges all of them on the lowered programs. Also the helpers our
 * schedulers share (widths that gain, bottom levels). Schedules and their
 * temporaries live in pl->scratch; nothing here is freed one by one.
 */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The algorithms: name, sync overlapped with backward, each task's
 * backward right after its forward (gradients accumulated task by task). */
static const struct {
	const char *name;
	int overlap, task_by_task;
} algos[ALGO__COUNT] = {
	[ALGO_SPINDLE] = {"spindle", 1, 0},
	[ALGO_PAPER] = {"spindle-paper", 0, 0},
	[ALGO_SEQUENTIAL] = {"sequential", 1, 0},
	[ALGO_TASK_LEVEL] = {"task-level", 1, 0},
	[ALGO_DISTMM] = {"distmm-mt", 1, 0},
	[ALGO_SEQUENTIAL_PAPER] = {"sequential-paper", 0, 1},
};

const char *algo_name(algo_t a)
{
	return (unsigned)a < ALGO__COUNT ? algos[a].name : "?";
}

int algo_overlaps_sync(algo_t a)
{
	return (unsigned)a < ALGO__COUNT && algos[a].overlap;
}

int algo_task_by_task(algo_t a)
{
	return (unsigned)a < ALGO__COUNT && algos[a].task_by_task;
}

int algo_parse(const char *s, algo_t *out)
{
	for (int a = 0; a < ALGO__COUNT; a++)
		if (!strcmp(s, algo_name((algo_t)a))) {
			*out = (algo_t)a;
			return 0;
		}
	return -1;
}

void sched_init(sched_t *s, algo_t a, sp_arena_t *arena)
{
	memset(s, 0, sizeof *s);
	s->algo = a;
	s->arena = arena;
}

static int push_slice(sched_t *s, sslice_t x)
{
	if (sp_arena_grow(s->arena, (void **)&s->s, &s->cap, s->n + 1, sizeof *s->s))
		return SP_ENOMEM;
	s->s[s->n++] = x;
	return 0;
}

int sched_push(sched_t *s, int metaop, int lf, int lt, int n, int wave, double t0,
	       double t1)
{
	return push_slice(s, (sslice_t){metaop, lf, lt, n, wave, t0, t1, 0, -1, 0});
}

int sched_push_devs(sched_t *s, int metaop, int lf, int lt, int n, double t0, double t1,
		    const int32_t *devs)
{
	sslice_t x = {metaop, lf, lt, n, 0, t0, t1, 0, s->n_devs, 0};
	if (sp_arena_grow(s->arena, (void **)&s->devs, &s->cap_devs, s->n_devs + n,
			  sizeof(int32_t)))
		return SP_ENOMEM;
	memcpy(s->devs + s->n_devs, devs, sizeof(int32_t) * (size_t)n);
	s->n_devs += n;
	return push_slice(s, x);
}

int sched_copy(sched_t *out, const sched_t *s)
{
	sp_arena_t *a = out->arena;
	out->n = out->n_devs = 0;
	if (sp_arena_grow(a, (void **)&out->s, &out->cap, s->n, sizeof *s->s) ||
	    sp_arena_grow(a, (void **)&out->devs, &out->cap_devs, s->n_devs, sizeof *s->devs))
		return SP_ENOMEM;
	if (s->n)
		memcpy(out->s, s->s, sizeof *s->s * (size_t)s->n);
	if (s->n_devs)
		memcpy(out->devs, s->devs, sizeof *s->devs * (size_t)s->n_devs);
	out->algo = s->algo;
	out->n = s->n;
	out->n_waves = s->n_waves;
	out->n_devs = s->n_devs;
	out->bwd_eager = s->bwd_eager;
	return 0;
}

int sched_keep_shorter(sched_t *out, const sched_t *t, int rc, double *best_ms)
{
	double ms = sched_makespan(t);
	if (rc || ms >= *best_ms * (1 - 1e-9))
		return rc;
	*best_ms = ms;
	return sched_copy(out, t);
}

double sched_makespan(const sched_t *s)
{
	double ms = 0;
	for (int i = 0; i < s->n; i++)
		ms = fmax(ms, s->s[i].t1);
	return ms;
}

int width_gains(const metaop_t *m, int c)
{
	return c == 1 || mop_t(m, c) < mop_t(m, c - 1) * (1 - 1e-12);
}

int width_floor(const metaop_t *m, int n)
{
	if (m->wfloor && n >= 1 && n <= m->nmax)
		return m->wfloor[n];
	while (n > 1 && !width_gains(m, n))
		n--;
	return n;
}

void sched_blevels(const planner_t *pl, const int *w, double *bl)
{
	for (int q = pl->n_mops - 1; q >= 0; q--) {
		int m = pl->topo[q];
		const metaop_t *mo = &pl->mops[m];
		double after = 0;
		for (int s = 0; s < mo->n_succ; s++)
			after = fmax(after, bl[pl->edges[mo->succ[s]].dst]);
		bl[m] = mo->n_layers * mop_t(mo, w[m]) + after;
	}
}

int mop_comp(const planner_t *pl, int m, int l, int *layer)
{
	const metaop_t *mo = &pl->mops[m];
	const sp_op_t *op = &pl->ops[mo->first_op + l];
	*layer = op->layer;
	return pl->model->tasks[mo->task].nodes[op->node].comp;
}

typedef struct {
	sslice_t s;
	int idx;
} keyed_t;

static int cmp_slice(const void *a, const void *b)
{
	const keyed_t *x = a, *y = b;
	if (x->s.t0 != y->s.t0)
		return x->s.t0 < y->s.t0 ? -1 : 1;
	if (x->s.wave != y->s.wave)
		return x->s.wave - y->s.wave;
	return x->idx - y->idx;
}

int sched_finish(sched_t *s)
{
	keyed_t *k = sp_arena_calloc(s->arena, (size_t)(s->n + 1), sizeof *k);
	if (!k)
		return SP_ENOMEM;
	for (int i = 0; i < s->n; i++)
		k[i] = (keyed_t){s->s[i], i};
	qsort(k, (size_t)s->n, sizeof *k, cmp_slice);
	int w = -1;
	for (int i = 0; i < s->n; i++) {
		if (i == 0 || k[i].s.t0 > k[i - 1].s.t0 + 1e-9 || k[i].s.wave != k[i - 1].s.wave)
			w++;
		s->s[i] = k[i].s;
		s->s[i].wave = w;
	}
	s->n_waves = w + 1;
	return 0;
}

/* Slices whose devices the scheduler chose: devices in range, distinct in
 * a slice, and no device in two slices at once. */
typedef struct {
	double t0, t1;
	int slice;
} busy_t;

static int cmp_busy(const void *a, const void *b)
{
	const busy_t *x = a, *y = b;
	return sched_cmp_key_id(x->t0, x->slice, y->t0, y->slice);
}

static int check_devices(const planner_t *pl, const sched_t *s, double eps)
{
	int N = pl->N;
	size_t total = 0;
	for (int i = 0; i < s->n; i++)
		total += s->s[i].dev_off >= 0 ? (size_t)s->s[i].n : 0;
	sp_arena_t *a = s->arena;
	int *cnt = sp_arena_calloc(a, (size_t)N + 1, sizeof(int));
	int *off = sp_arena_calloc(a, (size_t)N + 2, sizeof(int));
	int *seen = sp_arena_calloc(a, (size_t)N + 1, sizeof(int)); /* slice + 1 that last had d */
	busy_t *b = sp_arena_calloc(a, total + 1, sizeof *b);
	if (!cnt || !off || !seen || !b)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		if (x->dev_off < 0)
			continue;
		for (int q = 0; q < x->n; q++) {
			int d = s->devs[x->dev_off + q];
			int dup = d >= 0 && d < N && seen[d] == i + 1;
			if (d < 0 || d >= N || dup) {
				return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						"%s schedule: slice of '%s' has device %d %s",
						algo_name(s->algo), pl->mops[x->metaop].name, d,
						dup ? "twice" : "out of range");
			}
			seen[d] = i + 1;
			cnt[d]++;
		}
	}
	for (int d = 0; d < N; d++)
		off[d + 1] = off[d] + cnt[d];
	for (int d = 0; d < N; d++)
		cnt[d] = off[d];
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		if (x->dev_off >= 0)
			for (int q = 0; q < x->n; q++)
				b[cnt[s->devs[x->dev_off + q]]++] = (busy_t){x->t0, x->t1, i};
	}
	for (int d = 0; d < N; d++) {
		busy_t *v = b + off[d];
		int n = off[d + 1] - off[d];
		qsort(v, (size_t)n, sizeof *v, cmp_busy);
		for (int k = 1; k < n; k++)
			if (v[k].t0 + eps < v[k - 1].t1) {
				return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						"%s schedule: device %d runs '%s' (%.3f-%.3f ms) "
						"and '%s' (%.3f-%.3f ms) at once",
						algo_name(s->algo), d,
						pl->mops[s->s[v[k - 1].slice].metaop].name,
						v[k - 1].t0, v[k - 1].t1,
						pl->mops[s->s[v[k].slice].metaop].name, v[k].t0,
						v[k].t1);
			}
	}
	return 0;
}

int sched_check(const planner_t *pl, const sched_t *s)
{
	const double eps = 1e-6;
	for (int m = 0; m < pl->n_mops; m++) {
		const metaop_t *mo = &pl->mops[m];
		int next = 0, count = 0;
		double first_t0 = -1, last_t1 = 0;
		for (int i = 0; i < s->n; i++) {
			const sslice_t *x = &s->s[i];
			if (x->metaop != m)
				continue;
			if (x->lf != next || x->lt <= x->lf || x->n < 1 || x->n > mo->nmax)
				return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						  "%s schedule: MetaOp '%s' slice [%d,%d) on %d "
						  "devices breaks coverage",
						  algo_name(s->algo), mo->name, x->lf, x->lt, x->n);
			if (count == 0)
				first_t0 = x->t0;
			next = x->lt;
			last_t1 = x->t1;
			count++;
		}
		if (next != mo->n_layers || (mo->sink && count != 1))
			return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "%s schedule: MetaOp '%s' covers %d of %d layers",
					  algo_name(s->algo), mo->name, next, mo->n_layers);
		for (int q = 0; q < mo->n_pred; q++) {
			int p = pl->edges[mo->pred[q]].src;
			double pt1 = 0;
			for (int i = 0; i < s->n; i++)
				if (s->s[i].metaop == p)
					pt1 = s->s[i].t1;
			if (first_t0 + eps < pt1)
				return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
						  "%s schedule: '%s' starts before its input '%s' "
						  "is done",
						  algo_name(s->algo), mo->name, pl->mops[p].name);
		}
		(void)last_t1;
	}
	for (int i = 0; i < s->n; i++) {
		int used = 0;
		for (int j = 0; j < s->n; j++)
			if (s->s[j].t0 <= s->s[i].t0 + eps && s->s[j].t1 > s->s[i].t0 + eps)
				used += s->s[j].n;
		if (used > pl->N)
			return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "%s schedule: %d devices in use at %.3f ms (of %d)",
					  algo_name(s->algo), used, s->s[i].t0, pl->N);
	}
	return check_devices(pl, s, eps);
}

/* ---- sequential ---- */

int sched_sequential(planner_t *pl, sched_t *out)
{
	double t = 0;
	int w = 0;
	for (int ti = 0; ti < pl->model->n_tasks; ti++)
		for (int k = 0; k < pl->n_mops; k++) {
			const metaop_t *m = &pl->mops[pl->topo[k]];
			if (m->task != ti)
				continue;
			double d = m->n_layers * mop_t(m, m->nmax);
			if (sched_push(out, pl->topo[k], 0, m->n_layers, m->nmax, w++, t, t + d))
				return SP_ENOMEM;
			t += d;
		}
	return 0;
}

/* ---- task-level ---- */

static double task_time(const planner_t *pl, int ti, int g)
{
	double t = 0;
	for (int k = 0; k < pl->n_mops; k++) {
		const metaop_t *m = &pl->mops[k];
		if (m->task == ti)
			t += m->n_layers * mop_t(m, SP_MIN(g, m->nmax));
	}
	return t;
}

int sched_task_level(planner_t *pl, sched_t *out)
{
	int T = pl->model->n_tasks, N = pl->N;
	int *g = sp_arena_calloc(&pl->scratch, (size_t)T, sizeof(int));
	double *free_at = sp_arena_calloc(&pl->scratch, (size_t)N, sizeof(double));
	int *order = sp_arena_calloc(&pl->scratch, (size_t)T, sizeof(int));
	if (!g || !free_at || !order)
		return SP_ENOMEM;
	for (int t = 0; t < T; t++) {
		g[t] = 1;
		order[t] = t;
	}
	if (T <= N) {
		for (int left = N - T; left > 0; left--) {
			int best = -1;
			double gain = 1e-12;
			for (int t = 0; t < T; t++) {
				double d = task_time(pl, t, g[t]) - task_time(pl, t, g[t] + 1);
				if (d > gain) {
					gain = d;
					best = t;
				}
			}
			if (best < 0)
				break;
			g[best]++;
		}
	} else {
		/* longest task first (stable) */
		for (int i = 1; i < T; i++)
			for (int j = i; j > 0 && task_time(pl, order[j], 1) >
							 task_time(pl, order[j - 1], 1);
			     j--) {
				int x = order[j];
				order[j] = order[j - 1];
				order[j - 1] = x;
			}
	}
	/* place task groups: T <= N: disjoint groups from 0; else earliest-free device */
	for (int i = 0; i < T; i++) {
		int ti = order[i];
		double t = 0;
		if (T > N) {
			int d = 0;
			for (int k = 1; k < N; k++)
				if (free_at[k] < free_at[d])
					d = k;
			t = free_at[d];
			free_at[d] = t + task_time(pl, ti, 1);
		}
		for (int k = 0; k < pl->n_mops; k++) {
			const metaop_t *m = &pl->mops[pl->topo[k]];
			if (m->task != ti)
				continue;
			int n = SP_MIN(g[ti], m->nmax);
			double d = m->n_layers * mop_t(m, n);
			if (sched_push(out, pl->topo[k], 0, m->n_layers, n, 0, t, t + d))
				return SP_ENOMEM;
			t += d;
		}
	}
	return 0;
}

/* ---- distmm-mt ---- */

/* Integer device counts for independent MetaOps ids[0..k) on N devices, so
 * that they finish together as nearly as integers allow. */
static int split_devices(planner_t *pl, const int *ids, int k, int N, int *n_out)
{
	double *rem = sp_arena_calloc(&pl->scratch, (size_t)k, sizeof(double));
	double *nr = sp_arena_calloc(&pl->scratch, (size_t)k, sizeof(double));
	int used = 0;
	if (!rem || !nr)
		return SP_ENOMEM;
	for (int i = 0; i < k; i++)
		rem[i] = pl->mops[ids[i]].n_layers;
	relaxed_cstar(pl, ids, rem, k, N, nr);
	for (int i = 0; i < k; i++) {
		n_out[i] = SP_MAX(1, SP_MIN((int)floor(nr[i] + 1e-9), pl->mops[ids[i]].nmax));
		used += n_out[i];
	}
	while (used > N) { /* more MetaOps than devices is handled by the caller */
		int worst = -1;
		for (int i = 0; i < k; i++)
			if (n_out[i] > 1 && (worst < 0 || n_out[i] > n_out[worst]))
				worst = i;
		if (worst < 0)
			break;
		n_out[worst]--;
		used--;
	}
	while (used < N) {
		int best = -1;
		double bt = -1;
		for (int i = 0; i < k; i++) {
			const metaop_t *m = &pl->mops[ids[i]];
			double t = m->n_layers * mop_t(m, n_out[i]);
			if (n_out[i] < m->nmax && t > bt) {
				bt = t;
				best = i;
			}
		}
		if (best < 0)
			break;
		n_out[best]++;
		used++;
	}
	return 0;
}

int sched_distmm(planner_t *pl, sched_t *out)
{
	int w = 0;
	double t = 0;
	int *ids = sp_arena_calloc(&pl->scratch, (size_t)(pl->n_mops + 1), sizeof(int));
	int *n = sp_arena_calloc(&pl->scratch, (size_t)(pl->n_mops + 1), sizeof(int));
	if (!ids || !n)
		return SP_ENOMEM;
	for (int ti = 0; ti < pl->model->n_tasks; ti++)
		for (int lv = 0; lv < pl->n_levels; lv++) {
			int k = 0;
			for (int q = 0; q < pl->n_mops; q++)
				if (pl->mops[pl->topo[q]].task == ti && pl->mops[pl->topo[q]].level == lv)
					ids[k++] = pl->topo[q];
			/* chunks of at most N MetaOps run as one wave each */
			for (int c0 = 0; c0 < k; c0 += pl->N) {
				int kc = SP_MIN(pl->N, k - c0);
				if (split_devices(pl, ids + c0, kc, pl->N, n + c0))
					return SP_ENOMEM;
				double d = 0;
				for (int i = c0; i < c0 + kc; i++) {
					const metaop_t *m = &pl->mops[ids[i]];
					d = fmax(d, m->n_layers * mop_t(m, n[i]));
				}
				for (int i = c0; i < c0 + kc; i++) {
					const metaop_t *m = &pl->mops[ids[i]];
					if (sched_push(out, ids[i], 0, m->n_layers, n[i], w, t,
						       t + m->n_layers * mop_t(m, n[i])))
						return SP_ENOMEM;
				}
				w++;
				t += d;
			}
		}
	return 0;
}

int sched_run(planner_t *pl, algo_t a, cand_state_t *st, const sched_cand_t *c,
	      sched_t *out)
{
	sched_init(out, a, &pl->scratch);
	int rc;
	switch (a) {
	case ALGO_SEQUENTIAL:
	case ALGO_SEQUENTIAL_PAPER: rc = sched_sequential(pl, out); break;
	case ALGO_TASK_LEVEL: rc = sched_task_level(pl, out); break;
	case ALGO_DISTMM: rc = sched_distmm(pl, out); break;
	case ALGO_PAPER: rc = sched_paper(pl, out); break;
	case ALGO_SPINDLE: rc = cand_schedule(pl, st, c, out); break;
	default: rc = SP_EINTERNAL; break;
	}
	if (rc == SP_ENOMEM)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	if (rc) /* an error, or SCHED_NOTHING_NEW */
		return rc;
	if (sched_finish(out))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	if ((rc = sched_check(pl, out)))
		return rc;
	if (tp_assign(pl, out))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	if (algo_overlaps_sync(a) && sched_chunk(out, pl))
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	return 0;
}

int sched_chunk(sched_t *s, const planner_t *pl)
{
	int extra = 0;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		if (pl->mops[x->metaop].shape.type == COMP_TRANSFORMER)
			extra += SP_MIN(x->lt - x->lf, SYNC_CHUNKS) - 1;
	}
	if (!extra)
		return 0;
	sslice_t *ns = sp_arena_calloc(s->arena, (size_t)(s->n + extra), sizeof *ns);
	if (!ns)
		return SP_ENOMEM;
	int n = 0;
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		int L = x->lt - x->lf;
		int c = pl->mops[x->metaop].shape.type == COMP_TRANSFORMER ? SP_MIN(L, SYNC_CHUNKS) : 1;
		double per = L > 0 ? (x->t1 - x->t0) / L : 0;
		for (int k = 0; k < c; k++) {
			int a = x->lf + L * k / c, b = x->lf + L * (k + 1) / c;
			ns[n++] = (sslice_t){x->metaop, a, b, x->n, x->wave, x->t0 + (a - x->lf) * per,
					     x->t0 + (b - x->lf) * per, k > 0, x->dev_off, x->tp};
		}
	}
	s->s = ns;
	s->n = s->cap = n;
	return 0;
}
