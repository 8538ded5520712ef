// The training loop around Trainer::step: a log line every log_every steps with the interval's
// numbers (mean step time, tokens/s and MFU over the steps since the previous line, not the one
// logged step), the ETA, the JSONL metrics file, and on a terminal a progress bar under the log
// lines (train/console.h).
// Token counts (DataSource::train_counts) leave padding out: tok/s is the examples' tokens per
// second (every position for plain token data), and metrics.jsonl's "tokens" and "targets" are the
// run's tokens trained through the logged step and the training targets among them (what the loss
// averages over). MFU counts the model FLOPs of every position computed, padding included: it
// measures the device's use, not the data's.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "data/data.h"
#include "train/metrics.h"
#include "train/metrics_log.h"
#include "train/trainer.h"

namespace loom {

// What a run does around the steps: evaluation, checkpoints, the profiling window, a stop
// signal (run/ holds them, one unit each). The loop calls every hook, in the order given, at each
// point; a hook overrides the points it needs.
class StepHook {
 public:
  virtual ~StepHook() = default;
  // Before and after step `step` (1-based over the whole run). after_step follows the step's log
  // line; a diverged step runs none.
  virtual void before_step(int64_t /*step*/) {}
  virtual void after_step(int64_t /*step*/) {}
  // Asked of every hook after every step (after after_step), so a hook may run a collective in
  // it: any true ends the loop there.
  virtual bool stop_requested() { return false; }
  // Seconds of this hook's work still to come after step `step`, given the mean step time so
  // far; added to the ETA.
  virtual double pending_seconds(int64_t /*step*/, double /*step_seconds*/) { return 0; }
};

struct LoopOptions {
  int64_t steps = 0;
  int64_t log_every = 1;
  MetricsLog* metrics = nullptr;  // where logged steps go (JSONL, TensorBoard); nullptr = nowhere
  bool progress_bar = false;      // redraw one line per step (for a terminal)
  FILE* out = stdout;
  std::vector<StepHook*> hooks;
  // MFU on each log line: the model FLOPs of one step (forward and backward of every minibatch;
  // recompute not counted) against the device's matmul ceiling in FLOP/s. 0 for either: no MFU.
  double model_flops_per_step = 0, ceiling_flops_per_s = 0;
};

// Why the loop ended.
enum class LoopEnd { finished, stopped, diverged };

struct LoopResult {
  Metrics total;  // summed over the steps run
  // Tokens (examples) and targets of the steps run, and of every step of the run up to the last.
  TokenCounts trained, run_trained;
  LoopEnd end = LoopEnd::finished;
  std::string why;          // diverged: what was not finite, at which step, and the state kept
  StepReport last;          // the last step's report (metrics, optimizer)
  int64_t steps_run = 0;    // steps this call ran
  double step_seconds = 0;  // their wall time, summed (training steps only: no hooks)
};

// Runs steps until t.steps_done() == o.steps, batch k = data.train_batch(k), calling the
// options' step hooks. Stops early when a hook asks to stop, or when training diverges under train.on_nonfinite =
// "stop": a non-finite loss or gradient norm in float32/bfloat16 (float16's dynamic scaling skips steps with
// overflowing gradients as GradScaler does), or more than train.max_skipped_steps skipped steps in a row in any dtype.
// A diverged step applied no update and runs no after_step hook, so no checkpoint of it is written. A failed write of
// the metrics throws std::runtime_error naming the file.
LoopResult run_training(Trainer& t, const DataSource& data, const LoopOptions& o);

// "1h02m", "3m07s", "12.3s"
std::string format_duration(double seconds);

}  // namespace loom
