/*
 * ckpt.c — checkpoints that survive crashes and outlive plans.
 *
 * Save (collective): every rank packs the layers it owns (the lowest rank
 * holding a layer owns it) with their whole AdamW state (rt_pack_owned
 * all-gathers the shards of zero-1 buckets first); rank 0 gathers them,
 * checks that every layer of the model is there exactly once, and writes
 * DIR/<name>.tmp/, <name> = step-NNNNNNNN (or step-NNNNNNNN-K when that name
 * is taken, e.g. by an unpublished snapshot of an interrupted save):
 *   <component>.safetensors  8-byte little-endian header length N, N bytes
 *       of JSON header (padded with spaces to a multiple of 8) naming each
 *       tensor "l<layer>.<tensor>[.adam_m|.adam_v]" with dtype F32, shape
 *       and data_offsets relative to the start of the data, then the raw
 *       little-endian floats, contiguous, without holes
 *   manifest.json  format, model, step, seed, data position (the next
 *       step: the data is a function of seed and step), optimizer, size and
 *       CRC-32 of each file, and manifest_crc32: the CRC-32 of the compact,
 *       key-sorted JSON of the manifest without that member
 * Each file is fsynced, then the directory, then it is renamed to <name>,
 * then DIR/LATEST is replaced (LATEST.tmp, fsync, rename, fsync DIR).
 * LATEST is the commit point: until its rename the previous checkpoint is
 * the valid one. A crash leaves at most a stale .tmp directory or an
 * unpublished snapshot, both removed by the next save, which also removes
 * every snapshot but the new one and the one LATEST named before it. A
 * failed save removes what it wrote and leaves LATEST as it was.
 *
 * Load (collective): every rank reads LATEST (or DIR itself when it holds a
 * manifest), checks format and version (before anything else, so a newer
 * format is named as such), the manifest's CRC-32, the size and CRC-32 of
 * every file, that the checkpoint's components are the model's with the
 * same types and sizes, and the safetensors structure, then loads the
 * layers it holds (of a zero-1 bucket's AdamW state, its own shard). Every
 * rank learns whether every rank succeeded.
 *
 * Files: ckpt.c (packed parameter records, snapshot names, the manifest's
 * CRC), ckpt_save.c, ckpt_load.c; ckpt_internal.h is what they share.
 *
 * Not done here: choosing the seed (main.c reads it with ckpt_peek) and
 * detecting a stalled peer in the collectives (main.c's watchdog).
 */
#include "ckpt_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ck_cmp_rec(const void *a, const void *b)
{
	const rec_t *x = a, *y = b;
	if (x->comp != y->comp)
		return x->comp - y->comp;
	return x->layer - y->layer;
}

/* Splits packed records; floats per record = count * per. */
int ck_parse_records(const void *all, size_t bytes, int per, rec_t **out, int *n)
{
	const uint8_t *b = all;
	size_t o = 0;
	int cap = 0;
	*out = NULL;
	*n = 0;
	while (o + 16 <= bytes) {
		rec_t r;
		memcpy(&r.comp, b + o, 4);
		memcpy(&r.layer, b + o + 4, 4);
		memcpy(&r.count, b + o + 8, 8);
		o += 16;
		if (r.count < 0 || (uint64_t)r.count > (bytes - o) / 4 / (size_t)per)
			return -1;
		r.data = (const float *)(const void *)(b + o);
		o += (size_t)r.count * 4 * (size_t)per;
		if (SP_PUSH(*out, *n, cap, r))
			return -1;
	}
	return o == bytes ? 0 : -1;
}

int ckpt_gather_apply(rt_state_t *st, rt_comm_t *c, int opt_state, ckpt_apply_fn fn,
		      void *ctx, const char *what, sp_err_t *err)
{
	void *mine = NULL, *all = NULL;
	size_t bytes = 0, *sizes = NULL;
	/* bad[r]: rank r failed (packing, or rank 0's fn) */
	double *bad = calloc((size_t)c->nranks, sizeof(double));
	if (!bad)
		return sp_err_set(err, CKPT_ECOMM, NULL, 0, 0, NULL, "rank %d: out of memory",
				  c->rank);
	if (rt_pack_owned(st, opt_state, &mine, &bytes)) {
		sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "rank %d: out of memory packing %s",
			   c->rank, what);
		mine = NULL;
		bytes = 0;
		bad[c->rank] = 1;
	}
	/* every rank takes part in every collective, failed or not */
	int comm = c->ops->gather(c, mine, bytes, &all, &sizes);
	free(mine);
	if (!comm)
		comm = c->ops->allsum(c, bad, c->nranks);
	int first = -1;
	for (int r = 0; r < c->nranks && !comm; r++)
		if (bad[r] > 0 && first < 0)
			first = r;
	size_t total = 0;
	for (int r = 0; !comm && c->rank == 0 && r < c->nranks; r++)
		total += sizes[r];
	if (!comm && c->rank == 0 && first < 0 && fn(ctx, all, total, err))
		bad[0] = 1;
	free(all);
	free(sizes);
	/* every rank learns whether rank 0 succeeded */
	double b0 = c->rank == 0 ? bad[0] : 0;
	if (comm || c->ops->allsum(c, &b0, 1)) {
		free(bad);
		return sp_err_set(err, CKPT_ECOMM, NULL, 0, 0, NULL,
				  "rank %d: gathering %s failed (communication)", c->rank, what);
	}
	free(bad);
	if (first < 0 && b0 > 0)
		first = 0;
	if (first < 0)
		return 0;
	return sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "%s failed on rank %d", what, first);
}

int ck_agree(rt_comm_t *c, int rc, const sp_err_t *mine, double value, double *sum,
	     const char *path, const char *what, sp_err_t *err)
{
	/* flags[r]: rank r failed; the last entry sums the values */
	double *flags = calloc((size_t)c->nranks + 1, sizeof(double));
	int first_bad = -1;
	*sum = 0;
	if (!flags)
		return sp_err_set(err, CKPT_ECOMM, NULL, 0, 0, NULL, "out of memory");
	flags[c->rank] = rc ? 1 : 0;
	flags[c->nranks] = rc ? 0 : value;
	if (c->ops->allsum(c, flags, c->nranks + 1)) {
		free(flags);
		return sp_err_set(err, CKPT_ECOMM, path, 0, 0, NULL,
				  "rank %d: %s: communication failed", c->rank, what);
	}
	for (int r = c->nranks - 1; r >= 0; r--)
		if (flags[r] > 0)
			first_bad = r;
	*sum = flags[c->nranks];
	free(flags);
	if (rc) {
		*err = *mine;
		return rc;
	}
	if (first_bad >= 0)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "%s failed on rank %d", what,
				  first_bad);
	return 0;
}

int ckpt_records_sorted(const void *all, size_t total, double *l2, uint64_t *hash,
			const char *dump_path, sp_err_t *err)
{
	rec_t *rec = NULL;
	int n = 0;
	if (ck_parse_records(all, total, 1, &rec, &n)) {
		free(rec);
		return sp_err_set(err, SP_EINTERNAL, NULL, 0, 0, NULL, "bad parameter records");
	}
	qsort(rec, (size_t)n, sizeof *rec, ck_cmp_rec);
	double s = 0;
	uint64_t h = SP_FNV_INIT;
	for (int i = 0; i < n; i++) {
		for (int64_t k = 0; k < rec[i].count; k++)
			s += (double)rec[i].data[k] * rec[i].data[k];
		h = sp_fnv1a(h, &rec[i].comp, 4);
		h = sp_fnv1a(h, &rec[i].layer, 4);
		h = sp_fnv1a(h, rec[i].data, sizeof(float) * (size_t)rec[i].count);
	}
	*l2 = sqrt(s);
	*hash = h;
	int rc = 0;
	if (dump_path) {
		size_t need = 8;
		for (int i = 0; i < n; i++)
			need += 16 + 4 * (size_t)rec[i].count;
		uint8_t *buf = malloc(need);
		if (!buf) {
			free(rec);
			return sp_err_set(err, SP_ENOMEM, dump_path, 0, 0, NULL, "out of memory");
		}
		memcpy(buf, "SPDUMP1\n", 8);
		size_t o = 8;
		for (int i = 0; i < n; i++) {
			memcpy(buf + o, &rec[i].comp, 4);
			memcpy(buf + o + 4, &rec[i].layer, 4);
			memcpy(buf + o + 8, &rec[i].count, 8);
			memcpy(buf + o + 16, rec[i].data, 4 * (size_t)rec[i].count);
			o += 16 + 4 * (size_t)rec[i].count;
		}
		rc = sp_write_atomic(dump_path, buf, o, err);
		free(buf);
	}
	free(rec);
	return rc;
}

/* Whether name is one of ours: step-<digits>[-<digits>][.tmp]. */
int ck_snapshot_name(const char *name, int allow_tmp)
{
	const char *s = name;
	if (strncmp(s, "step-", 5))
		return 0;
	s += 5;
	if (!isdigit((unsigned char)*s))
		return 0;
	while (isdigit((unsigned char)*s))
		s++;
	if (*s == '-') {
		s++;
		if (!isdigit((unsigned char)*s))
			return 0;
		while (isdigit((unsigned char)*s))
			s++;
	}
	if (allow_tmp && !strcmp(s, ".tmp"))
		return 1;
	return *s == 0;
}

/* The snapshot LATEST names (0), or -1 when there is none or it is not
 * one of ours. */
int ck_read_latest(const char *dir, char *name, size_t cap)
{
	char path[4608];
	snprintf(path, sizeof path, "%s/LATEST", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int ok = fgets(name, (int)cap, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	name[strcspn(name, "\n")] = 0;
	return ck_snapshot_name(name, 0) ? 0 : -1;
}

void ck_dims_string(char *out, size_t cap, const sp_component_t *c)
{
	snprintf(out, cap, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d",
		 (long long)c->vocab, (long long)c->hidden, (long long)c->max_seq,
		 (long long)c->in, (long long)c->out, (long long)c->layers,
		 (long long)c->heads, (long long)c->ffn, (long long)c->classes, c->causal);
}

int ck_comp_layers(const sp_component_t *c)
{
	return c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
}

int ck_check_records(const sp_model_t *md, const rec_t *rec, int n, sp_err_t *err)
{
	int i = 0;
	for (int c = 0; c < md->n_comps; c++) {
		if (!ck_comp_trained(md, c))
			continue;
		for (int l = 0; l < ck_comp_layers(&md->comps[c]); l++, i++)
			if (i >= n || rec[i].comp != c || rec[i].layer != l ||
			    rec[i].count != comp_layer_params(&md->comps[c]))
				return sp_err_set(err, SP_EINTERNAL, NULL, 0, 0, NULL,
						  "checkpoint records: layer %d of component '%s' is "
						  "missing, repeated or of the wrong size",
						  l, md->comps[c].name);
	}
	if (i != n)
		return sp_err_set(err, SP_EINTERNAL, NULL, 0, 0, NULL,
				  "checkpoint records: %d records for %d layers", n, i);
	return 0;
}

int ck_comp_trained(const sp_model_t *md, int c)
{
	if (md->comps[c].type == COMP_CONTRASTIVE)
		return 0;
	for (int ti = 0; ti < md->n_tasks; ti++)
		for (int i = 0; i < md->tasks[ti].n_nodes; i++)
			if (md->tasks[ti].nodes[i].comp == c)
				return 1;
	return 0;
}

/* CRC-32 of the compact, key-sorted JSON of the manifest without its
 * "manifest_crc32" member, as 8 hex digits. */
int ck_manifest_crc(const json_t *man, char out[9])
{
	json_t *copy = json_deep_copy(man);
	if (!copy)
		return -1;
	json_object_del(copy, "manifest_crc32");
	char *s = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(copy);
	if (!s)
		return -1;
	snprintf(out, 9, "%08" PRIx32, sp_crc32(0, s, strlen(s)));
	free(s);
	return 0;
}
