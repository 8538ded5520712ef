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
};

// Runs steps until t.steps_done() == o.steps, batch k = data.train_batch(k), calling the
// options' step hooks (evaluation, checkpoints, profiling). Returns the metrics summed over the
// steps it ran.
Metrics run_training(Trainer& t, const DataSource& data, const LoopOptions& o);

// "1h02m", "3m07s", "12.3s"
std::string format_duration(double seconds);

}  // namespace loom
