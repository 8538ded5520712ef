#include "backend/cpu/simd/gemv.h"

#include <bit>
#include <cstring>

#include "backend/cpu/simd/product.h"

namespace loom::simd {

namespace {

// Element access for f32 and bfloat16 bits: one value, or kW consecutive values, as f32.
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }
inline Vec load(const float* p) { return load_vec(p); }
inline Vec load(const uint16_t* p) {
  using Half = uint16_t __attribute__((vector_size(kW * sizeof(uint16_t))));
  using Word = uint32_t __attribute__((vector_size(kW * sizeof(uint32_t))));
  Half h;
  std::memcpy(&h, p, sizeof h);
  const Word w = __builtin_convertvector(h, Word) << 16;
  Vec v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

// c[n] = Σ_k a[k]·B[k, n]: B's rows stream in order (k outer), c stays in L1 between them. kRows
// rows per pass over c, each element's chain still k = 0, 1, 2, … in order.
template <class T>
void gemv_n(int64_t N, int64_t K, const T* a, const T* B, int64_t ldb, float* c) {
  constexpr int kRows = 8;  // rows per pass over c: fewer would read and write c more often
  std::memset(c, 0, static_cast<size_t>(N) * sizeof(float));
  const int64_t nv = N / kW * kW;
  int64_t k = 0;
  for (; k + kRows <= K; k += kRows) {
    float ak[kRows];
    const T* bk[kRows];
    for (int r = 0; r < kRows; ++r) {
      ak[r] = widen(a[k + r]);
      bk[r] = B + (k + r) * ldb;
    }
    const bool ahead = k + 3 * kRows <= K;
    for (int64_t n = 0; n < nv; n += kW) {
      // The same columns of the rows two passes ahead: the hardware prefetchers lose track of a
      // column tile's short, strided row segments (dense.cpp's column tiles); on K chunks of whole
      // rows it is harmless.
      if (ahead)
        for (int r = 0; r < kRows; ++r) __builtin_prefetch(bk[r] + 2 * kRows * ldb + n);
      Vec v = load_vec(c + n);
      for (int r = 0; r < kRows; ++r) v = v + ak[r] * load(bk[r] + n);
      store_vec(c + n, v);
    }
    for (int64_t n = nv; n < N; ++n) {
      float v = c[n];
      for (int r = 0; r < kRows; ++r) v = v + ak[r] * widen(bk[r][n]);
      c[n] = v;
    }
  }
  for (; k < K; ++k) {
    const float ak = widen(a[k]);
    const T* bk = B + k * ldb;
    for (int64_t n = 0; n < nv; n += kW) store_vec(c + n, load_vec(c + n) + ak * load(bk + n));
    for (int64_t n = nv; n < N; ++n) c[n] = c[n] + ak * widen(bk[n]);
  }
}

// The kW lanes of v summed pairwise (lane l + h onto lane l, h = kW/2, …, 1): a fixed order.
inline float fold(Vec v) {
  float x[kW];
  std::memcpy(x, &v, sizeof x);
  for (int h = kW / 2; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) x[l] += x[l + h];
  return x[0];
}

// c[n] = Σ_k a[k]·B[n, k]: one row of B at a time, so B is read as one contiguous stream (four
// rows side by side, each with software prefetch, streamed the tied head at 25 GB/s where this
// reaches 34 on a 2-core Zen 4). Four vector chains take turns over blocks of kW elements of k
// (chain j the blocks j, j + 4, …), folded as ((s0 + s1) + (s2 + s3)), then the K mod kW tail.
template <class T>
void gemv_t(int64_t N, int64_t K, const T* a, const T* B, int64_t ldb, float* c) {
  const int64_t kv = K / kW * kW, k4 = K / (4 * kW) * (4 * kW);
  for (int64_t n = 0; n < N; ++n) {
    const T* r = B + n * ldb;
    Vec s[4] = {};
    int64_t k = 0;
    for (; k < k4; k += 4 * kW)
      for (int j = 0; j < 4; ++j) s[j] = s[j] + load(a + k + j * kW) * load(r + k + j * kW);
    for (int j = 0; k < kv; k += kW, ++j) s[j] = s[j] + load(a + k) * load(r + k);
    float v = fold((s[0] + s[1]) + (s[2] + s[3]));
    for (; k < K; ++k) v = v + widen(a[k]) * widen(r[k]);
    c[n] = v;
  }
}

template <class T>
void gemv_any(bool tb, int64_t N, int64_t K, const T* a, const T* B, int64_t ldb, float* c) {
  if (tb)
    gemv_t(N, K, a, B, ldb, c);
  else
    gemv_n(N, K, a, B, ldb, c);
}

}  // namespace

void gemv(bool tb, int64_t N, int64_t K, const float* a, const float* B, int64_t ldb, float* c) {
  gemv_any(tb, N, K, a, B, ldb, c);
}
void gemv(bool tb, int64_t N, int64_t K, const uint16_t* a, const uint16_t* B, int64_t ldb, float* c) {
  gemv_any(tb, N, K, a, B, ldb, c);
}

}  // namespace loom::simd
