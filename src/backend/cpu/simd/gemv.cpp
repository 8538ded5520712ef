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

// c[n] = Σ_k a[k]·B[k, n]: B's rows stream in order (k outer), c stays in L1 between them. Four
// rows per pass over c, each element's chain still k = 0, 1, 2, … in order.
template <class T>
void gemv_n(int64_t N, int64_t K, const T* a, const T* B, int64_t ldb, float* c) {
  std::memset(c, 0, static_cast<size_t>(N) * sizeof(float));
  const int64_t nv = N / kW * kW;
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const float a0 = widen(a[k]), a1 = widen(a[k + 1]), a2 = widen(a[k + 2]), a3 = widen(a[k + 3]);
    const T* b0 = B + k * ldb;
    const T* b1 = b0 + ldb;
    const T* b2 = b1 + ldb;
    const T* b3 = b2 + ldb;
    for (int64_t n = 0; n < nv; n += kW) {
      // The same columns of rows k + 8 … k + 11, two passes over c ahead: the hardware prefetchers
      // lose track of a column tile's short, strided row segments (bf16 GPT-2 decode 43 → 55 tok/s).
      if (k + 12 <= K)
        for (int r = 8; r < 12; ++r) __builtin_prefetch(b0 + r * ldb + n);
      Vec v = load_vec(c + n);
      v = v + a0 * load(b0 + n);
      v = v + a1 * load(b1 + n);
      v = v + a2 * load(b2 + n);
      v = v + a3 * load(b3 + n);
      store_vec(c + n, v);
    }
    for (int64_t n = nv; n < N; ++n) {
      float v = c[n];
      v = v + a0 * widen(b0[n]);
      v = v + a1 * widen(b1[n]);
      v = v + a2 * widen(b2[n]);
      v = v + a3 * widen(b3[n]);
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

// c[n] = Σ_k a[k]·B[n, k]: four rows of B at a time, each a dot product of kW lane chains.
template <class T>
void gemv_t(int64_t N, int64_t K, const T* a, const T* B, int64_t ldb, float* c) {
  const int64_t kv = K / kW * kW;
  const auto tail = [&](const T* row, float s) {
    for (int64_t k = kv; k < K; ++k) s = s + widen(a[k]) * widen(row[k]);
    return s;
  };
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) {
    const T* r0 = B + n * ldb;
    const T* r1 = r0 + ldb;
    const T* r2 = r1 + ldb;
    const T* r3 = r2 + ldb;
    Vec s0{}, s1{}, s2{}, s3{};
    for (int64_t k = 0; k < kv; k += kW) {
      for (int r = 8; r < 12 && n + r < N; ++r) __builtin_prefetch(r0 + r * ldb + k);  // two groups ahead
      const Vec av = load(a + k);
      s0 = s0 + av * load(r0 + k);
      s1 = s1 + av * load(r1 + k);
      s2 = s2 + av * load(r2 + k);
      s3 = s3 + av * load(r3 + k);
    }
    c[n] = tail(r0, fold(s0));
    c[n + 1] = tail(r1, fold(s1));
    c[n + 2] = tail(r2, fold(s2));
    c[n + 3] = tail(r3, fold(s3));
  }
  for (; n < N; ++n) {
    const T* r = B + n * ldb;
    Vec s{};
    for (int64_t k = 0; k < kv; k += kW) s = s + load(a + k) * load(r + k);
    c[n] = tail(r, fold(s));
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
