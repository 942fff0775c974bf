/*
 * sim_stats.c — a diagnostic (the debug env SPINDLE_SIM_STATS): how many
 * whole-plan simulations each site of the walk and of the layout trials
 * asks for, and how many of them start from a plan state one before
 * started from, so would give the same result again (sim_memo.c's pass
 * memo takes those it holds: every whole-plan simulation runs the same
 * full pass with sync on the state). A state is the arrays the simulator
 * and the trials read and write (buckets, devices, slices, waves,
 * programs), known by a 64-bit hash of them: a count, not a proof. Off
 * (the default) it costs one branch per simulation; it never changes what
 * the planner does. Counts over all threads (one lock).
 */
#include "planner.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATS_SITES 16

static struct {
	pthread_mutex_t lock;
	int on; /* set once by stats_read_env */
	const char *site[STATS_SITES];
	long calls[STATS_SITES], again[STATS_SITES];
	uint64_t *seen;
	int n, cap;
	const char *event[STATS_SITES]; /* sim_stats_event's, not simulations */
	long events[STATS_SITES];
} st = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}, {0}, NULL, 0, 0, {0}, {0}};

static void stats_read_env(void)
{
	st.on = getenv("SPINDLE_SIM_STATS") != NULL;
}

/* The env read once for all threads (worker threads ask too). */
static int stats_on(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, stats_read_env);
	return st.on;
}

void sim_stats_note(const char *site, const sp_plan_t *p)
{
	if (!stats_on())
		return;
	uint64_t h = sp_fnv1a(SP_FNV_INIT, p->buckets, sizeof *p->buckets * (size_t)p->n_buckets);
	h = sp_fnv1a(h, p->devices, sizeof *p->devices * (size_t)p->n_devices);
	h = sp_fnv1a(h, p->slices, sizeof *p->slices * (size_t)p->n_slices);
	h = sp_fnv1a(h, p->waves, sizeof *p->waves * (size_t)p->n_waves);
	h = sp_fnv1a(h, p->ins, sizeof *p->ins * (size_t)p->n_ins);
	pthread_mutex_lock(&st.lock);
	int s = 0;
	while (s < STATS_SITES && st.site[s] && strcmp(st.site[s], site))
		s++;
	if (s < STATS_SITES) {
		st.site[s] = site;
		st.calls[s]++;
		int i = 0;
		while (i < st.n && st.seen[i] != h)
			i++;
		if (i < st.n)
			st.again[s]++;
		else if (!sp_grow((void **)&st.seen, &st.cap, st.n + 1, sizeof *st.seen))
			st.seen[st.n++] = h;
	}
	pthread_mutex_unlock(&st.lock);
}

void sim_stats_event(const char *what)
{
	if (!stats_on())
		return;
	pthread_mutex_lock(&st.lock);
	int s = 0;
	while (s < STATS_SITES && st.event[s] && strcmp(st.event[s], what))
		s++;
	if (s < STATS_SITES) {
		st.event[s] = what;
		st.events[s]++;
	}
	pthread_mutex_unlock(&st.lock);
}

void sim_stats_print(void)
{
	if (!stats_on())
		return;
	long calls = 0, again = 0;
	for (int s = 0; s < STATS_SITES && st.site[s]; s++) {
		fprintf(stderr, "sim stats: %-22s %4ld simulations, %4ld of a state simulated before\n",
			st.site[s], st.calls[s], st.again[s]);
		calls += st.calls[s];
		again += st.again[s];
	}
	fprintf(stderr, "sim stats: %-22s %4ld simulations, %4ld of a state simulated before\n",
		"all", calls, again);
	for (int s = 0; s < STATS_SITES && st.event[s]; s++)
		fprintf(stderr, "sim stats: event %-16s %4ld times\n", st.event[s], st.events[s]);
	free(st.seen);
	memset(st.calls, 0, sizeof st.calls);
	memset(st.again, 0, sizeof st.again);
	memset(st.site, 0, sizeof st.site);
	memset(st.event, 0, sizeof st.event);
	memset(st.events, 0, sizeof st.events);
	st.seen = NULL;
	st.n = st.cap = 0;
}

void sim_stats_refined(int idx, const sim_result_t *r, double f)
{
	if (stats_on())
		fprintf(stderr,
			"sim stats: top_choose row %d refined: iteration %.9f ms, sync %.9f, "
			"transfer %.9f, partial %d, over %.0f bytes\n",
			idx, r->iteration_ms, r->sync_ms, r->transfer_ms, r->partial, f);
}
