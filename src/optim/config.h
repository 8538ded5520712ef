// The optimizer's slice of the run configuration (`optimizer.*` keys; train/config.h assembles
// the slices and declares their schema).
#pragma once
#include <cstdint>
#include <string>

#include "optim/schedule.h"

namespace loom {

// optax.chain(clip_by_global_norm(clip_norm), <name>(schedule)) — clipping first when
// clip_norm > 0, then the optimizer with the learning-rate schedule.
struct OptimizerConfig {
  std::string name = "adam";    // sgd | adam | adamw
  double learning_rate = 1e-3;  // constant rate, or the schedule's peak_value
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, eps_root = 0.0;
  double momentum = 0.0;                  // sgd
  bool nesterov = false;                  // sgd
  double weight_decay = 1e-4;             // adamw (Optax's default)
  std::string weight_decay_mask = "all";  // all | kernels (no biases, norms, embeddings) | ndim2 (nanoGPT)
  double clip_norm = 0.0;                 // clip_by_global_norm before the optimizer; 0 = off
  std::string shard = "none";             // none | state (ZeRO-1, with more than one rank; train/trainer.h)
  int64_t num_minibatches = 1;
  ScheduleSpec schedule;  // kind constant uses learning_rate
  // float16 loss scaling (PyTorch GradScaler semantics); ignored for float32 / bfloat16.
  std::string loss_scale = "dynamic";  // dynamic | static | none
  double loss_scale_init = 65536.0;
  double loss_scale_growth = 2.0;
  double loss_scale_backoff = 0.5;
  int64_t loss_scale_interval = 2000;
};

}  // namespace loom
