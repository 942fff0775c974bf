/*
 * main.c — spindle-run: one process per plan device (under mpirun), or one
 * process for a one-device plan. Reads the plan through the shared reader,
 * checks it matches the launch, builds the rank's state (from --init weights
 * or a checkpoint when given), trains K steps (on synthetic data, or on
 * a --data directory: dataset.c), reports per-task losses (and held-out
 * scores: eval.c) and
 * times next to the plan's prediction, and optionally writes a CSV log, a
 * measured Chrome trace, parameter dumps, checkpoints and exported weights.
 * Only this file decides exit statuses: 0 ok, 1 failure while running, 2
 * bad input (plan, options, launch, checkpoint, weights, dataset).
 *
 * Failures. Errors every rank knows of (bad input, a failed checkpoint
 * write, agreed through an all-reduce; a dataset row of the next step
 * that a rank could not read, agreed through the losses' all-reduce) end
 * every rank with the same status through MPI_Finalize. A failure only one rank sees while the others wait
 * on it (a timed-out receive, a lost collective) aborts the job. Waits
 * inside a step are bounded by the interpreter (--timeout); every blocking
 * collective outside a step (MPI_Init, start-up, losses, parameter
 * gathers, checkpoints, finalize) runs under a watchdog with the same
 * timeout (at least 30 s for MPI_Init) that prints "rank R: <what>: timed
 * out after S s ..." and ends the process with status 1, so mpirun tears
 * the job down. The watchdog also bounds a checkpoint write on rank 0:
 * --timeout must exceed it.
 *
 * Steps, each a function below, in order: parse the options, start the
 * comm, the checks each rank makes alone (plan, launch, backend,
 * checkpoint seed), agreeing on them, building the rank's state (and
 * loading weights or a checkpoint), opening rank 0's outputs, the training
 * loop (a step, the next step's rows, its losses and log line, its
 * checkpoint), the export, the final report, the held-out evaluation
 * (--eval: eval.c), and
 * finishing (or aborting when the ranks are out of step).
 *
 * Testing hooks (not for users): fault.h.
 */
#include "ckpt.h"
#include "fault.h"
#include "plan_verify.h"
#include "runtime.h"
#include "trace.h"
#include "weights.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

typedef struct {
	const char *plan_path, *backend, *comm, *trace_path, *log_path, *dump_path;
	const char *save_dir, *load_dir;
	const char *init_path, *init_map, *export_path;
	const char *data_dir, *data_check, *eval_dir, *eval_json;
	st_dtype_t export_dtype;
	int64_t steps, save_every;
	uint64_t seed;
	int seed_set, quiet, no_verify, memory_all, check_deferred;
	double timeout_s;
	fault_t fault; /* testing hooks */
} run_opts_t;

/* ---- watchdog: bounds every blocking collective outside a step ---------- */

static char wd_msg[600];
static size_t wd_len;
static double wd_seconds;

static void wd_fire(int sig)
{
	(void)sig;
	ssize_t r = write(STDERR_FILENO, wd_msg, wd_len);
	(void)r;
	_exit(1);
}

static void wd_init(double seconds)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = wd_fire;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	wd_seconds = seconds;
}

static void wd_start(double seconds)
{
	struct itimerval it;
	memset(&it, 0, sizeof it);
	it.it_value.tv_sec = (time_t)seconds;
	it.it_value.tv_usec = (suseconds_t)((seconds - (double)(time_t)seconds) * 1e6);
	if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0)
		it.it_value.tv_usec = 1;
	setitimer(ITIMER_REAL, &it, NULL);
}

static void wd_disarm(void)
{
	struct itimerval it;
	memset(&it, 0, sizeof it);
	setitimer(ITIMER_REAL, &it, NULL);
}

/* Until wd_disarm, or the next wd_arm: after the timeout the process prints
 * "rank R: <what>: timed out ..." and exits with status 1. */
__attribute__((format(printf, 2, 3))) static void wd_arm(int rank, const char *fmt, ...)
{
	wd_disarm();
	char what[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	int n = snprintf(wd_msg, sizeof wd_msg,
			 "rank %d: %s: timed out after %g s waiting for the other ranks (one "
			 "of them died or stalled)\n",
			 rank, what, wd_seconds);
	wd_len = n < 0 ? 0 : SP_MIN((size_t)n, sizeof wd_msg - 1);
	wd_start(wd_seconds);
}

/* MPI_Init waits for every rank: bounded by the timeout, but at least
 * WD_LAUNCH_S, since starting ranks on a loaded machine takes seconds. */
#define WD_LAUNCH_S 30.0
static void wd_arm_launch(void)
{
	double s = SP_MAX(wd_seconds, WD_LAUNCH_S);
	int n = snprintf(wd_msg, sizeof wd_msg,
			 "spindle-run (pid %ld): starting MPI: timed out after %g s waiting for "
			 "the other ranks (one of them died or stalled)\n",
			 (long)getpid(), s);
	wd_len = n < 0 ? 0 : SP_MIN((size_t)n, sizeof wd_msg - 1);
	wd_start(s);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mpirun -np N spindle-run PLAN.bin [options]\n"
		"       spindle-run PLAN.bin [options]        (one-device plans)\n"
		"\n"
		"  --backend cpu|cuda   compute backend (default cpu)\n"
		"  --comm nccl|mpi      how the cuda backend moves device buffers between\n"
		"                       ranks: nccl (default; one GPU per rank) or mpi\n"
		"                       (staged through host memory; ranks may share a\n"
		"                       GPU). The cpu backend always uses MPI: it accepts\n"
		"                       --comm mpi and refuses --comm nccl\n"
		"  --steps K            training steps (default 10)\n"
		"  --seed S             data and initialisation seed (default: the model's)\n"
		"  --data DIR           train on a spindle.dataset/1 directory (format:\n"
		"                       schemas/DATASET-FORMAT.md), in an epoch-wise\n"
		"                       shuffle from the seed; default: synthetic data.\n"
		"                       A reader thread reads each step's rows during the\n"
		"                       step before (two steps' rows in memory)\n"
		"  --data-check read|full  when the rows' values are checked: as each\n"
		"                       step reads them (read, default; the headers and\n"
		"                       lengths of every shard are checked at start-up), or\n"
		"                       also every row at start-up (full: reads the dataset\n"
		"                       once more)\n"
		"  --eval DIR           after training, score the model on a held-out\n"
		"                       spindle.dataset/1 directory (one forward pass): per\n"
		"                       task the loss, and accuracy beside chance\n"
		"                       (classifiers; contrastive: top-1 retrieval)\n"
		"  --eval-json FILE     also write those scores as JSON\n"
		"  --log FILE.csv       step,task,loss,step_ms,predicted_ms,param_l2,param_hash,\n"
		"                       epoch\n"
		"  --trace FILE.json    measured timeline of the last step (Chrome trace)\n"
		"  --dump-params FILE   all parameters after the last step (canonical order)\n"
		"  --save DIR           write a checkpoint at the end (and see --save-every)\n"
		"  --save-every K       also checkpoint every K steps\n"
		"  --load DIR           resume from a checkpoint (any plan of the same model)\n"
		"  --init FILE          start from the parameters in a safetensors file whose\n"
		"                       tensors are named component.layer.tensor (layer 0\n"
		"                       but for transformers; tensor names as in\n"
		"                       runtime/layers.h, e.g. vision.3.w_qkv, text.0.tok,\n"
		"                       a decoder's dec.0.w_kv);\n"
		"                       F32, BF16 or F16; every shape is checked\n"
		"  --init-map MAP.json  rename the file's tensors first: {\"their.name\":\n"
		"                       \"component.layer.tensor\", ...}; null skips one\n"
		"  --export FILE        write the parameters after the last step as a\n"
		"                       safetensors file with the names of --init\n"
		"  --export-dtype T     fp32 (default) or bf16\n"
		"  --timeout S          seconds a rank waits for a peer before aborting (300);\n"
		"                       also bounds each checkpoint write\n"
		"  --quiet              print only the summary\n"
		"  --memory-all         at the end, rank 0 also prints every other rank's\n"
		"                       memory per category beside the plan's prediction\n"
		"                       (and its zero-2 / zero-3 full-buffer lines), as it\n"
		"                       prints its own\n"
		"  --no-verify          skip the plan verifier (the planner's check that\n"
		"                       every program's transfers match, nothing deadlocks\n"
		"                       and every value is written before it is read), which\n"
		"                       every rank otherwise runs before step 1; the\n"
		"                       reader's checks of the file still run\n");
	/* two strings: one would pass the 4095 characters C17 compilers need
	 * to support (-Woverlength-strings) */
	fprintf(f,
		"  --check-deferred     test mode (cpu backend only): each deferred\n"
		"                       all-gather (plan bucket flag defer) lands in a\n"
		"                       staging buffer, and the bucket's weights (the\n"
		"                       rank's shard too) are NaN until the runtime waits\n"
		"                       for the gather, piece by piece (a piece's first\n"
		"                       layer use, STEP, before a digest, checkpoint,\n"
		"                       export or the end): a missing wait\n"
		"                       gives NaN losses and parameters. Two copies of\n"
		"                       each deferred bucket a step more; the\n"
		"                       numbers are otherwise those of a normal run\n"
		"\n"
		"exit status: 0 ok, 1 failure while running (a peer died or timed out, a\n"
		"checkpoint could not be written), 2 bad input (plan, options, launch,\n"
		"checkpoint, weights or dataset to load)\n");
}

/* --comm: a data plane this build has, and one the backend can use. The
 * CPU backend's buffers are host memory, which only MPI moves. */
static int check_comm(const run_opts_t *o)
{
	if (!o->comm)
		return 0;
	if (strcmp(o->comm, "nccl") && strcmp(o->comm, "mpi")) {
		fprintf(stderr, "spindle-run: unknown --comm '%s'\nhint: use nccl or mpi\n",
			o->comm);
		return 2;
	}
	if (!strcmp(o->comm, "mpi") && !comm_mpi_available()) {
		fprintf(stderr, "spindle-run: --comm mpi: this spindle-run was built without "
				"MPI\nhint: rebuild with -Dmpi=enabled, or omit --comm\n");
		return 2;
	}
	if (!strcmp(o->comm, "nccl") && backend_find(o->backend) == &backend_cpu) {
		fprintf(stderr, "spindle-run: --comm nccl: the cpu backend moves host buffers "
				"over MPI only\nhint: omit --comm, or use --backend cuda\n");
		return 2;
	}
	return 0;
}

/* The options whose value is a string, and where each goes (NULL: none). */
static const char **string_option(run_opts_t *o, const char *name)
{
	static const struct {
		const char *name;
		size_t at;
	} opts[] = {
		{"--backend", offsetof(run_opts_t, backend)},
		{"--comm", offsetof(run_opts_t, comm)},
		{"--trace", offsetof(run_opts_t, trace_path)},
		{"--log", offsetof(run_opts_t, log_path)},
		{"--dump-params", offsetof(run_opts_t, dump_path)},
		{"--save", offsetof(run_opts_t, save_dir)},
		{"--load", offsetof(run_opts_t, load_dir)},
		{"--init", offsetof(run_opts_t, init_path)},
		{"--init-map", offsetof(run_opts_t, init_map)},
		{"--export", offsetof(run_opts_t, export_path)},
		{"--data", offsetof(run_opts_t, data_dir)},
		{"--data-check", offsetof(run_opts_t, data_check)},
		{"--eval", offsetof(run_opts_t, eval_dir)},
		{"--eval-json", offsetof(run_opts_t, eval_json)},
	};
	for (int i = 0; i < SP_ARRAY_LEN(opts); i++)
		if (!strcmp(name, opts[i].name))
			return (const char **)(void *)((char *)o + opts[i].at);
	return NULL;
}

static int parse(run_opts_t *o, int argc, char **argv)
{
	memset(o, 0, sizeof *o);
	o->backend = "cpu";
	o->steps = 10;
	o->timeout_s = 300;
	fault_init(&o->fault);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			exit(0);
		}
		if (!strcmp(a, "--quiet")) {
			o->quiet = 1;
			continue;
		}
		if (!strcmp(a, "--no-verify")) {
			o->no_verify = 1;
			continue;
		}
		if (!strcmp(a, "--memory-all")) {
			o->memory_all = 1;
			continue;
		}
		if (!strcmp(a, "--check-deferred")) {
			o->check_deferred = 1;
			continue;
		}
		if (a[0] == '-' && a[1] == '-') {
			if (!v) {
				fprintf(stderr, "spindle-run: option '%s' needs a value\n", a);
				return 2;
			}
			char *end = NULL;
			i++;
			const char **str = string_option(o, a);
			if (str)
				*str = v;
			else if (!strcmp(a, "--export-dtype")) {
				if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
					fprintf(stderr, "spindle-run: unknown --export-dtype '%s'\n"
							"hint: use fp32 or bf16\n",
						v);
					return 2;
				}
				o->export_dtype = strcmp(v, "fp32") ? ST_BF16 : ST_F32;
			}
			else if (!strcmp(a, "--steps") || !strcmp(a, "--save-every") ||
				 !strcmp(a, "--seed") || !strcmp(a, "--fault-exit-at") ||
				 !strcmp(a, "--fault-rank")) {
				long long x = strtoll(v, &end, 10);
				if (!*v || *end || x < 0 || x > (1LL << 40)) {
					fprintf(stderr, "spindle-run: %s: invalid number '%s'\n", a, v);
					return 2;
				}
				if (!strcmp(a, "--steps"))
					o->steps = x;
				else if (!strcmp(a, "--save-every"))
					o->save_every = x;
				else if (!strcmp(a, "--seed")) {
					o->seed = (uint64_t)x;
					o->seed_set = 1;
				} else if (!strcmp(a, "--fault-exit-at"))
					o->fault.exit_step = x;
				else
					o->fault.exit_rank = (int)x;
			} else if (!strcmp(a, "--timeout")) {
				double x = strtod(v, &end);
				if (!*v || *end || !(x > 0) || x > 1e7) {
					fprintf(stderr, "spindle-run: --timeout: invalid number '%s'\n", v);
					return 2;
				}
				o->timeout_s = x;
			} else {
				fprintf(stderr, "spindle-run: unknown option '%s'\nhint: see "
						"spindle-run --help\n",
					a);
				return 2;
			}
			continue;
		}
		if (o->plan_path) {
			fprintf(stderr, "spindle-run: unexpected argument '%s'\n", a);
			return 2;
		}
		o->plan_path = a;
	}
	if (!o->plan_path) {
		usage(stderr);
		return 2;
	}
	if (o->init_map && !o->init_path) {
		fprintf(stderr, "spindle-run: --init-map renames the tensors of --init, which "
				"is missing\n");
		return 2;
	}
	if (o->init_path && o->load_dir) {
		fprintf(stderr, "spindle-run: --init and --load both give the parameters\nhint: "
				"a checkpoint (--load) resumes; --init starts afresh\n");
		return 2;
	}
	if (o->data_check && strcmp(o->data_check, "read") && strcmp(o->data_check, "full")) {
		fprintf(stderr, "spindle-run: unknown --data-check '%s'\nhint: use read or full\n",
			o->data_check);
		return 2;
	}
	if (o->eval_json && !o->eval_dir) {
		fprintf(stderr, "spindle-run: --eval-json writes the scores of --eval, which is "
				"missing\n");
		return 2;
	}
	if (o->eval_dir && strcmp(o->backend, "cpu")) {
		fprintf(stderr, "spindle-run: --eval: the %s backend does not evaluate yet\n"
				"hint: --export the weights, then evaluate them with --backend "
				"cpu --init FILE --steps 0 --eval DIR\n",
			o->backend);
		return 2;
	}
	const char *faults = getenv("SPINDLE_FAULT");
	if (faults && *faults && fault_parse(&o->fault, faults))
		return 2;
	if (!backend_find(o->backend)) {
		fprintf(stderr, "spindle-run: unknown backend '%s'\nhint: use cpu or cuda\n",
			o->backend);
		return 2;
	}
	if (o->check_deferred && backend_find(o->backend) != &backend_cpu) {
		fprintf(stderr, "spindle-run: --check-deferred is only built for the cpu "
				"backend\nhint: omit --check-deferred, or use --backend cpu\n");
		return 2;
	}
	return check_comm(o);
}

static double wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A failure the ranks may not agree on (a collective failed): abort. */
#define RUN_ECOMM CKPT_ECOMM

/* What digest_gathered fills and writes. */
typedef struct {
	double l2;
	uint64_t hash;
	const char *dump_path;
} digest_t;

static int digest_gathered(void *ctx, const void *all, size_t bytes, sp_err_t *err)
{
	digest_t *d = ctx;
	return ckpt_records_sorted(all, bytes, &d->l2, &d->hash, d->dump_path, err);
}

/* L2 norm and FNV hash of all parameters in canonical order (rank 0);
 * collective, and every rank learns whether rank 0 wrote the dump. */
static int param_digest(rt_state_t *st, rt_comm_t *c, double *l2, uint64_t *hash,
			const char *dump_path, sp_err_t *err)
{
	digest_t d = {0, 0, dump_path};
	int rc = ckpt_gather_apply(st, c, 0, digest_gathered, &d, "the parameters", err);
	*l2 = d.l2;
	*hash = d.hash;
	return rc;
}

/* What one run holds from start-up to the end; main's steps share it. */
typedef struct {
	run_opts_t o;
	rt_comm_t comm;
	const rt_backend_t *be; /* once attached: shut down at the end */
	int mpi;
	sp_plan_t plan;
	rt_opts_t ro;
	rt_state_t *st;
	rt_dataset_t *ds;
	rt_heldout_t *heldout; /* --eval */
	FILE *log;
	double *loss;
	int64_t first_step;
	double total_ms;
	sp_err_t err;
	int status; /* the exit status */
	/* quiet: the error is known to every rank and rank 0 reports it */
	int quiet, loud, save_dir_made;
} run_t;

/* How a step of main ends: go on; fail (every rank knows: finalize and
 * exit with status); or lost (the ranks are out of step: abort). */
enum { RUN_GO, RUN_FAIL, RUN_LOST };

/* MPI under mpirun, else one local rank; MPI_Init under the watchdog. */
static int start_comm(run_t *r, int *argc, char ***argv)
{
	r->mpi = comm_under_launcher() && comm_mpi_available();
	wd_init(r->o.timeout_s);
	wd_arm_launch();
	if (r->mpi ? comm_mpi_init(&r->comm, argc, argv, &r->err) : comm_local_init(&r->comm)) {
		wd_disarm();
		sp_err_print(stderr, &r->err);
		return 2;
	}
	wd_disarm();
	return 0;
}

/* The backend named by the options, on the rank's device. Returns the exit
 * status this rank wants: 0 to go on. */
static int start_backend(run_t *r)
{
	const rt_backend_t *be = backend_find(r->o.backend);
	r->comm.dataplane = r->o.comm;
	if (be->attach(&r->comm, &r->err))
		return 2;
	r->be = be;
	return be->init(&r->comm, &r->err) ? 1 : 0;
}

/* --data: the samples of steps after+1 .. after+steps, in the seed's order
 * (a resumed run continues it); step after+1's rows are read here. */
static int open_data(run_t *r, int64_t after)
{
	if (r->o.eval_dir && heldout_open(&r->heldout, r->o.eval_dir, &r->plan, r->comm.rank,
					  r->comm.nranks, r->ro.seed, &r->err))
		return r->err.code == SP_EINPUT ? 2 : 1;
	if (!r->o.data_dir)
		return 0;
	/* the dataset's steps are micro-steps (interp.c rt_step): step t is
	 * micro-steps (t-1)k+1 .. tk, read ahead together */
	int64_t k = r->plan.microbatches;
	int full = r->o.data_check && !strcmp(r->o.data_check, "full");
	if (dataset_stream(&r->ds, r->o.data_dir, &r->plan, r->comm.rank, r->comm.nranks,
			   r->ro.seed, after * k + 1, (after + r->o.steps) * k, full, &r->err))
		return r->err.code == SP_EINPUT ? 2 : 1;
	r->ro.data = r->ds;
	return 0;
}

/*
 * The planner's verifier (planner/plan_verify.h) on the plan as read: the
 * reader checks every index and range, the verifier what they mean
 * together (every RECV has its SEND, nothing deadlocks, no value is read
 * before all of it is written, gradients add up, memory fits the plan's
 * own cap). A plan that fails it was changed after planning: it would
 * train wrong numbers or hang. Returns the exit status this rank wants.
 */
static int verify_read_plan(run_t *r)
{
	const sp_plan_t *p = &r->plan;
	double cap = (p->memory_gib - p->mem_reserve_gib) * 1024.0 * 1024.0 * 1024.0;
	int rc = verify_plan(p, cap, &r->err);
	if (!rc)
		return 0;
	if (rc == SP_ENOMEM) {
		sp_err_hint(&r->err, "--no-verify skips the verification");
		return 1;
	}
	/* the verifier's "plan verification failed: ..." is about this file */
	r->err.code = SP_EINPUT;
	snprintf(r->err.file, sizeof r->err.file, "%s", r->o.plan_path);
	sp_err_hint(&r->err, "the plan was changed after spindle-plan wrote it (or another "
			     "planner made it): plan again");
	return 2;
}

/*
 * What each rank can check on its own before any collective a failed rank
 * would never join: the plan and the launch, the backend, the seed of a
 * checkpoint to resume, the dataset (headers, lengths, the first step's
 * rows: dataset_stream). Returns the exit status this rank wants: 0 to go
 * on.
 */
static int check_alone(run_t *r)
{
	const run_opts_t *o = &r->o;
	rt_comm_t *c = &r->comm;
	r->ro = (rt_opts_t){0, o->timeout_s, o->trace_path != NULL, NULL, o->check_deferred};
	int pre;
	if (plan_read(&r->plan, o->plan_path, &r->err))
		return 2;
	if (r->plan.n_devices != c->nranks) {
		sp_err_set(&r->err, SP_EINPUT, o->plan_path, 0, 0, NULL,
			   "the plan is for %d devices but %d rank%s started", r->plan.n_devices,
			   c->nranks, c->nranks == 1 ? " was" : "s were");
		if (!r->mpi && comm_under_launcher())
			sp_err_hint(&r->err, "this spindle-run was built without MPI");
		else
			sp_err_hint(&r->err, "run: mpirun -np %d spindle-run %s",
				    r->plan.n_devices, o->plan_path);
		return 2;
	}
	if (!o->no_verify && (pre = verify_read_plan(r)))
		return pre;
	/* before attaching: a plan the backend cannot run needs no device */
	if (rt_check_backend(&r->plan, backend_find(o->backend), o->plan_path, &r->err))
		return 2;
	if ((pre = start_backend(r)))
		return pre;
	r->ro.seed = o->seed_set ? o->seed : r->plan.model.seed;
	if (!o->load_dir)
		return open_data(r, 0);
	/* continue the checkpoint's data stream: its seed */
	int64_t saved = 0;
	uint64_t seed = 0;
	if (ckpt_peek(o->load_dir, &saved, &seed, &r->err))
		return r->err.code == SP_ENOMEM ? 1 : 2;
	if (o->seed_set && o->seed != seed) {
		sp_err_set(&r->err, SP_EINPUT, o->load_dir, 0, 0, NULL,
			   "the checkpoint was trained with seed %llu, not %llu",
			   (unsigned long long)seed, (unsigned long long)o->seed);
		sp_err_hint(&r->err, "omit --seed to continue with the checkpoint's seed");
		return 2;
	}
	r->ro.seed = seed;
	return open_data(r, saved);
}

/* Every rank learns which failed its own checks (pre: this rank's wish);
 * the lowest failing rank reports, the others stay quiet. */
/* who[q]: rank q's wish (0 go on, else its exit status). The lowest
 * failing rank reports, the others stay quiet; the status is pre when this
 * rank failed on its own (pre > 0), else the worst wish. Returns the
 * lowest failing rank, -1 when none failed. */
static int blame(run_t *r, const double *who, int pre)
{
	int first = -1, worst = 0;
	for (int q = 0; q < r->comm.nranks; q++)
		if (who[q] > 0) {
			if (first < 0)
				first = q;
			worst = SP_MAX(worst, (int)who[q]);
		}
	if (first >= 0) {
		r->status = pre ? pre : worst;
		r->quiet = r->comm.rank != first;
		r->loud = r->comm.rank == first;
	}
	return first;
}

static int agree_start(run_t *r, int pre)
{
	rt_comm_t *c = &r->comm;
	int rank = c->rank;
	double *who = calloc((size_t)c->nranks + 1, sizeof(double));
	if (!who) {
		sp_err_set(&r->err, RUN_ECOMM, NULL, 0, 0, NULL, "rank %d: out of memory", rank);
		return RUN_LOST;
	}
	who[rank] = pre;
	wd_arm(rank, "start-up checks");
	if (c->ops->allsum(c, who, c->nranks)) {
		free(who);
		sp_err_set(&r->err, RUN_ECOMM, NULL, 0, 0, NULL,
			   "rank %d: start-up all-reduce failed", rank);
		return RUN_LOST;
	}
	wd_disarm();
	int first = blame(r, who, pre);
	free(who);
	if (first < 0)
		return RUN_GO;
	if (rank == 0 && first != 0)
		fprintf(stderr, "spindle-run: rank %d could not start (its message follows or "
				"precedes this one)\n",
			first);
	return RUN_FAIL;
}

/* The rank's parameters, buffers and groups; then the weights to start
 * from, or the checkpoint to resume. */
static int build_state(run_t *r)
{
	int rank = r->comm.rank;
	wd_arm(rank, "setting up the plan's communicators, buffers and groups");
	if ((r->be->prepare && r->be->prepare(&r->comm, &r->plan, &r->err)) ||
	    rt_create(&r->st, &r->plan, r->be, &r->comm, &r->ro, &r->err)) {
		r->status = r->err.code == SP_EINPUT ? 2 : 1;
		return RUN_FAIL;
	}
	r->first_step = 1;
	if (r->o.init_path) {
		wd_arm(rank, "loading the weights '%s'", r->o.init_path);
		if (weights_init(r->st, &r->comm, &r->plan, r->o.init_path, r->o.init_map,
				 &r->err)) {
			if (r->err.code == RUN_ECOMM)
				return RUN_LOST;
			r->status = r->err.code == SP_ENOMEM || r->err.code == SP_EIO ? 1 : 2;
			return RUN_FAIL;
		}
		wd_disarm();
	}
	if (!r->o.load_dir)
		return RUN_GO;
	wd_arm(rank, "loading the checkpoint '%s'", r->o.load_dir);
	if (ckpt_load(r->st, &r->comm, &r->plan, r->o.load_dir, &r->first_step, &r->err)) {
		if (r->err.code == RUN_ECOMM)
			return RUN_LOST;
		r->status = r->err.code == SP_ENOMEM ? 1 : 2;
		return RUN_FAIL;
	}
	r->first_step++;
	return RUN_GO;
}

/* Rank 0's outputs (checkpoint directory, export path, CSV log; the trace,
 * parameter dump and scores it writes at the end checked), agreed by
 * every rank. */
static int open_outputs(run_t *r)
{
	const run_opts_t *o = &r->o;
	rt_comm_t *c = &r->comm;
	double bad = 0;
	if (c->rank == 0 && o->save_dir && ckpt_check_dir(o->save_dir, &r->save_dir_made, &r->err))
		bad = 1;
	if (c->rank == 0 && !bad && o->export_path && weights_check_path(o->export_path, &r->err))
		bad = 1;
	/* the files rank 0 writes after the last step: refused now, not then */
	const char *late[] = {o->trace_path, o->dump_path, o->eval_json};
	for (int i = 0; c->rank == 0 && !bad && i < 3; i++)
		if (late[i] && sp_output_check(late[i], &r->err))
			bad = 1;
	if (c->rank == 0 && !bad && o->log_path) {
		r->log = fopen(o->log_path, "w");
		if (!r->log) {
			sp_err_set(&r->err, SP_EINPUT, o->log_path, 0, 0, NULL,
				   "cannot open for writing: %s", strerror(errno));
			bad = 1;
		} else {
			fprintf(r->log,
				"step,task,loss,step_ms,predicted_ms,param_l2,param_hash,epoch\n");
		}
	}
	wd_arm(c->rank, "start-up");
	if (c->ops->allsum(c, &bad, 1)) {
		sp_err_set(&r->err, RUN_ECOMM, NULL, 0, 0, NULL,
			   "rank %d: start-up all-reduce failed", c->rank);
		return RUN_LOST;
	}
	wd_disarm();
	if (bad > 0) {
		r->status = 2;
		return RUN_FAIL;
	}
	return RUN_GO;
}

/* Rank R's memory line (MiB), its measured categories beside the plan's
 * prediction for device R: print_start's for rank 0. */
static void print_memory(const sp_plan_t *p, int rank, const double *act)
{
	int64_t pred[MEM__COUNT];
	plan_memory(p, rank, pred);
	printf("rank %d memory (MiB): params+state %.2f, activations %.2f, buffers %.2f, "
	       "work %.2f; plan predicted %.2f, %.2f, %.2f, %.2f in %s\n",
	       rank, act[0] / 1048576.0, act[1] / 1048576.0, act[2] / 1048576.0,
	       act[3] / 1048576.0, pred[0] / 1048576.0, pred[1] / 1048576.0,
	       pred[2] / 1048576.0, pred[3] / 1048576.0, dtype_name(p->model.dtype));
}

/* Rank 0: what runs where, and its memory next to the plan's prediction. */
static void print_start(const run_t *r)
{
	const sp_plan_t *p = &r->plan;
	int64_t act[MEM__COUNT];
	double a[MEM__COUNT];
	rt_memory(r->st, act);
	for (int c = 0; c < MEM__COUNT; c++)
		a[c] = (double)act[c];
	printf("spindle-run: plan '%s' (%s, %s) on %d rank%s, backend %s\n", r->o.plan_path,
	       p->model.name, p->algo, r->comm.nranks, r->comm.nranks > 1 ? "s" : "",
	       r->be->name);
	if (r->o.load_dir)
		printf("resuming after step %lld from '%s'\n", (long long)(r->first_step - 1),
		       r->o.load_dir);
	print_memory(p, 0, a);
	if (r->ds)
		printf("rank 0 data: %lld bytes of rows resident (the rows it reads for two "
		       "steps; a thread reads the next step's during each step)\n",
		       (long long)dataset_resident(r->ds));
}

/* After a failed gather of the parameters (digest, export): lost when the
 * ranks are out of step, else a failure rank 0 reports. */
static int gather_failed(run_t *r)
{
	if (r->err.code == RUN_ECOMM)
		return RUN_LOST;
	r->quiet = r->comm.rank != 0;
	r->status = 1;
	return RUN_FAIL;
}

/* Task i's epoch at step t: its first micro-step's (the dataset's steps
 * are micro-steps: interp.c rt_step). */
static int64_t epoch_of(const run_t *r, int i, int64_t t)
{
	return dataset_epoch(r->ds, i, (t - 1) * r->plan.microbatches + 1);
}

/* The epoch of step t of the task that has been through its samples least
 * often (tasks have their own epochs: dataset.c). */
static int64_t min_epoch(const run_t *r, int64_t t)
{
	int64_t e = INT64_MAX;
	for (int i = 0; i < r->plan.model.n_tasks; i++)
		e = SP_MIN(e, epoch_of(r, i, t));
	return e;
}

/* Task i's mean loss per sample at step t: the loss sums of its k_i
 * micro-batches over the step batch (the mean over the micro-steps). */
static double mean_loss(const run_t *r, int i)
{
	const sp_plan_t *p = &r->plan;
	return r->loss[i] / ((double)p->model.tasks[i].batch * plan_task_k(p, i));
}

/* Rank 0: step t's line on stdout and in the CSV log. */
static void print_step(const run_t *r, int64_t t, double ms, double l2, uint64_t h)
{
	const sp_plan_t *p = &r->plan;
	int T = p->model.n_tasks;
	if (!r->o.quiet) {
		printf("step %3lld  %8.2f ms (predicted %.2f)  ", (long long)t, ms,
		       p->cert.iteration_ms);
		if (r->ds) /* every task has seen all its samples this many times */
			printf("epoch %lld  ", (long long)min_epoch(r, t));
		printf("loss");
		for (int i = 0; i < T; i++)
			printf("  %s %.4f", p->model.tasks[i].name, mean_loss(r, i));
		printf("\n");
	}
	for (int i = 0; r->log && i < T; i++)
		fprintf(r->log, "%lld,%s,%.9g,%.3f,%.3f,%.9g,%016llx,%lld\n", (long long)t,
			p->model.tasks[i].name, mean_loss(r, i), ms, p->cert.iteration_ms, l2,
			(unsigned long long)h, r->ds ? (long long)epoch_of(r, i, t) : 0LL);
	if (r->log)
		fflush(r->log);
}

/* The checkpoint of step t. */
static int save_step(run_t *r, int64_t t)
{
	int rank = r->comm.rank;
	wd_arm(rank, "step %lld: completing the deferred all-gathers", (long long)t);
	if (rt_settle(r->st, &r->err))
		return RUN_LOST;
	wd_arm(rank, "step %lld: writing the checkpoint to '%s'", (long long)t, r->o.save_dir);
	if (ckpt_save(r->st, &r->comm, &r->plan, r->o.save_dir, t, r->ro.seed, &r->o.fault.ckpt,
		      &r->err)) {
		if (r->err.code == RUN_ECOMM)
			return RUN_LOST;
		r->quiet = rank != 0;
		r->status = r->err.code == SP_EINPUT ? 2 : 1;
		return RUN_FAIL;
	}
	wd_disarm();
	r->save_dir_made = 0;
	return RUN_GO;
}

/* After the losses of step t are summed: the rows of step t + 1 could not
 * be read on some rank (loss[T + q] > 0: rank q's exit status). Every rank
 * stops after step t; the lowest such rank reports. */
static int data_failed(run_t *r)
{
	return blame(r, r->loss + r->plan.model.n_tasks, 0) < 0 ? RUN_GO : RUN_FAIL;
}

/* Training step t: the rank's program, the rows of step t + 1 (read during
 * it), the summed losses with each rank's read status, the parameter digest
 * (for the log or the last step's dump), the report, a checkpoint; then
 * a stop when a rank could not read step t + 1. */
static int train_step(run_t *r, int64_t t)
{
	const run_opts_t *o = &r->o;
	rt_comm_t *c = &r->comm;
	int rank = c->rank, T = r->plan.model.n_tasks;
	for (int i = 0; i < T + c->nranks; i++)
		r->loss[i] = 0;
	fault_at_step(&o->fault, rank, t, 0);
	double t0 = wall_ms();
	if (rt_step(r->st, t, r->loss, &r->err))
		return RUN_LOST;
	fault_at_step(&o->fault, rank, t, 1);
	wd_arm(rank, "step %lld: reading the rows of step %lld", (long long)t, (long long)t + 1);
	if (dataset_next(r->ds, t * r->plan.microbatches + 1, &r->err))
		r->loss[T + rank] = r->err.code == SP_EINPUT ? 2 : 1;
	wd_arm(rank, "step %lld: summing the losses", (long long)t);
	if (c->ops->allsum(c, r->loss, T + c->nranks)) {
		sp_err_set(&r->err, RUN_ECOMM, NULL, 0, 0, NULL,
			   "rank %d: step %lld: summing the losses failed", rank, (long long)t);
		return RUN_LOST;
	}
	double ms = wall_ms() - t0;
	r->total_ms += ms;
	double l2 = 0;
	uint64_t h = 0;
	int last = t == r->first_step + o->steps - 1;
	wd_arm(rank, "step %lld: gathering the parameters", (long long)t);
	if ((o->log_path || (last && o->dump_path)) && rt_settle(r->st, &r->err))
		return RUN_LOST; /* the deferred all-gathers: the weights whole */
	if ((o->log_path || (last && o->dump_path)) &&
	    param_digest(r->st, c, &l2, &h, last ? o->dump_path : NULL, &r->err)) {
		return gather_failed(r);
	}
	wd_disarm();
	if (rank == 0)
		print_step(r, t, ms, l2, h);
	int out = RUN_GO;
	if (o->save_dir && ((o->save_every > 0 && t % o->save_every == 0) || last))
		out = save_step(r, t);
	return out == RUN_GO ? data_failed(r) : out;
}

static int train(run_t *r)
{
	/* the tasks' losses, then each rank's status reading the next step */
	r->loss = calloc((size_t)(r->plan.model.n_tasks + r->comm.nranks) + 1, sizeof(double));
	if (!r->loss) {
		sp_err_set(&r->err, SP_ENOMEM, NULL, 0, 0, NULL, "rank %d: out of memory",
			   r->comm.rank);
		return RUN_LOST;
	}
	int out = RUN_GO;
	for (int64_t t = r->first_step; out == RUN_GO && t < r->first_step + r->o.steps; t++)
		out = train_step(r, t);
	/* the last step's deferred all-gathers, before the export and the end */
	wd_arm(r->comm.rank, "completing the deferred all-gathers");
	if (out == RUN_GO && rt_settle(r->st, &r->err))
		return RUN_LOST;
	wd_disarm();
	return out;
}

/* The parameters after the last step, as --export asks. */
static int export_end(run_t *r)
{
	int rank = r->comm.rank;
	if (!r->o.export_path)
		return RUN_GO;
	wd_arm(rank, "writing the weights to '%s'", r->o.export_path);
	if (weights_export(r->st, &r->comm, &r->plan, r->o.export_path, r->o.export_dtype,
			   r->first_step + r->o.steps - 1, &r->err)) {
		return gather_failed(r);
	}
	wd_disarm();
	return RUN_GO;
}

/* Rank R's zero-2 and zero-3 full-buffer lines from z (has zero-2, most,
 * peak, pool; has zero-3, most, peak, pool, whole; bytes). */
static void print_full_buffers(int rank, const double *z)
{
	const double M = 1048576.0;
	if (z[0] > 0)
		printf("rank %d zero-2 full gradients (MiB): most live %.2f, walk's peak %.2f, "
		       "pool %.2f\n",
		       rank, z[1] / M, z[2] / M, z[3] / M);
	if (z[4] > 0)
		printf("rank %d zero-3 full weights (MiB): most live %.2f, walk's peak %.2f, "
		       "pool %.2f, whole buckets %.2f\n",
		       rank, z[5] / M, z[6] / M, z[7] / M, z[8] / M);
}

/* The rank's figures print_full_buffers prints, into z[9]. */
static void full_buffers(const rt_state_t *st, double *z)
{
	int64_t most, peak, pool, whole;
	memset(z, 0, 9 * sizeof *z);
	if (rt_zero2_peak(st, &most, &peak, &pool)) {
		z[0] = 1;
		z[1] = (double)most, z[2] = (double)peak, z[3] = (double)pool;
	}
	if (rt_zero3_peak(st, &most, &peak, &pool, &whole)) {
		z[4] = 1;
		z[5] = (double)most, z[6] = (double)peak, z[7] = (double)pool, z[8] = (double)whole;
	}
}

/* Per rank: 4 categories, then print_full_buffers' 9 figures. */
#define MEM_ALL_N (MEM__COUNT + 9)

/* --memory-all: every rank's figures, summed into rank slots on every rank
 * (collective), printed by rank 0 for the ranks after it. */
static int memory_all(run_t *r)
{
	int n = r->comm.nranks, rank = r->comm.rank;
	double *v = calloc((size_t)n * MEM_ALL_N, sizeof(double));
	if (!v) {
		sp_err_set(&r->err, SP_ENOMEM, NULL, 0, 0, NULL, "rank %d: out of memory", rank);
		return RUN_LOST;
	}
	double *mine = v + (size_t)rank * MEM_ALL_N;
	int64_t act[MEM__COUNT];
	rt_memory(r->st, act);
	for (int c = 0; c < MEM__COUNT; c++)
		mine[c] = (double)act[c];
	full_buffers(r->st, mine + MEM__COUNT);
	wd_arm(rank, "gathering every rank's memory (--memory-all)");
	if (r->comm.ops->allsum(&r->comm, v, n * MEM_ALL_N)) {
		wd_disarm();
		free(v);
		sp_err_set(&r->err, RUN_ECOMM, NULL, 0, 0, NULL,
			   "rank %d: gathering every rank's memory failed", rank);
		return RUN_LOST;
	}
	wd_disarm();
	/* Under --quiet rank 0's own line (print_start's) was not printed. */
	if (rank == 0 && r->o.quiet)
		print_memory(&r->plan, 0, v);
	for (int q = 1; rank == 0 && q < n; q++) {
		print_memory(&r->plan, q, v + (size_t)q * MEM_ALL_N);
		print_full_buffers(q, v + (size_t)q * MEM_ALL_N + MEM__COUNT);
	}
	free(v);
	return RUN_GO;
}

/* The summary line, and the measured trace of the last step. */
static int report_end(run_t *r)
{
	int64_t K = r->o.steps;
	if (r->comm.rank == 0)
		printf("spindle-run: %lld steps, %.2f ms per step measured, %.2f ms predicted\n",
		       (long long)K, K ? r->total_ms / (double)K : 0, r->plan.cert.iteration_ms);
	double z[9];
	full_buffers(r->st, z);
	if (r->comm.rank == 0)
		print_full_buffers(0, z);
	int64_t later, settled;
	int dbk, dpc;
	rt_deferred(r->st, &later, &settled);
	rt_defer_shape(r->st, &dbk, &dpc);
	if (r->comm.rank == 0 && later + settled > 0)
		printf("rank 0 deferred all-gathers: %lld completed in the next step, %lld "
		       "before a digest, a checkpoint or the end (pieces; %d buckets in %d "
		       "pieces)\n",
		       (long long)later, (long long)settled, dbk, dpc);
	if (r->o.memory_all && r->comm.nranks > 1 && memory_all(r) != RUN_GO)
		return RUN_LOST;
	wd_arm(r->comm.rank, "gathering the trace");
	if (r->o.trace_path &&
	    trace_write_measured(r->st, &r->comm, &r->plan, r->o.trace_path, &r->err)) {
		r->status = 1;
		return RUN_FAIL;
	}
	return RUN_GO;
}

/* --eval: the held-out scores, printed and written by rank 0. */
static int eval_end(run_t *r)
{
	int rank = r->comm.rank;
	if (!r->heldout)
		return RUN_GO;
	if (heldout_run(r->heldout, r->st, &r->comm, &r->err))
		return RUN_LOST;
	wd_arm(rank, "summing the held-out scores of '%s'", r->o.eval_dir);
	if (heldout_sum(r->heldout, &r->comm, &r->err))
		return RUN_LOST;
	wd_disarm();
	if (rank != 0)
		return RUN_GO;
	heldout_print(r->heldout, &r->plan, stdout);
	if (r->o.eval_json && heldout_write_json(r->heldout, &r->plan, r->o.eval_json, &r->err)) {
		r->status = 1;
		return RUN_FAIL;
	}
	return RUN_GO;
}

/* The ranks are out of step: finalizing could wait forever, so abort. */
static int lose(run_t *r)
{
	wd_disarm();
	if (r->err.code)
		sp_err_print(stderr, &r->err);
	fflush(stdout);
	fflush(stderr);
	if (r->log)
		fclose(r->log);
	r->comm.ops->abort(&r->comm, 1);
	return 1;
}

/* Reports a failure every rank knows of (out == RUN_FAIL), releases
 * everything and finalizes the comm. Returns the exit status. */
static int finish(run_t *r, int out)
{
	int rank = r->comm.rank;
	if (out == RUN_FAIL) {
		if (r->err.code && !r->quiet && (rank == 0 || r->status != 2 || r->loud))
			sp_err_print(stderr, &r->err);
		if (r->status == 0)
			r->status = 1;
		if (r->save_dir_made)
			rmdir(r->o.save_dir); /* only when still empty */
	}
	if (r->log)
		fclose(r->log);
	free(r->loss);
	if (out == RUN_FAIL) {
		/* deferred all-gathers still in flight (a step failed after the
		 * one that started them; every rank knows and comes here): they
		 * complete before their buffers go; lost ranks abort instead */
		sp_err_t e = {0};
		wd_arm(rank, "finishing (deferred all-gathers in flight)");
		rt_settle_pending(r->st, &e);
		wd_disarm();
	}
	rt_free(r->st);
	dataset_free(r->ds);
	heldout_free(r->heldout);
	plan_release(&r->plan);
	if (r->be)
		r->be->shutdown();
	wd_arm(rank, "finishing (MPI_Finalize)");
	r->comm.ops->finalize(&r->comm);
	wd_disarm();
	return r->status;
}

int main(int argc, char **argv)
{
	static run_t r; /* zero: nothing held yet */
	int status = parse(&r.o, argc, argv);
	if (!status)
		status = start_comm(&r, &argc, &argv);
	if (status)
		return status;
	int out = agree_start(&r, check_alone(&r));
	if (out == RUN_GO)
		out = build_state(&r);
	if (out == RUN_GO)
		out = open_outputs(&r);
	if (out == RUN_GO) {
		if (r.comm.rank == 0 && !r.o.quiet)
			print_start(&r);
		out = train(&r);
	}
	if (out == RUN_GO)
		out = export_end(&r);
	if (out == RUN_GO)
		out = report_end(&r);
	if (out == RUN_GO)
		out = eval_end(&r);
	if (out == RUN_LOST)
		return lose(&r);
	return finish(&r, out);
}
