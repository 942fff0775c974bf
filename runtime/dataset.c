/*
 * dataset.c — reads a "spindle.dataset/1" directory (schemas/DATASET-FORMAT.md)
 * for one rank of a plan and hands out the samples of each step. It does
 * not train, make datasets or decide where samples go in a batch (the
 * plan's s0/s1 do).
 *
 * Order. Task i with N samples and batch B runs N / B steps per epoch (the
 * last N mod B samples of an epoch's permutation are left out); step t
 * (1-based) is epoch e = (t - 1) / (N / B), and batch position s of it is
 * sample perm(seed, task name, e)[((t - 1) mod (N / B)) * B + s], perm a
 * Fisher-Yates shuffle (sample_index, the one place a sample index is
 * computed). B is the step batch: with K micro-steps (the plan's
 * microbatches) the dataset's steps are micro-steps, and for a task with
 * k <= K micro-batches (the plan's task batch is then B / k) micro-step
 * (t - 1) K + i + 1 is positions i B / k .. (i + 1) B / k - 1 of step t
 * when i < k; the task reads nothing in micro-steps i >= k (it does not
 * run in them: interp.c).
 * The order depends on the seed, the task's name, N and B only, so every
 * plan, rank count and k sees the same samples in a step, and a resumed
 * run (same seed, later steps) continues the same order.
 *
 * Reading, for training (dataset_stream): at start-up the index, every
 * shard's header (tensors, dtypes, shapes) and lengths table (1 <= length
 * <= seq, 4 bytes a sample) are checked and the shards stay open; the rows
 * of the first step are read. Then a reader thread reads the rows step t + 1
 * needs into the second of two step buffers while step t runs
 * (dataset_next waits for it, then starts the next read): at most two
 * steps' rows of the rank are resident, whatever the dataset's size. With
 * k micro-batches a spindle-run step is k of the dataset's steps (interp.c
 * rt_step), read ahead together: two groups of k are resident. Only
 * the batch positions the rank's program reads (its s0/s1 ranges of FWDs of
 * source nodes and LOSSes) are read. Each row's values (token ids, labels,
 * finite features, its length) are checked when read, and before a step's
 * first read of a shard the file is checked to be the one opened (size,
 * modification time, inode): a bad row or a changed shard fails that step's
 * read, naming the file, tensor and sample. With full checking, each rank
 * also reads and checks its share of every tensor (rows [rank N / R,
 * (rank + 1) N / R)) at start-up, so the ranks together check every row
 * before step 1.
 *
 * dataset_open (held-out scoring: eval.c) reads every step of [first,
 * last] at start-up, with full checking, and starts no thread.
 */
#include "runtime.h"
#include "safetensors.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { COL_TOKENS, COL_FEATURES, COL_LABELS };
static const char *const COL_SUFFIX[] = {"tokens", "features", "labels"};

/* One tensor of a task: a source node's inputs or a classifier's labels.
 * Int32 and float elements are both 4 bytes. */
typedef struct {
	int node, kind;
	int64_t seq, width; /* a row is seq * width elements (labels: 1 x 1) */
	int32_t *pos;       /* [batch]: index among the positions the rank reads, or -1 */
	int64_t n_pos;      /* positions the rank reads */
	void *rows;   /* [n_buf][n_pos][seq * width] int32 or float, padding zeroed */
	int32_t *len; /* [n_buf][n_pos] valid positions (labels: 1) */
	char name[SP_NAME_MAX + 16];  /* its tensor, "<node>.<kind>", for messages */
	char lname[SP_NAME_MAX + 16]; /* its lengths table, "<node>.length" */
} ds_col_t;

/* Where a column's tensor and lengths table are in one shard. */
typedef struct {
	st_info_t ti, li;
} ds_src_t;

typedef struct {
	char *path;
	int64_t base, n; /* the task's samples [base, base + n) */
	st_in_t in;      /* open for the run */
	struct stat sb;  /* the file at start-up */
	int64_t seen;    /* the last step that checked the file is still sb */
	ds_src_t *src;   /* [n_cols] */
} ds_shard_t;

typedef struct {
	int64_t n, spe; /* samples; steps per epoch (of the step batch) */
	int k;          /* the task's micro-batches per step (plan_task_k) */
	int n_shards;
	ds_shard_t *shards;
	int n_cols;
	ds_col_t *cols;
	int32_t *perm; /* [n]: the permutation of epoch perm_epoch */
	int64_t perm_epoch;
} ds_task_t;

struct rt_dataset {
	const sp_model_t *m;
	uint64_t seed;
	int64_t first, last;
	int n_buf;     /* step buffers: 2 groups (streaming) or last - first + 1 */
	int group;     /* the plan's micro-steps K: spindle-run's step t is
			* steps (t-1)*group+1 .. t*group of the dataset, the
			* first k_i of them the micro-batches of task i's step
			* batch (sample_index); streaming reads them ahead
			* together */
	int64_t *held; /* [n_buf]: the step each holds, 0 none */
	int64_t resident; /* bytes of the step buffers */
	ds_task_t *tasks; /* per model task */
	/* the reader thread: reads step `want` while want > done, then sets
	 * done (and rc, err on failure); all under mu, signalled on cv */
	int running, stop;
	pthread_t reader;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int64_t want, done;
	int rc;
	sp_err_t err;
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
static int read_task(ds_task_t *dt, json_t *tasks, const sp_task_t *t, int k,
		     const char *dir, const char *index, sp_err_t *err)
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
	dt->k = k;
	if (dt->n < t->batch * k) /* the step batch: k micro-batches */
		return sp_err_set(err, SP_EINPUT, index, 0, 0, where,
				  "task '%s' has %lld samples, fewer than one batch (%lld)",
				  t->name, (long long)dt->n, (long long)(t->batch * k));
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
		d->in.fd = -1;
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
		if (!(col.pos = calloc((size_t)t->batch, sizeof(int32_t))))
			return SP_ENOMEM;
		snprintf(col.name, sizeof col.name, "%s.%s", t->nodes[k].id, COL_SUFFIX[col.kind]);
		snprintf(col.lname, sizeof col.lname, "%s.length", t->nodes[k].id);
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
		c->pos[s] = 1;
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

/*
 * The sample at batch position s of task ti's step `step` (1-based; a
 * micro-step: position s of micro-batch (step - 1) mod group of the step
 * batch, which is below the task's k): the one place a sample index is
 * computed (see the top of the file). One
 * thread at a time calls it (dataset_open's, then the reader): it keeps the
 * permutation of the epoch last asked for.
 */
static int64_t sample_index(const rt_dataset_t *d, int ti, int64_t step, int64_t s)
{
	ds_task_t *dt = &d->tasks[ti];
	const sp_task_t *t = &d->m->tasks[ti];
	int64_t u = (step - 1) / d->group, i = (step - 1) % d->group;
	int64_t e = u / dt->spe, j = u % dt->spe;
	assert(i < dt->k);
	if (dt->perm_epoch != e)
		permutation(dt->perm, dt->n, d->seed, t->name, dt->perm_epoch = e);
	return dt->perm[(j * dt->k + i) * t->batch + s];
}

/* The step buffers of the positions the rank reads (marked in pos). */
static int make_buffers(rt_dataset_t *d, ds_task_t *dt, const sp_task_t *t)
{
	dt->spe = dt->n / (t->batch * dt->k);
	dt->perm_epoch = -1;
	if (!(dt->perm = malloc(sizeof(int32_t) * (size_t)dt->n)))
		return SP_ENOMEM;
	for (int i = 0; i < dt->n_cols; i++) {
		ds_col_t *c = &dt->cols[i];
		for (int64_t s = 0; s < t->batch; s++)
			c->pos[s] = c->pos[s] ? (int32_t)c->n_pos++ : -1;
		size_t rows = (size_t)(d->n_buf * c->n_pos);
		c->rows = calloc(rows * (size_t)(c->seq * c->width) + 1, 4);
		c->len = calloc(rows + 1, sizeof(int32_t));
		if (!c->rows || !c->len)
			return SP_ENOMEM;
		d->resident += (int64_t)rows * (c->seq * c->width + 1) * 4;
	}
	return 0;
}

/* ---- shards ---- */

/* What a message about one row of a shard says first. */
typedef struct {
	const ds_shard_t *sh;
	const char *tensor, *task;
	int64_t row, step; /* step: spindle-run's step it was read for (of
			    * group micro-steps: run_step), 0 at start-up */
} row_at_t;

__attribute__((format(printf, 3, 4))) static int row_error(sp_err_t *err, const row_at_t *a,
							     const char *fmt, ...)
{
	char what[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	char when[48] = "";
	if (a->step > 0)
		snprintf(when, sizeof when, ", read for step %lld", (long long)a->step);
	return sp_err_set(err, SP_EINPUT, a->sh->path, 0, 0, NULL,
			  "tensor '%s', row %lld (sample %lld of task '%s')%s: %s", a->tensor,
			  (long long)a->row, (long long)(a->sh->base + a->row), a->task, when,
			  what);
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

/* The names of column c's tensor and lengths table ("node.tokens",
 * "node.length"). */
/* Column ci's tensors in shard sh against the node (dtype, shape), and its
 * lengths table: every length in [1, seq]. */
static int check_column(ds_shard_t *sh, int ci, const ds_col_t *c, const sp_task_t *t,
			sp_err_t *err)
{
	const char *name = c->name, *lname = c->lname;
	int64_t dims[3] = {sh->n, c->seq, c->width};
	ds_src_t *src = &sh->src[ci];
	int rc = check_tensor(&sh->in, name, c->kind == COL_FEATURES ? ST_F32 : ST_I32,
			      c->kind == COL_LABELS ? 1 : c->kind == COL_TOKENS ? 2 : 3, dims,
			      &src->ti, err);
	if (rc || c->kind == COL_LABELS)
		return rc;
	if ((rc = check_tensor(&sh->in, lname, ST_I32, 1, dims, &src->li, err)))
		return rc;
	int32_t *len = malloc(sizeof(int32_t) * (size_t)sh->n);
	if (!len)
		return SP_ENOMEM;
	rc = st_in_read(&sh->in, &src->li, 0, sizeof(int32_t) * (size_t)sh->n, len, err);
	row_at_t a = {sh, lname, t->name, 0, 0};
	for (; !rc && a.row < sh->n; a.row++)
		if (len[a.row] < 1 || len[a.row] > c->seq)
			rc = row_error(err, &a, "length %d is not in [1, %lld], the node's seq",
				       len[a.row], (long long)c->seq);
	free(len);
	return rc;
}

/* Opens the task's shards for the run and checks their headers and
 * lengths tables. */
static int open_shards(ds_task_t *dt, const sp_task_t *t, sp_err_t *err)
{
	for (int k = 0; k < dt->n_shards; k++) {
		ds_shard_t *sh = &dt->shards[k];
		if (!(sh->src = calloc((size_t)dt->n_cols + 1, sizeof *sh->src)))
			return SP_ENOMEM;
		int rc = st_in_open(&sh->in, sh->path, err);
		if (!rc && fstat(sh->in.fd, &sh->sb))
			rc = sp_err_set(err, SP_EIO, sh->path, 0, 0, NULL, "cannot stat the file");
		for (int i = 0; i < dt->n_cols && !rc; i++)
			rc = check_column(sh, i, &dt->cols[i], t, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* Spindle-run's step that reads the dataset's step `step` (> 0): messages
 * name it, not the micro-step. */
static int64_t run_step(const rt_dataset_t *d, int64_t step)
{
	return (step - 1) / d->group + 1;
}

/* Before step's first read of shard sh: the file at its path is still the
 * one opened at start-up. */
static int check_unchanged(const rt_dataset_t *d, ds_shard_t *sh, int64_t step, sp_err_t *err)
{
	struct stat now;
	if (sh->seen == step)
		return 0;
	sh->seen = step;
	if (stat(sh->path, &now) == 0 && now.st_dev == sh->sb.st_dev &&
	    now.st_ino == sh->sb.st_ino && now.st_size == sh->sb.st_size &&
	    now.st_mtim.tv_sec == sh->sb.st_mtim.tv_sec &&
	    now.st_mtim.tv_nsec == sh->sb.st_mtim.tv_nsec)
		return 0;
	sp_err_set(err, SP_EINPUT, sh->path, 0, 0, NULL,
		   "the shard changed on disk after start-up (read for step %lld)",
		   (long long)run_step(d, step));
	sp_err_hint(err, "a dataset must stay as it is while a run reads it");
	return SP_EINPUT;
}

/* The shard holding sample s of the task (shards in order of base). */
static ds_shard_t *shard_of(const ds_task_t *dt, int64_t s)
{
	int lo = 0, hi = dt->n_shards - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (dt->shards[mid].base <= s)
			lo = mid;
		else
			hi = mid - 1;
	}
	return &dt->shards[lo];
}

/* Sample s's row of column ci of task ti into row, and its length,
 * checked; step > 0: read for that step (the shard checked unchanged). */
static int read_row(const rt_dataset_t *d, int ti, int ci, int64_t s, int64_t step,
		    void *row, int32_t *len, sp_err_t *err)
{
	const ds_task_t *dt = &d->tasks[ti];
	const sp_task_t *t = &d->m->tasks[ti];
	const ds_col_t *c = &dt->cols[ci];
	ds_shard_t *sh = shard_of(dt, s);
	row_at_t a = {sh, c->name, t->name, s - sh->base, step > 0 ? run_step(d, step) : 0};
	size_t rb = (size_t)(c->seq * c->width) * 4;
	*len = 1;
	int rc = step > 0 ? check_unchanged(d, sh, step, err) : 0;
	if (!rc)
		rc = st_in_read(&sh->in, &sh->src[ci].ti, (uint64_t)a.row * rb, rb, row, err);
	if (!rc && c->kind != COL_LABELS)
		rc = st_in_read(&sh->in, &sh->src[ci].li, (uint64_t)a.row * 4, 4, len, err);
	return rc ? rc : check_row(c, &d->m->comps[t->nodes[c->node].comp], &a, row, *len, err);
}

/* Every row the rank's program reads in `step`, into that step's buffer. */
static int read_step(rt_dataset_t *d, int64_t step, sp_err_t *err)
{
	int b = (int)((step - d->first) % d->n_buf);
	d->held[b] = 0;
	for (int ti = 0; ti < d->m->n_tasks; ti++) {
		const ds_task_t *dt = &d->tasks[ti];
		if ((step - 1) % d->group >= dt->k) /* not in this micro-step */
			continue;
		for (int ci = 0; ci < dt->n_cols; ci++) {
			const ds_col_t *c = &dt->cols[ci];
			size_t rb = (size_t)(c->seq * c->width) * 4;
			for (int64_t s = 0; s < d->m->tasks[ti].batch; s++) {
				if (c->pos[s] < 0)
					continue;
				size_t k = (size_t)(b * c->n_pos + c->pos[s]);
				int rc = read_row(d, ti, ci, sample_index(d, ti, step, s), step,
						  (uint8_t *)c->rows + k * rb, &c->len[k], err);
				if (rc)
					return rc;
			}
		}
	}
	d->held[b] = step;
	return 0;
}

/* Full checking: the rank's share [rank N / R, (rank + 1) N / R) of every
 * tensor of task ti, read and checked (not kept). */
static int check_share(const rt_dataset_t *d, int ti, int rank, int nranks, sp_err_t *err)
{
	const ds_task_t *dt = &d->tasks[ti];
	int64_t lo = dt->n * rank / nranks, hi = dt->n * (rank + 1) / nranks;
	int rc = 0;
	for (int ci = 0; ci < dt->n_cols && !rc; ci++) {
		const ds_col_t *c = &dt->cols[ci];
		void *tmp = malloc((size_t)(c->seq * c->width) * 4);
		int32_t len;
		if (!tmp)
			return SP_ENOMEM;
		for (int64_t s = lo; s < hi && !rc; s++)
			rc = read_row(d, ti, ci, s, 0, tmp, &len, err);
		free(tmp);
	}
	return rc;
}

/* ---- the reader thread ---- */

static void *reader_main(void *arg)
{
	rt_dataset_t *d = arg;
	pthread_mutex_lock(&d->mu);
	for (;;) {
		while (!d->stop && d->want <= d->done)
			pthread_cond_wait(&d->cv, &d->mu);
		if (d->stop)
			break;
		int64_t step = d->want, end = SP_MIN(step + d->group - 1, d->last);
		pthread_mutex_unlock(&d->mu);
		sp_err_t e = {0};
		int rc = 0;
		for (int64_t s = step; s <= end && !rc; s++)
			rc = read_step(d, s, &e);
		pthread_mutex_lock(&d->mu);
		if (rc && !d->rc) {
			d->rc = rc;
			d->err = e;
		}
		d->done = end;
		pthread_cond_broadcast(&d->cv);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* The reader, set to read step `first` (dataset_next waits for it). */
static int start_reader(rt_dataset_t *d, sp_err_t *err)
{
	if (pthread_mutex_init(&d->mu, NULL))
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "cannot make a mutex");
	if (pthread_cond_init(&d->cv, NULL)) {
		pthread_mutex_destroy(&d->mu);
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "cannot make a condition");
	}
	d->done = d->first - 1;
	d->want = d->first;
	if (pthread_create(&d->reader, NULL, reader_main, d)) {
		pthread_cond_destroy(&d->cv);
		pthread_mutex_destroy(&d->mu);
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
				  "cannot start the dataset's reader thread");
	}
	d->running = 1;
	return 0;
}

/* ---- the API ---- */

/* stream: two step buffers and the reader, else every step read here;
 * full: also check the rank's share of every tensor. */
static int open_dir(rt_dataset_t **out, const char *dir, const sp_plan_t *p, int rank,
		    int nranks, uint64_t seed, int64_t first, int64_t last, int stream,
		    int full, sp_err_t *err)
{
	const sp_model_t *m = &p->model;
	*out = NULL;
	char *index = join(dir, "index.json");
	rt_dataset_t *d = calloc(1, sizeof *d);
	int group = (int)SP_MAX(p->microbatches, 1);
	int n_buf = stream ? 2 * group : (int)SP_MAX(last - first + 1, 1);
	if (!index || !d || !(d->tasks = calloc((size_t)m->n_tasks + 1, sizeof *d->tasks)) ||
	    !(d->held = calloc((size_t)n_buf, sizeof *d->held))) {
		free(index);
		dataset_free(d);
		return sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
	}
	d->m = m;
	d->seed = seed;
	d->first = first;
	d->last = last;
	d->n_buf = n_buf;
	d->group = group;
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
		rc = read_task(&d->tasks[i], json_object_get(root, "tasks"), &m->tasks[i],
			       plan_task_k(p, i),
			       dir, index, err);
		if (!rc)
			rc = plan_columns(&d->tasks[i], m, &m->tasks[i]);
	}
	json_decref(root);
	free(index);
	if (!rc)
		mark_program(d, p, rank);
	for (int i = 0; i < m->n_tasks && !rc; i++) {
		rc = make_buffers(d, &d->tasks[i], &m->tasks[i]);
		if (!rc)
			rc = open_shards(&d->tasks[i], &m->tasks[i], err);
		if (!rc && full)
			rc = check_share(d, i, rank, nranks, err);
	}
	if (!rc && stream && first <= last)
		rc = start_reader(d, err);
	if (!rc && stream)
		rc = dataset_next(d, first, err);
	for (int64_t t = first; !rc && !stream && t <= last; t++)
		rc = read_step(d, t, err);
	if (rc == SP_ENOMEM)
		sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
	if (rc) {
		dataset_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

int dataset_open(rt_dataset_t **out, const char *dir, const sp_plan_t *p, int rank,
		 int nranks, uint64_t seed, int64_t first, int64_t last, sp_err_t *err)
{
	return open_dir(out, dir, p, rank, nranks, seed, first, last, 0, 1, err);
}

int dataset_stream(rt_dataset_t **out, const char *dir, const sp_plan_t *p, int rank,
		   int nranks, uint64_t seed, int64_t first, int64_t last, int full,
		   sp_err_t *err)
{
	return open_dir(out, dir, p, rank, nranks, seed, first, last, 1, full, err);
}

int dataset_next(rt_dataset_t *d, int64_t step, sp_err_t *err)
{
	if (!d || !d->running || step > d->last)
		return 0;
	pthread_mutex_lock(&d->mu);
	assert(d->want == step); /* groups are asked for in order */
	int64_t end = SP_MIN(step + d->group - 1, d->last);
	while (d->done < end && !d->rc)
		pthread_cond_wait(&d->cv, &d->mu);
	int rc = d->rc;
	if (rc && !err->code) { /* the message; err's warn function stays */
		sp_err_t keep = *err;
		*err = d->err;
		err->warn = keep.warn;
		err->warn_ctx = keep.warn_ctx;
	} else if (!rc && end < d->last) {
		d->want = end + 1;
		pthread_cond_signal(&d->cv);
	}
	pthread_mutex_unlock(&d->mu);
	return rc;
}

int64_t dataset_resident(const rt_dataset_t *d)
{
	return d->resident;
}

void dataset_free(rt_dataset_t *d)
{
	if (!d)
		return;
	if (d->running) {
		pthread_mutex_lock(&d->mu);
		d->stop = 1;
		pthread_cond_broadcast(&d->cv);
		pthread_mutex_unlock(&d->mu);
		pthread_join(d->reader, NULL);
		pthread_cond_destroy(&d->cv);
		pthread_mutex_destroy(&d->mu);
	}
	for (int i = 0; d->tasks && i < d->m->n_tasks; i++) {
		ds_task_t *dt = &d->tasks[i];
		for (int k = 0; k < dt->n_shards; k++) {
			st_in_release(&dt->shards[k].in);
			free(dt->shards[k].path);
			free(dt->shards[k].src);
		}
		for (int k = 0; k < dt->n_cols; k++) {
			free(dt->cols[k].pos);
			free(dt->cols[k].rows);
			free(dt->cols[k].len);
		}
		free(dt->shards);
		free(dt->cols);
		free(dt->perm);
	}
	free(d->tasks);
	free(d->held);
	free(d);
}

int64_t dataset_epoch(const rt_dataset_t *d, int task, int64_t step)
{
	return (step - 1) / d->group / d->tasks[task].spe;
}

/* The row of (step, task, node, batch position s) in its step buffer. */
static const void *row_of(const rt_dataset_t *d, int64_t step, int task, int node, int64_t s,
			  const ds_col_t **col, int32_t *len)
{
	const ds_col_t *c = col_of(&d->tasks[task], node);
	int b = (int)((step - d->first) % d->n_buf);
	assert(c && step >= d->first && step <= d->last && d->held[b] == step && s >= 0 &&
	       s < d->m->tasks[task].batch);
	assert(c->pos[s] >= 0); /* mark_program missed an instruction: our bug */
	size_t k = (size_t)(b * c->n_pos + c->pos[s]);
	*col = c;
	*len = c->len[k];
	return (const uint8_t *)c->rows + k * (size_t)(c->seq * c->width) * 4;
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
