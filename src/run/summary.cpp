#include "run/summary.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/format.h"
#include "train/loop.h"

namespace loom {

std::string format_run_summary(const RunSummary& s) {
  const int64_t run_steps = s.last_step - s.first_step + 1;
  std::string o = fmt::format("\nrun summary (steps {}-{} of {}{}):\n", s.first_step, s.last_step, s.total_steps,
                              s.first_step > 1 ? ", resumed" : "");
  auto row = [&](const char* name, const std::string& value) { o += fmt::format("  {:<16} {}\n", name, value); };
  row("loss", fmt::format("{:.4f} (the last step's training loss)", s.last_loss));
  if (s.last_val >= 0)
    row("val loss", fmt::format("{:.4f} at step {} (last); best {:.4f}{}", s.last_val, s.last_val_step, s.best_val,
                                s.best_val_step > 0 ? fmt::format(" at step {}", s.best_val_step) : ""));
  else if (s.best_val >= 0)
    row("val loss", fmt::format("best {:.4f}{} (none this session)", s.best_val,
                                s.best_val_step > 0 ? fmt::format(" at step {}", s.best_val_step) : ""));
  const char* unit = s.tokens ? "tokens" : "examples";
  const auto run_items = static_cast<double>(s.session_trained.tokens);
  const auto count = [](double v) { return format_count(static_cast<int64_t>(v + 0.5)); };
  const TokenCounts& all = s.run_trained;
  // Masked (chat) data: the targets, what the loss averages over, beside the tokens read.
  const std::string targets =
      all.targets == all.tokens
          ? ""
          : fmt::format(", {} of them targets ({:.1f}%)", format_count(all.targets),
                        all.tokens ? 100.0 * static_cast<double>(all.targets) / static_cast<double>(all.tokens) : 0.0);
  row(unit, fmt::format("{} trained{}{}", format_count(all.tokens), targets,
                        s.first_step > 1 ? fmt::format(" ({} this session)", count(run_items)) : ""));
  row("wall time",
      fmt::format("{} (training steps {}, evaluation {}, checkpoints {}, other {})", format_duration(s.wall_s),
                  format_duration(s.step_s), format_duration(s.eval_s), format_duration(s.save_s),
                  format_duration(std::max(0.0, s.wall_s - s.step_s - s.eval_s - s.save_s))));
  if (s.step_s > 0)
    row("throughput", fmt::format("{} {}/s (mean over the training steps), {:.1f} ms/step", count(run_items / s.step_s),
                                  s.tokens ? "tok" : "ex", 1e3 * s.step_s / static_cast<double>(run_steps)));
  return o;
}

}  // namespace loom
