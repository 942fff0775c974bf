/*
 * test_verify.c — the plan verifier (planner/verify.c) on hand-broken
 * programs. The demo model (3 tasks: a contrastive loss, an lm_head over a
 * concatenation, a classifier) is planned once on its 4-device cluster;
 * the valid plan must pass. Each test then breaks deep copies of it
 * (plan_encode + plan_decode) in one way, wherever that break applies,
 * and requires the verifier to reject every copy naming the defect the
 * break causes. The first message of each kind is printed, then how many
 * breaks of that kind were made and how many were rejected. Which defect a
 * break causes is not always the obvious one (a deleted RECV starves a
 * reader before the end-of-run transfer check); each test says why. The
 * tensor-parallel tests break the demo planned under --tp 2.
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
	uint8_t *zbytes; /* the same inputs under --zero 1 --recompute all */
	size_t zlen;
	uint8_t *tbytes; /* the same inputs under --tp 2 */
	size_t tlen;
	uint8_t *mbytes; /* under --microbatches match=2,caption=4 */
	size_t mlen;
	uint8_t *z3bytes; /* under --zero 3 */
	size_t z3len;
	double cap;     /* the planner's usable bytes per device */
	int n_devices;
} vfix_t;

static const char *root_dir(void)
{
	const char *r = getenv("SPINDLE_ROOT");
	return r && *r ? r : SPINDLE_ROOT;
}

/* Plans m on c under o, encoded into *out, *len (p: the plan, kept). */
static int plan_encoded(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
			sp_plan_t *p, uint8_t **out, size_t *len, sp_err_t *err)
{
	plan_summary_t sum;
	plan_release(p);
	return planner_run(o, m, c, p, &sum, err) || plan_encode(out, len, p, err);
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
	if (plan_encoded(&o, &m, &c, &p, &f->bytes, &f->len, &err))
		goto cleanup;
	plan_opts_t z = o, t = o;
	z.zero = 1;
	z.recompute = 1;
	t.tp = 2; /* sequential: every slice on all 4 devices, so split (ours
		   * picks 1-device lanes on this cluster, which no degree splits) */
	t.algo = ALGO_SEQUENTIAL;
	plan_opts_t mb = o, z3 = o;
	mb.mb_tasks = "match=2,caption=4";
	z3.zero = 3;
	if (plan_encoded(&z, &m, &c, &p, &f->zbytes, &f->zlen, &err) ||
	    plan_encoded(&t, &m, &c, &p, &f->tbytes, &f->tlen, &err) ||
	    plan_encoded(&mb, &m, &c, &p, &f->mbytes, &f->mlen, &err) ||
	    plan_encoded(&z3, &m, &c, &p, &f->z3bytes, &f->z3len, &err))
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
	if (f) {
		free(f->bytes);
		free(f->zbytes);
		free(f->tbytes);
		free(f->mbytes);
		free(f->z3bytes);
	}
	free(f);
	return 0;
}

/* ---- editing copies ---------------------------------------------------------- */

static void copy_plan(const vfix_t *f, sp_plan_t *out)
{
	sp_err_t err = {0};
	assert_int_equal(plan_decode(out, f->bytes, f->len, "demo.bin", &err), 0);
}

/* The plan made under --tp 2. */
static void copy_tplan(const vfix_t *f, sp_plan_t *out)
{
	sp_err_t err = {0};
	assert_int_equal(plan_decode(out, f->tbytes, f->tlen, "demo-tp2.bin", &err), 0);
}

/* The plan made under --zero 1 --recompute all. */
static void copy_zplan(const vfix_t *f, sp_plan_t *out)
{
	sp_err_t err = {0};
	assert_int_equal(plan_decode(out, f->zbytes, f->zlen, "demo-zero1.bin", &err), 0);
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

/* Drops element g of a shared array of *n elements of sz bytes. */
static void drop_at(void *arr, size_t sz, int32_t *n, int g)
{
	memmove((char *)arr + sz * (size_t)g, (char *)arr + sz * (size_t)(g + 1),
		sz * (size_t)(*n - g - 1));
	(*n)--;
}

/* Drops device d's held entry k (p->held is shared like p->ins). */
static void del_held(sp_plan_t *p, int d, int k)
{
	drop_at(p->held, sizeof *p->held, &p->n_held, p->devices[d].held_off + k);
	p->devices[d].n_held--;
	for (int e = d + 1; e < p->n_devices; e++)
		p->devices[e].held_off--;
}

/* Drops member q (params 0) or parameter q (params 1) of bucket b (both
 * lists are shared by the buckets, like p->ins). */
static void del_bucket_entry(sp_plan_t *p, int b, int q, int params)
{
	sp_bucket_t *bk = p->buckets;
	if (params) { /* the bucket's elems stay its params' (a rule of its own) */
		const sp_param_t *pr = &p->bucket_params[bk[b].param_off + q];
		bk[b].elems -= comp_layer_params_tp(&p->model.comps[pr->comp], pr->tp);
	}
	if (params)
		drop_at(p->bucket_params, sizeof *p->bucket_params, &p->n_bucket_params,
			bk[b].param_off + q);
	else
		drop_at(p->bucket_devs, sizeof *p->bucket_devs, &p->n_bucket_devs,
			bk[b].dev_off + q);
	*(params ? &bk[b].n_params : &bk[b].n_dev) -= 1;
	for (int e = b + 1; e < p->n_buckets; e++)
		*(params ? &bk[e].param_off : &bk[e].dev_off) -= 1;
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

static int count_op(const sp_plan_t *p, int op)
{
	int n = 0;
	for (int k = 0; k < p->n_ins; k++)
		n += p->ins[k].op == op;
	return n;
}

static void expect_valid(const sp_plan_t *p, double cap)
{
	sp_err_t err = {0};
	int rc = verify_plan(p, cap, &err);
	if (rc)
		fail_msg("valid plan rejected: %s", err.msg);
}

/*
 * Breaks of one kind: a reference copy to find sites in, the copy being
 * broken, how many breaks were made and how many the verifier rejected as
 * expected. The first rejection's message and the first misses are
 * printed; breaks_end prints both counts, so a miss shows in the summary.
 */
typedef struct {
	const vfix_t *f;
	const char *kind;
	double cap;
	sp_plan_t ref, p;
	int made, rejected;
	int zero1; /* breaking the --zero 1 --recompute all plan (2: its zero-2
		    * twin; 3: the --zero 3 plan) */
	int tp;    /* breaking the --tp 2 plan */
	int mb;    /* breaking the micro-batches-per-task plan */
} breaks_t;

/* The plan made under --microbatches match=2,caption=4. */
static void copy_mplan(const vfix_t *f, sp_plan_t *out)
{
	sp_err_t err = {0};
	assert_int_equal(plan_decode(out, f->mbytes, f->mlen, "demo-mb.bin", &err), 0);
}

/* The --zero 1 --recompute all plan with its zero-1 buckets in zero-2: the
 * same programs (a SYNC reduce-scatters, GATHERs after the STEP), the
 * gradients sharded too (the lowering is the same under --zero 2). */
static void copy_z2plan(const vfix_t *f, sp_plan_t *out)
{
	copy_zplan(f, out);
	for (int bk = 0; bk < out->n_buckets; bk++)
		if (out->buckets[bk].layout == LAYOUT_ZERO1)
			out->buckets[bk].layout = LAYOUT_ZERO2;
}

/* The plan made under --zero 3. */
static void copy_z3plan(const vfix_t *f, sp_plan_t *out)
{
	sp_err_t err = {0};
	assert_int_equal(plan_decode(out, f->z3bytes, f->z3len, "demo-zero3.bin", &err), 0);
}

/* A copy of the plan b breaks (plain, --zero 1 --recompute all or its
 * zero-2 twin, --zero 3, --tp 2). */
static void copy_for(const breaks_t *b, sp_plan_t *out)
{
	if (b->zero1 == 3)
		copy_z3plan(b->f, out);
	else if (b->mb)
		copy_mplan(b->f, out);
	else if (b->tp)
		copy_tplan(b->f, out);
	else if (b->zero1 == 2)
		copy_z2plan(b->f, out);
	else if (b->zero1)
		copy_zplan(b->f, out);
	else
		copy_plan(b->f, out);
}

static void breaks_begin_on(breaks_t *b, const vfix_t *f, const char *kind, int zero1, int tp)
{
	memset(b, 0, sizeof *b);
	b->f = f;
	b->kind = kind;
	b->cap = f->cap;
	b->zero1 = zero1;
	b->tp = tp;
	copy_for(b, &b->ref);
}

static void breaks_begin(breaks_t *b, const vfix_t *f, const char *kind)
{
	breaks_begin_on(b, f, kind, 0, 0);
}

/* The same on the plan made under --zero 1 --recompute all. */
static void breaks_begin_zero1(breaks_t *b, const vfix_t *f, const char *kind)
{
	breaks_begin_on(b, f, kind, 1, 0);
}

/* The same on the plan made under --tp 2. */
static void breaks_begin_tp(breaks_t *b, const vfix_t *f, const char *kind)
{
	breaks_begin_on(b, f, kind, 0, 1);
}

/* A fresh copy of the valid plan, to break. */
static sp_plan_t *break_copy(breaks_t *b)
{
	copy_for(b, &b->p);
	return &b->p;
}

/*
 * b->p, broken, is rejected as a bug of ours (SP_EINTERNAL) whose message
 * starts "plan verification failed: " and names `defect`, and the text
 * `where` formats to, when given (device and instruction). Releases b->p.
 */
static void judge(breaks_t *b, const char *defect, const char *where, ...)
	__attribute__((format(printf, 3, 4)));
static void judge(breaks_t *b, const char *defect, const char *where, ...)
{
	static const char pre[] = "plan verification failed: ";
	char at[256] = "";
	if (where) {
		va_list ap;
		va_start(ap, where);
		vsnprintf(at, sizeof at, where, ap);
		va_end(ap);
	}
	sp_err_t err = {0};
	int rc = verify_plan(&b->p, b->cap, &err);
	int ok = rc == SP_EINTERNAL && err.code == SP_EINTERNAL &&
		 !strncmp(err.msg, pre, strlen(pre)) && strstr(err.msg, defect) &&
		 strstr(err.msg, at);
	b->made++;
	if (ok && b->rejected++ == 0)
		print_message("%s\n", err.msg);
	if (!ok && b->made - b->rejected <= 3)
		print_message("MISS %s: expected '%s' %s, got rc %d: %s\n", b->kind, defect, at,
			      rc, err.msg);
	plan_release(&b->p);
}

/* Every break made was rejected, and at least `least` were made. */
static void breaks_end(breaks_t *b, int least)
{
	print_message("%s: %d of %d rejected (at least %d expected)\n", b->kind, b->rejected,
		      b->made, least);
	assert_int_equal(b->rejected, b->made);
	assert_true(b->made >= least);
	plan_release(&b->ref);
}

/* brk(b, d, k) for every instruction of b->ref with op `op` (-1: all).
 * b is the array the test began: kinds after the first are b[1], .... */
static void each_ins(breaks_t *b, int op, void (*brk)(breaks_t *b, int d, int k))
{
	for (int d = 0; d < b->ref.n_devices; d++)
		for (int k = 0; k < b->ref.devices[d].n_ins; k++)
			if (op < 0 || ins_at(&b->ref, d, k)->op == op)
				brk(b, d, k);
}

/* breaks_begin on the valid plan, or (zero1) on the --zero 1 one (2: its
 * zero-2 twin). */
static void breaks_open(breaks_t *b, void **state, int zero1, const char *kind)
{
	breaks_begin_on(b, *state, kind, zero1, 0);
}

/* Breaks brk at every instruction of op in the valid plan (zero1: the one
 * made under --zero 1 --recompute all); every break is rejected, and at
 * least `least` are made (-1: one per such instruction). */
static void breaks_each_ins(void **state, int zero1, const char *kind, int op,
			    void (*brk)(breaks_t *b, int d, int k), int least)
{
	breaks_t b;
	breaks_open(&b, state, zero1, kind);
	each_ins(&b, op, brk);
	breaks_end(&b, least < 0 ? count_op(&b.ref, op) : least);
}

/* brk(b, bucket, q) for every member q of every bucket of b->ref (params:
 * 0), or every parameter q of it (params: 1). */
static void each_bucket(breaks_t *b, int params, void (*brk)(breaks_t *b, int bk, int q))
{
	for (int bk = 0; bk < b->ref.n_buckets; bk++) {
		int n = params ? b->ref.buckets[bk].n_params : b->ref.buckets[bk].n_dev;
		for (int q = 0; q < n; q++)
			brk(b, bk, q);
	}
}

/* The same for brk at every member (params 0) or parameter (params 1) of
 * every bucket; least -1: one per member or parameter. */
static void breaks_each_bucket(void **state, int zero1, const char *kind, int params,
			       void (*brk)(breaks_t *b, int bk, int q), int least)
{
	breaks_t b;
	breaks_open(&b, state, zero1, kind);
	each_bucket(&b, params, brk);
	breaks_end(&b, least >= 0 ? least : params ? b.ref.n_bucket_params : b.ref.n_bucket_devs);
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

static void del_send(breaks_t *b, int d, int k)
{
	del_ins(break_copy(b), d, k);
	/* the receiver blocks, and so does whoever waits on it; the report
	 * names the lowest-numbered blocked device */
	judge(b, "deadlock", NULL);
}

static void test_deleted_send(void **state)
{
	breaks_each_ins(state, 0, "deleted SENDs", INS_SEND, del_send, -1);
}

/* ---- (b) a RECV whose sample range differs from its SEND's -------------------- */

static void resize_recv(breaks_t *b, int d, int k)
{
	for (int delta = -1; delta <= 1; delta += 2) {
		const sp_ins_t *in = ins_at(&b->ref, d, k);
		if (in->s1 + delta <= in->s0)
			continue;
		ins_at(break_copy(b), d, k)->s1 += delta;
		/* caught at the RECV itself, when its SEND has run */
		judge(b, "size mismatch", "device %d instruction %d (recv)", d, k);
	}
}

static void test_recv_size(void **state)
{
	breaks_each_ins(state, 0, "changed RECVs", INS_RECV, resize_recv, 2);
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
static void del_recv(breaks_t *b, int d, int k)
{
	del_ins(break_copy(b), d, k);
	judge(b, "missing input", "device %d ", d);
}

static void test_deleted_recv(void **state)
{
	breaks_each_ins(state, 0, "deleted RECVs", INS_RECV, del_recv, -1);
}

static int max_tag(const sp_plan_t *p)
{
	int t = -1;
	for (int k = 0; k < p->n_ins; k++)
		t = SP_MAX(t, p->ins[k].tag);
	return t;
}

/* b[0]: a later RECV takes its device's first RECV's tag; b[1]: the same
 * value sent once more, under a tag of its own, just before STEP: every
 * program finishes, one tag is left */
static void retag(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = ins_at(&b->ref, d, k);
	int first_recv = -1; /* before k */
	for (int j = 0; j < k && first_recv < 0; j++)
		if (ins_at(&b->ref, d, j)->op == INS_RECV)
			first_recv = j;
	if (in->op == INS_RECV && first_recv >= 0) {
		sp_plan_t *p = break_copy(b);
		ins_at(p, d, k)->tag = ins_at(p, d, first_recv)->tag;
		judge(b, "unmatched transfer", "device %d instruction %d (recv)", d, k);
	}
	if (in->op == INS_SEND) {
		int tag = max_tag(&b->ref) + 1;
		sp_ins_t extra = *in;
		extra.tag = tag;
		sp_plan_t *p = break_copy(&b[1]);
		ins_ins(p, d, p->devices[d].n_ins - 1, extra);
		judge(&b[1], "unmatched transfer", "tag %d is sent but never received", tag);
	}
}

/* "unmatched transfer" proper: a RECV of a tag its device received already,
 * and an extra SEND that no program receives */
static void test_unmatched_transfer(void **state)
{
	breaks_t b[2];
	breaks_begin(&b[0], *state, "retagged RECVs");
	breaks_begin(&b[1], *state, "extra SENDs");
	each_ins(b, -1, retag);
	breaks_end(&b[0], 1);
	breaks_end(&b[1], 1);
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
static void drop_held(breaks_t *b, int bk, int q)
{
	const sp_plan_t *ref = &b->ref;
	int d = ref->bucket_devs[ref->buckets[bk].dev_off + q];
	/* the held entry of the bucket's first parameter on d */
	const sp_param_t *pr = &ref->bucket_params[ref->buckets[bk].param_off];
	const char *name = ref->model.comps[pr->comp].name;
	int h = -1;
	for (int k = 0; k < ref->devices[d].n_held; k++)
		if (ref->held[ref->devices[d].held_off + k].comp == pr->comp &&
		    ref->held[ref->devices[d].held_off + k].layer == pr->layer)
			h = k;
	assert_true(h >= 0);
	del_held(break_copy(b), d, h);
	judge(b, "missing gradient contribution",
	      "sync group of '%s' layer %d includes non-holder device %d", name, pr->layer, d);
	if (ref->buckets[bk].n_params != 1)
		return; /* the bucket's other parameters stay held on d */
	for (int check = 0; check < 2; check++) {
		sp_plan_t *p = break_copy(&b[1]);
		del_held(p, d, h);
		del_bucket_entry(p, bk, q, 0);
		if (check == 0)
			judge(&b[1], "missing parameters", "device %d ", d);
		else
			judge(&b[1], "missing parameters", "'%s' layer %d is not held here", name,
			      pr->layer);
	}
}

static void test_missing_params(void **state)
{
	breaks_t b[2];
	breaks_begin(&b[0], *state, "dropped held entries");
	breaks_begin(&b[1], *state, "checks (two each) of held entries dropped with their sync membership");
	each_bucket(b, 0, drop_held);
	breaks_end(&b[0], 2);
	breaks_end(&b[1], 2);
}

/*
 * ---- (e) a BWD deleted ---------------------------------------------------------
 *
 * A BWD writes the gradient of its slice's input. Except at a source, whose
 * input is data, someone reads that gradient next (the BWD of the layers
 * below, or a SEND/COPY to the producer), finds it incomplete and says
 * "missing input". A source's BWD writes nothing anyone reads; what is lost
 * is its parameter gradient, which the end-of-run count finds short of the
 * task's batch: "missing gradient contribution". b[0]: sources, b[1]: others.
 */
static void del_bwd(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = ins_at(&b->ref, d, k);
	const sp_slice_t *sl = &b->ref.slices[in->slice];
	const sp_metaop_t *m = &b->ref.metaops[sl->metaop];
	if (sl->layer_from == 0 && m->width_in == 0) {
		/* the other devices of the slice still add their samples */
		int64_t B = b->ref.model.tasks[m->task].batch;
		del_ins(break_copy(b), d, k);
		judge(b, "missing gradient contribution",
		      "gets %lld samples of gradient in '%s' (batch %lld)",
		      (long long)(B - (in->s1 - in->s0)), m->name, (long long)B);
	} else {
		del_ins(break_copy(&b[1]), d, k);
		judge(&b[1], "missing input", "device %d ", d);
	}
}

static void test_deleted_bwd(void **state)
{
	breaks_t b[2];
	breaks_begin(&b[0], *state, "source BWD deletions");
	breaks_begin(&b[1], *state, "other BWD deletions");
	each_ins(b, INS_BWD, del_bwd);
	breaks_end(&b[0], 1);
	breaks_end(&b[1], 1);
}

/* ---- (f) a compute instruction moved before the RECV of its input ------------- */

static void swap_recv(breaks_t *b, int d, int k)
{
	if (k == 0)
		return;
	const sp_ins_t *rv = ins_at(&b->ref, d, k - 1), *in = ins_at(&b->ref, d, k);
	if (rv->op != INS_RECV || (in->op != INS_FWD && in->op != INS_LOSS))
		return;
	const sp_slice_t *sl = &b->ref.slices[in->slice];
	if (rv->dst.grad || rv->dst.metaop != sl->metaop || rv->dst.layer != sl->layer_from)
		return; /* not this instruction's input */
	sp_plan_t *p = break_copy(b);
	*ins_at(p, d, k - 1) = *in;
	*ins_at(p, d, k) = *rv;
	judge(b, "missing input", "device %d instruction %d (%s): missing input", d, k - 1,
	      ins_op_name(in->op));
}

static void test_fwd_before_recv(void **state)
{
	breaks_t b;
	breaks_begin(&b, *state, "swaps");
	each_ins(&b, -1, swap_recv);
	breaks_end(&b, 1);
}

/* ---- (g) a holder left out of its sync bucket --------------------------------- */

static void drop_member(breaks_t *b, int bk, int q)
{
	const sp_plan_t *ref = &b->ref;
	int d = ref->bucket_devs[ref->buckets[bk].dev_off + q];
	const sp_param_t *pr = &ref->bucket_params[ref->buckets[bk].param_off];
	del_bucket_entry(break_copy(b), bk, q, 0);
	judge(b, "missing gradient contribution",
	      "sync group of '%s' layer %d leaves out holder device %d",
	      ref->model.comps[pr->comp].name, pr->layer, d);
}

static void test_bucket_member(void **state)
{
	breaks_each_bucket(state, 0, "dropped members", 0, drop_member, -1);
}

/*
 * A parameter in no sync bucket at all passes the membership check (it
 * walks the buckets) but not the first instruction that computes its
 * gradient: its contributions would never be all-reduced.
 */
static void drop_param(breaks_t *b, int bk, int q)
{
	const sp_param_t *pr = &b->ref.bucket_params[b->ref.buckets[bk].param_off + q];
	del_bucket_entry(break_copy(b), bk, q, 1);
	judge(b, "missing gradient contribution",
	      "gradients of '%s' layer %d computed here are not in its sync group",
	      b->ref.model.comps[pr->comp].name, pr->layer);
}

static void test_param_unsynced(void **state)
{
	breaks_each_bucket(state, 0, "unsynced parameters", 1, drop_param, -1);
}

/*
 * A device that issues one of its buckets' all-reduces twice would update
 * that bucket twice in its step (the step walks the device's SYNCs): the
 * end-of-run check rejects it, naming device and bucket.
 */
static void sync_twice(breaks_t *b, int d, int k)
{
	sp_ins_t in = *ins_at(&b->ref, d, k);
	ins_ins(break_copy(b), d, k + 1, in);
	judge(b, "missing gradient contribution",
	      "device %d issues the all-reduce of sync bucket %d 2 times", d, (int)in.peer);
}

static void test_sync_twice(void **state)
{
	breaks_each_ins(state, 0, "repeated all-reduces", INS_SYNC, sync_twice, -1);
}

/* ---- (h) a memory cap below the plan's peak ------------------------------------ */

static void test_out_of_memory(void **state)
{
	breaks_t b;
	breaks_begin(&b, *state, "caps below the peak");
	int64_t peak = 0;
	int worst = -1;
	for (int d = 0; d < b.ref.n_devices; d++) {
		int64_t mem[MEM__COUNT], tot = 0;
		assert_int_equal(plan_memory(&b.ref, d, mem), 0);
		for (int c = 0; c < MEM__COUNT; c++)
			tot += mem[c];
		assert_int_equal(tot, b.ref.devices[d].mem_peak);
		if (tot > peak) {
			peak = tot;
			worst = d;
		}
	}
	assert_true(peak > 0 && (double)peak <= b.cap);
	/* a cap of exactly the peak fits; one byte less does not, and the
	 * first device at the peak is named */
	expect_valid(&b.ref, (double)peak);
	b.cap = (double)(peak - 1);
	break_copy(&b);
	judge(&b, "out of memory", "out of memory: device %d needs", worst);
	b.cap = (double)peak / 2;
	break_copy(&b);
	judge(&b, "out of memory", NULL);
	breaks_end(&b, 2);
}

/*
 * ---- (i) a cycle: A receives from B before sending what B waits for ----------
 *
 * For every A → B transfer t1 (A sends, B receives) followed on B by a
 * transfer t2 back to A, A's RECV of t2 is moved before its SEND of t1: A
 * waits for t2, which B sends only after receiving t1.
 */
static void make_cycle(breaks_t *b, int a, int ka)
{
	sp_plan_t *ref = &b->ref;
	const sp_ins_t *s1 = ins_at(ref, a, ka);
	int d = -1;
	int kb = find_tag(ref, INS_RECV, s1->tag, &d);
	assert_true(kb >= 0 && d == s1->peer);
	for (int j = kb + 1; j < ref->devices[d].n_ins; j++) {
		const sp_ins_t *s2 = ins_at(ref, d, j);
		if (s2->op != INS_SEND || s2->peer != a)
			continue;
		int a2 = -1;
		int kr = find_tag(ref, INS_RECV, s2->tag, &a2);
		assert_true(a2 == a && kr > ka);
		move_ins(break_copy(b), a, kr, ka);
		judge(b, "deadlock", NULL);
		return;
	}
}

static void test_deadlock_cycle(void **state)
{
	breaks_each_ins(state, 0, "cycles", INS_SEND, make_cycle, 1);
}

/*
 * Every single deleted instruction except a STEP is rejected. (A program
 * without its STEP passes: the verifier checks that gradients are complete
 * and synchronised, not that the optimizer runs.)
 */
static void del_any(breaks_t *b, int d, int k)
{
	if (ins_at(&b->ref, d, k)->op == INS_STEP)
		return;
	del_ins(break_copy(b), d, k);
	judge(b, "", NULL);
}

static void test_every_deletion(void **state)
{
	breaks_t b;
	breaks_begin(&b, *state, "every deletion but STEP");
	each_ins(&b, -1, del_any);
	const sp_plan_t *r = &b.ref;
	print_message("deleted: %d FWD %d BWD %d SEND %d RECV %d COPY %d LOSS %d SYNC\n",
		      count_op(r, INS_FWD), count_op(r, INS_BWD), count_op(r, INS_SEND),
		      count_op(r, INS_RECV), count_op(r, INS_COPY), count_op(r, INS_LOSS),
		      count_op(r, INS_SYNC));
	int want = r->n_ins - count_op(r, INS_STEP);
	assert_int_equal(b.made, want);
	breaks_end(&b, want);
}

/* ---- (k) zero-1 buckets and recomputing slices ---------------------------------- */

static int n_gathers_due(const sp_plan_t *p)
{
	int n = 0;
	for (int bk = 0; bk < p->n_buckets; bk++)
		n += layout_sharded(p->buckets[bk].layout) ? p->buckets[bk].n_dev : 0;
	return n;
}

/* The forced plan is valid and has what the tests below break: zero-1
 * buckets with their GATHERs, a bucket that does not span every device, and
 * recomputing slices. */
static void test_zero1_valid(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_zplan(f, &p);
	expect_valid(&p, f->cap);
	int redo = 0, partial = 0;
	for (int i = 0; i < p.n_slices; i++)
		redo += p.slices[i].recompute;
	for (int bk = 0; bk < p.n_buckets; bk++)
		partial |= p.buckets[bk].layout == LAYOUT_ZERO1 && p.buckets[bk].n_dev < p.n_devices;
	assert_true(count_op(&p, INS_GATHER) > 0);
	assert_int_equal(count_op(&p, INS_GATHER), n_gathers_due(&p));
	assert_true(redo > 0);
	assert_true(partial);
	print_message("zero-1: %d GATHER, %d of %d slices recompute\n", count_op(&p, INS_GATHER),
		      redo, p.n_slices);
	plan_release(&p);
}

/* A member that never all-gathers its zero-1 bucket starts the next
 * iteration with stale weights outside its shard. */
static void del_gather(breaks_t *b, int d, int k)
{
	del_ins(break_copy(b), d, k);
	judge(b, "sharded parameters",
	      "device %d leaves 1 of its zero-1/2 buckets without an all-gather", d);
}

static void test_gather_missing(void **state)
{
	breaks_each_ins(state, 1, "deleted all-gathers", INS_GATHER, del_gather, -1);
	breaks_each_ins(state, 2, "deleted all-gathers (zero-2)", INS_GATHER, del_gather, -1);
}

static void gather_twice(breaks_t *b, int d, int k)
{
	sp_ins_t in = *ins_at(&b->ref, d, k);
	ins_ins(break_copy(b), d, k + 1, in);
	judge(b, "sharded parameters", "all-gather of bucket %d twice", (int)in.peer);
}

static void test_gather_twice(void **state)
{
	breaks_each_ins(state, 1, "repeated all-gathers", INS_GATHER, gather_twice, -1);
	breaks_each_ins(state, 2, "repeated all-gathers (zero-2)", INS_GATHER, gather_twice, -1);
}

/* A GATHER moved before the STEP would gather shards not yet updated. */
static void gather_early(breaks_t *b, int d, int k)
{
	int step = -1;
	for (int j = 0; j < b->ref.devices[d].n_ins; j++)
		if (ins_at(&b->ref, d, j)->op == INS_STEP)
			step = j;
	assert_true(step >= 0 && step < k);
	int peer = (int)ins_at(&b->ref, d, k)->peer;
	move_ins(break_copy(b), d, k, step);
	judge(b, "sharded parameters", "all-gather of bucket %d before the optimizer step", peer);
}

static void test_gather_before_step(void **state)
{
	breaks_each_ins(state, 1, "all-gathers before the step", INS_GATHER, gather_early, -1);
	breaks_each_ins(state, 2, "all-gathers before the step (zero-2)", INS_GATHER, gather_early,
			-1);
}

/* A device outside a zero-1 bucket's group all-gathering it: after its own
 * STEP, at the end of its program. */
static void gather_stranger(breaks_t *b, int bk, int q)
{
	const sp_bucket_t *bt = &b->ref.buckets[bk];
	if (q || !layout_sharded(bt->layout)) /* once per zero-1/2 bucket */
		return;
	for (int d = 0; d < b->ref.n_devices; d++) {
		int64_t off, n;
		if (bucket_shard(&b->ref, bk, d, &off, &n) >= 0)
			continue;
		sp_ins_t ga;
		memset(&ga, 0, sizeof ga);
		ga.op = INS_GATHER;
		ga.slice = -1;
		ga.tag = -1;
		ga.peer = bk;
		ins_ins(break_copy(b), d, b->ref.devices[d].n_ins, ga);
		judge(b, "sharded parameters", "all-gather of bucket %d by a device outside its group",
		      bk);
	}
}

static void test_gather_stranger(void **state)
{
	breaks_each_bucket(state, 1, "all-gathers by non-members", 0, gather_stranger, 1);
	breaks_each_bucket(state, 2, "all-gathers by non-members (zero-2)", 0, gather_stranger, 1);
}

/* Deferred all-gathers: every zero-1 bucket of the forced plan deferred is
 * valid (the programs do not change); the flag on a bucket that does not
 * all-gather after the step (a replicated one, or zero-1 made zero-3) is
 * refused, by name. */
static void test_defer(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_zplan(f, &p);
	int n = 0, rep = -1;
	for (int bk = 0; bk < p.n_buckets; bk++) {
		p.buckets[bk].defer = layout_gathers_after_step(p.buckets[bk].layout);
		n += p.buckets[bk].defer;
		if (p.buckets[bk].layout == LAYOUT_REPLICATED && rep < 0)
			rep = bk;
	}
	assert_true(n > 0);
	expect_valid(&p, f->cap);
	assert_true(rep >= 0);
	p.buckets[rep].defer = 1;
	sp_err_t err = {0};
	assert_int_equal(verify_plan(&p, f->cap, &err), SP_EINTERNAL);
	char want[160];
	snprintf(want, sizeof want, "deferred all-gather: bucket %d is replicated", rep);
	if (!strstr(err.msg, want))
		fail_msg("expected '%s', got: %s", want, err.msg);
	print_message("defer: %d zero-1 buckets deferred valid; on a replicated one: %s\n", n,
		      err.msg);
	plan_release(&p);
}

/* ---- (l) zero-2 buckets (the zero-1 plan's twin) ---------------------------------- */

/* The twin is valid, and has zero-2 buckets whose gradients are written
 * before their SYNCs on every member. */
static void test_zero2_valid(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_z2plan(f, &p);
	expect_valid(&p, 0);
	int z2 = 0;
	for (int bk = 0; bk < p.n_buckets; bk++)
		z2 += p.buckets[bk].layout == LAYOUT_ZERO2;
	assert_true(z2 > 0);
	assert_int_equal(count_op(&p, INS_GATHER), n_gathers_due(&p));
	print_message("zero-2: %d buckets, %d GATHER\n", z2, count_op(&p, INS_GATHER));
	plan_release(&p);
}

/*
 * Overlap (bucket flag, --rs-overlap on): a zero-2 reduce-scatter completes
 * at the second placement of a full gradient at or past its safe point,
 * not the first. Checked against the rule itself: for every device of the
 * twin, the placements (instructions writing into a bucket with no full
 * gradient yet, or syncing one nothing wrote) are listed here from
 * z2map_writes alone; a bucket the plain walk completes at placement j
 * (done) the overlapped walk completes at placement j + 1, or at the STEP
 * when there is none. Some bucket completes before the STEP (else the
 * check is void). The overlapped plan is valid, its peak (plan_memory) is
 * at least the plain one's, and the verifier counts it: the plan is
 * rejected at a cap one byte below its peak.
 */
static void test_zero2_overlap(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_z2plan(f, &p);
	int32_t *safe = NULL, w[64];
	assert_int_equal(plan_z2_safe(&p, &safe), 0);
	sp_z2map_t m;
	assert_int_equal(z2map_init(&m, &p), 0);
	int mid = 0, later = 0;
	int64_t peak0 = 0, peak1 = 0;
	for (int d = 0; d < p.n_devices; d++) {
		const sp_device_t *dv = &p.devices[d];
		plan_z2_walk_t w0, w1;
		for (int bk = 0; bk < p.n_buckets; bk++)
			p.buckets[bk].overlap = 0;
		assert_int_equal(plan_z2_walk(&p, d, safe, &w0), 0);
		for (int bk = 0; bk < p.n_buckets; bk++)
			p.buckets[bk].overlap = p.buckets[bk].layout == LAYOUT_ZERO2;
		assert_int_equal(plan_z2_walk(&p, d, safe, &w1), 0);
		/* the placements of d's program (one micro-batch: one run) */
		assert_int_equal(z2map_for(&m, &p, d), 0);
		int *place = calloc((size_t)dv->n_ins + 1, sizeof *place), np = 0, step = dv->n_ins;
		char *seen = calloc((size_t)p.n_buckets + 1, 1);
		assert_true(place && seen);
		for (int k = 0; k < dv->n_ins; k++) {
			const sp_ins_t *in = &p.ins[dv->first_ins + k];
			int nw = z2map_writes(&m, &p, d, in, w, 64), any = 0;
			for (int j = 0; j < nw; j++)
				any |= !seen[w[j]]++;
			if (in->op == INS_SYNC && p.buckets[in->peer].layout == LAYOUT_ZERO2 &&
			    m.mine[in->peer])
				any |= !seen[in->peer]++;
			if (in->op == INS_STEP && step == dv->n_ins)
				step = k;
			if (any)
				place[np++] = k;
		}
		for (int bk = 0; bk < p.n_buckets; bk++) {
			if (w0.done[bk] < 0 || w0.done[bk] >= step) {
				assert_int_equal(w1.done[bk], w0.done[bk]); /* at the STEP both */
				continue;
			}
			int j = 0;
			while (j < np && place[j] != w0.done[bk])
				j++;
			assert_true(j < np); /* the plain walk completes at a placement */
			assert_int_equal(w1.done[bk], j + 1 < np ? place[j + 1] : step);
			mid++;
			later += w1.done[bk] > w0.done[bk];
		}
		peak0 = SP_MAX(peak0, w0.peak);
		peak1 = SP_MAX(peak1, w1.peak);
		free(place);
		free(seen);
		plan_z2_walk_release(&w0);
		plan_z2_walk_release(&w1);
	}
	print_message("overlap: %d buckets completed before the STEP, %d later with overlap; "
		      "full gradients at once %lld -> %lld elements\n",
		      mid, later, (long long)peak0, (long long)peak1);
	assert_true(mid > 0 && later > 0);
	assert_true(peak1 >= peak0);
	/* the overlapped plan: valid at its own peak, not a byte below */
	int64_t top = 0;
	for (int d = 0; d < p.n_devices; d++) {
		int64_t mem[MEM__COUNT], tot = 0;
		assert_int_equal(plan_memory(&p, d, mem), 0);
		for (int c = 0; c < MEM__COUNT; c++)
			tot += mem[c];
		p.devices[d].mem_peak = tot;
		for (int c = 0; c < MEM__COUNT; c++)
			p.devices[d].mem[c] = mem[c];
		top = SP_MAX(top, tot);
	}
	expect_valid(&p, (double)top);
	sp_err_t err = {0};
	assert_int_not_equal(verify_plan(&p, (double)top - 1, &err), 0);
	assert_non_null(strstr(err.msg, "out of memory"));
	z2map_release(&m);
	free(safe);
	plan_release(&p);
}

/* A zero-2 SYNC moved before the last instruction of its device that
 * writes into the bucket: that write would go to a full gradient the SYNC
 * has freed. */
static void sync_early(breaks_t *b, int d, int k)
{
	const sp_ins_t *sy = ins_at(&b->ref, d, k);
	if (b->ref.buckets[sy->peer].layout != LAYOUT_ZERO2)
		return;
	sp_z2map_t m;
	int32_t w[64];
	assert_int_equal(z2map_init(&m, &b->ref), 0);
	int last = -1;
	for (int j = 0; j < k; j++) {
		int nw = z2map_writes(&m, &b->ref, d, ins_at(&b->ref, d, j), w, 64);
		for (int q = 0; q < nw; q++)
			if (w[q] == sy->peer)
				last = j;
	}
	z2map_release(&m);
	assert_true(last >= 0); /* every member writes its bucket before the SYNC */
	int peer = (int)sy->peer;
	move_ins(break_copy(b), d, k, last);
	judge(b, "zero-2 gradient used after it was freed",
	      "device %d instruction %d (%s): zero-2 gradient used after it was freed: writes "
	      "gradients of bucket %d",
	      d, last + 1, ins_op_name(ins_at(&b->ref, d, last)->op), peer);
}

static void test_zero2_write_after_sync(void **state)
{
	breaks_t b;
	breaks_open(&b, state, 2, "zero-2 SYNCs before a write into their bucket");
	each_ins(&b, INS_SYNC, sync_early);
	int least = 0;
	for (int bk = 0; bk < b.ref.n_buckets; bk++)
		least += b.ref.buckets[bk].layout == LAYOUT_ZERO2 ? b.ref.buckets[bk].n_dev : 0;
	breaks_end(&b, least);
}

/*
 * Memory under the new layouts: the forced plan fits a cap of exactly its
 * peak; the same plan with every bucket replicated and every slice keeping
 * its activations (GATHERs dropped: a valid plan of the old kind) does not,
 * because the verifier prices each layout.
 */
static void test_zero1_memory(void **state)
{
	breaks_t b;
	breaks_begin_zero1(&b, *state, "layouts undone under the zero-1 peak");
	int64_t peak = 0;
	for (int d = 0; d < b.ref.n_devices; d++)
		peak = SP_MAX(peak, b.ref.devices[d].mem_peak);
	expect_valid(&b.ref, (double)peak);
	b.cap = (double)peak;
	sp_plan_t *p = break_copy(&b);
	for (int bk = 0; bk < p->n_buckets; bk++)
		p->buckets[bk].layout = LAYOUT_REPLICATED;
	for (int i = 0; i < p->n_slices; i++)
		p->slices[i].recompute = 0;
	for (int d = 0; d < p->n_devices; d++)
		for (int k = p->devices[d].n_ins - 1; k >= 0; k--)
			if (ins_at(p, d, k)->op == INS_GATHER)
				del_ins(p, d, k);
	expect_valid(p, 0); /* valid but for memory */
	judge(&b, "out of memory", NULL);
	breaks_end(&b, 1);
}

/* ---- (m) zero-3 buckets (the demo under --zero 3) ---------------------------------- */

static int is_use(const sp_ins_t *in)
{
	return in->op == INS_FWD || in->op == INS_BWD || in->op == INS_LOSS;
}

/* The plan is valid: zero-3 buckets, a PFREE for every PGATHER, no GATHER
 * after the STEP (the weights stay sharded). */
static void test_zero3_valid(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_z3plan(f, &p);
	expect_valid(&p, f->cap);
	int z3 = 0;
	for (int bk = 0; bk < p.n_buckets; bk++)
		z3 += p.buckets[bk].layout == LAYOUT_ZERO3;
	assert_true(z3 > 0);
	assert_true(count_op(&p, INS_PGATHER) > 0);
	assert_int_equal(count_op(&p, INS_PFREE), count_op(&p, INS_PGATHER));
	assert_int_equal(count_op(&p, INS_GATHER), 0);
	print_message("zero-3: %d buckets, %d PGATHER\n", z3, count_op(&p, INS_PGATHER));
	plan_release(&p);
}

/* A PGATHER moved past the use right after it: that use reads weights not
 * gathered yet. */
static void gather_late(breaks_t *b, int d, int k)
{
	if (k + 1 >= b->ref.devices[d].n_ins || !is_use(ins_at(&b->ref, d, k + 1)))
		return;
	int op = ins_at(&b->ref, d, k + 1)->op;
	move_ins(break_copy(b), d, k, k + 1);
	judge(b, "zero-3", "device %d instruction %d (%s): zero-3: the instruction uses zero-3 "
			   "weights not gathered",
	      d, k, ins_op_name(op));
}

/* A PFREE moved before the use right before it: that use reads weights
 * already given back. */
static void free_early(breaks_t *b, int d, int k)
{
	if (k < 1 || !is_use(ins_at(&b->ref, d, k - 1)))
		return;
	int op = ins_at(&b->ref, d, k - 1)->op;
	move_ins(break_copy(b), d, k, k - 1);
	judge(b, "zero-3", "device %d instruction %d (%s): zero-3: the instruction uses zero-3 "
			   "weights not gathered",
	      d, k, ins_op_name(op));
}

/* Uses of zero-3 weights by each device around its gathers. */
static int n_uses_after(const sp_plan_t *p, int op, int dir)
{
	int n = 0;
	for (int d = 0; d < p->n_devices; d++)
		for (int k = 0; k < p->devices[d].n_ins; k++) {
			int j = k + dir;
			n += p->ins[p->devices[d].first_ins + k].op == op && j >= 0 &&
			     j < p->devices[d].n_ins && is_use(&p->ins[p->devices[d].first_ins + j]);
		}
	return n;
}

static void test_zero3_use_outside_gather(void **state)
{
	breaks_t b[2];
	breaks_open(&b[0], state, 3, "zero-3 uses before their PGATHER");
	each_ins(&b[0], INS_PGATHER, gather_late);
	breaks_end(&b[0], SP_MAX(1, n_uses_after(&b[0].ref, INS_PGATHER, 1)));
	breaks_open(&b[1], state, 3, "zero-3 uses after their PFREE");
	each_ins(&b[1], INS_PFREE, free_early);
	breaks_end(&b[1], SP_MAX(1, n_uses_after(&b[1].ref, INS_PFREE, -1)));
}

/* Inserts a PGATHER of bucket bk and its PFREE before device d's
 * instruction k. */
static void ins_gather_pair(sp_plan_t *p, int d, int k, int bk)
{
	sp_ins_t in;
	memset(&in, 0, sizeof in);
	in.op = INS_PFREE;
	in.slice = -1;
	in.peer = bk;
	in.tag = -1;
	ins_ins(p, d, k, in);
	in.op = INS_PGATHER;
	ins_ins(p, d, k, in);
}

/* Device d's SYNC of bucket bk. */
static int sync_of(sp_plan_t *p, int d, int bk)
{
	int k = 0;
	while (ins_at(p, d, k)->op != INS_SYNC || ins_at(p, d, k)->peer != bk)
		k++;
	return k;
}

/* Every member of a zero-3 bucket gathers it once more at the start of its
 * program, but member q only just before its SYNC of it: the others wait
 * there for q, which waits for them at an earlier all-gather. */
static void gather_at_end(breaks_t *b, int bk, int q)
{
	const sp_bucket_t *bu = &b->ref.buckets[bk];
	if (bu->layout != LAYOUT_ZERO3)
		return;
	sp_plan_t *p = break_copy(b);
	for (int j = 0; j < bu->n_dev; j++) {
		int d = p->bucket_devs[bu->dev_off + j];
		ins_gather_pair(p, d, j == q ? sync_of(p, d, bk) : 0, bk);
	}
	judge(b, "deadlock", "waits at the all-gather of zero-3 bucket");
}

static void test_zero3_gather_order(void **state)
{
	breaks_each_bucket(state, 3, "zero-3 all-gathers a member reaches last", 0, gather_at_end,
			   1);
}

/* One member of a zero-3 bucket gathers it once more than the others: the
 * others' all-gathers lack a member. */
static void gather_extra(breaks_t *b, int bk, int q)
{
	const sp_bucket_t *bu = &b->ref.buckets[bk];
	if (bu->layout != LAYOUT_ZERO3)
		return;
	sp_plan_t *p = break_copy(b);
	ins_gather_pair(p, p->bucket_devs[bu->dev_off + q], 0, bk);
	judge(b, "zero-3", "gather the weights of bucket %d", bk);
}

static void test_zero3_gather_dropped(void **state)
{
	breaks_each_bucket(state, 3, "zero-3 all-gathers of one member alone", 0, gather_extra,
			   1);
}

/* A zero-3 SYNC moved before the device's last PGATHER of its bucket: its
 * reduce-scatter and that all-gather run on one group in another order
 * than on the other members. */
static void sync_before_gather(breaks_t *b, int d, int k)
{
	const sp_ins_t *sy = ins_at(&b->ref, d, k);
	if (b->ref.buckets[sy->peer].layout != LAYOUT_ZERO3)
		return;
	int last = -1;
	for (int j = 0; j < k; j++)
		if (ins_at(&b->ref, d, j)->op == INS_PGATHER && ins_at(&b->ref, d, j)->peer == sy->peer)
			last = j;
	assert_true(last >= 0);
	move_ins(break_copy(b), d, k, last);
	judge(b, "zero-3", "device %d instruction %d (pgather): zero-3: the instruction gathers "
			   "the weights of a zero-3 bucket after its SYNC",
	      d, last + 1);
}

static void test_zero3_sync_before_gather(void **state)
{
	breaks_t b;
	breaks_open(&b, state, 3, "zero-3 SYNCs before a PGATHER of their bucket");
	each_ins(&b, INS_SYNC, sync_before_gather);
	int least = 0;
	for (int bk = 0; bk < b.ref.n_buckets; bk++)
		least += b.ref.buckets[bk].layout == LAYOUT_ZERO3 ? b.ref.buckets[bk].n_dev : 0;
	breaks_end(&b, least);
}

/*
 * Memory under layout 3: the plan fits a cap of exactly its peak and not a
 * byte less; its devices' params+state are the shards and the gathered
 * pool, below the same plan with the weights counted whole (its buckets
 * zero-2: plan_memory alone, the programs unchanged).
 */
static void test_zero3_memory(void **state)
{
	breaks_t b;
	breaks_open(&b, state, 3, "caps below the zero-3 peak");
	int64_t peak = 0, below = 0;
	for (int d = 0; d < b.ref.n_devices; d++) {
		int64_t z3[MEM__COUNT], z2[MEM__COUNT], tot = 0;
		assert_int_equal(plan_memory(&b.ref, d, z3), 0);
		for (int c = 0; c < MEM__COUNT; c++)
			tot += z3[c];
		assert_int_equal(tot, b.ref.devices[d].mem_peak);
		peak = SP_MAX(peak, tot);
		sp_plan_t *p = break_copy(&b);
		for (int bk = 0; bk < p->n_buckets; bk++)
			if (p->buckets[bk].layout == LAYOUT_ZERO3)
				p->buckets[bk].layout = LAYOUT_ZERO2;
		assert_int_equal(plan_memory(p, d, z2), 0);
		below += z3[MEM_PARAMS] < z2[MEM_PARAMS];
		plan_release(p);
	}
	assert_true(below > 0);
	expect_valid(&b.ref, (double)peak);
	b.cap = (double)peak - 1;
	break_copy(&b);
	judge(&b, "out of memory", NULL);
	breaks_end(&b, 1);
}

/* ---- (j) tensor parallelism (the demo under --tp 2) ---------------------------- */

/* Slice i's device at slot k. */
static int slot_dev(const sp_plan_t *p, int i, int k)
{
	return p->slice_devs[p->slices[i].dev_off + k];
}

/* Device d's position of the op instruction of slice i, or -1. */
static int find_compute(const sp_plan_t *p, int d, int op, int i)
{
	for (int k = 0; k < p->devices[d].n_ins; k++) {
		const sp_ins_t *in = &p->ins[p->devices[d].first_ins + k];
		if (in->op == op && in->slice == i)
			return k;
	}
	return -1;
}

/* The plan verifies, has split slices, and member j of each holds shard
 * (tp, j) of its layers; each shard's bucket holds that shard's elements. */
static void test_tp_valid(void **state)
{
	breaks_t b;
	breaks_begin_tp(&b, *state, "tp");
	const sp_plan_t *p = &b.ref;
	expect_valid(p, b.cap);
	int split = 0;
	for (int i = 0; i < p->n_slices; i++) {
		const sp_slice_t *sl = &p->slices[i];
		if (sl->tp == 1)
			continue;
		split++;
		assert_int_equal(sl->tp, 2);
		for (int k = 0; k < sl->n_dev; k++) {
			const sp_device_t *dv = &p->devices[slot_dev(p, i, k)];
			int shards = 0;
			for (int h = 0; h < dv->n_held; h++)
				shards += p->held[dv->held_off + h].tp == 2 &&
					  p->held[dv->held_off + h].tp_rank == k % 2;
			assert_true(shards >= sl->layer_to - sl->layer_from);
		}
	}
	assert_true(split >= 1);
	for (int bk = 0; bk < p->n_buckets; bk++) {
		const sp_param_t *q = &p->bucket_params[p->buckets[bk].param_off];
		int64_t e = 0;
		for (int k = 0; k < p->buckets[bk].n_params; k++)
			e += comp_layer_params_tp(&p->model.comps[q[k].comp], q[k].tp);
		assert_int_equal(e, p->buckets[bk].elems);
	}
	plan_release(&b.ref);
}

/* brk(b, i) for every split slice i of the --tp 2 plan; at least one. */
static void each_tp_slice(void **state, const char *kind, void (*brk)(breaks_t *b, int i))
{
	breaks_t b;
	breaks_begin_tp(&b, *state, kind);
	for (int i = 0; i < b.ref.n_slices; i++)
		if (b.ref.slices[i].tp > 1)
			brk(&b, i);
	breaks_end(&b, 1);
}

/* A group whose members sit on two nodes (one member's node changed). */
static void span_nodes(breaks_t *b, int i)
{
	sp_plan_t *p = break_copy(b);
	p->nodes = 2;
	p->devices[slot_dev(p, i, 1)].node = 1;
	(void)i; /* slices share devices: the first split slice on them is named */
	judge(b, "tensor parallelism", "spans nodes");
}

static void test_tp_group_spans_nodes(void **state)
{
	each_tp_slice(state, "groups across nodes", span_nodes);
}

/* A split slice made whole while another slice of the same component
 * stays split: one sharding per layer. */
static int slice_comp(const sp_plan_t *r, int i)
{
	const sp_metaop_t *m = &r->metaops[r->slices[i].metaop];
	return r->model.tasks[m->task].nodes[r->ops[m->first_op].node].comp;
}

static void test_tp_one_sharding(void **state)
{
	breaks_t b;
	breaks_begin_tp(&b, *state, "two shardings of a layer");
	const sp_plan_t *r = &b.ref;
	for (int i = 0; i < r->n_slices; i++) {
		const sp_slice_t *x = &r->slices[i];
		if (x->tp != 2)
			continue;
		int shared = 0; /* another split slice over the same component */
		for (int j = 0; j < r->n_slices && !shared; j++)
			shared = j != i && r->slices[j].tp == 2 && slice_comp(r, j) == slice_comp(r, i);
		if (!shared)
			continue;
		break_copy(&b)->slices[i].tp = 1;
		judge(&b, "tensor parallelism", "one sharding per layer");
	}
	breaks_end(&b, 1);
}

/* Members 0 and 1 of a group trade places: each runs the slice without the
 * shard its new member index needs. */
static void swap_members(breaks_t *b, int i)
{
	sp_plan_t *p = break_copy(b);
	int32_t *sd = p->slice_devs + p->slices[i].dev_off;
	int32_t t = sd[0];
	sd[0] = sd[1];
	sd[1] = t;
	judge(b, "missing parameters", "shard of the slice's tp and this member");
}

static void test_tp_wrong_shard(void **state)
{
	each_tp_slice(state, "members swapped", swap_members);
}

/* A shard bucket that misstates its elements. */
static void test_tp_bucket_elems(void **state)
{
	breaks_t b;
	breaks_begin_tp(&b, *state, "shard bucket sizes");
	for (int bk = 0; bk < b.ref.n_buckets; bk++) {
		if (b.ref.bucket_params[b.ref.buckets[bk].param_off].tp == 1)
			continue;
		break_copy(&b)->buckets[bk].elems += 1;
		judge(&b, "tensor parallelism", "sync bucket %d says", bk);
	}
	breaks_end(&b, 1);
}

/* Member 1 runs the slice's BWD before its FWD while member 0 runs FWD
 * first: the group's all-reduces would never meet (a rendezvous deadlock). */
static void bwd_first(breaks_t *b, int i)
{
	int d = slot_dev(&b->ref, i, 1);
	int kf = find_compute(&b->ref, d, INS_FWD, i), kb = find_compute(&b->ref, d, INS_BWD, i);
	if (b->ref.metaops[b->ref.slices[i].metaop].shape.type == COMP_LM_HEAD)
		return; /* a split loss: LOSS only (fwd_twice repeats it) */
	assert_true(kf >= 0 && kb > kf);
	move_ins(break_copy(b), d, kb, kf);
	judge(b, "deadlock", "tensor-parallel group of slice %d", i);
}

static void test_tp_order(void **state)
{
	each_tp_slice(state, "members out of order", bwd_first);
}

/* Member 1 of a group loses a piece of its input: every member needs the
 * whole input of its group's samples. */
static void drop_member_input(breaks_t *b, int i)
{
	const sp_slice_t *sl = &b->ref.slices[i];
	int d = slot_dev(&b->ref, i, 1), kf = find_compute(&b->ref, d, INS_FWD, i);
	for (int k = 0; k < kf; k++) {
		const sp_ins_t *in = ins_at(&b->ref, d, k);
		if (in->op != INS_RECV || in->dst.grad || in->dst.metaop != sl->metaop ||
		    in->dst.layer != sl->layer_from)
			continue;
		del_ins(break_copy(b), d, k);
		judge(b, "missing input", "device %d instruction %d (fwd)", d, kf - 1);
	}
}

static void test_tp_member_input(void **state)
{
	each_tp_slice(state, "member inputs dropped", drop_member_input);
}

/* Member 1 runs the slice's FWD twice, member 0 once: the second FWD's
 * all-reduces have no partner, a rendezvous deadlock (the group's count of
 * arrivals must not let the repeat pass on the first rendezvous's; it did,
 * and the repeat was then only caught as a value written twice). */
static void fwd_twice(breaks_t *b, int i)
{
	int d = slot_dev(&b->ref, i, 1), kf = find_compute(&b->ref, d, INS_FWD, i);
	if (b->ref.metaops[b->ref.slices[i].metaop].shape.type == COMP_LM_HEAD)
		kf = find_compute(&b->ref, d, INS_LOSS, i); /* a split loss's LOSS */
	assert_true(kf >= 0);
	sp_plan_t *p = break_copy(b);
	ins_ins(p, d, kf + 1, *ins_at(p, d, kf));
	judge(b, "deadlock: the tensor-parallel group of slice", NULL);
}

static void test_tp_fwd_twice(void **state)
{
	each_tp_slice(state, "a member's FWD twice", fwd_twice);
}

/* ---- micro-batches per task ------------------------------------------------ */

/* The plan under --microbatches match=2,caption=4 (classify 1): a step of
 * 4 micro-steps with three sets of active tasks, each verified. */
static void test_mb_valid(void **state)
{
	const vfix_t *f = *state;
	sp_plan_t p;
	copy_mplan(f, &p);
	assert_int_equal(p.microbatches, 4);
	assert_int_equal(plan_task_k(&p, 0), 2);
	assert_int_equal(plan_task_k(&p, 1), 4);
	assert_int_equal(plan_task_k(&p, 2), 1);
	/* sets: micro-steps 0 (all), 1 (match, caption), 2-3 (caption) */
	assert_int_equal(plan_micro_next(&p.model, 4, 0), 1);
	assert_int_equal(plan_micro_next(&p.model, 4, 1), 2);
	assert_int_equal(plan_micro_next(&p.model, 4, 2), 4);
	expect_valid(&p, f->cap);
	plan_release(&p);
}

/* A RECV whose value is another task's than its SEND's: rejected at the
 * RECV (the reader's checks do not see it: a transfer's ends are matched
 * by tag only when the programs run). */
static void recv_other_task(breaks_t *b, int d, int k)
{
	const sp_ins_t *in = ins_at(&b->ref, d, k);
	int t = b->ref.metaops[in->dst.metaop].task, m = 0;
	while (m < b->ref.n_metaops && b->ref.metaops[m].task == t)
		m++;
	assert_true(m < b->ref.n_metaops);
	ins_at(break_copy(b), d, k)->dst.metaop = m;
	judge(b, "transfer between tasks", "device %d instruction %d (recv)", d, k);
}

static void test_mb_cross_task(void **state)
{
	breaks_t b;
	breaks_begin_on(&b, *state, "RECVs into another task's value", 0, 0);
	b.mb = 1;
	plan_release(&b.ref);
	copy_for(&b, &b.ref);
	each_ins(&b, INS_RECV, recv_other_task);
	breaks_end(&b, count_op(&b.ref, INS_RECV));
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
		cmocka_unit_test(test_zero1_valid),
		cmocka_unit_test(test_gather_missing),
		cmocka_unit_test(test_gather_twice),
		cmocka_unit_test(test_gather_before_step),
		cmocka_unit_test(test_gather_stranger),
		cmocka_unit_test(test_zero1_memory),
		cmocka_unit_test(test_defer),
		cmocka_unit_test(test_zero2_valid),
		cmocka_unit_test(test_zero2_overlap),
		cmocka_unit_test(test_zero2_write_after_sync),
		cmocka_unit_test(test_zero3_valid),
		cmocka_unit_test(test_zero3_use_outside_gather),
		cmocka_unit_test(test_zero3_gather_order),
		cmocka_unit_test(test_zero3_gather_dropped),
		cmocka_unit_test(test_zero3_sync_before_gather),
		cmocka_unit_test(test_zero3_memory),
		cmocka_unit_test(test_tp_valid),
		cmocka_unit_test(test_tp_group_spans_nodes),
		cmocka_unit_test(test_tp_one_sharding),
		cmocka_unit_test(test_tp_wrong_shard),
		cmocka_unit_test(test_tp_bucket_elems),
		cmocka_unit_test(test_tp_order),
		cmocka_unit_test(test_tp_member_input),
		cmocka_unit_test(test_tp_fwd_twice),
		cmocka_unit_test(test_mb_valid),
		cmocka_unit_test(test_mb_cross_task),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
