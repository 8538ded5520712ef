// The CPU backend's matmul ceiling for the profiler (Backend::measure_matmul_gflops): the best
// the machine's GEMMs reach with every thread, the yardstick for the achieved FLOP/s of a training
// step. float32 and float16 compute multiply as f32 (oneDNN's sgemm: on AMX hosts as fast as its
// f32 matmul primitive, which has no faster kernel for f32); bfloat16 uses oneDNN's bf16 matmul
// primitive where the dense kernels do (AVX512-BF16: vdpbf16ps, about twice the f32 rate; AMX:
// tdpbf16ps, about twice that again). matmul_kernel names the kernel and its instruction set.
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

// The square sizes measured; the ceiling is the best of them. The tile kernels of AMX outrun
// memory at 2048 (on a 2-core Sapphire Rapids slice oneDNN's bf16 matmul ran 1.11 TFLOP/s at 2048³
// and 1.47 at 1024³), so the smaller size keeps the ceiling an upper bound for a step's products.
constexpr int kCeilingSizes[] = {1024, 2048};

// Best of 3 runs of C[n, n] = A·B for n² operands of element type T (f32, or bf16 bits), after
// a warm-up run (page faults, BLAS buffers, thread start).
template <class T>
double square_gemm_gflops(int n, T (*value)(size_t)) {
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
  const bool bf16 = compute == DType::bf16 && cpuk::bf16_gemm_available();
  double best = 0;
  for (int n : kCeilingSizes) {
    const double gflops =
        bf16 ? square_gemm_gflops<uint16_t>(
                   n, [](size_t k) { return f32_to_bf16(static_cast<float>(k) * (1.f / 256.f) - 0.5f); })
             : square_gemm_gflops<float>(n, [](size_t k) { return static_cast<float>(k) * (1.f / 256.f) - 0.5f; });
    best = std::max(best, gflops);
  }
  return best;
}

std::string CpuBackend::matmul_kernel(DType compute) const {
  const std::string dnnl = "oneDNN " + cpuk::dnnl_version_name();
  if (compute == DType::bf16 && cpuk::bf16_gemm_available())
    return dnnl + " bf16 matmul " + cpuk::bf16_gemm_impl(kCeilingSizes[0], omp_get_max_threads()) + ", ISA " +
           cpuk::dnnl_isa_name();
  return dnnl + " sgemm, ISA " + cpuk::dnnl_isa_name();
}

}  // namespace loom
