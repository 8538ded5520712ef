// The CPU backend's matmul ceiling for the profiler (Backend::measure_matmul_gflops): what the
// backend's GEMM reaches on this machine with every thread, the yardstick for the achieved FLOP/s
// of a training step. float32 and float16 compute multiply as f32 (oneDNN sgemm); bfloat16 uses
// oneDNN's bf16 matmul where the dense kernels do (AVX512-BF16), about twice the f32 rate.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"

namespace loom {

namespace {

// Best of 3 runs of C[n, n] = A·B for 2048² operands of element type T (f32, or bf16 bits), after
// a warm-up run (page faults, BLAS buffers, thread start).
template <class T>
double square_gemm_gflops(T (*value)(size_t)) {
  constexpr int n = 2048;
  constexpr int kRuns = 3;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<T> a(elems), b(elems);
  std::vector<float> c(elems);
  for (size_t i = 0; i < elems; ++i) {
    a[i] = value(i % 251);
    b[i] = value(i % 241);
  }
  // oneDNN's bf16 matmul takes its scratchpad from the caller (gemm_bf16.cpp): a one-off
  // measurement outside any plan, so it has its own.
  std::vector<std::byte> pad;
  if constexpr (std::is_same_v<T, uint16_t>)
    pad.resize(static_cast<size_t>(cpuk::bf16_gemm_scratchpad(false, false, n, n, n, n, n, n, omp_get_max_threads())));
  auto run = [&] { cpuk::gemm_rm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, pad.data()); };
  run();
  double best = 1e30;
  for (int r = 0; r < kRuns; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * static_cast<double>(n) / best * 1e-9;
}

}  // namespace

double CpuBackend::measure_matmul_gflops(DType compute) {
  // Values in [-0.5, 0.5): no subnormals, no overflow.
  if (compute == DType::bf16 && cpuk::bf16_gemm_available())
    return square_gemm_gflops<uint16_t>(
        [](size_t k) { return f32_to_bf16(static_cast<float>(k) * (1.f / 256.f) - 0.5f); });
  return square_gemm_gflops<float>([](size_t k) { return static_cast<float>(k) * (1.f / 256.f) - 0.5f; });
}

}  // namespace loom
