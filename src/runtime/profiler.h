// The profiler's output (docs/profiling.md): turns a recording (runtime/recorder.h) plus the graph
// and its memory plan into
//   - a Chrome Trace Event file (docs/reference.md, "Trace file formats"; open it in Perfetto or
//     chrome://tracing):
//       train_step N > minibatch_i > forward | backward > scope spans > one span per op,
//       train_step N > optimizer,
//     recompute nodes grouped in `rematted_computation` spans inside the backward of their
//     region, and two counter tracks sampled at every op: the arena's live bytes at that
//     schedule step (MemoryPlan::live_bytes) and the total with params, grads, optimizer state
//     and inputs; under data parallelism, one span per gradient bucket's sum over ranks on a
//     "communication" thread track beside the executor's;
//   - a summary: median step time, time per phase, the most expensive ops, achieved GFLOP/s and
//     GB/s per op kind (from the op table's cost rules) and the step's FLOP/s against the
//     device's measured matmul ceiling.
// Everything here runs after the profiled steps; nothing touches the hot path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/passes/plan.h"
#include "runtime/recorder.h"

namespace loom {

struct TraceInfo {
  std::string process_name = "loom";  // the trace's process ("loom train (cpu)")
  int pid = 1;                        // its process id in the trace (rank + 1: ranks' traces merge)
  double origin_us = -1;              // the time the trace's 0 stands for (< 0: its first event)
  std::string title;                  // the run's description, stored in otherData
  int64_t persistent_bytes = 0;       // params + grads + optimizer state + inputs (the total track's base)
};

// The trace as text: one JSON object {"displayTimeUnit", "otherData", "traceEvents"} with one event
// per line. Spans still open and events outside any recorded span are handled (ops with no
// minibatch span around them are grouped by executor run).
std::string chrome_trace(const Graph& g, const MemoryPlan& plan, const OpRecorder& rec, const TraceInfo& info);

// Nested span names of a scope path: "block_3/attn/qkv" -> block_3, block_3/attn, block_3/attn/qkv.
std::vector<std::string> scope_prefixes(const std::string& scope);

struct OpTimeRow {
  std::string op;            // op name
  std::string scope, phase;  // per-node rows only (empty in per-kind rows)
  int64_t count = 0;         // executions
  double total_ms = 0;
  double share = 0;             // of the ops' total time
  double flops = 0, bytes = 0;  // totals over the executions
  double gflop_per_s = 0, gb_per_s = 0;
};

struct ProfileSummary {
  int64_t steps = 0;            // profiled train steps (train_step spans)
  int64_t minibatches = 0;      // minibatch runs recorded
  int64_t op_events = 0;        // executed nodes recorded
  std::vector<double> step_ms;  // each profiled step's wall time
  double median_step_ms = 0;
  double mean_step_ms = 0;  // the phases below add up to it
  // Mean per step. backward excludes recompute; other = step time not inside any op or the
  // optimizer (uploads, zeroing gradients, reading the loss, executor overhead).
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0, optimizer_ms = 0, other_ms = 0;
  // Mean per step of the gradient buckets' sums over ranks, start to completion (overlapping the
  // backward: not part of the phases above).
  double communication_ms = 0;
  // Hardware FLOPs: every op executed, the recomputed forward included (what the machine did).
  // Model FLOPs: without the recompute (what the model needs; the basis of MFU).
  double step_gflop = 0;                  // hardware FLOPs of one step, all minibatches (GFLOP)
  double model_step_gflop = 0;            // model FLOPs of one step (GFLOP)
  double step_gbytes = 0;                 // bytes moved by the ops of one step (GB)
  double achieved_gflop_per_s = 0;        // hardware FLOPs / median step time
  double achieved_model_gflop_per_s = 0;  // model FLOPs / median step time
  double ceiling_gflop_per_s = 0;         // measured matmul ceiling; 0 = not measured
  std::string ceiling_dtype = "float32";  // the compute dtype it was measured for
  std::string ceiling_kernel;             // what measured it, with its ISA (Backend::matmul_kernel)
  double fraction_of_ceiling = 0;         // hardware FLOP/s / ceiling (0 when not measured)
  double mfu = 0;                         // model FLOP/s / ceiling (0 when not measured)
  std::vector<OpTimeRow> top_ops;         // (op, scope, phase) by total time
  std::vector<OpTimeRow> op_kinds;        // per op kind, by total time
  size_t dropped_events = 0;              // events past the recorder's capacity
};

ProfileSummary summarize_profile(const Graph& g, const MemoryPlan& plan, const OpRecorder& rec,
                                 double ceiling_gflop_per_s, size_t top = 15);
nlohmann::json profile_summary_json(const ProfileSummary& s);
std::string format_profile_summary(const ProfileSummary& s);

}  // namespace loom
