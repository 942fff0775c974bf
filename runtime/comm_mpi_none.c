/*
 * comm_mpi_none.c — stands in for comm_mpi.c in builds without MPI
 * (-Dmpi=disabled): the runtime then runs one-device plans only and says
 * so for others.
 */
#include "runtime.h"

int comm_mpi_available(void)
{
	return 0;
}

int comm_mpi_init(rt_comm_t *c, int *argc, char ***argv, sp_err_t *err)
{
	(void)c;
	(void)argc;
	(void)argv;
	return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			  "this spindle-run was built without MPI: it runs one-device plans "
			  "only");
}
