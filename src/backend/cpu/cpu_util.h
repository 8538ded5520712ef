// Helpers shared by the CPU kernels (header-only, internal to backend/cpu/): block conversions
// between storage dtypes and f32, rounding to a compute dtype, fixed-order sums, parallel
// thresholds, and operand conversions into workspace spans (workspace.h).
//
// Determinism: every reduction here has a summation order that depends only on the length of
// what it sums, never on the thread count or the schedule.
#pragma once
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include <oneapi/dnnl/dnnl.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "backend/backend.h"
#include "backend/cpu/workspace.h"
#include "core/dtype.h"
#include "core/error.h"

namespace loom::cpuk {

// Row-major C[M, N] = alpha·op(A)·op(B) + beta·C with op = transpose when ta/tb; A is [M, K] (or
// [K, M] when ta), B is [K, N] (or [N, K] when tb). oneDNN's sgemm (docs/blas.md: the fastest of
// OpenBLAS, BLIS and oneDNN at our shapes, and it picks AVX-512 kernels at run time). It uses the
// OpenMP thread count in effect: inside our own parallel loops that is 1.
inline void sgemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  LOOM_ASSERT(st == dnnl_success, "dnnl_sgemm rejected its arguments");
}

// Bytes sgemm_rm mallocs for itself in one call of this shape and these leading dimensions made
// single-threaded, as every call of our kernels is (sgemm_bytes.cpp: oneDNN 3.2's packing buffers,
// or the no-copy kernel's workspace; exact with its AVX-512 kernels, an upper bound below them). It
// takes no user memory and frees them before returning, so the plan holds them as a host row
// (Backend::library_bytes): each kernel's layout function tells its Bump the largest call of each
// of its parallel loops (Bump::library).
int64_t sgemm_call_bytes(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc);

// The same product with alpha = 1, beta = 0, for the tile loops that take either element type.
// `pad` is unused: sgemm has no user scratchpad (its own buffers: sgemm_call_bytes).
inline void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, float* C, int64_t ldc, std::byte* /*pad*/) {
  sgemm_rm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
}

// The processor count a row vector's grid plans for (dense.cpp tile_grid; omp_get_num_procs(),
// read once). Tests set it to reach the grids of larger machines, and set it back.
int64_t row_vector_processors();
void set_row_vector_processors(int64_t n);

// Whether this CPU (as capped by ONEDNN_MAX_CPU_ISA) has AVX512-BF16, which gemm_rm on bfloat16
// operands needs (gemm_bf16.cpp). Without it bf16 products go through sgemm on widened copies.
bool bf16_gemm_available();
// Whether it runs on AMX tiles there (ONEDNN_MAX_CPU_ISA permitting): dense.cpp then prefers tiles
// whose operands are dense (gemm_bf16.cpp copies strided ones).
bool bf16_gemm_amx();
// The instruction set oneDNN runs its kernels with on this CPU, as capped by ONEDNN_MAX_CPU_ISA
// ("avx512_core_amx", "avx512_core_bf16", "avx512_core", "avx2", ...), and its version ("3.2.0").
const char* dnnl_isa_name();
std::string dnnl_version_name();
// The implementation oneDNN's bf16 matmul picks for C[n, n] = A·B (dense operands) with `threads`
// OpenMP threads, as its verbose mode names it (e.g. "brg:avx512_core_amx"). Only when
// bf16_gemm_available().
std::string bf16_gemm_impl(int64_t n, int threads);
// Row-major f32 C[M, N] = op(A)·op(B) for bfloat16 A and B (raw bits, layouts as sgemm_rm), fp32
// accumulation of the exact bf16 products, like sgemm on the widened values except for summation
// order and that vdpbf16ps treats subnormal inputs and results as zero. Only when
// bf16_gemm_available(); runs with the OpenMP thread count in effect (1 inside our tile loops).
// `pad` is oneDNN's scratchpad for the call: bf16_gemm_scratchpad(...) bytes for this shape and
// thread count, 64-byte aligned (nothing when that is 0).
void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
             int64_t ldb, float* C, int64_t ldc, std::byte* pad);
// Bytes of scratchpad gemm_rm on bfloat16 operands needs for a call of this shape and layout made
// with `threads` OpenMP threads in effect.
int64_t bf16_gemm_scratchpad(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                             int threads);

// Below this many elements an elementwise kernel runs on the calling thread: waking the pool
// costs more than the work.
inline constexpr int64_t kParallelMin = int64_t{1} << 15;
// Elements per block in the elementwise kernels (the f32 staging buffer lives on the stack).
inline constexpr int64_t kBlock = 2048;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- conversions -------------------------------------------------------------------------

// dst[k] = float(src[off + k]) for k in [0, n); src holds elements of type dt. Exact for the
// float dtypes (f16 widening uses F16C, which the dtype contract mirrors bit for bit).
inline void load_f32(const void* src, DType dt, int64_t off, float* dst, int64_t n) {
  switch (dt) {
    case DType::f32:
      std::memcpy(dst, static_cast<const float*>(src) + off, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16: {
      const auto* s = static_cast<const uint16_t*>(src) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(s[i]) << 16);
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const uint16_t*>(src) + off;
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::i32:
      convert(static_cast<const int32_t*>(src) + off, DType::i32, dst, DType::f32, static_cast<size_t>(n));
      return;
    case DType::i8:
    case DType::nf4:
      break;  // no elements: core/quant.h
  }
  LOOM_ASSERT(false, "invalid dtype");
}

// dst[off + k] = round_dt(src[k]) for k in [0, n) (round to nearest even; the dtype.h contract).
inline void store_f32(const float* src, void* dst, DType dt, int64_t off, int64_t n) {
  switch (dt) {
    case DType::f32:
      std::memcpy(static_cast<float*>(dst) + off, src, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst) + off;
      // f32_to_bf16, written branch-free so it vectorises.
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(src[i]);
        const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const uint32_t nan = (u >> 16) | 0x0040u;
        d[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
      }
      return;
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst) + off;
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::i32:
      convert(src, DType::f32, static_cast<int32_t*>(dst) + off, DType::i32, static_cast<size_t>(n));
      return;
    case DType::i8:
    case DType::nf4:
      break;  // no elements: core/quant.h
  }
  LOOM_ASSERT(false, "invalid dtype");
}

// p[k] = round_to(dt, p[k]): the value after a store to dt and a load back.
inline void round_inplace(float* p, int64_t n, DType dt) {
  switch (dt) {
    case DType::f32:
      return;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(p[i]);
        const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        const uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
        p[i] = std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
      }
      return;
    case DType::f16: {
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(p + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(p + i),
                                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
#endif
      for (; i < n; ++i) p[i] = f16_to_f32(f32_to_f16(p[i]));
      return;
    }
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) p[i] = round_to(DType::i32, p[i]);
      return;
    case DType::i8:
    case DType::nf4:
      break;  // no elements: core/quant.h
  }
  LOOM_ASSERT(false, "invalid dtype");
}

// Whether round_to(c, v) can change a value v that was loaded from dtype `from`.
inline bool rounding_changes(DType from, DType c) { return c != DType::f32 && c != from; }

// ---- fixed-order reductions ----------------------------------------------------------------

// Σ p[k] in f32 with kSumLanes interleaved partial sums (lane = k mod kSumLanes) folded pairwise in
// a fixed order: vectorisable, and the result depends only on n and the values. 16 lanes are two
// independent add chains per AVX2/AVX-512 register width, so that a row's sum (a layer norm's) is
// not bound by the add latency, as one chain would be.
inline constexpr int kSumLanes = 16;

// acc[0] + … + acc[N − 1], folded pairwise (halves added lane by lane): the fixed combination order
// of the interleaved partial sums here and in the optimizer's gradient norm. N a power of two.
template <class T, int N>
T fold_lanes(T (&acc)[N]) {
  static_assert((N & (N - 1)) == 0, "a power of two");
  for (int w = N / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

inline float sum_f32(const float* p, int64_t n) {
  float acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) acc[l] += p[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += p[i];
  return fold_lanes(acc);
}

// Σ a[k]·b[k] in f32, same lanes and fold as sum_f32.
// b's elements as f32: float as is, uint16_t as bfloat16 bits (exact).
inline float as_f32(float x) { return x; }
inline float as_f32(uint16_t bf16) { return bf16_to_f32(bf16); }
// With b bfloat16 bits, the same sum as dot_f32 over the widened row, without widening it first.
template <class T>
inline float dot_f32(const float* a, const T* b, int64_t n) {
  float acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) acc[l] += a[i + l] * as_f32(b[i + l]);
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * as_f32(b[i]);
  return fold_lanes(acc);
}

// max of the non-NaN elements of p[0, n), −inf when there are none (an all-NaN row then gives NaN
// downstream anyway: x − (−inf) is NaN). `omp simd` with a max reduction: GCC will not vectorise
// std::fmax or a compare-and-select reduction on its own (x86's max instructions treat NaN
// differently); max is exact in any order, so the lanes change nothing.
inline float max_f32(const float* p, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

// f(off, len) for the blocks [off, off + len) of kBlock elements (the last one shorter) that cover
// [0, n), in parallel over blocks when n is worth the pool. An elementwise pass's skeleton.
template <class F>
void for_blocks(int64_t n, F&& f) {
  const int64_t nb = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlock;
    f(off, n - off < kBlock ? n - off : kBlock);
  }
}

// ---- operands converted into workspace ----------------------------------------------------

// Whether t read as f32 rounded to compute dtype c needs a converted copy (f32_rounded): unless
// it is f32 already and c rounds nothing.
inline bool needs_f32_copy(const TensorArg& t, DType c) { return t.dtype != DType::f32 || c != DType::f32; }

// t as f32, with every element rounded to compute dtype c: t's own memory when needs_f32_copy is
// false, otherwise a converted copy in buf (t's numel floats; converted in parallel).
inline const float* f32_rounded(const TensorArg& t, DType c, float* buf) {
  if (!needs_f32_copy(t, c)) return t.as<float>();
  const bool round = rounding_changes(t.dtype, c);
  for_blocks(t.shape.numel(), [&](int64_t off, int64_t len) {
    load_f32(t.data, t.dtype, off, buf + off, len);
    if (round) round_inplace(buf + off, len, c);
  });
  return buf;
}

// t's elements rounded to bfloat16 (raw bits): t's own memory when it is bf16, otherwise a
// rounded copy in buf (t's numel elements; converted in parallel).
inline const uint16_t* bf16_rounded(const TensorArg& t, uint16_t* buf) {
  if (t.dtype == DType::bf16) return t.as<const uint16_t>();
  for_blocks(t.shape.numel(), [&](int64_t off, int64_t len) {
    float f[kBlock];
    load_f32(t.data, t.dtype, off, f, len);
    store_f32(f, buf, DType::bf16, off, len);
  });
  return buf;
}

// A row of t (elements [off, off + n)) as f32: a pointer into t when it is f32, otherwise a
// converted copy in buf (n floats: a row span of the calling thread, row_floats(t, n) long).
inline const float* row_f32(const TensorArg& t, int64_t off, int64_t n, float* buf) {
  if (t.dtype == DType::f32) return t.as<float>() + off;
  load_f32(t.data, t.dtype, off, buf, n);
  return buf;
}
// The floats row_f32 needs for rows of n elements of t: none when t is f32.
inline int64_t row_floats(const TensorArg& t, int64_t n) { return t.dtype == DType::f32 ? 0 : n; }

// exp(x) in f32 within ~1 ulp for x in [−87.3, 88.3] (Cody–Waite reduction x = n·ln2 + r, Cephes'
// degree-6 polynomial for exp(r), 2^n by exponent bits): written branch-free so a row of them
// vectorises. x is clamped to [−88, 89] and the ends fall out of the exponent bits: below −87.7
// n = −127 makes 2^n's bits 0, so the result is 0 (glibc would give a subnormal: immaterial next to
// a softmax's row sum, which is ≥ 1); above 88.4 n = 128 makes them +inf's. NaN propagates through
// the polynomial. The clamps without masks on the result: this function is most of the exact
// GELU's work. The softmax's exponents dominate this attention kernel's time
// otherwise (scalar expf costs as much as its two sgemms at D = 64).
inline float exp_f32(float x) {
  constexpr float kLo = -88.f, kHi = 89.f;
  float c = x > kHi ? kHi : x;
  c = c < kLo ? kLo : c;
  const float n = (c * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round(c / ln2)
  float r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // Estrin's scheme rather than Horner's: a shorter dependency chain.
  const float r2 = r * r;
  const float p01 = 5.0000001201e-1f + 1.6666665459e-1f * r, p23 = 4.1665795894e-2f + 8.3334519073e-3f * r;
  const float p45 = 1.3981999507e-3f + 1.9875691500e-4f * r;
  const float p = p01 + r2 * (p23 + r2 * p45);
  const float y = p * r2 + r + 1.f;
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// erfc(x) in f32 with exp_f32, branch-free like it: for z = |x|, erfc(z) = exp(−z²)·t·R(t) with
// t = 1/(1 + z/2) and R a degree-10 Chebyshev interpolant of exp(z²)·erfc(z)/t over z in [0, 9.5]
// (relative error 2.1 float ulps with the coefficients and each step rounded to float), so the left
// tail of the exact GELU keeps its relative accuracy; erfc(−z) = 2 − erfc(z). Beyond z ≈ 9.4 it is
// 0, the true value underflowing. exp(−z²) is a factor of its own so that a caller also needing
// exp(−x²) for the same x (the exact GELU's gradient: kmath::gelu_erf_grad) shares it once inlined.
// R by Estrin's scheme (product depth 4 rather than Horner's 10): a shorter dependency chain lets
// more vectors of a loop overlap.
inline float erfc_f32(float x) {
  const float z = std::fabs(x);
  const float t = 1.f / (1.f + 0.5f * z);
  const float w = t - 0.5869565010f;  // R is a polynomial in t − the interval's midpoint
  const float w2 = w * w, w4 = w2 * w2;
  const float a0 = 5.748564005e-01f + 7.871958017e-01f * w, a1 = 5.885713696e-01f + 7.946486771e-02f * w;
  const float a2 = -2.050461769e-01f + -4.687039554e-02f * w, a3 = 1.138551384e-01f + 9.388072067e-05f * w;
  const float a4 = -7.131396979e-02f + 1.874944009e-02f * w;
  const float r = (a0 + w2 * a1) + w4 * ((a2 + w2 * a3) + w4 * (a4 + w2 * 3.118523024e-02f));
  const float v = t * r * exp_f32(-(z * z));
  return x < 0.f ? 2.f - v : v;
}

// The elementary functions the shared formulas (backend/kernel_math.h) use on this backend.
struct FastMath {
  static float exp(float x) { return exp_f32(x); }
  static float erfc(float x) { return erfc_f32(x); }
};

}  // namespace loom::cpuk
