#include "train/loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace loom {

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  const auto total = static_cast<int64_t>(s + 0.5);
  if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

Metrics run_training(Trainer& t, const DataSource& data, const LoopOptions& o) {
  std::ofstream jsonl;
  if (!o.metrics_file.empty()) {
    jsonl.open(o.metrics_file, std::ios::app);
    if (!jsonl) throw std::runtime_error("cannot open metrics file '" + o.metrics_file + "' for writing");
  }
  const bool lm = t.config().model.kind == "transformer";
  const char* unit = lm ? "tok/s" : "ex/s";
  const double items_per_step =
      static_cast<double>(t.model().examples * t.config().optimizer.num_minibatches * t.comm().size());
  Metrics total;
  double elapsed = 0;
  const int64_t first = t.steps_done();
  for (int64_t s = first; s < o.steps; ++s) {
    if (o.before_step) o.before_step(s + 1);
    const StepReport r = t.step(data.train_batch(s));
    add_metrics(total, r.metrics);
    // The first step includes one-time costs (page faults, BLAS warm-up): leave it out of the
    // throughput estimate once there is a second step.
    elapsed += r.seconds;
    const double rate_time = s == first ? r.seconds : elapsed / static_cast<double>(s - first + 1);
    const double items_per_s = items_per_step / r.seconds;
    const double eta = rate_time * static_cast<double>(o.steps - s - 1);
    const int64_t step = t.steps_done();
    const double loss = r.metrics.at("loss").mean(), acc = r.metrics.at("accuracy").mean();
    const bool log = step % o.log_every == 0 || s + 1 == o.steps;
    std::string extra;
    if (r.opt.skipped)
      extra += fmt::format("  skipped (non-finite grads, scale -> {:g})", t.optimizer().scaler().scale);
    if (o.progress_bar) {
      const int width = 24;
      const int filled = static_cast<int>(width * (s + 1) / std::max<int64_t>(o.steps, 1));
      fmt::print(o.out, "\r[{}{}] step {}/{}  loss {:.4f}  {:.0f} {}  ETA {}\x1b[K", std::string(filled, '#'),
                 std::string(width - filled, '.'), s + 1, o.steps, loss, items_per_s, unit, format_duration(eta));
      if (log) fmt::print(o.out, "\n");
    } else if (log) {
      fmt::print(o.out, "step {}/{}  loss {:.6f}  accuracy {:.6f}  lr {:.3e}  {:.1f} ms/step  {:.0f} {}  ETA {}{}\n",
                 s + 1, o.steps, loss, acc, r.opt.lr, r.seconds * 1e3, items_per_s, unit, format_duration(eta), extra);
    }
    std::fflush(o.out);
    if (log && jsonl) {
      nlohmann::json j = {{"step", step},
                          {"loss", loss},
                          {"accuracy", acc},
                          {"lr", r.opt.lr},
                          {"step_time_s", r.seconds},
                          {lm ? "tokens_per_s" : "examples_per_s", items_per_s},
                          {"loss_scale", r.opt.loss_scale},
                          {"skipped_steps", t.optimizer().scaler().skipped}};
      if (r.opt.grad_norm >= 0) j["grad_norm"] = r.opt.grad_norm;
      jsonl << j.dump() << "\n";
      jsonl.flush();
    }
    if (o.after_step) o.after_step(s + 1);
  }
  return total;
}

}  // namespace loom
