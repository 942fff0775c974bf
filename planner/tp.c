/*
 * tp.c — tensor-parallel degrees after scheduling. tp_check refuses a
 * forced --tp N that some transformer cannot take before planning; the
 * placer asks tp_want for the degree to place a slice for (its scheduled
 * x->tp, chosen by tp_assign in tp_cost.c: auto, or the forced N where the
 * slice allows it); after placement tp_run keeps each degree only where
 * the rules hold, and reprices nothing (the scheduler priced the slice at
 * its degree).
 *
 * Rules (tp-format.txt): a transformer slice whose shape t splits
 * (shape_tp_ok: t divides heads and ffn, not a decoder) and whose width
 * n is a multiple of t
 * keeps tp = t when each of its n / t groups of t consecutive devices
 * (after placement, ascending) lies in one node. ONE SHARDING PER LAYER:
 * when the slices of one component disagree (one got t, another could
 * not: too narrow, or not node-aligned), or a device would hold two
 * different shards of one layer, every slice of that component falls back
 * to tp = 1, until no slice falls (a MetaOp can span components). A slice
 * left at tp = 1 wider than its batch keeps its first `batch` devices.
 */
#include "tp.h"

#include <stdio.h>
#include <string.h>

int tp_check(const plan_opts_t *o, const sp_model_t *m, const sp_cluster_t *c,
	     sp_err_t *err)
{
	int t = o->tp;
	if (t <= 1)
		return 0;
	for (int k = 0; k < m->n_comps; k++) {
		const sp_component_t *cp = &m->comps[k];
		if (cp->type != COMP_TRANSFORMER || cp->cross_attention ||
		    tp_ok(cp->type, cp->heads, cp->ffn, cp->vocab, t))
			continue; /* a decoder stays whole (tp_whole names it) */
		/* name only what t does not divide, located as model_check's errors */
		int bh = cp->heads % t != 0, bf = cp->ffn % t != 0;
		char path[160], what[96];
		snprintf(path, sizeof path, "components.%s%s", cp->name,
			 bh && bf ? "" : bh ? ".heads" : ".ffn");
		if (bh && bf)
			snprintf(what, sizeof what, "the heads (%lld) and ffn (%lld)",
				 (long long)cp->heads, (long long)cp->ffn);
		else
			snprintf(what, sizeof what, "the %s (%lld)", bh ? "heads" : "ffn",
				 (long long)(bh ? cp->heads : cp->ffn));
		sp_err_set(err, SP_EINPUT, o->model_path, 0, 0, path,
			   "--tp %d does not divide %s of transformer '%s'", t, what, cp->name);
		sp_err_hint(err, "use --tp auto, or a degree that divides every "
				 "transformer's heads and ffn");
		return SP_EINPUT;
	}
	for (int i = 0; o->sp > 0 && i < m->n_tasks; i++)
		for (int j = 0; j < m->tasks[i].n_nodes; j++) {
			const sp_node_t *nd = &m->tasks[i].nodes[j];
			sp_opshape_t sh = op_shape(m, &m->tasks[i], nd);
			if (sh.type != COMP_TRANSFORMER || sh.mem_seq > 0 || sh.seq % t == 0)
				continue;
			char path[160];
			snprintf(path, sizeof path, "tasks.%s.graph.%s.seq", m->tasks[i].name,
				 nd->id);
			sp_err_set(err, SP_EINPUT, o->model_path, 0, 0, path,
				   "--sp on with --tp %d: the seq (%lld) of transformer node '%s' "
				   "is not a multiple of %d (sequence shards need equal parts)",
				   t, (long long)sh.seq, nd->id, t);
			sp_err_hint(err, "use --sp auto (it leaves such slices without sequence "
					 "parallelism), or a --tp that divides every transformer's seq");
			return SP_EINPUT;
		}
	if (t > c->gpus_per_node) {
		sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			   "--tp %d is more than the %d GPUs of a node (a tensor-parallel "
			   "group lies in one node)",
			   t, c->gpus_per_node);
		sp_err_hint(err, "use --tp auto, or a degree of at most %d", c->gpus_per_node);
		return SP_EINPUT;
	}
	/* a t <= gpus_per_node that does not divide it stays allowed: the cost
	 * tables (cost.c's tp_degrees) then price the widths at t = 1 only, but
	 * tp_assign splits a class only where every slice can run t and prices
	 * it there (cost_layer_tp), and groups of t fit in a node (tests/runtime/equivalence.py mixes split and whole
	 * slices with --tp 2 on a node of 3) */
	return 0;
}

int tp_want(const planner_t *pl, const sslice_t *x)
{
	int t = x->tp;
	const sp_opshape_t *sh = &pl->mops[x->metaop].shape;
	if (t <= 1 || x->n % t || !pl_tp_ok(pl, sh, t))
		return 1;
	return t;
}

/* Every group of t consecutive devices of slice i lies in one node. */
static int groups_in_nodes(const planner_t *pl, const place_t *pc, int i, int n, int t)
{
	const int32_t *d = pc->devs + pc->off[i];
	for (int k = 0; k < n; k++)
		if (dev_node(pl->cluster, d[k]) != dev_node(pl->cluster, d[k - k % t]))
			return 0;
	return 1;
}

/* The component and parameter id of layer l of MetaOp m. */
static int layer_comp(const planner_t *pl, int m, int l)
{
	const metaop_t *mo = &pl->mops[m];
	return pl->model->tasks[mo->task].nodes[pl->ops[mo->first_op + l].node].comp;
}

/* One round of the agreement rules at the current degrees: agree[c] is the
 * degree of every slice covering component c (-1 none, 0 they disagree or
 * a device would hold two shards of one of its layers); every slice on a
 * disagreeing component falls back to 1. Returns how many slices fell. */
static int tp_round(planner_t *pl, sched_t *s, const place_t *pc, int *agree,
		    const int *base, int np, uint8_t *shard)
{
	int nc = pl->model->n_comps, fell = 0;
	for (int c = 0; c < nc; c++)
		agree[c] = -1;
	for (int i = 0; i < s->n; i++)
		for (int l = s->s[i].lf; l < s->s[i].lt; l++) {
			int c = layer_comp(pl, s->s[i].metaop, l);
			agree[c] = agree[c] < 0 || agree[c] == s->s[i].tp ? s->s[i].tp : 0;
		}
	/* one shard per device and layer: 1 + the member index, 0 not held */
	memset(shard, 0, (size_t)pl->N * (size_t)np);
	for (int i = 0; i < s->n; i++) {
		const sslice_t *x = &s->s[i];
		for (int l = x->lf; l < x->lt; l++) {
			int c = layer_comp(pl, x->metaop, l);
			if (agree[c] <= 1)
				continue;
			int pid = base[c] + pl->ops[pl->mops[x->metaop].first_op + l].layer;
			for (int k = 0; k < x->n; k++) {
				uint8_t *h = &shard[(size_t)pc->devs[pc->off[i] + k] * np + pid];
				if (*h && *h != 1 + k % x->tp)
					agree[c] = 0;
				*h = (uint8_t)(1 + k % x->tp);
			}
		}
	}
	for (int i = 0; i < s->n; i++)
		for (int l = s->s[i].lf; l < s->s[i].lt && s->s[i].tp > 1; l++)
			if (agree[layer_comp(pl, s->s[i].metaop, l)] == 0) {
				s->s[i].tp = 1;
				fell++;
			}
	return fell;
}

int tp_run(planner_t *pl, sched_t *s, place_t *pc)
{
	const sp_model_t *md = pl->model;
	for (int i = 0; i < s->n; i++) {
		sslice_t *x = &s->s[i];
		int t = tp_want(pl, x);
		x->tp = t > 1 && groups_in_nodes(pl, pc, i, x->n, t) ? t : 1;
	}
	int nc = md->n_comps, np = 0;
	int *agree = sp_arena_calloc(&pl->scratch, (size_t)nc + 1, sizeof(int));
	int *base = sp_arena_calloc(&pl->scratch, (size_t)nc + 1, sizeof(int));
	if (!agree || !base)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	for (int c = 0; c < nc; c++) {
		base[c] = np;
		np += md->comps[c].type == COMP_TRANSFORMER ? (int)md->comps[c].layers : 1;
	}
	uint8_t *shard = sp_arena_calloc(&pl->scratch, (size_t)pl->N * (size_t)np + 1, 1);
	if (!shard)
		return sp_err_set(pl->err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	/* a MetaOp may span two components: a fall for one can break the
	 * other's agreement, so repeat to a fixpoint (degrees only fall, so at
	 * most s->n rounds change anything) */
	while (tp_round(pl, s, pc, agree, base, np, shard))
		;
	/* --sp on: a degree auto chose must split the sequence too */
	for (int i = 0; pl->opts->sp > 0 && i < s->n; i++) {
		const metaop_t *m = &pl->mops[s->s[i].metaop];
		int t = s->s[i].tp;
		if (t <= 1 || m->shape.type != COMP_TRANSFORMER || sp_ok(&m->shape, t))
			continue;
		sp_err_set(pl->err, SP_EINPUT, pl->opts->model_path, 0, 0, NULL,
			   "--sp on: metaop '%s' is split %d ways, but its seq (%lld) is not a "
			   "multiple of %d (sequence shards need equal parts)",
			   m->name, t, (long long)m->shape.seq, t);
		sp_err_hint(pl->err, "use --sp auto (it leaves such slices without sequence "
				     "parallelism), or a --tp that divides every transformer's seq");
		return SP_EINPUT;
	}
	/* a slice that fell to 1 may be wider than its batch (n = d t with
	 * d <= B): its extra devices would get empty ranges yet hold whole
	 * layers; it keeps its first B devices (as tp_assign narrows a
	 * schedule's). The model holds the micro-batch, so B is per micro-step.
	 * The placement stays packed (lower.c: slice i's devices at off[i],
	 * the next slice's right after). */
	for (int i = 0, o = 0; i < s->n; i++) {
		sslice_t *x = &s->s[i];
		int64_t B = pl->mops[x->metaop].batch;
		if (x->tp == 1 && x->n > B)
			x->n = (int)B;
		memmove(pc->devs + o, pc->devs + pc->off[i], sizeof(int32_t) * (size_t)x->n);
		pc->off[i] = o;
		o += x->n;
	}
	return 0;
}

int sp_want(const planner_t *pl, const sslice_t *x, int t)
{
	const metaop_t *m = &pl->mops[x->metaop];
	if (pl->opts->sp == 0 || t <= 1 || x->n % t || !sp_ok(&m->shape, t))
		return 0;
	if (pl->opts->sp > 0)
		return 1;
	int64_t d = x->n / t, local = (m->batch + d - 1) / d;
	double f0, b0, f1, b1;
	cost_layer_sp(pl, x->metaop, local, t, 0, &f0, &b0);
	cost_layer_sp(pl, x->metaop, local, t, 1, &f1, &b1);
	return f1 + b1 <= f0 + b0;
}
