/*
 * pack.c — a rank's parameters in and out of its state, in canonical
 * records (runtime.h, rt_pack_owned): for checkpoints (ckpt*.c) and
 * weights files (weights.c). Whole layers travel, whatever the plan: a
 * tensor-parallel layer's shards are joined at the owner of shard 0 on the
 * way out and cut to the rank's shard on the way in; a zero-1 bucket's
 * optimizer state (zero-3: its weights too) is all-gathered out and
 * sharded in. It does not decide
 * which ranks hold what (the plan does) or write files (ckpt*.c, weights.c).
 */
#include "interp_internal.h"

#include <stdlib.h>
#include <string.h>

/* Polls req to completion; no timeout of its own (main.c's watchdog bounds
 * the checkpoint's collectives). */
static int wait_plain(rt_comm_t *c, rt_req_t *req)
{
	for (int done = 0; !done;)
		if (c->ops->test(c, req, &done))
			return -1;
	return 0;
}

/* Bucket mb's whole floats from the rank's shard of them (sn floats at
 * shard, on the device) through tmp (mb->n floats), all-gathered over its
 * group, into host (NULL: take part only). Collective over the group. */
static int gather_whole(const rt_state_t *st, const mybucket_t *mb, const float *shard,
			float *tmp, float *host)
{
	const rt_backend_t *b = st->b;
	rt_req_t r = {0};
	b->copy_rows(tmp + (mb->soff - mb->off), mb->sn, shard, mb->sn, 1, mb->sn, 0);
	b->sync();
	if (st->c->ops->iallgather(st->c, tmp, mb->n, mb->group, &r) || wait_plain(st->c, &r))
		return SP_EIO;
	if (host)
		b->to_host(host, tmp, sizeof(float) * (size_t)mb->n);
	return 0;
}

int rt_zero3_whole(const rt_state_t *st, float *hw)
{
	int64_t big = 0;
	for (int i = 0; i < st->n_mb; i++)
		big = SP_MAX(big, st->mb[i].zero3 ? st->mb[i].n : 0);
	float *tmp = big ? st->b->alloc(sizeof(float) * (size_t)big) : NULL;
	int rc = big && !tmp ? SP_ENOMEM : 0;
	for (int i = 0; i < st->n_mb && !rc; i++)
		if (st->mb[i].zero3)
			rc = gather_whole(st, &st->mb[i], st->ws + st->mb[i].wsoff, tmp,
					  hw ? hw + st->mb[i].off : NULL);
	st->b->release(tmp);
	return rc;
}

/* Held layer i's weights (the rank's part, pcount[i] floats) to host: from
 * w, or (zero-3) from hw, the whole weights rt_zero3_whole gathered. */
static void weights_to_host(const rt_state_t *st, const float *hw, int i, void *host)
{
	size_t fb = sizeof(float) * (size_t)st->pcount[i];
	if (st->mb[st->pmb[i]].zero3)
		memcpy(host, hw + st->poff[i], fb);
	else
		st->b->to_host(host, rt_wptr(st, i), fb);
}

/*
 * The AdamW state of every bucket of the rank, whole, on the host: hm and hv
 * hold n_w floats each, laid out like the weights. A zero-1 bucket's shards
 * are all-gathered over its group through a device buffer the size of the
 * largest such bucket, held only meanwhile (not in the memory categories):
 * collective over each zero-1 group, buckets in index order on every rank.
 */
static int whole_state(const rt_state_t *st, float *hm, float *hv)
{
	const rt_backend_t *b = st->b;
	int64_t big = 0;
	for (int i = 0; i < st->n_mb; i++)
		big = SP_MAX(big, st->mb[i].zero1 ? st->mb[i].n : 0);
	float *tmp = big ? b->alloc(sizeof(float) * (size_t)big) : NULL;
	int rc = big && !tmp ? SP_ENOMEM : 0;
	for (int i = 0; i < st->n_mb && !rc; i++) {
		const mybucket_t *mb = &st->mb[i];
		for (int h = 0; h < 2 && !rc; h++) {
			const float *dev = (h ? st->v : st->m) + mb->moff;
			float *host = hm ? (h ? hv : hm) + mb->off : NULL; /* NULL: join only */
			if (!mb->zero1) {
				if (host)
					b->to_host(host, dev, sizeof(float) * (size_t)mb->n);
				continue;
			}
			rc = gather_whole(st, mb, dev, tmp, host);
		}
	}
	b->release(tmp);
	return rc;
}

/*
 * The whole layers of the tensor-parallel layers the rank owns (it holds
 * shard 0): joined[i] = w, then m and v with adam (from hm, hv: the
 * whole-state host arrays of whole_state), each comp_layer_params floats,
 * from the rank's shard and the other shards' owners' (sent here point to
 * point, through a device buffer). Collective: every rank walks the
 * model's layers in order and sends or receives each shard in turn, also
 * when `failed` or after a failed transfer (then what it sends is zeros or
 * stale, and the caller's agreement discards the result; a rank without
 * its buffers cannot take part, and the watchdog ends its peers' wait).
 * Returns 0, SP_ENOMEM or SP_EIO (its own failures).
 */
static int join_shards(const rt_state_t *st, int failed, int adam, const float *hm,
		       const float *hv, const float *hw, float **joined)
{
	const sp_model_t *md = &st->p->model;
	const rt_backend_t *b = st->b;
	int parts = adam ? 3 : 1, rc = failed ? SP_ENOMEM : 0;
	int64_t big = 0;
	for (int i = 0; i < st->n_held; i++)
		big = SP_MAX(big, st->pcount[i]);
	float *dev = b->alloc(sizeof(float) * (size_t)SP_MAX(big * parts, 1));
	float *host = calloc((size_t)SP_MAX(big * parts, 1), sizeof(float));
	if (!dev || !host)
		rc = SP_ENOMEM;
	for (int c = 0; c < md->n_comps; c++)
		for (int l = 0; l < comp_n_layers(&md->comps[c]); l++) {
			int t = 1, o0 = plan_shard_owner(st->p, c, l, 0, &t);
			if (t <= 1)
				continue;
			int i = st->slot[st->param_base[c] + l];
			int64_t nw = comp_layer_params(&md->comps[c]);
			int64_t ns = comp_layer_params_tp(&md->comps[c], t);
			if (o0 == st->rank && i >= 0 && !rc &&
			    !(joined[i] = malloc(sizeof(float) * (size_t)(nw * parts))))
				rc = SP_ENOMEM;
			for (int j = 0; j < t; j++) {
				int oj = plan_shard_owner(st->p, c, l, j, NULL);
				int send = oj == st->rank && o0 != st->rank, recv = o0 == st->rank && oj != st->rank;
				if (!rc && oj == st->rank && i >= 0) { /* the rank's own shard */
					weights_to_host(st, hw, i, host);
					for (int q = 1; q < parts; q++)
						memcpy(host + q * ns, (q == 1 ? hm : hv) + st->poff[i],
						       sizeof(float) * (size_t)ns);
				}
				if (send || recv) {
					rt_req_t r = {0};
					size_t bytes = sizeof(float) * (size_t)(ns * parts);
					if (send && dev && host)
						b->to_device(dev, host, bytes);
					b->sync();
					int bad = !dev || (send ? st->c->ops->isend(st->c, dev, bytes, o0, 0, &r)
								: st->c->ops->irecv(st->c, dev, bytes, oj, 0, &r));
					if (bad || wait_plain(st->c, &r))
						rc = SP_EIO; /* the walk goes on: peers wait on it */
					else if (recv && host)
						b->to_host(host, dev, bytes);
				}
				if (!rc && o0 == st->rank && joined[i])
					for (int q = 0; q < parts; q++)
						layer_shard(&md->comps[c], t, j, joined[i] + q * nw,
							    host + q * ns, 1);
			}
		}
	b->release(dev);
	free(host);
	return rc;
}

int rt_pack_owned(const rt_state_t *st, int opt_state, void **out, size_t *bytes)
{
	int adam = st->p->model.opt.kind == OPT_ADAMW && opt_state;
	size_t total = 0;
	for (int i = 0; i < st->n_held; i++)
		if (plan_shard_owner(st->p, st->held[i].comp, st->held[i].layer, 0, NULL) == st->rank)
			total += 16 + sizeof(float) * (size_t)comp_layer_params(
						       &st->p->model.comps[st->held[i].comp]) *
					      (adam ? 3 : 1);
	uint8_t *buf = malloc(total + 1);
	float *hm = adam ? malloc(sizeof(float) * (size_t)SP_MAX(st->n_w, 1)) : NULL;
	float *hv = adam ? malloc(sizeof(float) * (size_t)SP_MAX(st->n_w, 1)) : NULL;
	int z3 = st->n_ws > 0;
	float *hw = z3 ? malloc(sizeof(float) * (size_t)SP_MAX(st->n_w, 1)) : NULL;
	int rc = !buf || (adam && (!hm || !hv)) || (z3 && !hw) ? SP_ENOMEM : 0;
	/* zero-3 weights whole first (collective, whatever the allocations did) */
	if (z3 && rt_zero3_whole(st, rc ? NULL : hw))
		rc = SP_ENOMEM;
	/* every rank joins the gathers, whatever its own allocations did */
	if (adam && (rc ? whole_state(st, NULL, NULL) : whole_state(st, hm, hv)))
		rc = SP_ENOMEM;
	float **joined = calloc((size_t)st->n_held + 1, sizeof(float *));
	if (!joined)
		rc = SP_ENOMEM;
	int jr = join_shards(st, rc, adam, hm, hv, hw, joined);
	if (jr && !rc)
		rc = jr;
	if (rc) {
		for (int i = 0; joined && i < st->n_held; i++)
			free(joined[i]);
		free(joined);
		free(buf);
		free(hm);
		free(hv);
		free(hw);
		return rc;
	}
	size_t o = 0;
	/* canonical order: by (comp, layer) */
	for (int c = 0; c < st->p->model.n_comps; c++) {
		for (int l = 0; l < comp_n_layers(&st->p->model.comps[c]); l++) {
			int i = st->slot[st->param_base[c] + l];
			if (i < 0 || plan_shard_owner(st->p, c, l, 0, NULL) != st->rank)
				continue;
			int32_t hdr[2] = {c, l};
			int64_t cnt = comp_layer_params(&st->p->model.comps[c]);
			memcpy(buf + o, hdr, 8);
			memcpy(buf + o + 8, &cnt, 8);
			o += 16;
			size_t fb = sizeof(float) * (size_t)cnt;
			if (joined[i]) { /* w, m, v of the whole layer */
				memcpy(buf + o, joined[i], fb * (adam ? 3 : 1));
				o += fb * (adam ? 3 : 1);
				continue;
			}
			weights_to_host(st, hw, i, buf + o);
			o += fb;
			if (adam) {
				memcpy(buf + o, hm + st->poff[i], fb);
				o += fb;
				memcpy(buf + o, hv + st->poff[i], fb);
				o += fb;
			}
		}
	}
	for (int i = 0; i < st->n_held; i++)
		free(joined[i]);
	free(joined);
	free(hm);
	free(hv);
	free(hw);
	*out = buf;
	*bytes = o;
	return 0;
}

/* Held layer i's AdamW state from whole host arrays m and v: the part the
 * rank owns (its bucket's shard under zero-1, all of it when replicated). */
static void unpack_state(rt_state_t *st, int i, const uint8_t *m, const uint8_t *v)
{
	for (int q = 0; q < st->n_mb; q++) {
		const mybucket_t *mb = &st->mb[q];
		int64_t lo = SP_MAX(st->poff[i], mb->soff);
		int64_t hi = SP_MIN(st->poff[i] + st->pcount[i], mb->soff + mb->sn);
		if (hi <= lo)
			continue;
		size_t at = sizeof(float) * (size_t)(lo - st->poff[i]);
		size_t len = sizeof(float) * (size_t)(hi - lo);
		int64_t to = mb->moff + (lo - mb->soff);
		st->b->to_device(st->m + to, m + at, len);
		st->b->to_device(st->v + to, v + at, len);
	}
}

int rt_unpack(rt_state_t *st, const void *data, size_t bytes, int opt_state, sp_err_t *err)
{
	int adam = st->p->model.opt.kind == OPT_ADAMW && opt_state;
	const uint8_t *buf = data;
	size_t o = 0;
	int loaded = 0;
	while (o + 16 <= bytes) {
		int32_t hdr[2];
		int64_t cnt;
		memcpy(hdr, buf + o, 8);
		memcpy(&cnt, buf + o + 8, 8);
		o += 16;
		if (hdr[0] < 0 || hdr[0] >= st->p->model.n_comps || cnt < 0 ||
		    cnt != comp_layer_params(&st->p->model.comps[hdr[0]]))
			return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
					  "parameter record does not match the model");
		size_t fb = sizeof(float) * (size_t)cnt * (adam ? 3 : 1);
		if (o + fb > bytes)
			return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
					  "parameter record is truncated");
		int nl = comp_n_layers(&st->p->model.comps[hdr[0]]);
		int i = hdr[1] >= 0 && hdr[1] < nl ? st->slot[st->param_base[hdr[0]] + hdr[1]] : -1;
		if (i >= 0) {
			/* the rank's shard of each of w, m, v (a tensor-parallel layer) */
			int parts = adam ? 3 : 1;
			float *cut = st->held[i].tp > 1
					     ? malloc(sizeof(float) * (size_t)(st->pcount[i] * parts))
					     : NULL;
			if (st->held[i].tp > 1 && !cut)
				return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
			const float *mine = rt_own_part(st, i, (const float *)(const void *)(buf + o), cnt,
						     parts, cut);
			int64_t per = st->held[i].tp > 1 ? st->pcount[i] : cnt;
			rt_put_weights(st, i, mine);
			if (adam)
				unpack_state(st, i, (const uint8_t *)(mine + per),
					     (const uint8_t *)(mine + 2 * per));
			free(cut);
			loaded++;
		}
		o += fb;
	}
	if (loaded != st->n_held)
		return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
				  "rank %d: %d of its %d parameter layers were found", st->rank,
				  loaded, st->n_held);
	return 0;
}
