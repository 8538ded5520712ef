// Do loom's bfloat16 GEMM tiles reach oneDNN's own matmul rate (issue 28, point 2)? For each
// product layout of a training step at bench shape (c) (6 layers, C 384, batch 8 × 256: forward
// NN, input gradient NT, weight gradient TN), times
//   onednn  oneDNN 3.x's bf16 matmul primitive on the whole product with every thread (dense
//           operands, its own threading): the yardstick;
//   loom    the product as backend/cpu/dense.cpp runs it: a grid of 4 tiles, one single-threaded
//           cpuk::gemm_rm call per tile under an OpenMP loop. NN and NT tile C by whole rows (dense
//           operands, dense.cpp's grid on AMX); TN tiles it the way that packs less (by rows when M
//           > N, as dense.cpp's tile_grid), so each call gets a strided block of A or of B and C,
//           which gemm_bf16.cpp copies dense on AMX.
// The GEMM calls only: the dense ops' operand conversions and epilogues are not in it (`loom
// profile` times whole ops). Best of 7 after a warm-up; the two variants alternate per shape.
// Prints the CPU's oneDNN ISA and one line per product.
//
//   ninja -C build loom_lib
//   g++ -O2 -fopenmp -std=c++20 -Isrc -I.deps/onednn/include bench/blas/amx_layouts.cpp
//     build/libloom_lib.a -L.deps/onednn/lib -Wl,-rpath,$PWD/.deps/onednn/lib -ldnnl -o /tmp/amx_layouts
//   /tmp/amx_layouts        # ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: the AVX512-BF16 kernels on the same CPU
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_util.h"

namespace {

using loom::f32_to_bf16;
namespace cpuk = loom::cpuk;

// A 64-byte aligned scratchpad (gemm_rm's contract).
struct Pad {
  std::unique_ptr<std::byte, decltype(&std::free)> p{nullptr, &std::free};
  explicit Pad(int64_t bytes)
      : p(static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>((bytes + 64) / 64 * 64))), &std::free) {}
  std::byte* get() const { return p.get(); }
};

template <class F>
double best_s(F f) {
  f();
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct Product {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};

}  // namespace

int main() {
  // (c): tokens 2048, C 384, MLP 1536, qkv 1152.
  const Product products[] = {
      {"forward qkv", false, false, 2048, 1152, 384},      {"forward mlp_in", false, false, 2048, 1536, 384},
      {"forward mlp_out", false, false, 2048, 384, 1536},  {"grad_input mlp_in", false, true, 2048, 384, 1536},
      {"grad_input mlp_out", false, true, 2048, 1536, 384}, {"grad_weight qkv", true, false, 384, 1152, 2048},
      {"grad_weight mlp_in", true, false, 384, 1536, 2048}, {"grad_weight mlp_out", true, false, 1536, 384, 2048}};
  constexpr int kTiles = 4;
  const int threads = omp_get_max_threads();
  if (!cpuk::bf16_gemm_available()) {
    std::printf("no bf16 matmul on this CPU (oneDNN ISA %s)\n", cpuk::dnnl_isa_name());
    return 0;
  }
  std::printf("oneDNN %s, ISA %s, %d threads, kernel at 1024^3: %s\n", cpuk::dnnl_version_name().c_str(),
              cpuk::dnnl_isa_name(), threads, cpuk::bf16_gemm_impl(1024, threads).c_str());
  std::printf("%-20s %5s %5s %5s %12s %12s %8s\n", "product", "M", "N", "K", "onednn GF/s", "loom GF/s", "ratio");
  for (const Product& p : products) {
    std::vector<uint16_t> a(static_cast<size_t>(p.M * p.K)), b(static_cast<size_t>(p.K * p.N));
    for (size_t i = 0; i < a.size(); ++i) a[i] = f32_to_bf16(static_cast<float>(i % 251) / 256.f - 0.5f);
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(static_cast<float>(i % 241) / 256.f - 0.5f);
    std::vector<float> c(static_cast<size_t>(p.M * p.N));
    const int64_t lda = p.ta ? p.M : p.K, ldb = p.tb ? p.K : p.N;
    const Pad whole_pad(cpuk::bf16_gemm_scratchpad(p.ta, p.tb, p.M, p.N, p.K, lda, ldb, p.N, threads));
    const auto whole = [&] {
      cpuk::gemm_rm(p.ta, p.tb, p.M, p.N, p.K, a.data(), lda, b.data(), ldb, c.data(), p.N, whole_pad.get());
    };
    // Row tiles (op(A) = A, or TN with M > N) or column tiles, as dense.cpp arranges them on AMX.
    const bool by_rows = !p.ta || p.M > p.N;
    const int64_t rows = by_rows ? p.M / kTiles : p.M, cols = by_rows ? p.N : p.N / kTiles;
    const int64_t tile_pad = cpuk::bf16_gemm_scratchpad(p.ta, p.tb, rows, cols, p.K, lda, ldb, p.N, 1);
    std::vector<Pad> pads;
    for (int t = 0; t < threads; ++t) pads.emplace_back(tile_pad);
    const auto tiled = [&] {
#pragma omp parallel for schedule(dynamic, 1)
      for (int t = 0; t < kTiles; ++t) {
        omp_set_num_threads(1);
        const int64_t m0 = by_rows ? t * rows : 0, n0 = by_rows ? 0 : t * cols;
        const uint16_t* at = p.ta ? a.data() + m0 : a.data() + m0 * lda;
        const uint16_t* bt = p.tb ? b.data() + n0 * ldb : b.data() + n0;
        cpuk::gemm_rm(p.ta, p.tb, rows, cols, p.K, at, lda, bt, ldb, c.data() + m0 * p.N + n0, p.N,
                      pads[static_cast<size_t>(omp_get_thread_num())].get());
      }
    };
    const double s_whole = best_s(whole), s_tiled = best_s(tiled);
    const double gflop = 2.0 * static_cast<double>(p.M * p.N) * static_cast<double>(p.K) * 1e-9;
    std::printf("%-20s %5ld %5ld %5ld %12.1f %12.1f %8.2f\n", p.name, static_cast<long>(p.M), static_cast<long>(p.N),
                static_cast<long>(p.K), gflop / s_whole, gflop / s_tiled, s_whole / s_tiled);
  }
}
