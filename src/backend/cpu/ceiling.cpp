// The CPU backend's matmul ceiling for the profiler (Backend::measure_matmul_gflops): what the
// backend's sgemm (oneDNN) reaches on this machine with every thread, the yardstick for the
// achieved FLOP/s of a training step.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"

namespace loom {

double CpuBackend::measure_matmul_gflops() {
  constexpr int n = 2048;
  constexpr int kRuns = 3;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<float> a(elems), b(elems), c(elems);
  for (size_t i = 0; i < elems; ++i) {
    a[i] = static_cast<float>(i % 251) * (1.f / 251.f) - 0.5f;
    b[i] = static_cast<float>(i % 241) * (1.f / 241.f) - 0.5f;
  }
  auto run = [&] {
    cpuk::sgemm_rm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  };
  run();  // warm-up: page faults, BLAS buffers, thread start
  double best = 1e30;
  for (int r = 0; r < kRuns; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * static_cast<double>(n) / best * 1e-9;
}

}  // namespace loom
