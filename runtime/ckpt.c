/*
 * ckpt.c — checkpoints that survive crashes and outlive plans.
 *
 * Save (collective): every rank packs the layers it owns (the lowest rank
 * holding a layer owns it) with their AdamW state; rank 0 gathers them,
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
 * layers it holds. Every rank learns whether every rank succeeded.
 *
 * Not done here: choosing the seed (main.c reads it with ckpt_peek) and
 * detecting a stalled peer in the collectives (main.c's watchdog).
 */
#include "ckpt.h"
#include "layers.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_PREFIX "spindle.checkpoint/"
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
		if (r.count < 0 || (uint64_t)r.count > (bytes - o) / 4 / (size_t)per)
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

/* Bytes written by one save, and the injected failure (testing hook). */
typedef struct {
	const ckpt_fault_t *fault;
	int64_t written;
} writer_t;

static int write_all(writer_t *w, int fd, const void *data, size_t n)
{
	const char *p = data;
	while (n > 0) {
		size_t chunk = n;
		if (w->fault && w->fault->enospc_after > 0) {
			if (w->written >= w->fault->enospc_after) {
				errno = ENOSPC;
				return -1;
			}
			chunk = (size_t)SP_MIN((int64_t)n, w->fault->enospc_after - w->written);
		}
		ssize_t r = write(fd, p, chunk);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		n -= (size_t)r;
		w->written += r;
	}
	return 0;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return -1;
	int rc = fsync(fd), e = errno;
	close(fd);
	/* some file systems cannot sync directories */
	if (rc != 0 && e != EINVAL && e != ENOTSUP) {
		errno = e;
		return -1;
	}
	return 0;
}

/* Creates path (truncating), writes a then b, fsyncs; *crc = CRC-32 of the
 * bytes. */
static int write_file(writer_t *w, const char *path, const void *a, size_t na,
		      const void *b, size_t nb, uint32_t *crc, sp_err_t *err)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return sp_err_set(err, SP_EIO, path, 0, 0, NULL, "cannot create: %s",
				  strerror(errno));
	int rc = 0;
	if (write_all(w, fd, a, na) || (nb && write_all(w, fd, b, nb)))
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "write failed: %s", strerror(errno));
	if (!rc && fsync(fd) != 0 && errno != EINVAL)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "fsync failed: %s", strerror(errno));
	if (close(fd) != 0 && !rc)
		rc = sp_err_set(err, SP_EIO, path, 0, 0, NULL, "close failed: %s", strerror(errno));
	if (crc)
		*crc = sp_crc32(sp_crc32(0, a, na), b, nb);
	return rc;
}

/* Whether name is one of ours: step-<digits>[-<digits>][.tmp]. */
static int snapshot_name(const char *name, int allow_tmp)
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

static void remove_tree(const char *dir);

/*
 * Removes the entries of dir but keep_a and keep_b (either may be NULL).
 * snaps 0: every entry, each a file; snaps 1: only those named like our
 * snapshots (and stale .tmp), each a flat directory.
 */
static void remove_entries(const char *dir, int snaps, const char *keep_a, const char *keep_b)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char path[4608];
	while ((e = readdir(d))) {
		const char *nm = e->d_name;
		if (!strcmp(nm, ".") || !strcmp(nm, "..") || (snaps && !snapshot_name(nm, 1)) ||
		    (keep_a && !strcmp(nm, keep_a)) || (keep_b && !strcmp(nm, keep_b)))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, nm);
		if (snaps)
			remove_tree(path);
		else
			unlink(path);
	}
	closedir(d);
}

/* Removes a snapshot directory (flat: files only) and its files. */
static void remove_tree(const char *dir)
{
	remove_entries(dir, 0, NULL, NULL);
	rmdir(dir);
}

/* Removes every snapshot (and stale .tmp) in dir but keep_a and keep_b. */
static void prune(const char *dir, const char *keep_a, const char *keep_b)
{
	remove_entries(dir, 1, keep_a, keep_b);
}

/* The snapshot LATEST names (0), or -1 when there is none or it is not
 * one of ours. */
static int read_latest(const char *dir, char *name, size_t cap)
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
	return snapshot_name(name, 0) ? 0 : -1;
}

static void dims_string(char *out, size_t cap, const sp_component_t *c)
{
	snprintf(out, cap, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d",
		 (long long)c->vocab, (long long)c->hidden, (long long)c->max_seq,
		 (long long)c->in, (long long)c->out, (long long)c->layers,
		 (long long)c->heads, (long long)c->ffn, (long long)c->classes, c->causal);
}

static int comp_layers(const sp_component_t *c)
{
	return c->type == COMP_TRANSFORMER ? (int)c->layers : 1;
}

static json_t *tensor_shape(const layer_tensor_t *t)
{
	/* layers.h gives vectors as cols == 1 */
	return t->cols == 1 ? json_pack("[I]", (json_int_t)t->rows)
			    : json_pack("[I,I]", (json_int_t)t->rows, (json_int_t)t->cols);
}

/* One component's safetensors file in memory: header JSON + data. rec[]
 * is sorted and holds every layer of comp exactly once. */
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
	char dims[200];
	dims_string(dims, sizeof dims, c);
	/* safetensors: __metadata__ maps strings to strings */
	if (json_object_set_new(meta, "format", json_string("spindle.tensors/1")) ||
	    json_object_set_new(meta, "component", json_string(c->name)) ||
	    json_object_set_new(meta, "type", json_string(comp_type_name(c->type))) ||
	    json_object_set_new(meta, "dims", json_string(dims)))
		goto cleanup;
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
	layer_tensor_t t[12];
	int nt = layer_tensors(c, t);
	for (int part = 0; part < (adam ? 3 : 1); part++)
		for (int i = 0; i < n; i++) {
			if (rec[i].comp != comp)
				continue;
			for (int q = 0; q < nt; q++) {
				char key[128];
				snprintf(key, sizeof key, "l%d.%s%s", rec[i].layer, t[q].name, sfx[part]);
				size_t nb = 4 * (size_t)(t[q].rows * t[q].cols);
				json_t *d = json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape",
						      tensor_shape(&t[q]), "data_offsets",
						      (json_int_t)o, (json_int_t)(o + nb));
				if (!d || json_object_set_new(h, key, d))
					goto cleanup;
				memcpy(data + o,
				       rec[i].data + (size_t)part * (size_t)rec[i].count + t[q].offset, nb);
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

/* CRC-32 of the compact, key-sorted JSON of the manifest without its
 * "manifest_crc32" member, as 8 hex digits. */
static int manifest_crc(const json_t *man, char out[9])
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

/* Every parameter layer of the model is in rec[] exactly once, with the
 * model's size (rec[] sorted). */
static int check_records(const sp_model_t *md, const rec_t *rec, int n, sp_err_t *err)
{
	int i = 0;
	for (int c = 0; c < md->n_comps; c++) {
		if (md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		for (int l = 0; l < comp_layers(&md->comps[c]); l++, i++)
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

static void fault_kill(void)
{
	fprintf(stderr, "spindle-run: rank 0: killing itself in a checkpoint save (fault "
			"injection)\n");
	fflush(stderr);
	raise(SIGKILL);
}

/* One snapshot being saved by rank 0: where it goes and how far it got. */
typedef struct {
	const sp_plan_t *p;
	const char *dir;
	int64_t step;
	const ckpt_fault_t *fault;
	writer_t w;
	char name[64], tmp[4200], fin[4096], prev[256];
	int renamed, published;
} snap_t;

/* The checkpoint directory, the previous LATEST, a fresh snapshot name
 * (never overwriting a snapshot, published or not) and its temporary
 * directory, created empty. */
static int snap_begin(snap_t *S, sp_err_t *err)
{
	if (mkdir(S->dir, 0755) != 0 && errno != EEXIST)
		return sp_err_set(err, SP_EIO, S->dir, 0, 0, NULL,
				  "cannot create the checkpoint directory: %s", strerror(errno));
	if (read_latest(S->dir, S->prev, sizeof S->prev))
		S->prev[0] = 0;
	struct stat sb;
	snprintf(S->name, sizeof S->name, "step-%08lld", (long long)S->step);
	snprintf(S->fin, sizeof S->fin, "%s/%s", S->dir, S->name);
	for (int k = 2; lstat(S->fin, &sb) == 0 && k < 1000000; k++) {
		snprintf(S->name, sizeof S->name, "step-%08lld-%d", (long long)S->step, k);
		snprintf(S->fin, sizeof S->fin, "%s/%s", S->dir, S->name);
	}
	snprintf(S->tmp, sizeof S->tmp, "%s.tmp", S->fin);
	remove_tree(S->tmp);
	if (mkdir(S->tmp, 0755) != 0) {
		int rc = sp_err_set(err, SP_EIO, S->tmp, 0, 0, NULL,
				    "cannot create the checkpoint's temporary directory: %s",
				    strerror(errno));
		S->tmp[0] = 0; /* nothing of ours to remove */
		return rc;
	}
	return 0;
}

/* Component c's safetensors file in the temporary directory, and its
 * entry (name, bytes, CRC) appended to files. */
static int snap_component(snap_t *S, int c, const rec_t *rec, int n, json_t *files,
			  sp_err_t *err)
{
	const sp_model_t *md = &S->p->model;
	char *hdr = NULL, path[4608];
	uint8_t *data = NULL, *head = NULL;
	size_t hl = 0, dl = 0;
	int rc = 0;
	if (component_file(md, c, rec, n, md->opt.kind == OPT_ADAMW, &hdr, &hl, &data, &dl))
		goto nomem;
	/* header padded with spaces to 8 bytes, as safetensors allows */
	size_t padded = (hl + 7) & ~(size_t)7;
	if (!(head = malloc(8 + padded)))
		goto nomem;
	uint64_t len = padded;
	for (int i = 0; i < 8; i++)
		head[i] = (uint8_t)(len >> (8 * i));
	memcpy(head + 8, hdr, hl);
	memset(head + 8 + hl, ' ', padded - hl);
	snprintf(path, sizeof path, "%s/%s.safetensors", S->tmp, md->comps[c].name);
	uint32_t crc = 0;
	if ((rc = write_file(&S->w, path, head, 8 + padded, data, dl, &crc, err)))
		goto done;
	char crcs[16];
	snprintf(crcs, sizeof crcs, "%08" PRIx32, crc);
	json_t *f = json_pack("{s:s, s:s, s:I, s:s}", "component", md->comps[c].name, "file",
			      strrchr(path, '/') + 1, "bytes", (json_int_t)(8 + padded + dl),
			      "crc32", crcs);
	if (!f || json_array_append_new(files, f))
		goto nomem;
	goto done;
nomem:
	rc = sp_err_set(err, SP_ENOMEM, S->dir, 0, 0, NULL, "out of memory");
done:
	free(head);
	free(hdr);
	free(data);
	return rc;
}

/* manifest.json (takes files), then the temporary directory synced. */
static int snap_manifest(snap_t *S, uint64_t seed, json_t *files, sp_err_t *err)
{
	const sp_model_t *md = &S->p->model;
	char hash[32], mcrc[9], path[4608], *ms = NULL;
	json_t *man = json_object();
	int rc = 0;
	snprintf(hash, sizeof hash, "%016llx", (unsigned long long)S->p->model_hash);
	if (!man) {
		json_decref(files);
		return sp_err_set(err, SP_ENOMEM, S->dir, 0, 0, NULL, "out of memory");
	}
	json_object_set_new(man, "format", json_string(CKPT_FORMAT));
	json_object_set_new(man, "model", json_string(md->name));
	json_object_set_new(man, "model_hash", json_string(hash));
	json_object_set_new(man, "step", json_integer(S->step));
	json_object_set_new(man, "seed", json_integer((json_int_t)seed));
	json_object_set_new(man, "data_position", json_integer(S->step + 1));
	json_object_set_new(man, "optimizer",
			    json_string(md->opt.kind == OPT_ADAMW ? "adamw" : "sgd"));
	json_object_set_new(man, "files", files);
	if (manifest_crc(man, mcrc) ||
	    json_object_set_new(man, "manifest_crc32", json_string(mcrc)) ||
	    !(ms = json_dumps(man, JSON_INDENT(2) | JSON_SORT_KEYS))) {
		rc = sp_err_set(err, SP_ENOMEM, S->dir, 0, 0, NULL, "out of memory");
	} else {
		snprintf(path, sizeof path, "%s/manifest.json", S->tmp);
		rc = write_file(&S->w, path, ms, strlen(ms), "\n", 1, NULL, err);
	}
	if (!rc && fsync_dir(S->tmp) != 0)
		rc = sp_err_set(err, SP_EIO, S->tmp, 0, 0, NULL, "fsync failed: %s",
				strerror(errno));
	json_decref(man);
	free(ms);
	return rc;
}

/* The temporary directory renamed to its final name, then the commit
 * point: LATEST names the new snapshot; older ones pruned. */
static int snap_publish(snap_t *S, sp_err_t *err)
{
	const ckpt_fault_t *fault = S->fault;
	char line[80], path[4608], latest[4608];
	if (fault && fault->kill_step == S->step && !fault->kill_latest)
		fault_kill();
	if (rename(S->tmp, S->fin) != 0)
		return sp_err_set(err, SP_EIO, S->fin, 0, 0, NULL,
				  "cannot publish the checkpoint: %s", strerror(errno));
	S->renamed = 1;
	if (fsync_dir(S->dir) != 0)
		return sp_err_set(err, SP_EIO, S->dir, 0, 0, NULL, "fsync failed: %s",
				  strerror(errno));
	if (fault && fault->kill_step == S->step && fault->kill_latest)
		fault_kill();
	snprintf(line, sizeof line, "%s\n", S->name);
	snprintf(path, sizeof path, "%s/LATEST.tmp", S->dir);
	snprintf(latest, sizeof latest, "%s/LATEST", S->dir);
	int rc = write_file(&S->w, path, line, strlen(line), NULL, 0, NULL, err);
	if (!rc && rename(path, latest) != 0)
		rc = sp_err_set(err, SP_EIO, latest, 0, 0, NULL, "cannot replace: %s",
				strerror(errno));
	if (rc) {
		unlink(path);
		return rc;
	}
	S->published = 1;
	if (fsync_dir(S->dir) != 0)
		return sp_err_set(err, SP_EIO, S->dir, 0, 0, NULL,
				  "fsync failed after publishing '%s': %s", S->name,
				  strerror(errno));
	prune(S->dir, S->name, S->prev[0] ? S->prev : NULL);
	return 0;
}

static int save_rank0(const sp_plan_t *p, const char *dir, int64_t step, uint64_t seed,
		      const void *all, size_t total, const ckpt_fault_t *fault, sp_err_t *err)
{
	const sp_model_t *md = &p->model;
	snap_t S = {.p = p, .dir = dir, .step = step, .fault = fault, .w = {fault, 0}};
	rec_t *rec = NULL;
	json_t *files = NULL;
	int n = 0, rc;
	if (parse_records(all, total, md->opt.kind == OPT_ADAMW ? 3 : 1, &rec, &n)) {
		free(rec);
		return sp_err_set(err, SP_EINTERNAL, dir, 0, 0, NULL, "bad parameter records");
	}
	qsort(rec, (size_t)n, sizeof *rec, cmp_rec);
	if ((rc = check_records(md, rec, n, err)) || (rc = snap_begin(&S, err)))
		goto cleanup;
	if (!(files = json_array())) {
		rc = sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	for (int c = 0; c < md->n_comps && !rc; c++)
		if (md->comps[c].type != COMP_CONTRASTIVE)
			rc = snap_component(&S, c, rec, n, files, err);
	if (rc)
		goto cleanup;
	rc = snap_manifest(&S, seed, files, err);
	files = NULL; /* the manifest took it */
	if (!rc)
		rc = snap_publish(&S, err);
cleanup:
	if (rc && !S.published && S.tmp[0]) {
		remove_tree(S.renamed ? S.fin : S.tmp);
		if (S.renamed)
			fsync_dir(dir);
	}
	json_decref(files);
	free(rec);
	return rc;
}

int ckpt_check_dir(const char *dir, int *created, sp_err_t *err)
{
	*created = 0;
	if (strlen(dir) > 2000)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "checkpoint path is too long");
	if (mkdir(dir, 0755) == 0)
		*created = 1;
	else if (errno != EEXIST) {
		int e = errno;
		sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
			   "cannot create the checkpoint directory: %s", strerror(e));
		if (e == ENOENT)
			sp_err_hint(err, "create its parent directory first");
		return err->code;
	}
	struct stat sb;
	if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
		return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
				  "the checkpoint path exists and is not a directory");
	char probe[2100];
	snprintf(probe, sizeof probe, "%s/.probe.%ld", dir, (long)getpid());
	int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0) {
		int e = errno;
		if (*created)
			rmdir(dir);
		*created = 0;
		return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
				  "cannot write in the checkpoint directory: %s", strerror(e));
	}
	close(fd);
	unlink(probe);
	return 0;
}

int ckpt_save(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *dir,
	      int64_t step, uint64_t seed, const ckpt_fault_t *fault, sp_err_t *err)
{
	if (strlen(dir) > 2000)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "checkpoint path is too long");
	void *mine = NULL, *all = NULL;
	size_t bytes = 0, *sizes = NULL;
	double bad = 0;
	if (rt_pack_owned(st, 1, &mine, &bytes)) {
		sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL,
			   "rank %d: out of memory packing the checkpoint", c->rank);
		mine = NULL;
		bytes = 0;
		bad = 1;
	}
	/* every rank takes part in every collective, failed or not */
	int comm = c->ops->gather(c, mine, bytes, &all, &sizes);
	free(mine);
	if (comm || c->ops->allsum(c, &bad, 1)) {
		free(all);
		free(sizes);
		return sp_err_set(err, CKPT_ECOMM, dir, 0, 0, NULL,
				  "rank %d: gathering the checkpoint of step %lld failed", c->rank,
				  (long long)step);
	}
	if (c->rank == 0 && !bad) {
		size_t total = 0;
		for (int r = 0; r < c->nranks; r++)
			total += sizes[r];
		if (save_rank0(p, dir, step, seed, all, total, fault, err))
			bad = 1;
	}
	free(all);
	free(sizes);
	/* every rank learns whether the save succeeded */
	if (c->ops->allsum(c, &bad, 1))
		return sp_err_set(err, CKPT_ECOMM, dir, 0, 0, NULL,
				  "rank %d: checkpoint of step %lld: communication failed", c->rank,
				  (long long)step);
	if (bad > 0)
		return sp_err_set(err, SP_EIO, dir, 0, 0, NULL,
				  "checkpoint of step %lld failed on rank 0", (long long)step);
	return 0;
}

/* ---- loading ---- */

/* Resolves the snapshot in dir and reads its manifest: format and version
 * first, then the manifest's CRC-32 and fields. */
static int read_manifest(const char *dir, char *snap, size_t cap, json_t **out,
			 int64_t *step, uint64_t *seed, sp_err_t *err)
{
	char path[4608], name[256];
	*out = NULL;
	if (strlen(dir) > 2000)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "checkpoint path is too long");
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	if (access(path, F_OK) == 0) {
		snprintf(snap, cap, "%s", dir);
	} else {
		snprintf(path, sizeof path, "%s/LATEST", dir);
		if (access(path, F_OK) != 0)
			return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
					  "no checkpoint here (neither LATEST nor manifest.json)");
		if (read_latest(dir, name, sizeof name))
			return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
					  "does not name a snapshot (step-NNNNNNNN)");
		snprintf(snap, cap, "%s/%s", dir, name);
	}
	snprintf(path, sizeof path, "%s/manifest.json", snap);
	char *text = NULL;
	size_t len = 0;
	int rc = sp_read_file(&text, &len, path, err);
	if (rc)
		return rc;
	json_error_t je;
	json_t *man = json_loadb(text, len, 0, &je);
	free(text);
	if (!man)
		return sp_err_set(err, SP_EINPUT, path, je.line, je.column, NULL,
				  "checkpoint manifest is corrupt or torn: %s", je.text);
	const char *fmt = json_string_value(json_object_get(man, "format"));
	if (!fmt || strncmp(fmt, CKPT_PREFIX, strlen(CKPT_PREFIX))) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, "format", "not a Spindle checkpoint");
		goto cleanup;
	}
	if (strcmp(fmt, CKPT_FORMAT)) {
		const char *v = fmt + strlen(CKPT_PREFIX);
		char *end = NULL;
		long ver = strtol(v, &end, 10);
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, "format",
				"checkpoint format '%s' is %s (this build reads %s)", fmt,
				*v && !*end && ver > CKPT_VERSION ? "newer than this build"
								  : "not supported",
				CKPT_FORMAT);
		if (*v && !*end && ver > CKPT_VERSION)
			sp_err_hint(err, "resume with the spindle-run that wrote it, or a newer one");
		goto cleanup;
	}
	char want[9];
	const char *got = json_string_value(json_object_get(man, "manifest_crc32"));
	if (manifest_crc(man, want)) {
		rc = sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	if (!got || strcmp(got, want)) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				"checkpoint manifest is corrupt (crc32 %s; it records %s)", want,
				got ? got : "none");
		goto cleanup;
	}
	json_t *jstep = json_object_get(man, "step"), *jseed = json_object_get(man, "seed");
	json_t *jpos = json_object_get(man, "data_position");
	if (!json_is_integer(jstep) || json_integer_value(jstep) < 0 || !json_is_integer(jseed) ||
	    !json_is_integer(jpos) || json_integer_value(jpos) != json_integer_value(jstep) + 1 ||
	    !json_is_string(json_object_get(man, "optimizer")) ||
	    !json_is_array(json_object_get(man, "files"))) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				"checkpoint manifest lacks step, seed, data_position, optimizer "
				"or files");
		goto cleanup;
	}
	*step = json_integer_value(jstep);
	*seed = (uint64_t)json_integer_value(jseed);
	*out = man;
	man = NULL;
cleanup:
	json_decref(man);
	return rc;
}

int ckpt_peek(const char *dir, int64_t *step, uint64_t *seed, sp_err_t *err)
{
	char snap[4096];
	json_t *man = NULL;
	int rc = read_manifest(dir, snap, sizeof snap, &man, step, seed, err);
	json_decref(man);
	return rc;
}

static int load_file(const char *path, const char *crc_hex, json_int_t bytes, uint8_t **out,
		     size_t *len, sp_err_t *err)
{
	char *buf = NULL;
	int rc = sp_read_file(&buf, len, path, err);
	if (rc)
		return rc;
	char crcs[16];
	snprintf(crcs, sizeof crcs, "%08" PRIx32, sp_crc32(0, buf, *len));
	if ((json_int_t)*len != bytes || strcmp(crcs, crc_hex)) {
		free(buf);
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "checkpoint file is corrupt or torn (size %zu, crc32 %s; the "
				  "manifest records %lld, %s)",
				  *len, crcs, (long long)bytes, crc_hex);
	}
	*out = (uint8_t *)buf;
	return 0;
}

/* The tensor `key` of a safetensors header: its byte range in the data,
 * checked against dtype F32, the expected shape and the data size. */
static int tensor_range(json_t *h, const char *key, const layer_tensor_t *t, size_t dlen,
			size_t *a_out)
{
	json_t *e = json_object_get(h, key);
	json_t *off = json_object_get(e, "data_offsets"), *shape = json_object_get(e, "shape");
	json_t *want = tensor_shape(t);
	int ok = json_is_object(e) && json_is_array(off) && json_array_size(off) == 2 &&
		 json_is_integer(json_array_get(off, 0)) && json_is_integer(json_array_get(off, 1)) &&
		 json_is_string(json_object_get(e, "dtype")) &&
		 !strcmp(json_string_value(json_object_get(e, "dtype")), "F32") && want &&
		 json_equal(shape, want);
	json_decref(want);
	if (!ok)
		return -1;
	json_int_t a = json_integer_value(json_array_get(off, 0));
	json_int_t b = json_integer_value(json_array_get(off, 1));
	size_t nb = 4 * (size_t)(t->rows * t->cols);
	if (a < 0 || b < a || (uint64_t)b > (uint64_t)dlen || (uint64_t)(b - a) != nb)
		return -1;
	*a_out = (size_t)a;
	return 0;
}

/* Appends this component's records (weights [+ m + v] per layer) from its
 * safetensors file to *recs. */
static int component_records(const sp_model_t *md, int comp, const uint8_t *buf, size_t len,
			     const char *path, int adam, uint8_t **recs, size_t *rlen,
			     size_t *rcap, sp_err_t *err)
{
	const sp_component_t *c = &md->comps[comp];
	if (len < 8)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "not a safetensors file");
	uint64_t hl = 0;
	for (int i = 0; i < 8; i++)
		hl |= (uint64_t)buf[i] << (8 * i);
	if (hl > len - 8 || hl < 2 || buf[8] != '{')
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "not a safetensors file (header length %llu of %zu bytes)",
				  (unsigned long long)hl, len);
	json_error_t je;
	json_t *h = json_loadb((const char *)buf + 8, (size_t)hl, 0, &je);
	if (!h)
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL, "bad safetensors header: %s",
				  je.text);
	int rc = 0;
	json_t *meta = json_object_get(h, "__metadata__");
	const char *ty = json_string_value(json_object_get(meta, "type"));
	const char *dims = json_string_value(json_object_get(meta, "dims"));
	char want[200];
	dims_string(want, sizeof want, c);
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
	layer_tensor_t t[12];
	int nt = layer_tensors(c, t);
	int64_t cnt = comp_layer_params(c);
	static const char *const sfx[3] = {"", ".adam_m", ".adam_v"};
	size_t need = 16 + 4 * (size_t)cnt * (adam ? 3 : 1);
	for (int l = 0; l < comp_layers(c) && !rc; l++) {
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
				size_t a = 0;
				snprintf(key, sizeof key, "l%d.%s%s", l, t[q].name, sfx[part]);
				if (tensor_range(h, key, &t[q], dlen, &a)) {
					rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
							"tensor '%s' is missing or has the wrong "
							"dtype, shape or offsets",
							key);
					break;
				}
				memcpy(r + 16 + 4 * ((size_t)part * (size_t)cnt + (size_t)t[q].offset),
				       data + a, 4 * (size_t)(t[q].rows * t[q].cols));
			}
		*rlen += need;
	}
cleanup:
	json_decref(h);
	return rc;
}

static int load_local(rt_state_t *st, const sp_plan_t *p, const char *dir, int64_t *step,
		      sp_err_t *err)
{
	const sp_model_t *md = &p->model;
	int adam = md->opt.kind == OPT_ADAMW;
	char snap[4096], mpath[4608];
	uint64_t seed = 0;
	json_t *man = NULL;
	int rc = read_manifest(dir, snap, sizeof snap, &man, step, &seed, err);
	if (rc)
		return rc;
	snprintf(mpath, sizeof mpath, "%s/manifest.json", snap);
	uint8_t *recs = NULL;
	size_t rlen = 0, rcap = 0;
	const char *opt = json_string_value(json_object_get(man, "optimizer"));
	if (strcmp(opt, adam ? "adamw" : "sgd")) {
		rc = sp_err_set(err, SP_EINPUT, mpath, 0, 0, "optimizer",
				"checkpoint optimizer '%s' differs from the model's '%s'", opt,
				adam ? "adamw" : "sgd");
		goto cleanup;
	}
	json_t *files = json_object_get(man, "files"), *e;
	size_t i;
	/* the same set of components: none missing (below), none extra */
	json_array_foreach(files, i, e) {
		const char *cn = json_string_value(json_object_get(e, "component"));
		int found = 0;
		for (int c = 0; cn && c < md->n_comps; c++)
			found |= md->comps[c].type != COMP_CONTRASTIVE && !strcmp(cn, md->comps[c].name);
		if (!found) {
			rc = sp_err_set(err, SP_EINPUT, mpath, 0, 0, NULL,
					"checkpoint holds component '%s', which the model '%s' "
					"lacks",
					cn ? cn : "?", md->name);
			sp_err_hint(err, "a checkpoint resumes only a model with the same components");
			goto cleanup;
		}
	}
	for (int c = 0; c < md->n_comps && !rc; c++) {
		if (md->comps[c].type == COMP_CONTRASTIVE)
			continue;
		json_t *f = NULL;
		json_array_foreach(files, i, e) {
			const char *cn = json_string_value(json_object_get(e, "component"));
			if (cn && !strcmp(cn, md->comps[c].name))
				f = e;
		}
		if (!f) {
			rc = sp_err_set(err, SP_EINPUT, mpath, 0, 0, NULL,
					"checkpoint has no file for component '%s' of the model "
					"'%s'",
					md->comps[c].name, md->name);
			sp_err_hint(err, "a checkpoint resumes only a model with the same components");
			break;
		}
		const char *fname = json_string_value(json_object_get(f, "file"));
		const char *crc = json_string_value(json_object_get(f, "crc32"));
		json_t *jb = json_object_get(f, "bytes");
		if (!fname || !crc || !json_is_integer(jb) || strchr(fname, '/') ||
		    !strcmp(fname, "..")) {
			rc = sp_err_set(err, SP_EINPUT, mpath, 0, 0, NULL, "bad file entry for '%s'",
					md->comps[c].name);
			break;
		}
		char fpath[8192];
		snprintf(fpath, sizeof fpath, "%s/%s", snap, fname);
		uint8_t *buf = NULL;
		size_t len = 0;
		rc = load_file(fpath, crc, json_integer_value(jb), &buf, &len, err);
		if (!rc)
			rc = component_records(md, c, buf, len, fpath, adam, &recs, &rlen, &rcap, err);
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
	*step = 0;
	int rc = load_local(st, p, dir, step, &mine);
	/* flags[r]: rank r failed; the last entry checks that all read one step */
	double *flags = calloc((size_t)c->nranks + 1, sizeof(double));
	if (!flags)
		return sp_err_set(err, CKPT_ECOMM, NULL, 0, 0, NULL, "out of memory");
	flags[c->rank] = rc ? 1 : 0;
	flags[c->nranks] = rc ? 0 : (double)*step;
	if (c->ops->allsum(c, flags, c->nranks + 1)) {
		free(flags);
		return sp_err_set(err, CKPT_ECOMM, dir, 0, 0, NULL,
				  "rank %d: checkpoint load: communication failed", c->rank);
	}
	int first_bad = -1, n_bad = 0;
	for (int r = 0; r < c->nranks; r++)
		if (flags[r] > 0) {
			n_bad++;
			if (first_bad < 0)
				first_bad = r;
		}
	double sum_step = flags[c->nranks];
	free(flags);
	if (rc) {
		*err = mine;
		return rc;
	}
	if (n_bad)
		return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
				  "checkpoint failed to load on rank %d", first_bad);
	if (sum_step != (double)*step * c->nranks)
		return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
				  "the ranks read different checkpoints (was it replaced while "
				  "loading?)");
	return 0;
}
