/*
 * plan_format.h — the constants of plan.bin (schemas/PLAN-FORMAT.md) that
 * the writer and the reader share: section ids, the header's and the
 * section table's sizes and field offsets, and each section's record size.
 * Private to schemas/: nothing outside plan_write.c and the reader's units
 * includes it. It holds no code and no validity rules (those are the
 * reader's); changing a value here changes the format (bump PLAN_VERSION).
 */
#ifndef SPINDLE_PLAN_FORMAT_H
#define SPINDLE_PLAN_FORMAT_H

/* Stable section ids: keep in step with PLAN-FORMAT.md. */
enum {
	SEC_STRINGS = 1,
	SEC_PROVENANCE = 2,
	SEC_MODEL = 3,
	SEC_COMPONENTS = 4,
	SEC_TASKS = 5,
	SEC_NODES = 6,
	SEC_NODE_INPUTS = 7,
	SEC_METAOPS = 8,
	SEC_OPS = 9,
	SEC_EDGES = 10,
	SEC_WAVES = 11,
	SEC_SLICES = 12,
	SEC_SLICE_DEVS = 13,
	SEC_BUCKETS = 14,
	SEC_BUCKET_DEVS = 15,
	SEC_BUCKET_PARAMS = 16,
	SEC_DEVICES = 17,
	SEC_INSTRUCTIONS = 18,
	SEC_HELD = 19,
	SEC_CERTIFICATE = 20,
	SEC_ALGORITHMS = 21,
	SEC__END
};

/* The header: byte offsets of its fields, then its size in version 1. */
enum {
	HDR_MAGIC = 0,       /* PLAN_MAGIC_LEN bytes */
	HDR_VERSION = 12,    /* u32 */
	HDR_SIZE_FIELD = 16, /* u32: the header's size */
	HDR_FILE_SIZE = 20,  /* u64 */
	HDR_N_SECTIONS = 28, /* u32: section table entries */
	HDR_CRC = 32,        /* u32: CRC-32 of [header size, file size) */
	HDR_RESERVED = 36,   /* u32, 0 */
	HEADER_SIZE = 40
};

/* One section table entry: byte offsets of its fields, then its size. */
enum {
	ENT_ID = 0,        /* u32 */
	ENT_RESERVED = 4,  /* u32, 0 */
	ENT_OFFSET = 8,    /* u64 */
	ENT_SIZE = 16,     /* u64: bytes */
	ENT_COUNT = 24,    /* u64: records, or strings of the string table */
	ENTRY_SIZE = 40
};

/* Bytes per record of each section (the string table has none). */
enum {
	REC_PROVENANCE = 64,
	REC_MODEL = 68,
	REC_COMPONENT = 104,
	REC_TASK = 32,
	REC_NODE = 36,
	REC_NODE_INPUT = 4,
	REC_METAOP = 140,
	REC_OP = 8,
	REC_EDGE = 20,
	REC_WAVE = 40,
	REC_SLICE = 68,
	REC_SLICE_DEV = 4,
	REC_BUCKET = 52,
	REC_BUCKET_DEV = 4,
	REC_BUCKET_PARAM = 16,
	REC_DEVICE = 96,
	REC_INSTRUCTION = 60,
	REC_HELD = 16,
	REC_CERTIFICATE = 128,
	REC_ALGORITHM = 40
};

#endif
