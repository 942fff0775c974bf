/*
 * fuzz_cluster.c — libFuzzer target for the cluster loader (schemas/
 * cluster_load.c): any bytes are either rejected with an error (code and
 * message set) or accepted and released cleanly.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size ? size : 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	sp_cluster_t c;
	sp_err_t err = {0};
	int rc = cluster_parse(&c, text, size, "fuzz.json", &err);
	if (rc ? !err.code || !err.msg[0] : err.code != 0)
		abort();
	cluster_release(&c);
	free(text);
	return 0;
}
