/*
 * jobs.c — worker threads for ours' candidate walk (plan.c, --jobs N): a
 * pool of N threads in all, the caller's among them, running queued jobs
 * least priority first once the jobs each waits for are done. Each thread
 * plans with a planner of its own: a copy of the caller's (the model, the
 * cluster, the cost tables, the layout estimates: read only while jobs
 * run) with its own run and scratch arenas, error, cost memo (cost.c
 * writes its memo on reads) and MetaOps (a job may make another table set
 * active on its thread with cost_use). GLPK keeps its state per
 * thread (toolchain.md): a thread frees it before it ends.
 *
 * It does not know what a job does, nor decide anything a plan depends
 * on: plan.c takes the jobs' results in the walk's order.
 */
#include "planner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	struct jobs *pool;
	planner_t pl; /* its arena, scratch, memo, err and MetaOps are its own */
	metaop_t *mops; /* a copy of the caller's: cost_use may switch its tables */
	sp_err_t err;
	pthread_t tid;
} jobs_thread_t;

struct jobs {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a job queued or finished, or quit */
	int quit, n, started;
	jobs_thread_t *th; /* th[0]: the caller's */
	sp_job_t **q;
	int nq, capq;
};

/* The queued job that may start with the least prio, marked running;
 * NULL when none may. Under the lock. */
static sp_job_t *jobs_pick(struct jobs *j)
{
	sp_job_t *best = NULL;
	for (int i = 0; i < j->nq; i++) {
		sp_job_t *x = j->q[i];
		int ready = x->state == JOB_PENDING;
		for (int k = 0; ready && k < JOB_MAX_AFTER; k++)
			ready = !x->after[k] || x->after[k]->state == JOB_DONE ||
				x->after[k]->state == JOB_DROPPED;
		if (ready && (!best || x->prio < best->prio))
			best = x;
	}
	if (best)
		best->state = JOB_RUNNING;
	return best;
}

/* Runs job (marked running) on thread t: unlocks around it. Under the
 * lock. Its temporaries in t's scratch are freed after it. */
static void jobs_run(struct jobs *j, jobs_thread_t *t, sp_job_t *job)
{
	pthread_mutex_unlock(&j->mu);
	sp_arena_mark_t mark = sp_arena_mark(&t->pl.scratch);
	t->pl.err = &job->err;
	int rc = job->run(&t->pl, job);
	t->pl.err = &t->err;
	sp_arena_reset(&t->pl.scratch, mark);
	pthread_mutex_lock(&j->mu);
	job->rc = rc;
	job->state = JOB_DONE;
	pthread_cond_broadcast(&j->cv);
}

static void *jobs_main(void *arg)
{
	jobs_thread_t *t = arg;
	struct jobs *j = t->pool;
	pthread_mutex_lock(&j->mu);
	for (;;) {
		sp_job_t *job = NULL;
		while (!j->quit && !(job = jobs_pick(j)))
			pthread_cond_wait(&j->cv, &j->mu);
		if (!job)
			break;
		jobs_run(j, t, job);
	}
	pthread_mutex_unlock(&j->mu);
	allot_thread_end();
	return NULL;
}

/* t's planner: pl's state, t's own arenas, memo and error. */
static void thread_copy(jobs_thread_t *t, const planner_t *pl)
{
	sp_arena_t arena = t->pl.arena, scratch = t->pl.scratch;
	struct cost_memo *memo = t->pl.memo;
	struct coll_memo *coll_memo = t->pl.coll_memo;
	sp_ins_t *ins_spare = t->pl.ins_spare;
	t->pl = *pl;
	t->pl.ins_spare = ins_spare;
	t->pl.coll_memo = coll_memo; /* never the caller's: its own arena's */
	t->pl.arena = arena;
	t->pl.scratch = scratch;
	t->pl.memo = memo;
	t->pl.err = &t->err;
	t->pl.jobs = NULL;
	if (t->mops) {
		memcpy(t->mops, pl->mops, sizeof *t->mops * (size_t)pl->n_mops);
		t->pl.mops = t->mops;
	}
}

int jobs_start(jobs_t **out, const planner_t *pl, int n, sp_err_t *err)
{
	struct jobs *j = calloc(1, sizeof *j);
	*out = NULL;
	if (!j || !(j->th = calloc((size_t)n, sizeof *j->th))) {
		free(j);
		return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
	}
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->n = n;
	*out = j;
	for (int i = 0; i < n; i++) {
		jobs_thread_t *t = &j->th[i];
		t->pool = j;
		sp_arena_init(&t->pl.arena);
		sp_arena_init(&t->pl.scratch);
		t->mops = sp_arena_calloc(&t->pl.arena, (size_t)pl->n_mops + 1, sizeof *t->mops);
		if (!t->mops || cost_memo_copy(&t->pl, pl))
			return sp_err_set(err, SP_ENOMEM, NULL, 0, 0, NULL, "out of memory");
		thread_copy(t, pl);
	}
	for (int i = 1; i < n; i++) {
		int rc = pthread_create(&j->th[i].tid, NULL, jobs_main, &j->th[i]);
		if (rc)
			return sp_err_set(err, SP_EINTERNAL, NULL, 0, 0, NULL,
					  "worker thread %d of %d did not start (%s)", i + 1, n,
					  strerror(rc));
		j->started = i;
	}
	return 0;
}

void jobs_sync(jobs_t *j, const planner_t *pl)
{
	pthread_mutex_lock(&j->mu);
	for (int i = 0; i < j->n; i++)
		thread_copy(&j->th[i], pl);
	pthread_mutex_unlock(&j->mu);
}

int jobs_add(jobs_t *j, sp_job_t *job)
{
	int rc = 0;
	pthread_mutex_lock(&j->mu);
	if (sp_grow((void **)&j->q, &j->capq, j->nq + 1, sizeof *j->q)) {
		rc = SP_ENOMEM;
	} else {
		job->state = JOB_PENDING;
		job->rc = 0;
		memset(&job->err, 0, sizeof job->err);
		j->q[j->nq++] = job;
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	return rc;
}

void jobs_wait(jobs_t *j, sp_job_t *job)
{
	pthread_mutex_lock(&j->mu);
	while (job->state == JOB_PENDING || job->state == JOB_RUNNING) {
		sp_job_t *other = jobs_pick(j);
		if (other)
			jobs_run(j, &j->th[0], other);
		else
			pthread_cond_wait(&j->cv, &j->mu);
	}
	pthread_mutex_unlock(&j->mu);
}

void jobs_mark_done(jobs_t *j, sp_job_t *job)
{
	pthread_mutex_lock(&j->mu);
	job->state = JOB_DONE;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

void jobs_drop(jobs_t *j, sp_job_t *job)
{
	pthread_mutex_lock(&j->mu);
	if (job->state == JOB_PENDING)
		job->state = JOB_DROPPED;
	while (job->state == JOB_RUNNING)
		pthread_cond_wait(&j->cv, &j->mu);
	for (int i = 0; i < j->nq; i++)
		if (j->q[i] == job) {
			memmove(&j->q[i], &j->q[i + 1], sizeof *j->q * (size_t)(j->nq - i - 1));
			j->nq--;
			break;
		}
	pthread_mutex_unlock(&j->mu);
}

void jobs_clear(jobs_t *j)
{
	pthread_mutex_lock(&j->mu);
	for (int i = 0; i < j->nq; i++)
		if (j->q[i]->state == JOB_PENDING)
			j->q[i]->state = JOB_DROPPED;
	for (int i = 0; i < j->nq; i++)
		while (j->q[i]->state == JOB_RUNNING)
			pthread_cond_wait(&j->cv, &j->mu);
	j->nq = 0;
	pthread_mutex_unlock(&j->mu);
}

void jobs_lock(jobs_t *j)
{
	pthread_mutex_lock(&j->mu);
}

void jobs_unlock(jobs_t *j)
{
	pthread_mutex_unlock(&j->mu);
}

void jobs_free(jobs_t *j)
{
	if (!j)
		return;
	jobs_clear(j);
	pthread_mutex_lock(&j->mu);
	j->quit = 1;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	for (int i = 1; i <= j->started; i++)
		pthread_join(j->th[i].tid, NULL);
	for (int i = 0; i < j->n; i++) {
		free(j->th[i].pl.ins_spare);
		sp_arena_release(&j->th[i].pl.scratch);
		sp_arena_release(&j->th[i].pl.arena);
	}
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j->q);
	free(j->th);
	free(j);
}
