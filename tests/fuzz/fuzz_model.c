/*
 * fuzz_model.c — libFuzzer target for the model loader (schemas/
 * model_load.c): any bytes are either rejected with an error (code and
 * message set) or accepted as a model that deep-copies and releases
 * cleanly. ASan/UBSan catch memory and arithmetic errors on the way.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* an exact-size copy: reads past the end are caught */
	char *text = malloc(size ? size : 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	sp_model_t m, copy;
	sp_err_t err = {0};
	int rc = model_parse(&m, text, size, "fuzz.json", &err);
	if (rc) {
		/* a rejection always says why */
		if (!err.code || !err.msg[0])
			abort();
	} else {
		if (err.code)
			abort();
		if (model_copy(&copy, &m) == 0)
			model_release(&copy);
	}
	model_release(&m);
	free(text);
	return 0;
}
