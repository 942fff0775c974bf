/*
 * main.c — spindle-run: one process per plan device (under mpirun), or one
 * process for a one-device plan. Reads the plan through the shared reader,
 * checks it matches the launch, builds the rank's state, trains K steps,
 * reports per-task losses and times next to the plan's prediction, and
 * optionally writes a CSV log, a measured Chrome trace, parameter dumps and
 * checkpoints. Only this file decides exit statuses: 0 ok, 1 failure while
 * running, 2 bad input (plan, options, launch).
 */
#include "ckpt.h"
#include "runtime.h"
#include "trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
	const char *plan_path, *backend, *trace_path, *log_path, *dump_path;
	const char *save_dir, *load_dir;
	int64_t steps, save_every;
	uint64_t seed;
	int seed_set, quiet;
	double timeout_s;
	int64_t die_at_step; /* testing hook: --fault-exit-at STEP (rank given by --fault-rank) */
	int fault_rank;
} run_opts_t;

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
		"  --timeout S          seconds a rank waits for a peer before aborting (300)\n"
		"  --quiet              print only the summary\n");
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

/* L2 norm and FNV hash of all parameters in canonical order (rank 0). */
static int param_digest(rt_state_t *st, rt_comm_t *c, double *l2, uint64_t *hash,
			const char *dump_path, sp_err_t *err)
{
	void *mine = NULL, *all = NULL;
	size_t bytes = 0, *sizes = NULL;
	int rc = rt_pack_owned(st, 0, &mine, &bytes);
	if (rc)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	if (c->gather(c, mine, bytes, &all, &sizes)) {
		free(mine);
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "gathering parameters failed");
	}
	free(mine);
	if (c->rank != 0)
		return 0;
	rc = ckpt_records_sorted(all, sizes, c->nranks, l2, hash, dump_path, err);
	free(all);
	free(sizes);
	return rc;
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
	if (mpi ? comm_mpi_init(&be.comm, &argc, &argv, &err) : comm_local_init(&be.comm)) {
		sp_err_print(stderr, &err);
		return 2;
	}
	rt_comm_t *c = &be.comm;
	int rank = c->rank;
	sp_plan_t plan = {0};
	rt_state_t *st = NULL;
	FILE *log = NULL;
	double *loss = NULL;
	if (plan_read(&plan, o.plan_path, &err)) {
		status = 2;
		goto fail;
	}
	if (plan.n_devices != c->nranks) {
		sp_err_set(&err, SP_EINPUT, o.plan_path, 0, 0, NULL,
			   "the plan is for %d devices but %d rank%s started", plan.n_devices,
			   c->nranks, c->nranks == 1 ? " was" : "s were");
		if (!mpi && comm_under_launcher())
			sp_err_hint(&err, "this spindle-run was built without MPI");
		else
			sp_err_hint(&err, "run: mpirun -np %d spindle-run %s", plan.n_devices,
				    o.plan_path);
		status = 2;
		goto fail;
	}
	if (!strcmp(o.backend, "cuda")) {
		if (backend_cuda(&be, &err)) {
			status = 2;
			goto fail;
		}
	} else {
		backend_cpu(&be);
	}
	if (be.init(&be, rank, &err)) {
		status = 1;
		goto fail;
	}
	rt_opts_t ro = {o.seed_set ? o.seed : plan.model.seed, o.timeout_s,
			o.trace_path != NULL};
	if (rt_create(&st, &plan, &be, &ro, &err)) {
		status = err.code == SP_EINPUT ? 2 : 1;
		goto fail;
	}
	int64_t first_step = 1;
	if (o.load_dir) {
		if (ckpt_load(st, c, &plan, o.load_dir, &first_step, &err)) {
			status = err.code == SP_EINPUT ? 2 : 1;
			goto fail;
		}
		first_step++;
	}
	if (rank == 0 && !o.quiet) {
		int64_t act[MEM__COUNT], pred[MEM__COUNT];
		rt_memory(st, act);
		plan_memory(&plan, 0, pred);
		printf("spindle-run: plan '%s' (%s, %s) on %d rank%s, backend %s\n", o.plan_path,
		       plan.model.name, plan.algo, c->nranks, c->nranks > 1 ? "s" : "", be.name);
		printf("rank 0 memory (MiB): params+state %.2f, activations %.2f, buffers %.2f, "
		       "work %.2f; plan predicted %.2f, %.2f, %.2f, %.2f in %s\n",
		       act[0] / 1048576.0, act[1] / 1048576.0, act[2] / 1048576.0, act[3] / 1048576.0,
		       pred[0] / 1048576.0, pred[1] / 1048576.0, pred[2] / 1048576.0,
		       pred[3] / 1048576.0, dtype_name(plan.model.dtype));
	}
	if (rank == 0 && o.log_path) {
		log = fopen(o.log_path, "w");
		if (!log) {
			sp_err_set(&err, SP_EIO, o.log_path, 0, 0, NULL, "cannot open for writing");
			status = 2;
			goto fail;
		}
		fprintf(log, "step,task,loss,step_ms,predicted_ms,param_l2,param_hash\n");
	}
	int T = plan.model.n_tasks;
	loss = calloc((size_t)T + 1, sizeof(double));
	if (!loss) {
		status = 1;
		goto fail;
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
		double t0 = wall_ms();
		if (rt_step(st, t, loss, &err)) {
			sp_err_print(stderr, &err);
			fflush(stderr);
			c->abort(c, 1);
			status = 1;
			goto done;
		}
		if (c->allsum(c, loss, T)) {
			status = 1;
			goto done;
		}
		double ms = wall_ms() - t0;
		total_ms += ms;
		double l2 = 0;
		uint64_t h = 0;
		int last = t == first_step + o.steps - 1;
		if ((o.log_path || (last && o.dump_path)) &&
		    param_digest(st, c, &l2, &h, last ? o.dump_path : NULL, &err)) {
			status = 1;
			goto fail;
		}
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
		}
		int save_now = o.save_dir && ((o.save_every > 0 && t % o.save_every == 0) || last);
		if (save_now && ckpt_save(st, c, &plan, o.save_dir, t, ro.seed, &err)) {
			status = 1;
			goto fail;
		}
	}
	if (rank == 0)
		printf("spindle-run: %lld steps, %.2f ms per step measured, %.2f ms predicted\n",
		       (long long)o.steps, o.steps ? total_ms / (double)o.steps : 0,
		       plan.cert.iteration_ms);
	if (o.trace_path && trace_write_measured(st, c, &plan, o.trace_path, &err)) {
		status = 1;
		goto fail;
	}
	goto done;
fail:
	if (err.code && (rank == 0 || status != 2))
		sp_err_print(stderr, &err);
	if (status == 0)
		status = 1;
done:
	if (log)
		fclose(log);
	free(loss);
	rt_free(st);
	plan_release(&plan);
	if (be.shutdown)
		be.shutdown(&be);
	c->finalize(c);
	return status;
}
