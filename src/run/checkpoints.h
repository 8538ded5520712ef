// The checkpoints of a run, as a hook of the training loop (train/loop.h): ckpt_<step>/ at
// train.checkpoint_interval (or at every evaluation when it is 0) and at the last step, best/
// when an evaluation improves (run/evaluation.h asks), pruned to train.keep_last after each
// successful save. A state holding a NaN is never written: the run ends diverged
// (run/divergence.h) with the checkpoints it has; so does a save that meets a full disk (an error
// naming the file, on every rank). Without a run directory nothing is saved.
#pragma once
#include <cstdint>
#include <string>

#include "data/data.h"
#include "run/cadence.h"
#include "train/config.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace loom {

// When ckpt_<step>/ is due: every train.checkpoint_interval steps, or at every evaluation when it
// is 0 (`evaluates`: the run evaluates during training), and at the last step.
Cadence checkpoint_cadence(const TrainConfig& train, bool evaluates);

class CheckpointHook : public StepHook {
 public:
  // `saved_step`: the step of the checkpoint this session resumed from, -1 for a new run;
  // `best_val`: the best validation loss so far (-1: none).
  CheckpointHook(Trainer& t, const DataSource& data, std::string run_dir, std::string config_toml, Cadence cadence,
                 int64_t saved_step, double best_val);

  void after_step(int64_t step) override;
  double pending_seconds(int64_t step, double step_seconds) override;

  // best/ for a new best validation loss (and every later checkpoint records it).
  void save_best(double val_loss);
  // ckpt_<step>/ of the current step unless it is saved already (a run stopped between cadence points).
  void save_current();
  bool saves() const { return !run_dir_.empty(); }
  int64_t saved_step() const { return saved_step_; }
  double seconds() const { return seconds_; }

 private:
  void save(const std::string& name);

  Trainer& t_;
  const DataSource& data_;
  std::string run_dir_, config_toml_;
  Cadence cadence_;
  int64_t saved_step_;
  double best_val_;
  double seconds_ = 0;  // this session's saves: their time and count (the summary, the ETA)
  int64_t count_ = 0;
};

}  // namespace loom
