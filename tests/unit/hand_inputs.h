/*
 * hand_inputs.h — the inputs of a planner unit test written by hand: a
 * cluster file and a model file whose JSON uses ' for " (easier to read
 * in C strings), parsed into m and c; the test fails with the parser's
 * message otherwise; hand_release frees them with the planner's arenas.
 * Include after cmocka.h and planner.h.
 */
#ifndef SPINDLE_TESTS_HAND_INPUTS_H
#define SPINDLE_TESTS_HAND_INPUTS_H

#include <stdlib.h>
#include <string.h>

static inline void hand_inputs(const char *model, const char *cluster, sp_model_t *m,
			       sp_cluster_t *c, sp_err_t *err)
{
	assert_int_equal(cluster_parse(c, cluster, strlen(cluster), "c.json", err), 0);
	char *text = strdup(model);
	assert_non_null(text);
	for (char *p = text; *p; p++)
		if (*p == '\'')
			*p = '"';
	int rc = model_parse(m, text, strlen(text), "m.json", err);
	free(text);
	if (rc)
		print_message("model_parse: %s\n", err->msg);
	assert_int_equal(rc, 0);
}

/* Frees what a test built on hand_inputs holds: pl's simulator memo (its
 * copies are on the heap), its arenas, m and c. */
static inline void hand_release(planner_t *pl, sp_model_t *m, sp_cluster_t *c)
{
	sim_memo_release(pl);
	sp_arena_release(&pl->arena);
	sp_arena_release(&pl->scratch);
	model_release(m);
	cluster_release(c);
}

#endif
