/*
 * ckpt_save.c — writing a checkpoint (ckpt_save, ckpt_check_dir): records
 * gathered on rank 0, one safetensors file per component and the manifest
 * in a temporary directory, published by renames with LATEST as the commit
 * point, older snapshots pruned (the protocol is described in ckpt.c). It
 * does not read checkpoints (ckpt_load.c).
 */
#include "ckpt_internal.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
		if (!strcmp(nm, ".") || !strcmp(nm, "..") || (snaps && !ck_snapshot_name(nm, 1)) ||
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

/* One component's safetensors file in memory. rec[] is sorted and holds
 * every layer of comp exactly once. */
static int component_file(const sp_model_t *md, int comp, const rec_t *rec, int n, int adam,
			  uint8_t **file, size_t *len, st_out_t *o)
{
	const sp_component_t *c = &md->comps[comp];
	char dims[200];
	ck_dims_string(dims, sizeof dims, c);
	/* safetensors: __metadata__ maps strings to strings */
	if (st_out_init(o, json_pack("{s:s, s:s, s:s, s:s}", "format", "spindle.tensors/1",
				     "component", c->name, "type", comp_type_name(c->type),
				     "dims", dims)))
		return -1;
	static const char *const sfx[3] = {"", ".adam_m", ".adam_v"};
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(c, t);
	for (int part = 0; part < (adam ? 3 : 1); part++)
		for (int i = 0; i < n; i++) {
			if (rec[i].comp != comp)
				continue;
			for (int q = 0; q < nt; q++) {
				char key[128];
				snprintf(key, sizeof key, "l%d.%s%s", rec[i].layer, t[q].name, sfx[part]);
				if (st_out_add(o, key, &t[q],
					       rec[i].data + (size_t)part * (size_t)rec[i].count +
						       t[q].offset,
					       ST_F32))
					return -1;
			}
		}
	return st_out_finish(o, file, len);
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
	uint64_t seed;
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
	if (ck_read_latest(S->dir, S->prev, sizeof S->prev))
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
	char path[4608];
	uint8_t *file = NULL;
	size_t len = 0;
	st_out_t o = {0};
	int rc = 0;
	if (component_file(md, c, rec, n, md->opt.kind == OPT_ADAMW, &file, &len, &o))
		goto nomem;
	snprintf(path, sizeof path, "%s/%s.safetensors", S->tmp, md->comps[c].name);
	uint32_t crc = 0;
	if ((rc = write_file(&S->w, path, file, len, NULL, 0, &crc, err)))
		goto done;
	char crcs[16];
	snprintf(crcs, sizeof crcs, "%08" PRIx32, crc);
	json_t *f = json_pack("{s:s, s:s, s:I, s:s}", "component", md->comps[c].name, "file",
			      strrchr(path, '/') + 1, "bytes", (json_int_t)len,
			      "crc32", crcs);
	if (!f || json_array_append_new(files, f))
		goto nomem;
	goto done;
nomem:
	rc = sp_err_set(err, SP_ENOMEM, S->dir, 0, 0, NULL, "out of memory");
done:
	free(file);
	st_out_release(&o);
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
	if (ck_manifest_crc(man, mcrc) ||
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

/* Rank 0, given the gathered records: the whole save of snapshot *ctx. */
static int save_rank0(void *ctx, const void *all, size_t total, sp_err_t *err)
{
	snap_t *S = ctx;
	const char *dir = S->dir;
	const sp_model_t *md = &S->p->model;
	rec_t *rec = NULL;
	json_t *files = NULL;
	int n = 0, rc;
	if (ck_parse_records(all, total, md->opt.kind == OPT_ADAMW ? 3 : 1, &rec, &n)) {
		free(rec);
		return sp_err_set(err, SP_EINTERNAL, dir, 0, 0, NULL, "bad parameter records");
	}
	qsort(rec, (size_t)n, sizeof *rec, ck_cmp_rec);
	if ((rc = ck_check_records(md, rec, n, err)) || (rc = snap_begin(S, err)))
		goto cleanup;
	if (!(files = json_array())) {
		rc = sp_err_set(err, SP_ENOMEM, dir, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	for (int c = 0; c < md->n_comps && !rc; c++)
		if (ck_comp_trained(md, c))
			rc = snap_component(S, c, rec, n, files, err);
	if (rc)
		goto cleanup;
	rc = snap_manifest(S, S->seed, files, err);
	files = NULL; /* the manifest took it */
	if (!rc)
		rc = snap_publish(S, err);
cleanup:
	if (rc && !S->published && S->tmp[0]) {
		remove_tree(S->renamed ? S->fin : S->tmp);
		if (S->renamed)
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
	snap_t S = {.p = p, .dir = dir, .step = step, .seed = seed, .fault = fault,
		    .w = {fault, 0}};
	char what[64];
	snprintf(what, sizeof what, "the checkpoint of step %lld", (long long)step);
	return ckpt_gather_apply(st, c, 1, save_rank0, &S, what, err);
}
