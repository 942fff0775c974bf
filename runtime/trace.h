/*
 * trace.h — the measured timeline of the last step, gathered to rank 0 and
 * written in the predicted trace's layout (schemas/trace_fmt.h).
 */
#ifndef SPINDLE_TRACE_H
#define SPINDLE_TRACE_H

#include "runtime.h"

int trace_write_measured(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p,
			 const char *path, sp_err_t *err);

#endif
