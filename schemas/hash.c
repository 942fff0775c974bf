/*
 * hash.c — FNV-1a for content hashes (provenance, parameter hashes) and
 * CRC-32 for file checksums. Both are byte-order independent by construction.
 */
#include "common.h"

uint64_t sp_fnv1a(uint64_t h, const void *data, size_t n)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
		crc_table[i] = c;
	}
	crc_ready = 1;
}

uint32_t sp_crc32(uint32_t crc, const void *data, size_t n)
{
	if (!crc_ready)
		crc_init();
	const unsigned char *p = data;
	crc = ~crc;
	for (size_t i = 0; i < n; i++)
		crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
	return ~crc;
}
