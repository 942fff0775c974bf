/*
 * dataset.c — reads a "spindle.dataset/1" directory (schemas/DATASET-FORMAT.md)
 * for one rank of a plan and hands out the samples of each step. It checks
 * everything before step 1 and keeps what the rank needs in memory; it
 * does not train, make datasets or decide where samples go in a batch
 * (the plan's s0/s1 do).
 *
 * Order. Task i with N samples and batch B runs N / B steps per epoch (the
 * last N mod B samples of an epoch's permutation are left out); step t
 * (1-based) is epoch e = (t - 1) / (N / B), and batch position s of it is
 * sample perm(seed, task name, e)[((t - 1) mod (N / B)) * B + s], perm a
 * Fisher-Yates shuffle. The order depends on the seed, the task's name and
 * N only, so every plan and rank count sees the same samples in a step,
 * and a resumed run (same seed, later steps) continues the same order.
 *
 * Reading. Each rank reads the rows its program touches in the steps of
 * this run, all of them once at start-up, not with a reader thread ahead of
 * each step: the datasets this runtime trains on (CPU-sized models, tens of
 * thousands of samples; the digits set is ~1 MB) fit in memory many times
 * over, the shuffle scatters a step's rows over the shards so a prefetcher
 * would issue the same small reads anyway, and a read at start-up can fail
 * with exit status 2 before step 1 instead of mid-run. Batch positions a
 * rank's program never reads (its s0/s1 ranges of FWDs of source nodes and
 * LOSSes) are never read. Content checks (token ids, lengths, labels,
 * finite features) cover the touched rows plus the rank's share of every
 * tensor (rows [rank N / R, (rank + 1) N / R)), so that the ranks together
 * check every row of the dataset and each row is read about once more.
 */
#include "runtime.h"
#include "safetensors.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { COL_TOKENS, COL_FEATURES, COL_LABELS };
static const char *const COL_SUFFIX[] = {"tokens", "features", "labels"};

/* One tensor of a task: a source node's inputs or a classifier's labels. */
typedef struct {
	int node, kind;
	int64_t seq, width; /* a row is seq * width elements (labels: 1 x 1) */
	uint8_t *pos_used;  /* [batch]: positions this rank's program reads */
	int32_t *slot;      /* [N]: sample -> kept row, or -1 */
	int64_t n_kept;
	void *rows;   /* [n_kept, seq * width] int32 or float, padding zeroed */
	int32_t *len; /* [n_kept] valid positions (labels: 1) */
} ds_col_t;

typedef struct {
	char *path;
	int64_t base, n; /* the task's samples [base, base + n) */
} ds_shard_t;

typedef struct {
	int64_t n, spe; /* samples; steps per epoch */
	int n_shards;
	ds_shard_t *shards;
	int n_cols;
	ds_col_t *cols;
	int32_t *order; /* [(last - first + 1) * batch]: sample of (step, position) */
} ds_task_t;

struct rt_dataset {
	const sp_model_t *m;
	int64_t first, last;
	ds_task_t *tasks; /* per model task */
};

/* ---- index.json ---- */

/* "dir/name" on the heap. */
static char *join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *s = malloc(n);
	if (s)
		snprintf(s, n, "%s/%s", dir, name);
	return s;
}

/* A positive integer member, or an error naming the index and the path. */
static int get_count(json_t *o, const char *key, const char *index, const char *where,
		     int64_t *out, sp_err_t *err)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    json_integer_value(v) > INT32_MAX)
		return sp_err_set(err, SP_EINPUT, index, 0, 0, where,
				  "'%s' must be an integer in [1, 2^31)", key);
	*out = (int64_t)json_integer_value(v);
	return 0;
}

/* Task ti's entry of the index: its sample count and shards. */
static int read_task(ds_task_t *dt, json_t *tasks, const sp_task_t *t, const char *dir,
		     const char *index, sp_err_t *err)
{
	char where[SP_NAME_MAX + 16];
	snprintf(where, sizeof where, "tasks.%s", t->name);
	json_t *e = json_object_get(tasks, t->name);
	if (!json_is_object(e)) {
		sp_err_set(err, SP_EINPUT, index, 0, 0, NULL, "task '%s' is missing", t->name);
		sp_err_hint(err, "a dataset holds every task of the plan's model, by name");
		return SP_EINPUT;
	}
	if (get_count(e, "samples", index, where, &dt->n, err))
		return SP_EINPUT;
	if (dt->n < t->batch)
		return sp_err_set(err, SP_EINPUT, index, 0, 0, where,
				  "task '%s' has %lld samples, fewer than one batch (%lld)",
				  t->name, (long long)dt->n, (long long)t->batch);
	json_t *sh = json_object_get(e, "shards");
	if (!json_is_array(sh) || json_array_size(sh) == 0)
		return sp_err_set(err, SP_EINPUT, index, 0, 0, where,
				  "'shards' must be a non-empty array");
	dt->shards = calloc(json_array_size(sh), sizeof *dt->shards);
	if (!dt->shards)
		return SP_ENOMEM;
	int64_t base = 0;
	size_t i;
	json_t *s;
	json_array_foreach(sh, i, s) {
		ds_shard_t *d = &dt->shards[dt->n_shards];
		const char *file = json_string_value(json_object_get(s, "file"));
		char at[sizeof where + 32];
		snprintf(at, sizeof at, "%s.shards[%zu]", where, i);
		if (!file || !*file || file[0] == '/' || strstr(file, ".."))
			return sp_err_set(err, SP_EINPUT, index, 0, 0, at,
					  "'file' must be a path inside the dataset directory");
		if (get_count(s, "samples", index, at, &d->n, err))
			return SP_EINPUT;
		if (!(d->path = join(dir, file)))
			return SP_ENOMEM;
		d->base = base;
		base += d->n;
		dt->n_shards++;
	}
	if (base != dt->n)
		return sp_err_set(err, SP_EINPUT, index, 0, 0, where,
				  "the shards hold %lld samples, 'samples' says %lld",
				  (long long)base, (long long)dt->n);
	return 0;
}

/* The tensors task t needs: one per source node, one per classifier. */
static int plan_columns(ds_task_t *dt, const sp_model_t *m, const sp_task_t *t)
{
	dt->cols = calloc((size_t)t->n_nodes + 1, sizeof *dt->cols);
	if (!dt->cols)
		return SP_ENOMEM;
	for (int k = 0; k < t->n_nodes; k++) {
		const sp_component_t *c = &m->comps[t->nodes[k].comp];
		ds_col_t col = {.node = k, .seq = t->nodes[k].seq, .width = 1};
		if (c->type == COMP_EMBEDDING)
			col.kind = COL_TOKENS;
		else if (c->type == COMP_PATCH)
			col = (ds_col_t){.node = k, .kind = COL_FEATURES, .seq = t->nodes[k].seq,
					 .width = c->in};
		else if (c->type == COMP_CLASSIFIER)
			col = (ds_col_t){.node = k, .kind = COL_LABELS, .seq = 1, .width = 1};
		else
			continue;
		col.pos_used = calloc((size_t)t->batch, 1);
		col.slot = malloc(sizeof(int32_t) * (size_t)dt->n);
		if (!col.pos_used || !col.slot) {
			free(col.pos_used);
			free(col.slot);
			return SP_ENOMEM;
		}
		dt->cols[dt->n_cols++] = col;
	}
	return 0;
}

static ds_col_t *col_of(const ds_task_t *dt, int node)
{
	for (int i = 0; i < dt->n_cols; i++)
		if (dt->cols[i].node == node)
			return &dt->cols[i];
	return NULL;
}

/* ---- what the rank's program reads ---- */

static void mark(ds_col_t *c, int32_t s0, int32_t s1)
{
	for (int32_t s = s0; c && s < s1; s++)
		c->pos_used[s] = 1;
}

/* Source FWDs read their node's inputs; an LM LOSS reads the tokens of its
 * task's embedding nodes (next-token targets); a classifier its labels. */
static void mark_program(rt_dataset_t *d, const sp_plan_t *p, int rank)
{
	const sp_device_t *dev = &p->devices[rank];
	for (int k = 0; k < dev->n_ins; k++) {
		const sp_ins_t *in = &p->ins[dev->first_ins + k];
		if (in->op != INS_FWD && in->op != INS_LOSS)
			continue;
		const sp_slice_t *sl = &p->slices[in->slice];
		const sp_metaop_t *mo = &p->metaops[sl->metaop];
		ds_task_t *dt = &d->tasks[mo->task];
		int node = p->ops[mo->first_op].node;
		if (in->op == INS_FWD && sl->layer_from == 0 && mo->width_in == 0)
			mark(col_of(dt, node), in->s0, in->s1);
		else if (in->op == INS_LOSS && mo->shape.type == COMP_CLASSIFIER)
			mark(col_of(dt, node), in->s0, in->s1);
		else if (in->op == INS_LOSS && mo->shape.type == COMP_LM_HEAD)
			for (int i = 0; i < dt->n_cols; i++)
				if (dt->cols[i].kind == COL_TOKENS)
					mark(&dt->cols[i], in->s0, in->s1);
	}
}

/*
 * perm(seed, task, e) into out[0..n): Fisher-Yates, j uniform in [0, i]
 * from a SplitMix64 stream keyed by (seed, task name, epoch). The modulo
 * bias of a 64-bit draw over n < 2^31 is below 2^-33.
 */
static void permutation(int32_t *out, int64_t n, uint64_t seed, const char *task, int64_t e)
{
	uint64_t key = sp_mix64(seed ^ 0x64617461ULL) ^ sp_fnv1a(SP_FNV_INIT, task, strlen(task));
	key = sp_mix64(key ^ sp_mix64((uint64_t)e));
	for (int64_t i = 0; i < n; i++)
		out[i] = (int32_t)i;
	for (int64_t i = n - 1; i > 0; i--) {
		int64_t j = (int64_t)(sp_mix64(key + (uint64_t)i) % (uint64_t)(i + 1));
		int32_t x = out[i];
		out[i] = out[j];
		out[j] = x;
	}
}

/* The sample of every (step, position) of this run. */
static int make_order(ds_task_t *dt, const sp_task_t *t, uint64_t seed, int64_t first,
		      int64_t last)
{
	int64_t B = t->batch, steps = SP_MAX(last - first + 1, 0);
	dt->spe = dt->n / B;
	dt->order = malloc(sizeof(int32_t) * (size_t)(steps * B + 1));
	int32_t *perm = malloc(sizeof(int32_t) * (size_t)dt->n);
	if (!dt->order || !perm) {
		free(perm);
		return SP_ENOMEM;
	}
	int64_t have = -1;
	for (int64_t st = first; st <= last; st++) {
		int64_t e = (st - 1) / dt->spe, j = (st - 1) % dt->spe;
		if (e != have)
			permutation(perm, dt->n, seed, t->name, have = e);
		memcpy(dt->order + (st - first) * B, perm + j * B, sizeof(int32_t) * (size_t)B);
	}
	free(perm);
	return 0;
}

/* Slots for the samples the rank touches; the rows themselves come later. */
static int make_slots(ds_task_t *dt, const sp_task_t *t, int64_t steps)
{
	for (int i = 0; i < dt->n_cols; i++) {
		ds_col_t *c = &dt->cols[i];
		for (int64_t s = 0; s < dt->n; s++)
			c->slot[s] = -1;
		for (int64_t q = 0; q < steps * t->batch; q++)
			if (c->pos_used[q % t->batch] && c->slot[dt->order[q]] < 0)
				c->slot[dt->order[q]] = (int32_t)c->n_kept++;
		size_t el = c->kind == COL_FEATURES ? sizeof(float) : sizeof(int32_t);
		c->rows = calloc((size_t)(c->n_kept * c->seq * c->width + 1), el);
		c->len = calloc((size_t)c->n_kept + 1, sizeof(int32_t));
		if (!c->rows || !c->len)
			return SP_ENOMEM;
	}
	return 0;
}

/* ---- shards ---- */

/* What a message about one row of a shard says first. */
typedef struct {
	const ds_shard_t *sh;
	const char *tensor, *task;
	int64_t row;
} row_at_t;

__attribute__((format(printf, 3, 4))) static int row_error(sp_err_t *err, const row_at_t *a,
							     const char *fmt, ...)
{
	char what[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	return sp_err_set(err, SP_EINPUT, a->sh->path, 0, 0, NULL,
			  "tensor '%s', row %lld (sample %lld of task '%s'): %s", a->tensor,
			  (long long)a->row, (long long)(a->sh->base + a->row), a->task, what);
}

/* Tensor name of the shard against dtype and shape [dims...]. */
static int check_tensor(st_in_t *in, const char *name, st_dtype_t dt, int ndim,
			const int64_t *dims, st_info_t *out, sp_err_t *err)
{
	if (st_in_info(in, name, out, err)) {
		sp_err_hint(err, "see schemas/DATASET-FORMAT.md for the tensors of each node");
		return SP_EINPUT;
	}
	if (out->dtype != dt)
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s' has dtype %s, not %s", name,
				  st_dtype_name(out->dtype), st_dtype_name(dt));
	int same = out->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = out->shape[i] == dims[i];
	if (!same) {
		char want[80];
		int n = snprintf(want, sizeof want, "[%lld", (long long)dims[0]);
		for (int i = 1; i < ndim; i++)
			n += snprintf(want + n, sizeof want - (size_t)n, ", %lld", (long long)dims[i]);
		snprintf(want + n, sizeof want - (size_t)n, "]");
		return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				  "tensor '%s' has another shape than %s (samples, seq, width "
				  "of the model's node)",
				  name, want);
	}
	return 0;
}

/* One row's checks (tokens below the vocabulary, finite features, labels
 * below the classes, 1 <= length <= seq); zeroes the padding. */
static int check_row(const ds_col_t *c, const sp_component_t *comp, const row_at_t *a,
		     void *row, int32_t len, sp_err_t *err)
{
	if (c->kind == COL_LABELS) {
		int32_t y = *(int32_t *)row;
		if (y < 0 || y >= comp->classes)
			return row_error(err, a, "label %d is not in [0, %lld), the classes of "
						 "component '%s'",
					 y, (long long)comp->classes, comp->name);
		return 0;
	}
	if (len < 1 || len > c->seq)
		return row_error(err, a, "length %d is not in [1, %lld], the node's seq", len,
				 (long long)c->seq);
	for (int64_t q = 0; q < len; q++)
		for (int64_t f = 0; f < c->width; f++) {
			int64_t i = q * c->width + f;
			if (c->kind == COL_TOKENS &&
			    (((int32_t *)row)[i] < 0 || ((int32_t *)row)[i] >= comp->vocab))
				return row_error(err, a, "token id %d at position %lld is not in [0, "
							 "%lld), the vocabulary of component '%s'",
						 ((int32_t *)row)[i], (long long)q,
						 (long long)comp->vocab, comp->name);
			if (c->kind == COL_FEATURES && !isfinite(((float *)row)[i]))
				return row_error(err, a, "feature %lld at position %lld is not finite",
						 (long long)f, (long long)q);
		}
	size_t el = c->kind == COL_FEATURES ? sizeof(float) : sizeof(int32_t);
	memset((uint8_t *)row + (size_t)(len * c->width) * el, 0,
	       (size_t)((c->seq - len) * c->width) * el);
	return 0;
}

/* Column c of one shard: headers checked; rows in [lo, hi) of the task
 * (the rank's share) or touched read and checked, the touched ones kept. */
static int read_column(ds_col_t *c, st_in_t *in, const ds_shard_t *sh, const sp_task_t *t,
		       const sp_model_t *m, int64_t lo, int64_t hi, sp_err_t *err)
{
	const sp_node_t *nd = &t->nodes[c->node];
	char name[SP_NAME_MAX + 16], lname[SP_NAME_MAX + 16];
	snprintf(name, sizeof name, "%s.%s", nd->id, COL_SUFFIX[c->kind]);
	snprintf(lname, sizeof lname, "%s.length", nd->id);
	int64_t dims[3] = {sh->n, c->seq, c->width};
	st_info_t ti, li;
	int rc = check_tensor(in, name, c->kind == COL_FEATURES ? ST_F32 : ST_I32,
			      c->kind == COL_LABELS ? 1 : c->kind == COL_TOKENS ? 2 : 3, dims, &ti,
			      err);
	if (!rc && c->kind != COL_LABELS)
		rc = check_tensor(in, lname, ST_I32, 1, dims, &li, err);
	if (rc)
		return rc;
	size_t rb = (size_t)(c->seq * c->width) * 4;
	uint8_t *tmp = malloc(rb);
	if (!tmp)
		return SP_ENOMEM;
	row_at_t a = {sh, name, t->name, 0};
	for (int64_t r = 0; r < sh->n && !rc; r++) {
		int64_t s = sh->base + r;
		int32_t len = 1, slot = c->slot[s];
		if (slot < 0 && (s < lo || s >= hi))
			continue;
		a.row = r;
		rc = st_in_read(in, &ti, (uint64_t)r * rb, rb, tmp, err);
		if (!rc && c->kind != COL_LABELS)
			rc = st_in_read(in, &li, (uint64_t)r * 4, 4, &len, err);
		if (!rc)
			rc = check_row(c, &m->comps[nd->comp], &a, tmp, len, err);
		if (!rc && slot >= 0) {
			memcpy((uint8_t *)c->rows + (size_t)slot * rb, tmp, rb);
			c->len[slot] = len;
		}
	}
	free(tmp);
	return rc;
}

static int read_shards(ds_task_t *dt, const sp_task_t *t, const sp_model_t *m, int rank,
		       int nranks, sp_err_t *err)
{
	int64_t lo = dt->n * rank / nranks, hi = dt->n * (rank + 1) / nranks;
	for (int k = 0; k < dt->n_shards; k++) {
		st_in_t in;
		int rc = st_in_open(&in, dt->shards[k].path, err);
		for (int i = 0; i < dt->n_cols && !rc; i++)
			rc = read_column(&dt->cols[i], &in, &dt->shards[k], t, m, lo, hi, err);
		st_in_release(&in);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- the API ---- */

int dataset_open(rt_dataset_t **out, const char *dir, const sp_plan_t *p, int rank,
		 int nranks, uint64_t seed, int64_t first, int64_t last, sp_err_t *err)
{
	const sp_model_t *m = &p->model;
	*out = NULL;
	char *index = join(dir, "index.json");
	rt_dataset_t *d = calloc(1, sizeof *d);
	if (!index || !d || !(d->tasks = calloc((size_t)m->n_tasks + 1, sizeof *d->tasks))) {
		free(index);
		dataset_free(d);
		return sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
	}
	d->m = m;
	d->first = first;
	d->last = last;
	json_error_t je;
	json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
	const char *fmt = json_string_value(json_object_get(root, "format"));
	int rc = 0;
	if (!root)
		rc = sp_err_set(err, SP_EINPUT, index, je.line, je.column, NULL, "%s", je.text);
	else if (!fmt || strcmp(fmt, "spindle.dataset/1"))
		rc = sp_err_set(err, SP_EINPUT, index, 0, 0, "format",
				"not a dataset index: 'format' is not \"spindle.dataset/1\"");
	else if (!json_is_object(json_object_get(root, "tasks")))
		rc = sp_err_set(err, SP_EINPUT, index, 0, 0, "tasks",
				"'tasks' must be an object keyed by task name");
	for (int i = 0; i < m->n_tasks && !rc; i++) {
		rc = read_task(&d->tasks[i], json_object_get(root, "tasks"), &m->tasks[i], dir,
			       index, err);
		if (!rc)
			rc = plan_columns(&d->tasks[i], m, &m->tasks[i]);
	}
	if (!rc)
		mark_program(d, p, rank);
	for (int i = 0; i < m->n_tasks && !rc; i++) {
		rc = make_order(&d->tasks[i], &m->tasks[i], seed, first, last);
		if (!rc)
			rc = make_slots(&d->tasks[i], &m->tasks[i], SP_MAX(last - first + 1, 0));
		if (!rc)
			rc = read_shards(&d->tasks[i], &m->tasks[i], m, rank, nranks, err);
	}
	json_decref(root);
	if (rc == SP_ENOMEM)
		sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
	free(index);
	if (rc) {
		dataset_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

void dataset_free(rt_dataset_t *d)
{
	if (!d)
		return;
	for (int i = 0; d->tasks && i < d->m->n_tasks; i++) {
		ds_task_t *dt = &d->tasks[i];
		for (int k = 0; k < dt->n_shards; k++)
			free(dt->shards[k].path);
		for (int k = 0; k < dt->n_cols; k++) {
			free(dt->cols[k].pos_used);
			free(dt->cols[k].slot);
			free(dt->cols[k].rows);
			free(dt->cols[k].len);
		}
		free(dt->shards);
		free(dt->cols);
		free(dt->order);
	}
	free(d->tasks);
	free(d);
}

int64_t dataset_epoch(const rt_dataset_t *d, int task, int64_t step)
{
	return (step - 1) / d->tasks[task].spe;
}

/* The kept row of (step, task, node, batch position s). */
static const void *row_of(const rt_dataset_t *d, int64_t step, int task, int node, int64_t s,
			  const ds_col_t **col, int32_t *len)
{
	const ds_task_t *dt = &d->tasks[task];
	const ds_col_t *c = col_of(dt, node);
	int64_t B = d->m->tasks[task].batch;
	assert(c && step >= d->first && step <= d->last && s >= 0 && s < B);
	int32_t slot = c->slot[dt->order[(step - d->first) * B + s]];
	assert(slot >= 0); /* mark_program missed an instruction: our bug */
	size_t el = c->kind == COL_FEATURES ? sizeof(float) : sizeof(int32_t);
	*col = c;
	*len = c->len[slot];
	return (const uint8_t *)c->rows + (size_t)slot * (size_t)(c->seq * c->width) * el;
}

void dataset_rows(void *out, const rt_dataset_t *d, int64_t step, int task, int node,
		  int64_t s0, int64_t s1)
{
	for (int64_t s = s0; s < s1; s++) {
		const ds_col_t *c;
		int32_t len;
		const void *row = row_of(d, step, task, node, s, &c, &len);
		size_t rb = (size_t)(c->seq * c->width) * 4;
		memcpy((uint8_t *)out + (size_t)(s - s0) * rb, row, rb);
	}
}

const int32_t *dataset_tokens(const rt_dataset_t *d, int64_t step, int task, int node,
			      int64_t s, int32_t *len)
{
	const ds_col_t *c;
	return row_of(d, step, task, node, s, &c, len);
}
