#include "run/divergence.h"

#include <fmt/format.h>

namespace loom {

dist::AgreedError diverged_error(const std::string& why, const std::string& run_dir, const std::string& source,
                                 int64_t saved_step) {
  const bool kept = !run_dir.empty() && saved_step >= 0;
  return dist::AgreedError(run_dir.empty() ? source : run_dir,
                           "training diverged: " + why + "; " +
                               (run_dir.empty() ? std::string("there is no run directory, so nothing was saved")
                                : kept          ? fmt::format("the last checkpoint, step {}, is intact", saved_step)
                                                : std::string("no checkpoint was written before it")),
                           kept ? "resume with `loom train --resume " + run_dir +
                                      "` and a lower optimizer.learning_rate (or optimizer.clip_norm = 1.0); "
                                      "train.on_nonfinite = skip goes on past such steps"
                                : "lower optimizer.learning_rate, set optimizer.clip_norm = 1.0, or train in float32");
}

}  // namespace loom
