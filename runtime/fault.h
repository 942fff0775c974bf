/*
 * fault.h — fault injection for spindle-run's tests (tests/runtime/crash.py,
 * hang.py, resume.py): what to break, and the two places the training loop
 * asks. Not for users, and not part of the runtime library: only the
 * spindle-run executable links fault.c, since its faults end the process.
 *
 * Faults come from --fault-exit-at STEP [--fault-rank R] (exit with status
 * 3 at the start of STEP) and from the environment variable SPINDLE_FAULT,
 * comma-separated:
 *   kill-in-save:STEP         rank 0 raises SIGKILL in the save of STEP,
 *                             after writing the snapshot, before publishing
 *   kill-in-save:STEP:latest  the same after the snapshot's rename, before
 *                             LATEST is replaced
 *   enospc-in-save:BYTES      checkpoint writes fail with ENOSPC after BYTES
 *                             bytes of each save
 *   stop-at:STEP:RANK[:end]   rank RANK raises SIGSTOP at the start of STEP
 *                             (with :end, after its program, before the
 *                             losses are summed)
 * The checkpoint faults are carried out by ckpt.c (ckpt_fault_t).
 */
#ifndef SPINDLE_FAULT_H
#define SPINDLE_FAULT_H

#include "ckpt.h"

#include <stdint.h>

typedef struct {
	int64_t exit_step; /* 0: none */
	int exit_rank;     /* -1: every rank */
	ckpt_fault_t ckpt;
	int64_t stop_step; /* 0: none */
	int stop_rank, stop_end;
} fault_t;

/* No faults. */
void fault_init(fault_t *f);
/* Adds the faults of spec (SPINDLE_FAULT's syntax). A bad spec is printed
 * with a hint and returns 2 (bad input). */
int fault_parse(fault_t *f, const char *spec);
/* Where the loop asks, on rank at step t: at its start (end = 0), or after
 * the rank's program (end = 1). Exits or stops the process when a fault
 * says so; otherwise returns. */
void fault_at_step(const fault_t *f, int rank, int64_t t, int end);

#endif
