// Op-by-op comparison of every registered backend (the CPU one today) against the reference
// backend: every op of the table, every applicable dtype, odd shapes, fresh random inputs per case
// (testing::OpCase runs each op through the real graph -> plan -> executor pipeline and checks the
// sentinel bytes around every output and around the kernel's workspace). BackendOps and
// BackendOptimizer run once per backend (support/backend_param.h: "BackendOps.Dense/cpu"); a test
// of an op the backend lacks is skipped, naming the op. Also, for the CPU backend: bitwise
// independence from the OpenMP thread count for the kernels that reduce, in-place aliasing, and
// the GEMM properties the dense kernels' tile buffers rely on.
//
// Tolerances (per output dtype, NMSE = Σ(cpu − ref)² / Σ ref², on outputs of ≥ 32 elements):
//   f32  1e-10   (f32 vs double accumulation)
//   bf16 1e-4    (outputs carry 8 significant bits: an occasional 1-ulp difference from a
//   f16  1e-6     different rounding of the f32 vs double intermediate; 11 bits for f16)
// Smaller outputs: per element |cpu − ref| ≤ sqrt(tol)·(|ref| + 1) (expect_close).
// Reductions (dense family, sum_leading, layer_norm_grad): additionally per element within
// 1e-5·A + 2 ulp of the rounding dtype at A, A = the same sum over |terms| (expect_bounded).
// 16-bit results additionally: at most 10% of elements not bit-identical (kMaxMismatch).
// Elementwise activations in bf16/f16 additionally: at most 1 ulp apart in the output dtype,
// except where the kmath formula itself cancels in float (see kActivationAbsSlack).
// Bit-exact: dropout, cast, add, grad_accumulate, accuracy, reshape (single correctly rounded
// operations, or no arithmetic at all).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"
#include "backend/reference/reference.h"
#include "core/rng.h"
#include "support/backend_param.h"
#include "support/cpu_checks.h"
#include "support/op_coverage.h"
#include "support/op_harness.h"

namespace loom {
namespace {

using testing::expect_bytes_equal;
using testing::expect_thread_invariant;
using testing::HostTensor;
using testing::nmse;
using testing::OpCase;
using testing::ThreadCount;

class BackendOps : public testing::BackendTest {};
class BackendOptimizer : public testing::BackendTest {};
INSTANTIATE_TEST_SUITE_P(, BackendOps, testing::compared_backends(), testing::backend_name);
INSTANTIATE_TEST_SUITE_P(, BackendOptimizer, testing::compared_backends(), testing::backend_name);

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr int64_t kRows[] = {1, 7, 33};
constexpr int64_t kWidths[] = {1, 5, 64, 130};

double nmse_tol(DType dt) {
  switch (dt) {
    case DType::f32:
      return 1e-10;
    case DType::bf16:
      return 1e-4;
    case DType::f16:
      return 1e-6;
    case DType::i32:
      return 0;
  }
  return 0;
}

// A distinct seed per case, so no two cases share inputs. LOOM_TEST_SEED (environment) moves the
// whole sequence, for stress runs over many input draws.
uint64_t next_seed() {
  static uint64_t s = [] {
    const char* e = std::getenv("LOOM_TEST_SEED");
    return e ? std::strtoull(e, nullptr, 10) * 1000003u : uint64_t{1000};
  }();
  return ++s;
}

std::string dn(DType dt) { return dtype_name(dt); }

// Bit patterns mapped to a monotonic integer line (−0 and +0 coincide): the ulp distance of two
// values of the same dtype is the difference of their positions.
int64_t ordered(const HostTensor& t, int64_t i) {
  if (t.dtype == DType::f32 || t.dtype == DType::i32) {
    uint32_t u;
    std::memcpy(&u, t.bytes.data() + i * 4, 4);
    const int64_t mag = u & 0x7fffffffu;
    return (u >> 31) ? -mag : mag;
  }
  uint16_t h;
  std::memcpy(&h, t.bytes.data() + i * 2, 2);
  const int64_t mag = h & 0x7fffu;
  return (h >> 15) ? -mag : mag;
}

struct Outputs {
  std::vector<HostTensor> got, ref;  // the backend under test's, the reference's
};

// Runs `c` on the backend under test and on the reference.
Outputs run_both(OpCase& c, const RunCtx& rc = {}) {
  Backend& be = testing::under_test();
  ReferenceBackend ref;
  EXPECT_TRUE(be.supports(c.graph(), c.node()));
  Outputs o;
  o.got = c.run(be, rc);
  o.ref = c.run(ref, rc);
  return o;
}

void expect_nmse(const HostTensor& cpu, const HostTensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(cpu.shape, ref.shape) << what;
  ASSERT_EQ(cpu.dtype, ref.dtype) << what;
  const double e = nmse(cpu, ref);
  EXPECT_LE(e, tol) << what << ": nmse " << e << " > " << tol;
}

// NMSE is only meaningful over enough elements: a single output that happens to be near zero
// (cancellation) has a large relative error however accurate it is. Below this many elements,
// each element is checked instead: |cpu − ref| ≤ sqrt(tol)·(|ref| + 1), the inputs being ~N(0, 1).
constexpr int64_t kNmseMinElems = 32;

// With the same rounding steps, CPU and reference round almost the same intermediate values, so
// their 16-bit results rarely differ at all (≤ 4% of elements in 200 seeded runs, mostly 1 ulp);
// a missed or extra rounding step makes a third or more differ while its NMSE can stay within
// the bf16 tolerance. So 16-bit results (outputs of ≥ 32 elements) must also match bit for bit
// on all but kMaxMismatch of their elements.
constexpr double kMaxMismatch = 0.10;

void expect_few_mismatches(const HostTensor& cpu, const HostTensor& ref, const std::string& what) {
  int64_t n = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) n += ordered(cpu, i) != ordered(ref, i);
  EXPECT_LE(static_cast<double>(n), kMaxMismatch * static_cast<double>(ref.numel()))
      << what << ": " << n << " of " << ref.numel() << " elements differ from the reference";
}

void expect_close(const HostTensor& cpu, const HostTensor& ref, DType prec, const std::string& what) {
  ASSERT_EQ(cpu.shape, ref.shape) << what;
  ASSERT_EQ(cpu.dtype, ref.dtype) << what;
  const double tol = nmse_tol(prec);
  if (ref.numel() >= kNmseMinElems) {
    expect_nmse(cpu, ref, tol, what);
    if (prec != DType::f32) expect_few_mismatches(cpu, ref, what);
    return;
  }
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = cpu.get(i), b = ref.get(i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (!(std::fabs(a - b) <= std::sqrt(tol) * (std::fabs(b) + 1))) {
      ADD_FAILURE() << what << ": element " << i << " cpu " << a << " ref " << b;
      return;
    }
  }
}

// Compares every output with the tolerance of its dtype (exact for int32 outputs).
void expect_outputs_close(const Outputs& o, const std::string& what) {
  ASSERT_EQ(o.got.size(), o.ref.size()) << what;
  for (size_t k = 0; k < o.got.size(); ++k) {
    const std::string w = what + " out" + std::to_string(k);
    if (o.ref[k].dtype == DType::i32)
      expect_bytes_equal(o.got[k], o.ref[k], w);
    else
      expect_close(o.got[k], o.ref[k], o.ref[k].dtype, w);
  }
}

// ---- reductions: error bounds relative to the magnitude of the terms --------------------------
//
// f32 accumulation error is bounded relative to Σ|term|, not to |Σ term|: an output that
// cancels (a one-element output, a column of a few rows) can have a large relative error that
// is still perfectly accurate. So reductions are checked element by element against
//   |cpu − ref| ≤ kAccumRel·A + 2·ulp_prec(A),   A = the same computation on |terms|,
// (2 ulps of the coarsest rounding dtype involved: the compute-dtype rounding of the sum and
// that of the output), plus NMSE where the output has enough elements for it to be meaningful and
// is not made of cancellations throughout (`cancels`).
constexpr double kAccumRel = 1e-5;

// The coarser of two float dtypes (the one with fewer significand bits).
DType coarser(DType a, DType b) {
  auto bits = [](DType d) { return d == DType::bf16 ? 8 : d == DType::f16 ? 11 : 24; };
  return bits(a) <= bits(b) ? a : b;
}

// Spacing of dtype dt's values at magnitude v (f16: never below its smallest subnormal).
double ulp_at(DType dt, double v) {
  const int bits = dt == DType::bf16 ? 8 : dt == DType::f16 ? 11 : 24;
  if (v == 0) return dt == DType::f16 ? std::ldexp(1.0, -24) : 0.0;
  double u = std::ldexp(1.0, std::ilogb(v) - (bits - 1));
  if (dt == DType::f16) u = std::max(u, std::ldexp(1.0, -24));
  return u;
}

void expect_bounded(const HostTensor& cpu, const HostTensor& ref, const std::vector<double>& mag, DType prec,
                    const std::string& what, bool cancels = false) {
  ASSERT_EQ(cpu.shape, ref.shape) << what;
  ASSERT_EQ(cpu.dtype, ref.dtype) << what;
  ASSERT_EQ(static_cast<int64_t>(mag.size()), ref.numel()) << what;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = mag[static_cast<size_t>(i)];
    const double err = std::fabs(static_cast<double>(cpu.get(i)) - ref.get(i));
    const double bound = kAccumRel * a + 2 * ulp_at(prec, a);
    if (!(err <= bound)) {
      ADD_FAILURE() << what << ": element " << i << " cpu " << cpu.get(i) << " ref " << ref.get(i) << " |err| " << err
                    << " > bound " << bound << " (magnitude " << a << ")";
      return;
    }
  }
  if (ref.numel() >= kNmseMinElems && !cancels) expect_close(cpu, ref, prec, what);
}

// Runs a multilinear op (dense family, sum_leading) on both backends, and the reference once more
// on |inputs| for the magnitudes A; checks output 0 with expect_bounded.
void check_multilinear(OpKind op, const std::vector<ValueDesc>& ins, const Attrs& attrs, DType prec,
                       const std::string& what) {
  OpCase oc(op, ins, attrs);
  oc.fill_random(next_seed());
  OpCase abs_case(op, ins, attrs);
  for (size_t k = 0; k < ins.size(); ++k)
    for (int64_t i = 0; i < oc.input(k).numel(); ++i) abs_case.input(k).set(i, std::fabs(oc.input(k).get(i)));
  ReferenceBackend ref;
  const HostTensor m = abs_case.run(ref).at(0);
  std::vector<double> mag(static_cast<size_t>(m.numel()));
  for (int64_t i = 0; i < m.numel(); ++i) mag[static_cast<size_t>(i)] = m.get(i);
  const Outputs o = run_both(oc);
  expect_bounded(o.got.at(0), o.ref.at(0), mag, prec, what);
}

// ---- dense family ------------------------------------------------------------------------

struct MKN {
  Shape x_lead;  // leading dims of x (rows)
  int64_t K, N;
};
const std::vector<MKN> kDenseShapes = {
    {Shape{1}, 1, 1},      {Shape{7}, 5, 64}, {Shape{33}, 130, 5},   {Shape{7}, 64, 130},
    {Shape{2, 3}, 130, 7}, {Shape{1}, 64, 1}, {Shape{260}, 33, 260},  // the last one is big enough for two GEMM tiles
    {Shape{1}, 130, 1100},  // one row (decoding: simd::gemv), split into column tiles, K and N not whole vectors
    {Shape{1}, 1100, 260},  // one row split into K chunks (chunks of 275 rows: not whole vectors) summed after
    {Shape{1}, 100, 1100},  // one row whose K leaves whole vectors after the blocks of four (Wᵀ: simd::gemv_t)
};

// {f32} or {f32, dt}: the dtype pairs worth testing once each.
std::vector<DType> f32_and(DType dt) {
  if (dt == DType::f32) return {DType::f32};
  return {DType::f32, dt};
}

Shape with_last(Shape lead, int64_t d) {
  lead.push_back(d);
  return lead;
}

// Kernel shape for transpose_w (stored [N, K], the tied-embedding layout) or not.
Shape kernel_shape(const MKN& s, bool wt) { return wt ? Shape{s.N, s.K} : Shape{s.K, s.N}; }

TEST_P(BackendOps, Dense) {
  LOOM_REQUIRE_OPS(OpKind::dense);
  for (DType c : kFloatTypes)
    for (DType xdt : f32_and(c))
      for (bool bias : {false, true})
        for (bool wt : {false, true})
          for (const MKN& s : kDenseShapes) {
            const std::string what = "dense c=" + dn(c) + " x=" + dn(xdt) + (bias ? " bias " : " ") +
                                     (wt ? "wT " : "") + with_last(s.x_lead, s.K).str() + "x[" + std::to_string(s.K) +
                                     "," + std::to_string(s.N) + "]";
            std::vector<ValueDesc> ins = {{with_last(s.x_lead, s.K), xdt}, {kernel_shape(s, wt), DType::f32}};
            if (bias) ins.push_back({Shape{s.N}, DType::f32});
            check_multilinear(OpKind::dense, ins, DenseAttrs{c, wt}, c, what);
          }
}

TEST_P(BackendOps, DenseGradInput) {
  LOOM_REQUIRE_OPS(OpKind::dense_grad_input);
  for (DType c : kFloatTypes)
    for (DType out : {DType::f32, DType::bf16, DType::f16})
      for (bool wt : {false, true})
        for (const MKN& s : kDenseShapes) {
          const std::string what = "dense_grad_input c=" + dn(c) + " out=" + dn(out) + (wt ? " wT " : " ") +
                                   with_last(s.x_lead, s.N).str() + " K=" + std::to_string(s.K);
          // dx is rounded to c, then to out: the coarser of the two sets the precision.
          check_multilinear(OpKind::dense_grad_input,
                            {{with_last(s.x_lead, s.N), c}, {kernel_shape(s, wt), DType::f32}},
                            DenseGradAttrs{c, out, wt}, coarser(c, out), what);
        }
}

// grad (+)= round_c(xᵀ·dy): assigning (the first writer in minibatch 0) and accumulating onto a
// random gradient; input 0 is the gradient buffer.
TEST_P(BackendOps, DenseGradWeight) {
  LOOM_REQUIRE_OPS(OpKind::dense_grad_weight);
  for (DType c : kFloatTypes)
    for (DType xdt : f32_and(c))
      for (bool wt : {false, true})
        for (bool assign : {true, false})
          for (const MKN& s : kDenseShapes) {
            const std::string what = "dense_grad_weight c=" + dn(c) + " x=" + dn(xdt) + (wt ? " wT " : " ") +
                                     (assign ? "assign " : "accumulate ") + with_last(s.x_lead, s.K).str() +
                                     " N=" + std::to_string(s.N);
            // dW is rounded to the compute dtype before it is added: c sets the precision.
            check_multilinear(
                OpKind::dense_grad_weight,
                {{kernel_shape(s, wt), DType::f32}, {with_last(s.x_lead, s.K), xdt}, {with_last(s.x_lead, s.N), c}},
                DenseGradWeightAttrs{c, wt, assign}, c, what);
          }
}

// A row vector split along K and across columns at once: on this machine the chunks alone cover
// the processors, so the grid of a larger one (16 processors: 4 chunks × 4 column tiles here) is
// set for the test, against the reference and across thread counts.
TEST_P(BackendOps, DenseRowVectorGridOfALargerMachine) {
  if (GetParam() != Device::cpu) GTEST_SKIP() << "the CPU dense kernels' partition";
  struct Restore {
    int64_t n = cpuk::row_vector_processors();
    ~Restore() { cpuk::set_row_vector_processors(n); }
  } restore;
  cpuk::set_row_vector_processors(16);
  for (DType c : kFloatTypes)
    for (bool bias : {false, true}) {
      std::vector<ValueDesc> ins = {{Shape{1, 1100}, c}, {Shape{1100, 1100}, DType::f32}};
      if (bias) ins.push_back({Shape{1100}, DType::f32});
      const std::string what = "dense one row, 16 processors, c=" + dn(c) + (bias ? " bias" : "");
      check_multilinear(OpKind::dense, ins, DenseAttrs{c}, c, what);
      OpCase oc(OpKind::dense, ins, DenseAttrs{c});
      oc.fill_random(next_seed());
      expect_thread_invariant(oc, what);
    }
}

// The dense family multiplies bfloat16 natively when the CPU has AVX512-BF16, unless oneDNN is
// capped below it: backend.dense_ops_without_avx512_bf16 reruns the dense tests with
// ONEDNN_MAX_CPU_ISA=AVX512_CORE, so both paths are tested on a machine that has the instructions.
TEST(CpuOps, Bf16GemmPathFollowsTheIsa) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && std::string(cap) != "AVX512_CORE") GTEST_SKIP() << "oneDNN capped to " << cap;
  EXPECT_EQ(cpuk::bf16_gemm_available(), __builtin_cpu_supports("avx512bf16") && !cap);
}

// The dense kernels form each tile of C in a tile buffer of their workspace instead of inside a
// whole [M, N] C, and give the same bits as before because of two properties of the GEMMs they call,
// checked here at tile shapes of loom's models, for sgemm and (on CPUs with AVX512-BF16) oneDNN's
// bf16 matmul: a product of rows [m0, m1) of A equals those rows of the whole product when A is not
// transposed (tiles go through their buffer in row blocks), and C's row stride changes nothing as
// long as it stays wider than C's columns (a tile buffer's rows are wider than the tile when the
// tile grid has several columns; the bf16 matmul picks its kernel by whether C's rows are dense).
struct GemmTile {
  bool ta, tb;
  int64_t m, n, K;
  int64_t ldc_whole;  // C's row stride in the whole product (n: dense rows)
  int64_t block;      // rows per call through the tile buffer
};
template <class T>
void expect_tile_buffer_agrees(const GemmTile& t, T (*from_f32)(float)) {
  const int64_t lda = t.ta ? t.m : t.K, ldb = t.tb ? t.K : t.n;
  std::vector<T> a(static_cast<size_t>(t.m * t.K)), b(static_cast<size_t>(t.K * t.n));
  const PhiloxKey key = rng_key(next_seed(), 0, 0, 0);
  uint64_t k = 0;
  for (T& v : a) v = from_f32(rng_normal(key, k++));
  for (T& v : b) v = from_f32(rng_normal(key, k++));
  // Rows of C from calls of `block` rows each into a C with row stride ldc.
  const auto product = [&](int64_t block, int64_t ldc) {
    std::vector<float> c(static_cast<size_t>(t.m * ldc));
    ThreadCount one(1);
    for (int64_t m0 = 0; m0 < t.m; m0 += block) {
      const int64_t rows = std::min(block, t.m - m0);
      std::vector<std::byte> pad;
      if constexpr (std::is_same_v<T, uint16_t>)
        pad.resize(static_cast<size_t>(cpuk::bf16_gemm_scratchpad(t.ta, t.tb, rows, t.n, t.K, lda, ldb, ldc, 1)));
      cpuk::gemm_rm(t.ta, t.tb, rows, t.n, t.K, t.ta ? a.data() + m0 : a.data() + m0 * lda, lda, b.data(), ldb,
                    c.data() + m0 * ldc, ldc, pad.data());
    }
    std::vector<float> dense;
    for (int64_t r = 0; r < t.m; ++r) dense.insert(dense.end(), c.begin() + r * ldc, c.begin() + r * ldc + t.n);
    return dense;
  };
  const std::vector<float> whole = product(t.m, t.ldc_whole);
  const int64_t ldc = t.ldc_whole == t.n ? t.n : (t.n + 16) / 16 * 16;
  // The properties are oneDNN's AVX-512 kernels' (measured, not promised). Its AVX2 sgemm splits K
  // by the call's shape, so there the blocks agree to rounding only: results stay deterministic
  // for a given configuration, but are not the bits of a whole-C call.
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  const bool exact = __builtin_cpu_supports("avx512f") && (!cap || std::string(cap).rfind("AVX512", 0) == 0);
  for (const int64_t stride : {ldc, t.ldc_whole == t.n ? t.n : t.n + 1, t.ldc_whole}) {
    const std::vector<float> got = product(t.block, stride);
    const std::string what = std::string(sizeof(T) == 2 ? "bf16" : "f32") + " ta " + std::to_string(t.ta) + " tb " +
                             std::to_string(t.tb) + " m " + std::to_string(t.m) + " n " + std::to_string(t.n) + " K " +
                             std::to_string(t.K) + ": blocks of " + std::to_string(t.block) + " rows, row stride " +
                             std::to_string(stride) + " vs whole";
    if (exact) {
      EXPECT_EQ(std::memcmp(got.data(), whole.data(), whole.size() * sizeof(float)), 0) << what;
    } else {
      for (size_t i = 0; i < whole.size(); ++i)
        ASSERT_NEAR(got[i], whole[i], 1e-4f * (1.f + std::fabs(whole[i]))) << what << " at " << i;
    }
  }
}

TEST(CpuOps, DenseGemmTileBuffersAgree) {
  const std::vector<GemmTile> tiles = {
      {false, true, 4400, 512, 256, 2048, 4096},  // row blocks of the kernel's size, strided
      {false, false, 700, 1536, 768, 3072, 256},  // an MLP tile in blocks, strided
      {false, true, 1000, 768, 384, 768, 300},    // dense rows, blocks with a tail
      {false, true, 96, 12564, 768, 50257, 96},   // GPT-2's tied logits: one block, strided
      {true, false, 768, 384, 512, 768, 768},     // weight gradients: transposed A, one call
      {true, false, 192, 3072, 256, 12288, 192},
      // Float32 dense tiles written into out in epilogue blocks (kEpilogueRows = 64; the last
      // block takes the rest, 64–127 rows): shape (d)'s MLP input, head and MLP output, and tails.
      {false, false, 512, 512, 256, 1024, 64},
      {false, false, 256, 1024, 256, 2048, 64},
      {false, false, 512, 128, 1024, 256, 64},
      {false, false, 200, 512, 256, 1024, 100},
      {false, true, 130, 384, 256, 1024, 65}};
  for (const GemmTile& t : tiles) {
    expect_tile_buffer_agrees<float>(t, [](float v) { return v; });
    if (cpuk::bf16_gemm_available()) expect_tile_buffer_agrees<uint16_t>(t, f32_to_bf16);
  }
}

// The bf16 GEMM on operands that are blocks inside bigger arrays (row strides wider than the
// block), in every layout the dense ops use, against exact sums in double: on AMX hosts such
// operands are first copied dense (gemm_bf16.cpp; these shapes are large enough for that), on
// AVX512-BF16 hosts they go to oneDNN as they are. C's columns past the block stay untouched.
TEST(CpuOps, Bf16GemmStridedOperands) {
  if (!cpuk::bf16_gemm_available()) GTEST_SKIP() << "no bf16 matmul on this CPU";
  constexpr int64_t M = 512, N = 640, K = 192;
  const PhiloxKey key = rng_key(next_seed(), 0, 0, 0);
  uint64_t k = 0;
  for (const auto& [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}}) {
    const int64_t lda = (ta ? M : K) + 8, ldb = (tb ? K : N) + 24, ldc = N + 40;
    std::vector<uint16_t> a(static_cast<size_t>((ta ? K : M) * lda)), b(static_cast<size_t>((tb ? N : K) * ldb));
    for (uint16_t& v : a) v = f32_to_bf16(rng_normal(key, k++));
    for (uint16_t& v : b) v = f32_to_bf16(rng_normal(key, k++));
    constexpr float kUntouched = 12345.f;
    std::vector<float> c(static_cast<size_t>(M * ldc), kUntouched);
    std::vector<std::byte> pad(static_cast<size_t>(cpuk::bf16_gemm_scratchpad(ta, tb, M, N, K, lda, ldb, ldc, 1)));
    {
      ThreadCount one(1);
      cpuk::gemm_rm(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, c.data(), ldc, pad.data());
    }
    const auto at = [&](int64_t m, int64_t kk) {
      return bf16_to_f32(a[static_cast<size_t>(ta ? kk * lda + m : m * lda + kk)]);
    };
    const auto bt = [&](int64_t kk, int64_t n) {
      return bf16_to_f32(b[static_cast<size_t>(tb ? n * ldb + kk : kk * ldb + n)]);
    };
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, magnitude = 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          const double p = static_cast<double>(at(m, kk)) * bt(kk, n);
          exact += p;
          magnitude += std::fabs(p);
        }
        // fp32 accumulation of K exact products: within K · 2^-24 of the magnitude sum.
        const double tol = static_cast<double>(K) * std::ldexp(1.0, -24) * magnitude + 1e-30;
        ASSERT_NEAR(c[static_cast<size_t>(m * ldc + n)], exact, tol)
            << "ta " << ta << " tb " << tb << " at " << m << ", " << n;
      }
      for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(c[static_cast<size_t>(m * ldc + n)], kUntouched) << "row " << m;
    }
  }
}

TEST_P(BackendOps, SumLeading) {
  LOOM_REQUIRE_OPS(OpKind::sum_leading);
  const std::vector<Shape> shapes = {Shape{1},       Shape{130},      Shape{1, 1},    Shape{7, 5},
                                     Shape{33, 130}, Shape{3, 7, 64}, Shape{600, 70}, Shape{5000, 3}};
  for (DType xdt : kFloatTypes)
    for (DType out : f32_and(xdt))
      for (const Shape& s : shapes)
        for (int keep = 0; keep <= s.rank; ++keep) {
          const std::string what =
              "sum_leading x=" + dn(xdt) + " out=" + dn(out) + " " + s.str() + " keep=" + std::to_string(keep);
          check_multilinear(OpKind::sum_leading, {{s, xdt}}, ReduceAttrs{keep, out}, out, what);
        }
}

// ---- layer norm --------------------------------------------------------------------------

// The inputs of layer_norm (x, scale, bias) or rms_norm (x, scale).
std::vector<ValueDesc> norm_inputs(OpKind op, const Shape& x, DType xdt) {
  std::vector<ValueDesc> in = {{x, xdt}, {Shape{x.last()}, DType::f32}};
  if (op == OpKind::layer_norm) in.push_back({Shape{x.last()}, DType::f32});
  return in;
}

TEST_P(BackendOps, LayerNorm) {
  LOOM_REQUIRE_OPS(OpKind::layer_norm, OpKind::rms_norm);
  for (OpKind op : {OpKind::layer_norm, OpKind::rms_norm})
    for (DType xdt : kFloatTypes)
      for (DType out : f32_and(xdt))
        for (int64_t R : kRows)
          for (int64_t C : kWidths)
            for (float eps : {1e-6f, 1e-5f}) {
              const std::string what = std::string(op_name(op)) + " x=" + dn(xdt) + " out=" + dn(out) +
                                       " R=" + std::to_string(R) + " C=" + std::to_string(C) +
                                       " eps=" + std::to_string(eps);
              OpCase oc(op, norm_inputs(op, Shape{R, C}, xdt), LayerNormAttrs{eps, out});
              oc.fill_random(next_seed());
              expect_outputs_close(run_both(oc), what);
            }
}

TEST_P(BackendOps, LayerNormRank3) {
  LOOM_REQUIRE_OPS(OpKind::layer_norm, OpKind::rms_norm);
  for (OpKind op : {OpKind::layer_norm, OpKind::rms_norm}) {
    OpCase oc(op, norm_inputs(op, Shape{3, 5, 64}, DType::bf16), LayerNormAttrs{1e-6f, DType::bf16});
    oc.fill_random(next_seed());
    expect_outputs_close(run_both(oc), std::string(op_name(op)) + " [3,5,64] bf16");
  }
}

// The inputs of layer_norm_grad (dy, x, scale, mean, rstd) or rms_norm_grad (dy, x, scale, rstd).
std::vector<ValueDesc> norm_grad_inputs(OpKind op, int64_t R, int64_t C, DType ydt, DType xdt) {
  std::vector<ValueDesc> in = {{Shape{R, C}, ydt}, {Shape{R, C}, xdt}, {Shape{C}, DType::f32}, {Shape{R}, DType::f32}};
  if (op == OpKind::layer_norm_grad) in.push_back({Shape{R}, DType::f32});
  return in;
}
bool centred(OpKind op) { return op == OpKind::layer_norm_grad; }
// The saved statistics of a norm_grad case: mean (0 for rms_norm_grad) and rstd of row r.
double stat_mean(OpCase& oc, OpKind op, int64_t r) { return centred(op) ? oc.input(3).get(r) : 0.0; }
HostTensor& stat_rstd(OpCase& oc, OpKind op) { return oc.input(centred(op) ? 4 : 3); }

// Inputs for layer_norm_grad / rms_norm_grad with consistent statistics, as the forward would save.
void set_norm_stats(OpCase& oc, OpKind op, int64_t R, int64_t C) {
  HostTensor& x = oc.input(1);
  for (int64_t r = 0; r < R; ++r) {
    double s = 0, sq = 0;
    if (centred(op))
      for (int64_t c = 0; c < C; ++c) s += x.get(r * C + c);
    const double mean = s / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) sq += (x.get(r * C + c) - mean) * (x.get(r * C + c) - mean);
    if (centred(op)) oc.input(3).set(r, static_cast<float>(mean));
    stat_rstd(oc, op).set(r, static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + 1e-6)));
  }
}

// Magnitudes of the terms of each norm_grad output (see expect_bounded), in double:
// dx: |rstd|·(|g| + mean|g| + |xhat|·mean|g·xhat|) (no mean|g| term for rms_norm_grad),
// dscale: Σ_rows |dy·xhat|, dbias: Σ_rows |dy|.
struct NormGradMagnitudes {
  std::vector<double> dx, dscale, dbias;
};
NormGradMagnitudes norm_grad_magnitudes(OpCase& oc, OpKind op, int64_t R, int64_t C, double offset = 0) {
  NormGradMagnitudes m;
  m.dx.resize(static_cast<size_t>(R * C));
  m.dscale.assign(static_cast<size_t>(C), 0.0);
  m.dbias.assign(static_cast<size_t>(C), 0.0);
  const HostTensor &dy = oc.input(0), &x = oc.input(1), &scale = oc.input(2), &rstd = stat_rstd(oc, op);
  for (int64_t r = 0; r < R; ++r) {
    const double mean = stat_mean(oc, op, r);
    double g_abs = 0, gx_abs = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x.get(r * C + c) - mean) * rstd.get(r);
      const double d = dy.get(r * C + c);
      g_abs += std::fabs(d * (offset + scale.get(c)));
      gx_abs += std::fabs(d * (offset + scale.get(c)) * xhat);
      m.dscale[static_cast<size_t>(c)] += std::fabs(d * xhat);
      m.dbias[static_cast<size_t>(c)] += std::fabs(d);
    }
    if (!centred(op)) g_abs = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x.get(r * C + c) - mean) * rstd.get(r);
      m.dx[static_cast<size_t>(r * C + c)] =
          std::fabs(rstd.get(r)) * (std::fabs(dy.get(r * C + c) * (offset + scale.get(c))) +
                                    g_abs / static_cast<double>(C) + std::fabs(xhat) * gx_abs / static_cast<double>(C));
    }
  }
  return m;
}

TEST_P(BackendOps, LayerNormGrad) {
  LOOM_REQUIRE_OPS(OpKind::layer_norm_grad, OpKind::rms_norm_grad);
  for (OpKind op : {OpKind::layer_norm_grad, OpKind::rms_norm_grad})
    for (DType xdt : kFloatTypes)
      for (DType ydt : f32_and(xdt))
        for (int64_t R : kRows)
          for (int64_t C : kWidths)
            for (bool real_stats : {false, true}) {
              const std::string what = std::string(op_name(op)) + " x=" + dn(xdt) + " dy=" + dn(ydt) +
                                       " R=" + std::to_string(R) + " C=" + std::to_string(C) +
                                       (real_stats ? " stats" : " random");
              OpCase oc(op, norm_grad_inputs(op, R, C, ydt, xdt), LayerNormAttrs{1e-6f, ydt});
              oc.fill_random(next_seed());
              if (real_stats) set_norm_stats(oc, op, R, C);
              const Outputs o = run_both(oc);
              const NormGradMagnitudes m = norm_grad_magnitudes(oc, op, R, C);
              // One column with its own statistics: rms_norm_grad's dx = rstd·g·(1 − xhat²) with
              // xhat² = x²/(x² + eps), all cancellation.
              const bool cancels = !centred(op) && C == 1 && real_stats;
              expect_bounded(o.got[0], o.ref[0], m.dx, xdt, what + " dx", cancels);
              expect_bounded(o.got[1], o.ref[1], m.dscale, DType::f32, what + " dscale");
              if (centred(op)) expect_bounded(o.got[2], o.ref[2], m.dbias, DType::f32, what + " dbias");
            }
}

// rms_norm with unit_offset (Gemma's 1 + scale): the definition on both backends, then the
// backend against the reference on the same shapes as LayerNorm, forward and backward.
TEST_P(BackendOps, RmsNormUnitOffset) {
  LOOM_REQUIRE_OPS(OpKind::rms_norm, OpKind::rms_norm_grad);
  const LayerNormAttrs attrs{.eps = 1e-6f, .dtype = DType::f32, .unit_offset = true};
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    OpCase oc(OpKind::rms_norm, norm_inputs(OpKind::rms_norm, Shape{3, 7}, DType::f32), attrs);
    oc.fill_random(next_seed());
    const HostTensor y = oc.run(*be).at(0);
    for (int64_t r = 0; r < 3; ++r) {
      double sq = 0;
      for (int64_t c = 0; c < 7; ++c) sq += oc.input(0).get(r * 7 + c) * oc.input(0).get(r * 7 + c);
      const double rstd = 1 / std::sqrt(sq / 7 + 1e-6);
      for (int64_t c = 0; c < 7; ++c) {
        const double want = oc.input(0).get(r * 7 + c) * rstd * (1 + oc.input(1).get(c));
        EXPECT_NEAR(y.get(r * 7 + c), want, 1e-6 * (1 + std::fabs(want))) << be->name();
      }
    }
  }
  for (DType xdt : kFloatTypes)
    for (int64_t R : kRows)
      for (int64_t C : kWidths) {
        const std::string what = "x=" + dn(xdt) + " R=" + std::to_string(R) + " C=" + std::to_string(C);
        OpCase fwd(OpKind::rms_norm, norm_inputs(OpKind::rms_norm, Shape{R, C}, xdt), attrs);
        fwd.fill_random(next_seed());
        expect_outputs_close(run_both(fwd), "rms_norm unit_offset " + what);
        OpCase grad(OpKind::rms_norm_grad, norm_grad_inputs(OpKind::rms_norm_grad, R, C, DType::f32, xdt), attrs);
        grad.fill_random(next_seed());
        set_norm_stats(grad, OpKind::rms_norm_grad, R, C);
        const Outputs o = run_both(grad);
        const NormGradMagnitudes m = norm_grad_magnitudes(grad, OpKind::rms_norm_grad, R, C, 1.0);
        expect_bounded(o.got[0], o.ref[0], m.dx, xdt, "rms_norm_grad unit_offset " + what + " dx", C == 1);
        expect_bounded(o.got[1], o.ref[1], m.dscale, DType::f32, "rms_norm_grad unit_offset " + what + " dscale");
      }
}

// ---- qk_norm -------------------------------------------------------------------------------

// Packed qkv shapes [B, T, S, (G+2)·D] as (B, T, S, G, D): one head of one element, odd head
// widths, grouped queries, and enough rows for the parallel paths and chunked parameter sums.
struct QkShape {
  int64_t B, T, S, G, D;
  Shape qkv() const { return Shape{B, T, S, (G + 2) * D}; }
  std::string str() const { return qkv().str() + " G=" + std::to_string(G); }
};
const QkShape kQkShapes[] = {{1, 1, 1, 1, 1}, {2, 3, 1, 1, 5}, {1, 7, 2, 3, 64}, {2, 33, 2, 2, 130}};

std::vector<ValueDesc> qk_norm_inputs(const QkShape& q, DType dt) {
  return {{q.qkv(), dt}, {Shape{q.D}, DType::f32}, {Shape{q.D}, DType::f32}};
}

// The definition on both backends, against a direct computation in double: each query head is
// x·rsqrt(mean(x²) + eps)·q_scale, the key head the same with k_scale, the value part is copied
// bit for bit, and rstd holds each head's statistic in head order.
TEST_P(BackendOps, QkNormDefinition) {
  LOOM_REQUIRE_OPS(OpKind::qk_norm);
  const QkShape q{1, 2, 2, 2, 6};
  const float eps = 1e-3f;
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)})
    for (bool unit : {false, true}) {
      OpCase oc(OpKind::qk_norm, qk_norm_inputs(q, DType::f32),
                QkNormAttrs{.eps = eps, .group = 2, .unit_offset = unit});
      oc.fill_random(next_seed());
      const std::vector<HostTensor> out = oc.run(*be);
      const HostTensor& x = oc.input(0);
      const int64_t W = (q.G + 2) * q.D;
      for (int64_t r = 0; r < q.B * q.T * q.S; ++r) {
        for (int64_t p = 0; p <= q.G; ++p) {
          double sq = 0;
          for (int64_t c = 0; c < q.D; ++c) sq += x.get(r * W + p * q.D + c) * x.get(r * W + p * q.D + c);
          const double rstd = 1 / std::sqrt(sq / static_cast<double>(q.D) + eps);
          EXPECT_NEAR(out[1].get(r * (q.G + 1) + p), rstd, 1e-6 * rstd) << be->name();
          const HostTensor& scale = oc.input(p < q.G ? 1 : 2);
          for (int64_t c = 0; c < q.D; ++c) {
            const double want = x.get(r * W + p * q.D + c) * rstd * ((unit ? 1 : 0) + scale.get(c));
            EXPECT_NEAR(out[0].get(r * W + p * q.D + c), want, 1e-6 * (1 + std::fabs(want))) << be->name();
          }
        }
        for (int64_t e = (q.G + 1) * q.D; e < W; ++e) EXPECT_EQ(out[0].get(r * W + e), x.get(r * W + e)) << be->name();
      }
    }
}

TEST_P(BackendOps, QkNorm) {
  LOOM_REQUIRE_OPS(OpKind::qk_norm);
  for (DType dt : kFloatTypes)
    for (const QkShape& q : kQkShapes)
      for (bool unit : {false, true}) {
        OpCase oc(OpKind::qk_norm, qk_norm_inputs(q, dt),
                  QkNormAttrs{.eps = 1e-6f, .group = static_cast<int32_t>(q.G), .unit_offset = unit});
        oc.fill_random(next_seed());
        expect_outputs_close(run_both(oc), "qk_norm " + dn(dt) + " " + q.str() + (unit ? " unit_offset" : ""));
      }
}

// qk_norm_grad with the statistics the forward saves; dqkv and the scale gradients bounded by
// the magnitudes of their terms (norm_grad_magnitudes' rms_norm_grad terms, per head).
TEST_P(BackendOps, QkNormGrad) {
  LOOM_REQUIRE_OPS(OpKind::qk_norm_grad);
  for (DType dt : kFloatTypes)
    for (const QkShape& q : kQkShapes)
      for (bool unit : {false, true}) {
        const std::string what = "qk_norm_grad " + dn(dt) + " " + q.str() + (unit ? " unit_offset" : "");
        const QkNormAttrs attrs{.eps = 1e-6f, .group = static_cast<int32_t>(q.G), .unit_offset = unit};
        const double offset = unit ? 1.0 : 0.0;
        const Shape stats{q.B, q.T, q.S, q.G + 1};
        OpCase oc(
            OpKind::qk_norm_grad,
            {{q.qkv(), dt}, {q.qkv(), dt}, {Shape{q.D}, DType::f32}, {Shape{q.D}, DType::f32}, {stats, DType::f32}},
            attrs);
        oc.fill_random(next_seed());
        const HostTensor& x = oc.input(1);
        const HostTensor& dy = oc.input(0);
        const int64_t W = (q.G + 2) * q.D, rows = q.B * q.T * q.S;
        std::vector<double> mdx(static_cast<size_t>(rows * W)), mds(static_cast<size_t>(2 * q.D), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t p = 0; p <= q.G; ++p) {
            const int64_t base = r * W + p * q.D;
            double sq = 0, gx = 0;
            for (int64_t c = 0; c < q.D; ++c) sq += x.get(base + c) * x.get(base + c);
            const double rstd = 1 / std::sqrt(sq / static_cast<double>(q.D) + 1e-6);
            oc.input(4).set(r * (q.G + 1) + p, static_cast<float>(rstd));
            const HostTensor& scale = oc.input(p < q.G ? 2 : 3);
            for (int64_t c = 0; c < q.D; ++c)
              gx += std::fabs(dy.get(base + c) * (offset + scale.get(c)) * x.get(base + c) * rstd);
            for (int64_t c = 0; c < q.D; ++c) {
              const double xhat = std::fabs(x.get(base + c) * rstd);
              mdx[static_cast<size_t>(base + c)] =
                  rstd * (std::fabs(dy.get(base + c) * (offset + scale.get(c))) + xhat * gx / static_cast<double>(q.D));
              mds[static_cast<size_t>((p < q.G ? 0 : q.D) + c)] += std::fabs(dy.get(base + c)) * xhat;
            }
          }
          for (int64_t e = (q.G + 1) * q.D; e < W; ++e)
            mdx[static_cast<size_t>(r * W + e)] = std::fabs(dy.get(r * W + e));
        }
        const Outputs o = run_both(oc);
        // One-element heads with their own statistics: dx = rstd·g·(1 − xhat²), all cancellation.
        expect_bounded(o.got[0], o.ref[0], mdx, dt, what + " dqkv", q.D == 1);
        expect_bounded(o.got[1], o.ref[1], std::vector<double>(mds.begin(), mds.begin() + q.D), DType::f32,
                       what + " dq_scale");
        expect_bounded(o.got[2], o.ref[2], std::vector<double>(mds.begin() + q.D, mds.end()), DType::f32,
                       what + " dk_scale");
      }
}

// ---- activations ---------------------------------------------------------------------------

// The kmath formulas cancel in float in a few places (1 + tanh(u) for very negative x in gelu and
// gelu_grad, 1 + x·(1 − σ(x)) near x ≈ −1.28 in silu_grad): there the float result carries an
// absolute error of a few 2^-24 times the size of the terms, which can be more than one ulp of a
// tiny 16-bit result (bf16 has f32's exponent range: float gives −0 where double gives −4e-16).
// Beyond 1 ulp we therefore accept |cpu − ref| ≤ kActivationAbsSlack·(1 + |x|)·(1 + |dy|).
constexpr double kActivationAbsSlack = 1e-6;

void expect_ulp(const HostTensor& cpu, const HostTensor& ref, const HostTensor& x, const HostTensor* dy,
                const std::string& what) {
  int64_t worst = 0, beyond = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const int64_t d = std::llabs(ordered(cpu, i) - ordered(ref, i));
    worst = std::max(worst, d);
    if (d <= 1) continue;
    const double scale = (1.0 + std::fabs(x.get(i))) * (1.0 + (dy ? std::fabs(dy->get(i)) : 0.0));
    if (std::fabs(static_cast<double>(cpu.get(i)) - ref.get(i)) > kActivationAbsSlack * scale) {
      ++beyond;
      if (beyond == 1)
        ADD_FAILURE() << what << ": element " << i << " (x = " << x.get(i) << ") is " << d << " ulp off: cpu "
                      << cpu.get(i) << " ref " << ref.get(i);
    }
  }
  EXPECT_EQ(beyond, 0) << what << " (max ulp distance " << worst << ")";
}

const std::vector<Shape> kElemShapes = {Shape{1}, Shape{7, 5}, Shape{33, 130}, Shape{3, 7, 64}, Shape{300, 130}};

TEST_P(BackendOps, Activations) {
  LOOM_REQUIRE_OPS(OpKind::silu, OpKind::gelu, OpKind::gelu_erf);
  for (OpKind op : {OpKind::silu, OpKind::gelu, OpKind::gelu_erf})
    for (DType dt : kFloatTypes)
      for (const Shape& s : kElemShapes) {
        const std::string what = std::string(op_name(op)) + " " + dn(dt) + " " + s.str();
        OpCase oc(op, {{s, dt}});
        oc.fill_random(next_seed());
        const Outputs o = run_both(oc);
        expect_outputs_close(o, what);
        if (dt != DType::f32) expect_ulp(o.got[0], o.ref[0], oc.input(0), nullptr, what);
      }
}

// The gradients (x, dy) -> dx, and silu_mul and gelu_mul (gate, up) -> act(gate)·up of the same form.
TEST_P(BackendOps, ActivationGrads) {
  LOOM_REQUIRE_OPS(OpKind::silu_grad, OpKind::gelu_grad, OpKind::gelu_erf_grad, OpKind::silu_mul, OpKind::gelu_mul);
  for (OpKind op : {OpKind::silu_grad, OpKind::gelu_grad, OpKind::gelu_erf_grad, OpKind::silu_mul, OpKind::gelu_mul})
    for (DType dt : kFloatTypes)
      for (const Shape& s : kElemShapes) {
        const std::string what = std::string(op_name(op)) + " " + dn(dt) + " " + s.str();
        OpCase oc(op, {{s, dt}, {s, dt}});
        oc.fill_random(next_seed());
        const Outputs o = run_both(oc);
        expect_outputs_close(o, what);
        if (dt != DType::f32) expect_ulp(o.got[0], o.ref[0], oc.input(0), &oc.input(1), what);
      }
}

// (gate, up, dy) -> dgate, dup: each against the reference, dgate's ulps scaled by up and dy.
TEST_P(BackendOps, GatedActivationGrads) {
  LOOM_REQUIRE_OPS(OpKind::silu_mul_grad, OpKind::gelu_mul_grad);
  for (OpKind op : {OpKind::silu_mul_grad, OpKind::gelu_mul_grad})
    for (DType dt : kFloatTypes)
      for (const Shape& s : kElemShapes) {
        const std::string what = std::string(op_name(op)) + " " + dn(dt) + " " + s.str();
        OpCase oc(op, {{s, dt}, {s, dt}, {s, dt}});
        oc.fill_random(next_seed());
        const Outputs o = run_both(oc);
        expect_outputs_close(o, what);
        if (dt == DType::f32) continue;
        HostTensor up_dy = oc.input(1);
        for (int64_t i = 0; i < up_dy.numel(); ++i) up_dy.set(i, oc.input(1).get(i) * oc.input(2).get(i));
        expect_ulp(o.got[0], o.ref[0], oc.input(0), &up_dy, what + " dgate");
        expect_ulp(o.got[1], o.ref[1], oc.input(0), &oc.input(2), what + " dup");
      }
}

// Wide-range inputs (|x| up to ~12) reach the saturated tails of the activations.
TEST_P(BackendOps, ActivationTails) {
  LOOM_REQUIRE_OPS(OpKind::silu, OpKind::gelu, OpKind::gelu_erf, OpKind::silu_grad, OpKind::gelu_grad,
                   OpKind::gelu_erf_grad);
  for (OpKind op :
       {OpKind::silu, OpKind::gelu, OpKind::gelu_erf, OpKind::silu_grad, OpKind::gelu_grad, OpKind::gelu_erf_grad})
    for (DType dt : kFloatTypes) {
      const bool grad = op == OpKind::silu_grad || op == OpKind::gelu_grad || op == OpKind::gelu_erf_grad;
      std::vector<ValueDesc> ins = {{Shape{4001}, dt}};
      if (grad) ins.push_back({Shape{4001}, dt});
      OpCase oc(op, ins);
      oc.fill_random(next_seed());
      for (int64_t i = 0; i < 4001; ++i) oc.input(0).set(i, -12.f + 24.f * static_cast<float>(i) / 4000.f);
      const std::string what = std::string(op_name(op)) + " tails " + dn(dt);
      const Outputs o = run_both(oc);
      // Many tail values are tiny and differ in low bits (see kActivationAbsSlack): NMSE and ulps
      // only, no mismatch count.
      expect_nmse(o.got[0], o.ref[0], nmse_tol(dt), what);
      if (dt != DType::f32) expect_ulp(o.got[0], o.ref[0], oc.input(0), grad ? &oc.input(1) : nullptr, what);
    }
}

// ---- structure ops ---------------------------------------------------------------------------

TEST_P(BackendOps, DropoutBitExact) {
  LOOM_REQUIRE_OPS(OpKind::dropout);
  const std::vector<Shape> shapes = {Shape{1}, Shape{7, 5}, Shape{33, 130}, Shape{257, 130}};
  for (DType dt : kFloatTypes)
    for (float rate : {0.f, 0.1f, 0.5f, 0.9f})
      for (const Shape& s : shapes) {
        const std::string what = "dropout " + dn(dt) + " rate=" + std::to_string(rate) + " " + s.str();
        OpCase oc(OpKind::dropout, {{s, dt}}, DropoutAttrs{rate, 17});
        oc.fill_random(next_seed());
        const RunCtx rc{1234, 7, 2};
        const Outputs o = run_both(oc, rc);
        expect_bytes_equal(o.got[0], o.ref[0], what);
        if (rate == 0.5f && s.numel() > 1000) {
          int64_t zeros = 0;
          for (int64_t i = 0; i < s.numel(); ++i) zeros += o.got[0].get(i) == 0.f;
          EXPECT_GT(zeros, s.numel() / 3) << what;
          EXPECT_LT(zeros, 2 * s.numel() / 3) << what;
        }
      }
}

TEST_P(BackendOps, DropoutMaskIsKeyedByRunAndStream) {
  LOOM_REQUIRE_OPS(OpKind::dropout);
  auto zeros_of = [](const HostTensor& t) {
    std::vector<bool> z;
    for (int64_t i = 0; i < t.numel(); ++i) z.push_back(t.get(i) == 0.f);
    return z;
  };
  Backend& cpu = testing::under_test();
  OpCase a(OpKind::dropout, {{Shape{4096}, DType::f32}}, DropoutAttrs{0.5f, 3});
  OpCase b(OpKind::dropout, {{Shape{4096}, DType::f32}}, DropoutAttrs{0.5f, 4});
  a.fill_random(next_seed());
  b.input(0) = a.input(0);
  const auto m0 = zeros_of(a.run(cpu, {1, 2, 0})[0]);
  EXPECT_EQ(m0, zeros_of(a.run(cpu, {1, 2, 0})[0])) << "recompute must reproduce the mask";
  EXPECT_NE(m0, zeros_of(a.run(cpu, {1, 2, 1})[0])) << "minibatch must change the mask";
  EXPECT_NE(m0, zeros_of(a.run(cpu, {1, 3, 0})[0])) << "step must change the mask";
  EXPECT_NE(m0, zeros_of(b.run(cpu, {1, 2, 0})[0])) << "stream must change the mask";
}

TEST_P(BackendOps, CastBitExact) {
  LOOM_REQUIRE_OPS(OpKind::cast);
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::i32};
  for (DType from : all)
    for (DType to : all)
      for (const Shape& s : {Shape{7}, Shape{33, 130}, Shape{300, 130}}) {
        const std::string what = "cast " + dn(from) + "->" + dn(to) + " " + s.str();
        OpCase oc(OpKind::cast, {{s, from}}, DTypeAttrs{to});
        oc.fill_random(next_seed(), 1 << 26);  // int32 inputs beyond 2^24 exercise rounding
        if (from == DType::f32)                // some values beyond the f16 range and tiny ones (subnormals)
          for (int64_t i = 0; i < s.numel(); i += 3) oc.input(0).set(i, oc.input(0).get(i) * (i % 2 ? 1e5f : 1e-6f));
        const Outputs o = run_both(oc);
        expect_bytes_equal(o.got[0], o.ref[0], what);
      }
}

TEST_P(BackendOps, AddBitExact) {
  LOOM_REQUIRE_OPS(OpKind::add);
  struct AB {
    Shape a, b;
  };
  const std::vector<AB> shapes = {
      {Shape{1}, Shape{1}},         {Shape{7, 5}, Shape{5}},         {Shape{7, 5}, Shape{7, 5}},
      {Shape{33, 130}, Shape{130}}, {Shape{3, 7, 64}, Shape{7, 64}}, {Shape{300, 130}, Shape{130}},
      {Shape{300, 1}, Shape{1}},    {Shape{5, 3}, Shape{}}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i32})
    for (const AB& s : shapes) {
      const std::string what = "add " + dn(dt) + " " + s.a.str() + "+" + s.b.str();
      OpCase oc(OpKind::add, {{s.a, dt}, {s.b, dt}});
      oc.fill_random(next_seed(), int32_t{1} << 30);  // int32 sums up to 2^31 wrap around
      const Outputs o = run_both(oc);
      expect_bytes_equal(o.got[0], o.ref[0], what);
    }
}

// scale: x·round_d(factor) rounded once to x's dtype (16-bit products are exact in float): the
// definition, and the backend bit for bit against the reference.
TEST_P(BackendOps, ScaleBitExact) {
  LOOM_REQUIRE_OPS(OpKind::scale);
  const ScaleAttrs at{.factor = static_cast<float>(std::sqrt(640.0))};  // gemma-3-270m's normaliser
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape& sh : {Shape{1}, Shape{3, 7}, Shape{2, 5, 1000}}) {
      const std::string what = "scale " + dn(dt) + " " + sh.str();
      OpCase oc(OpKind::scale, {{sh, dt}}, at);
      oc.fill_random(next_seed());
      const Outputs o = run_both(oc);
      expect_bytes_equal(o.got[0], o.ref[0], what);
      const float factor = round_to(dt, at.factor);
      for (int64_t i = 0; i < sh.numel(); i += 3)
        ASSERT_EQ(o.ref[0].get(i), round_to(dt, oc.input(0).get(i) * factor)) << what << " element " << i;
    }
}

// A LoRA update u·V into columns of y (nn/lora.h): within the dense family's error bounds of the
// reference (the r products summed in another order), y unchanged outside the columns;
// take_columns, its cotangent, bit for bit.
TEST_P(BackendOps, AddLowRank) {
  LOOM_REQUIRE_OPS(OpKind::add_low_rank, OpKind::take_columns);
  struct Case {
    Shape y;
    int64_t rows, offset, width, r;
  };
  // y [rows, heads, W] or [rows, W]; the last one is wider than a block and above the parallel threshold.
  const std::vector<Case> cases = {{Shape{3, 2, 12}, 6, 0, 8, 4},
                                   {Shape{3, 2, 12}, 3, 8, 2, 5},
                                   {Shape{5, 7}, 5, 0, 7, 1},
                                   {Shape{40, 3, 2500}, 40, 100, 2300, 16},
                                   {Shape{9, 130}, 9, 0, 130, 70}};
  for (DType dt : kFloatTypes)
    for (bool vt : {false, true})
      for (const Case& c : cases) {
        const ColumnsAttrs at{.offset = c.offset, .width = c.width, .scale = 0.37f, .compute = dt, .transpose_v = vt};
        const int64_t N = c.y.numel() / c.rows / c.y.last() * c.width;
        const std::string what = dn(dt) + (vt ? " vT " : " ") + c.y.str() + " columns " + std::to_string(c.offset) +
                                 "+" + std::to_string(c.width) + " r=" + std::to_string(c.r);
        const std::vector<ValueDesc> ins = {
            {c.y, dt}, {Shape{c.rows, c.r}, dt}, {vt ? Shape{N, c.r} : Shape{c.r, N}, DType::f32}};
        check_multilinear(OpKind::add_low_rank, ins, at, dt, "add_low_rank " + what);
        OpCase oc(OpKind::add_low_rank, ins, at);
        oc.fill_random(next_seed());
        const Outputs o = run_both(oc);
        const int64_t W = c.y.last();
        for (int64_t i = 0; i < c.y.numel(); i += 7) {
          const int64_t col = i % W;
          if (col < c.offset || col >= c.offset + c.width) {
            EXPECT_EQ(o.got[0].get(i), oc.input(0).get(i)) << what;
          }
        }
        OpCase tc(OpKind::take_columns, {{c.y, dt}}, at);
        tc.fill_random(next_seed());
        const Outputs t = run_both(tc);
        expect_bytes_equal(t.got[0], t.ref[0], "take_columns " + what);
      }
}

// Adds, except that a first writer assigns in minibatch 0 (and adds in later minibatches).
TEST_P(BackendOps, GradAccumulateBitExact) {
  LOOM_REQUIRE_OPS(OpKind::grad_accumulate);
  for (const Shape& s : {Shape{1}, Shape{7, 5}, Shape{33, 130}, Shape{300, 130}})
    for (const bool first : {false, true})
      for (const uint32_t mb : {0u, 1u}) {
        OpCase oc(OpKind::grad_accumulate, {{s, DType::f32}, {s, DType::f32}}, GradAccumulateAttrs{first});
        oc.fill_random(next_seed());
        const Outputs o = run_both(oc, RunCtx{1, 2, mb});
        ASSERT_EQ(o.got.size(), 1u);
        const std::string what =
            "grad_accumulate " + s.str() + (first ? " first" : "") + " minibatch " + std::to_string(mb);
        expect_bytes_equal(o.got[0], o.ref[0], what);
        const int64_t last = s.numel() - 1;
        const float want = first && mb == 0 ? oc.input(1).get(last) : oc.input(0).get(last) + oc.input(1).get(last);
        EXPECT_EQ(o.got[0].get(last), want) << what;
      }
}

// reshape is a view: run it inside a small program (silu -> reshape -> silu) so the planner
// aliases it to an arena buffer, and check both backends agree on the result read through it.
TEST_P(BackendOps, ReshapeView) {
  LOOM_REQUIRE_OPS(OpKind::silu, OpKind::reshape);
  for (DType dt : kFloatTypes) {
    Graph g;
    const ValueId x = g.add_input("x", Shape{6, 35}, dt);
    const NodeId n0 = g.add_node(OpKind::silu, {x}, NoAttrs{}, "a", Phase::forward);
    const ValueId h = g.node(n0).out[0];
    const NodeId n1 = g.add_node(OpKind::reshape, {h}, ShapeAttrs{Shape{7, 2, 15}}, "r", Phase::forward);
    const ValueId v = g.node(n1).out[0];
    const NodeId n2 = g.add_node(OpKind::silu, {v}, NoAttrs{}, "b", Phase::forward);
    const ValueId y = g.node(n2).out[0];
    g.mark_output(v);
    g.mark_output(y);
    HostTensor in(Shape{6, 35}, dt);
    const PhiloxKey key = rng_key(next_seed(), 0, 0, 0);
    for (int64_t i = 0; i < in.numel(); ++i) in.set(i, rng_normal(key, static_cast<uint64_t>(i)));
    std::vector<HostTensor> results;
    ReferenceBackend ref;
    for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
      const MemoryPlan plan = plan_program(*be, g, default_schedule(g));
      ASSERT_EQ(plan.value_root[v], h);
      std::unique_ptr<Executor> ex;
      const Status st = Executor::create(*be, g, plan, &ex);
      ASSERT_TRUE(st.is_ok()) << st.message();
      EXPECT_EQ(ex->ptr(v), ex->ptr(h));
      ex->upload(x, in.bytes.data());
      ex->run({});
      for (ValueId o : {v, y}) {
        HostTensor t(g.value(o).shape, dt);
        ex->download(o, t.bytes.data());
        results.push_back(std::move(t));
      }
    }
    expect_nmse(results[0], results[2], nmse_tol(dt), "reshape view " + dn(dt));
    expect_nmse(results[1], results[3], nmse_tol(dt), "silu after reshape " + dn(dt));
  }
}

// reshape of a persistent value (a graph input): the executor resolves the view to the input's
// own buffer.
TEST_P(BackendOps, ReshapeOfInput) {
  LOOM_REQUIRE_OPS(OpKind::reshape, OpKind::gelu);
  Graph g;
  const ValueId x = g.add_input("x", Shape{6, 35}, DType::bf16);
  const ValueId v = g.node(g.add_node(OpKind::reshape, {x}, ShapeAttrs{Shape{210}}, "r", Phase::forward)).out[0];
  const ValueId y = g.node(g.add_node(OpKind::gelu, {v}, NoAttrs{}, "a", Phase::forward)).out[0];
  g.mark_output(y);
  HostTensor in(Shape{6, 35}, DType::bf16);
  const PhiloxKey key = rng_key(next_seed(), 0, 0, 0);
  for (int64_t i = 0; i < in.numel(); ++i) in.set(i, rng_normal(key, static_cast<uint64_t>(i)));
  std::vector<HostTensor> results;
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    std::unique_ptr<Executor> ex;
    const Status st = Executor::create(*be, g, plan_program(*be, g, default_schedule(g)), &ex);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(ex->ptr(v), ex->ptr(x));
    ex->upload(x, in.bytes.data());
    ex->run({});
    HostTensor t(Shape{210}, DType::bf16);
    ex->download(y, t.bytes.data());
    results.push_back(std::move(t));
  }
  expect_close(results[0], results[1], DType::bf16, "gelu of reshaped input");
}

// kOpInplace ops: the planner may give output 0 the buffer of a same-size input that dies at the
// node. Run each such kernel directly with the output aliasing that input and compare with the
// separate-buffer result, bit for bit.
TEST(CpuOps, InPlaceAliasing) {
  struct Case {
    OpKind op;
    std::vector<ValueDesc> ins;
    Attrs attrs;
    size_t alias;  // the input the output takes over
  };
  const Shape s{37, 130};  // several blocks, a ragged tail, above the parallel threshold
  std::vector<Case> cases;
  for (DType dt : kFloatTypes) {
    cases.push_back({OpKind::silu, {{s, dt}}, NoAttrs{}, 0});
    cases.push_back({OpKind::gelu, {{s, dt}}, NoAttrs{}, 0});
    cases.push_back({OpKind::gelu_erf, {{s, dt}}, NoAttrs{}, 0});
    cases.push_back({OpKind::scale, {{s, dt}}, ScaleAttrs{.factor = 5.3f}, 0});
    for (size_t k : {0u, 1u}) {
      cases.push_back({OpKind::silu_grad, {{s, dt}, {s, dt}}, NoAttrs{}, k});
      cases.push_back({OpKind::gelu_grad, {{s, dt}, {s, dt}}, NoAttrs{}, k});
      cases.push_back({OpKind::gelu_erf_grad, {{s, dt}, {s, dt}}, NoAttrs{}, k});
      cases.push_back({OpKind::silu_mul, {{s, dt}, {s, dt}}, NoAttrs{}, k});
      cases.push_back({OpKind::gelu_mul, {{s, dt}, {s, dt}}, NoAttrs{}, k});
    }
    for (size_t k : {0u, 1u, 2u})
      for (OpKind op : {OpKind::silu_mul_grad, OpKind::gelu_mul_grad})
        cases.push_back({op, {{s, dt}, {s, dt}, {s, dt}}, NoAttrs{}, k});
    cases.push_back({OpKind::dropout, {{s, dt}}, DropoutAttrs{0.3f, 5}, 0});
    cases.push_back({OpKind::dropout, {{s, dt}}, DropoutAttrs{0.f, 5}, 0});
    cases.push_back({OpKind::add, {{s, dt}, {s, dt}}, NoAttrs{}, 0});
    cases.push_back({OpKind::add, {{s, dt}, {s, dt}}, NoAttrs{}, 1});
    cases.push_back({OpKind::add, {{s, dt}, {Shape{130}, dt}}, NoAttrs{}, 0});
    cases.push_back({OpKind::rope, {{Shape{3, 37, 2, 32}, dt}, {Shape{37}, DType::i32}}, RopeAttrs{.group = 2}, 0});
    cases.push_back({OpKind::add_low_rank,
                     {{Shape{37, 2, 130}, dt}, {Shape{37, 6}, dt}, {Shape{6, 80}, DType::f32}},
                     ColumnsAttrs{.offset = 70, .width = 40, .scale = 0.5f, .compute = dt},
                     0});
  }
  cases.push_back({OpKind::add, {{s, DType::i32}, {s, DType::i32}}, NoAttrs{}, 1});
  cases.push_back({OpKind::cast, {{s, DType::f32}}, DTypeAttrs{DType::i32}, 0});
  cases.push_back({OpKind::cast, {{s, DType::i32}}, DTypeAttrs{DType::f32}, 0});
  cases.push_back({OpKind::cast, {{s, DType::bf16}}, DTypeAttrs{DType::f16}, 0});
  cases.push_back({OpKind::cast, {{s, DType::f16}}, DTypeAttrs{DType::bf16}, 0});
  cases.push_back({OpKind::cast, {{s, DType::f32}}, DTypeAttrs{DType::f32}, 0});
  std::vector<OpKind> covered;
  for (Case& c : cases) {
    covered.push_back(c.op);
    const std::string what =
        std::string(op_name(c.op)) + " " + dn(c.ins[0].dtype) + " aliasing input " + std::to_string(c.alias);
    OpCase oc(c.op, c.ins, c.attrs);
    oc.fill_random(next_seed(), 1 << 20);
    const RunCtx rc{9, 1, 0};
    CpuBackend cpu;
    const std::vector<HostTensor> expected = oc.run(cpu, rc);
    ASSERT_EQ(expected[0].bytes.size(), oc.input(c.alias).bytes.size()) << what;
    // The inputs' copies, then the buffers of the outputs after the first (silu_mul_grad's dup).
    std::vector<std::vector<unsigned char>> bufs;
    std::vector<TensorArg> in, out;
    for (size_t k = 0; k < c.ins.size(); ++k) bufs.push_back(oc.input(k).bytes);
    for (size_t k = 1; k < expected.size(); ++k) bufs.emplace_back(expected[k].bytes.size());
    for (size_t k = 0; k < c.ins.size(); ++k) in.push_back(TensorArg{bufs[k].data(), c.ins[k].shape, c.ins[k].dtype});
    for (size_t k = 0; k < expected.size(); ++k)
      out.push_back(
          TensorArg{bufs[k == 0 ? c.alias : c.ins.size() + k - 1].data(), expected[k].shape, expected[k].dtype});
    const int threads = omp_get_max_threads();
    std::vector<std::byte> ws(static_cast<size_t>(cpu.workspace_bytes(oc.graph(), oc.node(), threads)));
    cpu.run(KernelArgs{oc.node(), in, out, rc, Workspace{ws.data(), static_cast<int64_t>(ws.size()), threads}});
    for (size_t k = 0; k < expected.size(); ++k) {
      HostTensor got(expected[k].shape, expected[k].dtype);
      got.bytes = bufs[k == 0 ? c.alias : c.ins.size() + k - 1];
      expect_bytes_equal(got, expected[k], what + " out" + std::to_string(k));
    }
  }
  for (int i = 0; i < kNumOps; ++i) {
    const auto op = static_cast<OpKind>(i);
    if (!(op_info(op).flags & kOpInplace)) continue;
    EXPECT_NE(std::find(covered.begin(), covered.end(), op), covered.end())
        << op_name(op) << " is kOpInplace but has no aliasing case here";
  }
}

// ---- log_softmax and losses -----------------------------------------------------------------

TEST_P(BackendOps, LogSoftmax) {
  LOOM_REQUIRE_OPS(OpKind::log_softmax);
  for (DType dt : kFloatTypes)
    for (int64_t R : kRows)
      for (int64_t C : kWidths) {
        const std::string what = "log_softmax " + dn(dt) + " [" + std::to_string(R) + "," + std::to_string(C) + "]";
        OpCase oc(OpKind::log_softmax, {{Shape{R, C}, dt}});
        oc.fill_random(next_seed());
        expect_outputs_close(run_both(oc), what);
      }
}

TEST_P(BackendOps, LogSoftmaxGrad) {
  LOOM_REQUIRE_OPS(OpKind::log_softmax_grad);
  for (DType dt : kFloatTypes)
    for (int64_t R : kRows)
      for (int64_t C : kWidths) {
        const std::string what =
            "log_softmax_grad " + dn(dt) + " [" + std::to_string(R) + "," + std::to_string(C) + "]";
        OpCase oc(OpKind::log_softmax_grad, {{Shape{R, C}, dt}, {Shape{R, C}, dt}});
        oc.fill_random(next_seed());
        // y as a real log_softmax output (≤ 0), so exp(y) is a probability.
        for (int64_t i = 0; i < R * C; ++i) oc.input(0).set(i, -std::fabs(oc.input(0).get(i)) * 3.f);
        expect_outputs_close(run_both(oc), what);
      }
}

std::vector<Shape> logit_shapes() {
  std::vector<Shape> s;
  for (int64_t R : kRows)
    for (int64_t V : kWidths) s.push_back(Shape{R, V});
  s.push_back(Shape{3, 7, 130});
  s.push_back(Shape{64, 1000});
  return s;
}

// Low-precision logits are widened exactly inside the loss ops (a bf16 model's loss reads its
// bf16 logits), and the gradient is rounded once to the logits' dtype.
constexpr DType kLogitDTypes[] = {DType::f32, DType::bf16, DType::f16};

TEST_P(BackendOps, CrossEntropy) {
  LOOM_REQUIRE_OPS(OpKind::cross_entropy);
  for (DType dt : kLogitDTypes)
    for (const Shape& s : logit_shapes()) {
      OpCase oc(OpKind::cross_entropy, {{s, dt}, {s.drop_last(), DType::i32}});
      oc.fill_random(next_seed(), static_cast<int32_t>(s.last()));
      const Outputs o = run_both(oc);
      // A scalar computed in f32 from the same (widened) values: NMSE 1e-12 is a relative error
      // of 1e-6 whatever the logits' dtype.
      expect_nmse(o.got[0], o.ref[0], 1e-12, "cross_entropy " + s.str() + " " + dtype_name(dt));
    }
}

TEST_P(BackendOps, CrossEntropyGrad) {
  LOOM_REQUIRE_OPS(OpKind::cross_entropy_grad);
  for (DType dt : kLogitDTypes)
    for (const Shape& s : logit_shapes()) {
      OpCase oc(OpKind::cross_entropy_grad, {{s, dt}, {s.drop_last(), DType::i32}, {Shape{}, DType::f32}});
      oc.fill_random(next_seed(), static_cast<int32_t>(s.last()));
      const Outputs o = run_both(oc);
      ASSERT_EQ(o.got[0].dtype, dt) << "the gradient has the logits' dtype";
      expect_outputs_close(o, "cross_entropy_grad " + s.str() + " " + dtype_name(dt));
    }
}

// The fused widening gives bit for bit what a float32 cast of the logits followed by the f32 op
// (and, for the gradient, a cast of it back) gives, on the backend under test: the program a bf16 model
// ran before the loss read its logits itself.
TEST_P(BackendOps, LossOnLowPrecisionLogitsEqualsCastThenF32) {
  LOOM_REQUIRE_OPS(OpKind::cross_entropy_grad);
  Backend& cpu = testing::under_test();
  for (DType dt : {DType::bf16, DType::f16})
    for (const Shape& s : logit_shapes()) {
      OpCase low(OpKind::cross_entropy_grad, {{s, dt}, {s.drop_last(), DType::i32}, {Shape{}, DType::f32}});
      low.fill_random(next_seed(), static_cast<int32_t>(s.last()));
      OpCase wide(OpKind::cross_entropy_grad, {{s, DType::f32}, {s.drop_last(), DType::i32}, {Shape{}, DType::f32}});
      for (int64_t i = 0; i < s.numel(); ++i) wide.input(0).set(i, low.input(0).get(i));
      for (int64_t i = 0; i < s.drop_last().numel(); ++i) wide.input(1).set_i32(i, low.input(1).get_i32(i));
      wide.input(2).set(0, low.input(2).get(0));
      const HostTensor g_low = low.run(cpu)[0];
      const HostTensor g_wide = wide.run(cpu)[0];
      for (int64_t i = 0; i < s.numel(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(g_low.get(i)), std::bit_cast<uint32_t>(round_to(dt, g_wide.get(i))))
            << s.str() << " " << dtype_name(dt) << " element " << i;
    }
}

TEST_P(BackendOps, Accuracy) {
  LOOM_REQUIRE_OPS(OpKind::accuracy);
  for (DType dt : kLogitDTypes)
    for (const Shape& s : logit_shapes()) {
      OpCase oc(OpKind::accuracy, {{s, dt}, {s.drop_last(), DType::i32}});
      oc.fill_random(next_seed(), static_cast<int32_t>(s.last()));
      const Outputs o = run_both(oc);
      expect_bytes_equal(o.got[0], o.ref[0], "accuracy " + s.str() + " " + dtype_name(dt));
    }
}

// Ties (the first maximum wins) and NaNs (a NaN is the maximum, the first one winning).
TEST_P(BackendOps, AccuracyTiesAndNaN) {
  LOOM_REQUIRE_OPS(OpKind::accuracy);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {1,  3,   3,  0,    // tie: argmax 1
                                     2,  2,   2,  2,    // all equal: 0
                                     0,  nan, 5,  nan,  // first NaN: 1
                                     -1, -2,  -3, -4};
  const std::vector<int32_t> labels = {1, 0, 1, 0};  // all correct
  for (int flip = 0; flip < 2; ++flip) {
    OpCase oc(OpKind::accuracy, {{Shape{4, 4}, DType::f32}, {Shape{4}, DType::i32}});
    for (int64_t i = 0; i < 16; ++i) oc.input(0).set(i, logits[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < 4; ++i) oc.input(1).set_i32(i, labels[static_cast<size_t>(i)] + flip);
    const Outputs o = run_both(oc);
    EXPECT_EQ(o.got[0].get_i32(0), flip ? 0 : 4);
    expect_bytes_equal(o.got[0], o.ref[0], "accuracy ties/NaN");
  }
}

// The same rules on rows longer than the kernel's search chunks (64), one width with a short last
// chunk and one of whole chunks: a tie across chunks, a NaN in the last chunk after the maximum,
// a row of −inf, −0 and +0 on either side of a chunk bound, the maximum last, a NaN in an earlier
// chunk than a larger number.
TEST_P(BackendOps, AccuracyTiesAndNaNInLongRows) {
  LOOM_REQUIRE_OPS(OpKind::accuracy);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  constexpr int64_t kRows = 6;
  for (const int64_t V : {150, 128}) {
    std::vector<float> x(static_cast<size_t>(kRows * V));
    for (int64_t i = 0; i < kRows * V; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 37) / 37.f;
    const auto at = [&](int64_t r, int64_t c) -> float& { return x[static_cast<size_t>(r * V + c)]; };
    at(0, 70) = at(0, V - 20) = 5;
    at(1, 3) = 9;
    at(1, V - 1) = nan;
    for (int64_t c = 0; c < V; ++c) at(2, c) = at(3, c) = -inf;
    at(3, 63) = -0.f;
    at(3, 64) = 0.f;
    at(4, V - 1) = 2;
    at(5, 10) = nan;
    at(5, 100) = 9;
    const std::vector<int32_t> argmax = {70, static_cast<int32_t>(V - 1), 0, 63, static_cast<int32_t>(V - 1), 10};
    for (int flip = 0; flip < 2; ++flip) {
      OpCase oc(OpKind::accuracy, {{Shape{kRows, V}, DType::f32}, {Shape{kRows}, DType::i32}});
      for (int64_t i = 0; i < kRows * V; ++i) oc.input(0).set(i, x[static_cast<size_t>(i)]);
      for (int64_t r = 0; r < kRows; ++r)
        oc.input(1).set_i32(r, static_cast<int32_t>((argmax[static_cast<size_t>(r)] + flip) % V));
      const Outputs o = run_both(oc);
      EXPECT_EQ(o.got[0].get_i32(0), flip ? 0 : kRows) << "V = " << V;
      expect_bytes_equal(o.got[0], o.ref[0], "accuracy, long rows, V = " + std::to_string(V));
    }
  }
}

// A negative label (the data's kIgnoreLabel: no training target) takes its row out of all three
// loss ops: the loss and the correct count equal those of the other rows alone (a case holding
// only them, run on the same backend), and the gradient is zero in the ignored rows and the same
// bits as the kept-rows case elsewhere.
TEST_P(BackendOps, LossOpsIgnoreNegativeLabels) {
  LOOM_REQUIRE_OPS(OpKind::cross_entropy, OpKind::cross_entropy_grad, OpKind::accuracy);
  Backend& be = testing::under_test();
  constexpr int64_t R = 42, V = 33;
  const auto ignored = [](int64_t r) { return r % 3 == 1 || r >= 38; };
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < R; ++r)
    if (!ignored(r)) kept.push_back(r);
  const auto K = static_cast<int64_t>(kept.size());
  for (DType dt : kLogitDTypes) {
    OpCase all(OpKind::cross_entropy_grad, {{Shape{R, V}, dt}, {Shape{R}, DType::i32}, {Shape{}, DType::f32}});
    all.fill_random(next_seed(), static_cast<int32_t>(V));
    OpCase few(OpKind::cross_entropy_grad, {{Shape{K, V}, dt}, {Shape{K}, DType::i32}, {Shape{}, DType::f32}});
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t c = 0; c < V; ++c) few.input(0).set(k * V + c, all.input(0).get(kept[k] * V + c));
      few.input(1).set_i32(k, all.input(1).get_i32(kept[k]));
    }
    // Any negative label is ignored; a large logit would dominate the sums if these rows counted.
    for (int64_t r = 0; r < R; ++r)
      if (ignored(r)) {
        all.input(0).set(r * V + 5, 100.f);
        all.input(1).set_i32(r, r == R - 1 ? -7 : -1);
      }
    few.input(2).set(0, 0.375f);
    all.input(2).set(0, 0.375f);
    const std::string what = std::string(" on ") + dtype_name(dt) + " logits";
    // The gradient.
    const Outputs o = run_both(all);
    expect_outputs_close(o, "cross_entropy_grad with ignored rows" + what);
    const HostTensor g_few = few.run(be)[0];
    for (int64_t r = 0, k = 0; r < R; ++r)
      for (int64_t c = 0; c < V; ++c) {
        const float want = ignored(r) ? 0.f : g_few.get(k * V + c);
        ASSERT_EQ(std::bit_cast<uint32_t>(o.got[0].get(r * V + c)), std::bit_cast<uint32_t>(want))
            << "row " << r << " column " << c << what;
        if (!ignored(r) && c == V - 1) ++k;
      }
    // The loss and the correct count, from the same inputs.
    for (OpKind op : {OpKind::cross_entropy, OpKind::accuracy}) {
      OpCase a(op, {{Shape{R, V}, dt}, {Shape{R}, DType::i32}});
      OpCase f(op, {{Shape{K, V}, dt}, {Shape{K}, DType::i32}});
      for (int i = 0; i < 2; ++i) {
        a.input(static_cast<size_t>(i)).bytes = all.input(static_cast<size_t>(i)).bytes;
        f.input(static_cast<size_t>(i)).bytes = few.input(static_cast<size_t>(i)).bytes;
      }
      const Outputs oa = run_both(a);
      const HostTensor of = f.run(be)[0];
      if (op == OpKind::accuracy) {
        expect_bytes_equal(oa.got[0], oa.ref[0], "accuracy with ignored rows" + what);
        EXPECT_EQ(oa.got[0].get_i32(0), of.get_i32(0)) << what;
      } else {
        expect_nmse(oa.got[0], oa.ref[0], 1e-12, "cross_entropy with ignored rows" + what);
        EXPECT_EQ(oa.got[0].get(0), of.get(0)) << what;
      }
    }
  }
}

// ---- linear_cross_entropy: the head and the loss fused ---------------------------------------

// Rows, width, vocabulary and chunk: chunks that do not divide V (the last one narrower), one
// wider than V, one column each, and a vocabulary of several GEMM tiles.
struct HeadShape {
  int64_t R, C, V, chunk;
};
constexpr HeadShape kHeadShapes[] = {{37, 24, 100, 32}, {5, 16, 70, 128}, {9, 8, 13, 1}, {64, 96, 1000, 384}};

// A head's bias: none, float32 (a trained parameter) or in the compute dtype (a narrowed one).
enum class HeadBias { none, f32, compute };
std::optional<DType> bias_dtype(HeadBias b, DType c) {
  if (b == HeadBias::none) return std::nullopt;
  return b == HeadBias::f32 ? DType::f32 : c;
}

Shape head_kernel(const HeadShape& h, bool tied) { return tied ? Shape{h.V, h.C} : Shape{h.C, h.V}; }
std::string head_what(const char* op, const HeadShape& h, DType c, bool tied, HeadBias b) {
  const char* bias = b == HeadBias::none ? "" : b == HeadBias::f32 ? " bias f32" : " bias in c";
  return std::string(op) + " c=" + dn(c) + (tied ? " tied" : " untied") + bias + " R=" + std::to_string(h.R) +
         " C=" + std::to_string(h.C) + " V=" + std::to_string(h.V) + " chunk=" + std::to_string(h.chunk);
}
// Every third row's label ignored (kIgnoreLabel, -1).
void ignore_every_third(HostTensor& labels) {
  for (int64_t r = 1; r < labels.numel(); r += 3) labels.set_i32(r, -1);
}
// The forward case of h (x in c, the bias b), random, with every third label ignored.
OpCase head_forward(const HeadShape& h, DType c, bool tied, HeadBias b) {
  std::vector<ValueDesc> in = {{Shape{h.R, h.C}, c}, {head_kernel(h, tied), DType::f32}, {Shape{h.R}, DType::i32}};
  if (const auto bd = bias_dtype(b, c)) in.push_back({Shape{h.V}, *bd});
  OpCase oc(OpKind::linear_cross_entropy, in,
            LinearCrossEntropyAttrs{.compute = c, .transpose_w = tied, .chunk = h.chunk});
  oc.fill_random(next_seed(), static_cast<int32_t>(h.V));
  ignore_every_third(oc.input(2));
  return oc;
}

// Loss, correct and lse against the reference's whole rows in double. The logits are rounded to
// the compute dtype as dense rounds them, so with bfloat16 a logit may round to the neighbouring
// value (an f32 product summed in another order) and a near tie for the maximum change the count.
// With a bias (float32, or narrowed to the compute dtype), dense's: round_c(round_c(x·w) + round_c(b)).
TEST_P(BackendOps, LinearCrossEntropy) {
  LOOM_REQUIRE_OPS(OpKind::linear_cross_entropy);
  for (DType c : {DType::f32, DType::bf16})
    for (bool tied : {false, true})
      for (HeadBias b : {HeadBias::none, HeadBias::f32, HeadBias::compute})
        for (const HeadShape& h : kHeadShapes) {
          const std::string what = head_what("linear_cross_entropy", h, c, tied, b);
          OpCase oc = head_forward(h, c, tied, b);
          const Outputs o = run_both(oc);
          const double tol = c == DType::f32 ? 1e-12 : 1e-8;
          expect_nmse(o.got[0], o.ref[0], tol, what + " loss");
          expect_nmse(o.got[2], o.ref[2], tol, what + " lse");
          EXPECT_NEAR(o.got[1].get_i32(0), o.ref[1].get_i32(0), c == DType::f32 ? 0 : 1) << what << " correct";
          EXPECT_GT(o.ref[0].get(0), 0.0) << what;
        }
}

// The backward case of forward case `fwd` (with a float32 bias when `biased`):
// linear_cross_entropy_grad (the kernel's gradient, its previous contents random, first; with a bias
// linear_cross_entropy_grad_with_bias, the bias's cotangent its second output) or, with `frozen`,
// linear_cross_entropy_grad_input, from the lse the reference's forward gives and a loss cotangent
// of 0.37.
OpCase head_backward(OpCase& fwd, const HeadShape& h, DType c, bool tied, bool biased, bool assign, bool frozen) {
  ReferenceBackend ref;
  const HostTensor lse = fwd.run(ref).at(2);
  std::vector<ValueDesc> in = {{Shape{h.R, h.C}, c},
                               {head_kernel(h, tied), DType::f32},
                               {Shape{h.R}, DType::i32},
                               {Shape{h.R}, DType::f32},
                               {Shape{}, DType::f32}};
  if (biased) in.push_back({Shape{h.V}, DType::f32});
  if (!frozen) in.insert(in.begin(), ValueDesc{head_kernel(h, tied), DType::f32});
  const OpKind op = frozen   ? OpKind::linear_cross_entropy_grad_input
                    : biased ? OpKind::linear_cross_entropy_grad_with_bias
                             : OpKind::linear_cross_entropy_grad;
  OpCase oc(op, in,
            LinearCrossEntropyAttrs{
                .compute = c, .transpose_w = tied, .chunk = h.chunk, .assign_in_first_minibatch = assign});
  oc.fill_random(next_seed());
  const size_t x_at = frozen ? 0 : 1;
  for (size_t k = 0; k < 3; ++k) oc.input(x_at + k).bytes = fwd.input(k).bytes;
  oc.input(x_at + 3).bytes = lse.bytes;
  oc.input(x_at + 4).set(0, 0.37f);
  if (biased) oc.input(x_at + 5).bytes = fwd.input(3).bytes;
  return oc;
}

// The kernel's gradient (assigned and accumulated), dx and (with a bias,
// linear_cross_entropy_grad_with_bias) the bias's cotangent against the reference, from the lse the
// reference's forward gives, with every third label ignored.
TEST_P(BackendOps, LinearCrossEntropyGrad) {
  LOOM_REQUIRE_OPS(OpKind::linear_cross_entropy_grad, OpKind::linear_cross_entropy_grad_with_bias);
  for (DType c : {DType::f32, DType::bf16})
    for (bool tied : {false, true})
      for (bool biased : {false, true})
        for (bool assign : {true, false})
          for (const HeadShape& h : kHeadShapes) {
            const HeadBias b = biased ? HeadBias::f32 : HeadBias::none;
            const std::string what = head_what("linear_cross_entropy_grad", h, c, tied, b) + (assign ? " assign" : "");
            OpCase fwd = head_forward(h, c, tied, b);
            OpCase oc = head_backward(fwd, h, c, tied, biased, assign, /*frozen=*/false);
            const Outputs o = run_both(oc);
            ASSERT_EQ(o.got.size(), biased ? 3u : 2u) << what;
            expect_nmse(o.got[0], o.ref[0], nmse_tol(c), what + " kernel gradient");
            expect_close(o.got[1], o.ref[1], c, what + " dx");
            if (c != DType::f32) expect_few_mismatches(o.got[1], o.ref[1], what + " dx");
            if (biased) expect_close(o.got[2], o.ref[2], c, what + " bias gradient");
            for (int64_t r = 1; r < h.R; r += 3)
              for (int64_t k = 0; k < h.C; ++k)
                ASSERT_EQ(o.got[1].get(r * h.C + k), 0.f) << what << ": ignored row " << r;
          }
}

// A frozen kernel's backward (a LoRA run's head): dx against the reference, and bit for bit the dx
// linear_cross_entropy_grad gives on the same backend (the same products, the kernel's gradient
// left out).
TEST_P(BackendOps, LinearCrossEntropyGradInput) {
  LOOM_REQUIRE_OPS(OpKind::linear_cross_entropy_grad_input, OpKind::linear_cross_entropy_grad,
                   OpKind::linear_cross_entropy_grad_with_bias);
  for (DType c : {DType::f32, DType::bf16})
    for (bool tied : {false, true})
      for (bool biased : {false, true})
        for (const HeadShape& h : kHeadShapes) {
          const HeadBias b = biased ? HeadBias::f32 : HeadBias::none;
          const std::string what = head_what("linear_cross_entropy_grad_input", h, c, tied, b);
          OpCase fwd = head_forward(h, c, tied, b);
          OpCase oc = head_backward(fwd, h, c, tied, biased, false, /*frozen=*/true);
          const Outputs o = run_both(oc);
          expect_close(o.got[0], o.ref[0], c, what + " dx");
          if (c != DType::f32) expect_few_mismatches(o.got[0], o.ref[0], what + " dx");
          for (int64_t r = 1; r < h.R; r += 3)
            for (int64_t k = 0; k < h.C; ++k)
              ASSERT_EQ(o.got[0].get(r * h.C + k), 0.f) << what << ": ignored row " << r;
          OpCase trained = head_backward(fwd, h, c, tied, biased, false, /*frozen=*/false);
          for (size_t k = 0; k < (biased ? 6u : 5u); ++k) trained.input(k + 1).bytes = oc.input(k).bytes;
          EXPECT_EQ(trained.run(testing::under_test()).at(1).bytes, o.got[0].bytes) << what;
        }
}

// ---- fused optimizer ------------------------------------------------------------------------

struct OptState {
  std::vector<std::vector<float>> p, g, m, v;
  std::vector<float> wd;
  std::vector<OptimTensor> tensors() {
    std::vector<OptimTensor> ts;
    for (size_t i = 0; i < p.size(); ++i)
      ts.push_back({p[i].data(), g[i].data(), m[i].data(), v[i].data(), static_cast<int64_t>(p[i].size()), wd[i]});
    return ts;
  }
};

OptState make_opt_state(uint64_t seed) {
  OptState s;
  const PhiloxKey key = rng_key(seed, 0, 0, 0);
  uint64_t k = 0;
  const int64_t sizes[] = {1, 7, 33, 130, 0, 20000, 40001};
  for (size_t t = 0; t < std::size(sizes); ++t) {
    const auto n = static_cast<size_t>(sizes[t]);
    s.p.emplace_back(n);
    s.g.emplace_back(n);
    s.m.emplace_back(n);
    s.v.emplace_back(n);
    for (size_t i = 0; i < n; ++i) {
      s.p[t][i] = rng_normal(key, k++);
      s.g[t][i] = rng_normal(key, k++) * 0.1f;
      s.m[t][i] = rng_normal(key, k++) * 0.01f;
      s.v[t][i] = std::fabs(rng_normal(key, k++)) * 1e-4f;
    }
    s.wd.push_back(t % 2 ? 0.01f : 0.f);
  }
  return s;
}

// Optimizer state is compared element by element: |cpu − ref| ≤ 1e-6·(|ref| + floor), the floor
// being the scale of that array's terms (params ~1, first moments ~1e-2, second moments ~1e-4):
// b1·mu + (1−b1)·g can cancel, and a relative check on a near-zero element would be meaningless.
// Params additionally may differ by 1e-4 of their total movement (`before` = the params before
// the updates): the CPU computes adam's bias corrections 1 − b^count in float as optax does, the
// reference in double, and for b2 = 0.999 at small counts that subtraction keeps only ~4-5 digits,
// so the two updates differ by up to ~1e-5 relative.
void expect_state_close(const std::vector<float>& cpu, const std::vector<float>& ref, double floor,
                        const std::string& what, const std::vector<float>* before = nullptr) {
  ASSERT_EQ(cpu.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(static_cast<double>(cpu[i]) - ref[i]) <=
          1e-6 * (std::fabs(ref[i]) + floor) + (before ? 1e-4 * std::fabs(ref[i] - (*before)[i]) : 0.0))) {
      ADD_FAILURE() << what << ": element " << i << " cpu " << cpu[i] << " ref " << ref[i];
      return;
    }
}

TEST_P(BackendOptimizer, GradSqNorm) {
  OptState s = make_opt_state(next_seed());
  Backend& cpu = testing::under_test();
  ReferenceBackend ref;
  const auto ts = s.tensors();
  const double a = cpu.grad_sq_norm(ts), b = ref.grad_sq_norm(ts);
  EXPECT_NEAR(a, b, 1e-6 * b);
  // A non-finite gradient makes the norm non-finite.
  s.g[5][123] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(cpu.grad_sq_norm(s.tensors())));
  s.g[5][123] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(std::isfinite(cpu.grad_sq_norm(s.tensors())));
}

TEST_P(BackendOptimizer, AdamMatchesReference) {
  for (float eps_root : {0.f, 1e-8f})
    for (float grad_scale : {1.f, 0.25f}) {
      OptState a = make_opt_state(next_seed());
      OptState b = a;
      const OptState before = a;
      Backend& cpu = testing::under_test();
      ReferenceBackend ref;
      for (int64_t count = 1; count <= 4; ++count) {
        OptimHyper h;
        h.lr = 1e-2f;
        h.eps_root = eps_root;
        h.grad_scale = grad_scale;
        h.count = count;
        cpu.optimizer_update(a.tensors(), h);
        ref.optimizer_update(b.tensors(), h);
      }
      for (size_t t = 0; t < a.p.size(); ++t) {
        const std::string what = "tensor " + std::to_string(t) + " eps_root=" + std::to_string(eps_root) +
                                 " scale=" + std::to_string(grad_scale);
        expect_state_close(a.p[t], b.p[t], 1.0, "param " + what, &before.p[t]);
        expect_state_close(a.m[t], b.m[t], 1e-2, "mu " + what);
        expect_state_close(a.v[t], b.v[t], 1e-4, "nu " + what);
      }
    }
}

TEST_P(BackendOptimizer, SgdMatchesReference) {
  for (float momentum : {0.f, 0.9f})
    for (bool nesterov : {false, true}) {
      if (momentum == 0.f && nesterov) continue;
      OptState a = make_opt_state(next_seed());
      OptState b = a;
      Backend& cpu = testing::under_test();
      ReferenceBackend ref;
      for (int64_t count = 1; count <= 3; ++count) {
        OptimHyper h;
        h.kind = OptimKind::sgd;
        h.lr = 0.1f;
        h.momentum = momentum;
        h.nesterov = nesterov;
        h.grad_scale = 0.5f;
        h.count = count;
        std::vector<OptimTensor> ta = a.tensors(), tb = b.tensors();
        if (momentum == 0.f)  // plain sgd keeps no state
          for (auto* ts : {&ta, &tb})
            for (OptimTensor& t : *ts) t.mu = t.nu = nullptr;
        cpu.optimizer_update(ta, h);
        ref.optimizer_update(tb, h);
      }
      for (size_t t = 0; t < a.p.size(); ++t) {
        const std::string what =
            "tensor " + std::to_string(t) + " momentum=" + std::to_string(momentum) + (nesterov ? " nesterov" : "");
        expect_state_close(a.p[t], b.p[t], 1.0, "param " + what);
        expect_state_close(a.m[t], b.m[t], 1e-1, "trace " + what);
      }
    }
}

// ---- thread-count independence ---------------------------------------------------------------

TEST(CpuThreads, LayerNormGrad) {
  for (OpKind op : {OpKind::layer_norm_grad, OpKind::rms_norm_grad})
    for (DType dt : {DType::f32, DType::bf16}) {
      OpCase oc(op, norm_grad_inputs(op, 300, 256, dt, dt), LayerNormAttrs{1e-6f, dt});
      oc.fill_random(next_seed());
      expect_thread_invariant(oc, std::string(op_name(op)) + " " + dn(dt));
    }
}

TEST(CpuThreads, QkNormGrad) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const QkShape q{4, 64, 2, 2, 64};
    OpCase oc(OpKind::qk_norm_grad,
              {{q.qkv(), dt},
               {q.qkv(), dt},
               {Shape{q.D}, DType::f32},
               {Shape{q.D}, DType::f32},
               {Shape{q.B, q.T, q.S, q.G + 1}, DType::f32}},
              QkNormAttrs{.eps = 1e-6f, .group = 2});
    oc.fill_random(next_seed());
    expect_thread_invariant(oc, "qk_norm_grad " + dn(dt));
  }
}

TEST(CpuThreads, SumLeading) {
  for (const Shape& s : {Shape{2000, 100}, Shape{100000}, Shape{64, 2048}}) {
    OpCase oc(OpKind::sum_leading, {{s, DType::f32}}, ReduceAttrs{1, DType::f32});
    oc.fill_random(next_seed());
    expect_thread_invariant(oc, "sum_leading " + s.str());
  }
}

TEST(CpuThreads, CrossEntropy) {
  OpCase oc(OpKind::cross_entropy, {{Shape{512, 100}, DType::f32}, {Shape{512}, DType::i32}});
  oc.fill_random(next_seed(), 100);
  expect_thread_invariant(oc, "cross_entropy");
}

TEST(CpuThreads, Dense) {
  for (DType c : kFloatTypes) {
    OpCase oc(OpKind::dense, {{Shape{256, 300}, c}, {Shape{300, 200}, DType::f32}, {Shape{200}, DType::f32}},
              DenseAttrs{c});
    oc.fill_random(next_seed());
    expect_thread_invariant(oc, "dense " + dn(c));
    OpCase gi(OpKind::dense_grad_input, {{Shape{256, 200}, c}, {Shape{300, 200}, DType::f32}}, DenseGradAttrs{c, c});
    gi.fill_random(next_seed());
    expect_thread_invariant(gi, "dense_grad_input " + dn(c));
    for (bool assign : {true, false}) {
      OpCase gw(OpKind::dense_grad_weight, {{Shape{300, 200}, DType::f32}, {Shape{256, 300}, c}, {Shape{256, 200}, c}},
                DenseGradWeightAttrs{c, false, assign});
      gw.fill_random(next_seed());
      expect_thread_invariant(gw, "dense_grad_weight " + dn(c) + (assign ? " assign" : " accumulate"));
    }
  }
  // One row (decoding: simd::gemv over column tiles, or K chunks for a long K), in both layouts of W.
  for (DType c : kFloatTypes)
    for (bool wt : {false, true})
      for (int64_t K : {300, 1100}) {
        OpCase row(OpKind::dense, {{Shape{1, K}, c}, {wt ? Shape{1100, K} : Shape{K, 1100}, DType::f32}},
                   DenseAttrs{c, wt});
        row.fill_random(next_seed());
        expect_thread_invariant(row, "dense one row " + dn(c) + (wt ? " wT" : "") + " K=" + std::to_string(K));
      }
  // Few rows, many columns: the tile grid splits N.
  OpCase wide(OpKind::dense, {{Shape{64, 300}, DType::f32}, {Shape{300, 1100}, DType::f32}}, DenseAttrs{DType::f32});
  wide.fill_random(next_seed());
  expect_thread_invariant(wide, "dense wide");
}

// The GEMM tiles run OpenBLAS single-threaded by lowering nthreads-var inside our own parallel
// region; that must not leak out to the caller, for one tile (inactive region) or many.
TEST(CpuThreads, DenseLeavesThreadCountAlone) {
  ThreadCount tc(2);
  for (const Shape& xs : {Shape{4, 8}, Shape{512, 300}}) {
    OpCase oc(OpKind::dense, {{xs, DType::f32}, {Shape{xs[1], 300}, DType::f32}}, DenseAttrs{DType::f32});
    oc.fill_random(next_seed());
    CpuBackend cpu;
    oc.run(cpu);
    EXPECT_EQ(omp_get_max_threads(), 2) << xs.str();
  }
}

TEST(CpuThreads, Optimizer) {
  std::vector<OptState> states;
  std::vector<double> norms;
  const OptState init = make_opt_state(next_seed());
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    CpuBackend cpu;
    OptState s = init;
    norms.push_back(cpu.grad_sq_norm(s.tensors()));
    OptimHyper h;
    h.count = 3;
    cpu.optimizer_update(s.tensors(), h);
    states.push_back(std::move(s));
  }
  for (size_t r = 1; r < states.size(); ++r) {
    EXPECT_EQ(std::bit_cast<uint64_t>(norms[0]), std::bit_cast<uint64_t>(norms[r]));
    EXPECT_EQ(states[0].p, states[r].p);
    EXPECT_EQ(states[0].m, states[r].m);
    EXPECT_EQ(states[0].v, states[r].v);
  }
}

// The backend-vs-reference test of every op of the table (some in test_ops_attention.cpp): an op
// of ops.def without a row here does not compile.
constexpr testing::OpTestTable kCpuCase = testing::op_test_table({
    {OpKind::dense, "BackendOps.Dense"},
    {OpKind::dense_grad_input, "BackendOps.DenseGradInput"},
    {OpKind::dense_grad_weight, "BackendOps.DenseGradWeight"},
    {OpKind::sum_leading, "BackendOps.SumLeading"},
    {OpKind::layer_norm, "BackendOps.LayerNorm"},
    {OpKind::layer_norm_grad, "BackendOps.LayerNormGrad"},
    {OpKind::rms_norm, "BackendOps.LayerNorm"},
    {OpKind::rms_norm_grad, "BackendOps.LayerNormGrad"},
    {OpKind::qk_norm, "BackendOps.QkNorm"},
    {OpKind::qk_norm_grad, "BackendOps.QkNormGrad"},
    {OpKind::silu, "BackendOps.Activations"},
    {OpKind::silu_grad, "BackendOps.ActivationGrads"},
    {OpKind::gelu, "BackendOps.Activations"},
    {OpKind::gelu_grad, "BackendOps.ActivationGrads"},
    {OpKind::gelu_erf, "BackendOps.Activations"},
    {OpKind::gelu_erf_grad, "BackendOps.ActivationGrads"},
    {OpKind::silu_mul, "BackendOps.ActivationGrads"},
    {OpKind::silu_mul_grad, "BackendOps.GatedActivationGrads"},
    {OpKind::gelu_mul, "BackendOps.ActivationGrads"},
    {OpKind::gelu_mul_grad, "BackendOps.GatedActivationGrads"},
    {OpKind::dropout, "BackendOps.DropoutBitExact"},
    {OpKind::reshape, "BackendOps.ReshapeView"},
    {OpKind::cast, "BackendOps.CastBitExact"},
    {OpKind::add, "BackendOps.AddBitExact"},
    {OpKind::add_low_rank, "BackendOps.AddLowRank"},
    {OpKind::scale, "BackendOps.ScaleBitExact"},
    {OpKind::take_columns, "BackendOps.AddLowRank"},
    {OpKind::log_softmax, "BackendOps.LogSoftmax"},
    {OpKind::log_softmax_grad, "BackendOps.LogSoftmaxGrad"},
    {OpKind::cross_entropy, "BackendOps.CrossEntropy"},
    {OpKind::cross_entropy_grad, "BackendOps.CrossEntropyGrad"},
    {OpKind::accuracy, "BackendOps.Accuracy"},
    {OpKind::linear_cross_entropy, "BackendOps.LinearCrossEntropy"},
    {OpKind::linear_cross_entropy_grad, "BackendOps.LinearCrossEntropyGrad"},
    {OpKind::linear_cross_entropy_grad_with_bias, "BackendOps.LinearCrossEntropyGrad"},
    {OpKind::linear_cross_entropy_grad_input, "BackendOps.LinearCrossEntropyGradInput"},
    {OpKind::grad_accumulate, "BackendOps.GradAccumulateBitExact"},
    {OpKind::embedding, "BackendOpsAttention.EmbeddingBitExact"},
    {OpKind::embedding_grad, "BackendOpsAttention.EmbeddingGrad"},
    {OpKind::attention, "BackendOpsAttention.Attention"},
    {OpKind::attention_grad, "BackendOpsAttention.Attention"},
    {OpKind::attention_decode, "BackendOpsAttention.AttentionDecodeMatchesAttention"},
    {OpKind::kv_cache_write, "BackendOpsAttention.KvCacheWrite"},
    {OpKind::rope, "BackendOpsAttention.Rope"},
});
#define LOOM_OP(name, ...) \
  static_assert(testing::has_test(kCpuCase, OpKind::name), "op '" #name "' has no CPU-vs-reference test in kCpuCase");
#include "graph/ops.def"
#undef LOOM_OP

TEST(CpuOps, TableCoverage) { EXPECT_EQ(testing::unregistered_tests(kCpuCase), ""); }

}  // namespace
}  // namespace loom
