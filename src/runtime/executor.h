// The executor: runs a planned program on a backend (docs/ARCHITECTURE.md, "Executor").
//
// Built once per program: it checks that the backend supports every node of the schedule and
// that the plan reserves the workspace each kernel needs, allocates exactly the planned arena
// (activations and workspace) plus one block per persistent value (params, grads, inputs), and
// then replays the schedule every run with the planned offsets — no allocation in the step.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "core/error.h"
#include "graph/passes/plan.h"
#include "runtime/recorder.h"

namespace loom {

class Executor {
 public:
  // Persistent values to bind to existing device buffers instead of allocating (by value name):
  // an evaluation program shares the training program's parameters this way.
  using External = std::unordered_map<std::string, void*>;

  // Builds an executor or returns a Status naming the unsupported node, the node whose workspace
  // the plan lacks (plan with plan_program) or the failed allocation. With `arena_of`, the program
  // runs in that executor's arena instead of allocating its own, when it is large enough: for a
  // program that never runs while the other's activations are needed (the evaluation program
  // between training steps), each overwriting the other's; `arena_of` must outlive it.
  static Status create(Backend& be, const Graph& g, MemoryPlan plan, std::unique_ptr<Executor>* out,
                       const External* external = nullptr, const Executor* arena_of = nullptr);
  // Binds a forward-only program's gradient values to no storage in `ext`: its graph has one per
  // parameter (Graph::add_param) that none of its nodes reads or writes, and unbound, create would
  // allocate a zeroed buffer the size of every parameter. Asserts that no node uses a gradient.
  static void bind_no_gradients(const Graph& g, External& ext);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs the whole schedule.
  void run(const RunCtx& rc);
  // Runs schedule steps [begin, end) (used by the profiler and by tests that stop early).
  void run_steps(const RunCtx& rc, size_t begin, size_t end);

  // Profiling: with a recorder set, every node's execution is timed into it (one OpEvent per
  // node, no allocation); with none (the default) running costs one branch per run_steps call.
  // The recorder must outlive its use; set nullptr to stop recording.
  void set_recorder(OpRecorder* r) { recorder_ = r; }
  OpRecorder* recorder() const { return recorder_; }

  // Device pointer of any value (arena or persistent); nullptr for a gathered parameter
  // (PlanOptions::gather_params), which has storage only in its buffers' live ranges.
  void* ptr(ValueId v) const { return ptrs_[v]; }
  // Where buffer b of the plan lies in the arena (a gathered parameter's, which the caller fills).
  void* buffer_ptr(const BufferInfo& b) const { return static_cast<char*>(arena_) + b.offset; }
  TensorArg arg(ValueId v) const;

  // Host <-> device helpers for persistent values and outputs.
  void upload(ValueId v, const void* host);
  void download(ValueId v, void* host) const;
  void zero(ValueId v);

  const Graph& graph() const { return g_; }
  const MemoryPlan& plan() const { return plan_; }
  Backend& backend() const { return be_; }
  int64_t arena_bytes_allocated() const { return owns_arena_ ? arena_bytes_ : 0; }

 private:
  Executor(Backend& be, const Graph& g, MemoryPlan plan) : be_(be), g_(g), plan_(std::move(plan)) {}
  Backend& be_;
  const Graph& g_;
  MemoryPlan plan_;
  void* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  bool owns_arena_ = true;
  std::vector<void*> persistent_;
  std::vector<void*> ptrs_;
  // Per scheduled node, the argument arrays and the workspace, resolved once.
  std::vector<std::vector<TensorArg>> ins_, outs_;
  std::vector<Workspace> workspace_;
  OpRecorder* recorder_ = nullptr;
  void run_steps_recorded(const RunCtx& rc, size_t begin, size_t end);
};

// Checks that `be` supports every scheduled node; returns a Status naming the first one that is
// not: its op when the backend lacks the op altogether, else its op, scope and dtypes.
Status check_coverage(const Backend& be, const Graph& g, const std::vector<NodeId>& schedule);

// Per node of g (indexed by NodeId): the workspace be's kernel needs with `threads` threads.
std::vector<int64_t> kernel_workspace(const Backend& be, const Graph& g, int threads);

// The plan an Executor on `be` runs: plan_memory with be's kernel workspace for `threads` threads
// (the count the kernels will run with; by default the current one, backend/registry.h).
MemoryPlan plan_program(const Backend& be, const Graph& g, std::vector<NodeId> schedule, PlanOptions opts = {},
                        int threads = num_threads());

}  // namespace loom
