#include "report/ceiling.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "report/profile.h"

namespace loom {

namespace fs = std::filesystem;

FlopCounts step_flops(const Trainer& t) {
  const Graph& g = t.model().graph;
  FlopCounts f;
  for (NodeId id : t.plan().schedule) {
    const Node& n = g.node(id);
    const auto flops = static_cast<double>(node_cost(g, n).flops);
    f.hardware += flops;
    if (n.phase != Phase::recompute) f.model += flops;
  }
  const auto mb = static_cast<double>(t.config().optimizer.num_minibatches);
  return {.model = f.model * mb, .hardware = f.hardware * mb};
}

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

nlohmann::json read_cache(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return nlohmann::json::object();
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

// An entry: {"gflops": x, "busy": whether other processes competed for the cores meanwhile}.
void cache_ceiling(const Backend& be, DType compute, double gflops, bool busy) {
  const fs::path p = ceiling_cache_file();
  if (p.empty() || gflops <= 0) return;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  nlohmann::json j = read_cache(p);
  // A ceiling is an upper bound: a lower measurement means the machine was busy (or throttled).
  // An idle measurement replaces a busy one; otherwise the higher stays.
  const std::string key = ceiling_cache_key(be, compute);
  if (auto it = j.find(key); it != j.end() && it->is_object()) {
    const bool old_busy = it->value("busy", true);
    const double old = it->value("gflops", 0.0);
    if ((busy && !old_busy) || (busy == old_busy && old >= gflops)) return;
  }
  j[key] = {{"gflops", gflops}, {"busy", busy}};
  // Written beside and renamed: concurrent runs never read half a file.
  const fs::path tmp = p.string() + "." + std::to_string(getpid()) + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f.flush()) return fs::remove(tmp, ec), void();
  }
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace

std::string ceiling_cache_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return (fs::path(xdg) / "loom" / "matmul_ceiling.json").string();
  if (home && *home) return (fs::path(home) / ".cache" / "loom" / "matmul_ceiling.json").string();
  return {};
}

std::string ceiling_cache_key(const Backend& be, DType compute) {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string kernel = be.matmul_kernel(compute);
  return fmt::format("{} {} {} threads, {}{}{}", be.name(), dtype_name(compute), num_threads(), cpu_model(),
                     isa && *isa ? fmt::format(", ONEDNN_MAX_CPU_ISA={}", isa) : "",
                     kernel.empty() ? "" : ", " + kernel);
}

namespace {
constexpr const char* kBusyNote =
    "note: the matmul ceiling was measured while other processes competed for the cores, so it is low and MFU "
    "reads high; `loom profile` on an idle machine measures it again\n";
}  // namespace

double measure_matmul_ceiling(Backend& be, DType compute, std::FILE* log) {
  LoadSampler load;
  load.start();
  const double gflops = be.measure_matmul_gflops(compute);
  const bool busy = load.stop().contended();
  cache_ceiling(be, compute, gflops, busy);
  if (busy && log) fmt::print(log, "{}", kBusyNote);
  return gflops;
}

double matmul_ceiling_flops(Backend& be, DType compute, std::FILE* log) {
  const fs::path p = ceiling_cache_file();
  const std::string key = ceiling_cache_key(be, compute);
  if (!p.empty()) {
    const nlohmann::json j = read_cache(p);
    if (auto it = j.find(key); it != j.end() && it->is_object() && it->value("gflops", 0.0) > 0) {
      if (it->value("busy", true) && log) fmt::print(log, "{}", kBusyNote);
      return it->value("gflops", 0.0) * 1e9;
    }
  }
  if (log) {
    fmt::print(log, "measuring the {} matmul ceiling once for MFU (about a second; cached in {})\n",
               dtype_name(compute), p.empty() ? "nowhere: HOME is not set" : p.string());
    std::fflush(log);
  }
  return measure_matmul_ceiling(be, compute, log) * 1e9;
}

}  // namespace loom
