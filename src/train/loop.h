// The training loop around Trainer::step: logging (a progress bar with step, loss, throughput
// and ETA on a terminal; plain lines otherwise), the JSONL metrics file, and the tutorial's
// final print_metrics block.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

#include "data/data.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace loom {

struct LoopOptions {
  int64_t steps = 0;
  int64_t log_every = 1;
  std::string metrics_file;   // JSONL; "" = none
  bool progress_bar = false;  // redraw one line per step (for a terminal)
  FILE* out = stdout;
  // Called before and after every step with its 1-based number in this run (loom train --profile).
  std::function<void(int64_t step)> before_step, after_step;
  // Asked after every step (after after_step): true ends the loop (a signal asked to stop).
  std::function<bool()> should_stop;
};

// Why the loop ended.
enum class LoopEnd { finished, stopped, diverged };

struct LoopResult {
  Metrics total;  // summed over the steps run
  LoopEnd end = LoopEnd::finished;
  std::string why;  // diverged: what was not finite, at which step, and the state kept
  StepReport last;  // the last step's report (metrics, optimizer)
};

// Runs steps until t.steps_done() == o.steps, batch k = data.train_batch(k), calling the
// options' step hooks (evaluation, checkpoints, profiling). Stops early when should_stop() says
// so, or when training diverges under train.on_nonfinite = "stop": a non-finite loss or gradient
// norm in float32/bfloat16 (float16's dynamic scaling skips steps with overflowing gradients as
// GradScaler does), or more than train.max_skipped_steps skipped steps in a row in any dtype. A
// diverged step applied no update and runs no after_step hook, so no checkpoint of it is written.
// A failed write of the metrics file throws std::runtime_error naming it.
LoopResult run_training(Trainer& t, const DataSource& data, const LoopOptions& o);

// "1h02m", "3m07s", "12.3s"
std::string format_duration(double seconds);

}  // namespace loom
