/*
 * coll_none.c — stands in for coll_mpi.c in builds without MPI
 * (-Dmpi=disabled): spindle-profile --collectives then refuses with a
 * message; layer profiling is unaffected.
 */
#include "coll.h"

int coll_measure(sp_coll_point_t **out, int *n_out, int *out_root, const coll_opts_t *o,
		 int *argc, char ***argv, sp_err_t *err)
{
	(void)o;
	(void)argc;
	(void)argv;
	*out = NULL;
	*n_out = 0;
	*out_root = 1;
	return sp_err_set(err, SP_EINPUT, NULL, 0, 0, NULL,
			  "this spindle-profile was built without MPI: --collectives needs it");
}
