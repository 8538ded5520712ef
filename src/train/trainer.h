// The training step (docs/ARCHITECTURE.md, "Train step"):
//   zero grads; for each minibatch: upload its slice, set the loss seed (loss scale / target
//   tokens of the global batch), run the forward+backward program (gradients accumulate in
//   place), read the loss sum and correct count; then the optimizer (optim/optimizer.h) clips,
//   checks and updates params and moments in one fused pass.
// Params, grads and optimizer state are persistent fp32 buffers on the backend: never copied,
// never duplicated (the tutorial's buffer donation).
//
// Data parallelism over N ranks (a dist::Comm): data.batch_size stays the global batch; rank r
// takes rows [r·B/N, (r+1)·B/N) of every global batch and still runs optimizer.num_minibatches
// (M) minibatches in it, which are the global minibatches r·M .. r·M + M - 1 (the same rows and
// dropout keys as one process with N·M minibatches).
// One normalisation (transformers' num_items_in_batch): the loss is the sum of the target tokens'
// losses (labels >= 0; data/data.h's kIgnoreLabel marks the others) over all N·M minibatches
// divided by the number of targets in all of them, counted from the batch before the step. So the
// loss seed is 1/(targets of the global batch) in every minibatch however the targets are spread
// over minibatches and ranks, and the sum of the ranks' gradients (dist::Comm's fixed rank order)
// is the gradient of that loss; clipping and the update then run identically on every rank
// (optimizer.shard = state, ZeRO-1: each rank receives only its chunk of every bucket's sum
// (reduce-scatter), holds the moments of and updates only those elements, and the parameters are
// all-gathered; the clip norm is the whole gradient's, its per-rank parts summed in rank order).
// The sum runs in buckets of train.bucket_kib while the last minibatch's backward still computes
// (each bucket starts once the schedule has written its gradients for the last time); buckets
// never change the bits. optimizer.shard = state+grads (ZeRO-2) also shards the gradients: they
// are working memory in the arena (rank_plan_options), each live until its bucket's sum is taken;
// every minibatch's gradients are reduce-scattered during its backward and this rank's chunks
// added into a persistent gradient shard (1/N of the gradients), which the optimizer reads. The
// sum over ranks then comes before the sum over minibatches: equal to `none` to float32 rounding,
// not bit for bit. optimizer.shard = params (ZeRO-3) also shards the parameters: every parameter
// is a bucket of its own, this rank keeps its chunk of each (the optimizer updates it there), and
// the plan holds each whole parameter in the arena over its forward uses and again over its
// backward and recompute uses (once over both where no other parameter is read between, as for the
// head's kernel: rank_plan_options), all-gathered into each such buffer while the
// kernels before its first use run (prefetch, optimizer.gather_ahead: started at the use
// optimizer.gather_ahead uses before its own, waited for right before its own; the first use's
// during the previous step's update, once their chunks are updated); it trains as
// state+grads does, bit for bit whatever the prefetch. Metrics are gathered per minibatch and summed in global
// minibatch order, as one process would; their counts are target tokens.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "data/data.h"
#include "dist/comm.h"
#include "io/param_io.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "runtime/executor.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/param_gathers.h"

namespace loom {

// Examples per minibatch when `ranks` ranks split data.batch_size and each accumulates
// optimizer.num_minibatches: a UserError naming both keys unless ranks × num_minibatches divides
// the batch.
int64_t minibatch_size(const Config& c, int ranks = 1);

// The per-minibatch training program, ready to plan: the model, its backward (autodiff), the
// remat pass and the resulting schedule, with minibatches of minibatch_size(c, ranks). Pure
// graph work: nothing is allocated or run.
struct TrainProgram {
  nn::ModelGraph model;
  ValueId dloss = kNoValue;  // the loss seed input
  NodeId num_forward = 0;
  std::vector<NodeId> schedule;
  std::vector<ValueId> zero_grads;  // gradients to zero before each step (mark_first_grad_writes)
};
TrainProgram build_train_program(const Config& c, int ranks = 1);

// The parameters (indices into Graph::params()) in the order the schedule writes their gradients
// for the last time, each with the number of scheduled nodes run by then (0: never written): the
// order of the gradient buckets summed over ranks.
std::vector<std::pair<size_t, size_t>> gradient_order(const TrainProgram& p);

// What data parallelism over `ranks` ranks adds to, or takes from, one rank's memory, from the
// program alone (`loom memory --ranks`); a Trainer allocates exactly this.
struct RankMemory {
  int64_t optimizer_elems = 0;    // parameter elements whose moments the largest share holds
  int64_t grad_shard_elems = 0;   // state+grads and params: gradient elements the largest share keeps
  int64_t param_shard_elems = 0;  // params: parameter elements the largest share keeps
  int64_t comm_buffer_bytes = 0;  // the gradient buckets' staging and receive buffers
  // The buffer a checkpoint's save or resume streams through (train/checkpoint.h), held between
  // steps beside everything else: every rank's, whatever the rank count.
  int64_t checkpoint_stream_bytes = 0;
  // The shards' bytes beside the plan's persistent buffers: moments (`moments` per element), and
  // the gradient and parameter shards.
  int64_t shard_bytes(int64_t moments) const {
    return (moments * optimizer_elems + grad_shard_elems + param_shard_elems) * static_cast<int64_t>(sizeof(float));
  }
};
RankMemory rank_memory(const Config& c, const TrainProgram& p, int ranks);

// `base` with, under optimizer.shard = state+grads on more than one rank, every gradient planned
// in the arena (PlanOptions::grad_release) until its bucket's sum over ranks has completed: a
// bucket started after schedule step s - 1 completes at the latest when the bucket
// Comm::kMaxPending later starts (the trainer waits for it there) or at the end of the schedule.
// Under optimizer.shard = params also every parameter (PlanOptions::gather_params): one buffer for
// its forward uses and one for its backward and recompute uses (or one for both), which the trainer
// all-gathers from the ranks' shards, the gather in flight from the buffer's first step to its first use
// (PlanOptions::gather_ahead = optimizer.gather_ahead; base's is not used).
PlanOptions rank_plan_options(const Config& c, const TrainProgram& p, int ranks, PlanOptions base = {});

struct StepReport {
  Metrics metrics;      // this step's (sum, count) pairs; the counts are target tokens
  OptimizerReport opt;  // lr, grad norm, loss scale, skipped
  double seconds = 0;   // wall time of the step
};

class Trainer {
 public:
  // Builds, differentiates and plans the program and initialises the train state.
  // Throws UserError for configuration problems and std::runtime_error for resource failures.
  // `comm` (default: a single process) is the data-parallel group this trainer is one rank of.
  // With more than one rank the constructor is collective (its memory check): every rank builds its
  // Trainer at the same point.
  // `evaluates`: an Evaluator will run beside it (`loom train` with a validation split), so the fit
  // check counts that program's bytes too (Evaluator::planned_bytes), as `loom memory` does.
  Trainer(const Config& c, Backend& be, PlanOptions plan_options = {}, dist::Comm* comm = nullptr,
          bool evaluates = false);
  ~Trainer();

  StepReport step(const Batch& batch);

  int64_t steps_done() const { return step_; }
  dist::Comm& comm() const { return comm_; }
  const Config& config() const { return cfg_; }
  const nn::ModelGraph& model() const { return prog_.model; }
  const MemoryPlan& plan() const { return exec_->plan(); }
  const TrainProgram& program() const { return prog_; }
  Executor& executor() { return *exec_; }
  const Executor& executor() const { return *exec_; }
  Optimizer& optimizer() { return *opt_; }
  const Optimizer& optimizer() const { return *opt_; }
  // Continues a run from a checkpoint (after its params and moments are loaded).
  void restore_progress(int64_t step, int64_t opt_count, double loss_scale, int64_t scaler_tracker,
                        int64_t scaler_skipped, int64_t scaler_consecutive = 0);
  // Host copies of a parameter (by path) and of its gradient from the last step (with sharded
  // optimizer state only this rank's chunks of the gradient hold the sum over ranks; with
  // state+grads the rest is zero: only the shard is kept). With sharded parameters param() is
  // collective (every rank calls it: an all-gather) and set_param() keeps this rank's chunk.
  std::vector<float> param(const std::string& path) const;
  std::vector<float> grad(const std::string& path) const;
  void set_param(const std::string& path, const std::vector<float>& values);
  // Profiling (report/profile.h): with a recorder set, step() marks its spans (train step,
  // minibatches, optimizer, each gradient bucket's sum over ranks) and the executor times every
  // node; nullptr turns recording off.
  void set_recorder(OpRecorder* r);
  // Gradient buckets summed over ranks per step (0 in a single process).
  size_t num_buckets() const { return reducer_->num_buckets(); }
  // Bucket sums per step: every minibatch's with sharded gradients (state+grads), else the last's.
  size_t bucket_sums_per_step() const {
    return num_buckets() * static_cast<size_t>(grad_shard_ ? cfg_.optimizer.num_minibatches : 1);
  }
  // The elements of parameter `param` (Graph::params() order) whose optimizer moments this rank
  // holds: all of them unless the optimizer state is sharded, then this rank's slice (the ranks'
  // slices are in rank order and tile the parameter); empty for a frozen parameter.
  dist::Range moment_range(size_t param) const;
  // Elements [begin, begin + n) of optimizer moment `which` (0: the first, mu; 1: the second, nu)
  // of parameter `param`, which lie within moment_range(param) (or n = 0: nothing), copied out to /
  // in from host memory.
  void read_moment(int which, size_t param, int64_t begin, int64_t n, float* out) const;
  void write_moment(int which, size_t param, int64_t begin, int64_t n, const float* values);
  bool sharded() const { return sharded_; }
  // optimizer.shard = params on more than one rank: this rank holds only moment_range(param) of
  // each parameter's values, read and written here (elements [begin, begin + n) within it).
  bool params_sharded() const { return param_shard_ != nullptr; }
  void read_param_shard(size_t param, int64_t begin, int64_t n, float* out) const;
  void write_param_shard(size_t param, int64_t begin, int64_t n, const float* values);
  // Where a load (io/param_io.h's import_params, io/hf.h's load_hf_params) stores the parameters
  // this rank holds: every element into the executor, or with sharded parameters its slice of each
  // into the shard (write_param_shard), so that a sharded load reads only that slice.
  ParamSink param_sink();
  int64_t comm_buffer_bytes() const { return reducer_->buffer_bytes(); }
  // Bytes of the gradient shard (state+grads on more than one rank; else 0).
  int64_t grad_shard_bytes() const { return reducer_->shard_elems() * static_cast<int64_t>(sizeof(float)); }
  // Bytes of the parameter shard (params on more than one rank; else 0): laid out as the gradient shard.
  int64_t param_shard_bytes() const { return param_shard_ ? grad_shard_bytes() : 0; }
  // Sharded parameters: the all-gathers started so far (with a prefetch, also the next step's
  // first, started during this step's update), and how many of those completed were still in
  // flight while a kernel or a later part of the update ran (prefetched; none with
  // optimizer.gather_ahead = 0).
  int64_t gathers_started() const { return gathers_.started(); }
  int64_t gathers_overlapped() const { return gathers_.overlapped(); }
  // Sharded parameters: this rank's chunk (dist::chunk) of parameter `param` (Graph::params()
  // order) on the backend, what a program planned with PlanOptions::gather_params all-gathers
  // (ParamGathers; the evaluation program reads the trainer's chunks so).
  const float* param_chunk(size_t param) const;
  // Waits for this trainer's gathers in flight (a prefetch into its arena for the next step); that
  // step starts them again. Call it before another program runs in the trainer's arena.
  void settle_gathers() { gathers_.settle(); }

 private:
  Config cfg_;
  Backend& be_;
  TrainProgram prog_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<Optimizer> opt_;
  int64_t step_ = 0;
  OpRecorder* recorder_ = nullptr;
  dist::Comm& comm_;
  // Every gradient, in the order of their last write in the schedule, summed over ranks in
  // buckets during the last minibatch's backward (every minibatch's with state+grads): bucket b
  // starts once the first bucket_ready_[b] scheduled nodes have run.
  std::unique_ptr<dist::BucketReducer> reducer_;
  bool sharded_ = false;                       // optimizer.shard = state or state+grads on more than one rank
  float* grad_shard_ = nullptr;                // state+grads: this rank's chunks of the summed gradients
  std::vector<std::vector<ValueId>> zero_at_;  // state+grads: gradients zeroed before each schedule step
  // params: this rank's chunk of every parameter (laid out as grad_shard_), the bucket of each
  // parameter (one each), and the all-gathers into the plan's gathered buffers.
  float* param_shard_ = nullptr;
  std::vector<size_t> shard_bucket_;
  // With a prefetch (optimizer.gather_ahead > 0), the gathers of the first use's buffers (live from
  // step 0 in the plan) start as soon as the optimizer has updated their parameters' chunks
  // (early_slices_, updated first), so that they overlap the rest of the update and all that comes
  // before the next step. A run starts them at step 0 otherwise: the first step, the later
  // minibatches, after write_param_shard or an evaluation in the arena.
  ParamGathers gathers_;
  std::vector<size_t> early_slices_;  // indices into the optimizer's slices
  dist::Range shard_range(size_t param) const;
  size_t param_index(const std::string& path) const;
  std::vector<size_t> order_;                  // the parameter behind each of the reducer's buffers
  std::vector<dist::FloatSpan> params_;        // the parameters in that order (gathered after a sharded update)
  std::vector<size_t> bucket_ready_;
  std::vector<int32_t> bucket_span_;  // the recorder's communication span of each bucket in flight
  void run_with_buckets(const RunCtx& rc);
};

}  // namespace loom
