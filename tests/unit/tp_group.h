/*
 * tp_group.h — runs the t members of a tensor-parallel transformer block
 * (layers.c's tblock_fwd / tblock_bwd on their shards) concurrently in
 * threads of one process, with an all-reduce hook over shared memory. For
 * tests only: it checks nothing itself, and it is no model of the
 * runtime's all-reduce (no timeout, no error injection beyond the hook's
 * own return). Also the split-against-unsplit comparison and a failing
 * all-reduce hook both split-layer tests use.
 */
#ifndef SPINDLE_TP_GROUP_H
#define SPINDLE_TP_GROUP_H

#include "layers.h"

#include <stdint.h>

/*
 * One member: caller-owned buffers. p: its shard (layer_tensors_tp layout);
 * saved: n op_saved_elems_tp(s, n, t) floats; y [n s h] written; dx [n s h]
 * and dp (shard layout) added into by the backward. sums: when not NULL,
 * every all-reduce's result is appended (at most cap_sums floats; more
 * fails the all-reduce with SP_EINTERNAL); n_sums counts them. rc: the
 * member's first nonzero return.
 */
typedef struct {
	float *p, *saved, *y, *dx, *dp;
	float *sums;
	int64_t n_sums, cap_sums;
	int rc;
} tp_member_t;

/*
 * Forward of the t members on x [n s h], then (dy not NULL) their backward
 * on dy. The hook sums the members' buffers in rank order into every
 * member, so all members see the same bits. Returns 0, or the first
 * member's nonzero rc (members[j].rc say which).
 */
int tp_group_run(const sp_opshape_t *s, int t, int n, const float *x, const float *dy,
		 tp_member_t *members);

/*
 * Any split layer: fn(tp, args[j]) for member j = 0..t-1 in t threads, tp
 * carrying the same shared-memory all-reduce (and reduce-scatter and
 * all-gather, in place on comm_shard's shards, for sequence parallelism;
 * tp->sp is 0: a member sets it on its own copy). rec (NULL: none): member j's
 * all-reduce results are appended to rec[j].sums as tp_group_run does,
 * and so are its whole buffers after each reduce-scatter and all-gather
 * (only sums, n_sums, cap_sums are used). Returns 0, or the first member's
 * nonzero return.
 */
typedef int tp_member_fn(const rt_tp_t *tp, void *arg);
int tp_group_each(int t, tp_member_fn *fn, void **args, tp_member_t *rec);

/*
 * Split against unsplit, element-wise: |got - ref| <= rtol max|ref|.
 * Prints the count and the worst difference when some are over; returns
 * how many are.
 */
int tp_close_rel(const char *what, const float *got, const float *ref, int64_t n, double rtol);

/*
 * The t members' shard gradients dp[0..t) (layer_tensors_tp layout) put
 * back whole into g [np] (layer_shard); returns how many (member, whole
 * tensor) pairs have a gradient that differs from member 0's by a bit (a
 * whole tensor's must be the same on every member), printing each.
 */
int tp_put_back(const sp_component_t *c, int t, float *const *dp, float *g, int64_t np);

/* An all-reduce hook that fails (SP_EIO), counting its calls in *(int *)ctx. */
int tp_failing_allreduce(void *ctx, float *buf, int64_t n);

#endif
