/*
 * test_regather.c — layout.c's regather, which rewrites every program's
 * tail for the buckets' layouts (its GATHERs dropped wherever they are,
 * then one GATHER per zero-1/2 bucket of the device in the order of its
 * SYNCs) by copying runs between GATHERs into a spare array. On random
 * programs (GATHERs in the body and in the tail, several SYNCs per
 * device, every layout) and a sequence of layout changes that grows and
 * shrinks the array (the spare reused or replaced), each result must be
 * the one the element-by-element rewrite below gives, byte for byte: the
 * instructions, the programs' ranges, the count and the zeroed entries up
 * to the size a fresh array would have.
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

static void test_random_programs(void **state)
{
	(void)state;
	static const int ops[] = {INS_FWD, INS_BWD, INS_SEND, INS_RECV, INS_SYNC,
				  INS_SYNC, INS_GATHER, INS_COPY};
	srand(7);
	for (int round = 0; round < 200; round++) {
		enum { ND = 6, NB = 5 };
		planner_t pl;
		sp_plan_t p;
		sp_bucket_t bk[NB];
		sp_device_t dv[ND];
		memset(&pl, 0, sizeof pl);
		memset(&p, 0, sizeof p);
		memset(bk, 0, sizeof bk);
		memset(dv, 0, sizeof dv);
		p.n_buckets = NB;
		p.buckets = bk;
		p.n_devices = ND;
		p.devices = dv;
		int cap = ND * 40, n = 0;
		p.ins = calloc((size_t)cap + 1, sizeof *p.ins);
		assert_non_null(p.ins);
		for (int b = 0; b < NB; b++)
			bk[b].n_dev = ND; /* room for a GATHER per device and bucket */
		for (int d = 0; d < ND; d++) {
			int len = rand() % 30, synced = 0;
			dv[d].first_ins = n;
			for (int k = 0; k < len; k++) {
				sp_ins_t *in = &p.ins[n++];
				in->op = ops[rand() % (int)(sizeof ops / sizeof *ops)];
				in->slice = rand() % 9;
				in->s1 = k;
				in->peer = rand() % NB;
				in->tag = rand();
				/* one SYNC per bucket and device: a bucket's
				 * GATHERs n_dev at most */
				if (in->op == INS_SYNC && (synced >> in->peer & 1))
					in->op = INS_FWD;
				else if (in->op == INS_SYNC)
					synced |= 1 << in->peer;
			}
			if (rand() % 2) { /* a tail as lower_sync.c writes it */
				p.ins[n++].op = INS_STEP;
				for (int g = rand() % 3; g > 0; g--) {
					p.ins[n].op = INS_GATHER;
					p.ins[n++].peer = rand() % NB;
				}
			}
			dv[d].n_ins = n - dv[d].first_ins;
		}
		p.n_ins = n;
		for (int step = 0; step < 6; step++) {
			for (int b = 0; b < NB; b++)
				bk[b].layout = rand() % 3 ? LAYOUT_REPLICATED : rand() % 4;
			int32_t first[ND], len[ND];
			int want_n;
			size_t need;
			sp_ins_t *want = reference(&p, first, len, &want_n, &need);
			assert_int_equal(regather(&pl, &p), 0);
			assert_int_equal(p.n_ins, want_n);
			for (int d = 0; d < ND; d++) {
				assert_int_equal(dv[d].first_ins, first[d]);
				assert_int_equal(dv[d].n_ins, len[d]);
			}
			assert_memory_equal(p.ins, want, need * sizeof *want);
			free(want);
		}
		free(p.ins);
		free(pl.ins_spare);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_programs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
