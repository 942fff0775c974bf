/*
 * test_arith.c — the per-operator arithmetic of schemas/arith.c for a
 * cross-attention decoder (issue #20), against counts worked out by hand
 * below from the formulas written in each test: parameters, forward and
 * backward FLOPs, saved elements, the memory's place in the shape (a
 * profile key) and what --inspect prints (inspect_node). Also: a
 * transformer without cross-attention keeps its counts. It does not
 * check the loader's rules (tests/invalid) or any planning.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <stdlib.h>
#include <string.h>

/*
 * A captioning encoder-decoder: an 8-token patch encoder of width 16, a
 * 6-token causal decoder of width 8 (2 heads, FFN 16) attending to the
 * encoder's output through K and V projections from 16 to 8.
 */
static const char MODEL[] =
	"{\"format\": \"spindle.model/1\", \"name\": \"encdec\", \"components\": {"
	" \"img\": {\"type\": \"patch\", \"in\": 12, \"hidden\": 16, \"max_seq\": 8},"
	" \"enc\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 16, \"heads\": 2,"
	"  \"ffn\": 32},"
	" \"tok\": {\"type\": \"embedding\", \"vocab\": 32, \"hidden\": 8, \"max_seq\": 6},"
	" \"dec\": {\"type\": \"transformer\", \"layers\": 2, \"hidden\": 8, \"heads\": 2,"
	"  \"ffn\": 16, \"causal\": true, \"cross_attention\": true, \"memory_width\": 16},"
	" \"head\": {\"type\": \"lm_head\", \"hidden\": 8, \"vocab\": 32}},"
	" \"tasks\": [{\"name\": \"caption\", \"batch\": 4, \"graph\": ["
	"  {\"id\": \"img_in\", \"component\": \"img\", \"seq\": 8},"
	"  {\"id\": \"enc\", \"component\": \"enc\", \"seq\": 8, \"inputs\": [\"img_in\"]},"
	"  {\"id\": \"txt_in\", \"component\": \"tok\", \"seq\": 6},"
	"  {\"id\": \"dec\", \"component\": \"dec\", \"seq\": 6, \"inputs\": [\"txt_in\"],"
	"   \"memory\": \"enc\"},"
	"  {\"id\": \"loss\", \"component\": \"head\", \"inputs\": [\"dec\"]}]}]}";

enum { ENC = 1, DEC = 3 }; /* node and component indices of MODEL */

static int setup(void **state)
{
	sp_model_t *m = calloc(1, sizeof *m);
	sp_err_t err = {0};
	if (!m || model_parse(m, MODEL, sizeof MODEL - 1, "model.json", &err)) {
		fprintf(stderr, "%s\n", err.msg);
		free(m);
		return -1;
	}
	*state = m;
	return 0;
}

static int teardown(void **state)
{
	model_release(*state);
	free(*state);
	return 0;
}

static sp_opshape_t shape_of(const sp_model_t *m, int node)
{
	return op_shape(m, &m->tasks[0], &m->tasks[0].nodes[node]);
}

/* h 8, f 16, a 2, s 6, memory m 8 tokens of width W 16. */
static void test_decoder_params(void **state)
{
	const sp_model_t *m = *state;
	const sp_component_t *c = &m->comps[DEC];
	/* self-attention block: W_qkv 8x24 + b 24, W_o 8x8 + b 8, W_1 8x16 +
	 * b 16, W_2 16x8 + b 8, LN1 and LN2 2x8 each */
	int64_t self = 192 + 24 + 64 + 8 + 128 + 16 + 128 + 8 + 16 + 16;
	/* cross-attention: LN_c 2x8, W_q 8x8 + b 8, W_kv 16x16 + b 16,
	 * W_oc 8x8 + b 8 */
	int64_t cross = 16 + 64 + 8 + 256 + 16 + 64 + 8;
	assert_int_equal(self, 600);
	assert_int_equal(comp_layer_params(c), self + cross);
	assert_int_equal(comp_params(c), 2 * (self + cross));
	/* without a declared memory_width, K and V read width hidden: [8, 16] */
	sp_component_t same = *c;
	same.memory_width = same.hidden;
	assert_int_equal(comp_layer_params(&same), self + cross - 2 * 16 * 8 + 2 * 8 * 8);
}

static void test_decoder_flops_and_saved(void **state)
{
	const sp_model_t *m = *state;
	sp_opshape_t s = shape_of(m, DEC);
	assert_int_equal(s.mem_seq, 8);
	assert_int_equal(s.mem_width, 16);
	/* self: 8 s h^2 + 4 s^2 h + 4 s h f = 3072 + 1152 + 3072 */
	int64_t self = 8 * 6 * 8 * 8 + 4 * 6 * 6 * 8 + 4 * 6 * 8 * 16;
	/* cross: q 2 s h h, k and v 2*2 m W h, scores and weighted sum
	 * 2 s m h * 2, out 2 s h h */
	int64_t cross = 2 * 6 * 8 * 8 + 2 * 2 * 8 * 16 * 8 + 2 * 6 * 8 * 8 * 2 + 2 * 6 * 8 * 8;
	assert_int_equal(cross, 7168);
	assert_int_equal(op_fwd_flops(&s, 4), self + cross);
	assert_int_equal(op_bwd_flops(&s, 4), 2 * (self + cross));
	/* self: 8 s h + 2 s f + a s^2 + 4 s; cross: LN_c out, Q, heads,
	 * residual 4 s h, K and V 2 m h, probabilities a s m, LN_c stats 2 s */
	int64_t saved_self = 8 * 6 * 8 + 2 * 6 * 16 + 2 * 6 * 6 + 4 * 6;
	int64_t saved_cross = 4 * 6 * 8 + 2 * 8 * 8 + 2 * 6 * 8 + 2 * 6;
	assert_int_equal(op_saved_elems(&s, 4), saved_self + saved_cross);
	/* --inspect: per sample, both layers, bf16 */
	inspect_node_t in;
	inspect_node(&in, m, &m->tasks[0], &m->tasks[0].nodes[DEC]);
	assert_int_equal(in.params, 2 * 1032);
	assert_int_equal(in.fwd_flops, 2 * (self + cross));
	assert_int_equal(in.bwd_flops, 4 * (self + cross));
	assert_int_equal(in.saved_bytes, 2 * 2 * (saved_self + saved_cross));
}

/* A transformer without a memory keeps the self-attention counts. */
static void test_encoder_unchanged(void **state)
{
	const sp_model_t *m = *state;
	sp_opshape_t s = shape_of(m, ENC);
	assert_int_equal(s.mem_seq, 0);
	assert_int_equal(s.mem_width, 0);
	/* h 16, f 32, s 8, a 2 */
	assert_int_equal(comp_layer_params(&m->comps[ENC]),
			 4 * 16 * 16 + 2 * 16 * 32 + 9 * 16 + 32);
	assert_int_equal(op_fwd_flops(&s, 4),
			 8 * 8 * 16 * 16 + 4 * 8 * 8 * 16 + 4 * 8 * 16 * 32);
	assert_int_equal(op_saved_elems(&s, 4),
			 8 * 8 * 16 + 2 * 8 * 32 + 2 * 8 * 8 + 4 * 8);
}

/* The memory's length and width are part of the shape: a profile key. */
static void test_shape_key(void **state)
{
	const sp_model_t *m = *state;
	sp_opshape_t a = shape_of(m, DEC), b = a;
	assert_true(opshape_equal(&a, &b));
	b.mem_seq = 9;
	assert_false(opshape_equal(&a, &b));
	b = a;
	b.mem_width = 8;
	assert_false(opshape_equal(&a, &b));
	char buf[128];
	opshape_str(buf, sizeof buf, &a);
	assert_string_equal(buf, "transformer h8 a2 f16 s6 causal memory m8 w16");
	sp_opshape_t e = shape_of(m, ENC);
	opshape_str(buf, sizeof buf, &e);
	assert_string_equal(buf, "transformer h16 a2 f32 s8");
}

/* A copy (the plan embeds one) keeps the memory. */
static void test_copy(void **state)
{
	const sp_model_t *m = *state;
	sp_model_t c;
	assert_int_equal(model_copy(&c, m), 0);
	sp_opshape_t a = shape_of(m, DEC), b = shape_of(&c, DEC);
	assert_true(opshape_equal(&a, &b));
	model_release(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decoder_params),
		cmocka_unit_test(test_decoder_flops_and_saved),
		cmocka_unit_test(test_encoder_unchanged),
		cmocka_unit_test(test_shape_key),
		cmocka_unit_test(test_copy),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
