// Schedule and memory plan (docs/ARCHITECTURE.md, "Memory plan").
//
// The plan is data: for every value of the program it records where the value lives (the
// activation arena at an offset, or a persistent buffer), its size and its live range over the
// schedule, and for every step where its kernel's workspace lives. The executor allocates exactly
// `arena_bytes` and replays these offsets every step; `loom memory` and the memory viewer print
// the same table without running anything.
//
// Rules (after ggml-alloc and tinygrad's memory planner):
//   - only ValueKind::activation values are placed; params, grads, inputs are persistent,
//     except the gradients given a release step (PlanOptions::grad_release: sharded gradients,
//     which live only until their sum over ranks is taken, train/trainer.h) and, with
//     PlanOptions::gather_params, the parameters (sharded parameters, gathered before each use);
//   - a value is live from the step that produces it to the last step that reads it (outputs
//     marked with Graph::mark_output stay live to the end);
//   - a view (kOpView) gets no storage: it aliases its root and extends the root's live range;
//   - in place (kOpInplace ops, when PlanOptions::inplace): output 0 takes over the buffer of an
//     input of the same byte size whose last use is this node (ggml-alloc's rule), so an
//     elementwise chain needs one buffer, not two;
//   - a node's kernel workspace (WorkspaceNeeds, sized by the backend that runs it) is one
//     more buffer, live at that node's step only;
//   - what the libraries a kernel calls allocate for themselves (WorkspaceNeeds::library) lives
//     outside the arena, inside one node's run at a time: one host row, the largest of them;
//   - offsets are chosen greedily by size, each buffer in the best-fitting gap among buffers
//     whose live ranges overlap its own; two buffers live at the same step never overlap.
#pragma once
#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace loom {

inline constexpr int64_t kArenaAlignment = 64;

struct BufferInfo {
  ValueId value = kNoValue;     // the value owning the storage (a view's root); kNoValue: the
                                // workspace of the node at step `first` (== last)
  int64_t offset = -1;          // in the arena
  int64_t bytes = 0;            // aligned size
  int32_t first = 0, last = 0;  // live range in schedule steps, inclusive
  // A gathered parameter's storage for one interval of its uses (PlanOptions::gather_params): the
  // caller starts filling it before step `first` runs and has filled it before step `first_use`,
  // the interval's first use (`first` is earlier when its gather is prefetched,
  // PlanOptions::gather_ahead); value is the parameter.
  bool gathered = false;
  int32_t first_use = -1;  // gathered buffers only
};

struct MemoryPlan {
  std::vector<NodeId> schedule;       // node execution order
  std::vector<int64_t> value_offset;  // per value: byte offset in the arena, -1 if persistent
  std::vector<ValueId> value_root;    // per value: the value whose storage it uses (itself unless a
                                      // view or an in-place output)
  std::vector<BufferInfo> buffers;    // one per storage-owning activation, in allocation order
  std::vector<char> gathered;         // per value: a parameter held in the arena (gather_params); its
                                      // buffers are the `gathered` ones, value_offset is -1
  std::vector<int64_t> live_bytes;    // per step: Σ bytes of buffers live at that step
  // Per step: the node's kernel workspace, its arena offset (-1 when it needs none) and bytes.
  std::vector<int64_t> workspace_offset, workspace_bytes;
  int32_t workspace_threads = 1;  // the thread count the workspace was sized for
  int64_t arena_bytes = 0;        // the arena's size: activations and kernel workspace
  // Host memory beside the arena that the libraries of the running kernel allocate for themselves
  // (Backend::library_bytes: oneDNN's sgemm packing buffers on the CPU), the largest over the
  // schedule. Not allocated by the executor: counted, like the arena, in every total of the plan.
  int64_t library_bytes = 0;
  int64_t lower_bound_bytes = 0;  // max over steps of live bytes (no allocator can do better)
  int32_t peak_step = 0;          // a step where live bytes reach the lower bound
  // Persistent memory by kind (not in the arena; gradients and parameters planned in the arena are
  // not counted).
  int64_t param_bytes = 0, grad_bytes = 0, input_bytes = 0;
};

// The default schedule: nodes in graph order (forward, then backward with recompute inserted
// by the remat pass), which is a topological order by construction.
std::vector<NodeId> default_schedule(const Graph& g);

struct PlanOptions {
  bool inplace = true;  // let kOpInplace outputs reuse a dying input's buffer
  bool reuse = true;    // false: every buffer gets bytes of its own (the unplanned baseline for tests)
  // Per value (indexed by ValueId; empty: none): for a gradient, a step >= 0 puts it in the arena,
  // live from the first step that writes it (step 0 when none does) to the later of its last use
  // and this step; -1 leaves it persistent. Such a gradient holds nothing from one run to the next.
  std::vector<int32_t> grad_release;
  // Parameters in the arena (sharded parameters, ZeRO-3: the caller keeps only a shard and
  // gathers the whole parameter into its buffer before its first use in each interval): one buffer
  // per parameter for its forward uses and one for its backward and recompute uses, each live from
  // the first use of its interval to the last; one buffer for both when no other gathered
  // parameter is read between its last forward use and its first backward use (a head's kernel,
  // tied or not). A view of a parameter reads its interval's buffer.
  bool gather_params = false;
  // Prefetch: the gathered buffers a step first reads (a use: a kernel and its bias) are live (and
  // their gathers in flight) from the use gather_ahead uses before it, in order of first use (the
  // first uses: from the first), so that their gathers overlap the kernels in between; 0: from
  // their own use. With 1 the prefetch windows never overlap, so at most one use's buffers at a
  // time are live early: the live bytes grow by at most the largest use's parameters. With any
  // prefetch the first use's buffers are live from step 0: the caller may start their gathers
  // before the run, between runs, when nothing else in the arena is live.
  int32_t gather_ahead = 1;
};

// The kernel workspace of a program on the backend that will run it (Backend::workspace_bytes;
// runtime/executor.h's plan_program fills it): per node, indexed by NodeId (empty: none), the bytes
// its kernel needs with `threads` threads, and the bytes the libraries it calls allocate for
// themselves meanwhile (Backend::library_bytes).
struct WorkspaceNeeds {
  std::vector<int64_t> bytes;
  int32_t threads = 1;
  std::vector<int64_t> library;
};

MemoryPlan plan_memory(const Graph& g, std::vector<NodeId> schedule, PlanOptions opts = {},
                       const WorkspaceNeeds& workspace = {});

// Checks the plan's invariants: every buffer lies inside the arena at an aligned offset, no two
// buffers live at the same time share bytes, every activation a scheduled node reads has storage,
// every workspace buffer lives at one step and is where that step says, and the arena is at least
// the live-bytes lower bound. Returns an empty string when they hold, else the first violation.
// Only tests call it: plan_memory does not.
std::string verify_plan(const Graph& g, const MemoryPlan& p);

}  // namespace loom
