// Register-blocked products of small f32 matrices, written with GCC vector types (16 floats per
// vector on AVX-512, 8 on AVX, 4 otherwise), for the block products of attention
// (backend/cpu/attention.cpp), where a dnnl_sgemm call spends about as long in its own overhead as
// in arithmetic (docs/performance.md has the measurements behind the bounds attention uses).
//
// product() keeps an R-row by NV-vector tile of C in registers and, per k, broadcasts R elements of
// op(A) and loads NV vectors of B's row k; every element of C sums over k in order, so the result
// depends only on the operands, never on threads. It can leave out the terms of a triangular
// (causal) product that are exact zeros (Skip).
#pragma once
#include <cstdint>
#include <cstring>

namespace loom::simd {

// Floats per vector, and the most accumulator vectors a tile keeps (out of AVX-512's 32 registers,
// AVX's 16: a tile also holds NV vectors of B and a broadcast, and 12 on AVX2 would spill).
// A build without AVX (LOOM_NATIVE=OFF on plain x86-64) gets 4-float vectors, so that a Vec still
// fits one register (in_register() needs that).
#if defined(__AVX512F__)
inline constexpr int kW = 16, kAccs = 16;
#elif defined(__AVX__)
inline constexpr int kW = 8, kAccs = 8;
#else
inline constexpr int kW = 4, kAccs = 8;
#endif
using Vec = float __attribute__((vector_size(kW * sizeof(float))));

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }

// Row widths of a triangular product are rounded up to whole 16-float vectors (an AVX-512 vector,
// whatever kW is): the granule of Skip::cols.
inline constexpr int64_t kLanes = 16;
inline int64_t whole_vectors(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Terms of a triangular product that are exact zeros, which product() leaves out. A band is R rows
// [r, r + R) of C; with off the row offset of C's first row in the triangle, the band's last row
// is row off + r + R − 1 of it.
enum class Skip {
  none,
  // C is lower triangular by columns: only the band's row widths, [0, whole_vectors(off + r + R)).
  cols,
  // op(A) is lower triangular: only k < off + r + R.
  k_hi,
  // op(A)'s rows start at the diagonal (C's row j sums over k ≥ j − off): only k ≥ r − off.
  k_lo,
};

// One block product C[M, N] = op(A)·B, plus C when acc; op(A) is A, or Aᵀ when ta (A stored
// [K, M]); row-major with leading dimensions lda, ldb, ldc, as sgemm takes them. B's and C's rows
// must have room for N rounded up to whole vectors (product() computes those columns too).
struct Prod {
  bool ta;
  int64_t M, N, K;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  bool acc;
  Skip skip;
  int64_t off;
  // B's transpose, [N, K], for a caller that sends the product to sgemm instead (which reads op(B)
  // = Bᵀ in place); product() reads B.
  const float* Bt = nullptr;
  int64_t ldbt = 0;
};

void product(const Prod& p);

// One stage of an in-register transpose of kW rows: rows a = i and b = i + s (i & s == 0) swap
// their off-diagonal s×s blocks, a'[j] = b[j − s] and b'[j − s] = a[j] for the lanes j with j & s.
// The stages s = kW/2, …, 2, 1 together transpose (each swaps row bit s with lane bit s).
template <int s>
void swap_blocks(Vec& a, Vec& b) {
  using Lanes = int32_t __attribute__((vector_size(sizeof(Vec))));
  Lanes j;
  for (int l = 0; l < kW; ++l) j[l] = l;
  const Lanes hi = (j & s) != 0;
  const Vec na = __builtin_shuffle(a, b, hi ? j + (kW - s) : j);  // indices ≥ kW pick from b
  b = __builtin_shuffle(a, b, hi ? j + kW : j + s);
  a = na;
}
template <int s>
void transpose_stages(Vec* r) {
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i)
    if ((i & s) == 0) swap_blocks<s>(r[i], r[i + s]);
  if constexpr (s > 1) transpose_stages<s / 2>(r);
}

// dst[e][t] = src[t][e] for a kW × kW block: rows of src at stride lds, rows of dst at stride ldd,
// through registers.
inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  Vec r[kW];
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i) r[i] = load_vec(src + i * lds);
  transpose_stages<kW / 2>(r);
#pragma GCC unroll 16
  for (int i = 0; i < kW; ++i) store_vec(dst + i * ldd, r[i]);
}

}  // namespace loom::simd
