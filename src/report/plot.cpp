#include "report/plot.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/error.h"

extern char** environ;

namespace loom {

namespace fs = std::filesystem;

namespace {

bool on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  for (std::string dirs = path ? path : ""; !dirs.empty();) {
    const size_t colon = dirs.find(':');
    const std::string dir = dirs.substr(0, colon);
    if (!dir.empty() && access((fs::path(dir) / program).c_str(), X_OK) == 0) return true;
    dirs = colon == std::string::npos ? "" : dirs.substr(colon + 1);
  }
  return false;
}

// The gnuplot string literal of `s` (single quotes: no escapes but '' for ').
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string plot_run(const PlotOptions& o) {
  const fs::path metrics = fs::is_directory(o.run) ? fs::path(o.run) / "metrics.jsonl" : fs::path(o.run);
  std::ifstream in(metrics);
  if (!in)
    throw UserError(metrics.string(), "cannot be opened",
                    "give a run directory written by `loom train --out DIR` (it holds metrics.jsonl), or the metrics "
                    "file itself");
  // Columns of the data file: step, loss, val_loss, lr, throughput, mfu or accuracy ("NaN" = absent).
  std::string rows;
  int64_t train_rows = 0, val_rows = 0;
  bool tokens = false, mfu = false;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step")) continue;
    auto col = [&](const char* key) { return j.contains(key) ? fmt::format("{}", j[key].get<double>()) : "NaN"; };
    tokens = tokens || j.contains("tokens_per_s");
    mfu = mfu || j.contains("mfu");
    train_rows += j.contains("loss");
    val_rows += j.contains("val_loss");
    rows += fmt::format("{} {} {} {} {} {} {}\n", j["step"].get<int64_t>(), col("loss"), col("val_loss"), col("lr"),
                        j.contains("tokens_per_s") ? col("tokens_per_s") : col("examples_per_s"), col("mfu"),
                        col("accuracy"));
  }
  if (train_rows + val_rows == 0)
    throw UserError(metrics.string(), "holds no logged step", "plot a run that has trained at least one step");
  if (!on_path(o.gnuplot))
    throw UserError("loom plot", "needs gnuplot, which is not installed",
                    "install it: apt-get install gnuplot-nox (scripts/install-deps.sh does), or read the numbers in "
                    "TensorBoard (train.tensorboard = true) or " +
                        metrics.string());
  const std::string png = !o.out.empty() ? o.out : (metrics.parent_path() / "curves.png").string();
  const fs::path tmp = fs::temp_directory_path() / fmt::format("loom_plot_{}", getpid());
  fs::create_directories(tmp);
  std::ofstream(tmp / "metrics.dat") << rows;
  const std::string data = quoted((tmp / "metrics.dat").string());
  std::string script = fmt::format(
      "set terminal pngcairo noenhanced size 1400,900 font ',10'\n"
      "set output {}\n"
      "set datafile missing 'NaN'\n"
      "set grid\nset key top right\nset xlabel 'step'\n"
      "set multiplot layout 2,2 title {}\n",
      quoted(png), quoted(fs::absolute(metrics).parent_path().string()));
  script += fmt::format(
      "set title 'loss'\nplot {0} using 1:2 with lines title 'train', {0} using 1:3 with "
      "linespoints pt 7 ps 0.6 title 'val'\n",
      data);
  script += fmt::format("set title 'learning rate'\nplot {} using 1:4 with lines notitle\n", data);
  script +=
      fmt::format("set title '{}'\nplot {} using 1:5 with lines notitle\n", tokens ? "tokens/s" : "examples/s", data);
  script +=
      mfu ? fmt::format("set title 'MFU'\nset format y '%.0f%%'\nplot {} using 1:($6*100) with lines notitle\n", data)
          : fmt::format("set title 'training accuracy'\nplot {} using 1:7 with lines notitle\n", data);
  script += "unset multiplot\n";
  std::ofstream(tmp / "plot.gp") << script;

  const std::string script_path = (tmp / "plot.gp").string();
  char* argv[] = {const_cast<char*>(o.gnuplot.c_str()), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  int status = 0;
  const int spawned = posix_spawnp(&pid, o.gnuplot.c_str(), nullptr, nullptr, argv, environ);
  if (spawned == 0) waitpid(pid, &status, 0);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (spawned != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("gnuplot failed to draw " + png + " (its messages are above)");
  return png;
}

}  // namespace loom
