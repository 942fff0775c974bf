/*
 * layer_check.c — helpers shared by the layer unit tests (test_layers.c,
 * test_layers_tp.c): a seeded uniform generator, buffers, and the
 * finite-difference check of a gradient. It asserts through cmocka, so
 * only cmocka tests link it; it tests nothing itself.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "layer_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 1;

double urand(double lo, double hi)
{
	rng_state = sp_mix64(rng_state);
	return lo + (hi - lo) * (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

float *fill(float *v, int64_t n, double lo, double hi)
{
	for (int64_t i = 0; i < n; i++)
		v[i] = (float)urand(lo, hi);
	return v;
}

float *falloc(int64_t n)
{
	float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
	assert_non_null(p);
	return p;
}

double dot(const float *a, const float *b, int64_t n)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

int compare_grad(const char *what, const double *num, const float *ana, int64_t n,
			double rtol)
{
	double mx = 0, maxdiff = 0;
	int64_t bad = 0, at = -1;
	for (int64_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(num[i]));
	double atol = 3e-4 * mx + 1e-6;
	for (int64_t i = 0; i < n; i++) {
		double d = fabs(num[i] - ana[i]);
		if (d > maxdiff) {
			maxdiff = d;
			at = i;
		}
		if (!(d <= atol + rtol * fabs(num[i]))) {
			if (bad < 5)
				fprintf(stderr,
					"  %s[%lld]: numeric %.6g analytic %.6g\n", what,
					(long long)i, num[i], (double)ana[i]);
			bad++;
		}
	}
	if (bad)
		fprintf(stderr,
			"%s: %lld of %lld mismatch, max diff %.3g at %lld "
			"(max |grad| %.3g)\n",
			what, (long long)bad, (long long)n, maxdiff, (long long)at, mx);
	return (int)bad;
}

void numgrad(double *out, objective_fn f, void *ctx, float *v, int64_t n,
		    double eps)
{
	for (int64_t i = 0; i < n; i++) {
		float keep = v[i];
		v[i] = (float)(keep + eps);
		double hi = v[i], fp = f(ctx);
		v[i] = (float)(keep - eps);
		double lo = v[i], fm = f(ctx);
		v[i] = keep;
		out[i] = (fp - fm) / (hi - lo);
	}
}

int check_fd(const char *what, objective_fn f, void *ctx, float *v,
		    const float *ana, int64_t n, double eps)
{
	double *num = calloc((size_t)n, sizeof *num);
	assert_non_null(num);
	numgrad(num, f, ctx, v, n, eps);
	int bad = compare_grad(what, num, ana, n, 1e-2);
	double mx = 0;
	for (int64_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(num[i]));
	free(num);
	if (mx == 0)
		fprintf(stderr, "%s: numeric gradient is identically zero\n", what);
	return bad + (mx == 0);
}

float *random_params(const sp_component_t *c, int64_t *np)
{
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(c, t);
	*np = comp_layer_params(c);
	float *p = falloc(*np);
	for (int i = 0; i < nt; i++) {
		float *q = p + t[i].offset;
		int64_t n = t[i].rows * t[i].cols;
		size_t len = strlen(t[i].name);
		if (t[i].name[0] == 'l' && t[i].name[len - 1] == 'g')
			fill(q, n, 0.7, 1.3);
		else
			fill(q, n, -0.5, 0.5);
	}
	return p;
}
