// Is oneDNN's bf16 matmul worth using for loom's bfloat16 GEMMs? Times loom's own two GEMM entry
// points (backend/cpu/cpu_util.h: cpuk::gemm_rm on bf16 bits, the cached oneDNN matmul primitive
// of gemm_bf16.cpp, and on f32, dnnl_sgemm) on one thread, as loom's GEMM tiles run them, for the
// layouts the dense ops use (NN forward, NT input gradient, TN weight gradient) at the
// tutorial-shape (d) sizes and the attention block sizes. Best of 5 rounds of 10 calls each.
//
//   ninja -C build
//   g++ -O2 -fopenmp -std=c++20 -Isrc -I.deps/onednn/include bench/blas/bf16.cpp build/libloom_lib.a
//     -L.deps/onednn/lib -Wl,-rpath,$PWD/.deps/onednn/lib -ldnnl -o /tmp/bf16 && /tmp/bf16
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cpu/cpu_util.h"

namespace {

template <class F>
double best_us(F f) {
  for (int i = 0; i < 3; ++i) f();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) f();
    best =
        std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 10);
  }
  return best;
}

}  // namespace

int main() {
  using loom::cpuk::gemm_rm;
  omp_set_num_threads(1);
  std::printf("effective oneDNN ISA 0x%x, bf16 matmul %s\n", static_cast<unsigned>(dnnl_get_effective_cpu_isa()),
              loom::cpuk::bf16_gemm_available() ? "available" : "NOT available (the timings below are meaningless)");
  struct Case {
    int64_t M, N, K;
    bool ta, tb;
  };
  const Case cases[] = {{512, 1024, 256, false, false}, {512, 1024, 256, false, true},  {256, 1024, 512, true, false},
                        {1024, 256, 1024, true, false}, {1024, 256, 1024, false, true}, {512, 2048, 256, false, false},
                        {64, 64, 32, false, true},      {64, 32, 64, false, false},     {64, 32, 64, true, false}};
  for (const Case& c : cases) {
    const int64_t M = c.M, N = c.N, K = c.K, lda = c.ta ? M : K, ldb = c.tb ? K : N;
    const std::vector<uint16_t> A(M * K, 0x3f80), B(K * N, 0x3f00);  // bf16 1.0 and 0.5
    const std::vector<float> Af(M * K, 1.f), Bf(K * N, 0.5f);
    std::vector<float> C(M * N);
    const double t_bf16 = best_us([&] { gemm_rm(c.ta, c.tb, M, N, K, A.data(), lda, B.data(), ldb, C.data(), N); });
    const double t_f32 = best_us([&] { gemm_rm(c.ta, c.tb, M, N, K, Af.data(), lda, Bf.data(), ldb, C.data(), N); });
    const double flop = 2.0 * M * N * K;
    std::printf("%c%c %5ldx%5ldx%5ld  bf16 matmul %8.1f us %6.1f GFLOP/s  sgemm %8.1f us %6.1f GFLOP/s  x%.2f\n",
                c.ta ? 'T' : 'N', c.tb ? 'T' : 'N', static_cast<long>(M), static_cast<long>(N), static_cast<long>(K),
                t_bf16, flop / t_bf16 * 1e-3, t_f32, flop / t_f32 * 1e-3, t_f32 / t_bf16);
  }
}
