/*
 * profile.c — spindle-profile: measures the per-layer forward and backward
 * time of every distinct operator shape of a model on one device, at
 * several per-device batch sizes, and writes them as a cluster "profile"
 * section (schemas/cluster.schema.json) that planner/cost.c interpolates.
 *
 *   spindle-profile MODEL.json [--backend cpu|cuda] -o OUT.json
 *                   [--batches 1,2,4,8] [--reps N] [--warmup N]
 *                   [--cluster CLUSTER.json]
 *   mpirun -np N spindle-profile --collectives -o OUT.json
 *                   [--sizes 4096,...] [--reps N] [--warmup N]
 *                   [--cluster CLUSTER.json]
 *
 * Shapes: op_shape() of every node of every task, deduplicated with
 * opshape_equal (the planner's matching rule), in order of first
 * appearance. Each is timed through the backend table with its own
 * parameters (layer_init of the first component that has the shape),
 * synthetic inputs and buffers from b->alloc.
 *
 * Timing: CLOCK_MONOTONIC around b->sync()ed runs. One call is made to
 * fill caches and a second, timed call calibrates k, the number of calls
 * one run makes so that it lasts at least MIN_RUN_MS (tiny CPU layers take
 * microseconds, below the noise of a single reading); then --warmup runs
 * are discarded and the median of --reps runs, divided by k, is reported.
 * The runs of a shape's batches are interleaved (see measure_shape), so
 * all its batches' buffers are allocated at once. Backward runs reuse the
 * activations the forward runs saved.
 *
 * Decoders (a cross-attention transformer, shape.mem_seq > 0): the block
 * reads a memory [n, mem_seq, mem_width] besides its input, and its
 * backward adds into the memory's gradient too; both are timed with
 * synthetic memories, through the backend's xblock_fwd/xblock_bwd (cpu:
 * runtime/layers_xattn.c; cuda: runtime/cuda/cu_xattn.cu). With a backend
 * whose entries are NULL (the stand-in table of a build without CUDA) a
 * model with a decoder shape is refused before anything is measured (exit
 * 2), never timed through the plain block, which would leave the
 * cross-attention out.
 *
 * Losses (lm_head, classifier, contrastive): the runtime's loss functions
 * compute forward and backward in one call (layers.h), so the whole call is
 * reported as fwd_ms and bwd_ms is 0. The planner prices a LOSS instruction
 * at f + b (planner/sim.c) and schedules on tf + tb, so it reads the
 * measured call once either way. The contrastive loss does not scale with
 * devices: the planner evaluates it at the task's whole batch B, and each
 * point at batch B here is one call over B samples (s0 = 0, s1 = B).
 *
 * Batches: --batches, or by default for each shape the powers of two up to
 * cap = min(largest batch of a task containing it, 64), plus cap itself;
 * contrastive shapes also get their tasks' batches (up to 1024), the only
 * batches the planner asks for.
 *
 * Collectives (--collectives, no MODEL): all-reduce, all-gather,
 * reduce-scatter and p2p by size and group shape over MPI on the ranks
 * mpirun started (coll_mpi.c says how), written by world rank 0 as the
 * "collectives" section; with --cluster, only the group shapes that fit
 * its nodes and gpus_per_node. --backend cuda measures NCCL on one GPU per
 * rank instead (coll_nccl.c; refused with exit 2 in builds without CUDA
 * and NCCL, or with more ranks on a node than GPUs).
 *
 * Output: {"profile": [...]} (or {"collectives": [...]}), or with --cluster
 * the whole cluster file (keys in its order) with that section replaced or
 * added; times printed with %.6g; written atomically. Layer profiling runs
 * as one process and never starts MPI; --collectives does.
 * Exit status: 0 written, 1 failure while measuring or writing, 2 bad input.
 */
#include "coll.h"
#include "layers.h"
#include "runtime.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BATCHES 64
#define DEFAULT_CAP 64
#define CONTRASTIVE_MAX_B 1024
#define MIN_RUN_MS 1.0
#define MAX_CALLS 10000
/* --sizes default: 4 KiB to 64 MiB, a factor 4 apart (a gradient bucket of
 * a small component to one of a large one) */
#define DEFAULT_SIZES {4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
/* --sizes: at most 1 GiB per buffer (two are allocated per rank) */
#define MAX_SIZE ((int64_t)1 << 30)

typedef struct {
	const char *model_path, *out_path, *cluster_path, *backend;
	int64_t batches[MAX_BATCHES];
	int n_batches; /* 0: default per shape */
	int reps, warmup;
	int collectives;
	int64_t sizes[MAX_BATCHES];
	int n_sizes;
} opts_t;

typedef struct {
	sp_opshape_t s;
	int comp;          /* first component with this shape */
	int64_t max_batch; /* largest task batch of a task containing it */
	int64_t batches[MAX_BATCHES + 8];
	int n_batches;
	sp_prof_point_t pts[MAX_BATCHES + 8];
} shape_t;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: spindle-profile MODEL.json [--backend cpu|cuda] -o OUT.json [options]\n"
		"       mpirun -np N spindle-profile --collectives -o OUT.json [options]\n"
		"\n"
		"Measures per-layer forward and backward times of every distinct operator\n"
		"shape of the model and writes them as a cluster profile section; with\n"
		"--collectives, measures all-reduce, all-gather, reduce-scatter and p2p\n"
		"times by size and group shape (MPI on the cpu backend, NCCL on cuda)\n"
		"into the \"collectives\" section.\n"
		"\n"
		"  --backend cpu|cuda    compute backend (default cpu)\n"
		"  -o, --output FILE     where to write (atomically)\n"
		"  --batches B1,B2,...   per-device batch sizes (default: powers of two up\n"
		"                        to min(largest task batch, 64))\n"
		"  --reps N              timed runs per point, median reported (default 5)\n"
		"  --warmup N            discarded runs before them (default 2)\n"
		"  --cluster FILE        write FILE with its \"profile\" (or \"collectives\")\n"
		"                        replaced instead of the bare section\n"
		"  --collectives         measure collectives (under mpirun; --backend cuda:\n"
		"                        NCCL, one GPU per rank)\n"
		"  --sizes S1,S2,...     their buffer sizes in bytes (default 4096 to\n"
		"                        67108864, a factor 4 apart)\n"
		"\n"
		"Losses are timed as one call (forward and backward together): fwd_ms\n"
		"holds it and bwd_ms is 0. Decoder (cross-attention) layers are measured\n"
		"by the cpu backend only; their entries carry mem_seq and mem_width.\n"
		"exit status: 0 written, 1 failure while measuring or writing, 2 bad input\n");
}

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	if (!s || !*s)
		return -1;
	long long v = strtoll(s, &end, 10);
	if (*end || end == s || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static int sort_unique(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_i64);
	int k = 0;
	for (int i = 0; i < n; i++)
		if (k == 0 || v[i] != v[k - 1])
			v[k++] = v[i];
	return k;
}

/* A comma-separated list of up to MAX_BATCHES integers lo..hi, sorted,
 * repeats dropped. */
static int parse_list(int64_t *v, int *n, const char *s, int64_t lo, int64_t hi)
{
	char buf[1024];
	if (strlen(s) >= sizeof buf)
		return -1;
	snprintf(buf, sizeof buf, "%s", s);
	*n = 0;
	for (char *tok = buf, *next; tok; tok = next) {
		next = strchr(tok, ',');
		if (next)
			*next++ = 0;
		int64_t b;
		if (*n == MAX_BATCHES || parse_int(tok, lo, hi, &b))
			return -1;
		v[(*n)++] = b;
	}
	*n = sort_unique(v, *n);
	return 0;
}

static int parse_args(opts_t *o, int argc, char **argv)
{
	memset(o, 0, sizeof *o);
	o->backend = "cpu";
	o->reps = 5;
	o->warmup = 2;
	int pos = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int64_t x;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(a, "--collectives")) {
			o->collectives = 1;
		} else if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--cluster") ||
			   !strcmp(a, "--backend") || !strcmp(a, "--batches") ||
			   !strcmp(a, "--sizes") || !strcmp(a, "--reps") || !strcmp(a, "--warmup")) {
			if (!v) {
				fprintf(stderr, "spindle-profile: option '%s' needs a value\n", a);
				return SP_EXIT_INPUT;
			}
			i++;
			if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
				o->out_path = v;
			} else if (!strcmp(a, "--cluster")) {
				o->cluster_path = v;
			} else if (!strcmp(a, "--backend")) {
				if (!backend_find(v)) {
					fprintf(stderr, "spindle-profile: unknown backend '%s'\n"
							"hint: use cpu or cuda\n", v);
					return SP_EXIT_INPUT;
				}
				o->backend = v;
			} else if (!strcmp(a, "--batches") || !strcmp(a, "--sizes")) {
				int bat = !strcmp(a, "--batches");
				int64_t lo = bat ? 1 : 4, hi = bat ? SP_MAX_BATCH : MAX_SIZE;
				if (parse_list(bat ? o->batches : o->sizes, bat ? &o->n_batches : &o->n_sizes,
					       v, lo, hi)) {
					fprintf(stderr, "spindle-profile: %s: invalid list '%s'\n"
							"hint: up to %d comma-separated %s %lld..%lld, "
							"e.g. %s\n", a, v, MAX_BATCHES,
						bat ? "integers" : "byte counts", (long long)lo,
						(long long)hi, bat ? "1,2,4,8" : "4096,65536");
					return SP_EXIT_INPUT;
				}
			} else {
				int reps = !strcmp(a, "--reps");
				if (parse_int(v, reps ? 1 : 0, 1000, &x)) {
					fprintf(stderr, "spindle-profile: %s: invalid count '%s' "
							"(expected %d..1000)\n", a, v, reps ? 1 : 0);
					return SP_EXIT_INPUT;
				}
				*(reps ? &o->reps : &o->warmup) = (int)x;
			}
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "spindle-profile: unknown option '%s'\n"
					"hint: see spindle-profile --help\n", a);
			return SP_EXIT_INPUT;
		} else if (pos++ == 0) {
			o->model_path = a;
		} else {
			fprintf(stderr, "spindle-profile: unexpected argument '%s'\n", a);
			return SP_EXIT_INPUT;
		}
	}
	if (o->collectives) {
		static const int64_t def[] = DEFAULT_SIZES;
		const char *bad = o->model_path ? "a MODEL argument (it measures no layers)"
				  : o->n_batches ? "--batches"
						 : NULL;
		if (bad) {
			fprintf(stderr, "spindle-profile: --collectives does not take %s\n", bad);
			return SP_EXIT_INPUT;
		}
		if (!o->n_sizes) {
			memcpy(o->sizes, def, sizeof def);
			o->n_sizes = SP_ARRAY_LEN(def);
		}
	} else if (o->n_sizes) {
		fprintf(stderr, "spindle-profile: --sizes needs --collectives\n");
		return SP_EXIT_INPUT;
	}
	if ((!o->model_path && !o->collectives) || !o->out_path) {
		if (o->model_path)
			fprintf(stderr, "spindle-profile: missing -o OUT.json\n");
		usage(stderr);
		return SP_EXIT_INPUT;
	}
	return 0;
}

/* ---- shapes ---------------------------------------------------------------- */

static void add_batch(shape_t *sh, int64_t b)
{
	if (sh->n_batches < SP_ARRAY_LEN(sh->batches))
		sh->batches[sh->n_batches++] = b;
}

/* Distinct shapes in order of first appearance, with their batches. */
static int collect_shapes(const sp_model_t *m, const opts_t *o, shape_t **out, int *n_out)
{
	shape_t *v = NULL;
	int n = 0, cap = 0;
	for (int ti = 0; ti < m->n_tasks; ti++) {
		const sp_task_t *t = &m->tasks[ti];
		for (int ni = 0; ni < t->n_nodes; ni++) {
			sp_opshape_t s = op_shape(m, t, &t->nodes[ni]);
			int k = 0;
			while (k < n && !opshape_equal(&v[k].s, &s))
				k++;
			if (k == n) {
				shape_t z;
				memset(&z, 0, sizeof z);
				z.s = s;
				z.comp = t->nodes[ni].comp;
				if (SP_PUSH(v, n, cap, z)) {
					free(v);
					return SP_ENOMEM;
				}
			}
			v[k].max_batch = SP_MAX(v[k].max_batch, t->batch);
			if (s.type == COMP_CONTRASTIVE && !o->n_batches &&
			    t->batch <= CONTRASTIVE_MAX_B)
				add_batch(&v[k], t->batch);
		}
	}
	for (int k = 0; k < n; k++) {
		shape_t *sh = &v[k];
		if (o->n_batches) {
			memcpy(sh->batches, o->batches, sizeof(int64_t) * (size_t)o->n_batches);
			sh->n_batches = o->n_batches;
		} else {
			int64_t c = SP_MIN(sh->max_batch, (int64_t)DEFAULT_CAP);
			for (int64_t b = 1; b <= c; b *= 2)
				add_batch(sh, b);
			add_batch(sh, c);
		}
		sh->n_batches = sort_unique(sh->batches, sh->n_batches);
	}
	*out = v;
	*n_out = n;
	return 0;
}

/* ---- measuring ------------------------------------------------------------- */

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Buffers of one (shape, batch) measurement, all from b->alloc. */
typedef struct {
	const rt_backend_t *b;
	const sp_opshape_t *s;
	const sp_component_t *c;
	int n;
	int64_t seq_in; /* classifier and contrastive: tokens per sample of x */
	float *p, *dp, *x, *dx, *y, *dy, *saved;
	float *mem, *dmem; /* decoders: the memory [n, mem_seq, mem_width], its gradient */
	int32_t *ints;     /* tokens, targets or labels */
} bench_t;


/* One forward call; 0, or the layer's error code (a shape it refuses). */
static int run_fwd(bench_t *q)
{
	const rt_backend_t *b = q->b;
	const sp_opshape_t *s = q->s;
	int n = q->n;
	double scale = 1.0 / n;
	switch (s->type) {
	case COMP_EMBEDDING: b->embedding_fwd(s, n, q->p, q->ints, q->y, q->saved); break;
	case COMP_PATCH: b->patch_fwd(s, n, q->p, q->x, q->y, q->saved); break;
	case COMP_TRANSFORMER:
		if (s->mem_seq > 0)
			return b->xblock_fwd ? b->xblock_fwd(s, NULL, n, q->p, q->x, q->mem, q->y,
							     q->saved)
					     : SP_EINPUT;
		return b->tblock_fwd(s, NULL, n, q->p, q->x, q->y, q->saved);
	case COMP_LINEAR: b->linear_fwd(s, n, q->p, q->x, q->y, q->saved); break;
	/* losses: forward and backward in one call (see the top of the file) */
	case COMP_LM_HEAD:
		b->lm_head_loss(s, n, q->p, q->x, q->ints, scale, q->dx, q->dp, q->saved);
		break;
	case COMP_CLASSIFIER:
		b->classifier_loss(s, n, q->seq_in, q->p, q->x, q->ints, scale, q->dx, q->dp,
				   q->saved);
		break;
	case COMP_CONTRASTIVE: {
		int64_t w = s->hidden;
		b->contrastive_loss(n, w, q->seq_in, q->seq_in, q->c->temperature, 0, n, q->x,
				    q->x + w, scale, q->dx, q->dx + w, q->saved);
		break;
	}
	case COMP__COUNT: break;
	}
	return 0;
}

static int run_bwd(bench_t *q)
{
	const rt_backend_t *b = q->b;
	const sp_opshape_t *s = q->s;
	switch (s->type) {
	case COMP_EMBEDDING: b->embedding_bwd(s, q->n, q->saved, q->dy, q->dp); break;
	case COMP_PATCH: b->patch_bwd(s, q->n, q->p, q->saved, q->dy, q->dp); break;
	case COMP_TRANSFORMER:
		if (s->mem_seq > 0)
			return b->xblock_bwd ? b->xblock_bwd(s, NULL, q->n, q->p, q->saved, q->mem,
							     q->dy, q->dx, q->dmem, q->dp)
					     : SP_EINPUT;
		return b->tblock_bwd(s, NULL, q->n, q->p, q->saved, q->dy, q->dx, q->dp);
	case COMP_LINEAR: b->linear_bwd(s, q->n, q->p, q->saved, q->dy, q->dx, q->dp); break;
	default: break; /* losses: no separate backward */
	}
	return 0;
}

/*
 * Evicts the CPU caches before a timed run: in a training step a layer's
 * weights and inputs were last touched many layers ago, so timing it with
 * everything hot from the previous repetition would promise too much.
 */
static void flush_caches(void)
{
	enum { FLUSH_BYTES = 32 << 20 };
	static volatile unsigned char *junk;
	if (!junk)
		junk = calloc(FLUSH_BYTES, 1);
	for (size_t i = 0; junk && i < FLUSH_BYTES; i += 64)
		junk[i]++;
}

/* k calls in one direction: their time in ms into *ms; 0, or the first
 * call's error code (the layer refused the shape). */
static int run_calls(bench_t *q, int bwd, int k, double *ms)
{
	flush_caches();
	q->b->sync();
	double t0 = now_ms();
	for (int i = 0; i < k; i++) {
		int rc = (bwd ? run_bwd : run_fwd)(q);
		if (rc)
			return rc;
	}
	q->b->sync();
	*ms = now_ms() - t0;
	return 0;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Calls per run so that a run lasts at least MIN_RUN_MS (one call to fill
 * caches, one timed) into *k; 0 or the layer's error code. */
static int calibrate(bench_t *q, int bwd, int *k)
{
	double t1 = 0;
	int rc = run_calls(q, bwd, 1, &t1);
	if (rc || (rc = run_calls(q, bwd, 1, &t1)))
		return rc;
	*k = t1 >= MIN_RUN_MS		  ? 1
	     : t1 > MIN_RUN_MS / MAX_CALLS ? (int)ceil(MIN_RUN_MS / t1)
					  : MAX_CALLS;
	return 0;
}

static double median(double *t, int n)
{
	qsort(t, (size_t)n, sizeof *t, cmp_dbl);
	return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Host buffer of n values copied to the device, each from u_i =
 * mix(key ^ mix(i)): floats (range 0) uniform in [-a, a), else int32
 * u_i mod range. */
static void *dev_values(const rt_backend_t *b, int64_t n, double a, int64_t range, uint64_t key)
{
	size_t elem = range ? sizeof(int32_t) : sizeof(float);
	void *d = b->alloc(elem * (size_t)SP_MAX(n, 1)), *h = malloc(elem * (size_t)SP_MAX(n, 1));
	if (d && h) {
		for (int64_t i = 0; i < n; i++) {
			if (range)
				((int32_t *)h)[i] = (int32_t)(sp_mix64(key ^ sp_mix64((uint64_t)i)) %
							      (uint64_t)range);
			else
				((float *)h)[i] = (float)(a * (2.0 * sp_unit(key ^ sp_mix64((uint64_t)i)) - 1.0));
		}
		b->to_device(d, h, elem * (size_t)n);
	}
	free(h);
	if (!h && d) {
		b->release(d);
		d = NULL;
	}
	return d;
}

static void bench_free(bench_t *q)
{
	void *bufs[] = {q->p, q->dp, q->x, q->dx, q->y, q->dy, q->saved, q->mem, q->dmem, q->ints};
	for (int i = 0; i < SP_ARRAY_LEN(bufs); i++)
		if (bufs[i])
			q->b->release(bufs[i]);
}

/* Parameters, inputs and buffers of one shape at per-device batch n. */
static int bench_setup(bench_t *qp, const rt_backend_t *b, const sp_model_t *m, const shape_t *sh,
		       int64_t n, sp_err_t *err)
{
	const sp_opshape_t *s = &sh->s;
	const sp_component_t *c = &m->comps[sh->comp];
	bench_t q;
	memset(&q, 0, sizeof q);
	memset(qp, 0, sizeof *qp);
	q.b = b;
	q.s = s;
	q.c = c;
	q.n = (int)n;
	q.seq_in = s->type == COMP_CONTRASTIVE ? 2 : 1;
	/* element counts of the inputs x, outputs y and saved activations */
	int64_t x_w = 0, x_seq = s->seq, y_w = 0, ints = 0, ints_range = 1;
	switch (s->type) {
	case COMP_EMBEDDING: y_w = s->hidden, ints = s->seq, ints_range = s->vocab; break;
	case COMP_PATCH: x_w = s->in, y_w = s->hidden; break;
	case COMP_TRANSFORMER: x_w = y_w = s->hidden; break;
	case COMP_LINEAR: x_w = s->in, y_w = s->out; break;
	case COMP_LM_HEAD: x_w = s->hidden, ints = s->seq, ints_range = s->vocab; break;
	case COMP_CLASSIFIER:
		x_w = s->hidden, x_seq = q.seq_in, ints = 1, ints_range = s->classes;
		break;
	case COMP_CONTRASTIVE: x_w = s->hidden, x_seq = q.seq_in; break;
	case COMP__COUNT: break;
	}
	int ovf = 0;
	int64_t P = comp_layer_params(c);
	int64_t nx = sp_mul(n, sp_mul(x_seq, x_w, &ovf), &ovf);
	int64_t ny = sp_mul(n, sp_mul(s->seq, y_w, &ovf), &ovf);
	int64_t ns = sp_mul(n, op_saved_elems(s, n), &ovf);
	int64_t ni = sp_mul(n, ints, &ovf);
	int64_t nm = sp_mul(n, sp_mul(s->mem_seq, s->mem_width, &ovf), &ovf); /* decoders */
	int64_t lim = (int64_t)(SIZE_MAX / 8);
	if (ovf || P >= lim || nx >= lim || ny >= lim || ns >= lim || ni >= lim || nm >= lim)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
				  "buffers of batch %lld are too large to allocate", (long long)n);
	uint64_t key = sp_mix64(m->seed ^ (uint64_t)n);
	float *host = malloc(sizeof(float) * (size_t)SP_MAX(P, 1));
	q.p = b->alloc(sizeof(float) * (size_t)SP_MAX(P, 1));
	q.dp = b->alloc(sizeof(float) * (size_t)SP_MAX(P, 1));
	q.saved = b->alloc(sizeof(float) * (size_t)SP_MAX(ns, 1));
	int ok = host && q.p && q.dp && q.saved;
	if (ok) {
		b->layer_init(host, c, 0, m->seed);
		b->to_device(q.p, host, sizeof(float) * (size_t)P);
		b->zero(q.dp, P);
	}
	free(host);
	if (ok && x_w) {
		q.x = dev_values(b, nx, 1.0, 0, key + 1);
		q.dx = b->alloc(sizeof(float) * (size_t)SP_MAX(nx, 1));
		ok = q.x && q.dx;
		if (ok)
			b->zero(q.dx, nx);
	}
	if (ok && y_w) {
		q.y = b->alloc(sizeof(float) * (size_t)SP_MAX(ny, 1));
		q.dy = dev_values(b, ny, 0.01, 0, key + 2);
		ok = q.y && q.dy;
	}
	if (ok && ints) {
		q.ints = dev_values(b, ni, 0, ints_range, key + 3);
		ok = q.ints != NULL;
	}
	if (ok && nm) {
		q.mem = dev_values(b, nm, 1.0, 0, key + 4);
		q.dmem = b->alloc(sizeof(float) * (size_t)nm);
		ok = q.mem && q.dmem;
		if (ok)
			b->zero(q.dmem, nm);
	}
	if (!ok) {
		bench_free(&q);
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
				  "out of memory allocating buffers of batch %lld", (long long)n);
	}
	*qp = q;
	return 0;
}

/*
 * Measures every batch of one shape. The runs of all its batches are
 * interleaved (warm-up rounds, then rep 1 of every batch, rep 2, ...), so a
 * burst of other load on the machine slows one rep of several points,
 * which the median discards, rather than every rep of one point.
 */
static int measure_shape(const rt_backend_t *b, const sp_model_t *m, shape_t *sh, const opts_t *o,
			 sp_err_t *err)
{
	int nb = sh->n_batches, rc = 0;
	int dirs = comp_is_sink(sh->s.type) ? 1 : 2; /* losses: one call, no backward */
	bench_t *q = calloc((size_t)nb, sizeof *q);
	int *k = calloc((size_t)nb * 2, sizeof *k);
	double *t = calloc((size_t)nb * 2 * (size_t)o->reps, sizeof *t);
	int *order = calloc((size_t)nb * 2, sizeof *order);
	if (!q || !k || !t || !order) {
		rc = sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto out;
	}
	for (int i = 0; i < nb && !rc; i++)
		rc = bench_setup(&q[i], b, m, sh, sh->batches[i], err);
	if (rc)
		goto out;
	/* forward first everywhere: the backward reads what it saved */
	for (int i = 0; i < nb && !rc; i++)
		for (int d = 0; d < dirs && !rc; d++)
			rc = calibrate(&q[i], d, &k[2 * i + d]);
	if (rc)
		goto refused;
	/* rounds: the warm-ups, then the reps; each runs every (batch,
	 * direction) once in its own shuffled order, so that periodic load
	 * (a time slice) cannot keep hitting the same point */
	int nj = nb * dirs;
	for (int r = -o->warmup; r < o->reps; r++) {
		for (int j = 0; j < nj; j++)
			order[j] = j;
		for (int j = nj - 1; j > 0; j--) {
			int x = (int)(sp_mix64(((uint64_t)(r + o->warmup) << 20) ^ (uint64_t)j) %
				      (uint64_t)(j + 1));
			int tmp = order[j];
			order[j] = order[x];
			order[x] = tmp;
		}
		for (int j = 0; j < nj; j++) {
			int i = order[j] / dirs, d = order[j] % dirs;
			double ms = 0;
			if ((rc = run_calls(&q[i], d, k[2 * i + d], &ms)))
				goto refused;
			if (r >= 0)
				t[(2 * i + d) * o->reps + r] = ms / k[2 * i + d];
		}
	}
	for (int i = 0; i < nb; i++) {
		sh->pts[i].batch = (double)sh->batches[i];
		sh->pts[i].fwd_ms = median(&t[(2 * i) * o->reps], o->reps);
		sh->pts[i].bwd_ms = dirs == 2 ? median(&t[(2 * i + 1) * o->reps], o->reps) : 0.0;
	}
	goto out;
refused:
	/* a layer that refuses a shape the loader accepted is this program's bug */
	rc = sp_err_set(err, SP_EINTERNAL, NULL, 0, 0, NULL,
			"the %s backend's layer refused the shape (code %d)", b->name, rc);
out:
	for (int i = 0; q && i < nb; i++)
		bench_free(&q[i]);
	free(q);
	free(k);
	free(t);
	free(order);
	return rc;
}

/* ---- output ---------------------------------------------------------------- */

/* Shortest of %.15g..%.17g that reads back as x (keeps the user's numbers). */
static void put_real(FILE *f, double x)
{
	char buf[64];
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, sizeof buf, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	fputs(buf, f);
	if (!strpbrk(buf, ".eEn")) /* keep it a real */
		fputs(".0", f);
}

/* One JSON value on one line, separators ", " and ": ". */
static void put_value(FILE *f, json_t *v)
{
	const char *k;
	json_t *x;
	size_t i;
	int first = 1;
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		fputc('{', f);
		json_object_foreach(v, k, x) {
			fputs(first ? "" : ", ", f);
			first = 0;
			sp_json_str(f, k);
			fputs(": ", f);
			put_value(f, x);
		}
		fputc('}', f);
		break;
	case JSON_ARRAY:
		fputc('[', f);
		json_array_foreach(v, i, x) {
			fputs(i ? ", " : "", f);
			put_value(f, x);
		}
		fputc(']', f);
		break;
	case JSON_STRING: sp_json_str(f, json_string_value(v)); break;
	case JSON_INTEGER: fprintf(f, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
	case JSON_REAL: put_real(f, json_real_value(v)); break;
	case JSON_TRUE: fputs("true", f); break;
	case JSON_FALSE: fputs("false", f); break;
	case JSON_NULL: fputs("null", f); break;
	}
}

/* The op object's keys, in the schema's order. */
static void put_op(FILE *f, const sp_opshape_t *s)
{
	fprintf(f, "{\"type\": \"%s\"", comp_type_name(s->type));
#define K(name, field) fprintf(f, ", \"" name "\": %lld", (long long)s->field)
	switch (s->type) {
	case COMP_EMBEDDING: K("vocab", vocab); K("hidden", hidden); K("seq", seq); break;
	case COMP_PATCH: K("in", in); K("hidden", hidden); K("seq", seq); break;
	case COMP_TRANSFORMER:
		K("hidden", hidden); K("heads", heads); K("ffn", ffn); K("seq", seq);
		fprintf(f, ", \"causal\": %s", s->causal ? "true" : "false");
		if (s->mem_seq > 0) {
			K("mem_seq", mem_seq); K("mem_width", mem_width);
		}
		break;
	case COMP_LINEAR: K("in", in); K("out", out); K("seq", seq); break;
	case COMP_LM_HEAD: K("hidden", hidden); K("vocab", vocab); K("seq", seq); break;
	case COMP_CLASSIFIER: K("hidden", hidden); K("classes", classes); break;
	case COMP_CONTRASTIVE: K("hidden", hidden); break;
	case COMP__COUNT: break;
	}
#undef K
	fputc('}', f);
}

static void put_profile(FILE *f, const shape_t *v, int n)
{
	fputs("[", f);
	for (int k = 0; k < n; k++) {
		fputs(k ? ",\n    " : "\n    ", f);
		fputs("{\"op\": ", f);
		put_op(f, &v[k].s);
		fputs(",\n     \"points\": [", f);
		for (int i = 0; i < v[k].n_batches; i++)
			fprintf(f, "%s{\"batch\": %lld, \"fwd_ms\": %.6g, \"bwd_ms\": %.6g}",
				i ? ", " : "", (long long)v[k].pts[i].batch, v[k].pts[i].fwd_ms,
				v[k].pts[i].bwd_ms);
		fputs("]}", f);
	}
	fputs(n ? "\n  ]" : "]", f);
}

static void put_collectives(FILE *f, const sp_coll_point_t *v, int n)
{
	fputs("[", f);
	for (int i = 0; i < n; i++)
		fprintf(f, "%s{\"op\": \"%s\", \"ranks\": %d, \"nodes\": %d, \"bytes\": %.0f, "
			   "\"ms\": %.6g}",
			i ? ",\n    " : "\n    ", SP_COLL_NAMES[v[i].op], v[i].ranks, v[i].nodes,
			v[i].bytes, v[i].ms);
	fputs(n ? "\n  ]" : "]", f);
}

/* The section written: layer shapes (profile) or collective points. */
typedef struct {
	const shape_t *shapes;
	const sp_coll_point_t *coll;
	int n;
} section_t;

static void put_section(FILE *f, const section_t *s)
{
	if (s->coll)
		put_collectives(f, s->coll, s->n);
	else
		put_profile(f, s->shapes, s->n);
}

/* The whole output file into a memory buffer; cluster may be NULL. */
static int render(char **out, size_t *len, json_t *cluster, const section_t *sec)
{
	const char *key = sec->coll ? "collectives" : "profile";
	FILE *f = open_memstream(out, len);
	if (!f)
		return SP_ENOMEM;
	fputs("{", f);
	int first = 1, done = 0;
	const char *k;
	json_t *x;
	if (cluster) {
		json_object_foreach(cluster, k, x) {
			fputs(first ? "\n  " : ",\n  ", f);
			first = 0;
			sp_json_str(f, k);
			fputs(": ", f);
			if (!strcmp(k, key)) {
				put_section(f, sec);
				done = 1;
			} else {
				put_value(f, x);
			}
		}
	}
	if (!done) {
		fputs(first ? "\n  " : ",\n  ", f);
		fprintf(f, "\"%s\": ", key);
		put_section(f, sec);
	}
	fputs("\n}\n", f);
	return fclose(f) ? SP_ENOMEM : 0;
}

/* The cluster file as jansson objects (key order kept), after the loader's
 * own validation so a bad file gets its usual message. */
static int load_cluster_json(json_t **out, const char *path, sp_err_t *err)
{
	sp_cluster_t c;
	int rc = cluster_load(&c, path, err);
	if (rc)
		return rc;
	cluster_release(&c);
	json_error_t je;
	*out = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!*out || !json_is_object(*out)) {
		json_decref(*out);
		*out = NULL;
		return sp_err_set(err, SP_EIO, path, je.line, je.column, NULL, "%s", je.text);
	}
	return 0;
}

/* Renders sec (into cluster when not NULL), checks that a cluster loads,
 * writes o->out_path atomically. 0 or a code with err set. */
static int write_output(const opts_t *o, json_t *cluster, const section_t *sec, sp_err_t *err)
{
	char *text = NULL;
	size_t len = 0;
	int rc = 0;
	if (render(&text, &len, cluster, sec)) {
		rc = sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto out;
	}
	/* what we write must load where it is used */
	if (cluster) {
		sp_cluster_t check;
		if (cluster_parse(&check, text, len, o->out_path, err)) {
			rc = err->code = SP_EINTERNAL;
			fprintf(stderr, "spindle-profile: internal error: the cluster written "
					"does not load: ");
			goto out;
		}
		cluster_release(&check);
	}
	rc = sp_write_atomic(o->out_path, text, len, err);
out:
	free(text);
	return rc;
}

/* --collectives: every rank measures, world rank 0 writes. */
static int main_collectives(const opts_t *o, int *argc, char ***argv)
{
	sp_err_t err = {0};
	json_t *cluster = NULL;
	sp_coll_point_t *pts = NULL;
	sp_cluster_t c = {0};
	int n = 0, root = 1, status = SP_EXIT_OK;
	coll_opts_t co = {.sizes = o->sizes, .n_sizes = o->n_sizes, .reps = o->reps,
			  .warmup = o->warmup, .max_per_node = SP_MAX_DEVICES, .max_nodes = 4096,
			  .cuda = !strcmp(o->backend, "cuda")};
	/* every rank reads the cluster, so all measure the same shapes */
	if (o->cluster_path) {
		if (cluster_load(&c, o->cluster_path, &err) ||
		    load_cluster_json(&cluster, o->cluster_path, &err))
			goto fail;
		co.max_per_node = c.gpus_per_node;
		co.max_nodes = c.nodes;
	}
	double t0 = now_ms();
	if (coll_measure(&pts, &n, &root, &co, argc, argv, &err)) {
		if (root)
			fprintf(stderr, "spindle-profile: ");
		goto fail;
	}
	if (!root)
		goto done;
	printf("spindle-profile: %d collective points (%d sizes, %d warm-up + %d timed runs "
	       "each)\n",
	       n, o->n_sizes, o->warmup, o->reps);
	for (int i = 0; i < n; i++)
		printf("  %-14s ranks %d nodes %d %10.0f B %10.4f ms\n", SP_COLL_NAMES[pts[i].op],
		       pts[i].ranks, pts[i].nodes, pts[i].bytes, pts[i].ms);
	section_t sec = {.coll = pts, .n = n};
	if (write_output(o, cluster, &sec, &err))
		goto fail;
	printf("wrote %s: %s (%.2f s of measuring)\n", o->out_path,
	       cluster ? "cluster with collectives" : "collectives", (now_ms() - t0) * 1e-3);
	goto done;
fail:
	if (root) {
		sp_err_print(stderr, &err);
		status = err.code == SP_EINPUT ? SP_EXIT_INPUT : SP_EXIT_FAIL;
	}
done:
	free(pts);
	cluster_release(&c);
	json_decref(cluster);
	return status;
}

int main(int argc, char **argv)
{
	opts_t o;
	int rc = parse_args(&o, argc, argv);
	if (rc)
		return rc;
	if (o.collectives)
		return main_collectives(&o, &argc, &argv);
	sp_err_t err = {0};
	sp_model_t model = {0};
	json_t *cluster = NULL;
	shape_t *shapes = NULL;
	int n = 0, status = SP_EXIT_OK, up = 0;
	rt_comm_t comm;
	const rt_backend_t *be = backend_find(o.backend);
	if (model_load(&model, o.model_path, &err) ||
	    (o.cluster_path && load_cluster_json(&cluster, o.cluster_path, &err)))
		goto fail;
	if (collect_shapes(&model, &o, &shapes, &n)) {
		sp_err_set(&err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		goto fail;
	}
	/* decoders: only where the backend has the cross-attention block */
	for (int k = 0; k < n && !(be->xblock_fwd && be->xblock_bwd); k++)
		if (shapes[k].s.mem_seq > 0) {
			char name[128];
			opshape_str(name, sizeof name, &shapes[k].s);
			sp_err_set(&err, SP_EINPUT, NULL, 0, 0, NULL,
				   "cross-attention is not built for the %s backend (shape %s)",
				   be->name, name);
			sp_err_hint(&err, "profile this model with --backend cpu, or leave its "
					  "decoder layers to the analytic model");
			goto fail;
		}
	/* one local rank: no MPI, whatever the build links */
	if (comm_local_init(&comm)) {
		sp_err_set(&err, SP_EINTERNAL, NULL, 0, 0, NULL, "cannot set up the local comm");
		goto fail;
	}
	if (be->attach(&comm, &err)) {
		fprintf(stderr, "spindle-profile: ");
		err.code = SP_EINPUT;
		goto fail;
	}
	if (be->init(&comm, &err)) {
		if (!err.code)
			sp_err_set(&err, SP_EIO, NULL, 0, 0, NULL, "backend %s failed to start",
				   be->name);
		goto fail;
	}
	up = 1;
	double t0 = now_ms();
	printf("spindle-profile: %s, backend %s, %d shape%s, %d warm-up + %d timed runs "
	       "per point\n",
	       model.name, be->name, n, n == 1 ? "" : "s", o.warmup, o.reps);
	for (int k = 0; k < n; k++) {
		shape_t *sh = &shapes[k];
		char name[128];
		opshape_str(name, sizeof name, &sh->s);
		if (measure_shape(be, &model, sh, &o, &err)) {
			fprintf(stderr, "spindle-profile: %s: ", name);
			goto fail;
		}
		printf("  %-40s", name);
		for (int i = 0; i < sh->n_batches; i++)
			printf(" b%lld %.4g/%.4g", (long long)sh->batches[i], sh->pts[i].fwd_ms,
			       sh->pts[i].bwd_ms);
		printf(" ms\n");
		fflush(stdout);
	}
	section_t sec = {.shapes = shapes, .n = n};
	if (write_output(&o, cluster, &sec, &err))
		goto fail;
	printf("wrote %s: %s for %d shape%s (%.2f s of measuring)\n", o.out_path,
	       cluster ? "cluster with profile" : "profile", n, n == 1 ? "" : "s",
	       (now_ms() - t0) * 1e-3);
	goto done;
fail:
	sp_err_print(stderr, &err);
	status = err.code == SP_EINPUT ? SP_EXIT_INPUT : SP_EXIT_FAIL;
done:
	if (up)
		be->shutdown();
	free(shapes);
	json_decref(cluster);
	model_release(&model);
	return status;
}
