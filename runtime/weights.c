/*
 * weights.c — spindle-run --init and --export: the model's parameters as
 * one safetensors file named "<component>.<layer>.<tensor>" (weights.h),
 * with an optional rename map on the way in. It reads and writes only
 * parameters: no optimizer state, no data position (that is a checkpoint,
 * ckpt.c), and it never changes which layers a rank holds.
 */
#include "weights.h"

#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WEIGHTS_FORMAT "spindle.weights/1"

/* One parameter tensor of the model, and the file's name for it. */
typedef struct {
	char name[160];
	int comp, layer;
	layer_tensor_t t;
	const char *src; /* the file's tensor that gives it, or NULL */
} want_t;

/* Every parameter tensor of every component (unused ones too, so their
 * names are known), in canonical order. */
static int model_tensors(const sp_model_t *md, want_t **out, int *n)
{
	int cap = 0;
	*out = NULL;
	*n = 0;
	for (int c = 0; c < md->n_comps; c++) {
		layer_tensor_t t[LAYER_TENSORS_MAX];
		int nt = layer_tensors(&md->comps[c], t);
		for (int l = 0; l < ck_comp_layers(&md->comps[c]); l++)
			for (int q = 0; q < nt; q++) {
				want_t w = {.comp = c, .layer = l, .t = t[q]};
				snprintf(w.name, sizeof w.name, "%s.%d.%s", md->comps[c].name, l,
					 t[q].name);
				if (SP_PUSH(*out, *n, cap, w))
					return SP_ENOMEM;
			}
	}
	return 0;
}

static want_t *find(want_t *w, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(w[i].name, name))
			return &w[i];
	return NULL;
}

/* The rename map: a JSON object of strings (or null: skip the tensor),
 * each of the file's names once. */
static int read_map(const char *path, json_t **out, sp_err_t *err)
{
	json_error_t je;
	char *text = NULL;
	size_t len = 0;
	*out = NULL;
	int rc = sp_read_file(&text, &len, path, err);
	if (rc)
		return rc;
	*out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!*out)
		return sp_err_set(err, SP_EINPUT, path, je.line, je.column, NULL,
				  "cannot read the rename map: %s", je.text);
	const char *k;
	json_t *v;
	if (!json_is_object(*out))
		return sp_err_set(err, SP_EINPUT, path, 0, 0, NULL,
				  "a rename map is a JSON object {\"their.name\": \"our.name\"}");
	json_object_foreach(*out, k, v) {
		if (!json_is_string(v) && !json_is_null(v))
			return sp_err_set(err, SP_EINPUT, path, 0, 0, k,
					  "expected the model's tensor name (a string) or null");
	}
	return 0;
}

/* Gives each tensor of the model its source in the file: the file's name
 * through the map, else the name itself. */
static int match_names(st_in_t *in, json_t *map, const char *map_path, want_t *w, int n,
		       sp_err_t *err)
{
	const char *key;
	json_t *e;
	json_object_foreach(in->hdr, key, e) {
		if (!strcmp(key, "__metadata__"))
			continue;
		json_t *m = json_object_get(map, key);
		if (m && json_is_null(m))
			continue;
		const char *ours = m ? json_string_value(m) : key;
		want_t *x = find(w, n, ours);
		if (!x && m)
			return sp_err_set(err, SP_EINPUT, map_path, 0, 0, key,
					  "renames tensor '%s' of '%s' to '%s', which the model "
					  "does not have",
					  key, in->path, ours);
		if (!x) {
			sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
				   "tensor '%s' is not one of the model's and no rename map "
				   "names it",
				   key);
			sp_err_hint(err, "the model's names are component.layer.tensor (see "
					 "spindle-run --help); map the file's names with "
					 "--init-map, null to skip one");
			return err->code;
		}
		if (x->src)
			return sp_err_set(err, SP_EINPUT, in->path, 0, 0, NULL,
					  "tensors '%s' and '%s' both give the model's '%s'",
					  x->src, key, ours);
		x->src = key;
	}
	return 0;
}

/* Every tensor of a trained component present, every present one of the
 * model's shape (a component no task uses: checked when present). */
static int check_all(st_in_t *in, const sp_model_t *md, want_t *w, int n, sp_err_t *err)
{
	for (int i = 0; i < n; i++) {
		int rc = 0;
		if (w[i].src)
			rc = st_in_get(in, w[i].src, w[i].name, &w[i].t, 0, NULL, err);
		else if (ck_comp_trained(md, w[i].comp))
			rc = st_in_get(in, w[i].name, NULL, &w[i].t, 0, NULL, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* Records (rt_unpack's layout, weights only) of the layers this rank
 * holds, read from the file. */
static int read_held(st_in_t *in, const sp_plan_t *p, int rank, want_t *w, int n,
		     uint8_t **recs, size_t *len, sp_err_t *err)
{
	const sp_device_t *d = &p->devices[rank];
	const sp_model_t *md = &p->model;
	size_t total = 0;
	for (int h = 0; h < d->n_held; h++)
		total += 16 + 4 * (size_t)comp_layer_params(&md->comps[p->held[d->held_off + h].comp]);
	uint8_t *buf = malloc(total + 1);
	if (!buf)
		return sp_err_set(err, SP_ENOMEM, in->path, 0, 0, NULL, "out of memory");
	*recs = buf;
	*len = total;
	size_t o = 0;
	for (int h = 0; h < d->n_held; h++) {
		sp_param_t pr = p->held[d->held_off + h];
		int64_t cnt = comp_layer_params(&md->comps[pr.comp]);
		memcpy(buf + o, &pr.comp, 4);
		memcpy(buf + o + 4, &pr.layer, 4);
		memcpy(buf + o + 8, &cnt, 8);
		float *f = (float *)(void *)(buf + o + 16);
		for (int i = 0; i < n; i++) {
			if (w[i].comp != pr.comp || w[i].layer != pr.layer)
				continue;
			int rc = st_in_get(in, w[i].src ? w[i].src : w[i].name, w[i].name, &w[i].t,
					   0, f + w[i].t.offset, err);
			if (rc)
				return rc;
		}
		o += 16 + 4 * (size_t)cnt;
	}
	return 0;
}

static int init_local(rt_state_t *st, const sp_plan_t *p, int rank, const char *path,
		      const char *map_path, sp_err_t *err)
{
	st_in_t in = {.fd = -1};
	json_t *map = NULL;
	want_t *w = NULL;
	uint8_t *recs = NULL;
	size_t len = 0;
	int n = 0, rc;
	if ((rc = st_in_open(&in, path, err)) || (map_path && (rc = read_map(map_path, &map, err))))
		goto cleanup;
	if (model_tensors(&p->model, &w, &n)) {
		rc = sp_err_set(err, SP_ENOMEM, path, 0, 0, NULL, "out of memory");
		goto cleanup;
	}
	if (!(rc = match_names(&in, map, map_path, w, n, err)) &&
	    !(rc = check_all(&in, &p->model, w, n, err)) &&
	    !(rc = read_held(&in, p, rank, w, n, &recs, &len, err)))
		rc = rt_unpack(st, recs, len, 0, err);
cleanup:
	st_in_release(&in);
	json_decref(map);
	free(w);
	free(recs);
	return rc;
}

int weights_init(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *path,
		 const char *map_path, sp_err_t *err)
{
	sp_err_t mine = {0};
	double unused = 0;
	int rc = init_local(st, p, c->rank, path, map_path, &mine);
	return ck_agree(c, rc, &mine, 0, &unused, path, "loading the weights", err);
}

int weights_check_path(const char *path, sp_err_t *err)
{
	if (strlen(path) > 4000)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL, "--export path is too long");
	return sp_output_check(path, err);
}
/* What export_gathered needs beside the records. */
typedef struct {
	const sp_model_t *md;
	const char *path;
	st_dtype_t dt;
	int64_t step;
} export_t;

/* Rank 0: the sorted records as one safetensors file, written atomically. */
static int export_gathered(void *ctx, const void *all, size_t total, sp_err_t *err)
{
	const export_t *x = ctx;
	const sp_model_t *md = x->md;
	rec_t *rec = NULL;
	st_out_t o = {0};
	uint8_t *file = NULL;
	size_t len = 0;
	int n = 0, rc;
	if (ck_parse_records(all, total, 1, &rec, &n)) {
		rc = sp_err_set(err, SP_EINTERNAL, x->path, 0, 0, NULL, "bad parameter records");
		goto cleanup;
	}
	qsort(rec, (size_t)n, sizeof *rec, ck_cmp_rec);
	if ((rc = ck_check_records(md, rec, n, err)))
		goto cleanup;
	char step[32];
	snprintf(step, sizeof step, "%lld", (long long)x->step);
	rc = st_out_init(&o, json_pack("{s:s, s:s, s:s, s:s}", "format", WEIGHTS_FORMAT, "model",
				       md->name, "step", step, "dtype", st_dtype_name(x->dt)));
	for (int i = 0; i < n && !rc; i++) {
		const sp_component_t *c = &md->comps[rec[i].comp];
		layer_tensor_t t[LAYER_TENSORS_MAX];
		int nt = layer_tensors(c, t);
		for (int q = 0; q < nt && !rc; q++) {
			char name[160];
			snprintf(name, sizeof name, "%s.%d.%s", c->name, rec[i].layer, t[q].name);
			rc = st_out_add(&o, name, &t[q], rec[i].data + t[q].offset, x->dt);
		}
	}
	if (rc || (rc = st_out_finish(&o, &file, &len)))
		rc = sp_err_set(err, SP_ENOMEM, x->path, 0, 0, NULL, "out of memory");
	else
		rc = sp_write_atomic(x->path, file, len, err);
cleanup:
	st_out_release(&o);
	free(rec);
	free(file);
	return rc;
}

int weights_export(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *path,
		   st_dtype_t dt, int64_t step, sp_err_t *err)
{
	export_t x = {&p->model, path, dt, step};
	char what[4200];
	snprintf(what, sizeof what, "the export to '%s'", path);
	return ckpt_gather_apply(st, c, 0, export_gathered, &x, what, err);
}
