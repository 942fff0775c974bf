/*
 * trace_fmt.c — Chrome trace JSON (Perfetto loads it) in the one layout
 * both the predicted timeline (spindle-show --trace) and the measured one
 * (spindle-run --trace) use: a process per device/rank, thread 0 for
 * compute and thread 1 for communication, events named after the plan's
 * instructions ("task/node layers 0-12 fwd", "send act 1.5 KiB to 3", "recv
 * mem act 4.0 KiB from 0" for a decoder's memory). The
 * measured FWD/BWD of a tensor-parallel slice (and LOSS of a split LM
 * head) carry args splitting their time into compute_ms and
 * tp_allreduce_ms (the group's collectives inside the layers: all-reduces,
 * and with sequence parallelism all-gathers and reduce-scatters, and the
 * CPU embedding backward's all-gather of its position gradient); the
 * predicted trace has no args.
 */
#include "plan.h"
#include "trace_fmt.h"

#include <string.h>

void trace_ins_name(char *buf, size_t cap, const sp_plan_t *p, const sp_ins_t *in)
{
	int db = 4;
	switch (in->op) {
	case INS_FWD:
	case INS_BWD:
	case INS_LOSS: {
		const sp_slice_t *sl = &p->slices[in->slice];
		snprintf(buf, cap, "%s layers %d-%d %s", p->metaops[sl->metaop].name,
			 sl->layer_from, sl->layer_to,
			 in->op == INS_FWD ? "fwd" : in->op == INS_BWD ? "bwd" : "loss");
		break;
	}
	case INS_SEND:
	case INS_RECV:
	case INS_COPY: {
		int32_t seq, width;
		const sp_vref_t *r = in->op == INS_RECV ? &in->dst : &in->src;
		plan_value_shape(p, r->metaop, r->layer, &seq, &width);
		double kib = (double)(in->s1 - in->s0) * in->seq_len * width * db / 1024.0;
		/* a decoder's memory (layer -1) on either end: "mem act", "mem grad" */
		int mem = r->layer < 0 || (in->op == INS_COPY && in->dst.layer < 0);
		const char *what = in->src.grad ? (mem ? "mem grad" : "grad")
						: (mem ? "mem act" : "act");
		if (in->op == INS_COPY)
			snprintf(buf, cap, "copy %s %.1f KiB", what, kib);
		else
			snprintf(buf, cap, "%s %s %.1f KiB %s %d", in->op == INS_SEND ? "send" : "recv",
				 what, kib, in->op == INS_SEND ? "to" : "from", in->peer);
		break;
	}
	case INS_SYNC: snprintf(buf, cap, "sync bucket %d", in->peer); break;
	case INS_STEP: snprintf(buf, cap, "optimizer step"); break;
	default: snprintf(buf, cap, "?"); break;
	}
}

void trace_begin(FILE *f, int n_proc, const char *proc_word)
{
	fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
	for (int d = 0; d < n_proc; d++) {
		fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"%s %d\"}},\n",
			d, proc_word, d);
		fprintf(f, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}},\n",
			d, d);
		fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n",
			d);
		fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"communication\"}},\n",
			d);
	}
}

/* An event's fields up to its name, the closing brace left to the caller. */
static void event_open(FILE *f, int pid, int tid, const char *name, const char *cat,
		       double ts_ms, double dur_ms)
{
	fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\",\"name\":",
		pid, tid, ts_ms * 1e3, dur_ms * 1e3, cat);
	sp_json_str(f, name);
}

void trace_event(FILE *f, int pid, int tid, const char *name, const char *cat,
		 double ts_ms, double dur_ms)
{
	event_open(f, pid, tid, name, cat, ts_ms, dur_ms);
	fprintf(f, "},\n");
}

void trace_event_tp(FILE *f, int pid, const char *name, double ts_ms, double dur_ms,
		    double tp_ms)
{
	event_open(f, pid, 0, name, "compute", ts_ms, dur_ms);
	fprintf(f, ",\"args\":{\"compute_ms\":%.3f,\"tp_allreduce_ms\":%.3f}},\n",
		dur_ms - tp_ms, tp_ms);
}

void trace_end(FILE *f)
{
	/* a final metadata record keeps the array valid after the trailing comma */
	fprintf(f, "{\"ph\":\"M\",\"name\":\"trace_end\",\"pid\":0,\"args\":{}}\n]}\n");
}
