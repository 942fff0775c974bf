/*
 * test_verify.c — the plan verifier (planner/verify.c) on hand-broken
 * programs. The demo model (3 tasks: a contrastive loss, an lm_head over a
 * concatenation, a classifier) is planned once on its 4-device cluster;
 * the valid plan must pass. Each test then breaks deep copies of it
 * (plan_encode + plan_decode) in one way, wherever that break applies,
 * and requires the verifier to reject every copy naming the defect the
 * break causes. The first message of each kind is printed. Which defect a
 * break causes is not always the obvious one (a deleted RECV starves a
 * reader before the end-of-run transfer check); each test says why.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

typedef struct {
	uint8_t *bytes; /* the valid plan, encoded */
	size_t len;
	double cap;     /* the planner's usable bytes per device */
	int n_devices;
} vfix_t;

static const char *root_dir(void)
{
	const char *r = getenv("SPINDLE_ROOT");
	return r && *r ? r : SPINDLE_ROOT;
}

static int group_setup(void **state)
{
	char mpath[4096], cpath[4096];
	snprintf(mpath, sizeof mpath, "%s/plans/demo/model.json", root_dir());
	snprintf(cpath, sizeof cpath, "%s/plans/demo/cluster.json", root_dir());
	sp_err_t err = {0};
	sp_model_t m = {0};
	sp_cluster_t c = {0};
	sp_plan_t p = {0};
	plan_summary_t sum;
	vfix_t *f = calloc(1, sizeof *f);
	int rc = -1;
	if (!f || model_load(&m, mpath, &err) || cluster_load(&c, cpath, &err))
		goto cleanup;
	/* main.c's defaults */
	plan_opts_t o = {0};
	o.algo = ALGO_SPINDLE;
	o.placement = PLACE_SPINDLE;
	o.mem_reserve_gib = SP_MIN(2.0, 0.1 * c.memory_gib);
	o.milp_nodes = 200;
	if (planner_run(&o, &m, &c, &p, &sum, &err) ||
	    plan_encode(&f->bytes, &f->len, &p, &err))
		goto cleanup;
	f->cap = (c.memory_gib - o.mem_reserve_gib) * 1024.0 * 1024.0 * 1024.0;
	f->n_devices = p.n_devices;
	*state = f;
	f = NULL;
	rc = 0;
cleanup:
	if (rc)
		fprintf(stderr, "setup: %s\n", err.msg);
	free(f);
	plan_release(&p);
	model_release(&m);
	cluster_release(&c);
	return rc;
}

static int group_teardown(void **state)
{
	vfix_t *f = *state;
	if (f)
		free(f->bytes);
	free(f);
	return 0;
}

/* ---- editing copies ---------------------------------------------------------- */

static void copy_plan(const vfix_t *f, sp_plan_t *out)
{
	sp_err_t err = {0};
	assert_int_equal(plan_decode(out, f->bytes, f->len, "demo.bin", &err), 0);
}

static sp_ins_t *ins_at(sp_plan_t *p, int d, int k)
{
	return &p->ins[p->devices[d].first_ins + k];
}

/* All devices' programs share p->ins: device d owns [first_ins, +n_ins). */
static void del_ins(sp_plan_t *p, int d, int k)
{
	int g = p->devices[d].first_ins + k;
	memmove(p->ins + g, p->ins + g + 1, sizeof *p->ins * (size_t)(p->n_ins - g - 1));
	p->n_ins--;
	p->devices[d].n_ins--;
	for (int e = d + 1; e < p->n_devices; e++)
		p->devices[e].first_ins--;
}

/* Inserts in before device d's instruction k (k == n_ins: at the end). */
static void ins_ins(sp_plan_t *p, int d, int k, sp_ins_t in)
{
	sp_ins_t *grown = realloc(p->ins, sizeof *p->ins * (size_t)(p->n_ins + 1));
	assert_non_null(grown);
	p->ins = grown;
	int g = p->devices[d].first_ins + k;
	memmove(p->ins + g + 1, p->ins + g, sizeof *p->ins * (size_t)(p->n_ins - g));
	p->ins[g] = in;
	p->n_ins++;
	p->devices[d].n_ins++;
	for (int e = d + 1; e < p->n_devices; e++)
		p->devices[e].first_ins++;
}

/* Moves device d's instruction from position `from` to position `to`. */
static void move_ins(sp_plan_t *p, int d, int from, int to)
{
	sp_ins_t in = *ins_at(p, d, from);
	del_ins(p, d, from);
	ins_ins(p, d, to, in);
}

/* Drops device d's held entry k (p->held is shared like p->ins). */
static void del_held(sp_plan_t *p, int d, int k)
{
	int g = p->devices[d].held_off + k;
	memmove(p->held + g, p->held + g + 1, sizeof *p->held * (size_t)(p->n_held - g - 1));
	p->n_held--;
	p->devices[d].n_held--;
	for (int e = d + 1; e < p->n_devices; e++)
		p->devices[e].held_off--;
}

/* Drops member q of bucket b's device list (p->bucket_devs is shared). */
static void del_bucket_dev(sp_plan_t *p, int b, int q)
{
	int g = p->buckets[b].dev_off + q;
	memmove(p->bucket_devs + g, p->bucket_devs + g + 1,
		sizeof *p->bucket_devs * (size_t)(p->n_bucket_devs - g - 1));
	p->n_bucket_devs--;
	p->buckets[b].n_dev--;
	for (int e = b + 1; e < p->n_buckets; e++)
		p->buckets[e].dev_off--;
}

/* Drops parameter q of bucket b (p->bucket_params is shared). */
static void del_bucket_param(sp_plan_t *p, int b, int q)
{
	int g = p->buckets[b].param_off + q;
	memmove(p->bucket_params + g, p->bucket_params + g + 1,
		sizeof *p->bucket_params * (size_t)(p->n_bucket_params - g - 1));
	p->n_bucket_params--;
	p->buckets[b].n_params--;
	for (int e = b + 1; e < p->n_buckets; e++)
		p->buckets[e].param_off--;
}

/* Device and position of the instruction with op and tag, or -1. */
static int find_tag(const sp_plan_t *p, int op, int tag, int *dev)
{
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
			if (in->op == op && in->tag == tag) {
				*dev = d;
				return k;
			}
		}
	return -1;
}

/* ---- expectations ----------------------------------------------------------- */

/*
 * verify_plan rejects p as a bug of ours (SP_EINTERNAL) naming `defect`;
 * `where`, when given, must appear too (device and instruction). The
 * message is printed when *shown is 0.
 */
static void expect_defect(const sp_plan_t *p, double cap, const char *defect,
			  const char *where, int *shown)
{
	sp_err_t err = {0};
	int rc = verify_plan(p, cap, &err);
	if (rc != SP_EINTERNAL || !strstr(err.msg, defect) || (where && !strstr(err.msg, where)))
		fail_msg("expected '%s'%s%s, got rc %d: %s", defect, where ? " at " : "",
			 where ? where : "", rc, err.msg);
	assert_int_equal(err.code, SP_EINTERNAL);
	static const char pre[] = "plan verification failed: ";
	assert_memory_equal(err.msg, pre, strlen(pre));
	if (shown && !*shown) {
		print_message("%s\n", err.msg);
		*shown = 1;
	}
}

static void expect_valid(const sp_plan_t *p, double cap)
{
	sp_err_t err = {0};
	int rc = verify_plan(p, cap, &err);
	if (rc)
		fail_msg("valid plan rejected: %s", err.msg);
}

static int count_op(const sp_plan_t *p, int op)
{
	int n = 0;
	for (int k = 0; k < p->n_ins; k++)
		n += p->ins[k].op == op;
	return n;
}

/* ---- the valid plan ------------------------------------------------------------ */

static void test_valid(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_plan(f, &p);
	expect_valid(&p, f->cap);
	expect_valid(&p, 0); /* 0: no memory check */
	/* the copy is exact: it encodes to the same bytes */
	uint8_t *again = NULL;
	size_t n = 0;
	sp_err_t err = {0};
	assert_int_equal(plan_encode(&again, &n, &p, &err), 0);
	assert_int_equal(n, f->len);
	assert_memory_equal(again, f->bytes, n);
	free(again);
	/* the premises of the tests below: a multi-device plan with transfers
	 * both ways, sync buckets, and the three kinds of loss */
	assert_true(p.n_devices >= 3);
	assert_true(count_op(&p, INS_SEND) >= 2);
	assert_int_equal(count_op(&p, INS_SEND), count_op(&p, INS_RECV));
	assert_true(p.n_buckets >= 2);
	int kinds = 0, concat = 0;
	for (int m = 0; m < p.n_metaops; m++) {
		kinds |= 1 << p.metaops[m].shape.type;
		int preds = 0;
		for (int e = 0; e < p.n_edges; e++)
			preds += p.edges[e].dst == m;
		concat |= preds >= 2 && p.metaops[m].shape.type == COMP_TRANSFORMER;
	}
	assert_true(kinds & (1 << COMP_CONTRASTIVE));
	assert_true(kinds & (1 << COMP_LM_HEAD));
	assert_true(kinds & (1 << COMP_CLASSIFIER));
	assert_true(concat);
	print_message("valid: %d devices, %d instructions (%d SEND), %d buckets\n", p.n_devices,
		      p.n_ins, count_op(&p, INS_SEND), p.n_buckets);
	plan_release(&p);
}

/* ---- (a) a deleted SEND: its RECV waits forever ----------------------------------- */

static void test_deleted_send(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			if (ins_at(&ref, d, k)->op != INS_SEND)
				continue;
			sp_plan_t p;
			copy_plan(f, &p);
			del_ins(&p, d, k);
			/* the receiver blocks, and so does whoever waits on it; the
			 * report names the lowest-numbered blocked device */
			expect_defect(&p, f->cap, "deadlock", NULL, &shown);
			plan_release(&p);
			n++;
		}
	print_message("%d of %d deletions rejected\n", n, n);
	assert_true(n >= 2);
	plan_release(&ref);
}

/* ---- (b) a RECV whose sample range differs from its SEND's -------------------- */

static void test_recv_size(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			if (ins_at(&ref, d, k)->op != INS_RECV)
				continue;
			for (int delta = -1; delta <= 1; delta += 2) {
				sp_plan_t p;
				copy_plan(f, &p);
				sp_ins_t *in = ins_at(&p, d, k);
				if (in->s1 + delta <= in->s0)
					continue;
				in->s1 += delta;
				/* caught at the RECV itself, when its SEND has run */
				char where[64];
				snprintf(where, sizeof where, "device %d instruction %d (recv)", d, k);
				expect_defect(&p, f->cap, "size mismatch", where, &shown);
				plan_release(&p);
				n++;
			}
		}
	print_message("%d of %d changed RECVs rejected\n", n, n);
	assert_true(n >= 2);
	plan_release(&ref);
}

/*
 * ---- (c) unmatched transfers ---------------------------------------------------
 *
 * Deleting a RECV leaves its SEND unreceived, but the verifier only looks
 * for unreceived tags once every program has finished, and no program
 * finishes: the RECV's value is always read later on its device (by a FWD,
 * LOSS, BWD, SEND or COPY), which then finds it incomplete. So a deleted
 * RECV is reported as "missing input", at the reader.
 */
static void test_deleted_recv(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			if (ins_at(&ref, d, k)->op != INS_RECV)
				continue;
			sp_plan_t p;
			copy_plan(f, &p);
			del_ins(&p, d, k);
			char where[32];
			snprintf(where, sizeof where, "device %d ", d);
			expect_defect(&p, f->cap, "missing input", where, &shown);
			plan_release(&p);
			n++;
		}
	print_message("%d of %d deletions rejected\n", n, n);
	assert_true(n >= 2);
	plan_release(&ref);
}

/* "unmatched transfer" proper: a RECV of a tag its device received already,
 * and an extra SEND that no program receives */
static void test_unmatched_transfer(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n_twice = 0, n_extra = 0, shown_twice = 0, shown_extra = 0;
	int max_tag = -1;
	for (int k = 0; k < ref.n_ins; k++)
		max_tag = SP_MAX(max_tag, ref.ins[k].tag);
	for (int d = 0; d < ref.n_devices; d++) {
		int first_recv = -1;
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			const sp_ins_t *in = ins_at(&ref, d, k);
			if (in->op == INS_RECV && first_recv < 0) {
				first_recv = k;
			} else if (in->op == INS_RECV) {
				/* a later RECV takes the device's first RECV's tag */
				sp_plan_t p;
				copy_plan(f, &p);
				ins_at(&p, d, k)->tag = ins_at(&p, d, first_recv)->tag;
				char where[64];
				snprintf(where, sizeof where, "device %d instruction %d (recv)", d, k);
				expect_defect(&p, f->cap, "unmatched transfer", where, &shown_twice);
				plan_release(&p);
				n_twice++;
			}
			if (in->op == INS_SEND) {
				/* the same value once more, under a tag of its own, just
				 * before STEP: every program finishes, one tag is left */
				sp_plan_t p;
				copy_plan(f, &p);
				sp_ins_t extra = *in;
				extra.tag = max_tag + 1;
				ins_ins(&p, d, p.devices[d].n_ins - 1, extra);
				char what[64];
				snprintf(what, sizeof what, "tag %d is sent but never received",
					 max_tag + 1);
				expect_defect(&p, f->cap, "unmatched transfer", what, &shown_extra);
				plan_release(&p);
				n_extra++;
			}
		}
	}
	print_message("%d retagged RECVs, %d extra SENDs rejected\n", n_twice, n_extra);
	assert_true(n_twice >= 1 && n_extra >= 1);
	plan_release(&ref);
}

/*
 * ---- (d) a held parameter dropped ---------------------------------------------
 *
 * Dropping (comp, layer) from a device's held list alone is caught before
 * any instruction runs: the device is still in that parameter's sync
 * bucket, and the verifier first checks that bucket members are exactly
 * the holders, so it says "missing gradient contribution" (the sync group
 * includes a non-holder). Dropping the device from the bucket as well (a
 * lowering that forgot the parameter altogether) gets past that check, and
 * the first FWD of the layer there is "missing parameters".
 */
static void test_missing_params(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n_held = 0, n_both = 0, shown_held = 0, shown_both = 0;
	for (int b = 0; b < ref.n_buckets; b++) {
		const sp_bucket_t *bk = &ref.buckets[b];
		for (int q = 0; q < bk->n_dev; q++) {
			int d = ref.bucket_devs[bk->dev_off + q];
			/* the held entry of the bucket's first parameter on d */
			const sp_param_t *pr = &ref.bucket_params[bk->param_off];
			int h = -1;
			for (int k = 0; k < ref.devices[d].n_held; k++)
				if (ref.held[ref.devices[d].held_off + k].comp == pr->comp &&
				    ref.held[ref.devices[d].held_off + k].layer == pr->layer)
					h = k;
			assert_true(h >= 0);
			char where[160];
			sp_plan_t p;
			copy_plan(f, &p);
			del_held(&p, d, h);
			snprintf(where, sizeof where, "sync group of '%s' layer %d includes "
				 "non-holder device %d", p.model.comps[pr->comp].name, pr->layer, d);
			expect_defect(&p, f->cap, "missing gradient contribution", where,
				      &shown_held);
			plan_release(&p);
			n_held++;
			if (bk->n_params != 1)
				continue; /* the bucket's other parameters stay held on d */
			copy_plan(f, &p);
			del_held(&p, d, h);
			del_bucket_dev(&p, b, q);
			snprintf(where, sizeof where, "device %d ", d);
			expect_defect(&p, f->cap, "missing parameters", where, &shown_both);
			snprintf(where, sizeof where, "'%s' layer %d is not held here",
				 p.model.comps[pr->comp].name, pr->layer);
			expect_defect(&p, f->cap, "missing parameters", where, NULL);
			plan_release(&p);
			n_both++;
		}
	}
	print_message("%d dropped held entries, %d dropped with their sync membership "
		      "rejected\n",
		      n_held, n_both);
	assert_true(n_held >= 2 && n_both >= 1);
	plan_release(&ref);
}

/*
 * ---- (e) a BWD deleted ---------------------------------------------------------
 *
 * A BWD writes the gradient of its slice's input. Except at a source, whose
 * input is data, someone reads that gradient next (the BWD of the layers
 * below, or a SEND/COPY to the producer), finds it incomplete and says
 * "missing input". A source's BWD writes nothing anyone reads; what is lost
 * is its parameter gradient, which the end-of-run count finds short of the
 * task's batch: "missing gradient contribution".
 */
static void test_deleted_bwd(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n_src = 0, n_mid = 0, shown_src = 0, shown_mid = 0;
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			const sp_ins_t *in = ins_at(&ref, d, k);
			if (in->op != INS_BWD)
				continue;
			const sp_slice_t *sl = &ref.slices[in->slice];
			const sp_metaop_t *m = &ref.metaops[sl->metaop];
			int source = sl->layer_from == 0 && m->width_in == 0;
			sp_plan_t p;
			copy_plan(f, &p);
			del_ins(&p, d, k);
			if (source) {
				/* the other devices of the slice still add their samples */
				int64_t B = ref.model.tasks[m->task].batch;
				char what[200];
				snprintf(what, sizeof what,
					 "gets %lld samples of gradient in '%s' (batch %lld)",
					 (long long)(B - (in->s1 - in->s0)), m->name, (long long)B);
				expect_defect(&p, f->cap, "missing gradient contribution", what,
					      &shown_src);
				n_src++;
			} else {
				char where[32];
				snprintf(where, sizeof where, "device %d ", d);
				expect_defect(&p, f->cap, "missing input", where, &shown_mid);
				n_mid++;
			}
			plan_release(&p);
		}
	print_message("%d source and %d other BWD deletions rejected\n", n_src, n_mid);
	assert_true(n_src >= 1 && n_mid >= 1);
	plan_release(&ref);
}

/* ---- (f) a compute instruction moved before the RECV of its input ------------- */

static void test_fwd_before_recv(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 1; k < ref.devices[d].n_ins; k++) {
			const sp_ins_t *rv = ins_at(&ref, d, k - 1), *in = ins_at(&ref, d, k);
			if (rv->op != INS_RECV || (in->op != INS_FWD && in->op != INS_LOSS))
				continue;
			const sp_slice_t *sl = &ref.slices[in->slice];
			if (rv->dst.grad || rv->dst.metaop != sl->metaop ||
			    rv->dst.layer != sl->layer_from)
				continue; /* not this instruction's input */
			sp_plan_t p;
			copy_plan(f, &p);
			sp_ins_t tmp = *ins_at(&p, d, k - 1);
			*ins_at(&p, d, k - 1) = *ins_at(&p, d, k);
			*ins_at(&p, d, k) = tmp;
			char where[64];
			snprintf(where, sizeof where, "device %d instruction %d (%s): missing input",
				 d, k - 1, ins_op_name(in->op));
			expect_defect(&p, f->cap, "missing input", where, &shown);
			plan_release(&p);
			n++;
		}
	print_message("%d of %d swaps rejected\n", n, n);
	assert_true(n >= 1);
	plan_release(&ref);
}

/* ---- (g) a holder left out of its sync bucket --------------------------------- */

static void test_bucket_member(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int b = 0; b < ref.n_buckets; b++)
		for (int q = 0; q < ref.buckets[b].n_dev; q++) {
			int d = ref.bucket_devs[ref.buckets[b].dev_off + q];
			const sp_param_t *pr = &ref.bucket_params[ref.buckets[b].param_off];
			sp_plan_t p;
			copy_plan(f, &p);
			del_bucket_dev(&p, b, q);
			char what[160];
			snprintf(what, sizeof what, "sync group of '%s' layer %d leaves out holder "
				 "device %d", p.model.comps[pr->comp].name, pr->layer, d);
			expect_defect(&p, f->cap, "missing gradient contribution", what, &shown);
			plan_release(&p);
			n++;
		}
	print_message("%d of %d dropped members rejected\n", n, n);
	assert_true(n >= 2);
	plan_release(&ref);
}

/*
 * A parameter in no sync bucket at all passes the membership check (it
 * walks the buckets) but not the first instruction that computes its
 * gradient: its contributions would never be all-reduced.
 */
static void test_param_unsynced(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int b = 0; b < ref.n_buckets; b++)
		for (int q = 0; q < ref.buckets[b].n_params; q++) {
			sp_param_t pr = ref.bucket_params[ref.buckets[b].param_off + q];
			sp_plan_t p;
			copy_plan(f, &p);
			del_bucket_param(&p, b, q);
			char what[160];
			snprintf(what, sizeof what, "gradients of '%s' layer %d computed here are "
				 "not in its sync group", p.model.comps[pr.comp].name, pr.layer);
			expect_defect(&p, f->cap, "missing gradient contribution", what, &shown);
			plan_release(&p);
			n++;
		}
	print_message("%d of %d unsynced parameters rejected\n", n, n);
	assert_true(n >= 2);
	plan_release(&ref);
}

/*
 * A device that issues one of its buckets' all-reduces twice would update
 * that bucket twice in its step (the step walks the device's SYNCs): the
 * end-of-run check rejects it, naming device and bucket.
 */
static void test_sync_twice(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			sp_ins_t in = *ins_at(&ref, d, k);
			if (in.op != INS_SYNC)
				continue;
			sp_plan_t p;
			copy_plan(f, &p);
			ins_ins(&p, d, k + 1, in);
			char what[160];
			snprintf(what, sizeof what, "device %d issues the all-reduce of sync bucket "
				 "%d 2 times", d, (int)in.peer);
			expect_defect(&p, f->cap, "missing gradient contribution", what, &shown);
			plan_release(&p);
			n++;
		}
	print_message("%d of %d repeated all-reduces rejected\n", n, n);
	assert_true(n >= 2);
	plan_release(&ref);
}

/* ---- (h) a memory cap below the plan's peak ------------------------------------ */

static void test_out_of_memory(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_plan(f, &p);
	int64_t peak = 0;
	int worst = -1;
	for (int d = 0; d < p.n_devices; d++) {
		int64_t mem[MEM__COUNT], tot = 0;
		assert_int_equal(plan_memory(&p, d, mem), 0);
		for (int c = 0; c < MEM__COUNT; c++)
			tot += mem[c];
		assert_int_equal(tot, p.devices[d].mem_peak);
		if (tot > peak) {
			peak = tot;
			worst = d;
		}
	}
	assert_true(peak > 0 && (double)peak <= f->cap);
	/* a cap of exactly the peak fits; one byte less does not, and the
	 * first device at the peak is named */
	expect_valid(&p, (double)peak);
	char what[64];
	snprintf(what, sizeof what, "out of memory: device %d needs", worst);
	int shown = 0;
	expect_defect(&p, (double)(peak - 1), "out of memory", what, &shown);
	expect_defect(&p, (double)peak / 2, "out of memory", NULL, NULL);
	plan_release(&p);
}

/*
 * ---- (i) a cycle: A receives from B before sending what B waits for ----------
 *
 * For every A → B transfer t1 (A sends, B receives) followed on B by a
 * transfer t2 back to A, A's RECV of t2 is moved before its SEND of t1: A
 * waits for t2, which B sends only after receiving t1.
 */
static void test_deadlock_cycle(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, shown = 0;
	for (int a = 0; a < ref.n_devices; a++)
		for (int ka = 0; ka < ref.devices[a].n_ins; ka++) {
			const sp_ins_t *s1 = ins_at(&ref, a, ka);
			if (s1->op != INS_SEND)
				continue;
			int b = -1;
			int kb = find_tag(&ref, INS_RECV, s1->tag, &b);
			assert_true(kb >= 0 && b == s1->peer);
			for (int j = kb + 1; j < ref.devices[b].n_ins; j++) {
				const sp_ins_t *s2 = ins_at(&ref, b, j);
				if (s2->op != INS_SEND || s2->peer != a)
					continue;
				int a2 = -1;
				int kr = find_tag(&ref, INS_RECV, s2->tag, &a2);
				assert_true(a2 == a && kr > ka);
				sp_plan_t p;
				copy_plan(f, &p);
				move_ins(&p, a, kr, ka);
				expect_defect(&p, f->cap, "deadlock", NULL, &shown);
				plan_release(&p);
				n++;
				break;
			}
		}
	print_message("%d of %d cycles rejected\n", n, n);
	assert_true(n >= 1);
	plan_release(&ref);
}

/*
 * Every single deleted instruction except a STEP is rejected. (A program
 * without its STEP passes: the verifier checks that gradients are complete
 * and synchronised, not that the optimizer runs.)
 */
static void test_every_deletion(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t ref;
	copy_plan(f, &ref);
	int n = 0, by_op[INS_STEP + 1] = {0};
	for (int d = 0; d < ref.n_devices; d++)
		for (int k = 0; k < ref.devices[d].n_ins; k++) {
			int op = ins_at(&ref, d, k)->op;
			if (op == INS_STEP)
				continue;
			sp_plan_t p;
			copy_plan(f, &p);
			del_ins(&p, d, k);
			sp_err_t err = {0};
			int rc = verify_plan(&p, f->cap, &err);
			if (rc != SP_EINTERNAL)
				fail_msg("deleting device %d instruction %d (%s) passed (rc %d)", d, k,
					 ins_op_name(op), rc);
			plan_release(&p);
			by_op[op]++;
			n++;
		}
	print_message("%d deletions rejected: %d FWD %d BWD %d SEND %d RECV %d COPY %d LOSS "
		      "%d SYNC\n",
		      n, by_op[INS_FWD], by_op[INS_BWD], by_op[INS_SEND], by_op[INS_RECV],
		      by_op[INS_COPY], by_op[INS_LOSS], by_op[INS_SYNC]);
	assert_int_equal(n, ref.n_ins - count_op(&ref, INS_STEP));
	plan_release(&ref);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_deleted_send),
		cmocka_unit_test(test_recv_size),
		cmocka_unit_test(test_deleted_recv),
		cmocka_unit_test(test_unmatched_transfer),
		cmocka_unit_test(test_missing_params),
		cmocka_unit_test(test_deleted_bwd),
		cmocka_unit_test(test_fwd_before_recv),
		cmocka_unit_test(test_bucket_member),
		cmocka_unit_test(test_param_unsynced),
		cmocka_unit_test(test_sync_twice),
		cmocka_unit_test(test_out_of_memory),
		cmocka_unit_test(test_deadlock_cycle),
		cmocka_unit_test(test_every_deletion),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
