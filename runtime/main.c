/*
 * main.c — spindle-run: one process per plan device (under mpirun), or one
 * process for a one-device plan. Reads the plan through the shared reader,
 * checks it matches the launch, builds the rank's state, trains K steps,
 * reports per-task losses and times next to the plan's prediction, and
 * optionally writes a CSV log, a measured Chrome trace, parameter dumps and
 * checkpoints. Only this file decides exit statuses: 0 ok, 1 failure while
 * running, 2 bad input (plan, options, launch, checkpoint).
 *
 * Failures. Errors every rank knows of (bad input, a failed checkpoint
 * write, agreed through an all-reduce) end every rank with the same status
 * through MPI_Finalize. A failure only one rank sees while the others wait
 * on it (a timed-out receive, a lost collective) aborts the job. Waits
 * inside a step are bounded by the interpreter (--timeout); every blocking
 * collective outside a step (MPI_Init, start-up, losses, parameter
 * gathers, checkpoints, finalize) runs under a watchdog with the same
 * timeout (at least 30 s for MPI_Init) that prints "rank R: <what>: timed
 * out after S s ..." and ends the process with status 1, so mpirun tears
 * the job down. The watchdog also bounds a checkpoint write on rank 0:
 * --timeout must exceed it.
 *
 * Testing hooks (not for users): --fault-exit-at STEP [--fault-rank R]
 * exits with status 3 at the start of STEP; the environment variable
 * SPINDLE_FAULT holds comma-separated faults:
 *   kill-in-save:STEP         rank 0 raises SIGKILL in the save of STEP,
 *                             after writing the snapshot, before publishing
 *   kill-in-save:STEP:latest  the same after the snapshot's rename, before
 *                             LATEST is replaced
 *   enospc-in-save:BYTES      checkpoint writes fail with ENOSPC after BYTES
 *                             bytes of each save
 *   stop-at:STEP:RANK[:end]   rank RANK raises SIGSTOP at the start of STEP
 *                             (with :end, after its program, before the
 *                             losses are summed)
 */
#include "ckpt.h"
#include "runtime.h"
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef struct {
	const char *plan_path, *backend, *trace_path, *log_path, *dump_path;
	const char *save_dir, *load_dir;
	int64_t steps, save_every;
	uint64_t seed;
	int seed_set, quiet;
	double timeout_s;
	int64_t die_at_step; /* testing hook: --fault-exit-at STEP (rank given by --fault-rank) */
	int fault_rank;
	ckpt_fault_t ckpt_fault; /* testing hooks from SPINDLE_FAULT */
	int64_t stop_step;
	int stop_rank, stop_end;
} run_opts_t;

/* Parses SPINDLE_FAULT (see the top of this file). */
static int parse_faults(run_opts_t *o, const char *spec)
{
	char buf[512];
	if (strlen(spec) >= sizeof buf)
		goto bad;
	snprintf(buf, sizeof buf, "%s", spec);
	for (char *save = NULL, *f = strtok_r(buf, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
		long long a = 0, b = 0;
		int n = 0;
		if (sscanf(f, "kill-in-save:%lld%n", &a, &n) == 1 && a > 0 && !f[n]) {
			o->ckpt_fault.kill_step = a;
			o->ckpt_fault.kill_latest = 0;
		} else if (sscanf(f, "kill-in-save:%lld:latest%n", &a, &n) == 1 && a > 0 && !f[n]) {
			o->ckpt_fault.kill_step = a;
			o->ckpt_fault.kill_latest = 1;
		} else if (sscanf(f, "enospc-in-save:%lld%n", &a, &n) == 1 && a > 0 && !f[n]) {
			o->ckpt_fault.enospc_after = a;
		} else if (sscanf(f, "stop-at:%lld:%lld%n", &a, &b, &n) == 2 && a > 0 && b >= 0 &&
			   b < 1 << 20 && (!f[n] || !strcmp(f + n, ":end"))) {
			o->stop_step = a;
			o->stop_rank = (int)b;
			o->stop_end = f[n] != 0;
		} else {
			goto bad;
		}
	}
	return 0;
bad:
	fprintf(stderr, "spindle-run: SPINDLE_FAULT: invalid fault '%s'\nhint: use "
			"kill-in-save:STEP[:latest], enospc-in-save:BYTES or stop-at:STEP:RANK[:end] "
			"(testing hooks)\n",
		spec);
	return 2;
}

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
		"  --steps K            training steps (default 10)\n"
		"  --seed S             data and initialisation seed (default: the model's)\n"
		"  --log FILE.csv       step,task,loss,step_ms,predicted_ms,param_l2,param_hash\n"
		"  --trace FILE.json    measured timeline of the last step (Chrome trace)\n"
		"  --dump-params FILE   all parameters after the last step (canonical order)\n"
		"  --save DIR           write a checkpoint at the end (and see --save-every)\n"
		"  --save-every K       also checkpoint every K steps\n"
		"  --load DIR           resume from a checkpoint (any plan of the same model)\n"
		"  --timeout S          seconds a rank waits for a peer before aborting (300);\n"
		"                       also bounds each checkpoint write\n"
		"  --quiet              print only the summary\n"
		"\n"
		"exit status: 0 ok, 1 failure while running (a peer died or timed out, a\n"
		"checkpoint could not be written), 2 bad input (plan, options, launch,\n"
		"checkpoint to load)\n");
}

static int parse(run_opts_t *o, int argc, char **argv)
{
	memset(o, 0, sizeof *o);
	o->backend = "cpu";
	o->steps = 10;
	o->timeout_s = 300;
	o->fault_rank = -1;
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
		if (a[0] == '-' && a[1] == '-') {
			if (!v) {
				fprintf(stderr, "spindle-run: option '%s' needs a value\n", a);
				return 2;
			}
			char *end = NULL;
			i++;
			if (!strcmp(a, "--backend"))
				o->backend = v;
			else if (!strcmp(a, "--trace"))
				o->trace_path = v;
			else if (!strcmp(a, "--log"))
				o->log_path = v;
			else if (!strcmp(a, "--dump-params"))
				o->dump_path = v;
			else if (!strcmp(a, "--save"))
				o->save_dir = v;
			else if (!strcmp(a, "--load"))
				o->load_dir = v;
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
					o->die_at_step = x;
				else
					o->fault_rank = (int)x;
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
	const char *faults = getenv("SPINDLE_FAULT");
	if (faults && *faults && parse_faults(o, faults))
		return 2;
	if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
		fprintf(stderr, "spindle-run: unknown backend '%s'\nhint: use cpu or cuda\n",
			o->backend);
		return 2;
	}
	return 0;
}

static double wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void fault_stop(int rank, int64_t t, const char *where)
{
	fprintf(stderr, "spindle-run: rank %d: stopping at %s of step %lld (fault injection)\n",
		rank, where, (long long)t);
	fflush(stderr);
	raise(SIGSTOP);
}

/* A failure the ranks may not agree on (a collective failed): abort. */
#define RUN_ECOMM CKPT_ECOMM

/* L2 norm and FNV hash of all parameters in canonical order (rank 0);
 * collective, and every rank learns whether rank 0 wrote the dump. */
static int param_digest(rt_state_t *st, rt_comm_t *c, double *l2, uint64_t *hash,
			const char *dump_path, sp_err_t *err)
{
	void *mine = NULL, *all = NULL;
	size_t bytes = 0, *sizes = NULL;
	double bad = 0;
	if (rt_pack_owned(st, 0, &mine, &bytes)) {
		sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "rank %d: out of memory", c->rank);
		mine = NULL;
		bytes = 0;
		bad = 1;
	}
	int comm = c->gather(c, mine, bytes, &all, &sizes);
	free(mine);
	if (comm)
		return sp_err_set(err, RUN_ECOMM, NULL, 0, 0, NULL,
				  "rank %d: gathering parameters failed", c->rank);
	if (c->rank == 0 && !bad)
		bad = ckpt_records_sorted(all, sizes, c->nranks, l2, hash, dump_path, err) ? 1 : 0;
	free(all);
	free(sizes);
	if (c->allsum(c, &bad, 1))
		return sp_err_set(err, RUN_ECOMM, NULL, 0, 0, NULL,
				  "rank %d: gathering parameters failed", c->rank);
	if (bad > 0)
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "gathering or writing the parameters failed on rank 0");
	return 0;
}

int main(int argc, char **argv)
{
	run_opts_t o;
	int status = parse(&o, argc, argv);
	if (status)
		return status;
	sp_err_t err = {0};
	rt_backend_t be;
	memset(&be, 0, sizeof be);
	int mpi = comm_under_launcher() && comm_mpi_available();
	wd_init(o.timeout_s);
	wd_arm_launch();
	if (mpi ? comm_mpi_init(&be.comm, &argc, &argv, &err) : comm_local_init(&be.comm)) {
		wd_disarm();
		sp_err_print(stderr, &err);
		return 2;
	}
	wd_disarm();
	rt_comm_t *c = &be.comm;
	int rank = c->rank;
	sp_plan_t plan = {0};
	rt_state_t *st = NULL;
	FILE *log = NULL;
	double *loss = NULL;
	/* quiet: the error is known to every rank and rank 0 reports it */
	int quiet = 0, loud = 0, save_dir_made = 0;
	/* start-up: each rank checks what it can on its own, then all agree
	 * before the first collective a failed rank would never join */
	int pre = 0; /* the exit status this rank wants: 0 to go on */
	rt_opts_t ro = {0, o.timeout_s, o.trace_path != NULL};
	if (plan_read(&plan, o.plan_path, &err)) {
		pre = 2;
	} else if (plan.n_devices != c->nranks) {
		sp_err_set(&err, SP_EINPUT, o.plan_path, 0, 0, NULL,
			   "the plan is for %d devices but %d rank%s started", plan.n_devices,
			   c->nranks, c->nranks == 1 ? " was" : "s were");
		if (!mpi && comm_under_launcher())
			sp_err_hint(&err, "this spindle-run was built without MPI");
		else
			sp_err_hint(&err, "run: mpirun -np %d spindle-run %s", plan.n_devices,
				    o.plan_path);
		pre = 2;
	}
	if (!pre) {
		if (!strcmp(o.backend, "cuda")) {
			if (backend_cuda(&be, &err))
				pre = 2;
		} else {
			backend_cpu(&be);
		}
	}
	if (!pre && be.init(&be, rank, &err))
		pre = 1;
	if (!pre) {
		ro.seed = o.seed_set ? o.seed : plan.model.seed;
		if (o.load_dir) {
			/* continue the checkpoint's data stream: its seed */
			int64_t saved = 0;
			uint64_t seed = 0;
			if (ckpt_peek(o.load_dir, &saved, &seed, &err)) {
				pre = err.code == SP_ENOMEM ? 1 : 2;
			} else if (o.seed_set && o.seed != seed) {
				sp_err_set(&err, SP_EINPUT, o.load_dir, 0, 0, NULL,
					   "the checkpoint was trained with seed %llu, not %llu",
					   (unsigned long long)seed, (unsigned long long)o.seed);
				sp_err_hint(&err,
					    "omit --seed to continue with the checkpoint's seed");
				pre = 2;
			} else {
				ro.seed = seed;
			}
		}
	}
	{
		/* who failed: the lowest failing rank reports, the others stay quiet */
		double *who = calloc((size_t)c->nranks + 1, sizeof(double));
		if (!who) {
			sp_err_set(&err, RUN_ECOMM, NULL, 0, 0, NULL, "rank %d: out of memory", rank);
			goto lost;
		}
		who[rank] = pre;
		wd_arm(rank, "start-up checks");
		if (c->allsum(c, who, c->nranks)) {
			free(who);
			sp_err_set(&err, RUN_ECOMM, NULL, 0, 0, NULL,
				   "rank %d: start-up all-reduce failed", rank);
			goto lost;
		}
		wd_disarm();
		int first = -1, worst = 0;
		for (int r = 0; r < c->nranks; r++)
			if (who[r] > 0) {
				if (first < 0)
					first = r;
				worst = SP_MAX(worst, (int)who[r]);
			}
		free(who);
		if (first >= 0) {
			status = pre ? pre : worst;
			quiet = rank != first;
			loud = rank == first;
			if (rank == 0 && first != 0)
				fprintf(stderr, "spindle-run: rank %d could not start (its message "
						"follows or precedes this one)\n",
					first);
			goto fail;
		}
	}
	wd_arm(rank, "setting up the plan's buffers and groups");
	if (rt_create(&st, &plan, &be, &ro, &err)) {
		status = err.code == SP_EINPUT ? 2 : 1;
		goto fail;
	}
	int64_t first_step = 1;
	if (o.load_dir) {
		wd_arm(rank, "loading the checkpoint '%s'", o.load_dir);
		if (ckpt_load(st, c, &plan, o.load_dir, &first_step, &err)) {
			if (err.code == RUN_ECOMM)
				goto lost;
			status = err.code == SP_ENOMEM ? 1 : 2;
			goto fail;
		}
		first_step++;
	}
	/* start-up checks of rank 0's outputs, agreed by every rank */
	double bad = 0;
	if (rank == 0 && o.save_dir && ckpt_check_dir(o.save_dir, &save_dir_made, &err))
		bad = 1;
	if (rank == 0 && !bad && o.log_path) {
		log = fopen(o.log_path, "w");
		if (!log) {
			sp_err_set(&err, SP_EINPUT, o.log_path, 0, 0, NULL,
				   "cannot open for writing: %s", strerror(errno));
			bad = 1;
		} else {
			fprintf(log, "step,task,loss,step_ms,predicted_ms,param_l2,param_hash\n");
		}
	}
	wd_arm(rank, "start-up");
	if (c->allsum(c, &bad, 1)) {
		sp_err_set(&err, RUN_ECOMM, NULL, 0, 0, NULL, "rank %d: start-up all-reduce failed",
			   rank);
		goto lost;
	}
	wd_disarm();
	if (bad > 0) {
		status = 2;
		goto fail;
	}
	if (rank == 0 && !o.quiet) {
		int64_t act[MEM__COUNT], pred[MEM__COUNT];
		rt_memory(st, act);
		plan_memory(&plan, 0, pred);
		printf("spindle-run: plan '%s' (%s, %s) on %d rank%s, backend %s\n", o.plan_path,
		       plan.model.name, plan.algo, c->nranks, c->nranks > 1 ? "s" : "", be.name);
		if (o.load_dir)
			printf("resuming after step %lld from '%s'\n", (long long)(first_step - 1),
			       o.load_dir);
		printf("rank 0 memory (MiB): params+state %.2f, activations %.2f, buffers %.2f, "
		       "work %.2f; plan predicted %.2f, %.2f, %.2f, %.2f in %s\n",
		       act[0] / 1048576.0, act[1] / 1048576.0, act[2] / 1048576.0, act[3] / 1048576.0,
		       pred[0] / 1048576.0, pred[1] / 1048576.0, pred[2] / 1048576.0,
		       pred[3] / 1048576.0, dtype_name(plan.model.dtype));
	}
	int T = plan.model.n_tasks;
	loss = calloc((size_t)T + 1, sizeof(double));
	if (!loss) {
		sp_err_set(&err, SP_ENOMEM, NULL, 0, 0, NULL, "rank %d: out of memory", rank);
		goto lost;
	}
	double total_ms = 0;
	for (int64_t t = first_step; t < first_step + o.steps; t++) {
		for (int i = 0; i < T; i++)
			loss[i] = 0;
		if (o.die_at_step == t && (o.fault_rank < 0 || o.fault_rank == rank)) {
			fprintf(stderr, "spindle-run: rank %d: exiting at step %lld (fault injection)\n",
				rank, (long long)t);
			exit(3);
		}
		if (o.stop_step == t && o.stop_rank == rank && !o.stop_end)
			fault_stop(rank, t, "the start");
		double t0 = wall_ms();
		if (rt_step(st, t, loss, &err))
			goto lost;
		if (o.stop_step == t && o.stop_rank == rank && o.stop_end)
			fault_stop(rank, t, "the end");
		wd_arm(rank, "step %lld: summing the losses", (long long)t);
		if (c->allsum(c, loss, T)) {
			sp_err_set(&err, RUN_ECOMM, NULL, 0, 0, NULL,
				   "rank %d: step %lld: summing the losses failed", rank, (long long)t);
			goto lost;
		}
		double ms = wall_ms() - t0;
		total_ms += ms;
		double l2 = 0;
		uint64_t h = 0;
		int last = t == first_step + o.steps - 1;
		wd_arm(rank, "step %lld: gathering the parameters", (long long)t);
		if ((o.log_path || (last && o.dump_path)) &&
		    param_digest(st, c, &l2, &h, last ? o.dump_path : NULL, &err)) {
			if (err.code == RUN_ECOMM)
				goto lost;
			quiet = rank != 0;
			status = 1;
			goto fail;
		}
		wd_disarm();
		if (rank == 0) {
			if (!o.quiet) {
				printf("step %3lld  %8.2f ms (predicted %.2f)  loss", (long long)t, ms,
				       plan.cert.iteration_ms);
				for (int i = 0; i < T; i++)
					printf("  %s %.4f", plan.model.tasks[i].name,
					       loss[i] / (double)plan.model.tasks[i].batch);
				printf("\n");
			}
			for (int i = 0; log && i < T; i++)
				fprintf(log, "%lld,%s,%.9g,%.3f,%.3f,%.9g,%016llx\n", (long long)t,
					plan.model.tasks[i].name,
					loss[i] / (double)plan.model.tasks[i].batch, ms,
					plan.cert.iteration_ms, l2, (unsigned long long)h);
			if (log)
				fflush(log);
		}
		int save_now = o.save_dir && ((o.save_every > 0 && t % o.save_every == 0) || last);
		if (save_now) {
			wd_arm(rank, "step %lld: writing the checkpoint to '%s'", (long long)t,
			       o.save_dir);
			if (ckpt_save(st, c, &plan, o.save_dir, t, ro.seed, &o.ckpt_fault, &err)) {
				if (err.code == RUN_ECOMM)
					goto lost;
				quiet = rank != 0;
				status = err.code == SP_EINPUT ? 2 : 1;
				goto fail;
			}
			wd_disarm();
			save_dir_made = 0;
		}
	}
	if (rank == 0)
		printf("spindle-run: %lld steps, %.2f ms per step measured, %.2f ms predicted\n",
		       (long long)o.steps, o.steps ? total_ms / (double)o.steps : 0,
		       plan.cert.iteration_ms);
	wd_arm(rank, "gathering the trace");
	if (o.trace_path && trace_write_measured(st, c, &plan, o.trace_path, &err)) {
		status = 1;
		goto fail;
	}
	goto done;
lost:
	/* the ranks are out of step: finalizing could wait forever */
	wd_disarm();
	if (err.code)
		sp_err_print(stderr, &err);
	fflush(stdout);
	fflush(stderr);
	if (log)
		fclose(log);
	c->abort(c, 1);
	return 1;
fail:
	if (err.code && !quiet && (rank == 0 || status != 2 || loud))
		sp_err_print(stderr, &err);
	if (status == 0)
		status = 1;
	if (save_dir_made)
		rmdir(o.save_dir); /* only when still empty */
done:
	if (log)
		fclose(log);
	free(loss);
	rt_free(st);
	plan_release(&plan);
	if (be.shutdown)
		be.shutdown(&be);
	wd_arm(rank, "finishing (MPI_Finalize)");
	c->finalize(c);
	wd_disarm();
	return status;
}
