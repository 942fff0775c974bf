/*
 * iv_peak.h — the most weight that weighted intervals hold open at any of
 * a set of points, where most of the intervals stay while a few others
 * are tried against them: sched_pack.c's peak of devices held (pack_peak),
 * asked for every plan of a lane beside the lanes placed before it.
 *
 * Interval i, [s_i, e_i) of weight w_i, counts at u when s_i <= u < e_i
 * (an empty interval, or one with a NaN end, counts nowhere: leave it
 * out). The weight open at u is
 *   sum of w_i with s_i <= u  -  sum of w_i with e_i <= u
 * (where e_i <= u, s_i < u too: the two cancel), so with both lists of
 * ends sorted and summed it is two binary searches (iv_fixed_at). The
 * weights are integers: the sums are exact in any order, so every answer
 * is the brute force's (every interval summed at every point).
 *
 * iv_fixed_t: the intervals that stay (their ends in open[i], close[i],
 * n of them) and points of interest u[0 .. m) in ascending order, not
 * NaN, all filled by the caller. iv_fixed_build sorts the ends, sums
 * them and tabulates the weight at every point with range maxima
 * (O((n + m) log(n + m))); then iv_fixed_peak gives the most weight, the
 * fixed intervals' plus up to IV_OWN others', at the points [a, z) and at
 * a few more, in O(log(n + m)): between the others' ends their weight is
 * constant, so each such run of points is one range maximum.
 *
 * Storage: open, close: n; open_sum, close_sum: n; u: m; held:
 * iv_fixed_levels(m) * m ints (the caller's arena).
 */
#ifndef SPINDLE_IV_PEAK_H
#define SPINDLE_IV_PEAK_H

#include "sort.h"

#include <stddef.h>

typedef struct {
	double v; /* where the interval opens or closes */
	int w;
} iv_end_t;

/* By place, then weight: ends that tie in both are alike (a total order
 * on what can be told apart, as sort.h wants). */
#define IV_END_BEFORE(x, y) ((x).v < (y).v || ((x).v == (y).v && (x).w < (y).w))
SP_SORT_DEFINE(iv_end_sort, iv_end_t, IV_END_BEFORE)

#define IV_OWN 2 /* intervals tried against the fixed ones at a time */

typedef struct {
	iv_end_t *open, *close;
	int *open_sum, *close_sum; /* the weights of the first i + 1 */
	double *u;
	int *held; /* [l * m + i]: the most weight at the points [i, i + 2^l) */
	int n, m;
} iv_fixed_t;

/* Rows of held for m points: 1 + floor(log2 m) (1 for none). */
static inline int iv_fixed_levels(int m)
{
	int l = 1;
	while ((2 << (l - 1)) <= m)
		l++;
	return l;
}

/* The number of ends in e[0 .. n) (ascending) at or before u. */
static inline int iv_ends_upto(const iv_end_t *e, int n, double u)
{
	int a = 0, b = n;
	while (a < b) {
		int c = a + (b - a) / 2;
		if (e[c].v <= u)
			a = c + 1;
		else
			b = c;
	}
	return a;
}

/* The weight the fixed intervals hold at u. */
static inline int iv_fixed_at(const iv_fixed_t *F, double u)
{
	int a = iv_ends_upto(F->open, F->n, u), b = iv_ends_upto(F->close, F->n, u);
	return (a ? F->open_sum[a - 1] : 0) - (b ? F->close_sum[b - 1] : 0);
}

static inline void iv_fixed_build(iv_fixed_t *F)
{
	iv_end_sort(F->open, F->n);
	iv_end_sort(F->close, F->n);
	for (int i = 0; i < F->n; i++) {
		F->open_sum[i] = F->open[i].w + (i ? F->open_sum[i - 1] : 0);
		F->close_sum[i] = F->close[i].w + (i ? F->close_sum[i - 1] : 0);
	}
	for (int i = 0; i < F->m; i++)
		F->held[i] = iv_fixed_at(F, F->u[i]);
	for (int l = 1; (1 << l) <= F->m; l++) {
		int *row = F->held + (size_t)l * F->m, *prev = row - F->m;
		for (int i = 0; i + (1 << l) <= F->m; i++)
			row[i] = prev[i] > prev[i + (1 << (l - 1))] ? prev[i] : prev[i + (1 << (l - 1))];
	}
}

/* The most weight at the points [p, q), p < q. */
static inline int iv_fixed_max(const iv_fixed_t *F, int p, int q)
{
	int l = 0;
	while ((2 << l) <= q - p)
		l++;
	const int *row = F->held + (size_t)l * F->m;
	return row[p] > row[q - (1 << l)] ? row[p] : row[q - (1 << l)];
}

/* The first of the points [a, b) at or after x (b when none). */
static inline int iv_fixed_from(const iv_fixed_t *F, int a, int b, double x)
{
	while (a < b) {
		int c = a + (b - a) / 2;
		if (F->u[c] < x)
			a = c + 1;
		else
			b = c;
	}
	return a;
}

/* The weight the intervals own[0 .. no) (open[i] .. close[i]) hold at u. */
static inline int iv_own_at(const iv_end_t *open, const iv_end_t *close, int no, double u)
{
	int held = 0;
	for (int i = 0; i < no; i++)
		held += open[i].v <= u && u < close[i].v ? open[i].w : 0;
	return held;
}

/* The most weight, the fixed intervals' and own[0 .. no)'s (no <=
 * IV_OWN, each with open < close), at the points [a, z) (a <= z) and at
 * x[0 .. nx) (not NaN); 0 when none exceed it. */
static inline int iv_fixed_peak(const iv_fixed_t *F, int a, int z, const iv_end_t *open,
				const iv_end_t *close, int no, const double *x, int nx)
{
	int peak = 0;
	for (int i = 0; i < nx; i++) {
		int h = iv_fixed_at(F, x[i]) + iv_own_at(open, close, no, x[i]);
		peak = h > peak ? h : peak;
	}
	/* own's weight changes only where the points pass one of its ends */
	int cut[2 + 2 * IV_OWN] = {a, z}, nc = 2;
	for (int i = 0; i < 2 * no && a < z; i++) {
		int c = iv_fixed_from(F, a, z, i % 2 ? close[i / 2].v : open[i / 2].v), y = nc++;
		for (; y > 0 && cut[y - 1] > c; y--)
			cut[y] = cut[y - 1];
		cut[y] = c;
	}
	for (int i = 0; i + 1 < nc; i++)
		if (cut[i] < cut[i + 1]) {
			int h = iv_fixed_max(F, cut[i], cut[i + 1]) +
				iv_own_at(open, close, no, F->u[cut[i]]);
			peak = h > peak ? h : peak;
		}
	return peak;
}

#endif
