/*
 * verify_counts.c — the verifier's per-sample counts (tokens of a value
 * written on a device, verify.c; layers of a decoder's memory gradient,
 * verify_mem.c) as runs: samples [s0, s1) that share one count, sorted
 * and disjoint; a sample in no run counts 0. Its memory grows with the
 * instructions that touch a value on a device, not with the task's batch:
 * a table of batch + 1 counts per device and value made the verifier's
 * memory devices x values x batch (0.8 GB of the planner's 0.9 GB peak for
 * plans/ofasys with batches x64 on 256 GPUs, twice that at 512 GPUs or at
 * x128). Runs live in the verifier's arena (a grown array's old copy stays
 * there until the verification ends: at most as much again).
 */
#include "verify.h"

#include <string.h>

/* The first run that ends after s (c->n when none). */
static int find(const vcounts_t *c, int32_t s)
{
	int lo = 0, hi = c->n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (c->r[mid].s1 <= s)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int32_t vcounts_piece(const vcounts_t *c, int32_t s, int32_t s1, int32_t *n)
{
	int i = find(c, s);
	*n = 0;
	if (i == c->n)
		return s1;
	if (c->r[i].s0 > s)
		return SP_MIN(c->r[i].s0, s1);
	*n = c->r[i].n;
	return SP_MIN(c->r[i].s1, s1);
}

static int insert(sp_arena_t *a, vcounts_t *c, int i, vrun_t r)
{
	if (sp_arena_grow(a, (void **)&c->r, &c->cap, c->n + 1, sizeof *c->r))
		return SP_ENOMEM;
	memmove(&c->r[i + 1], &c->r[i], (size_t)(c->n - i) * sizeof *c->r);
	c->r[i] = r;
	c->n++;
	return 0;
}

/* No run crosses x afterwards (one that did is cut in two there). */
static int split(sp_arena_t *a, vcounts_t *c, int32_t x)
{
	int i = find(c, x);
	if (i == c->n || c->r[i].s0 >= x)
		return 0;
	vrun_t right = {x, c->r[i].s1, c->r[i].n};
	c->r[i].s1 = x;
	return insert(a, c, i + 1, right);
}

/* Neighbouring runs with the same count become one. */
static void coalesce(vcounts_t *c)
{
	int w = 0;
	for (int i = 0; i < c->n; i++) {
		if (w > 0 && c->r[w - 1].s1 == c->r[i].s0 && c->r[w - 1].n == c->r[i].n)
			c->r[w - 1].s1 = c->r[i].s1;
		else
			c->r[w++] = c->r[i];
	}
	c->n = w;
}

int vcounts_add(sp_arena_t *a, vcounts_t *c, int32_t s0, int32_t s1, int32_t add)
{
	if (s0 >= s1 || add == 0)
		return 0;
	int rc;
	if ((rc = split(a, c, s0)) || (rc = split(a, c, s1)))
		return rc;
	/* every run that meets [s0, s1) now lies inside it: add to those,
	 * and fill the gaps between them with new runs of count add */
	int i = find(c, s0);
	for (int32_t s = s0; s < s1; i++) {
		if (i < c->n && c->r[i].s0 == s) {
			c->r[i].n += add;
			s = c->r[i].s1;
			continue;
		}
		int32_t e = i < c->n ? SP_MIN(c->r[i].s0, s1) : s1;
		if ((rc = insert(a, c, i, (vrun_t){s, e, add})))
			return rc;
		s = e;
	}
	coalesce(c);
	return 0;
}

int vcounts_clip(sp_arena_t *a, vcounts_t *out, const vcounts_t *c, int32_t s0, int32_t s1)
{
	memset(out, 0, sizeof *out);
	for (int32_t s = s0, n, e; s < s1; s = e) {
		e = vcounts_piece(c, s, s1, &n);
		if (n && insert(a, out, out->n, (vrun_t){s, e, n}))
			return SP_ENOMEM;
	}
	return 0;
}
