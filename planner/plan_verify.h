/*
 * plan_verify.h — the plan verifier's interface (verify.c, verify_mem.c),
 * for the planner (planner.h includes it) and for callers that hold only a
 * plan: spindle-run checks every plan with it before step 1, tests and
 * tools too. The verifier reads nothing but the plan (schemas/plan.h); it
 * is the library spindle_verify (planner/meson.build), which links neither
 * GLPK nor the rest of the planner.
 */
#ifndef SPINDLE_PLAN_VERIFY_H
#define SPINDLE_PLAN_VERIFY_H

#include "common.h"
#include "plan.h"

/*
 * Simulates all programs together; rejects deadlocks, unmatched or
 * mismatched transfers, compute without parameters or input, missing
 * gradient contributions in syncs, and memory over capacity
 * (mem_cap_bytes <= 0: no memory check). Returns 0, SP_EINTERNAL with
 * "plan verification failed: device d instruction k (op): ..." in err, or
 * SP_ENOMEM.
 */
int verify_plan(const sp_plan_t *p, double mem_cap_bytes, sp_err_t *err);

#endif
