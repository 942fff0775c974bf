/*
 * trace_fmt.h — Chrome trace JSON writer shared by spindle-show (predicted)
 * and spindle-run (measured): same processes, threads and event names.
 */
#ifndef SPINDLE_TRACE_FMT_H
#define SPINDLE_TRACE_FMT_H

#include "plan.h"

#include <stdio.h>

void trace_ins_name(char *buf, size_t cap, const sp_plan_t *p, const sp_ins_t *in);
void trace_begin(FILE *f, int n_proc, const char *proc_word);
/* One complete event: tid 0 compute, 1 communication; times in ms. */
void trace_event(FILE *f, int pid, int tid, const char *name, const char *cat,
		 double ts_ms, double dur_ms);
/* A compute event of a tensor-parallel FWD/BWD: as trace_event (tid 0,
 * cat "compute") with args {"compute_ms", "tp_allreduce_ms"}, the second
 * the time of its all-reduces, the first the rest of dur_ms. */
void trace_event_tp(FILE *f, int pid, const char *name, double ts_ms, double dur_ms,
		    double tp_ms);
void trace_end(FILE *f);

#endif
