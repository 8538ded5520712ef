#include "run/checkpoints.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "core/clock.h"
#include "core/error.h"
#include "dist/comm.h"
#include "run/divergence.h"
#include "train/checkpoint.h"

namespace loom {

Cadence checkpoint_cadence(const TrainConfig& train, bool evaluates) {
  return {train.checkpoint_interval > 0 ? train.checkpoint_interval : evaluates ? train.eval_interval : 0, train.steps};
}

CheckpointHook::CheckpointHook(Trainer& t, const DataSource& data, std::string run_dir, std::string config_toml,
                               Cadence cadence, int64_t saved_step, double best_val)
    : t_(t),
      data_(data),
      run_dir_(std::move(run_dir)),
      config_toml_(std::move(config_toml)),
      cadence_(cadence),
      saved_step_(saved_step),
      best_val_(best_val) {}

void CheckpointHook::after_step(int64_t step) {
  if (saves() && cadence_.due(step)) save(fmt::format("ckpt_{:06d}", step));
}

double CheckpointHook::pending_seconds(int64_t step, double) {
  // At the mean time of this session's saves so far; nothing is known before the first.
  if (!saves() || count_ == 0) return 0;
  return static_cast<double>(cadence_.left_after(step)) * seconds_ / static_cast<double>(count_);
}

void CheckpointHook::save_best(double val_loss) {
  best_val_ = val_loss;
  if (saves()) save("best");
}

void CheckpointHook::save_current() {
  if (saves() && saved_step_ != t_.steps_done()) save(fmt::format("ckpt_{:06d}", t_.steps_done()));
}

void CheckpointHook::save(const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  const LossScaler& sc = t_.optimizer().scaler();
  const CheckpointState state{.config_toml = config_toml_,
                              .step = t_.steps_done(),
                              .opt_count = t_.optimizer().count(),
                              .loss_scale = sc.scale,
                              .scaler_tracker = sc.tracker,
                              .scaler_skipped = sc.skipped,
                              .scaler_consecutive = sc.consecutive,
                              .seed = t_.config().seed,
                              .val_position = data_.val_position(),
                              .best_val_loss = best_val_,
                              .base_hash = {}};  // save_checkpoint hashes a LoRA run's base
  SaveResult sr;
  try {
    sr = save_checkpoint(t_, state, (std::filesystem::path(run_dir_) / name).string(), data_.tokenizer_json());
  } catch (const UserError& e) {  // every rank: a full disk ends the run with the checkpoints it has
    throw dist::AgreedError(
        "",
        e.what() + std::string("; ") +
            (name == "best" ? "the new best/ was not saved (the one before is intact), "
                            : name + " was not saved (no part of it is left), ") +
            (saved_step_ >= 0 ? fmt::format("the last checkpoint, step {}, is intact", saved_step_)
                              : std::string("and no checkpoint was written before it")),
        e.hint() + (saved_step_ >= 0 ? "; then resume with `loom train --resume " + run_dir_ + "`" : ""));
  }
  seconds_ += seconds_since(t0);
  ++count_;
  if (!sr.saved)
    throw diverged_error(
        fmt::format("tensor '{}' is not finite after step {} (not saved)", sr.nonfinite, t_.steps_done()), run_dir_,
        t_.config().source, saved_step_);
  if (name == "best") return;
  saved_step_ = t_.steps_done();
  if (t_.comm().rank() == 0) prune_checkpoints(run_dir_, t_.config().train.keep_last);  // rank 0 owns the directory
}

}  // namespace loom
