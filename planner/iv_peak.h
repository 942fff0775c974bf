/*
 * iv_peak.h — the most weight that weighted intervals hold open at any of
 * a set of points, by one sweep: sched_pack.c's peak of devices held at
 * the times lanes start intervals (pack_peak).
 *
 * Interval i, [s_i, e_i) of weight w_i, counts at u when s_i <= u < e_i.
 * Given the intervals as two lists of ends, its opening (s_i, w_i) and
 * its closing (e_i, w_i), with s_i < e_i (an empty interval, or one with
 * a NaN end, counts nowhere: leave it out), the weight open at u is
 *   sum of w_i with s_i <= u  -  sum of w_i with e_i <= u
 * (where e_i <= u, s_i < u too: the two cancel), so with the points and
 * both lists sorted it is read at every point in one pass:
 * O((n + m) log(n + m)) for n intervals and m points, where summing
 * every interval at every point costs n * m. The weights are integers:
 * the sums are exact in any order, so the answer is the brute force's.
 *
 * Few intervals and points (n * m <= IV_PEAK_BRUTE) are summed as they
 * are: then that costs less than the sorts.
 *
 * iv_peak(open, close, n, u, m), open[i] and close[i] the ends of one
 * interval, returns the greatest weight open at one of the m points (0
 * when none exceed it; points must not be NaN); it may sort its arrays in
 * place.
 */
#ifndef SPINDLE_IV_PEAK_H
#define SPINDLE_IV_PEAK_H

#include "sort.h"

typedef struct {
	double v; /* where the interval opens or closes */
	int w;
} iv_end_t;

/* By place, then weight: ends that tie in both are alike (a total order
 * on what can be told apart, as sort.h wants). */
#define IV_END_BEFORE(x, y) ((x).v < (y).v || ((x).v == (y).v && (x).w < (y).w))
#define IV_PT_BEFORE(x, y) ((x) < (y))
SP_SORT_DEFINE(iv_end_sort, iv_end_t, IV_END_BEFORE)
SP_SORT_DEFINE(iv_pt_sort, double, IV_PT_BEFORE)

#define IV_PEAK_BRUTE 512

static inline int iv_peak(iv_end_t *open, iv_end_t *close, int n, double *u, int m)
{
	int held = 0, peak = 0, a = 0, b = 0;
	if ((long)n * m <= IV_PEAK_BRUTE) {
		for (int i = 0; i < m; i++) {
			held = 0;
			for (int j = 0; j < n; j++)
				if (open[j].v <= u[i] && close[j].v > u[i])
					held += open[j].w;
			peak = held > peak ? held : peak;
		}
		return peak;
	}
	iv_end_sort(open, n);
	iv_end_sort(close, n);
	iv_pt_sort(u, m);
	for (int i = 0; i < m; i++) {
		for (; a < n && open[a].v <= u[i]; a++)
			held += open[a].w;
		for (; b < n && close[b].v <= u[i]; b++)
			held -= close[b].w;
		peak = held > peak ? held : peak;
	}
	return peak;
}

#endif
