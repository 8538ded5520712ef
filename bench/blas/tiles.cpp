// How many tiles should loom's CPU GEMM use (backend/cpu/dense.cpp, tile_grid)? Times the
// training GEMMs of the benchmark shapes (docs/performance.md) split into T = 4, 8 and 16 tiles
// arranged as tile_grid arranges them (powers of two per side, tiles >= 64 x 128, least packed
// volume), and into the grid loom used before (rows first, tiles >= 128 x 256, up to 16), one
// single-threaded oneDNN sgemm per tile under an OpenMP loop, as loom runs them. Best of 7 calls,
// every variant timed twice, interleaved. GFLOP/s per variant.
//
//   g++ -O2 -fopenmp bench/blas/tiles.cpp -ldnnl -o /tmp/tiles && OMP_NUM_THREADS=2 /tmp/tiles
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

void tiled(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C, int64_t tr,
           int64_t tc) {
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, nt = tr * tc;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < nt; ++t) {
    omp_set_num_threads(1);
    const int64_t i = t / tc, j = t % tc;
    const int64_t m0 = i * M / tr, m1 = (i + 1) * M / tr, n0 = j * N / tc, n1 = (j + 1) * N / tc;
    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m1 - m0, n1 - n0, K, 1.f, ta ? A + m0 : A + m0 * lda, lda,
               tb ? B + n0 * ldb : B + n0, ldb, 0.f, C + m0 * N + n0, N);
  }
}

// The grid loom used before: rows first, tiles >= 128 x 256 (smaller until there are 4), <= 16.
void old_grid(int64_t M, int64_t N, int64_t& tr, int64_t& tc) {
  tr = tc = 1;
  for (int64_t r = 128, c = 256; tr * tc < 4 && r >= 32; r /= 2, c /= 2) {
    tr = std::clamp<int64_t>(M / r, 1, 16);
    tc = std::clamp<int64_t>(N / c, 1, 16 / tr);
  }
}

// tile_grid with tile_count() = T.
void new_grid(int64_t M, int64_t N, int64_t T, int64_t& tr, int64_t& tc) {
  tr = tc = 1;
  for (int64_t t = T; t > 1; t /= 2) {
    int64_t best = -1;
    for (int64_t r = 1; r <= t; r *= 2) {
      const int64_t c = t / r;
      if ((r > 1 && M / r < 64) || (c > 1 && N / c < 128)) continue;
      if (best < 0 || c * M + r * N < best) {
        best = c * M + r * N;
        tr = r;
        tc = c;
      }
    }
    if (best >= 0) return;
  }
}

}  // namespace

int main() {
  struct Shape {
    const char* name;
    bool ta, tb;
    int64_t M, N, K;
  };
  const Shape shapes[] = {
      {"(c) dense mlp_in       NN 2048x1536x384", false, false, 2048, 1536, 384},
      {"(c) grad_input mlp_in  NT 2048x384x1536", false, true, 2048, 384, 1536},
      {"(c) grad_weight mlp_in TN 384x1536x2048", true, false, 384, 1536, 2048},
      {"(c) grad_input mlp_out NT 2048x1536x384", false, true, 2048, 1536, 384},
      {"(a) dense qkv          NN 256x2304x768", false, false, 256, 2304, 768},
      {"(a) grad_input lm head NN 256x768x50257", false, false, 256, 768, 50257},
      {"(a) dense lm head      NT 256x50257x768", false, true, 256, 50257, 768},
      {"(a) grad_weight mlp_in TN 768x3072x256", true, false, 768, 3072, 256},
      {"(d) dense mlp_in       NN 1024x1024x256", false, false, 1024, 1024, 256},
      {"(d) grad_input mlp_in  NT 1024x256x1024", false, true, 1024, 256, 1024},
      {"(b) dense qkv          NN 768x384x128", false, false, 768, 384, 128},
      {"(b) grad_weight qkv    TN 128x384x768", true, false, 128, 384, 768},
      {"(b) grad_input mlp_out NT 768x512x128", false, true, 768, 512, 128},
  };
  std::printf("threads %d; GFLOP/s, two rounds each\n", omp_get_max_threads());
  for (const Shape& s : shapes) {
    std::vector<float> A(s.M * s.K, 0.5f), B(s.K * s.N, 0.25f), C(s.M * s.N);
    std::printf("%s:", s.name);
    for (int round = 0; round < 2; ++round)
      for (int v = 0; v < 4; ++v) {
        int64_t tr, tc;
        if (v == 0)
          old_grid(s.M, s.N, tr, tc);
        else
          new_grid(s.M, s.N, int64_t{2} << v, tr, tc);  // 4, 8, 16
        double best = 1e9;
        for (int r = 0; r < 7; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          tiled(s.ta, s.tb, s.M, s.N, s.K, A.data(), B.data(), C.data(), tr, tc);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf("  %s%ldx%ld %.0f", v == 0 ? "old " : (v == 1 ? "T4 " : (v == 2 ? "T8 " : "T16 ")), tr, tc,
                    2.0 * s.M * s.N * s.K / best / 1e9);
      }
    std::printf("\n");
  }
}
