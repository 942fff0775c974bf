/*
 * verify.h — the plan verifier's shared state, internal to planner/verify*.c.
 * verify.c runs every program together and checks data flow, transfers,
 * parameters and gradients; verify_mem.c adds the rules of a decoder's
 * memory act(c, -1) and its gradient grad(c, -1) (issue #20). Callers
 * outside the verifier use verify_plan (plan_verify.h).
 */
#ifndef SPINDLE_VERIFY_H
#define SPINDLE_VERIFY_H

#include "planner.h"

#include <stdarg.h>

/* Per-sample counts as runs (verify_counts.c): r[0..n) sorted, disjoint,
 * each samples [s0, s1) with count n; a sample in no run counts 0. */
typedef struct {
	int32_t s0, s1, n;
} vrun_t;

typedef struct {
	vrun_t *r;
	int n, cap;
} vcounts_t;

typedef struct {
	int32_t m, l, g;
	vcounts_t cnt; /* tokens written per sample of the task's batch */
} vbuf_t;

typedef struct {
	int32_t slice, s0, s1;
} saved_t;

typedef struct {
	vbuf_t *v;
	int nv, capv;
	saved_t *sv;
	int ns, caps;
} dstate_t;

/* The memory rules' state (verify_mem.c). Decoder i is MetaOp dec[i];
 * per (device d, decoder i) at d * n_dec + i, a count per sample of the
 * decoder's task batch. */
typedef struct {
	int n_dec;
	int *dec;        /* decoder MetaOps, ascending */
	int *dec_of;     /* per MetaOp: its decoder index, -1 none */
	int *producer;   /* per decoder: MetaOp p whose act(p, L_p) is its memory */
	vcounts_t *local; /* layers of grad(c, -1) this device's BWDs added */
	vcounts_t *got;   /* layers of grad(c, -1) received or copied into
			   * grad(p, L_p) on this device */
	vcounts_t *sent;  /* per tag: layers per sample a SEND of grad(c, -1)
			   * carried (its samples), empty for other tags */
} vmem_t;

/* The zero-2 rules' state (verify_zero2.c): per bucket_devs entry of a
 * zero-2 bucket, its member's full gradient (0 not yet, 1 live, 2 synced);
 * per device, the zero-2 buckets synced since its last allocation. */
typedef struct {
	sp_z2map_t map; /* malloc'd: vz2_release */
	int32_t *safe;  /* plan_z2_safe's, malloc'd */
	int32_t *w;     /* scratch for z2map_writes, cap entries */
	int cap;
	char *state;
	int32_t **pend;
	int *n_pend, *cap_pend;
} vz2_t;

/* The zero-3 rules' state (verify_zero3.c): per bucket_devs entry of a
 * zero-3 bucket, the PGATHERs its member reached; per instruction, the
 * round of its PGATHER (0 not reached). NULL without zero-3 buckets. */
typedef struct {
	int32_t *garr, *round;
} vz3_t;

typedef struct {
	const sp_plan_t *p;
	sp_err_t *err;
	sp_arena_t arena; /* everything below; released once at the end */
	dstate_t *ds;
	int *param_base, n_params;
	int *bucket_of_param; /* per shard key (id * SP_MAX_TP + tp_rank): -1 none */
	int *layer_tp;        /* per param id: its slices' tp, 0 none yet */
	int *arrived;         /* per slice_devs entry of a group's first member,
			       * times 2 (+1 backward): members at its rendezvous */
	int *rounds;          /* per slice_devs entry, times 2 (+1 backward):
			       * the member's arrivals at its rendezvous */
	int *at_rdv;          /* per instruction: its round (0 not arrived) */
	int max_tag;          /* tags are 0 .. max_tag - 1 */
	int *pc;              /* per device: next instruction */
	int *send_of;         /* per tag: the SEND's global instruction index */
	char *sent, *recvd;   /* per tag */
	int *issued;          /* per bucket: SYNCs issued so far */
	int64_t *contrib;     /* per operator: samples of gradient computed */
	int micro;            /* the micro-step run: its active tasks only */
	vmem_t mem;
	vz2_t z2;
	vz3_t z3;
} vstate_t;

/* ---- verify.c: helpers the rules share ------------------------------------ */

/* Fails the verification (SP_EINTERNAL): "plan verification failed:
 * device d instruction k (op): <message>", or without the location when d
 * or k is negative. */
int verify_vfail(vstate_t *st, int d, int k, const char *fmt, va_list ap);
/* verify_vfail with its arguments inline (the verifier's files' one way to
 * fail). */
int verify_fail(vstate_t *st, int d, int k, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int64_t verify_batch(const sp_plan_t *p, int m);
/* Device d's buffer of value r (found or added), NULL when out of memory. */
vbuf_t *verify_value(vstate_t *st, int d, const sp_vref_t *r);
/* Tokens per sample a complete value r holds. */
int32_t verify_expected(const sp_plan_t *p, const sp_vref_t *r);
/* Adds tokens to samples [s0, s1) of value r on device d; more than
 * complete is a value written twice. */
int verify_write(vstate_t *st, int d, int k, const sp_vref_t *r, int32_t s0, int32_t s1,
		 int32_t tokens);

/* ---- verify_counts.c: per-sample counts as runs ------------------------------ */

/* From sample s (< s1): where its piece of one count ends (at most s1),
 * the count in *n. Walks a range: for (s = s0; s < s1; s = e) e = ... */
int32_t vcounts_piece(const vcounts_t *c, int32_t s, int32_t s1, int32_t *n);
/* Adds add to the count of every sample in [s0, s1); SP_ENOMEM. */
int vcounts_add(sp_arena_t *a, vcounts_t *c, int32_t s0, int32_t s1, int32_t add);
/* out: c's counts of samples [s0, s1) (none elsewhere); SP_ENOMEM. */
int vcounts_clip(sp_arena_t *a, vcounts_t *out, const vcounts_t *c, int32_t s0, int32_t s1);

/* ---- verify_mem.c: a decoder's memory (issue #20) --------------------------- */

/*
 * Before the run: indexes decoders and their producers, refuses a split
 * decoder slice, and checks each program's order of memory gradients: no
 * SEND/COPY of grad(c, -1) before a BWD of c on the same device that adds
 * to its samples, and every BWD's contribution sent or copied later.
 */
int vmem_prepare(vstate_t *st);
/* At a FWD/BWD (after its range and parameters are checked): a decoder's
 * memory is here for its samples, its BWD adds to grad(c, -1); a BWD of a
 * memory producer's last slice runs only once every contribution to the
 * memory gradient of its samples has arrived. */
int vmem_compute(vstate_t *st, int d, int k, const sp_ins_t *in);
/* At a SEND, RECV or COPY (a RECV's SEND has run): checks memory values
 * and moves memory gradients; *done set when nothing else is to be done. */
int vmem_xfer(vstate_t *st, int d, int k, const sp_ins_t *in, int *done);

/* ---- verify_zero2.c: zero-2 full gradients ---------------------------------- */

/* Before the run: the zero-2 map and states (nothing without zero-2). */
int vz2_prepare(vstate_t *st);
void vz2_release(vstate_t *st);
/* 1 when device d's instruction in must wait: it allocates a full gradient
 * while a zero-2 SYNC it issued is not yet issued by every member. */
int vz2_wait(vstate_t *st, int d, int k, const sp_ins_t *in);
/* After instruction k ran: its full gradients live, a SYNC's freed; a
 * write after the bucket's SYNC fails. */
int vz2_exec(vstate_t *st, int d, int k, const sp_ins_t *in);

/* ---- verify_zero3.c: zero-3 weights ----------------------------------------- */

/* Before the run: each program's PGATHERs, PFREEs and uses (plan_z3_walk),
 * equal gather counts over each group; the rendezvous state. */
int vz3_prepare(vstate_t *st);
/* 1 when device d's PGATHER k must wait for the other members of its
 * bucket to reach theirs. */
int vz3_wait(vstate_t *st, int d, int k, const sp_ins_t *in);

#endif
