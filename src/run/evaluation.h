// Evaluation during a run, as a hook of the training loop (train/loop.h): the validation loss
// every train.eval_interval steps and at the last step, printed ("step N: val loss X (best so
// far)") and logged (metrics.jsonl, TensorBoard); a new best asks the checkpoints for best/.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "backend/backend.h"
#include "data/data.h"
#include "run/cadence.h"
#include "run/checkpoints.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"
#include "train/loop.h"
#include "train/metrics_log.h"

namespace loom {

// The validation losses a session saw, for the summary. -1: none; best_step 0: unknown (a
// checkpoint that does not record it).
struct ValidationRecord {
  double last = -1, best = -1;
  int64_t last_step = 0, best_step = 0;
};

// What a session starts from: the resumed checkpoint's best validation loss and the step of the
// run directory's best/ (0 when it records none); nothing for a new run (`resumed.path` "").
ValidationRecord validation_so_far(const Checkpoint& resumed, const std::filesystem::path& run_dir);

class EvaluationHook : public StepHook {
 public:
  // `record`: the best so far when resuming. `started`: the command's start, for elapsed_s.
  EvaluationHook(Trainer& t, Backend& be, DataSource& data, CheckpointHook& checkpoints, MetricsLog& metrics,
                 ValidationRecord record, std::chrono::steady_clock::time_point started, FILE* out);

  void after_step(int64_t step) override;
  double pending_seconds(int64_t step, double step_seconds) override;

  const ValidationRecord& record() const { return record_; }
  double seconds() const { return seconds_; }

 private:
  Evaluator eval_;
  DataSource& data_;
  CheckpointHook& checkpoints_;
  MetricsLog& metrics_;
  ValidationRecord record_;
  std::chrono::steady_clock::time_point started_;
  FILE* out_;
  Cadence cadence_;
  int64_t iters_, minibatches_;
  double seconds_ = 0;  // this session's evaluations: their time and count (the summary, the ETA)
  int64_t count_ = 0;
};

}  // namespace loom
