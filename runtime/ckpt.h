/*
 * ckpt.h — checkpoints and canonical parameter records.
 *
 * A checkpoint is a directory DIR holding complete snapshots
 * DIR/step-NNNNNNNN/ (one safetensors file per component with its weights
 * and optimizer state, and manifest.json with step, seed, data position,
 * and a CRC-32 per file) and DIR/LATEST naming the newest complete one.
 * It is independent of the plan: any plan of the same components resumes
 * from it.
 */
#ifndef SPINDLE_CKPT_H
#define SPINDLE_CKPT_H

#include "runtime.h"

/*
 * Rank 0: the gathered records of all ranks (sizes[r] bytes each), sorted
 * into canonical (component, layer) order. Computes the L2 norm and an
 * FNV-1a hash of the exact weight bytes; writes them to dump_path when
 * given (magic "SPDUMP1\n", then the records).
 */
int ckpt_records_sorted(const void *all, const size_t *sizes, int nranks, double *l2,
			uint64_t *hash, const char *dump_path, sp_err_t *err);

/* Collective. Writes a checkpoint of the state after `step`. */
int ckpt_save(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t step, uint64_t seed, sp_err_t *err);
/* Collective. Loads weights and optimizer state; *step = the step saved. */
int ckpt_load(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t *step, sp_err_t *err);

#endif
