/*
 * test_regather.c — layout_trial.c's regather, which rewrites every program's
 * tail for the buckets' layouts (its GATHERs dropped wherever they are,
 * then one GATHER per zero-1/2 bucket of the device in the order of its
 * SYNCs) by copying runs between GATHERs into a spare array. On random
 * programs (GATHERs in the body and in the tail, several SYNCs per
 * device, every layout) and a sequence of layout changes that grows and
 * shrinks the array (the spare reused or replaced), each result must be
 * the one the element-by-element rewrite below gives, byte for byte: the
 * instructions, the programs' ranges, the count and the zeroed entries up
 * to the size a fresh array would have.
 *
 * trial_restore (layout_trial.c) on the same programs: a trial's layouts
 * changed and rewritten by regather (none, once, twice), the layouts put
 * back, then restored; the programs must be the ones saved, byte for
 * byte, with their ranges and count, as a rewrite for the saved layouts
 * gives them; where the trial's one rewrite left the saved array intact
 * as the spare, the saved array itself (not a copy); a save taken after a
 * trial and restored after another trial (try_defer_one's fastest) as
 * saved too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "layout.h"

#include <stdlib.h>
#include <string.h>

/* The rewrite, one instruction at a time; *need: the size of the array. */
static sp_ins_t *reference(const sp_plan_t *p, int32_t *first, int32_t *len, int *n_out,
			   size_t *need)
{
	int extra = 0, n = 0;
	for (int b = 0; b < p->n_buckets; b++)
		extra += layout_gathers_after_step(p->buckets[b].layout) ? p->buckets[b].n_dev : 0;
	*need = (size_t)(p->n_ins + extra) + 1;
	sp_ins_t *ins = calloc(*need, sizeof *ins);
	assert_non_null(ins);
	for (int d = 0; d < p->n_devices; d++) {
		const sp_ins_t *old = p->ins + p->devices[d].first_ins;
		first[d] = n;
		for (int k = 0; k < p->devices[d].n_ins; k++)
			if (old[k].op != INS_GATHER)
				ins[n++] = old[k];
		for (int k = 0; k < p->devices[d].n_ins; k++)
			if (old[k].op == INS_SYNC &&
			    layout_gathers_after_step(p->buckets[old[k].peer].layout)) {
				sp_ins_t g;
				memset(&g, 0, sizeof g);
				g.op = INS_GATHER;
				g.slice = -1;
				g.tag = -1;
				g.peer = old[k].peer;
				ins[n++] = g;
			}
		len[d] = n - first[d];
	}
	*n_out = n;
	return ins;
}

enum { ND = 6, NB = 5 };

/* A plan to rewrite: the planner, the plan and the arrays it points into. */
typedef struct {
	planner_t pl;
	sp_plan_t p;
	sp_bucket_t bk[NB];
	sp_device_t dv[ND];
} rig_t;

/* Random programs on ND devices of NB buckets into r->p (r->p.ins
 * allocated, r->pl's scratch arena empty), layouts replicated. */
static void random_programs(rig_t *r)
{
	static const int ops[] = {INS_FWD, INS_BWD, INS_SEND, INS_RECV, INS_SYNC,
				  INS_SYNC, INS_GATHER, INS_COPY};
	sp_plan_t *p = &r->p;
	memset(r, 0, sizeof *r);
	sp_arena_init(&r->pl.scratch);
	p->n_buckets = NB;
	p->buckets = r->bk;
	p->n_devices = ND;
	p->devices = r->dv;
	int cap = ND * 40, n = 0;
	p->ins = calloc((size_t)cap + 1, sizeof *p->ins);
	assert_non_null(p->ins);
	for (int b = 0; b < NB; b++)
		r->bk[b].n_dev = ND; /* room for a GATHER per device and bucket */
	for (int d = 0; d < ND; d++) {
		int len = rand() % 30, synced = 0;
		r->dv[d].first_ins = n;
		for (int k = 0; k < len; k++) {
			sp_ins_t *in = &p->ins[n++];
			in->op = ops[rand() % (int)(sizeof ops / sizeof *ops)];
			in->slice = rand() % 9;
			in->s1 = k;
			in->peer = rand() % NB;
			in->tag = rand();
			/* one SYNC per bucket and device: a bucket's GATHERs
			 * n_dev at most */
			if (in->op == INS_SYNC && (synced >> in->peer & 1))
				in->op = INS_FWD;
			else if (in->op == INS_SYNC)
				synced |= 1 << in->peer;
		}
		if (rand() % 2) { /* a tail as lower_sync.c writes it */
			p->ins[n++].op = INS_STEP;
			for (int g = rand() % 3; g > 0; g--) {
				p->ins[n].op = INS_GATHER;
				p->ins[n++].peer = rand() % NB;
			}
		}
		r->dv[d].n_ins = n - r->dv[d].first_ins;
	}
	p->n_ins = n;
}

static void rig_release(rig_t *r)
{
	free(r->p.ins);
	free(r->pl.ins_spare);
	sp_arena_release(&r->pl.scratch);
}

static void test_random_programs(void **state)
{
	(void)state;
	srand(7);
	for (int round = 0; round < 200; round++) {
		rig_t r;
		random_programs(&r);
		for (int step = 0; step < 6; step++) {
			for (int b = 0; b < NB; b++)
				r.bk[b].layout = rand() % 3 ? LAYOUT_REPLICATED : rand() % 4;
			int32_t first[ND], len[ND];
			int want_n;
			size_t need;
			sp_ins_t *want = reference(&r.p, first, len, &want_n, &need);
			assert_int_equal(regather(&r.pl, &r.p), 0);
			assert_int_equal(r.p.n_ins, want_n);
			for (int d = 0; d < ND; d++) {
				assert_int_equal(r.dv[d].first_ins, first[d]);
				assert_int_equal(r.dv[d].n_ins, len[d]);
			}
			assert_memory_equal(r.p.ins, want, need * sizeof *want);
			free(want);
		}
		rig_release(&r);
	}
}

/* A copy of p's programs (instructions, ranges, count) to compare. */
typedef struct {
	sp_ins_t *ins;
	int32_t first[ND], len[ND], n;
} progs_t;

static void progs_take(progs_t *c, const sp_plan_t *p)
{
	c->n = p->n_ins;
	c->ins = malloc(sizeof *c->ins * (size_t)p->n_ins + 1);
	assert_non_null(c->ins);
	memcpy(c->ins, p->ins, sizeof *c->ins * (size_t)p->n_ins);
	for (int d = 0; d < ND; d++) {
		c->first[d] = p->devices[d].first_ins;
		c->len[d] = p->devices[d].n_ins;
	}
}

static void progs_check(const progs_t *c, const sp_plan_t *p)
{
	assert_int_equal(p->n_ins, c->n);
	for (int d = 0; d < ND; d++) {
		assert_int_equal(p->devices[d].first_ins, c->first[d]);
		assert_int_equal(p->devices[d].n_ins, c->len[d]);
	}
	assert_memory_equal(p->ins, c->ins, sizeof *c->ins * (size_t)c->n);
}

/* Some buckets' layouts changed (gathering or not), rewritten. */
static void trial(planner_t *pl, sp_plan_t *p)
{
	for (int b = 0; b < NB; b++)
		if (rand() % 2)
			p->buckets[b].layout = rand() % 2 ? LAYOUT_ZERO1 : LAYOUT_REPLICATED;
	assert_int_equal(regather(pl, p), 0);
}

static void layouts_back(sp_plan_t *p, const trial_save_t *t)
{
	for (int b = 0; b < NB; b++)
		p->buckets[b].layout = t->layout[b]; /* trial_restore then prices none */
}

static void test_restore_programs(void **state)
{
	(void)state;
	srand(11);
	int swapped = 0;
	for (int round = 0; round < 200; round++) {
		rig_t r;
		random_programs(&r);
		for (int b = 0; b < NB; b++)
			r.bk[b].layout = rand() % 2 ? LAYOUT_ZERO1 : LAYOUT_REPLICATED;
		assert_int_equal(regather(&r.pl, &r.p), 0); /* a simulated plan's programs */
		trial_save_t sv, fast;
		progs_t saved, at_fast;
		assert_int_equal(trial_save(&r.pl, &r.pl.scratch, &r.p, &sv), 0);
		progs_take(&saved, &r.p);
		int rewrites = round % 4; /* none to three: the spare the saved array again */
		for (int i = 0; i < rewrites; i++)
			trial(&r.pl, &r.p);
		layouts_back(&r.p, &sv);
		uint64_t gen = r.pl.ins_regathers;
		assert_int_equal(trial_restore(&r.pl, &r.p, &sv), 0);
		progs_check(&saved, &r.p);
		if (rewrites <= 1) { /* the saved array back as it was, not rewritten */
			assert_int_equal(r.pl.ins_regathers, gen);
			assert_ptr_equal(r.p.ins, sv.ins);
			swapped += rewrites;
		}
		/* try_defer_one: a trial saved as the fastest, the plan restored,
		 * another trial, then the fastest restored */
		trial(&r.pl, &r.p);
		assert_int_equal(trial_save(&r.pl, &r.pl.scratch, &r.p, &fast), 0);
		progs_take(&at_fast, &r.p);
		layouts_back(&r.p, &sv);
		gen = r.pl.ins_regathers;
		assert_int_equal(trial_restore(&r.pl, &r.p, &sv), 0);
		progs_check(&saved, &r.p);
		/* one rewrite since it was restored: the array it restored back */
		assert_int_equal(r.pl.ins_regathers, gen);
		assert_ptr_equal(r.p.ins, sv.ins);
		trial(&r.pl, &r.p);
		layouts_back(&r.p, &fast);
		assert_int_equal(trial_restore(&r.pl, &r.p, &fast), 0);
		progs_check(&at_fast, &r.p);
		/* three tries, the third failing before its rewrite: the plan
		 * restored after the first two (each a swap), then the fastest
		 * (the first), whose array the second trial wrote over */
		trial_save_t s0, f1;
		progs_t at_s0, at_f1;
		assert_int_equal(trial_save(&r.pl, &r.pl.scratch, &r.p, &s0), 0);
		progs_take(&at_s0, &r.p);
		trial(&r.pl, &r.p);
		assert_int_equal(trial_save(&r.pl, &r.pl.scratch, &r.p, &f1), 0);
		progs_take(&at_f1, &r.p);
		for (int k = 0; k < 2; k++) {
			if (k)
				trial(&r.pl, &r.p);
			layouts_back(&r.p, &s0);
			assert_int_equal(trial_restore(&r.pl, &r.p, &s0), 0);
			progs_check(&at_s0, &r.p);
		}
		layouts_back(&r.p, &f1);
		assert_int_equal(trial_restore(&r.pl, &r.p, &f1), 0);
		progs_check(&at_f1, &r.p);
		free(at_s0.ins);
		free(at_f1.ins);
		free(saved.ins);
		free(at_fast.ins);
		rig_release(&r);
	}
	print_message("%d of 200 first restores took the saved array back\n", swapped);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_programs),
		cmocka_unit_test(test_restore_programs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
