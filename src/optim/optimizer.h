// The optimizer as Optax composes it, run as one fused backend pass per step (or slice by slice in
// an order the caller gives, Optimizer::UpdateOrder):
//   optax.chain(clip_by_global_norm(clip_norm), sgd | adam | adamw(schedule, mask))
// plus float16 loss scaling with PyTorch GradScaler's rule (docs/reference.md, "Loss scaling"): the loss is
// multiplied by the scale (through the loss seed), gradients are unscaled before clipping, a
// non-finite gradient skips the update and backs the scale off, and the scale grows after
// `interval` finite steps. Unscaling and clipping are folded into the update's grad_scale factor,
// so gradients are read once.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/choice_format.h"
#include "graph/graph.h"
#include "optim/config.h"
#include "runtime/executor.h"

// What a skipped step found not finite (OptimizerReport::nonfinite), as messages name it.
#define LOOM_NONFINITE_QUANTITIES(X)                 \
  X(nothing, "nothing", "every quantity was finite") \
  X(loss, "loss", "the loss")                        \
  X(grad_norm, "gradient norm", "the global gradient norm")

namespace loom {

LOOM_CHOICE_SPELLED(NonFinite, "non-finite quantity", LOOM_NONFINITE_QUANTITIES)

// PyTorch GradScaler's state machine (growth tracker, backoff, growth), with a floor: the scale
// never backs off below `min_scale` (a scale halving towards 0 would skip every step forever).
// The skip counters run in every dtype: a float32 step skipped for a non-finite loss counts too.
struct LossScaler {
  bool enabled = false;
  bool dynamic = false;
  double scale = 1.0;
  double growth = 2.0, backoff = 0.5;
  double min_scale = 1.0;
  int64_t interval = 2000;
  int64_t tracker = 0;      // consecutive finite steps since the last change
  int64_t skipped = 0;      // steps whose update was skipped (non-finite loss or gradients)
  int64_t consecutive = 0;  // skipped steps in a row, up to the last one
  void update(bool found_inf);
};

// The elements [begin, begin + n) of parameter `param` (an index into Graph::params()): a part of
// the model whose optimizer state this process holds and updates. One whole slice per parameter
// in a single process; under sharded optimizer state (train/trainer.h) each rank's own parts.
// Its gradient is elements [begin, begin + n) of the parameter's gradient buffer, or with `grad`
// set n elements there (a rank's gradient shard under optimizer.shard = state+grads); likewise its
// values are in the parameter's buffer, or with `values` set n elements there (a rank's parameter
// shard under optimizer.shard = params).
struct OptimSlice {
  size_t param = 0;
  int64_t begin = 0, n = 0;
  float* grad = nullptr;
  float* values = nullptr;
};

struct OptimizerReport {
  double lr = 0;                             // learning rate used (0 when skipped)
  double grad_norm = -1;                     // global norm of the unscaled gradients, -1 when not computed
  bool skipped = false;                      // no update: `nonfinite` says why
  NonFinite nonfinite = NonFinite::nothing;  // what was not finite when skipped
  double loss_scale = 1;                     // scale used for this step's loss
};

class Optimizer {
 public:
  // Allocates the moments (zeroed) on `be` for `slices` (none given: every trainable parameter of `g` whole).
  // `sum_over_ranks`, when set, turns this process's part of the squared gradient norm into the
  // whole model's (the parts are summed over the ranks holding the other slices).
  Optimizer(const OptimizerConfig& c, DType compute_dtype, Backend& be, const Graph& g, const Executor& ex,
            std::optional<std::vector<OptimSlice>> slices = {}, std::function<double(double)> sum_over_ranks = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The loss seed multiplier for this step (the loss scale; 1 without scaling).
  double loss_scale() const { return scaler_.enabled ? scaler_.scale : 1.0; }
  // The order of one step's update: the slices `first` (indices into slices()) are updated before
  // the others, `after_first` runs once they are (not when the step is skipped), and `poll` after
  // each later slice (communication started by after_first advances only when polled). The
  // elements and their bits are those of one pass (the update is elementwise). Default: one pass.
  struct UpdateOrder {
    std::vector<size_t> first;
    std::function<void()> after_first, poll;
  };
  // Clips, checks, and updates params and moments in place from the accumulated gradients. With
  // `loss_finite` false (the step's loss is a NaN or an infinity) nothing is updated: the step is
  // skipped and counted, and a dynamic loss scale backs off.
  OptimizerReport step(bool loss_finite = true, const UpdateOrder& order = {});

  int64_t count() const { return count_; }  // applied updates (Optax's count)
  const LossScaler& scaler() const { return scaler_; }
  LossScaler& scaler() { return scaler_; }
  void set_count(int64_t c) { count_ = c; }
  // The slices and, for each, its parameter, gradient and moment buffers (offset to the slice).
  const std::vector<OptimSlice>& slices() const { return slices_; }
  const std::vector<OptimTensor>& tensors() const { return ts_; }
  // Whether the optimizer keeps moment `which` (0: mu, the first; 1: nu, the second).
  bool keeps_moment(int which) const { return which < moments_; }

 private:
  OptimizerConfig cfg_;
  Backend& be_;
  std::vector<OptimSlice> slices_;
  std::vector<OptimTensor> ts_;
  std::function<double(double)> sum_over_ranks_;
  int64_t moments_ = 0;  // optimizer_moments(cfg_)
  std::vector<void*> bufs_;
  LossScaler scaler_;
  int64_t count_ = 0;
};

// Moment buffers per parameter the optimizer keeps: 2 for adam/adamw, 1 for sgd with momentum, else 0.
int64_t optimizer_moments(const OptimizerConfig& c);

// Whether a parameter of `role` and `shape` is decayed under optimizer.weight_decay_mask.
bool weight_decay_applies(WeightDecayMask mask, ParamRole role, const Shape& shape);

}  // namespace loom
