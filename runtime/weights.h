/*
 * weights.h — parameters in and out as one standard safetensors file
 * (spindle-run --init, --export), independent of plans and of Spindle:
 * any safetensors reader opens an export, and a file from another trainer
 * loads through a rename map.
 *
 * Names: "<component>.<layer>.<tensor>", the component's name in the model,
 * the layer (0 for every component but a transformer), the tensor's name in
 * layers.h's table (layer_tensors), e.g. "vision.3.w_qkv", "text_emb.0.tok",
 * a cross-attention decoder's "dec.0.w_kv".
 * Shapes are layers.h's: [rows] for vectors, else [rows, cols], row-major.
 * Contrastive losses have no parameters; a component no task uses is
 * neither exported nor required (its tensors in a file are checked and
 * skipped).
 */
#ifndef SPINDLE_WEIGHTS_H
#define SPINDLE_WEIGHTS_H

#include "runtime.h"
#include "safetensors.h"

/*
 * Collective, after rt_create. Loads the parameters this rank holds from
 * path (F32, BF16 or F16, converted to fp32); the optimizer state stays as
 * rt_create made it. map_path, when not NULL, is a JSON object renaming
 * the file's tensors: {"their.name": "component.layer.tensor", ...}; a
 * name mapped to null is skipped. Every rank checks the whole header
 * (every tensor of the model present once, with its shape, no tensor left
 * unexplained) and reads only the tensors of the layers it holds. Returns
 * 0, CKPT_ECOMM (a collective failed), or the error: SP_EINPUT naming the
 * file and tensor (on the rank that found it; the others name that rank).
 */
int weights_init(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *path,
		 const char *map_path, sp_err_t *err);

/* Local (rank 0, before training): whether a file can be created beside
 * path, so a bad --export fails at start-up (SP_EINPUT). */
int weights_check_path(const char *path, sp_err_t *err);

/*
 * Collective. Rank 0 gathers every trained parameter and writes path
 * atomically (a temporary file, fsynced, renamed): every tensor by its
 * name, as dt, in canonical (component, layer, tensor) order; __metadata__
 * holds format "spindle.weights/1", the model's name, the step and the
 * dtype. Returns 0, CKPT_ECOMM, or the error.
 */
int weights_export(rt_state_t *st, rt_comm_t *c, const sp_plan_t *p, const char *path,
		   st_dtype_t dt, int64_t step, sp_err_t *err);

#endif
