/*
 * ckpt_internal.h — what ckpt.c, ckpt_save.c and ckpt_load.c share (the
 * format's names, packed parameter records, snapshot names, the manifest's
 * CRC), and weights.c with them (records, trained components, agreement);
 * private to those four files. The protocol is described in ckpt.c.
 */
#ifndef SPINDLE_CKPT_INTERNAL_H
#define SPINDLE_CKPT_INTERNAL_H

#include "ckpt.h"
#include "layers.h"

#include <jansson.h>

#define CKPT_PREFIX "spindle.checkpoint/"
#define CKPT_FORMAT "spindle.checkpoint/1"
#define CKPT_VERSION 1

typedef struct {
	int32_t comp, layer;
	int64_t count;
	const float *data; /* count floats, then m and v when present */
} rec_t;

/* qsort order of records: by component, then layer. */
int ck_cmp_rec(const void *a, const void *b);
/* Splits packed records; floats per record = count * per. *out is on the
 * heap (free it, also on failure). */
int ck_parse_records(const void *all, size_t bytes, int per, rec_t **out, int *n);
/* Every trained layer of the model in rec[] (sorted) exactly once, with
 * the model's size; SP_EINTERNAL (our bug) otherwise. */
int ck_check_records(const sp_model_t *md, const rec_t *rec, int n, sp_err_t *err);
/*
 * Collective, after each rank tried something alone (rc, its error in
 * *mine): every rank learns whether all succeeded, and *sum = the sum of
 * value over the ranks that did. Returns 0; CKPT_ECOMM; on a failed rank
 * its own error (copied from mine); on the others SP_EINPUT "<what> failed
 * on rank R" (R the lowest that failed) about path.
 */
int ck_agree(rt_comm_t *c, int rc, const sp_err_t *mine, double value, double *sum,
	     const char *path, const char *what, sp_err_t *err);
/* Whether name is one of ours: step-<digits>[-<digits>][.tmp]. */
int ck_snapshot_name(const char *name, int allow_tmp);
/* The snapshot LATEST names (0), or -1 when there is none or it is not
 * one of ours. */
int ck_read_latest(const char *dir, char *name, size_t cap);
/* A component's dimensions as the manifest records them. */
void ck_dims_string(char *out, size_t cap, const sp_component_t *c);
int ck_comp_layers(const sp_component_t *c);
/* Whether component c has parameters that are trained: it is no
 * contrastive loss and some node uses it (an unused component is planned
 * nowhere, so no rank holds it and no file carries it). */
int ck_comp_trained(const sp_model_t *md, int c);
/* CRC-32 of the compact, key-sorted JSON of the manifest without its
 * "manifest_crc32" member, as 8 hex digits. */
int ck_manifest_crc(const json_t *man, char out[9]);

#endif
