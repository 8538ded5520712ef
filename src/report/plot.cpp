#include "report/plot.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

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
  // Columns of the data file: step, loss, val_loss, lr, throughput, mfu, accuracy ("NaN" = absent,
  // or null: a skipped step's non-finite loss is written as null).
  std::string rows;
  int64_t train_rows = 0, val_rows = 0;
  std::array<bool, 7> drawn{};  // a column holds a number somewhere: gnuplot refuses a plot with no point
  bool tokens = false;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    tokens = tokens || j.contains("tokens_per_s");
    train_rows += j.contains("loss");
    val_rows += j.contains("val_loss");
    const char* keys[] = {"loss", "val_loss", "lr", tokens ? "tokens_per_s" : "examples_per_s", "mfu", "accuracy"};
    rows += fmt::format("{}", j["step"].get<int64_t>());
    for (size_t c = 0; c < std::size(keys); ++c) {
      const bool number = j.contains(keys[c]) && j[keys[c]].is_number();
      drawn[c + 1] = drawn[c + 1] || number;
      rows += number ? fmt::format(" {}", j[keys[c]].get<double>()) : std::string(" NaN");
    }
    rows += "\n";
  }
  if (train_rows + val_rows == 0)
    throw UserError(metrics.string(), "holds no logged step", "plot a run that has trained at least one step");
  if (!on_path(o.gnuplot))
    throw UserError("loom plot", "needs gnuplot, which is not installed",
                    "install it: apt-get install gnuplot-nox (scripts/install-deps.sh does), or read the numbers in "
                    "TensorBoard (train.tensorboard = true) or " +
                        metrics.string());
  const std::string png = !o.out.empty() ? o.out : (metrics.parent_path() / "curves.png").string();
  // A fresh private directory (mkdtemp): a fixed name in a shared /tmp could be made in advance
  // by another user, with links that would redirect these writes onto the caller's files.
  std::string made = (fs::temp_directory_path() / "loom_plot_XXXXXX").string();
  if (!mkdtemp(made.data())) throw std::system_error(errno, std::generic_category(), "loom plot: mkdtemp " + made);
  const fs::path tmp = made;
  std::ofstream(tmp / "metrics.dat") << rows;
  const std::string data = quoted((tmp / "metrics.dat").string());
  std::string script = fmt::format(
      "set terminal pngcairo noenhanced size 1400,900 font ',10'\n"
      "set output {}\n"
      "set datafile missing 'NaN'\n"
      "set grid\nset key top right\nset xlabel 'step'\n"
      "set multiplot layout 2,2 title {}\n",
      quoted(png), quoted(fs::absolute(metrics).parent_path().string()));
  // A panel draws the series that have points, and is left out when none has.
  auto panel = [&](const std::string& title, std::initializer_list<std::pair<int, std::string>> series) {
    std::string plots;
    for (const auto& [column, how] : series)
      if (drawn[column]) plots += (plots.empty() ? "" : ", ") + data + " " + how;
    if (!plots.empty()) script += "set title '" + title + "'\nplot " + plots + "\n";
  };
  panel("loss", {{1, "using 1:2 with lines title 'train'"}, {2, "using 1:3 with linespoints pt 7 ps 0.6 title 'val'"}});
  panel("learning rate", {{3, "using 1:4 with lines notitle"}});
  panel(tokens ? "tokens/s" : "examples/s", {{4, "using 1:5 with lines notitle"}});
  if (drawn[5]) {
    script += "set format y '%.0f%%'\n";
    panel("MFU", {{5, "using 1:($6*100) with lines notitle"}});
  } else {
    panel("training accuracy", {{6, "using 1:7 with lines notitle"}});
  }
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
