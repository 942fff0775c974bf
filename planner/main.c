/*
 * main.c — spindle-plan: command line, loading the inputs, and the exit
 * status. Everything else is in the passes (planner.h). Only this file
 * prints errors and decides how the program exits.
 */
#include "planner.h"
#include "tp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --jobs: at most JOBS_MAX; by default the online CPUs, at most
 * JOBS_DEFAULT_MAX (ours has about 8 candidates to share out). */
enum { JOBS_MAX = 64, JOBS_DEFAULT_MAX = 8 };

static void usage(FILE *f)
{
	fprintf(f,
		"usage: spindle-plan MODEL.json CLUSTER.json [-o PLAN.bin] [options]\n"
		"\n"
		"  -o, --output FILE    write the plan (atomically; nothing on error)\n"
		"  --inspect            print what was understood of the inputs and stop\n"
		"  --costs              print the cost table (per-layer times of every MetaOp\n"
		"                       at every width, collective and transfer prices) as\n"
		"                       JSON and stop\n"
		"  --report             print the report (algorithms, bounds, waves)\n"
		"  --compare            plan with every algorithm (default: ours and sequential)\n"
		"  --json               print the report as JSON\n"
		"  --algo NAME          spindle (default), spindle-paper, sequential,\n"
		"                       task-level, distmm-mt, sequential-paper\n"
		"  --placement KIND     spindle (default) or naive\n"
		"  --mem-reserve GIB    memory kept free on every device\n"
		"                       (default: 2 GiB or 10%% of it, whichever is less)\n"
		"  --milp-nodes N       branch-and-bound nodes per MILP (default 200)\n"
		"  --candidates         list our scheduling candidates and stop\n"
		"  --exclude NAME       plan ours without candidate NAME (e.g. data-parallel:\n"
		"                       ours without reusing the sequential plan)\n"
		"  --only NAME          plan ours with candidate NAME alone (what its plan\n"
		"                       costs; no plan when it has none for these inputs)\n");
	fprintf(f,
		"  --zero 0|1|2|3|auto  parameter state layout of every sync group of 2 or\n"
		"                       more devices: 0 replicated, 1 zero-1 (optimizer state\n"
		"                       sharded), 2 zero-2 (gradients sharded too), 3 zero-3\n"
		"                       (weights too: gathered at each use); auto\n"
		"                       (default) chooses per group (zero-3 for the\n"
		"                       large components when only it fits)\n"
		"  --rs-overlap off|on|auto\n"
		"                       zero-2/3 buckets: on completes a reduce-scatter one\n"
		"                       full-gradient placement later, beside the next\n"
		"                       bucket's backward (one more full gradient live);\n"
		"                       auto (default) when it fits and is faster\n"
		"  --defer-gather off|on|auto\n"
		"                       zero-1/2 buckets: on leaves the all-gather after the\n"
		"                       step in flight, waited for by the next step before\n"
		"                       its first use of the weights; auto (default) when\n"
		"                       the simulated iteration is faster\n"
		"  --recompute none|all|auto\n"
		"                       transformer slices keep their activations or\n"
		"                       recompute them in the backward; auto (default)\n"
		"                       chooses per slice\n"
		"  --microbatches N|TASK=N,...|auto\n"
		"                       every task's batch as N micro-batches of batch / N\n"
		"                       (N divides every batch; gradients accumulate over\n"
		"                       them), or N per task named (others: 1; a step is as\n"
		"                       many micro-steps as the most, a task runs in its\n"
		"                       first N); auto (default): 1 unless nothing fits, then\n"
		"                       the fastest of a few counts that fit (from the\n"
		"                       fewest, more first for the tasks whose activations\n"
		"                       free most)\n"
		"  --tp 1|2|4|8|auto    tensor-parallel degree: a number splits every\n"
		"                       transformer slice whose width it divides into\n"
		"                       groups of that many devices of one node (it must\n"
		"                       divide every transformer's heads and ffn; each\n"
		"                       transformer it leaves whole is named on stderr,\n"
		"                       with why); auto (default) chooses per layer\n"
		"  --sp off|on|auto     sequence parallelism of split transformer slices:\n"
		"                       layer norms and residuals on seq / t tokens per\n"
		"                       member, all-gathers and reduce-scatters in place\n"
		"                       of the all-reduces; off (default); on: every split\n"
		"                       transformer, whose seq t must divide; auto: where\n"
		"                       the seq allows it and the predicted layer time is\n"
		"                       not worse (it saves activation memory). Off by\n"
		"                       default: the cuda backend's block is built but has\n"
		"                       not run on a GPU yet\n");
	/* in parts: C17 promises string literals of 4095 characters only */
	fprintf(f,

		"  --tp-vocab split|whole\n"
		"                       split (default): embeddings and LM heads split by\n"
		"                       vocabulary like transformers (shards of V/t ids,\n"
		"                       the first V%%t one more; fewer ids than the degree:\n"
		"                       they stay whole); whole: they never split\n"
		"  --jobs N             threads that evaluate our candidates (1 to %d;\n"
		"                       default: the online CPUs, at most %d); the plan\n"
		"                       is the same for every N. With 1 the planning times\n"
		"                       are CPU time, else wall-clock time\n"
		"  --refine-within PCT|all\n"
		"                       ours chooses on refined iterations (layout_refine):\n"
		"                       besides the walk's choice it refines the\n"
		"                       candidates whose unrefined iteration is within\n"
		"                       PCT%% of the choice's (default 10); all: every\n"
		"                       one whose bound of its refined iteration may\n"
		"                       beat it (exact, slower)\n"
		"  --simulate-all       ours simulates every candidate in full instead of\n"
		"                       skipping those a lower bound shows cannot be chosen\n"
		"                       (the same plan, more planning time: for tests)\n"
		"  --max-instructions N refuse (exit 2, naming the slice) a plan whose\n"
		"                       transfers alone are more than N instructions,\n"
		"                       before the planner holds them (about %d bytes\n"
		"                       each); default %lld, 0 no limit\n"
		"  -h, --help           this text\n"
		"\n"
		"exit status: 0 planned, 1 no feasible plan, out of memory or internal error,\n"
		"2 bad input (a plan over --max-instructions too)\n",
		JOBS_MAX, JOBS_DEFAULT_MAX, PLAN_BYTES_PER_INS, (long long)PLAN_MAX_INS_DEFAULT);
}

static int takes_value(const char *a)
{
	static const char *const names[] = {"-o",	   "--output",	   "--algo",
					    "--exclude",   "--only",      "--placement",  "--mem-reserve",
					    "--milp-nodes", "--zero",	   "--recompute", "--rs-overlap", "--defer-gather",
					    "--microbatches", "--tp", "--sp", "--tp-vocab",
					    "--max-instructions", "--jobs", "--refine-within"};
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		if (!strcmp(a, names[i]))
			return 1;
	return 0;
}

/* A number option's value: --mem-reserve GIB or --milp-nodes N. */
static int opt_number(plan_opts_t *o, const char *a, const char *val)
{
	char *end;
	double x = strtod(val, &end);
	if (*end || end == val || !(x >= 0) || x > 1e6) {
		fprintf(stderr, "spindle-plan: %s: invalid number '%s'\n", a, val);
		return SP_EXIT_INPUT;
	}
	if (!strcmp(a, "--mem-reserve")) {
		o->mem_reserve_gib = x;
	} else if (x < 1 || x != (int)x) {
		fprintf(stderr, "spindle-plan: --milp-nodes: '%s' is not a positive integer\n",
			val);
		return SP_EXIT_INPUT;
	} else {
		o->milp_nodes = (int)x;
	}
	return 0;
}

/* --zero and --recompute: a word of words[] (its index - 1: -1 is auto). */
static int opt_word(int *out, const char *a, const char *val, const char *const words[],
		    int n, const char *hint)
{
	for (int k = 0; k < n; k++)
		if (!strcmp(val, words[k])) {
			*out = k - 1;
			return 0;
		}
	fprintf(stderr, "spindle-plan: %s: unknown value '%s'\nhint: %s\n", a, val, hint);
	return SP_EXIT_INPUT;
}

/* --microbatches and --tp: auto (0) or a number from 1 to max. */
static int opt_auto_int(int *out, const char *a, const char *val, int max, const char *what,
			const char *which)
{
	char *end;
	long k = strtol(val, &end, 10);
	if (!strcmp(val, "auto"))
		k = 0;
	else if (*end || end == val || k < 1 || k > max) {
		fprintf(stderr, "spindle-plan: %s: '%s' is not %s\nhint: use auto or a number "
				"from 1 to %d %s\n",
			a, val, what, max, which);
		return SP_EXIT_INPUT;
	}
	*out = (int)k;
	return 0;
}

/* An option that takes a value: 0 when taken, -1 when a is not one of
 * them, SP_EXIT_INPUT on a bad value. */
static int opt_value(plan_opts_t *o, const char *a, const char *val)
{
	if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
		o->out_path = val;
	} else if (!strcmp(a, "--algo")) {
		if (algo_parse(val, &o->algo)) {
			fprintf(stderr, "spindle-plan: unknown algorithm '%s'\nhint: use spindle, "
					"spindle-paper, sequential, task-level or distmm-mt\n",
				val);
			return SP_EXIT_INPUT;
		}
	} else if (!strcmp(a, "--exclude") || !strcmp(a, "--only")) {
		if (!cand_find(val)) {
			fprintf(stderr, "spindle-plan: unknown candidate '%s'\nhint: "
					"spindle-plan --candidates lists them\n",
				val);
			return SP_EXIT_INPUT;
		}
		*(!strcmp(a, "--only") ? &o->only : &o->exclude) = val;
	} else if (!strcmp(a, "--placement")) {
		if (!strcmp(val, "spindle") || !strcmp(val, "naive")) {
			o->placement = !strcmp(val, "spindle") ? PLACE_SPINDLE : PLACE_NAIVE;
		} else {
			fprintf(stderr, "spindle-plan: unknown placement '%s'\nhint: use "
					"spindle or naive\n",
				val);
			return SP_EXIT_INPUT;
		}
	} else if (!strcmp(a, "--mem-reserve") || !strcmp(a, "--milp-nodes")) {
		return opt_number(o, a, val);
	} else if (!strcmp(a, "--zero")) {
		static const char *const w[5] = {"auto", "0", "1", "2", "3"};
		return opt_word(&o->zero, a, val, w, 5, "use 0, 1, 2, 3 or auto");
	} else if (!strcmp(a, "--microbatches")) {
		if (strchr(val, '=')) { /* per task: planner_run checks it against the model */
			o->mb_tasks = val;
			o->microbatches = 0;
			return 0;
		}
		o->mb_tasks = NULL;
		return opt_auto_int(&o->microbatches, a, val, SP_MAX_MICROBATCHES, "a count",
				    "that divides every task's batch, or TASK=COUNT,...");
	} else if (!strcmp(a, "--tp")) {
		return opt_auto_int(&o->tp, a, val, SP_MAX_TP, "a degree",
				    "(usually 1, 2, 4 or 8)");
	} else if (!strcmp(a, "--sp")) {
		static const char *const w[] = {"auto", "off", "on"};
		return opt_word(&o->sp, a, val, w, 3, "use on, off or auto");
	} else if (!strcmp(a, "--tp-vocab")) {
		if (strcmp(val, "split") && strcmp(val, "whole")) {
			fprintf(stderr, "spindle-plan: %s: unknown value '%s'\nhint: use split or "
					"whole\n", a, val);
			return SP_EXIT_INPUT;
		}
		o->tp_vocab_whole = !strcmp(val, "whole");
	} else if (!strcmp(a, "--max-instructions")) {
		char *end;
		errno = 0;
		long long n = strtoll(val, &end, 10);
		if (*end || end == val || n < 0 || errno == ERANGE) {
			fprintf(stderr, "spindle-plan: --max-instructions: invalid number '%s'\n"
					"hint: a count of instructions (0: no limit)\n",
				val);
			return SP_EXIT_INPUT;
		}
		o->max_ins = n;
	} else if (!strcmp(a, "--jobs")) {
		char *end;
		long n = strtol(val, &end, 10);
		if (*end || end == val || n < 1 || n > JOBS_MAX) {
			fprintf(stderr, "spindle-plan: --jobs: '%s' is not a thread count\n"
					"hint: use a number from 1 to %d (1: no worker threads)\n",
				val, JOBS_MAX);
			return SP_EXIT_INPUT;
		}
		o->jobs = (int)n;
	} else if (!strcmp(a, "--refine-within")) {
		char *end;
		double x = strtod(val, &end);
		if (!strcmp(val, "all")) {
			o->refine_within = -1;
		} else if (*end || end == val || !(x > 0 && x <= 1000)) {
			fprintf(stderr, "spindle-plan: --refine-within: invalid percentage '%s'\n"
					"hint: a number above 0, at most 1000, or all\n",
				val);
			return SP_EXIT_INPUT;
		} else {
			o->refine_within = x / 100;
		}
	} else if (!strcmp(a, "--recompute")) {
		static const char *const w[3] = {"auto", "none", "all"};
		return opt_word(&o->recompute, a, val, w, 3, "use none, all or auto");
	} else if (!strcmp(a, "--rs-overlap")) {
		static const char *const w[3] = {"auto", "off", "on"};
		return opt_word(&o->rs_overlap, a, val, w, 3, "use off, on or auto");
	} else if (!strcmp(a, "--defer-gather")) {
		static const char *const w[3] = {"auto", "off", "on"};
		return opt_word(&o->defer_gather, a, val, w, 3, "use off, on or auto");
	} else {
		return -1;
	}
	return 0;
}

/* A flag without a value: 1 when a is one. */
static int opt_flag(plan_opts_t *o, const char *a)
{
	int *f = !strcmp(a, "--inspect")   ? &o->inspect
		 : !strcmp(a, "--costs")   ? &o->costs
		 : !strcmp(a, "--report")  ? &o->report
		 : !strcmp(a, "--compare") ? &o->compare
		 : !strcmp(a, "--json")    ? &o->json
		 : !strcmp(a, "--simulate-all") ? &o->simulate_all
					   : NULL;
	if (f)
		*f = 1;
	return f != NULL;
}

static int parse_args(plan_opts_t *o, int argc, char **argv)
{
	memset(o, 0, sizeof *o);
	o->algo = ALGO_SPINDLE;
	o->placement = PLACE_SPINDLE;
	o->mem_reserve_gib = -1; /* auto: min(2 GiB, 10% of the device) */
	o->milp_nodes = 200;
	o->zero = -1;
	o->recompute = -1;
	o->rs_overlap = -1;
	o->defer_gather = -1;
	o->sp = 0; /* off: the cuda backend's block has not run on a GPU yet */
	o->max_ins = PLAN_MAX_INS_DEFAULT;
	o->refine_within = 0.10;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	o->jobs = cpus < 1 ? 1 : cpus > JOBS_DEFAULT_MAX ? JOBS_DEFAULT_MAX : (int)cpus;
	const char **pos[] = {&o->model_path, &o->cluster_path};
	int n_pos = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			exit(0);
		}
		if (!strcmp(a, "--candidates")) {
			for (int c = 0; c < n_sched_cands; c++)
				printf("%s\n", sched_cands[c].name);
			exit(0);
		}
		if (opt_flag(o, a))
			continue;
		int rc = val ? opt_value(o, a, val) : -1;
		if (rc > 0)
			return rc;
		if (rc == 0) {
			i++;
			continue;
		}
		if (a[0] == '-' && a[1]) {
			if (!val && takes_value(a))
				fprintf(stderr, "spindle-plan: option '%s' needs a value\n", a);
			else
				fprintf(stderr, "spindle-plan: unknown option '%s'\nhint: see "
						"spindle-plan --help\n",
					a);
			return SP_EXIT_INPUT;
		}
		if (n_pos == 2) {
			fprintf(stderr, "spindle-plan: unexpected argument '%s'\n", a);
			return SP_EXIT_INPUT;
		}
		*pos[n_pos++] = a;
	}
	if (n_pos != 2) {
		usage(stderr);
		return SP_EXIT_INPUT;
	}
	return 0;
}

/* err's warn function: each warning of the loaders, on stderr. */
static void warn(void *ctx, const sp_err_t *w)
{
	sp_warn_print(ctx, w);
}

/* Prints err; the exit status it calls for. */
static int fail(const sp_err_t *err)
{
	if (err->code == SP_ENOMEM && !err->hint[0]) {
		sp_err_t e = *err;
		sp_err_hint(&e, "spindle-plan could not get the memory it asked for (see ulimit "
				"-v); a smaller --max-instructions refuses a plan by its size "
				"before holding it");
		sp_err_print(stderr, &e);
		return SP_EXIT_FAIL;
	}
	sp_err_print(stderr, err);
	return err->code == SP_EINPUT ? SP_EXIT_INPUT : SP_EXIT_FAIL;
}

int main(int argc, char **argv)
{
	plan_opts_t o;
	int rc = parse_args(&o, argc, argv);
	if (rc)
		return rc;
	if (o.only && (o.exclude || o.algo != ALGO_SPINDLE)) {
		fprintf(stderr, "spindle-plan: --only cannot be combined with %s\nhint: --only "
				"NAME plans ours (--algo spindle) with candidate NAME alone\n",
			o.exclude ? "--exclude" : "--algo other than spindle");
		return SP_EXIT_INPUT;
	}
	sp_err_t err = {.warn = warn, .warn_ctx = stderr};
	sp_model_t model = {0};
	sp_cluster_t cluster = {0};
	sp_plan_t plan = {0};
	plan_summary_t sum;
	int status = SP_EXIT_OK;
	if (model_load(&model, o.model_path, &err) ||
	    cluster_load(&cluster, o.cluster_path, &err)) {
		status = fail(&err);
		goto cleanup;
	}
	if (o.mem_reserve_gib < 0)
		o.mem_reserve_gib = SP_MIN(2.0, 0.1 * cluster.memory_gib);
	if (o.inspect) {
		inspect_print(stdout, &model, &cluster);
		goto cleanup;
	}
	if (o.costs) {
		if (costs_print(stdout, &o, &model, &cluster, &err))
			status = fail(&err);
		goto cleanup;
	}
	/* --only: cand_schedule leaves the others out; data-parallel's plan is
	 * seq's, taken by the walk without cand_schedule, so it is left out
	 * here unless it is the one (--exclude beside --only is refused above) */
	if (o.only)
		o.exclude = strcmp(o.only, "data-parallel") ? "data-parallel" : NULL;
	if ((o.out_path && sp_output_check(o.out_path, &err)) ||
	    planner_run(&o, &model, &cluster, &plan, &sum, &err)) {
		if (o.only && (!err.msg[0] || err.code == SP_EINFEAS)) {
			/* the walk kept no schedule: say whose */
			if (!err.msg[0])
				sp_err_set(&err, SP_EINFEAS, NULL, 0, 0, NULL, "no plan");
			if (!err.hint[0])
				sp_err_hint(&err, "candidate '%s' makes no plan for these inputs "
						  "alone (--only); without --only ours plans with "
						  "every candidate",
					    o.only);
		}
		status = fail(&err);
		goto cleanup;
	}
	/* a forced --tp N says which transformers it left whole, and why */
	if (tp_whole(stderr, &plan, "spindle-plan: ")) {
		fprintf(stderr, "spindle-plan: out of memory\n");
		status = SP_EXIT_FAIL;
		goto cleanup;
	}
	/* the file first: a run that cannot write it reports no success */
	if (o.out_path && plan_write(&plan, o.out_path, &err)) {
		status = fail(&err);
		goto cleanup;
	}
	if (o.json)
		report_json(stdout, &plan, &sum);
	else if (o.report || o.compare)
		report_print(stdout, &plan, &sum);
	else
		fprintf(stdout, "%s: %s plan, predicted %.2f ms per iteration (lower bound "
				"%.2f ms, sequential %.2f ms)\n",
			o.model_path, algo_name(sum.chosen), plan.cert.iteration_ms,
			plan.cert.lower_bound_ms, sum.algos[ALGO_SEQUENTIAL].iteration_ms);
cleanup:
	plan_release(&plan);
	model_release(&model);
	cluster_release(&cluster);
	return status;
}
