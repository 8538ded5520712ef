// What oneDNN's sgemm mallocs for itself in one single-threaded call (cpu_util.h sgemm_call_bytes),
// after oneDNN 3.2's f32 GEMM (src/common/gemm.cpp dnnl_sgemm; src/cpu/x64/gemm/gemm_driver.cpp,
// gemm_info.cpp, gemv_driver.cpp, f32/jit_avx512_common_gemm_f32.cpp). dnnl_sgemm is row-major: it
// computes the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so its m is our N, its n our M, its A our B.
// With one thread the driver takes the first of these paths that applies:
//   - m or n is 1: a GEMV, nothing allocated;
//   - n < 16 with its A transposed and its B not (AVX-512): the small-n TN kernel, nothing;
//   - the no-copy kernel when its checker says so (AVX-512: nocopy_checker_avx512): a workspace of
//     BK·48 + 64 + 48 floats (BK = 384), whatever the shape;
//   - otherwise the copy-based kernel (gemm_kernel_driver): one block of A [m_padd, k_padd] and one
//     of B [k_padd, n_padd] packed, two offset rows (48 and n_padd floats) and a 4 KiB page of
//     alignment after each of the four.
// On AVX-512 that is the whole decision. Below AVX-512 the copy-based size with that ISA's blocking
// is returned for every call: an upper bound, as it exceeds the no-copy workspace there.
#include <algorithm>
#include <string_view>

#include "backend/cpu/cpu_util.h"

namespace loom::cpuk {

namespace {

constexpr int64_t kPage = 4096;  // oneDNN's PAGE_4K

// gemm_info_t's f32 blocking for an ISA.
struct Blocking {
  int64_t um, un, bm, bn, bk, bk_traditional, blocking_small_k, bn_small_k;
};

int64_t round_up(int64_t x, int64_t to) { return ceil_div(x, to) * to; }

// The copy-based kernel's malloc (gemm_kernel_driver: get_m_padd, get_k_padd, get_n_padd, mem_size).
int64_t copy_bytes(const Blocking& b, int64_t m, int64_t n, int64_t k) {
  const int64_t m_padd = round_up(std::min(std::max(m, b.um), b.bm), b.um);
  const int64_t n_padd = round_up(std::min(std::max(n, b.un), k < b.blocking_small_k ? b.bn_small_k : b.bn), b.un);
  const int64_t k_padd = k <= b.bk_traditional ? std::max<int64_t>(128, k)  // uk is 1 for f32
                         : k < 2 * b.bk        ? (k + 1) / 2
                                               : b.bk;
  return 4 * (m_padd * k_padd + k_padd * n_padd + b.um + n_padd) + 4 * kPage;
}

// nocopy_checker_avx512 with one thread: whether the no-copy kernel runs (transa, transb, m, n, k
// and the leading dimensions as oneDNN sees them).
bool no_copy_avx512(bool transa, bool transb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  const bool nn = !transa && !transb, nt = !transa && transb, tn = transa && !transb;
  const bool lda_bad = lda % 256 == 0, ldb_bad = ldb % 256 == 0, ldc_bad = ldc % 256 == 0;
  const bool lda_verybad = lda % 1024 == 0;
  if (tn && m > 100 && ((m < 1200 && n < 200 && k < 1200) || (lda_bad && ldb_bad))) return false;
  if (nn && lda_verybad && k > 500 && n > 100) return false;
  if (1.0 / static_cast<double>(m) + 1.0 / static_cast<double>(n) >= 0.00196 && !(lda_verybad && nt)) return true;
  if (lda_bad || ldb_bad || ldc_bad) {
    if (m >= 32 && n > 16) return false;
    if (m >= 32 && n == 16 && (k >= 6400 || transa || m == 4096)) return false;
  }
  if (m <= 378 && n <= 378 && k >= 378) return false;
  if (m >= 378 && k >= 378) return false;
  if (!transb) return m <= 28 || n <= 28 || k <= 1;
  return (m <= 28 && m >= n) || n <= 28 || k <= 1;
}

}  // namespace

int64_t sgemm_call_bytes(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
  static const bool avx512 = std::string_view(dnnl_isa_name()).starts_with("avx512");
  static const bool avx2 = std::string_view(dnnl_isa_name()).starts_with("avx2");
  // oneDNN's view: m = N, n = M, its A is our B (transposed when tb), its B our A.
  const int64_t m = N, n = M, k = K;
  if (m <= 0 || n <= 0 || k <= 0 || m == 1 || n == 1) return 0;
  if (avx512) {
    const bool transa = tb, transb = ta;
    if (n < 16 && transa && !transb) return 0;
    if (no_copy_avx512(transa, transb, m, n, k, ldb, lda, ldc)) return 4 * (384 * 48 + 64 + 48);
    return copy_bytes({48, 8, 9984, 384, 384, 384, 48, 24}, m, n, k);
  }
  if (avx2) return copy_bytes({24, 4, 10000, 384, 192, 256, 48, 24}, m, n, k);
  return copy_bytes({16, 4, 4096, 96, 256, 256, 48, 24}, m, n, k);  // AVX; SSE4.1's blocks are smaller
}

}  // namespace loom::cpuk
