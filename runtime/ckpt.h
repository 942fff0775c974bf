/*
 * ckpt.h — checkpoints and canonical parameter records.
 *
 * A checkpoint is a directory DIR holding complete snapshots
 * DIR/step-NNNNNNNN[-K]/ (one safetensors file per component with its
 * weights and optimizer state, and manifest.json with step, seed, data
 * position, a CRC-32 per file and one of its own) and DIR/LATEST naming the
 * newest complete one. LATEST is the only commit point: a snapshot exists
 * for readers once LATEST names it. It is independent of the plan: any plan
 * of the same components resumes from it.
 */
#ifndef SPINDLE_CKPT_H
#define SPINDLE_CKPT_H

#include "runtime.h"

/*
 * Returned by ckpt_save and ckpt_load when the ranks could not agree on the
 * outcome (a collective failed: a peer died or stalled). The ranks are then
 * out of step and the caller must abort the job, not finalize it. Every
 * other error is known to every rank.
 */
#define CKPT_ECOMM (-20)

/*
 * Testing hooks (main.c fills them from SPINDLE_FAULT; all zero: none).
 *   kill_step    rank 0 raises SIGKILL while saving the checkpoint of this
 *                step: kill_latest 0 after every file of the snapshot is
 *                written and fsynced under its temporary name, before the
 *                publishing rename; 1 after that rename, before LATEST is
 *                replaced
 *   enospc_after every write of a save fails with ENOSPC once this many
 *                bytes have been written by that save (0: never)
 */
typedef struct {
	int64_t kill_step;
	int kill_latest;
	int64_t enospc_after;
} ckpt_fault_t;

/* What rank 0 does with the packed records of every rank (rt_pack_owned),
 * concatenated in rank order, `bytes` in all. */
typedef int (*ckpt_apply_fn)(void *ctx, const void *all, size_t bytes, sp_err_t *err);

/*
 * Collective: every rank packs the layers it owns (with their AdamW state
 * when opt_state), rank 0 gathers them and calls fn, and every rank learns
 * whether all of it succeeded. Returns 0; CKPT_ECOMM when a collective
 * failed; otherwise, after a failure, rank 0's own error on rank 0 (or the
 * packing rank's on that rank) and SP_EIO "<what> failed on rank R" on the
 * others. `what` names the operation in messages ("the checkpoint of step
 * 5").
 */
int ckpt_gather_apply(rt_state_t *st, rt_comm_t *c, int opt_state, ckpt_apply_fn fn,
		      void *ctx, const char *what, sp_err_t *err);

/*
 * Rank 0: the gathered records of all ranks (`bytes` in all), sorted
 * into canonical (component, layer) order. Computes the L2 norm and an
 * FNV-1a hash of the exact weight bytes; writes them to dump_path when
 * given (magic "SPDUMP1\n", then the records).
 */
int ckpt_records_sorted(const void *all, size_t bytes, double *l2, uint64_t *hash,
			const char *dump_path, sp_err_t *err);

/*
 * Local (call it on rank 0 before training): creates DIR when missing and
 * checks that files can be created in it, so a bad --save fails at
 * start-up (SP_EINPUT) instead of after hours of training. *created = 1
 * when it made DIR.
 */
int ckpt_check_dir(const char *dir, int *created, sp_err_t *err);

/* Collective. Writes a checkpoint of the state after `step`. */
int ckpt_save(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t step, uint64_t seed, const ckpt_fault_t *fault, sp_err_t *err);

/*
 * Local. Reads and verifies the manifest of the checkpoint in dir (format,
 * version, its CRC-32, fields) without reading the tensors: the step and
 * the seed it was trained with (the run must use that seed to continue the
 * same data stream).
 */
int ckpt_peek(const char *dir, int64_t *step, uint64_t *seed, sp_err_t *err);

/* Collective. Loads weights and optimizer state; *step = the step saved.
 * Nothing is loaded on any rank unless every file checks out. */
int ckpt_load(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t *step, sp_err_t *err);

#endif
