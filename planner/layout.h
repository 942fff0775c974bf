/*
 * layout.h — the memory layouts' own helpers, shared by layout.c (the
 * estimates, the choice that fits a lowered plan, the trials once
 * simulated, zero-3 under auto, the report and the advice) and
 * layout_refine.c (layout_refine: an algorithm's chosen plan, zero-1 for
 * the optimizer step's tail and deferred all-gathers), with what a trial
 * changes and gives back in layout_trial.c (regather, trial_save,
 * trial_restore). Nothing else includes it; the entry points are in
 * planner.h.
 */
#ifndef SPINDLE_LAYOUT_H
#define SPINDLE_LAYOUT_H

#include "lower.h"

/* What a layout trial may change and gives back when the simulator says
 * no: the slices', waves' and devices' predicted times and memory, and
 * each bucket's layout (saved in the candidate's scratch arena); the
 * instruction array the programs were in (ins, n_ins: not copied) and
 * pl->ins_changes then (gen), which tell trial_restore whether that
 * array is still intact as regather's spare. */
typedef struct {
	uint8_t *layout, *overlap, *defer;
	sp_slice_t *sl;
	sp_wave_t *wv;
	sp_device_t *dv;
	const sp_ins_t *ins;
	int32_t n_ins;
	uint64_t gen;
} trial_save_t;

/* ---- layout.c ---- */
int set_layout(planner_t *pl, sp_plan_t *p, int b, int layout);
int no_memory(planner_t *pl, int rc);

/* ---- layout_trial.c ---- */
int regather(planner_t *pl, sp_plan_t *p);
int trial_save(const planner_t *pl, sp_arena_t *a, const sp_plan_t *p, trial_save_t *t);
int trial_restore(planner_t *pl, sp_plan_t *p, trial_save_t *t);
int trial_check_programs(planner_t *pl, const sp_plan_t *p, const char *site);

#endif
