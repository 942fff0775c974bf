/*
 * ckpt_load.c — reading a checkpoint (ckpt_peek, ckpt_load): the manifest's
 * format, version and CRC first, then every file's size and CRC, the
 * components against the model and the safetensors structure, then the
 * layers this rank holds (the protocol is described in ckpt.c). It writes
 * nothing.
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
		if (ck_read_latest(dir, name, sizeof name))
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
	if (ck_manifest_crc(man, want)) {
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
	/* step at most 2^40, the most --steps allows: the step after a run
	 * (step + --steps) stays far inside int64, and the ranks' sum of steps
	 * in ck_agree stays exact in a double */
	if (json_integer_value(jstep) > ((json_int_t)1 << 40)) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, "step",
				"checkpoint step %lld is out of range (at most 2^40)",
				(long long)json_integer_value(jstep));
		goto cleanup;
	}
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

/* Appends this component's records (weights [+ m + v] per layer) from its
 * safetensors file to *recs. */
static int component_records(const sp_model_t *md, int comp, const uint8_t *buf, size_t len,
			     const char *path, int adam, uint8_t **recs, size_t *rlen,
			     size_t *rcap, sp_err_t *err)
{
	const sp_component_t *c = &md->comps[comp];
	st_in_t in;
	int rc = st_in_mem(&in, path, buf, len, err);
	if (rc)
		goto cleanup;
	json_t *meta = json_object_get(in.hdr, "__metadata__");
	const char *ty = json_string_value(json_object_get(meta, "type"));
	const char *dims = json_string_value(json_object_get(meta, "dims"));
	char want[200];
	ck_dims_string(want, sizeof want, c);
	if (!ty || !dims || strcmp(ty, comp_type_name(c->type)) || strcmp(dims, want)) {
		rc = sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				"component '%s' in the checkpoint (%s %s) differs from the "
				"model's (%s %s)",
				c->name, ty ? ty : "?", dims ? dims : "?", comp_type_name(c->type),
				want);
		sp_err_hint(err, "a checkpoint resumes only a model with the same components");
		goto cleanup;
	}
	layer_tensor_t t[LAYER_TENSORS_MAX];
	int nt = layer_tensors(c, t);
	int64_t cnt = comp_layer_params(c);
	static const char *const sfx[3] = {"", ".adam_m", ".adam_v"};
	size_t need = 16 + 4 * (size_t)cnt * (adam ? 3 : 1);
	for (int l = 0; l < ck_comp_layers(c) && !rc; l++) {
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
		float *f = (float *)(void *)(r + 16);
		for (int part = 0; part < (adam ? 3 : 1) && !rc; part++)
			for (int q = 0; q < nt && !rc; q++) {
				char key[128];
				snprintf(key, sizeof key, "l%d.%s%s", l, t[q].name, sfx[part]);
				rc = st_in_get(&in, key, NULL, &t[q], 1,
					       f + (size_t)part * (size_t)cnt + (size_t)t[q].offset, err);
			}
		*rlen += need;
	}
cleanup:
	st_in_release(&in);
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
	/* the same set of components: none missing (below), none extra; a file
	 * for a component this model has but leaves unused is skipped */
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
		if (!ck_comp_trained(md, c))
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
	double sum_step = 0;
	int rc = load_local(st, p, dir, step, &mine);
	/* the sum of the steps read checks that all read one step */
	if ((rc = ck_agree(c, rc, &mine, (double)*step, &sum_step, dir, "the checkpoint load",
			   err)))
		return rc;
	if (sum_step != (double)*step * c->nranks)
		return sp_err_set(err, SP_EINPUT, dir, 0, 0, NULL,
				  "the ranks read different checkpoints (was it replaced while "
				  "loading?)");
	return 0;
}
