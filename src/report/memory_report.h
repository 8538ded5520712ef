// `loom memory`: the device memory a training run will need, from the plan alone (nothing runs).
// total = params + grads + optimizer state + arena + inputs + library buffers (host memory the
// running kernel's libraries allocate for themselves, MemoryPlan::library_bytes) + the checkpoint
// stream buffer (host memory a save or a resume streams through, train/checkpoint.h) (+ the
// evaluation program's inputs when
// train.eval_interval > 0, and its arena if it does not fit in the trainer's, which it borrows
// between steps), where the arena holds the activations
// and the kernels' workspace (each node's, live at its step): at the live-bytes peak, `workspace` is
// the workspace of the node running there and `activations` the rest of the arena. The plan is the
// one `loom train` runs: for the configured device and thread count (workspace depends on both).
// With `ranks` > 1 it is one rank's memory: a minibatch of data.batch_size / (ranks × num_minibatches)
// examples, the gradient buckets' communication buffers, and with optimizer.shard = state the moments
// of the largest share (train/trainer.h, rank_memory); with state+grads also the gradients: the
// largest share's shard as `grads`, the whole gradients planned in the arena with their buckets'
// lifetimes (rank_plan_options); with params also the parameters: the largest share's shard as
// `params`, each parameter gathered into the arena for its forward uses and again for its
// backward and recompute uses (counted in `activations`).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/format.h"
#include "graph/passes/plan.h"
#include "train/config.h"
#include "train/fit.h"
#include "train/trainer.h"

namespace loom {

struct BufferRow {
  bool workspace = false;  // a node's kernel workspace (no shape or dtype; scope and op are the node's)
  std::string scope, op;
  Shape shape;
  DType dtype = DType::f32;
  int64_t bytes = 0;
  int32_t first = 0, last = 0;
  std::string first_phase, last_phase;
};

struct MemoryReport {
  std::string config_summary;
  int64_t frozen_params_bytes = 0;  // of params_bytes: a LoRA run's frozen base (no grads, no optimizer state)
  std::string base_storage;         // lora.base_dtype's name: how the base's dense kernels are stored
  int64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0, activations_bytes = 0, inputs_bytes = 0,
          workspace_bytes = 0, library_bytes = 0, communication_bytes = 0, evaluation_bytes = 0, checkpoint_bytes = 0,
          total_bytes = 0, lower_bound_bytes = 0;
  int ranks = 1;
  bool grad_shard = false;   // optimizer.shard = state+grads or params: `grads` is one rank's shard
  bool param_shard = false;  // optimizer.shard = params: `params` is one rank's shard
  int32_t peak_step = 0, num_steps = 0;
  std::string peak_op, peak_scope, peak_phase;
  // The largest workspace of any node (not necessarily live at the peak), and the thread count the
  // per-thread parts of the workspace were sized for.
  int64_t max_workspace_bytes = 0;
  std::string max_workspace_op, max_workspace_scope;
  int32_t workspace_threads = 1;
  int64_t num_params = 0;
  double plan_ms = 0;                      // building the program (autodiff, remat) + planning
  std::vector<BufferRow> largest_at_peak;  // up to 15, by size
};

// The plan `loom train` runs `prog` (c's training program) with: kernel workspace for c.device with
// c.threads threads.
MemoryPlan plan_training(const Config& c, const TrainProgram& prog, PlanOptions opts = {});
// Builds and plans the configured training program (timed) and summarises it.
MemoryReport memory_report(const Config& c, size_t top = 15, PlanOptions opts = {}, int ranks = 1);
// `loom memory --ranks N`: one rank's memory in each optimizer.shard mode, one row each.
std::string format_shard_modes(const Config& c, int ranks, PlanOptions opts = {});
std::string format_memory_report(const MemoryReport& r);
// `loom memory --fit`: model.remat = auto's choice at each budget of Fitter::frontier: the choice,
// its planned total, the recomputed FLOPs as a share of the step's, and the step time predicted as
// every FLOP (recompute included) at `ceiling_flops` FLOP/s (report/ceiling.h; 0: no prediction).
std::string format_fit_frontier(const std::vector<Fitter::FitPoint>& points, double ceiling_flops);
nlohmann::json fit_frontier_json(const std::vector<Fitter::FitPoint>& points, double ceiling_flops);
// One choice: its total, its description (describe_choice), layers, minibatches, head chunk, recomputed and step FLOPs.
nlohmann::json fit_choice_json(const FitChoice& f);
nlohmann::json memory_report_json(const MemoryReport& r);

}  // namespace loom
