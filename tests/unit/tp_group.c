/*
 * tp_group.c — the threads and the shared-memory all-reduce of tp_group.h.
 * Each all-reduce: every member publishes its buffer, waits at a barrier,
 * sums all buffers in rank order into private memory, waits again (no one
 * still reads), then copies the sum back. Not a benchmark, not the
 * runtime's collective.
 */
#include "tp_group.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TP_MAX = 8 };

typedef struct {
	pthread_barrier_t bar;
	float *bufs[TP_MAX];
	const sp_opshape_t *s;
	int t, n;
	const float *x, *dy;
} group_t;

typedef struct {
	group_t *g;
	tp_member_t *m;
	rt_tp_t tp;
} member_ctx_t;

/* A collective's result buf[0..n) appended to m's record (if it keeps one). */
static int record(tp_member_t *m, const float *buf, int64_t n)
{
	if (!m->sums)
		return 0;
	if (m->n_sums + n > m->cap_sums)
		return SP_EINTERNAL;
	memcpy(m->sums + m->n_sums, buf, sizeof(float) * (size_t)n);
	m->n_sums += n;
	return 0;
}

static int group_allreduce(void *ctx, float *buf, int64_t n)
{
	member_ctx_t *c = ctx;
	group_t *g = c->g;
	float *sum = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
	g->bufs[c->tp.rank] = buf;
	pthread_barrier_wait(&g->bar);
	if (sum)
		for (int64_t k = 0; k < n; k++) {
			float v = 0.0f;
			for (int r = 0; r < g->t; r++)
				v += g->bufs[r][k];
			sum[k] = v;
		}
	pthread_barrier_wait(&g->bar);
	if (!sum)
		return SP_ENOMEM;
	memcpy(buf, sum, sizeof(float) * (size_t)n);
	free(sum);
	return record(c->m, buf, n);
}

/*
 * The in-place halves (backend_ops.h): member i's shard of buf[0..n) is
 * [n i/t, n (i+1)/t). reduce_scatter sums every member's shard in rank
 * order into that member's shard; allgather copies each member's shard
 * into every member's buffer. Both through barriers like the all-reduce.
 */
static void shard_of(int64_t n, int i, int t, int64_t *off, int64_t *cnt)
{
	*off = n * i / t;
	*cnt = n * (i + 1) / t - *off;
}

static int group_reduce_scatter(void *ctx, float *buf, int64_t n)
{
	member_ctx_t *c = ctx;
	group_t *g = c->g;
	int64_t off, cnt;
	shard_of(n, c->tp.rank, g->t, &off, &cnt);
	float *sum = malloc(sizeof(float) * (size_t)(cnt > 0 ? cnt : 1));
	g->bufs[c->tp.rank] = buf;
	pthread_barrier_wait(&g->bar);
	if (sum)
		for (int64_t k = 0; k < cnt; k++) {
			float v = 0.0f;
			for (int r = 0; r < g->t; r++)
				v += g->bufs[r][off + k];
			sum[k] = v;
		}
	pthread_barrier_wait(&g->bar);
	if (!sum)
		return SP_ENOMEM;
	memcpy(buf + off, sum, sizeof(float) * (size_t)cnt);
	free(sum);
	return record(c->m, buf, n);
}

static int group_allgather(void *ctx, float *buf, int64_t n)
{
	member_ctx_t *c = ctx;
	group_t *g = c->g;
	g->bufs[c->tp.rank] = buf;
	pthread_barrier_wait(&g->bar);
	for (int r = 0; r < g->t; r++) {
		int64_t off, cnt;
		shard_of(n, r, g->t, &off, &cnt);
		if (r != c->tp.rank)
			memcpy(buf + off, g->bufs[r] + off, sizeof(float) * (size_t)cnt);
	}
	pthread_barrier_wait(&g->bar);
	return record(c->m, buf, n);
}

static void *member_main(void *arg)
{
	member_ctx_t *c = arg;
	group_t *g = c->g;
	tp_member_t *m = c->m;
	m->rc = tblock_fwd(g->s, &c->tp, g->n, m->p, g->x, m->y, m->saved);
	if (!m->rc && g->dy)
		m->rc = tblock_bwd(g->s, &c->tp, g->n, m->p, m->saved, g->dy, m->dx, m->dp);
	return NULL;
}

int tp_group_run(const sp_opshape_t *s, int t, int n, const float *x, const float *dy,
		 tp_member_t *members)
{
	group_t g = {.s = s, .t = t, .n = n, .x = x, .dy = dy};
	member_ctx_t ctx[TP_MAX];
	pthread_t th[TP_MAX];
	if (t < 1 || t > TP_MAX || pthread_barrier_init(&g.bar, NULL, (unsigned)t))
		return SP_EINTERNAL;
	int started = 0, rc = 0;
	for (int j = 0; j < t; j++) {
		ctx[j] = (member_ctx_t){.g = &g, .m = &members[j],
					.tp = {.t = t, .rank = j, .allreduce = group_allreduce,
					       .reduce_scatter = group_reduce_scatter,
					       .allgather = group_allgather}};
		ctx[j].tp.ctx = &ctx[j];
		members[j].n_sums = 0;
		if (pthread_create(&th[j], NULL, member_main, &ctx[j]))
			break;
		started++;
	}
	/* a member that could not start would leave the others at the barrier */
	if (started < t)
		abort();
	for (int j = 0; j < t; j++)
		pthread_join(th[j], NULL);
	pthread_barrier_destroy(&g.bar);
	for (int j = 0; j < t && !rc; j++)
		rc = members[j].rc;
	return rc;
}

typedef struct {
	member_ctx_t c;
	tp_member_t none; /* no sums recorded */
	tp_member_fn *fn;
	void *arg;
	int rc;
} each_ctx_t;

static void *each_main(void *arg)
{
	each_ctx_t *e = arg;
	e->rc = e->fn(&e->c.tp, e->arg);
	return NULL;
}

int tp_group_each(int t, tp_member_fn *fn, void **args, tp_member_t *rec)
{
	group_t g = {.t = t};
	each_ctx_t ctx[TP_MAX];
	pthread_t th[TP_MAX];
	if (t < 1 || t > TP_MAX || pthread_barrier_init(&g.bar, NULL, (unsigned)t))
		return SP_EINTERNAL;
	for (int j = 0; j < t; j++) {
		memset(&ctx[j], 0, sizeof ctx[j]);
		ctx[j].c = (member_ctx_t){.g = &g, .m = rec ? &rec[j] : &ctx[j].none,
					  .tp = {.t = t, .rank = j, .allreduce = group_allreduce,
						 .reduce_scatter = group_reduce_scatter,
						 .allgather = group_allgather}};
		if (rec)
			rec[j].n_sums = 0;
		ctx[j].c.tp.ctx = &ctx[j].c;
		ctx[j].fn = fn;
		ctx[j].arg = args[j];
		if (pthread_create(&th[j], NULL, each_main, &ctx[j]))
			abort(); /* the others would wait at the barrier */
	}
	int rc = 0;
	for (int j = 0; j < t; j++)
		pthread_join(th[j], NULL);
	pthread_barrier_destroy(&g.bar);
	for (int j = 0; j < t && !rc; j++)
		rc = ctx[j].rc;
	return rc;
}

int tp_close_rel(const char *what, const float *got, const float *ref, int64_t n, double rtol)
{
	double mx = 0, worst = 0;
	int64_t bad = 0, at = 0;
	for (int64_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(ref[i]));
	for (int64_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - ref[i]);
		if (d > worst)
			worst = d, at = i;
		bad += d > rtol * mx;
	}
	if (bad)
		fprintf(stderr, "%s: %lld of %lld differ by more than %.3g, worst %.3g at %lld "
				"(%.8g, expected %.8g)\n",
			what, (long long)bad, (long long)n, rtol * mx, worst, (long long)at,
			(double)got[at], (double)ref[at]);
	return (int)bad;
}

int tp_put_back(const sp_component_t *c, int t, float *const *dp, float *g, int64_t np)
{
	layer_tensor_t lt[LAYER_TENSORS_MAX], st[LAYER_TENSORS_MAX];
	int nt = layer_tensors(c, lt), bad = 0;
	layer_tensors_tp(c, t, st);
	float *g0 = malloc(sizeof(float) * (size_t)(np > 0 ? np : 1));
	if (!g0)
		return 1;
	for (int j = 0; j < t; j++) {
		layer_shard(c, t, j, g, dp[j], 1);
		if (j == 0)
			memcpy(g0, g, sizeof(float) * (size_t)np);
		for (int i = 0; i < nt; i++) {
			int64_t o = lt[i].offset, n = lt[i].rows * lt[i].cols;
			if (st[i].rows * st[i].cols == n &&
			    memcmp(g + o, g0 + o, sizeof(float) * (size_t)n)) {
				fprintf(stderr, "t %d member %d: gradient of whole %s differs "
						"from member 0's\n",
					t, j, lt[i].name);
				bad++;
			}
		}
	}
	free(g0);
	return bad;
}

int tp_failing_allreduce(void *ctx, float *buf, int64_t n)
{
	(void)buf, (void)n;
	++*(int *)ctx;
	return SP_EIO;
}
