/*
 * ckpt.c — checkpoints that survive crashes and outlive plans.
 *
 * Save (collective): every rank packs the layers it owns (the lowest rank
 * holding a layer owns it) with their AdamW state; rank 0 gathers them and
 * writes DIR/step-NNNNNNNN.tmp/: one safetensors file per component (8-byte
 * little-endian header length, JSON header naming each tensor
 * "l<layer>.<tensor>[.adam_m|.adam_v]" with dtype F32, shape and byte
 * offsets, then the raw little-endian floats) and manifest.json (format,
 * model, step, seed, data position = next step, optimizer, and a CRC-32 and
 * size per file). Each file is fsynced, the directory renamed to
 * step-NNNNNNNN, then DIR/LATEST is replaced atomically (temp, fsync,
 * rename). Until that rename the previous checkpoint is the valid one; a
 * crash leaves at most a stale .tmp directory, removed by the next save.
 * Older snapshots than the previous one are removed.
 *
 * Load (collective): every rank reads LATEST (or DIR itself when it holds a
 * manifest), checks format and version, the CRC-32 of every file, that each
 * component's type and sizes match the plan's model, then loads the layers
 * it holds. Nothing is loaded unless everything checks out.
 */
#include "ckpt.h"
#include "layers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT "spindle.checkpoint/1"
#define CKPT_VERSION 1

typedef struct {
	int32_t comp, layer;
	int64_t count;
	const float *data; /* count floats, then m and v when present */
} rec_t;

static int cmp_rec(const void *a, const void *b)
{
	const rec_t *x = a, *y = b;
	if (x->comp != y->comp)
		return x->comp - y->comp;
	return x->layer - y->layer;
}

/* Splits packed records; floats per record = count * per. */
static int parse_records(const void *all, size_t bytes, int per, rec_t **out, int *n)
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
		if (r.count < 0 || (size_t)r.count * 4 * (size_t)per > bytes - o)
			return -1;
		r.data = (const float *)(const void *)(b + o);
		o += (size_t)r.count * 4 * (size_t)per;
		if (SP_PUSH(*out, *n, cap, r))
			return -1;
	}
	return o == bytes ? 0 : -1;
}

int ckpt_records_sorted(const void *all, const size_t *sizes, int nranks, double *l2,
			uint64_t *hash, const char *dump_path, sp_err_t *err)
{
	size_t total = 0;
	for (int r = 0; r < nranks; r++)
		total += sizes[r];
	rec_t *rec = NULL;
	int n = 0;
	if (parse_records(all, total, 1, &rec, &n)) {
		free(rec);
		return sp_err_set(err, SP_EINTERNAL, NULL, 0, 0, NULL, "bad parameter records");
	}
	qsort(rec, (size_t)n, sizeof *rec, cmp_rec);
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

/* ---- writing ---- */

static int write_all(int fd, const void *data, size_t n)
{
	const char *p = data;
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return -1;
	int rc = fsync(fd);
	close(fd);
	return rc == 0 || errno == EINVAL ? 0 : -1;
}

/* Writes path (new file), fsyncs; returns CRC-32 of the bytes in *crc. */
static int write_file(const char *path, const void *a, size_t na, const void *b, size_t nb,
		      uint32_t *crc, sp_err_t *err)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return sp_err_set(err, SP_EIO, path, 0, 0, NULL, "cannot create: %s",
				  strerror(errno));
	int rc = 0;
	if (write_all(fd, a, na) || (nb && write_all(fd, b, nb)))
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "write failed: %s", strerror(errno));
	if (!rc && fsync(fd) != 0 && errno != EINVAL)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "fsync failed: %s", strerror(errno));
	if (close(fd) != 0 && !rc)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "close failed: %s", strerror(errno));
	if (crc)
		*crc = sp_crc32(sp_crc32(0, a, na), b, nb);
	return rc;
}

static void remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char path[4096];
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

/* Removes stale .tmp snapshots and snapshots older than keep_a/keep_b. */
static void prune(const char *dir, const char *keep_a, const char *keep_b)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char path[4096];
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, "step-", 5))
			continue;
		if ((keep_a && !strcmp(e->d_name, keep_a)) || (keep_b && !strcmp(e->d_name, keep_b)))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		remove_tree(path);
	}
	closedir(d);
}

static int read_latest(const char *dir, char *name, size_t cap)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/LATEST", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int ok = fgets(name, (int)cap, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	name[strcspn(name, "\n")] = 0;
	return name[0] ? 0 : -1;
}

/* One component's safetensors file in memory: header JSON + data. */
static int component_file(const sp_model_t *md, int comp, const rec_t *rec, int n, int adam,
			  char **hdr_out, size_t *hdr_len, uint8_t **data_out, size_t *data_len)
{
	const sp_component_t *c = &md->comps[comp];
	json_t *h = json_object(), *meta = json_object();
	size_t total = 0;
	int rc = -1;
	uint8_t *data = NULL;
	char *js = NULL;
	if (!h || !meta)
		goto cleanup;
	json_object_set_new(meta, "format", json_string("spindle.tensors/1"));
	json_object_set_new(meta, "component", json_string(c->name));
	json_object_set_new(meta, "type", json_string(comp_type_name(c->type)));
	char dims[200];
	snprintf(dims, sizeof dims, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d",
		 (long long)c->vocab, (long long)c->hidden, (long long)c->max_seq,
		 (long long)c->in, (long long)c->out, (long long)c->layers,
		 (long long)c->heads, (long long)c->ffn, (long long)c->classes, c->causal);
	json_object_set_new(meta, "dims", json_string(dims));
	json_object_set_new(h, "__metadata__", meta);
	meta = NULL;
	for (int i = 0; i < n; i++)
		if (rec[i].comp == comp)
			total += 4 * (size_t)rec[i].count * (adam ? 3 : 1);
	data = malloc(total + 1);
	if (!data)
		goto cleanup;
	size_t o = 0;
	static const char *const sfx[3] = {"", ".adam_m", ".adam_v"};
	for (int part = 0; part < (adam ? 3 : 1); part++)
		for (int i = 0; i < n; i++) {
			if (rec[i].comp != comp)
				continue;
			layer_tensor_t t[12];
			int nt = layer_tensors(c, t);
			for (int q = 0; q < nt; q++) {
				char key[128];
				snprintf(key, sizeof key, "l%d.%s%s", rec[i].layer, t[q].name, sfx[part]);
				size_t nb = 4 * (size_t)(t[q].rows * t[q].cols);
				json_t *d = json_object();
				json_object_set_new(d, "dtype", json_string("F32"));
				json_t *shape = t[q].cols == 1 ? json_pack("[I]", (json_int_t)t[q].rows)
							       : json_pack("[I,I]", (json_int_t)t[q].rows,
									   (json_int_t)t[q].cols);
				json_object_set_new(d, "shape", shape);
				json_object_set_new(d, "data_offsets",
						    json_pack("[I,I]", (json_int_t)o,
							      (json_int_t)(o + nb)));
				json_object_set_new(h, key, d);
				memcpy(data + o, rec[i].data + (size_t)part * (size_t)rec[i].count + t[q].offset,
				       nb);
				o += nb;
			}
		}
	js = json_dumps(h, JSON_SORT_KEYS | JSON_COMPACT);
	if (!js)
		goto cleanup;
	*hdr_len = strlen(js);
	*hdr_out = js;
	js = NULL;
	*data_out = data;
	*data_len = o;
	data = NULL;
	rc = 0;
cleanup:
	json_decref(h);
	json_decref(meta);
	free(data);
	free(js);
	return rc;
}

static int save_rank0(const sp_plan_t *p, const char *dir, int64_t step, uint64_t seed,
		      const void *all, size_t total, sp_err_t *err)
{
	const sp_model_t *md = &p->model;
	int adam = md->opt.kind == OPT_ADAMW;
	rec_t *rec = NULL;
	int n = 0, rc = 0;
	char name[64], tmp[4096], fin[4096], path[8192], prev[256] = "";
	json_t *man = NULL, *files = NULL;
	char *ms = NULL;
	if (parse_records(all, total, adam ? 3 : 1, &rec, &n))
		return sp_err_set(err, SP_EINTERNAL, dir, 0, 0, NULL, "bad parameter records");
	qsort(rec, (size_t)n, sizeof *rec, cmp_rec);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		rc = sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL, "cannot create the checkpoint "
								 "directory: %s",
				strerror(errno));
		goto cleanup;
	}
	read_latest(dir, prev, sizeof prev);
	snprintf(name, sizeof name, "step-%08lld", (long long)step);
	snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
	snprintf(fin, sizeof fin, "%s/%s", dir, name);
	remove_tree(tmp);
	if (mkdir(tmp, 0755) != 0) {
		rc = sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
				"cannot write in the checkpoint directory: %s", strerror(errno));
		goto cleanup;
	}
	man = json_object();
	files = json_array();
	for (int c = 0; c < md->n_comps && !rc; c++) {
		if (md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		char *hdr = NULL;
		uint8_t *data = NULL;
		size_t hl = 0, dl = 0;
		if (component_file(md, c, rec, n, adam, &hdr, &hl, &data, &dl)) {
			rc = sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
			break;
		}
		/* header padded with spaces to 8 bytes, as safetensors allows */
		size_t padded = (hl + 7) & ~(size_t)7;
		uint8_t *head = malloc(8 + padded);
		if (!head) {
			free(hdr);
			free(data);
			rc = sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
			break;
		}
		uint64_t len = padded;
		for (int i = 0; i < 8; i++)
			head[i] = (uint8_t)(len >> (8 * i));
		memcpy(head + 8, hdr, hl);
		memset(head + 8 + hl, ' ', padded - hl);
		snprintf(path, sizeof path, "%s/%s.safetensors", tmp, md->comps[c].name);
		uint32_t crc = 0;
		rc = write_file(path, head, 8 + padded, data, dl, &crc, err);
		char crcs[16];
		snprintf(crcs, sizeof crcs, "%08x", crc);
		json_array_append_new(files, json_pack("{s:s, s:s, s:I, s:s}", "component",
						       md->comps[c].name, "file",
						       strrchr(path, '/') + 1, "bytes",
						       (json_int_t)(8 + padded + dl), "crc32", crcs));
		free(head);
		free(hdr);
		free(data);
	}
	if (rc)
		goto cleanup;
	char hash[32];
	snprintf(hash, sizeof hash, "%016llx", (unsigned long long)p->model_hash);
	json_object_set_new(man, "format", json_string(CKPT_FORMAT));
	json_object_set_new(man, "model", json_string(md->name));
	json_object_set_new(man, "model_hash", json_string(hash));
	json_object_set_new(man, "step", json_integer(step));
	json_object_set_new(man, "seed", json_integer((json_int_t)seed));
	json_object_set_new(man, "data_position", json_integer(step + 1));
	json_object_set_new(man, "optimizer", json_string(adam ? "adamw" : "sgd"));
	json_object_set_new(man, "files", files);
	files = NULL;
	ms = json_dumps(man, JSON_INDENT(2) | JSON_SORT_KEYS);
	if (!ms) {
		rc = sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	snprintf(path, sizeof path, "%s/manifest.json", tmp);
	if ((rc = write_file(path, ms, strlen(ms), NULL, 0, NULL, err)))
		goto cleanup;
	remove_tree(fin);
	if (fsync_dir(tmp) || rename(tmp, fin) != 0 || fsync_dir(dir)) {
		rc = sp_err_set(err, SP_EIO, fin, 0, 0, NULL, "cannot publish the checkpoint: %s",
				strerror(errno));
		goto cleanup;
	}
	char line[80];
	snprintf(line, sizeof line, "%s\n", name);
	snprintf(path, sizeof path, "%s/LATEST", dir);
	if ((rc = sp_write_atomic(path, line, strlen(line), err)) || fsync_dir(dir))
		goto cleanup;
	prune(dir, name, prev[0] ? prev : NULL);
cleanup:
	if (rc)
		remove_tree(tmp);
	json_decref(man);
	json_decref(files);
	free(ms);
	free(rec);
	return rc;
}

int ckpt_save(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t step, uint64_t seed, sp_err_t *err)
{
	if (strlen(dir) > 2000)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "checkpoint path is too long");
	void *mine = NULL, *all = NULL;
	size_t bytes = 0, *sizes = NULL;
	int rc = rt_pack_owned(st, 1, &mine, &bytes);
	double bad = rc ? 1 : 0;
	if (!rc && c->gather(c, mine, bytes, &all, &sizes))
		bad = 1;
	free(mine);
	if (c->rank == 0 && !bad) {
		size_t total = 0;
		for (int r = 0; r < c->nranks; r++)
			total += sizes[r];
		if (save_rank0(p, dir, step, seed, all, total, err))
			bad = 1;
	}
	free(all);
	free(sizes);
	/* every rank learns whether the save succeeded */
	if (c->allsum(c, &bad, 1) || bad > 0) {
		if (!err->code)
			sp_err_set(err, SP_EIO, dir, 0, 0, NULL, "checkpoint at step %lld failed",
				   (long long)step);
		return err->code;
	}
	return 0;
}

/* ---- loading ---- */

static int load_file(const char *path, const char *crc_hex, int64_t bytes, uint8_t **out,
		     size_t *len, sp_err_t *err)
{
	char *buf = NULL;
	int rc = sp_read_file(&buf, len, path, err);
	if (rc)
		return rc;
	char crcs[16];
	snprintf(crcs, sizeof crcs, "%08x", sp_crc32(0, buf, *len));
	if ((int64_t)*len != bytes || strcmp(crcs, crc_hex)) {
		free(buf);
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "checkpoint file is corrupt or torn (size %zu, crc32 %s; the "
				  "manifest says %lld, %s)",
				  *len, crcs, (long long)bytes, crc_hex);
	}
	*out = (uint8_t *)buf;
	return 0;
}

/* Builds this rank's records (weights + m + v) from one component file. */
static int component_records(rt_state_t *st, const sp_model_t *md, int comp,
			     const uint8_t *buf, size_t len, const char *path, int adam,
			     uint8_t **recs, size_t *rlen, size_t *rcap, sp_err_t *err)
{
	const sp_component_t *c = &md->comps[comp];
	if (len < 8)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "not a safetensors file");
	uint64_t hl = 0;
	for (int i = 0; i < 8; i++)
		hl |= (uint64_t)buf[i] << (8 * i);
	if (hl > len - 8)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "header runs past the file");
	json_error_t je;
	json_t *h = json_loadb((const char *)buf + 8, (size_t)hl, 0, &je);
	if (!h)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "bad header: %s", je.text);
	int rc = 0;
	json_t *meta = json_object_get(h, "__metadata__");
	const char *ty = json_string_value(json_object_get(meta, "type"));
	const char *dims = json_string_value(json_object_get(meta, "dims"));
	char want[200];
	snprintf(want, sizeof want, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d",
		 (long long)c->vocab, (long long)c->hidden, (long long)c->max_seq,
		 (long long)c->in, (long long)c->out, (long long)c->layers,
		 (long long)c->heads, (long long)c->ffn, (long long)c->classes, c->causal);
	if (!ty || !dims || strcmp(ty, comp_type_name(c->type)) || strcmp(dims, want)) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				"component '%s' in the checkpoint (%s %s) differs from the "
				"model's (%s %s)",
				c->name, ty ? ty : "?", dims ? dims : "?", comp_type_name(c->type),
				want);
		sp_err_hint(err, "a checkpoint resumes only a model with the same components");
		goto cleanup;
	}
	const uint8_t *data = buf + 8 + hl;
	size_t dlen = len - 8 - (size_t)hl;
	int nl = c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
	layer_tensor_t t[12];
	int nt = layer_tensors(c, t);
	int64_t cnt = comp_layer_params(c);
	static const char *const sfx[3] = {"", ".adam_m", ".adam_v"};
	for (int l = 0; l < nl && !rc; l++) {
		size_t need = 16 + 4 * (size_t)cnt * (adam ? 3 : 1);
		if (*rlen + need > *rcap) {
			size_t nc = (*rlen + need) * 2;
			uint8_t *nb = realloc(*recs, nc);
			if (!nb) {
				rc = sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
				break;
			}
			*recs = nb;
			*rcap = nc;
		}
		uint8_t *r = *recs + *rlen;
		int32_t hdr[2] = {comp, l};
		memcpy(r, hdr, 8);
		memcpy(r + 8, &cnt, 8);
		for (int part = 0; part < (adam ? 3 : 1) && !rc; part++)
			for (int q = 0; q < nt; q++) {
				char key[128];
				snprintf(key, sizeof key, "l%d.%s%s", l, t[q].name, sfx[part]);
				json_t *e = json_object_get(h, key);
				json_t *off = json_object_get(e, "data_offsets");
				json_int_t a = json_integer_value(json_array_get(off, 0));
				json_int_t b = json_integer_value(json_array_get(off, 1));
				size_t nb = 4 * (size_t)(t[q].rows * t[q].cols);
				if (!e || a < 0 || b < a || (size_t)b > dlen || (size_t)(b - a) != nb) {
					rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
							"tensor '%s' is missing or has the wrong size",
							key);
					break;
				}
				memcpy(r + 16 + 4 * ((size_t)part * (size_t)cnt + (size_t)t[q].offset),
				       data + a, nb);
			}
		*rlen += need;
	}
	(void)st;
cleanup:
	json_decref(h);
	return rc;
}

static int load_local(rt_state_t *st, const sp_plan_t *p, const char *dir, int64_t *step,
		      sp_err_t *err)
{
	const sp_model_t *md = &p->model;
	int adam = md->opt.kind == OPT_ADAMW;
	char snap[4096], path[8192], name[256];
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	if (access(path, F_OK) == 0) {
		snprintf(snap, sizeof snap, "%s", dir);
	} else {
		if (read_latest(dir, name, sizeof name))
			return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
					  "no checkpoint here (neither LATEST nor manifest.json)");
		snprintf(snap, sizeof snap, "%s/%s", dir, name);
	}
	snprintf(path, sizeof path, "%s/manifest.json", snap);
	json_error_t je;
	json_t *man = json_load_file(path, 0, &je);
	if (!man)
		return sp_err_set(err, SP_EINPUT, path, je.line, je.column, NULL,
				  "unreadable checkpoint manifest: %s", je.text);
	int rc = 0;
	uint8_t *recs = NULL;
	size_t rlen = 0, rcap = 0;
	const char *fmt = json_string_value(json_object_get(man, "format"));
	if (!fmt || strncmp(fmt, "spindle.checkpoint/", 19)) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, "format", "not a Spindle checkpoint");
		goto cleanup;
	}
	if (atoi(fmt + 19) != CKPT_VERSION) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, "format",
				"checkpoint format '%s' is not supported (this build reads "
				"%s)",
				fmt, CKPT_FORMAT);
		goto cleanup;
	}
	json_t *jstep = json_object_get(man, "step");
	const char *opt = json_string_value(json_object_get(man, "optimizer"));
	if (!json_is_integer(jstep) || json_integer_value(jstep) < 0 || !opt) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "manifest lacks step or optimizer");
		goto cleanup;
	}
	if (strcmp(opt, adam ? "adamw" : "sgd")) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, "optimizer",
				"checkpoint optimizer '%s' differs from the model's '%s'", opt,
				adam ? "adamw" : "sgd");
		goto cleanup;
	}
	*step = json_integer_value(jstep);
	json_t *files = json_object_get(man, "files");
	for (int c = 0; c < md->n_comps && !rc; c++) {
		if (md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		json_t *f = NULL, *e;
		size_t i;
		json_array_foreach(files, i, e) {
			const char *cn = json_string_value(json_object_get(e, "component"));
			if (cn && !strcmp(cn, md->comps[c].name))
				f = e;
		}
		if (!f) {
			rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
					"checkpoint has no file for component '%s'",
					md->comps[c].name);
			sp_err_hint(err, "a checkpoint resumes only a model with the same components");
			break;
		}
		const char *fname = json_string_value(json_object_get(f, "file"));
		const char *crc = json_string_value(json_object_get(f, "crc32"));
		json_int_t bytes = json_integer_value(json_object_get(f, "bytes"));
		if (!fname || !crc || strchr(fname, '/')) {
			rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "bad file entry for '%s'",
					md->comps[c].name);
			break;
		}
		char fpath[8192];
		snprintf(fpath, sizeof fpath, "%s/%s", snap, fname);
		uint8_t *buf = NULL;
		size_t len = 0;
		rc = load_file(fpath, crc, bytes, &buf, &len, err);
		if (!rc)
			rc = component_records(st, md, c, buf, len, fpath, adam, &recs, &rlen, &rcap,
					       err);
		free(buf);
	}
	if (!rc)
		rc = rt_unpack(st, recs, rlen, 1, err);
cleanup:
	json_decref(man);
	free(recs);
	return rc;
}

int ckpt_load(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t *step, sp_err_t *err)
{
	sp_err_t mine = {0};
	if (strlen(dir) > 2000)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "checkpoint path is too long");
	double bad = load_local(st, p, dir, step, &mine) ? 1 : 0;
	double agree[2] = {bad, (double)*step};
	if (c->allsum(c, agree, 2))
		return sp_err_set(err, SP_EIO, dir, 0, 0, NULL, "checkpoint load: communication failed");
	if (agree[0] > 0) {
		if (mine.code)
			*err = mine;
		else
			sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL, "checkpoint failed to load on "
								   "another rank");
		return err->code;
	}
	return 0;
}
