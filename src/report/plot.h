// `loom plot RUN`: the training curves of a run as one PNG, drawn by gnuplot (Debian's
// gnuplot-nox; scripts/install-deps.sh installs it) from RUN/metrics.jsonl: training and
// validation loss, learning rate, throughput (tokens/s or examples/s) and MFU (when the log has
// it; else training accuracy), each against the step. For users without TensorBoard.
#pragma once
#include <string>

namespace loom {

struct PlotOptions {
  std::string run;                  // a run directory (its metrics.jsonl) or a metrics JSONL file
  std::string out;                  // the PNG ("" = RUN/curves.png, or beside the metrics file)
  std::string gnuplot = "gnuplot";  // the program (looked up on PATH)
};

// Writes the PNG and returns its path. UserError when the metrics are missing or hold no logged
// step, or when gnuplot is not installed (naming the package); std::runtime_error when gnuplot
// fails.
std::string plot_run(const PlotOptions& o);

}  // namespace loom
