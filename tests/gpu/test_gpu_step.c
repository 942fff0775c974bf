/*
 * test_gpu_step.c — one training step of a whole workload on the cuda
 * backend against the same step on the cpu backend: plans MODEL on
 * CLUSTER (one device), runs `spindle-run --steps 1 --dump-params --log`
 * with each backend, and compares the per-task losses and every
 * parameter's update (p1 - p0, with p0 from layer_init, which both
 * backends start from).
 *
 *   test_gpu_step SPINDLE_PLAN SPINDLE_RUN MODEL.json CLUSTER.json
 *   test_gpu_step PLAN.bin SPINDLE_RUN MODEL.json -   (a plan made elsewhere)
 *
 * SGD: each update is lr g, compared elementwise within a bf16 tolerance
 * of the largest update of its tensor record. AdamW: the first step moves
 * each weight by about lr sign(g), so where |g| is below the bf16 noise
 * the sign may differ (a difference of 2 lr); at most 2% of the weights
 * may, and no difference may exceed 2.5 lr. Exits 77 without a GPU.
 */
#include "cuda/cuda_backend.h"
#include "layers.h"
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	int32_t comp, layer;
	int64_t count;
	float *data;
} rec_t;

static char tmp[64];

static int run(const char *cmd, const char *log)
{
	int rc = system(cmd);
	if (rc != 0) {
		printf("command failed (status %d): %s\n", rc, cmd);
		char *text = NULL;
		size_t len = 0;
		sp_err_t err = {0};
		if (log && !sp_read_file(&text, &len, log, &err))
			printf("---- %s\n%s----\n", log, text);
		free(text);
	}
	return rc;
}

static int read_dump(const char *path, rec_t **out, int *n)
{
	char *buf = NULL;
	size_t len = 0, o = 8;
	sp_err_t err = {0};
	*out = NULL;
	*n = 0;
	if (sp_read_file(&buf, &len, path, &err) || len < 8 || memcmp(buf, "SPDUMP1\n", 8)) {
		printf("cannot read parameter dump %s\n", path);
		free(buf);
		return -1;
	}
	int cap = 0;
	while (o + 16 <= len) {
		rec_t r;
		memcpy(&r.comp, buf + o, 4);
		memcpy(&r.layer, buf + o + 4, 4);
		memcpy(&r.count, buf + o + 8, 8);
		o += 16;
		if (r.count < 0 || o + 4 * (size_t)r.count > len)
			break;
		r.data = malloc(4 * (size_t)(r.count ? r.count : 1));
		memcpy(r.data, buf + o, 4 * (size_t)r.count);
		o += 4 * (size_t)r.count;
		if (SP_PUSH(*out, *n, cap, r))
			break;
	}
	free(buf);
	return 0;
}

/* Per-task losses of step 1 from a --log CSV, in file order. */
static int read_losses(const char *path, double *loss, int max)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int n = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f) && n < max) {
		char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
		if (!c2 || !strncmp(line, "step", 4))
			continue;
		loss[n++] = strtod(c2 + 1, NULL);
	}
	fclose(f);
	return n;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: test_gpu_step SPINDLE_PLAN|PLAN.bin SPINDLE_RUN MODEL.json "
				"CLUSTER.json|-\n");
		return 2;
	}
	if (cu_device_count() <= 0) {
		printf("test_gpu_step: no usable CUDA device, skipping\n");
		return 77;
	}
	const char *plan = argv[1], *runner = argv[2], *model = argv[3], *cluster = argv[4];
	snprintf(tmp, sizeof tmp, "/tmp/spindle-gpu-step-XXXXXX");
	if (!mkdtemp(tmp)) {
		perror("mkdtemp");
		return 1;
	}
	char cmd[4096], log[256], plan_bin[256];
	size_t pl = strlen(plan);
	snprintf(log, sizeof log, "%s/plan.log", tmp);
	if (pl > 4 && !strcmp(plan + pl - 4, ".bin")) {
		snprintf(plan_bin, sizeof plan_bin, "%s", plan);
	} else {
		snprintf(plan_bin, sizeof plan_bin, "%s/plan.bin", tmp);
		snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' -o '%s' > '%s' 2>&1", plan, model,
			 cluster, plan_bin, log);
		if (run(cmd, log))
			return 1;
	}
	const char *be[2] = {"cpu", "cuda"};
	for (int i = 0; i < 2; i++) {
		snprintf(log, sizeof log, "%s/%s.out", tmp, be[i]);
		snprintf(cmd, sizeof cmd,
			 "'%s' '%s' --steps 1 --backend %s --dump-params '%s/%s.dump' "
			 "--log '%s/%s.csv' > '%s' 2>&1",
			 runner, plan_bin, be[i], tmp, be[i], tmp, be[i], log);
		if (run(cmd, log))
			return 1;
	}

	sp_model_t m;
	sp_err_t err = {0};
	if (model_load(&m, model, &err)) {
		sp_err_print(stderr, &err);
		return 1;
	}
	int fails = 0;
	double lc[64], lg[64];
	char path[256];
	snprintf(path, sizeof path, "%s/cpu.csv", tmp);
	int nl = read_losses(path, lc, 64);
	snprintf(path, sizeof path, "%s/cuda.csv", tmp);
	int nl2 = read_losses(path, lg, 64);
	if (nl <= 0 || nl != nl2) {
		printf("FAIL loss logs differ in length (%d, %d)\n", nl, nl2);
		fails++;
	}
	for (int i = 0; i < nl && i < nl2; i++) {
		double d = fabs(lg[i] - lc[i]);
		int ok = d <= 0.02 * fabs(lc[i]) + 1e-4;
		printf("%s loss of task %d: cuda %.6f cpu %.6f\n", ok ? "ok  " : "FAIL", i, lg[i], lc[i]);
		fails += !ok;
	}

	rec_t *rc = NULL, *rg = NULL;
	int nc = 0, ng = 0;
	snprintf(path, sizeof path, "%s/cpu.dump", tmp);
	if (read_dump(path, &rc, &nc))
		return 1;
	snprintf(path, sizeof path, "%s/cuda.dump", tmp);
	if (read_dump(path, &rg, &ng))
		return 1;
	if (nc != ng || nc == 0) {
		printf("FAIL the dumps hold %d and %d records\n", nc, ng);
		return 1;
	}
	double lr = m.opt.lr;
	int adam = m.opt.kind == OPT_ADAMW;
	int64_t total = 0, flips = 0;
	double worst = 0;
	for (int i = 0; i < nc; i++) {
		rec_t *a = &rc[i], *b = &rg[i];
		if (a->comp != b->comp || a->layer != b->layer || a->count != b->count ||
		    a->comp < 0 || a->comp >= m.n_comps) {
			printf("FAIL record %d differs in shape\n", i);
			return 1;
		}
		const sp_component_t *c = &m.comps[a->comp];
		float *p0 = malloc(4 * (size_t)(a->count ? a->count : 1));
		layer_init(p0, c, a->layer, m.seed);
		double mx = 0, maxd = 0;
		int64_t bad = 0;
		for (int64_t k = 0; k < a->count; k++)
			mx = fmax(mx, fabs((double)a->data[k] - p0[k]));
		for (int64_t k = 0; k < a->count; k++) {
			double uc = (double)a->data[k] - p0[k], ug = (double)b->data[k] - p0[k];
			double d = fabs(ug - uc);
			maxd = fmax(maxd, isnan(d) ? INFINITY : d);
			if (adam) {
				bad += !(d <= 0.1 * lr + 0.05 * fabs(uc));
				worst = fmax(worst, isnan(d) ? INFINITY : d);
			} else if (!(d <= 0.05 * mx + 0.05 * fabs(uc) + 1e-9)) {
				if (bad < 3)
					printf("    mismatch %s layer %d [%lld]: update cuda %.6g cpu %.6g\n",
					       c->name, a->layer, (long long)k, ug, uc);
				bad++;
			}
		}
		total += a->count;
		flips += bad;
		printf("%s %s layer %d: %lld values, max |update| %.3g, max |diff| %.3g, %lld out of "
		       "tolerance\n",
		       !adam && bad ? "FAIL" : "ok  ", c->name, a->layer, (long long)a->count, mx, maxd,
		       (long long)bad);
		fails += !adam && bad;
		free(p0);
	}
	if (adam) {
		int ok = (double)flips <= 0.02 * (double)total && worst <= 2.5 * lr + 1e-6;
		printf("%s adamw: %lld of %lld updates differ (sign of a tiny gradient), worst %.3g "
		       "(lr %.3g)\n",
		       ok ? "ok  " : "FAIL", (long long)flips, (long long)total, worst, lr);
		fails += !ok;
	}
	for (int i = 0; i < nc; i++) {
		free(rc[i].data);
		free(rg[i].data);
	}
	free(rc);
	free(rg);
	model_release(&m);
	printf("%s: %d failure%s (work files in %s)\n", fails ? "FAIL" : "PASS", fails,
	       fails == 1 ? "" : "s", tmp);
	return fails ? 1 : 0;
}
