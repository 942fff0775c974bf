/*
 * plan_util.c — small helpers over a plan that the planner, the runtime and
 * the tools share: instruction names for messages and text views, and the
 * shape of a value act(m, l) / grad(m, l). They trust the plan (plan_read
 * has checked every index); they do not check it again.
 */
#include "plan.h"

const char *ins_op_name(int op)
{
	switch (op) {
	case INS_FWD: return "fwd";
	case INS_BWD: return "bwd";
	case INS_SEND: return "send";
	case INS_RECV: return "recv";
	case INS_COPY: return "copy";
	case INS_LOSS: return "loss";
	case INS_SYNC: return "sync";
	case INS_STEP: return "step";
	default: return "?";
	}
}

/* Boundary 0 is the MetaOp's input; every boundary l >= 1 has its output shape. */
void plan_value_shape(const sp_plan_t *p, int m, int l, int32_t *seq, int32_t *width)
{
	const sp_metaop_t *mo = &p->metaops[m];
	*seq = l == 0 ? mo->seq_in : mo->seq_out;
	*width = l == 0 ? mo->width_in : mo->width_out;
}
