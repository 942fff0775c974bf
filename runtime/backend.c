/*
 * backend.c — the list of compute backends a process can choose from by
 * name, and starting one alone. Which tables exist is the build's choice
 * (backend_cuda.c or its stand-in); nothing here knows what they do.
 */
#include "runtime.h"

#include <string.h>

static const rt_backend_t *const backends[] = {&backend_cpu, &backend_cuda};

const rt_backend_t *backend_find(const char *name)
{
	for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
		if (!strcmp(backends[i]->name, name))
			return backends[i];
	return NULL;
}

int backend_start(const rt_backend_t *b, rt_comm_t *c, sp_err_t *err)
{
	int rc = b->attach(c, err);
	if (!rc)
		rc = b->init(c, err);
	if (rc && !err->code)
		sp_err_set(err, SP_EIO, NULL, 0, 0, NULL, "backend %s failed to start", b->name);
	return rc;
}
