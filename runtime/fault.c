/*
 * fault.c — fault injection for spindle-run's tests (see fault.h for the
 * faults and their syntax). Parses the faults and carries out the ones of
 * the training loop (exit, stop); ckpt.c carries out the checkpoint ones.
 * Linked into the spindle-run executable only: its exit is the point.
 */
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fault_init(fault_t *f)
{
	memset(f, 0, sizeof *f);
	f->exit_rank = -1;
}

int fault_parse(fault_t *f, const char *spec)
{
	char buf[512];
	if (strlen(spec) >= sizeof buf)
		goto bad;
	snprintf(buf, sizeof buf, "%s", spec);
	char *save = NULL;
	for (char *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
		long long a = 0, b = 0;
		int n = 0;
		if (sscanf(s, "kill-in-save:%lld%n", &a, &n) == 1 && a > 0 && !s[n]) {
			f->ckpt.kill_step = a;
			f->ckpt.kill_latest = 0;
		} else if (sscanf(s, "kill-in-save:%lld:latest%n", &a, &n) == 1 && a > 0 &&
			   !s[n]) {
			f->ckpt.kill_step = a;
			f->ckpt.kill_latest = 1;
		} else if (sscanf(s, "enospc-in-save:%lld%n", &a, &n) == 1 && a > 0 && !s[n]) {
			f->ckpt.enospc_after = a;
		} else if (sscanf(s, "stop-at:%lld:%lld%n", &a, &b, &n) == 2 && a > 0 && b >= 0 &&
			   b < 1 << 20 && (!s[n] || !strcmp(s + n, ":end"))) {
			f->stop_step = a;
			f->stop_rank = (int)b;
			f->stop_end = s[n] != 0;
		} else {
			goto bad;
		}
	}
	return 0;
bad:
	fprintf(stderr, "spindle-run: SPINDLE_FAULT: invalid fault '%s'\nhint: use "
			"kill-in-save:STEP[:latest], enospc-in-save:BYTES or stop-at:STEP:RANK[:end] "
			"(testing hooks)\n",
		spec);
	return 2;
}

void fault_at_step(const fault_t *f, int rank, int64_t t, int end)
{
	if (!end && f->exit_step == t && (f->exit_rank < 0 || f->exit_rank == rank)) {
		fprintf(stderr, "spindle-run: rank %d: exiting at step %lld (fault injection)\n", rank,
			(long long)t);
		exit(3);
	}
	if (f->stop_step == t && f->stop_rank == rank && f->stop_end == end) {
		fprintf(stderr,
			"spindle-run: rank %d: stopping at %s of step %lld (fault injection)\n",
			rank, end ? "the end" : "the start", (long long)t);
		fflush(stderr);
		raise(SIGSTOP);
	}
}
