/*
 * test_pack.c — the lanes-packed candidate (sched_pack). sched_pack is
 * wrapped (-Wl,--wrap) and every schedule it returns over whole planning
 * runs (clip-4 on 16 A800s, clip-10 on 32) is checked:
 *  - each lane's heaviest MetaOp runs at two device counts at most (a
 *    plan is lo devices and hi during its hi phase);
 *  - no device runs two slices at once, and every slice's devices are
 *    its width, distinct;
 *  - its makespan is at least the fluid lanes' horizon (lanes_horizon:
 *    the lanes' least device-time at every horizon is what the fluid
 *    spreads, so no packing of whole layers ends sooner);
 *  - no slice of a lane's MetaOp (but a sink) runs across its layer 1
 *    or 3 (head_cut: its first layers in slices of 1 and 2 layers, so
 *    their gradients sync in small buckets at the backward's end);
 *  - at least one schedule comes back per run (the candidate is not dead),
 *    and the ascending one (lanes-packed-asc) differs from the other on
 *    clip-10 at 32 (its flag is read);
 *  - on clip-4 at 32 the reordering one (lanes-packed-reorder: a greedy
 *    placement that fails tried again with the failing lane first) comes
 *    back and ends sooner than the plain one (its greedy fails where the
 *    plain bisection stopped);
 *  - in lanes-packed-tails (SCHED_PACK_HANDOVER) every change of a
 *    lane's width keeps at least half the samples the best slot order
 *    keeps on the devices that stay, and waits for its hand-over's
 *    transfers (hand_over_check);
 *  - lanes-packed-tails (SCHED_PACK_TAILS) comes back, and its latest
 *    device end plus optimizer step (each device's last slice end plus
 *    the step of every (component, layer) its slices hold, recomputed
 *    here from the slices) is earlier than the plain one's on clip-10
 *    at 32 (where its devices and horizon differ; on clip-4 at 32 its
 *    slices wait for hand-overs the plain one's do not, so the two are
 *    not compared there).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "planner.h"
#include "plan_bundled.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPINDLE_ROOT
#define SPINDLE_ROOT "."
#endif

static long n_sched, n_bad, n_asc;
static uint64_t fp[8];   /* per flags: the last schedule's fingerprint */
static double span[8];   /* per flags: the last schedule's makespan */
static double tail[8];   /* per flags: the last schedule's end plus step */
static long n_reorder, n_tails, n_hand;

int __real_sched_pack(planner_t *pl, const int *w, int flags, sched_t *out);
int __wrap_sched_pack(planner_t *pl, const int *w, int flags, sched_t *out);

static void bad(const char *what, const char *name)
{
	print_message("sched_pack: %s (%s)\n", what, name);
	n_bad++;
}

/* Where a MetaOp goes from x's width to y's, wider, on devices that
 * include x's (a lane's hand-over, its layers next to each other), the
 * samples x's devices keep (sample_range: slot q of n holds [q B / n,
 * (q + 1) B / n)) are at least half of the x.n floor(B / y.n) that the
 * best slot order keeps (each device keeps at most its share of y); and
 * the later of the two starts no sooner than the earlier ends plus the
 * hand-over's transfers: the ceil(B / hi) samples of the output of its
 * lane's heaviest MetaOp that a slot of the wider one holds, forward and
 * back, across nodes where hi is more than a node's GPUs (cost_xfer_ms,
 * hi = y.n). */
static void hand_over_check(const planner_t *pl, const lanes_t *L, const sched_t *s,
			    const sslice_t *x, const sslice_t *y)
{
	if (x->metaop != y->metaop || x->n >= y->n || (x->lt != y->lf && y->lt != x->lf) ||
	    x->dev_off < 0 || y->dev_off < 0)
		return;
	int64_t B = pl->mops[x->metaop].batch, kept = 0;
	for (int c = 0; c < x->n; c++) {
		int r = 0;
		while (r < y->n && s->devs[y->dev_off + r] != s->devs[x->dev_off + c])
			r++;
		if (r == y->n)
			return; /* not a hand-over: x's devices are not all y's */
		int32_t a0, a1, b0, b1;
		sample_range(B, c, x->n, &a0, &a1);
		sample_range(B, r, y->n, &b0, &b1);
		kept += a1 < b1 ? (a1 > b0 ? a1 - (a0 > b0 ? a0 : b0) : 0)
				: (b1 > a0 ? b1 - (a0 > b0 ? a0 : b0) : 0);
	}
	n_hand++;
	int heavy = x->metaop; /* the heaviest MetaOp of x's lane */
	for (int j = 0; j < L->nl; j++)
		for (int i = L->ln[j].first; i < L->ln[j].first + L->ln[j].n; i++)
			heavy = L->lm[i] == x->metaop ? L->ln[j].heavy : heavy;
	const metaop_t *mo = &pl->mops[heavy];
	int G = pl->cluster->gpus_per_node;
	int64_t bytes = (B + y->n - 1) / y->n * mo->seq_out * mo->width_out *
			dtype_bytes(pl->model->dtype);
	double gap = (x->t0 < y->t0 ? y->t0 - x->t1 : x->t0 - y->t1);
	double want = 2 * cost_xfer_ms(pl->cluster, 0, y->n > G ? G : 1, bytes);
	if (gap < want * (1 - 1e-9) - 1e-9) {
		print_message("hand-over %d -> %d devices: %.4f ms between, its transfers %.4f\n",
			      x->n, y->n, gap, want);
		bad("a change of width sooner than its hand-over", pl->mops[x->metaop].name);
	}
	if (2 * kept < (int64_t)x->n * (B / y->n)) {
		print_message("hand-over %d -> %d devices, batch %lld: %lld samples kept\n", x->n,
			      y->n, (long long)B, (long long)kept);
		bad("a hand-over that keeps less than half the samples it can", pl->mops[x->metaop].name);
	}
}

static void check(planner_t *pl, const int *w, const sched_t *s, int handover)
{
	lanes_t L = {0};
	sp_arena_mark_t mark = sp_arena_mark(&pl->scratch);
	if (lanes_build(pl, w, &L)) {
		bad("lanes_build failed", "");
		return;
	}
	for (int j = 0; j < L.nl; j++) {
		int m = L.ln[j].heavy, a = 0, b = 0;
		for (int i = 0; i < s->n; i++) {
			if (s->s[i].metaop != m)
				continue;
			int n = s->s[i].n;
			if (!a || a == n)
				a = n;
			else if (!b || b == n)
				b = n;
			else
				bad("a lane's heaviest MetaOp at three widths", pl->mops[m].name);
		}
	}
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		if (L.in_lane[x->metaop] && !pl->mops[x->metaop].sink &&
		    ((x->lf < 1 && x->lt > 1) || (x->lf < 3 && x->lt > 3)))
			bad("a lane's slice across its layer 1 or 3", pl->mops[x->metaop].name);
		if (x->dev_off < 0) {
			bad("a slice without devices", pl->mops[x->metaop].name);
			continue;
		}
		for (int q = 0; q < x->n; q++)
			for (int r = q + 1; r < x->n; r++)
				if (s->devs[x->dev_off + q] == s->devs[x->dev_off + r])
					bad("a device twice in one slice", pl->mops[x->metaop].name);
		for (int k = i + 1; k < s->n; k++) {
			const sslice_t *y = &s->s[k];
			if (y->t0 >= x->t1 - 1e-6 || x->t0 >= y->t1 - 1e-6 || y->dev_off < 0)
				continue;
			for (int q = 0; q < x->n; q++)
				for (int r = 0; r < y->n; r++)
					if (s->devs[x->dev_off + q] == s->devs[y->dev_off + r])
						bad("a device in two slices at once",
						    pl->mops[x->metaop].name);
		}
	}
	for (int i = 0; i < s->n && handover; i++)
		for (int k = 0; k < s->n; k++)
			hand_over_check(pl, &L, s, &s->s[i], &s->s[k]);
	double fluid = lanes_horizon(&L, pl->N);
	if (sched_makespan(s) < fluid * (1 - 1e-9))
		bad("makespan below the fluid horizon", "");
	sp_arena_reset(&pl->scratch, mark);
}

/* The latest a device of s ends with its optimizer step: its last slice's
 * end plus the step of every (component, layer) its slices hold. */
static double end_plus_step(const planner_t *pl, const sched_t *s)
{
	int nc = pl->model->n_comps, most = 1;
	for (int c = 0; c < nc; c++)
		most = (int)(pl->model->comps[c].layers > most ? pl->model->comps[c].layers : most);
	size_t n = (size_t)pl->N * (size_t)nc * (size_t)most;
	unsigned char *held = calloc(n + 1, 1);
	double *end = calloc((size_t)pl->N + 1, sizeof(double));
	double *step = calloc((size_t)pl->N + 1, sizeof(double)), worst = 0;
	assert_non_null(held);
	assert_non_null(end);
	assert_non_null(step);
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		const metaop_t *mo = &pl->mops[x->metaop];
		for (int q = 0; q < x->n && x->dev_off >= 0; q++) {
			int d = s->devs[x->dev_off + q];
			end[d] = fmax(end[d], x->t1);
			for (int l = x->lf; l < x->lt; l++) {
				const sp_op_t *op = &pl->ops[mo->first_op + l];
				int c = pl->model->tasks[mo->task].nodes[op->node].comp;
				size_t k = ((size_t)d * (size_t)nc + (size_t)c) * (size_t)most +
					   (size_t)op->layer;
				if (!held[k])
					step[d] += cost_step_ms(pl, comp_layer_params(&pl->model->comps[c]));
				held[k] = 1;
			}
		}
	}
	for (int d = 0; d < pl->N; d++)
		worst = fmax(worst, end[d] + step[d]);
	free(held);
	free(end);
	free(step);
	return worst;
}

int __wrap_sched_pack(planner_t *pl, const int *w, int flags, sched_t *out)
{
	int rc = __real_sched_pack(pl, w, flags, out);
	if (!rc) {
		n_sched++;
		n_asc += (flags & SCHED_PACK_ASC) != 0;
		n_reorder += (flags & SCHED_PACK_REORDER) != 0;
		n_tails += (flags & SCHED_PACK_TAILS) != 0;
		span[flags & 7] = sched_makespan(out);
		tail[flags & 7] = end_plus_step(pl, out);
		check(pl, w, out, (flags & SCHED_PACK_HANDOVER) != 0);
		uint64_t h = 1469598103934665603ull;
		for (int i = 0; i < out->n; i++) {
			const sslice_t *x = &out->s[i];
			h = (h ^ (uint64_t)(x->metaop * 131 + x->lf * 7 + x->n)) * 1099511628211ull;
			h = (h ^ (uint64_t)llround(x->t0 * 1e3)) * 1099511628211ull;
		}
		fp[flags & 7] = h;
	}
	return rc;
}

static void plan_one(const char *model, const char *cluster)
{
	n_sched = n_bad = n_asc = n_reorder = n_tails = n_hand = 0;
	memset(fp, 0, sizeof fp);
	memset(span, 0, sizeof span);
	memset(tail, 0, sizeof tail);
	plan_bundled(model, cluster);
	print_message("%s on %s: %ld packed schedules, %ld hand-overs, %ld faults\n", model,
		      cluster, n_sched, n_hand, n_bad);
	assert_true(n_sched > 0);
	assert_int_equal(n_bad, 0);
}

static void test_clip4_16(void **state)
{
	(void)state;
	plan_one("clip-4", "a800-2x8");
}

static void test_clip10_32(void **state)
{
	(void)state;
	plan_one("clip-10", "a800-4x8");
	assert_true(n_asc > 0 && n_asc < n_sched);
	assert_true(fp[0] != fp[1]);
	print_message("end plus step: plain %.3f ms, tails %.3f ms\n", tail[0],
		      tail[SCHED_PACK_TAILS]);
	assert_true(n_tails > 0);
	assert_true(tail[0] > 0 && tail[SCHED_PACK_TAILS] < tail[0] * (1 - 1e-6));
}

static void test_clip4_32(void **state)
{
	(void)state;
	plan_one("clip-4", "a800-4x8");
	print_message("makespan: plain %.3f ms, reorder %.3f ms\n", span[0],
		      span[SCHED_PACK_REORDER]);
	assert_true(n_reorder > 0);
	assert_true(span[0] > 0 && span[SCHED_PACK_REORDER] < span[0] * (1 - 1e-6));
	assert_true(n_tails > 0);
	assert_true(n_hand > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clip4_16),
		cmocka_unit_test(test_clip10_32),
		cmocka_unit_test(test_clip4_32),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
