// The optimizer's slice of the run configuration and its `optimizer.*` keys (optimizer_keys;
// train/config.h assembles the slices and concatenates the rooms' key tables).
#pragma once
#include <cstdint>
#include <vector>

#include "core/choice.h"
#include "core/config_key.h"
#include "optim/schedule.h"

#define LOOM_OPTIMIZERS(X)                                                      \
  X(sgd, "optax.sgd: momentum and nesterov from optimizer.momentum, .nesterov") \
  X(adam, "optax.adam: b1, b2, eps, eps_root")                                  \
  X(adamw, "optax.adamw: adam with decoupled weight_decay on weight_decay_mask")

#define LOOM_WEIGHT_DECAY_MASKS(X)                                 \
  X(all, "every parameter")                                        \
  X(kernels, "dense kernels only: no biases, norms or embeddings") \
  X(ndim2, "every tensor with 2+ dims (nanoGPT)")

#define LOOM_LOSS_SCALES(X)                                                                       \
  X(dynamic, "PyTorch GradScaler: back off on a non-finite step, grow after loss_scale_interval") \
  X(static_, "the fixed scale loss_scale_init")                                                   \
  X(none, "no loss scaling")

// How the optimizer's state is split across the ranks of a data-parallel job (src/dist/); with one
// rank every mode is none. Columns: enumerator, name, help (LOOM_CHOICE_SPELLED).
#define LOOM_OPTIMIZER_SHARDS(X)                                                                             \
  X(none, "none", "every rank keeps the whole optimizer state (DDP)")                                        \
  X(state, "state", "ZeRO-1: each rank keeps and updates its slice of the moments, parameters all-gathered") \
  X(state_grads, "state+grads",                                                                              \
    "ZeRO-2: as state, and each rank keeps only its slice of the fp32 gradients (reduce-scattered per minibatch)") \
  X(params, "params",                                                                                        \
    "ZeRO-3: as state+grads, and each rank keeps only its slice of the parameters, all-gathered before each use")

namespace loom {

LOOM_CHOICE_SPELLED(OptimizerShard, "shard mode", LOOM_OPTIMIZER_SHARDS)
LOOM_CHOICE(OptimizerName, "optimizer", LOOM_OPTIMIZERS)
LOOM_CHOICE(WeightDecayMask, "mask", LOOM_WEIGHT_DECAY_MASKS)
LOOM_CHOICE(LossScaleMode, "loss scaling", LOOM_LOSS_SCALES)

// optax.chain(clip_by_global_norm(clip_norm), <name>(schedule)) — clipping first when
// clip_norm > 0, then the optimizer with the learning-rate schedule.
struct OptimizerConfig {
  OptimizerName name = OptimizerName::adam;
  double learning_rate = 1e-3;  // constant rate, or the schedule's peak_value
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, eps_root = 0.0;
  double momentum = 0.0;       // sgd
  bool nesterov = false;       // sgd
  double weight_decay = 1e-4;  // adamw (Optax's default)
  WeightDecayMask weight_decay_mask = WeightDecayMask::all;
  double clip_norm = 0.0;                       // clip_by_global_norm before the optimizer; 0 = off
  OptimizerShard shard = OptimizerShard::none;  // with more than one rank (train/trainer.h)
  // shard = params: how many parameter uses ahead each use's all-gathers start (PlanOptions::
  // gather_ahead); 0: each gather blocks at its use. Changes memory and overlap, never the bits.
  int64_t gather_ahead = 1;
  int64_t num_minibatches = 1;
  ScheduleSpec schedule;  // kind constant uses learning_rate
  // float16 loss scaling (PyTorch GradScaler semantics); ignored for float32 / bfloat16.
  LossScaleMode loss_scale = LossScaleMode::dynamic;
  double loss_scale_init = 65536.0;
  double loss_scale_growth = 2.0;
  double loss_scale_backoff = 0.5;
  int64_t loss_scale_interval = 2000;
  double loss_scale_min = 1.0;  // dynamic scaling never backs off below this
};

// The optimizer.* keys (core/config_key.h rows), in `loom help config` order.
const std::vector<KeySpec<OptimizerConfig>>& optimizer_keys();
// The checks of optimizer.* alone, the schedule's included: a UserError naming the key.
void validate_optimizer(const OptimizerConfig& c);

}  // namespace loom
