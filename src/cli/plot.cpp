// `loom plot RUN [--out FILE]`: the training curves as a PNG (report/plot.h).
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "report/plot.h"

namespace loom::cli {

CommandBody add_plot_command(CLI::App& sub) {
  auto o = std::make_shared<PlotOptions>();
  sub.add_option("run", o->run, "a run directory (its metrics.jsonl) or a metrics JSONL file")
      ->required()
      ->transform(home_path());
  sub.add_option("--out", o->out, "the PNG to write (default RUN/curves.png)")->transform(home_path());
  return [o] {
    fmt::print("wrote {}\n", plot_run(*o));
    return 0;
  };
}

}  // namespace loom::cli
