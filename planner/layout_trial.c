/*
 * layout_trial.c — the programs and state a layout trial changes: regather
 * (every program's GATHER tail rewritten for the buckets' layouts),
 * trial_save and trial_restore (a rejected trial's plan given back, its
 * programs without a rewrite where regather's spare still holds them) and
 * trial_check_programs (SPINDLE_CHECK_RESTORE). The trials themselves are
 * layout.c's and layout_refine.c's (layout.h).
 */
#include "layout.h"

#include <malloc.h> /* malloc_usable_size (glibc) */
#include <stdlib.h>
#include <string.h>

/*
 * Rewrites every program's tail for the buckets' current layouts: after
 * STEP, one GATHER per zero-1 bucket of the device, in the order of its
 * SYNCs (as lower_sync.c emits them). Returns SP_ENOMEM or 0.
 *
 * The new array is written into pl->ins_spare, the array an earlier call
 * replaced, when that one is large enough, and the replaced array becomes
 * the spare: a run calls this a few times per refinement on arrays of
 * ~120 MB (m32), and a fresh malloc of that size is a fresh mmap whose
 * every page faults on first touch and is unmapped again on free. A fresh
 * one is made with room for 1/16 more, so that the trials' added GATHERs
 * (a few thousand on m32's sequential plan) fit the spare afterwards.
 * malloc_usable_size gives the spare's capacity whoever allocated it
 * (lower_sync.c, layout_last_init, this). The entries from n up to the
 * size a fresh array would have (the spare one included) are zeroed as
 * before; the rest of a larger spare is never read. A device's program is
 * copied by runs between its GATHERs (one memcpy each, mostly one run),
 * its SYNCs' buckets noted on the way (sy: room for the longest program,
 * allocated before any device is rewritten, so a failure leaves the plan
 * as it was) for its tail.
 */
int regather(planner_t *pl, sp_plan_t *p)
{
	int extra = 0;
	for (int b = 0; b < p->n_buckets; b++)
		extra += layout_gathers_after_step(p->buckets[b].layout) ? p->buckets[b].n_dev : 0;
	size_t need = (size_t)(p->n_ins + extra) + 1;
	sp_ins_t *ins = pl->ins_spare;
	if (!ins || malloc_usable_size(ins) / sizeof *ins < need) {
		free(ins);
		pl->ins_spare = NULL;
		/* every entry below n is written: no zeroing (the spare one is) */
		if (!(ins = malloc((need + need / 16) * sizeof *ins)))
			return SP_ENOMEM;
		pl->ins_spare = ins; /* until it replaces p->ins below */
	}
	int longest = 0;
	for (int d = 0; d < p->n_devices; d++)
		longest = p->devices[d].n_ins > longest ? p->devices[d].n_ins : longest;
	int n = 0, n_sy = 0, *sy = malloc(sizeof *sy * ((size_t)longest + 1));
	if (!sy)
		return SP_ENOMEM;
	for (int d = 0; d < p->n_devices; d++) {
		sp_device_t *dv = &p->devices[d];
		const sp_ins_t *old = p->ins + dv->first_ins;
		int first = n;
		n_sy = 0;
		for (int k = 0; k < dv->n_ins; k++) {
			int j = k;
			for (; j < dv->n_ins && old[j].op != INS_GATHER; j++) {
				if (old[j].op != INS_SYNC ||
				    !layout_gathers_after_step(p->buckets[old[j].peer].layout))
					continue;
				sy[n_sy++] = old[j].peer;
			}
			memcpy(ins + n, old + k, sizeof *ins * (size_t)(j - k));
			n += j - k;
			k = j; /* the GATHER at j (if any) is left out */
		}
		for (int i = 0; i < n_sy; i++) {
			ins[n] = lower_ins_new(INS_GATHER);
			ins[n++].peer = sy[i];
		}
		dv->first_ins = first;
		dv->n_ins = n - first;
	}
	free(sy);
	memset(&ins[n], 0, sizeof *ins * (need - (size_t)n));
	pl->ins_spare = p->ins;
	p->ins = ins;
	p->n_ins = n;
	pl->ins_regathers++;
	pl->ins_changes++;
	sim_stats_event("programs rewritten (regather)");
	return 0;
}

int trial_save(const planner_t *pl, sp_arena_t *a, const sp_plan_t *p, trial_save_t *t)
{
	t->ins = p->ins;
	t->n_ins = p->n_ins;
	t->gen = pl->ins_changes;
	t->layout = sp_arena_calloc(a, (size_t)p->n_buckets + 1, 1);
	t->overlap = sp_arena_calloc(a, (size_t)p->n_buckets + 1, 1);
	t->defer = sp_arena_calloc(a, (size_t)p->n_buckets + 1, 1);
	t->sl = sp_arena_calloc(a, (size_t)p->n_slices + 1, sizeof *t->sl);
	t->wv = sp_arena_calloc(a, (size_t)p->n_waves + 1, sizeof *t->wv);
	t->dv = sp_arena_calloc(a, (size_t)p->n_devices + 1, sizeof *t->dv);
	if (!t->layout || !t->overlap || !t->defer || !t->sl || !t->wv || !t->dv)
		return SP_ENOMEM;
	for (int b = 0; b < p->n_buckets; b++) {
		t->layout[b] = (uint8_t)p->buckets[b].layout;
		t->overlap[b] = (uint8_t)p->buckets[b].overlap;
		t->defer[b] = (uint8_t)p->buckets[b].defer;
	}
	if (p->n_slices) /* none: p->slices may be NULL, no memcpy of it */
		memcpy(t->sl, p->slices, sizeof *t->sl * (size_t)p->n_slices);
	if (p->n_waves)
		memcpy(t->wv, p->waves, sizeof *t->wv * (size_t)p->n_waves);
	memcpy(t->dv, p->devices, sizeof *t->dv * (size_t)p->n_devices);
	return 0;
}


/* SPINDLE_CHECK_RESTORE set (tests/planner/restore_exact.py): 0 when p's
 * programs are those regather writes for its layouts (each device's
 * without GATHERs, then a GATHER per SYNC of a bucket that gathers after
 * the step, in the SYNCs' order; the programs one after another), else an
 * internal error: site kept programs that a rewrite would change. */
int trial_check_programs(planner_t *pl, const sp_plan_t *p, const char *site)
{
	if (!getenv("SPINDLE_CHECK_RESTORE"))
		return 0;
	int32_t n = 0;
	for (int d = 0; d < p->n_devices; d++) {
		const sp_device_t *dv = &p->devices[d];
		const sp_ins_t *prog = p->ins + dv->first_ins;
		int k = 0, bad = dv->first_ins != n;
		while (k < dv->n_ins && prog[k].op != INS_GATHER)
			k++;
		for (int j = 0, body = k; j < body && !bad; j++) {
			if (prog[j].op != INS_SYNC ||
			    !layout_gathers_after_step(p->buckets[prog[j].peer].layout))
				continue;
			sp_ins_t ga = lower_ins_new(INS_GATHER);
			ga.peer = prog[j].peer;
			bad = k >= dv->n_ins || memcmp(&prog[k++], &ga, sizeof ga);
		}
		if (bad || k != dv->n_ins)
			return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "%s: device %d's program is not regather's for its layouts",
					  site, d);
		n += dv->n_ins;
	}
	if (n == p->n_ins)
		return 0;
	return sp_err_set(pl->err, SP_EINTERNAL, NULL, 0, 0, NULL,
			  "%s: %d instructions in the programs, %d in the plan", site, (int)n,
			  (int)p->n_ins);
}

/*
 * The plan as trial_save found it (the layouts, with their prices, and
 * the programs). The programs saved are regather's for the saved layouts
 * (the plan a trial starts from is the simulated one, its GATHERs those
 * of its layouts: lower_sync.c writes them as regather does, and every
 * layout change that moves a GATHER is followed by regather), and a
 * trial changes them only by regather. So where the one array regather
 * wrote since the save was the trial's (t->gen + 1), the saved array is
 * intact as regather's spare: it takes its place again with the saved
 * ranges (the trial's array the spare; the swap counts in
 * pl->ins_changes, which numbers every change of p->ins), instead of a
 * rewrite of every program into it with the same bytes; t then saves the
 * plan as it is, so a later trial of the same save is restored the same
 * way. Where the array was not changed since the save (t->gen, p->ins
 * still it), it is kept as it is. Else its programs' ranges as they are
 * and the array rewritten by regather (the saved ranges index another
 * array), which t then saves.
 */
int trial_restore(planner_t *pl, sp_plan_t *p, trial_save_t *t)
{
	for (int b = 0; b < p->n_buckets; b++) {
		p->buckets[b].overlap = t->overlap[b];
		p->buckets[b].defer = t->defer[b];
		if (p->buckets[b].layout != t->layout[b]) {
			p->buckets[b].layout = t->layout[b];
			bucket_price(pl->cluster, p, &p->buckets[b], dtype_bytes(p->model.dtype));
		}
	}
	if (p->n_slices)
		memcpy(p->slices, t->sl, sizeof *t->sl * (size_t)p->n_slices);
	if (p->n_waves)
		memcpy(p->waves, t->wv, sizeof *t->wv * (size_t)p->n_waves);
	int swap = pl->ins_changes == t->gen + 1 && pl->ins_spare == t->ins;
	if (swap || (pl->ins_changes == t->gen && p->ins == t->ins)) {
		if (swap) {
			pl->ins_spare = p->ins;
			p->ins = (sp_ins_t *)t->ins;
			p->n_ins = t->n_ins;
			/* p->ins changed: counted, so an older save whose
			 * array is now the spare (the trial's) never swaps */
			t->gen = ++pl->ins_changes;
		}
		memcpy(p->devices, t->dv, sizeof *t->dv * (size_t)p->n_devices);
		sim_stats_event("programs restored without a rewrite");
		return trial_check_programs(pl, p, "trial restore");
	}
	for (int d = 0; d < p->n_devices; d++) {
		int32_t first = p->devices[d].first_ins, n = p->devices[d].n_ins;
		p->devices[d] = t->dv[d];
		p->devices[d].first_ins = first;
		p->devices[d].n_ins = n;
	}
	int rc = regather(pl, p);
	if (rc)
		return rc;
	t->ins = p->ins; /* the plan as saved, in this array */
	t->n_ins = p->n_ins;
	t->gen = pl->ins_changes;
	for (int d = 0; d < p->n_devices; d++) {
		t->dv[d].first_ins = p->devices[d].first_ins;
		t->dv[d].n_ins = p->devices[d].n_ins;
	}
	return 0;
}
