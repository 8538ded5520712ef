#include "backend/cpu/simd/product.h"

#include <algorithm>

namespace loom::simd {

namespace {

// v, held in a register. Without it GCC folds the loads of B's vectors into every FMA that uses
// them, reloading each once per row of the tile: 20 loads per 16 FMAs in a 4×4 tile instead of 8,
// which would make product() load-bound (and slower than sgemm at attention's shapes).
// The empty asm changes no value.
Vec in_register(Vec v) {
#if defined(__x86_64__)
  asm("" : "+v"(v));
#endif
  return v;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// C's rows [r, r + R) by vectors [v0, v0 + NV) = their value (when acc) + Σ_{k ∈ [k0, k1)}
// op(A)[r][k]·B[k]: the tile lives in registers; per k, NV vector loads of B's row and R
// broadcasts of op(A)'s column. Each element sums over k in order.
template <int R, int NV>
void tile(const Prod& p, int64_t r, int64_t v0, int64_t k0, int64_t k1) {
  const int64_t ars = p.ta ? 1 : p.lda, aks = p.ta ? p.lda : 1;
  const float* A = p.A + r * ars;
  const float* B = p.B + v0 * kW;
  float* C = p.C + r * p.ldc + v0 * kW;
  Vec c[R][NV];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[i][v] = p.acc ? load_vec(C + i * p.ldc + v * kW) : Vec{};
  for (int64_t k = k0; k < k1; ++k) {
    Vec b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = in_register(load_vec(B + k * p.ldb + v * kW));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const float a = A[i * ars + k * aks];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[i][v] += a * b[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store_vec(C + i * p.ldc + v * kW, c[i][v]);
}

// The band's vectors [v0, nv): tiles of NV vectors, then the rest with fewer.
template <int R, int NV>
void span(const Prod& p, int64_t r, int64_t v0, int64_t nv, int64_t k0, int64_t k1) {
  for (; v0 + NV <= nv; v0 += NV) tile<R, NV>(p, r, v0, k0, k1);
  if constexpr (NV > 1)
    if (v0 < nv) span<R, NV - 1>(p, r, v0, nv, k0, k1);
}

// Band [r, r + R) of C, less what p.skip leaves out.
template <int R, int NV>
void band(const Prod& p, int64_t r) {
  int64_t k0 = 0, k1 = p.K, nv = ceil_div(p.N, kW);
  const int64_t keys = p.off + r + R;
  if (p.skip == Skip::cols) nv = std::min(nv, whole_vectors(keys) / kW);
  if (p.skip == Skip::k_hi) k1 = std::min(k1, keys);
  if (p.skip == Skip::k_lo) k0 = std::max<int64_t>(0, r - p.off);
  span<R, NV>(p, r, 0, nv, k0, k1);
}

// Bands of as many rows as the accumulator registers allow with NV vectors per row (at most 8:
// each row costs a broadcast per k), then single rows.
template <int NV>
void bands(const Prod& p) {
  constexpr int R = std::min(8, kAccs / NV);
  int64_t r = 0;
  for (; r + R <= p.M; r += R) band<R, NV>(p, r);
  for (; r < p.M; ++r) band<1, NV>(p, r);
}

}  // namespace

// Over C's columns up to N rounded up to whole vectors.
void product(const Prod& p) {
  switch (std::min<int64_t>(ceil_div(p.N, kW), 4)) {
    case 1:
      return bands<1>(p);
    case 2:
      return bands<2>(p);
    case 3:
      return bands<3>(p);
    default:
      return bands<4>(p);
  }
}

}  // namespace loom::simd
