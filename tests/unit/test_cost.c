/*
 * test_cost.c — the analytic layer model's parts (planner/cost.c): the
 * matrix products listed per layer add up to model.h's FLOPs for every
 * layer type, pass and batch; a product's tile- and wave-quantised time is
 * never below its FLOPs at E_MAX of peak and matches a hand-computed case;
 * kernel counts grow with the head loops as the backend issues them. The
 * counts themselves are checked against the sources by
 * tests/planner/launch_counts.py, not here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <math.h>

static const sp_opshape_t shapes[] = {
	{.type = COMP_EMBEDDING, .hidden = 1024, .seq = 77, .vocab = 49408},
	{.type = COMP_PATCH, .hidden = 1280, .seq = 257, .in = 588},
	{.type = COMP_TRANSFORMER, .hidden = 1280, .heads = 16, .ffn = 5120, .seq = 257},
	{.type = COMP_TRANSFORMER, .hidden = 384, .heads = 8, .ffn = 1536, .seq = 197, .causal = 1},
	{.type = COMP_LINEAR, .seq = 1, .in = 1280, .out = 1024},
	{.type = COMP_LM_HEAD, .hidden = 512, .seq = 64, .vocab = 1000},
	{.type = COMP_CLASSIFIER, .hidden = 768, .classes = 10},
	{.type = COMP_CONTRASTIVE, .hidden = 1024},
};

static void products_add_up_to_flops(void **state)
{
	(void)state;
	const int64_t batches[] = {1, 3, 16, 17, 255};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		for (size_t j = 0; j < sizeof batches / sizeof batches[0]; j++)
			for (int bwd = 0; bwd < 2; bwd++) {
				const sp_opshape_t *s = &shapes[i];
				int64_t b = batches[j], task_batch = b;
				cost_gemm_t g[COST_MAX_GEMMS];
				int n = cost_layer_gemms(s, b, bwd, g);
				assert_true(n >= 0 && n <= COST_MAX_GEMMS);
				double sum = 0;
				for (int k = 0; k < n; k++)
					sum += 2 * g[k].m * g[k].n * g[k].k * g[k].batch * g[k].calls;
				double want = (double)b * (double)(bwd ? op_bwd_flops(s, task_batch)
								       : op_fwd_flops(s, task_batch));
				if (fabs(sum - want) > 1e-9 * want) {
					print_error("shape %zu b %lld %s: products %.0f, model.h %.0f\n", i,
						    (long long)b, bwd ? "bwd" : "fwd", sum, want);
					fail();
				}
			}
}

static void quantised_time(void **state)
{
	(void)state;
	/* 1024^3 on 108 SMs at 312 TFLOP/s: 64x64 tiles, 256 of them, 3 waves
	 * (the 256x128 ... 128x64 tiles need 65536, 16384, 16384 tile-area
	 * units per SM, 64x64 3 x 4096 = 12288): 3 x 2 x 64 x 64 x 1024 FLOPs at
	 * 0.6 x 312e12 / 108 FLOP/s per SM */
	cost_gemm_t g = {1024, 1024, 1024, 1, 1};
	double want = 3.0 * 2 * 64 * 64 * 1024 / (0.6 * 312e12 / 108) * 1e3;
	assert_true(fabs(cost_gemm_ms(&g, 108, 312e12) - want) < 1e-12);
	/* never below the FLOPs at 0.6 of peak, and monotone in every size */
	const double dims[] = {1, 7, 64, 65, 257, 1000, 4096, 5000};
	for (size_t a = 0; a < 8; a++)
		for (size_t b = 0; b < 8; b++)
			for (size_t c = 0; c < 8; c++) {
				cost_gemm_t p = {dims[a], dims[b], dims[c], 3, 2};
				double t = cost_gemm_ms(&p, 132, 989e12);
				double floor = 2 * p.m * p.n * p.k * p.batch * p.calls /
					       (0.6 * 989e12) * 1e3;
				assert_true(t >= floor * (1 - 1e-12));
				if (a + 1 < 8) {
					cost_gemm_t q = p;
					q.m = dims[a + 1];
					assert_true(cost_gemm_ms(&q, 132, 989e12) >= t);
				}
			}
}

static void kernels_follow_head_loops(void **state)
{
	(void)state;
	const sp_opshape_t *vit = &shapes[2]; /* 16 heads */
	/* cu_tblock_fwd: 13 + 2 gemm_grid calls of min(b, heads) launches each */
	assert_int_equal(cost_layer_kernels(vit, 1, 0), 13 + 2);
	assert_int_equal(cost_layer_kernels(vit, 64, 0), 13 + 2 * 16);
	/* cu_tblock_bwd 29 + 4 grids, and exec_bwd's memset of dx */
	assert_int_equal(cost_layer_kernels(vit, 4, 1), 29 + 1 + 4 * 4);
	/* losses: everything in the forward call, plus the host copy of labels */
	assert_int_equal(cost_layer_kernels(&shapes[6], 8, 0), 14 + 1);
	assert_int_equal(cost_layer_kernels(&shapes[6], 8, 1), 0);
	assert_int_equal(cost_layer_kernels(&shapes[7], 8, 0), 14);
}

static const struct CMUnitTest cost_tests[] = {
	cmocka_unit_test(products_add_up_to_flops),
	cmocka_unit_test(quantised_time),
	cmocka_unit_test(kernels_follow_head_loops),
};

int main(void)
{
	return cmocka_run_group_tests(cost_tests, NULL, NULL);
}
