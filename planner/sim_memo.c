/*
 * sim_memo.c — ours' walk simulates a lowered plan once per planning run.
 * Different candidates can lower to the same plan (lanes and lanes with
 * an end game that takes no step, the memory fallbacks of the MILP list
 * schedule when their segments fit anyway, the eager backward where no
 * slice moves), and so can the same candidate on another table set (its
 * schedule reads the set's tables, the plan may not differ). plan.c's
 * held_simulate asks here first: a plan recorded with its result takes
 * that result instead of a simulation.
 *
 * Exact: plan_simulated reads only the plan and the run's constants (the
 * cluster, the model, the options, the cost memo, which returns the bits
 * its caller would compute; cost_layer_sp prices a slice by its own
 * degree, the same on every table set), so a plan equal in every array
 * it reads simulates to the same bits. The key is the plan's arrays, byte
 * for byte (padding included: two equal plans that differ there are only
 * simulated twice), compared in full, never by hash alone; the hash only
 * finds the entry. The plan a memo'd result leaves (its layouts tried,
 * its times recorded) is not kept: plan.c simulates the walk's choice
 * again when it came from here.
 *
 * Memory: each entry holds a copy of its plan's arrays (malloc: written
 * once, never zeroed), at most SIM_MEMO_BYTES in all per run (past it,
 * plans are simulated and not recorded); the entries in pl->arena,
 * sim_memo_release frees the copies.
 *
 * Each pass of the simulator with sync (sim_pass_*, sim.c's run: the full
 * pass, by mode, recording and micro-step; the compute and transfer
 * passes are cheap and seldom repeated) is recorded the same way, one
 * level down: the same pass of the same plan
 * state (every array above, the layouts and the times the last pass left
 * included) run again, as when a rejected trial is tried again on the same
 * plan or plan.c simulates the walk's memo'd choice again, takes the
 * recorded iteration and busy time and the times the pass wrote into the
 * plan (its slices, devices and waves) instead of a run. Exact for the
 * reason above: a pass reads only those arrays and the run's constants.
 * Only the planner that made the memo uses it: a worker thread's copy of
 * the planner (jobs.c) sees its pointer but not as its own, and makes
 * none (see memo_of).
 */
#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_MEMO_BYTES ((size_t)64 << 20)

/* The arrays of a lowered plan that the simulator and the layout trials
 * read, after their counts (the model is the run's, copied into every
 * plan); SEG_INS and those before SEG_WAVES are left out of the hash. */
enum { SEG_WAVES = 4, SEG_INS = 11, SEG__COUNT = 13 };

typedef struct {
	const void *p;
	size_t n;
} seg_t;

typedef struct {
	int32_t n[13];
} counts_t;

static void plan_segs(const sp_plan_t *p, counts_t *c, seg_t s[SEG__COUNT])
{
	*c = (counts_t){{p->microbatches, p->n_metaops, p->n_ops, p->n_edges, p->n_waves,
			 p->n_slices, p->n_slice_devs, p->n_buckets, p->n_bucket_devs,
			 p->n_bucket_params, p->n_devices, p->n_ins, p->n_held}};
	int i = 0;
	s[i++] = (seg_t){c, sizeof *c};
	s[i++] = (seg_t){p->metaops, sizeof *p->metaops * (size_t)p->n_metaops};
	s[i++] = (seg_t){p->ops, sizeof *p->ops * (size_t)p->n_ops};
	s[i++] = (seg_t){p->edges, sizeof *p->edges * (size_t)p->n_edges};
	s[i++] = (seg_t){p->waves, sizeof *p->waves * (size_t)p->n_waves};
	s[i++] = (seg_t){p->slices, sizeof *p->slices * (size_t)p->n_slices};
	s[i++] = (seg_t){p->slice_devs, sizeof *p->slice_devs * (size_t)p->n_slice_devs};
	s[i++] = (seg_t){p->buckets, sizeof *p->buckets * (size_t)p->n_buckets};
	s[i++] = (seg_t){p->bucket_devs, sizeof *p->bucket_devs * (size_t)p->n_bucket_devs};
	s[i++] = (seg_t){p->bucket_params, sizeof *p->bucket_params * (size_t)p->n_bucket_params};
	s[i++] = (seg_t){p->devices, sizeof *p->devices * (size_t)p->n_devices};
	s[i++] = (seg_t){p->ins, sizeof *p->ins * (size_t)p->n_ins};
	s[i++] = (seg_t){p->held, sizeof *p->held * (size_t)p->n_held};
}

/* FNV-1a over the bytes, 8 at a time (the tail byte by byte). */
static uint64_t hash_bytes(uint64_t h, const void *data, size_t n)
{
	const unsigned char *b = data;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, b + i, sizeof w);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	for (; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

typedef struct {
	uint64_t hash;
	size_t len;
	unsigned char *blob; /* the plan's segments, one after another */
	sim_result_t r;
	double f;
} memo_entry_t;

/* A pass: the key's segments, then the slices, devices and waves it
 * left. */
typedef struct {
	uint64_t hash;
	size_t len;
	unsigned char *blob;
	int32_t tag[3];
	double iteration, busy_total;
} pass_entry_t;

struct sim_memo {
	const planner_t *owner; /* the planner whose memo it is */
	memo_entry_t *e;
	int n, cap;
	pass_entry_t *pe;
	int n_pass, cap_pass;
	long pass_hits, pass_runs; /* SPINDLE_PASS_MEMO_STATS */
	size_t bytes;
};

/* The hash reads the counts and the small arrays that differ between
 * plans (the programs are the bulk of a plan; plans that differ there
 * almost always differ in these too); the MetaOps and operators are the
 * run's. */
static uint64_t plan_hash(const seg_t s[SEG__COUNT])
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (int i = 0; i < SEG__COUNT; i++)
		if (i == 0 || (i >= SEG_WAVES && i != SEG_INS))
			h = hash_bytes(h, s[i].p, s[i].n);
	return h;
}

static int blob_equal(const unsigned char *b, size_t len, const seg_t s[SEG__COUNT])
{
	size_t off = 0;
	for (int i = 0; i < SEG__COUNT; i++) {
		if (off + s[i].n > len || (s[i].n && memcmp(b + off, s[i].p, s[i].n)))
			return 0;
		off += s[i].n;
	}
	return off == len;
}

int sim_memo_find(planner_t *pl, const sp_plan_t *p, sim_memo_key_t *key, sim_result_t *r,
		  double *f)
{
	counts_t c;
	seg_t s[SEG__COUNT];
	struct sim_memo *m = pl->sim_memo;
	plan_segs(p, &c, s);
	memset(key, 0, sizeof *key);
	key->hash = plan_hash(s);
	for (int i = 0; i < SEG__COUNT; i++)
		key->len += s[i].n;
	for (int i = 0; m && i < m->n; i++)
		if (m->e[i].hash == key->hash && m->e[i].len == key->len &&
		    blob_equal(m->e[i].blob, m->e[i].len, s)) {
			*r = m->e[i].r;
			*f = m->e[i].f;
			return 1;
		}
	/* not seen: its bytes, for sim_memo_add once it is simulated */
	if (!m && !(m = pl->sim_memo = sp_arena_calloc(&pl->arena, 1, sizeof *m)))
		return SP_ENOMEM;
	m->owner = m->owner ? m->owner : pl;
	if (m->bytes + key->len > SIM_MEMO_BYTES)
		return 0;
	if (!(key->blob = malloc(key->len + 1)))
		return SP_ENOMEM;
	size_t off = 0;
	for (int i = 0; i < SEG__COUNT; i++) {
		if (s[i].n)
			memcpy(key->blob + off, s[i].p, s[i].n);
		off += s[i].n;
	}
	m->bytes += key->len;
	return 0;
}

int sim_memo_add(planner_t *pl, sim_memo_key_t *key, const sim_result_t *r, double f)
{
	struct sim_memo *m = pl->sim_memo;
	int rc = 0;
	if (!key->blob)
		return 0; /* no room: not recorded */
	if (r && m->n == m->cap)
		rc = sp_arena_grow(&pl->arena, (void **)&m->e, &m->cap, m->n + 1, sizeof *m->e);
	if (!r || rc) {
		m->bytes -= key->len;
		free(key->blob);
		key->blob = NULL;
		return rc;
	}
	m->e[m->n++] = (memo_entry_t){key->hash, key->len, key->blob, *r, f};
	key->blob = NULL;
	return 0;
}

void sim_memo_release(planner_t *pl)
{
	struct sim_memo *m = pl->sim_memo;
	if (m && getenv("SPINDLE_PASS_MEMO_STATS")) /* a diagnostic for tests */
		fprintf(stderr, "pass memo: %ld of %ld passes with sync taken from it\n",
			m->pass_hits, m->pass_hits + m->pass_runs);
	for (int i = 0; m && i < m->n; i++)
		free(m->e[i].blob);
	for (int i = 0; m && i < m->n_pass; i++)
		free(m->pe[i].blob);
	pl->sim_memo = NULL; /* the entries were in pl->arena */
}

int sim_memo_same(const sp_plan_t *a, const sp_plan_t *b)
{
	counts_t ca, cb;
	seg_t sa[SEG__COUNT], sb[SEG__COUNT];
	plan_segs(a, &ca, sa);
	plan_segs(b, &cb, sb);
	for (int i = 0; i < SEG__COUNT; i++)
		if (sa[i].n != sb[i].n || (sa[i].n && memcmp(sa[i].p, sb[i].p, sa[i].n)))
			return 0;
	return 1;
}

/* ---- one pass of the simulator (sim.c run) ----------------------------------- */

/* pl's own memo, made on first use (NULL: none for pl). A worker thread's
 * planner is a copy of the walk's (jobs.c): it finds the walk's memo, not
 * its own, and while the walk's planner has no workers (pl->jobs NULL
 * under --jobs 2+) nothing tells a copy from the walk's own, so no memo is
 * made then. */
static struct sim_memo *memo_of(planner_t *pl, int *rc)
{
	struct sim_memo *m = pl->sim_memo;
	*rc = 0;
	if (m)
		return m->owner == pl ? m : NULL;
	if (pl->opts->jobs > 1 && !pl->jobs)
		return NULL;
	if (!(m = pl->sim_memo = sp_arena_calloc(&pl->arena, 1, sizeof *m))) {
		*rc = SP_ENOMEM;
		return NULL;
	}
	m->owner = pl;
	return m;
}

/* The outputs of a full pass: what record_times writes. */
static void pass_outs(const sp_plan_t *p, seg_t o[3])
{
	o[0] = (seg_t){p->slices, sizeof *p->slices * (size_t)p->n_slices};
	o[1] = (seg_t){p->devices, sizeof *p->devices * (size_t)p->n_devices};
	o[2] = (seg_t){p->waves, sizeof *p->waves * (size_t)p->n_waves};
}

int sim_pass_find(planner_t *pl, sp_plan_t *p, const int32_t tag[3], sim_memo_key_t *key,
		  double out[2])
{
	counts_t c;
	seg_t s[SEG__COUNT], o[3];
	int rc;
	struct sim_memo *m = memo_of(pl, &rc);
	memset(key, 0, sizeof *key);
	if (!m)
		return rc;
	plan_segs(p, &c, s);
	pass_outs(p, o);
	key->hash = plan_hash(s);
	for (int i = 0; i < SEG__COUNT; i++)
		key->len += s[i].n;
	for (int i = 0; i < m->n_pass; i++) {
		const pass_entry_t *e = &m->pe[i];
		if (e->hash != key->hash || memcmp(e->tag, tag, sizeof e->tag) ||
		    e->len != key->len + o[0].n + o[1].n + o[2].n || !blob_equal(e->blob, key->len, s))
			continue;
		const unsigned char *b = e->blob + key->len;
		for (int k = 0; k < 3; k++) { /* the times the pass wrote */
			if (o[k].n)
				memcpy((void *)o[k].p, b, o[k].n);
			b += o[k].n;
		}
		out[0] = e->iteration;
		out[1] = e->busy_total;
		key->len = 0;
		m->pass_hits++;
		return 1;
	}
	size_t all = key->len + o[0].n + o[1].n + o[2].n;
	m->pass_runs++;
	if (m->bytes + all > SIM_MEMO_BYTES)
		return 0;
	if (!(key->blob = malloc(all + sizeof key->tag + 1)))
		return SP_ENOMEM;
	memcpy(key->tag, tag, sizeof key->tag);
	size_t off = 0;
	for (int i = 0; i < SEG__COUNT; i++) {
		if (s[i].n)
			memcpy(key->blob + off, s[i].p, s[i].n);
		off += s[i].n;
	}
	m->bytes += all;
	return 0;
}

int sim_pass_add(planner_t *pl, sim_memo_key_t *key, const sp_plan_t *p, const double *out)
{
	struct sim_memo *m = pl->sim_memo;
	seg_t o[3];
	int rc = 0;
	if (!key->blob)
		return 0; /* no room, or not pl's memo: not recorded */
	pass_outs(p, o);
	size_t all = key->len + o[0].n + o[1].n + o[2].n;
	if (out && m->n_pass == m->cap_pass)
		rc = sp_arena_grow(&pl->arena, (void **)&m->pe, &m->cap_pass, m->n_pass + 1,
				   sizeof *m->pe);
	if (!out || rc) {
		m->bytes -= all;
		free(key->blob);
		key->blob = NULL;
		return rc;
	}
	unsigned char *b = key->blob + key->len;
	for (int k = 0; k < 3; k++) {
		if (o[k].n)
			memcpy(b, o[k].p, o[k].n);
		b += o[k].n;
	}
	pass_entry_t *e = &m->pe[m->n_pass++];
	*e = (pass_entry_t){key->hash, all, key->blob, {0}, out[0], out[1]};
	memcpy(e->tag, key->tag, sizeof e->tag);
	key->blob = NULL;
	return 0;
}
