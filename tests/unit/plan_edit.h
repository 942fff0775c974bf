/*
 * plan_edit.h — edits to a plan's programs, for tests that break a valid
 * plan on purpose (test_verify_mem.c). All programs share p->ins, device d
 * owning [first_ins, +n_ins); every edit keeps that layout consistent. The
 * edits check nothing about the plan: making it wrong is their purpose.
 */
#ifndef SPINDLE_PLAN_EDIT_H
#define SPINDLE_PLAN_EDIT_H

#include "plan.h"

/* A deep copy of in into *out (to release with plan_release); SP_ENOMEM
 * when out of memory (*out then empty). */
int plan_edit_copy(sp_plan_t *out, const sp_plan_t *in);
/* Device d's instruction k. */
sp_ins_t *plan_edit_at(const sp_plan_t *p, int d, int k);
/* Removes device d's instruction k. */
void plan_edit_delete(sp_plan_t *p, int d, int k);
/* Inserts in before device d's instruction k (k == n_ins: at the end);
 * SP_ENOMEM when the programs cannot grow. */
int plan_edit_insert(sp_plan_t *p, int d, int k, sp_ins_t in);
/* Moves device d's instruction `from` to position `to` of the program
 * without it: to <= from puts it before the instruction now at `to`, to >
 * from right after the one that was at `to`. */
int plan_edit_move(sp_plan_t *p, int d, int from, int to);
/* Points device d's instruction k at another value: its source (dst 0) or
 * its destination (dst 1). */
void plan_edit_retarget(sp_plan_t *p, int d, int k, int dst, sp_vref_t v);
/* Device (*dev) and position of the instruction with op and tag, or -1. */
int plan_edit_find_tag(const sp_plan_t *p, int op, int tag, int *dev);

#endif
