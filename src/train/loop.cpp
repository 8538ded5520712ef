#include "train/loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "nn/models.h"
#include "train/console.h"

namespace loom {

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  const auto total = static_cast<int64_t>(s + 0.5);
  if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

LoopResult run_training(Trainer& t, const DataSource& data, const LoopOptions& o) {
  const bool lm = nn::model_kind(t.config().model.kind).language_model;
  const char* unit = lm ? "tok/s" : "ex/s";
  LoopResult res;
  Metrics& total = res.total;
  const TrainConfig& tc = t.config().train;
  const bool fp16 = t.config().model.dtype == DType::f16;
  const int64_t first = t.steps_done();
  double interval_s = 0;  // steps since the previous log line
  int64_t interval_steps = 0, interval_tokens = 0;
  for (int64_t s = 0; s < first; ++s) res.run_trained += data.train_counts(s);
  double first_s = 0;  // this call's first step
  for (int64_t s = first; s < o.steps; ++s) {
    for (StepHook* h : o.hooks) h->before_step(s + 1);
    const StepReport r = t.step(data.train_batch(s));
    res.last = r;
    ++res.steps_run;
    res.step_seconds += r.seconds;
    if (res.steps_run == 1) first_s = r.seconds;
    interval_s += r.seconds;
    ++interval_steps;
    const TokenCounts counts = data.train_counts(s);
    interval_tokens += counts.tokens;
    res.trained += counts;
    res.run_trained += counts;
    total += r.metrics;
    const LossScaler& sc = t.optimizer().scaler();
    // float16 gradients that overflow are the loss scale's business (skip and back off), up to
    // max_skipped_steps in a row; anything else non-finite means the run diverged.
    const bool scale_skip = fp16 && r.opt.nonfinite == NonFinite::grad_norm;
    std::string diverged;
    if (r.opt.skipped && !scale_skip && tc.on_nonfinite == OnNonFinite::stop)
      diverged = fmt::format("the {} is not finite at step {}", r.opt.nonfinite, s + 1);
    else if (r.opt.skipped && tc.max_skipped_steps > 0 && sc.consecutive >= tc.max_skipped_steps)
      diverged = fmt::format("{} steps in a row were skipped (non-finite {}{}), up to step {}", sc.consecutive,
                             r.opt.nonfinite, sc.enabled ? fmt::format(" at loss scale {:g}", sc.scale) : "", s + 1);
    // The ETA: the mean step time so far (leaving out this call's first step, which pays one-time
    // costs such as page faults and BLAS warm-up, once there is a second) times the steps left,
    // plus the evaluations and checkpoints still to come.
    const double rate_time =
        res.steps_run == 1 ? r.seconds : (res.step_seconds - first_s) / static_cast<double>(res.steps_run - 1);
    double eta = rate_time * static_cast<double>(o.steps - s - 1);
    for (StepHook* h : o.hooks) eta += h->pending_seconds(s + 1, rate_time);
    const int64_t step = t.steps_done();
    const double loss = r.metrics.loss.mean(), acc = r.metrics.accuracy.mean();
    const bool log = step % o.log_every == 0 || s + 1 == o.steps;
    if (log) {
      const double mean_s = interval_s / static_cast<double>(interval_steps);
      const double items_per_s = static_cast<double>(interval_tokens) / interval_s;
      const double mfu = o.model_flops_per_step > 0 && o.ceiling_flops_per_s > 0
                             ? o.model_flops_per_step / mean_s / o.ceiling_flops_per_s
                             : -1;
      std::string extra;
      if (r.opt.skipped)
        extra += sc.enabled ? fmt::format("  skipped (non-finite {}, scale -> {:g})", r.opt.nonfinite, sc.scale)
                            : fmt::format("  skipped (non-finite {})", r.opt.nonfinite);
      clear_status_line();
      fmt::print(o.out, "step {}/{}  loss {:.6f}  accuracy {:.6f}  lr {:.3e}  {:.1f} ms/step  {:.0f} {}{}  ETA {}{}\n",
                 s + 1, o.steps, loss, acc, r.opt.lr, mean_s * 1e3, items_per_s, unit,
                 mfu > 1    ? std::string("  MFU >100% (the cached ceiling is low: `loom profile` re-measures it)")
                 : mfu >= 0 ? fmt::format("  MFU {:.1f}%", 100 * mfu)
                            : "",
                 format_duration(eta), extra);
      if (o.metrics) {
        nlohmann::json j = {{"step", step},
                            {"loss", loss},
                            {"accuracy", acc},
                            {"lr", r.opt.lr},
                            {"step_time_s", mean_s},
                            {lm ? "tokens_per_s" : "examples_per_s", items_per_s},
                            {lm ? "tokens" : "examples", res.run_trained.tokens},
                            {"targets", res.run_trained.targets},
                            {"loss_scale", r.opt.loss_scale},
                            {"skipped_steps", sc.skipped}};
        if (mfu >= 0) j["mfu"] = mfu;
        if (r.opt.grad_norm >= 0) j["grad_norm"] = r.opt.grad_norm;
        o.metrics->write(j);
      }
      interval_s = 0;
      interval_steps = 0;
      interval_tokens = 0;
    }
    if (o.progress_bar) {
      const int width = 24;
      const int filled = static_cast<int>(width * (s + 1) / std::max<int64_t>(o.steps, 1));
      draw_status_line(o.out,
                       fmt::format("[{}{}] step {}/{}  loss {:.4f}  ETA {}", std::string(filled, '#'),
                                   std::string(width - filled, '.'), s + 1, o.steps, loss, format_duration(eta)));
    } else {
      std::fflush(o.out);
    }
    if (!diverged.empty()) {
      clear_status_line();
      res.end = LoopEnd::diverged;
      res.why = diverged;
      return res;
    }
    for (StepHook* h : o.hooks) h->after_step(s + 1);
    bool stop = false;
    for (StepHook* h : o.hooks) stop = h->stop_requested() || stop;  // every hook is asked
    if (stop) {
      clear_status_line();
      res.end = LoopEnd::stopped;
      return res;
    }
  }
  clear_status_line();
  return res;
}

}  // namespace loom
