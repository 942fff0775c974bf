/*
 * layer_check.h — helpers shared by the layer unit tests: random data from
 * one seeded stream, zeroed buffers that fail the test when allocation
 * fails, and central finite differences compared with an analytic
 * gradient. Test code only (cmocka); no checks of its own.
 */
#ifndef SPINDLE_LAYER_CHECK_H
#define SPINDLE_LAYER_CHECK_H

#include "layers.h"

#include <stdint.h>

/* Uniform in [lo, hi) from one deterministic stream (sp_mix64). */
double urand(double lo, double hi);
/* v[0..n) uniform in [lo, hi); returns v. */
float *fill(float *v, int64_t n, double lo, double hi);
/* n zeroed floats (at least one); fails the test when out of memory. */
float *falloc(int64_t n);
double dot(const float *a, const float *b, int64_t n);
/* Random parameters: LN gains near 1, everything else uniform in [-0.5, 0.5]. */
float *random_params(const sp_component_t *c, int64_t *np);

/*
 * Element-wise |num - ana| <= atol + rtol |num| with atol = 3e-4 max|num|
 * + 1e-6. Prints the max difference and the first mismatches; returns
 * their count.
 */
int compare_grad(const char *what, const double *num, const float *ana, int64_t n,
		 double rtol);

typedef double (*objective_fn)(void *ctx);
/* out[i] = (f(v_i + eps) - f(v_i - eps)) / (actual step), v restored after. */
void numgrad(double *out, objective_fn f, void *ctx, float *v, int64_t n, double eps);
/* compare_grad of numgrad against ana (rtol 1e-2); an identically zero
 * numeric gradient counts as one mismatch. */
int check_fd(const char *what, objective_fn f, void *ctx, float *v, const float *ana,
	     int64_t n, double eps);

#endif
