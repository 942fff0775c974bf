/*
 * sort.h — an in-place sort with its comparison inlined, for the
 * planner's hot lists (the placer's candidates and device lists, the
 * lanes' devices by free time), where qsort's call per comparison cost
 * more than the comparisons.
 *
 * Only for total orders: before(x, y) or before(y, x) for any two
 * elements that are not the same (ties broken by a distinct id). Then the
 * sorted array is unique, so this gives byte for byte what qsort with the
 * matching comparator gives (the plans do not change).
 *
 * SP_SORT_DEFINE(name, type, before) defines
 *   static void name(type *a, int n)
 * sorting a[0..n) so that before(a[i], a[j]) for i < j; before is a macro
 * or function of two values. Quicksort (median of three, the smaller part
 * first: O(log n) depth) down to runs of 16, then insertion.
 */
#ifndef SPINDLE_SORT_H
#define SPINDLE_SORT_H

#define SP_SORT_SWAP_(type, x, y)                                                        \
	do {                                                                             \
		type t_ = (x);                                                           \
		(x) = (y);                                                               \
		(y) = t_;                                                                \
	} while (0)

#define SP_SORT_DEFINE(name, type, before)                                               \
	static void name##_insertion_(type *a, int n)                                    \
	{                                                                                \
		for (int i = 1; i < n; i++) {                                            \
			type x = a[i];                                                   \
			int j = i;                                                       \
			for (; j > 0 && before(x, a[j - 1]); j--)                        \
				a[j] = a[j - 1];                                         \
			a[j] = x;                                                        \
		}                                                                        \
	}                                                                                \
	static void name(type *a, int n)                                                 \
	{                                                                                \
		while (n > 16) {                                                         \
			/* a[0] <= a[m] <= a[n - 1]: the ends stop the scans */          \
			int m = n / 2, i = 0, j = n - 1;                                 \
			if (before(a[m], a[0]))                                          \
				SP_SORT_SWAP_(type, a[m], a[0]);                         \
			if (before(a[n - 1], a[m])) {                                    \
				SP_SORT_SWAP_(type, a[n - 1], a[m]);                     \
				if (before(a[m], a[0]))                                  \
					SP_SORT_SWAP_(type, a[m], a[0]);                 \
			}                                                                \
			type p = a[m];                                                   \
			for (;;) {                                                       \
				do                                                       \
					i++;                                             \
				while (before(a[i], p));                                 \
				do                                                       \
					j--;                                             \
				while (before(p, a[j]));                                 \
				if (i >= j)                                              \
					break;                                           \
				SP_SORT_SWAP_(type, a[i], a[j]);                         \
			}                                                                \
			/* a[0..j] before or at p, a[j+1..n) at or after it */           \
			if (j + 1 < n - j - 1) {                                         \
				name(a, j + 1);                                          \
				a += j + 1;                                              \
				n -= j + 1;                                              \
			} else {                                                         \
				name(a + j + 1, n - j - 1);                              \
				n = j + 1;                                               \
			}                                                                \
		}                                                                        \
		name##_insertion_(a, n);                                                 \
	}

#endif
