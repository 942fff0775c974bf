/*
 * eval.c — spindle-run --eval DIR: one pass over a held-out split after
 * training, forward only (interp.c's rt_eval), and its report: per task
 * the mean loss, and the accuracy beside its chance level (classification:
 * argmax == label; contrastive: top-1 retrieval in both directions, a
 * duplicate of the partner counting as the partner), on stdout and as
 * JSON. It does not train, and it does not choose the samples: the
 * held-out directory is read like --data (dataset.c) for steps 1..E, E
 * the most batches a task's held-out samples fill; task i counts its
 * first N_i / B_i of them (one pass over its samples, in the seed's
 * shuffle, the last N_i mod B_i left out; with k micro-batches a step is
 * k of the dataset's steps, B_i the step batch: dataset.c), so every plan,
 * rank count and k scores the same samples.
 */
#include "runtime.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rt_heldout {
	const char *dir;
	rt_dataset_t *ds;
	int n_tasks;
	int64_t *steps; /* per task: batches in one pass */
	int64_t n_steps;
	double *acc; /* [n_tasks * EV__COUNT], summed over steps and ranks */
};

/* Batches per epoch of task i: the last step of epoch 0 (dataset_epoch is
 * (step - 1) / steps-per-epoch; doubling, then bisection). */
static int64_t steps_per_epoch(const rt_dataset_t *d, int i)
{
	int64_t lo = 1, hi = 2; /* epoch(lo) == 0 < epoch(hi) once found */
	while (dataset_epoch(d, i, hi) == 0) {
		lo = hi;
		hi *= 2;
	}
	while (hi - lo > 1) {
		int64_t mid = lo + (hi - lo) / 2;
		*(dataset_epoch(d, i, mid) == 0 ? &lo : &hi) = mid;
	}
	return lo;
}

int heldout_open(rt_heldout_t **out, const char *dir, const sp_plan_t *p, int rank,
		 int nranks, uint64_t seed, sp_err_t *err)
{
	int T = p->model.n_tasks;
	rt_heldout_t *h = calloc(1, sizeof *h);
	*out = NULL;
	if (!h || !(h->steps = calloc((size_t)T, sizeof *h->steps)) ||
	    !(h->acc = calloc((size_t)T * EV__COUNT, sizeof *h->acc))) {
		heldout_free(h);
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
	h->dir = dir;
	h->n_tasks = T;
	/* the first open learns the steps per task, the second reads them all */
	if (dataset_open(&h->ds, dir, p, rank, nranks, seed, 1, 1, err)) {
		heldout_free(h);
		return err->code;
	}
	for (int i = 0; i < T; i++) {
		h->steps[i] = steps_per_epoch(h->ds, i);
		h->n_steps = SP_MAX(h->n_steps, h->steps[i]);
	}
	if (h->n_steps > 1) {
		dataset_free(h->ds);
		h->ds = NULL;
		if (dataset_open(&h->ds, dir, p, rank, nranks, seed, 1, h->n_steps, err)) {
			heldout_free(h);
			return err->code;
		}
	}
	*out = h;
	return 0;
}

void heldout_free(rt_heldout_t *h)
{
	if (!h)
		return;
	dataset_free(h->ds);
	free(h->steps);
	free(h->acc);
	free(h);
}

int heldout_run(rt_heldout_t *h, rt_state_t *st, rt_comm_t *c, sp_err_t *err)
{
	int T = h->n_tasks;
	double *one = malloc(sizeof(double) * (size_t)T * EV__COUNT);
	if (!one)
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "rank %d: out of memory",
				  c->rank);
	memset(h->acc, 0, sizeof(double) * (size_t)T * EV__COUNT);
	int rc = 0;
	for (int64_t s = 1; !rc && s <= h->n_steps; s++) {
		rc = rt_eval(st, h->ds, s, one, err);
		for (int i = 0; !rc && i < T; i++)
			for (int q = 0; s <= h->steps[i] && q < EV__COUNT; q++)
				h->acc[i * EV__COUNT + q] += one[i * EV__COUNT + q];
	}
	free(one);
	return rc;
}

int heldout_sum(rt_heldout_t *h, rt_comm_t *c, sp_err_t *err)
{
	if (c->ops->allsum(c, h->acc, h->n_tasks * EV__COUNT))
		return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL,
				  "rank %d: summing the held-out scores failed", c->rank);
	return 0;
}

/* Task i's kind of score: "classification", "retrieval" or NULL (loss only). */
static const char *score_kind(const sp_plan_t *p, int i)
{
	const sp_task_t *t = &p->model.tasks[i];
	for (int n = 0; n < t->n_nodes; n++)
		switch (p->model.comps[t->nodes[n].comp].type) {
		case COMP_CLASSIFIER: return "classification";
		case COMP_CONTRASTIVE: return "retrieval";
		default: break;
		}
	return NULL;
}

void heldout_print(const rt_heldout_t *h, const sp_plan_t *p, FILE *f)
{
	fprintf(f, "held-out evaluation on '%s' (one pass, forward only):\n", h->dir);
	fprintf(f, "  %-14s %8s %9s %9s %8s  %s\n", "task", "samples", "loss", "accuracy",
		"chance", "scored as");
	for (int i = 0; i < h->n_tasks; i++) {
		const double *e = h->acc + i * EV__COUNT;
		const char *kind = score_kind(p, i);
		fprintf(f, "  %-14s %8.0f %9.4f", p->model.tasks[i].name, e[EV_SAMPLES],
			e[EV_SAMPLES] > 0 ? e[EV_LOSS] / e[EV_SAMPLES] : 0.0);
		if (kind && e[EV_TRIALS] > 0)
			fprintf(f, " %9.4f %8.4f  %s\n", e[EV_HITS] / e[EV_TRIALS],
				e[EV_CHANCE] / e[EV_TRIALS], kind);
		else
			fprintf(f, " %9s %8s  loss only\n", "-", "-");
	}
	fprintf(f, "  (retrieval: each sample's partner among its batch, both directions; a "
		   "candidate whose input\n   equals the partner's or the query's counts as "
		   "right, and chance counts those too)\n");
}

int heldout_write_json(const rt_heldout_t *h, const sp_plan_t *p, const char *path,
		       sp_err_t *err)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "cannot open for writing: %s",
				  strerror(errno));
	fprintf(f, "{\"format\": \"spindle.eval/1\", \"model\": \"%s\", \"tasks\": [",
		p->model.name);
	for (int i = 0; i < h->n_tasks; i++) {
		const double *e = h->acc + i * EV__COUNT;
		const char *kind = score_kind(p, i);
		fprintf(f,
			"%s\n {\"task\": \"%s\", \"batches\": %lld, \"samples\": %.0f, "
			"\"loss\": %.9g, \"kind\": %s%s%s, \"scored\": %.0f, \"right\": %.0f, "
			"\"accuracy\": %.9g, \"chance\": %.9g}",
			i ? "," : "", p->model.tasks[i].name, (long long)h->steps[i],
			e[EV_SAMPLES], e[EV_SAMPLES] > 0 ? e[EV_LOSS] / e[EV_SAMPLES] : 0.0,
			kind ? "\"" : "", kind ? kind : "null", kind ? "\"" : "", e[EV_TRIALS],
			e[EV_HITS], e[EV_TRIALS] > 0 ? e[EV_HITS] / e[EV_TRIALS] : 0.0,
			e[EV_TRIALS] > 0 ? e[EV_CHANCE] / e[EV_TRIALS] : 0.0);
	}
	fprintf(f, "\n]}\n");
	if (fclose(f))
		return sp_err_set(err, SP_EIO, path, 0, 0, NULL, "write failed: %s",
				  strerror(errno));
	return 0;
}
