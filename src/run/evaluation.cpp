#include "run/evaluation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/clock.h"
#include "train/console.h"

namespace loom {

ValidationRecord validation_so_far(const Checkpoint& resumed, const std::filesystem::path& run_dir) {
  if (resumed.path.empty()) return {};
  return {.best = resumed.state.best_val_loss,
          .best_step = std::max<int64_t>(0, checkpoint_step((run_dir / "best").string()))};
}

EvaluationHook::EvaluationHook(Trainer& t, Backend& be, DataSource& data, CheckpointHook& checkpoints,
                               MetricsLog& metrics, ValidationRecord record,
                               std::chrono::steady_clock::time_point started, FILE* out)
    : eval_(t, be),
      data_(data),
      checkpoints_(checkpoints),
      metrics_(metrics),
      record_(record),
      started_(started),
      out_(out),
      cadence_{t.config().train.eval_interval, t.config().train.steps},
      iters_(t.config().train.eval_iters),
      minibatches_(t.config().optimizer.num_minibatches) {}

void EvaluationHook::after_step(int64_t step) {
  if (!cadence_.due(step)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const double vl = eval_.run(data_, iters_);
  seconds_ += seconds_since(t0);
  ++count_;
  record_.last = vl;
  record_.last_step = step;
  const bool improved = std::isfinite(vl) && (record_.best < 0 || vl < record_.best);
  if (improved) record_.best = vl, record_.best_step = step;
  clear_status_line();
  fmt::print(out_, "step {}: val loss {:.4f}{}\n", step, vl, improved ? " (best so far)" : "");
  std::fflush(out_);
  // elapsed_s: this command's wall time so far (setup and evaluations included), for time to a loss.
  metrics_.write(
      {{"step", step}, {"val_loss", vl}, {"best_val_loss", record_.best}, {"elapsed_s", seconds_since(started_)}});
  if (improved) checkpoints_.save_best(vl);
}

double EvaluationHook::pending_seconds(int64_t step, double step_s) {
  // At the mean time of this session's evaluations so far; before the first, its batches' forward
  // passes of one minibatch each at a third of a training minibatch's time (forward ≈ 1/3 of
  // forward + backward).
  const double per_eval =
      count_ ? seconds_ / static_cast<double>(count_)
             : static_cast<double>(data_.val_batches(iters_)) * step_s / (3.0 * static_cast<double>(minibatches_));
  return static_cast<double>(cadence_.left_after(step)) * per_eval;
}

}  // namespace loom
