/*
 * cuda_backend.h — the C face of the CUDA backend. Everything behind it is
 * CUDA C++ (the .cu files beside it); backend_cuda.c puts these functions into
 * its const rt_backend_t table and comm_nccl.c (beside this header) wraps the
 * rank's rt_comm_t with NCCL. The functions are declared with the types of
 * backend_ops.h and have layers.h semantics; every pointer they take is a
 * device pointer.
 *
 * Precision (what is bf16 and what is fp32):
 *   fp32  every buffer that crosses this interface: parameters (the fp32
 *         masters), gradients, AdamW m and v, activations, input gradients,
 *         saved-activation and loss-scratch buffers as the interpreter
 *         sizes them; LayerNorm statistics; softmax probabilities; the
 *         residual stream; losses (reduced in double); the optimizer math;
 *         embedding gathers; the classifier and contrastive losses (small:
 *         fp32 SGEMM without TF32).
 *   bf16  operands of the large matrix products (transformer QKV, attention
 *         scores and P V, output projection, MLP, the decoder's query,
 *         key/value and output projections of its cross-attention, linear,
 *         patch, lm_head):
 *         a bf16 shadow of each weight matrix, kept inside the backend and
 *         rewritten by the optimizer step (or lazily after any other write
 *         to the parameters' allocation); bf16 copies of the activations
 *         those products read, some stored inside `saved` in place of the
 *         fp32 copies the CPU keeps (see cu_layers.cu). Products accumulate
 *         in fp32 (CUBLAS_COMPUTE_32F) and weight gradients are accumulated
 *         in fp32 directly by cuBLAS.
 *
 * Errors: functions returning int fill an sp_err_t. Functions that return
 * void (the table's layer calls) record the first error, print it with
 * file:line, rank and host, and abort the job through the hook set with
 * cu_set_abort (the comm's abort), since a failed kernel leaves the CUDA
 * context unusable.
 */
#ifndef SPINDLE_CUDA_BACKEND_H
#define SPINDLE_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend_ops.h"
#include "common.h"
#include "model.h"

struct rt_comm;
struct sp_plan;

/* ---- cu_runtime.cu: device, memory, errors, optimizer -------------------- */

/* Number of usable devices; 0 when there is none or the driver fails. */
int cu_device_count(void);
/* Picks the rank's device (its local rank), creates the stream and the
 * cuBLAS handle, and reserves the layer workspace, reduction scratch and
 * pinned staging buffer. More local ranks than devices is an input error
 * unless cu_allow_shared_device(1) was called first. */
int cu_init(int rank, sp_err_t *err);
/* Whether several local ranks may share one device (a comm that is not
 * NCCL, e.g. host-staged MPI); call before cu_init. Default: no. */
void cu_allow_shared_device(int allowed);
/* Makes the bf16 shadow of the allocation holding p[0..n) now (start-up)
 * instead of in the first forward. */
void cu_reserve_shadow(const float *p, int64_t n);
/* p (inside an allocation of ours) is being written by something other
 * than this backend's functions (an NCCL all-gather of weights): its bf16
 * shadow is re-made at the next use. */
void cu_mark_written(const void *p);
/* Grows the reduction scratch to bytes now, at start-up (no warning). */
void cu_reserve_reduction(size_t bytes);
void cu_shutdown(void);
/* Called (then never returns) when a void entry point hits an error. */
void cu_set_abort(void (*fn)(void *ctx, int code), void *ctx);
/* The first error recorded, "" when none. */
const char *cu_first_error(void);
/* Workspace cap in bytes: layers split their samples into chunks whose
 * scratch fits (default 2 GiB, or SPINDLE_CUDA_WORKSPACE_MB). */
void cu_set_workspace_cap(size_t bytes);
/* Bytes the backend holds beside the interpreter's allocations. */
void cu_memory_extra(size_t *workspace, size_t *shadows);
/* The compute stream (cudaStream_t) for comm_nccl.c. */
void *cu_stream(void);
/* cu_comm.cu, for comm_nccl.c's padded sharded collectives: on stream
 * (cudaStream_t), the shards of n elements over k members (member i's
 * comm_shard) between their places and a window of a padded layout
 * (elements [r0, r0 + m) of member i's shard at [i m, (i + 1) m), those
 * past the shard's end 0): to_padded from the shard layout src to the
 * padded dst, else back; who >= 0: only member who's. 0, or -1 when the
 * launch fails. */
int cu_shard_repack(float *dst, const float *src, int64_t n, int k, int64_t r0, int64_t m,
		    int to_padded, int who, void *stream);

rt_alloc_fn_t cu_alloc;
rt_release_fn_t cu_release;
rt_copy_fn_t cu_to_device, cu_to_host;
rt_zero_fn_t cu_zero;
rt_copy_rows_fn_t cu_copy_rows;
rt_sync_fn_t cu_sync;
rt_adamw_step_fn_t cu_adamw_step;
rt_sgd_step_fn_t cu_sgd_step;

/* ---- cu_layers.cu, cu_xattn.cu: sources, blocks, linear -------------------- */

rt_embedding_fwd_fn_t cu_embedding_fwd;
rt_embedding_bwd_fn_t cu_embedding_bwd;
rt_fwd_fn_t cu_patch_fwd, cu_linear_fwd;
/* The split block's hook gets device buffers; it is called with every
 * earlier kernel enqueued on the compute stream and must return with the
 * sum visible to later kernels on it (the runtime's NCCL hook syncs as
 * needed). */
rt_tblock_fwd_fn_t cu_tblock_fwd;
rt_patch_bwd_fn_t cu_patch_bwd;
rt_bwd_fn_t cu_linear_bwd;
rt_tblock_bwd_fn_t cu_tblock_bwd;
/* The cross-attention decoder block (cu_xattn.cu): unsplit only (t > 1 is
 * SP_EINPUT, as on the CPU); memory and dmemory are device buffers. */
rt_xblock_fwd_fn_t cu_xblock_fwd;
rt_xblock_bwd_fn_t cu_xblock_bwd;
/* The vocabulary-parallel embedding (cu_layers.cu) and LM head
 * (cu_loss.cu): the split block's hook rules; t == 1 is the whole layer. */
rt_embedding_fwd_tp_fn_t cu_embedding_fwd_tp;
rt_embedding_bwd_tp_fn_t cu_embedding_bwd_tp;
rt_lm_head_loss_tp_fn_t cu_lm_head_loss_tp;

/* ---- cu_loss.cu: losses (forward and backward in one call) --------------- */

rt_lm_head_loss_fn_t cu_lm_head_loss;
rt_classifier_loss_fn_t cu_classifier_loss;
rt_contrastive_loss_fn_t cu_contrastive_loss;

/* ---- comm_nccl.c (or cuda/comm_nccl_none.c without NCCL) ------------------ */

/* Whether this build has the NCCL data plane. */
int comm_nccl_available(void);
/*
 * Wraps c (MPI or local, already initialised) so that isend, irecv,
 * iallreduce, test and group_create move device buffers with NCCL; allsum,
 * gather and barrier stay on the wrapped comm; abort and finalize tear the
 * NCCL communicators down first. Makes no NCCL call yet. With one rank it
 * only turns all-reduces into no-ops.
 */
int comm_nccl_wrap(struct rt_comm *c, sp_err_t *err);
/*
 * Collective over all ranks, after cu_init: agrees that every rank has a
 * device (dev_ok) and creates the world communicator (unique id from rank
 * 0, spread with the wrapped comm's allsum).
 */
int comm_nccl_start(struct rt_comm *c, int dev_ok, sp_err_t *err);
/*
 * Collective over all ranks, after comm_nccl_start and before the plan's
 * groups are created (rt_create): makes and warms up every communicator
 * the plan needs (one per sync bucket with several members, one per
 * direction of each pair that exchanges data) in the plan's global order.
 * Does nothing for a comm that is not NCCL's or with one rank. Without it,
 * group_create, isend and irecv fail with a message saying so.
 */
int comm_nccl_prepare(struct rt_comm *c, const struct sp_plan *p, sp_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
