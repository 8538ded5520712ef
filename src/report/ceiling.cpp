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

void cache_ceiling(const Backend& be, DType compute, double gflops) {
  const fs::path p = ceiling_cache_file();
  if (p.empty() || gflops <= 0) return;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  nlohmann::json j = read_cache(p);
  // A ceiling is an upper bound: a lower measurement means the machine was busy (or throttled).
  const std::string key = ceiling_cache_key(be, compute);
  if (auto it = j.find(key); it != j.end() && it->is_number() && it->get<double>() >= gflops) return;
  j[key] = gflops;
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
  return fmt::format("{} {} {} threads, {}{}", be.name(), dtype_name(compute), num_threads(), cpu_model(),
                     isa && *isa ? fmt::format(", ONEDNN_MAX_CPU_ISA={}", isa) : "");
}

double measure_matmul_ceiling(Backend& be, DType compute, std::FILE* log) {
  LoadSampler load;
  load.start();
  const double gflops = be.measure_matmul_gflops(compute);
  if (load.stop().contended()) {
    if (log)
      fmt::print(log, "the machine is busy: the ceiling measured low ({:.1f} GFLOP/s) and is not cached\n", gflops);
  } else {
    cache_ceiling(be, compute, gflops);
  }
  return gflops;
}

double matmul_ceiling_flops(Backend& be, DType compute, std::FILE* log) {
  const fs::path p = ceiling_cache_file();
  const std::string key = ceiling_cache_key(be, compute);
  if (!p.empty()) {
    const nlohmann::json j = read_cache(p);
    if (auto it = j.find(key); it != j.end() && it->is_number() && it->get<double>() > 0)
      return it->get<double>() * 1e9;
  }
  if (log) {
    fmt::print(log, "measuring the {} matmul ceiling once for MFU (about a second; cached in {})\n",
               dtype_name(compute), p.empty() ? "nowhere: HOME is not set" : p.string());
    std::fflush(log);
  }
  return measure_matmul_ceiling(be, compute, log) * 1e9;
}

}  // namespace loom
