// The optimizer as Optax composes it, run as one fused backend pass per step:
//   optax.chain(clip_by_global_norm(clip_norm), sgd | adam | adamw(schedule, mask))
// plus float16 loss scaling with PyTorch GradScaler's rule (REFERENCE.md §3.2): the loss is
// multiplied by the scale (through the loss seed), gradients are unscaled before clipping, a
// non-finite gradient skips the update and backs the scale off, and the scale grows after
// `interval` finite steps. Unscaling and clipping are folded into the update's grad_scale factor,
// so gradients are read once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"
#include "optim/config.h"
#include "runtime/executor.h"

namespace loom {

// PyTorch GradScaler's state machine (growth tracker, backoff, growth).
struct LossScaler {
  bool enabled = false;
  bool dynamic = false;
  double scale = 1.0;
  double growth = 2.0, backoff = 0.5;
  int64_t interval = 2000;
  int64_t tracker = 0;  // consecutive finite steps since the last change
  int64_t skipped = 0;  // steps whose update was skipped (non-finite gradients)
  void update(bool found_inf);
};

struct OptimizerReport {
  double lr = 0;          // learning rate used (0 when skipped)
  double grad_norm = -1;  // global norm of the unscaled gradients, -1 when not computed
  bool skipped = false;   // non-finite gradients: no update
  double loss_scale = 1;  // scale used for this step's loss
};

class Optimizer {
 public:
  // Allocates the moments for every parameter of `g` (zeroed) on `be`.
  Optimizer(const OptimizerConfig& c, DType compute_dtype, Backend& be, const Graph& g, const Executor& ex);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The loss seed multiplier for this step (the loss scale; 1 without scaling).
  double loss_scale() const { return scaler_.enabled ? scaler_.scale : 1.0; }
  // Clips, checks, and updates params and moments in place from the accumulated gradients.
  OptimizerReport step();

  int64_t count() const { return count_; }  // applied updates (Optax's count)
  const LossScaler& scaler() const { return scaler_; }
  LossScaler& scaler() { return scaler_; }
  void set_count(int64_t c) { count_ = c; }
  // Device buffers of the moments (for checkpoints): per tensor, mu then nu where present.
  const std::vector<OptimTensor>& tensors() const { return ts_; }

 private:
  OptimizerConfig cfg_;
  Backend& be_;
  std::vector<OptimTensor> ts_;
  std::vector<void*> bufs_;
  LossScaler scaler_;
  int64_t count_ = 0;
};

// Whether `path` is decayed under optimizer.weight_decay_mask.
bool weight_decay_applies(WeightDecayMask mask, const std::string& path, const Shape& shape);

}  // namespace loom
