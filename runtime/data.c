/*
 * data.c — training data for the interpreter: from a dataset (--data,
 * dataset.c reads it; here only the LM targets are derived from its tokens)
 * or, by default, synthetic. Synthetic data is deterministic: every number is a hash
 * of (seed, step, task, node or component, sample, position), so ranks that
 * split a batch differently see identical samples. Learnable:
 *   z        latent of a sample: K = 8 uniforms in [-1, 1) from
 *            (seed, step, task, sample); shared by all nodes of the task,
 *            so paired modalities agree (contrastive losses can align them)
 *   features x[p][f] = sum_k z_k R[p][f][k] / sqrt(K) + 0.1 noise, R a fixed
 *            per-component projection (same "sensor" in every task)
 *   tokens   t[0] = floor(V (z_0 + 1) / 2), t[q+1] = (5 t[q] + 3) mod V:
 *            the next token is a function of the current one
 *   labels   floor(C (z_0 + 1) / 2): readable from the features
 *   LM       the target of a position is the next token of the embedding
 *   targets  stream it came from (through transformers, which concatenate
 *            their inputs along seq, and linears); -1 where it came from
 *            features (ignored by the loss)
 */
#include "runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define K_LATENT 8

static uint64_t key(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e)
{
	uint64_t h = sp_mix64(a ^ 0x5851f42d4c957f2dULL);
	h = sp_mix64(h ^ b);
	h = sp_mix64(h ^ c);
	h = sp_mix64(h ^ d);
	return sp_mix64(h ^ e);
}

static double latent(uint64_t seed, int64_t step, int task, int64_t sample, int k)
{
	return 2.0 * sp_unit(key(seed, (uint64_t)step, (uint64_t)task, (uint64_t)sample,
				 0x100 + (uint64_t)k)) -
	       1.0;
}

static int32_t first_token(uint64_t seed, int64_t step, int task, int64_t sample, int64_t V)
{
	double u = (latent(seed, step, task, sample, 0) + 1.0) / 2.0;
	int64_t t = (int64_t)floor(u * (double)V);
	return (int32_t)SP_MIN(SP_MAX(t, 0), V - 1);
}

static int32_t token_at(int32_t t0, int64_t q, int64_t V)
{
	int64_t t = t0;
	for (int64_t i = 0; i < q; i++)
		t = (5 * t + 3) % V;
	return (int32_t)t;
}

void data_tokens(int32_t *out, const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
		 int64_t step, int task, int node, int64_t s0, int64_t s1)
{
	if (ds) {
		dataset_rows(out, ds, step, task, node, s0, s1);
		return;
	}
	const sp_node_t *n = &m->tasks[task].nodes[node];
	int64_t V = m->comps[n->comp].vocab;
	for (int64_t s = s0; s < s1; s++) {
		int64_t t = first_token(seed, step, task, s, V);
		for (int64_t q = 0; q < n->seq; q++) {
			out[(s - s0) * n->seq + q] = (int32_t)t;
			t = (5 * t + 3) % V;
		}
	}
}

void data_features(float *out, const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
		   int64_t step, int task, int node, int64_t s0, int64_t s1)
{
	if (ds) {
		dataset_rows(out, ds, step, task, node, s0, s1);
		return;
	}
	const sp_node_t *n = &m->tasks[task].nodes[node];
	const sp_component_t *c = &m->comps[n->comp];
	uint64_t cname = sp_fnv1a(SP_FNV_INIT, c->name, strlen(c->name));
	double scale = 1.0 / sqrt((double)K_LATENT);
	int64_t cells = n->seq * c->in;
	/* the projection R is the same for every sample: computed once per call
	 * (if the table cannot be allocated, each element is hashed in place) */
	float *R = malloc(sizeof(float) * (size_t)(cells * K_LATENT + 1));
	for (int64_t e = 0; R && e < cells; e++) {
		int64_t p = e / c->in, f = e % c->in;
		for (int k = 0; k < K_LATENT; k++)
			R[e * K_LATENT + k] = (float)(2.0 * sp_unit(key(seed, cname, (uint64_t)p,
								     (uint64_t)f, (uint64_t)k)) -
						      1.0);
	}
	for (int64_t s = s0; s < s1; s++) {
		double z[K_LATENT];
		for (int k = 0; k < K_LATENT; k++)
			z[k] = latent(seed, step, task, s, k);
		for (int64_t e = 0; e < cells; e++) {
			double x = 0;
			for (int k = 0; k < K_LATENT; k++) {
				double r = R ? R[e * K_LATENT + k]
					     : (float)(2.0 * sp_unit(key(seed, cname,
									 (uint64_t)(e / c->in),
									 (uint64_t)(e % c->in),
									 (uint64_t)k)) -
						       1.0);
				x += z[k] * r;
			}
			double noise = 2.0 * sp_unit(key(seed ^ 0x9e37, (uint64_t)step,
							 (uint64_t)task * 4096 + (uint64_t)node,
							 (uint64_t)s, (uint64_t)e)) -
				       1.0;
			out[(s - s0) * cells + e] = (float)(x * scale + 0.1 * noise);
		}
	}
	free(R);
}

void data_labels(int32_t *out, const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
		 int64_t step, int task, int node, int64_t s0, int64_t s1)
{
	if (ds) {
		dataset_rows(out, ds, step, task, node, s0, s1);
		return;
	}
	const sp_node_t *n = &m->tasks[task].nodes[node];
	int64_t C = m->comps[n->comp].classes;
	for (int64_t s = s0; s < s1; s++) {
		double u = (latent(seed, step, task, s, 0) + 1.0) / 2.0;
		int64_t c = (int64_t)floor(u * (double)C);
		out[s - s0] = (int32_t)SP_MIN(SP_MAX(c, 0), C - 1);
	}
}

/*
 * The target of position q of embedding node e's stream in sample s: the
 * next token (synthetic: of the endless stream; dataset: -1 when q + 1 is
 * at or past the sample's length, so the loss ignores the last token and
 * the padding), reduced modulo the LM head's vocabulary LV, which may be
 * smaller than the stream's.
 */
static int32_t next_token(const rt_dataset_t *ds, const sp_model_t *m, uint64_t seed,
			  int64_t step, int task, int e, int64_t q, int64_t s, int64_t LV)
{
	int64_t V = m->comps[m->tasks[task].nodes[e].comp].vocab;
	if (!ds)
		return (int32_t)(token_at(first_token(seed, step, task, s, V), q + 1, V) % LV);
	int32_t len;
	const int32_t *row = dataset_tokens(ds, step, task, e, s, &len);
	return q + 1 < len ? (int32_t)(row[q + 1] % LV) : -1;
}

void data_lm_targets(int32_t *out, const rt_dataset_t *ds, const sp_model_t *m,
		     uint64_t seed, int64_t step, int task, int node, int64_t s0, int64_t s1)
{
	const sp_task_t *t = &m->tasks[task];
	const sp_node_t *n = &t->nodes[node];
	int src = n->inputs[0];
	int64_t seq = n->seq, LV = m->comps[n->comp].vocab;
	for (int64_t p = 0; p < seq; p++) {
		int64_t q = 0;
		int e = node_trace_position(m, t, src, p, &q);
		for (int64_t s = s0; s < s1; s++)
			out[(s - s0) * seq + p] =
				e < 0 ? -1 : next_token(ds, m, seed, step, task, e, q, s, LV);
	}
}
