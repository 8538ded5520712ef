// The training loop around Trainer::step: logging (a progress bar with step, loss, throughput
// and ETA on a terminal; plain lines otherwise), the JSONL metrics file, and the tutorial's
// final print_metrics block.
#pragma once
#include <cstdio>
#include <string>

#include "train/data.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace loom {

struct LoopOptions {
  int64_t steps = 0;
  int64_t log_every = 1;
  std::string metrics_file;  // JSONL; "" = none
  bool progress_bar = false;  // redraw one line per step (for a terminal)
  FILE* out = stdout;
};

// Runs `steps` steps on `batch`; returns the metrics summed over all of them.
Metrics run_training(Trainer& t, const Batch& batch, const LoopOptions& o);

// "1h02m", "3m07s", "12.3s"
std::string format_duration(double seconds);

}  // namespace loom
