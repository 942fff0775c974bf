/*
 * hand_inputs.h — the inputs of a planner unit test written by hand: a
 * cluster file and a model file whose JSON uses ' for " (easier to read
 * in C strings), parsed into m and c; the test fails with the parser's
 * message otherwise; hand_release frees them with the planner's arenas.
 * hand_planner goes on to a planner over them (MetaOps and cost tables
 * built), as a test that lowers or places a hand-made schedule needs.
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

/* What hand_planner builds; the planner points into the rest, so a
 * hand_t stays where it was built. */
typedef struct {
	sp_model_t model;
	sp_cluster_t cluster;
	plan_opts_t opts;
	sp_err_t err;
	planner_t pl;
} hand_t;

/* Parses model and cluster (hand_inputs) and builds h->pl over them for
 * n devices of 78 GiB, one micro-step, our algorithm and placement and
 * parameter layout zero (no recomputation): its MetaOps (graph_build)
 * and cost tables (cost_build). Release with hand_done. */
static inline void hand_planner(hand_t *h, const char *model, const char *cluster, int n,
				int zero)
{
	memset(h, 0, sizeof *h);
	h->opts = (plan_opts_t){.algo = ALGO_SPINDLE, .placement = PLACE_SPINDLE,
				.mem_reserve_gib = 2, .milp_nodes = 200, .zero = zero};
	h->pl = (planner_t){.model = &h->model, .cluster = &h->cluster, .opts = &h->opts,
			    .err = &h->err, .k = 1};
	hand_inputs(model, cluster, &h->model, &h->cluster, &h->err);
	sp_arena_init(&h->pl.arena);
	sp_arena_init(&h->pl.scratch);
	h->pl.N = n;
	h->pl.mem_cap = 78.0 * 1024 * 1024 * 1024;
	int rc = graph_build(&h->pl);
	if (!rc)
		rc = cost_build(&h->pl);
	if (rc)
		print_message("planner setup: %s\n", h->err.msg);
	assert_int_equal(rc, 0);
}

static inline void hand_done(hand_t *h)
{
	hand_release(&h->pl, &h->model, &h->cluster);
}

#endif
