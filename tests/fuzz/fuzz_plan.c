/*
 * fuzz_plan.c — libFuzzer target for the plan reader (schemas/plan_decode.c,
 * plan_check.c). Each input is decoded twice: as it is (the header checks)
 * and with its file-size and CRC-32 header fields recomputed (otherwise
 * nearly every mutation stops at the checksum and the section and record
 * checks behind it are never reached). Either decode rejects with an error
 * (code and message set) or yields a plan; a decoded plan must encode again
 * (plan_write.c), that encoding must decode, and encoding is deterministic
 * (the second encoding equals the first byte for byte). The plan verifier
 * (planner/plan_verify.h), which spindle-run runs on every plan it reads,
 * must then pass it or refuse it with a message (SP_EINTERNAL, or
 * SP_ENOMEM), under the sanitizers like the reader.
 */
#include "plan.h"
#include "plan_verify.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size)
{
	sp_plan_t p, q;
	sp_err_t err = {0};
	if (plan_decode(&p, data, size, "fuzz.bin", &err)) {
		if (!err.code || !err.msg[0])
			abort();
		plan_release(&p);
		return;
	}
	uint8_t *a = NULL, *b = NULL;
	size_t na = 0, nb = 0;
	if (plan_encode(&a, &na, &p, &err))
		abort();
	if (plan_decode(&q, a, na, "fuzz-reencoded.bin", &err))
		abort();
	if (plan_encode(&b, &nb, &q, &err) || na != nb || memcmp(a, b, na))
		abort();
	memset(&err, 0, sizeof err);
	int rc = verify_plan(&p, (p.memory_gib - p.mem_reserve_gib) * 1073741824.0, &err);
	if (rc && ((rc != SP_EINTERNAL && rc != SP_ENOMEM) || !err.msg[0]))
		abort();
	free(a);
	free(b);
	plan_release(&q);
	plan_release(&p);
}

static uint32_t rd32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check(data, size);
	if (size < 40)
		return 0;
	/* header (PLAN-FORMAT.md): u64 file size at 20, u32 header size at 16,
	 * u32 CRC-32 of [header size, file size) at 32 */
	uint8_t *fixed = malloc(size);
	if (!fixed)
		return 0;
	memcpy(fixed, data, size);
	uint64_t n = size;
	for (int i = 0; i < 8; i++)
		fixed[20 + i] = (uint8_t)(n >> (8 * i));
	uint32_t hs = rd32(fixed + 16);
	if (hs <= size) {
		uint32_t crc = sp_crc32(0, fixed + hs, size - hs);
		for (int i = 0; i < 4; i++)
			fixed[32 + i] = (uint8_t)(crc >> (8 * i));
	}
	check(fixed, size);
	free(fixed);
	return 0;
}
