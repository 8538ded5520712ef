// Every registered backend vs the reference backend for the embedding and attention op families
// (BackendOpsAttention runs once per backend, support/backend_param.h; testing::OpCase runs each op
// through the real graph -> plan -> executor pipeline and checks the sentinel bytes around every
// output), plus the CPU backend's bitwise independence from the OpenMP thread count. attention_decode
// (one KV-cached decoding step) is checked against attention itself: decoding positions 0..T-1
// must reproduce causal attention row by row (bit for bit on the reference backend).
//
// Tolerances, NMSE = Σ(cpu − ref)² / Σ ref² over outputs of ≥ 32 elements, by the coarsest
// dtype the op rounds through (attention: the coarser of qkv's dtype and softmax_dtype, since a
// 1-ulp difference in a rounded logit or weight moves every output that depends on it):
//   f32 1e-10 (f32 vs double accumulation), bf16 1e-4, f16 1e-5 (occasional 1-ulp differences
//   in intermediates rounded from an f32 vs a double sum).
// Smaller outputs: per element |cpu − ref| ≤ sqrt(tol)·(|ref| + 1).
// Bit-exact: embedding (one rounding of one value, no arithmetic).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/reference/reference.h"
#include "graph/passes/plan.h"
#include "runtime/executor.h"
#include "support/backend_param.h"
#include "support/cpu_checks.h"
#include "support/op_harness.h"

namespace loom {
namespace {

using testing::expect_bytes_equal;
using testing::expect_thread_invariant;
using testing::HostTensor;
using testing::nmse;
using testing::OpCase;
using testing::ThreadCount;

class BackendOpsAttention : public testing::BackendTest {};
INSTANTIATE_TEST_SUITE_P(, BackendOpsAttention, testing::compared_backends(), testing::backend_name);

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};

uint64_t next_seed() {
  static uint64_t s = [] {
    const char* e = std::getenv("LOOM_TEST_SEED");
    return e ? std::strtoull(e, nullptr, 10) * 1000003u + 500000u : uint64_t{500000};
  }();
  return ++s;
}

std::string dn(DType dt) { return dtype_name(dt); }

double nmse_tol(DType dt) {
  switch (dt) {
    case DType::bf16:
      return 1e-4;
    case DType::f16:
      return 1e-5;
    default:
      return 1e-10;
  }
}

DType coarser(DType a, DType b) {
  auto bits = [](DType d) { return d == DType::bf16 ? 8 : d == DType::f16 ? 11 : 24; };
  return bits(a) <= bits(b) ? a : b;
}

struct Outputs {
  std::vector<HostTensor> got, ref;  // the backend under test's, the reference's
};

// Runs `c` on the backend under test and on the reference.
Outputs run_both(OpCase& c) {
  ReferenceBackend ref;
  Outputs o;
  o.got = c.run(testing::under_test());
  o.ref = c.run(ref);
  return o;
}

void expect_close(const HostTensor& cpu, const HostTensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(cpu.shape, ref.shape) << what;
  ASSERT_EQ(cpu.dtype, ref.dtype) << what;
  for (int64_t i = 0; i < ref.numel(); ++i)
    ASSERT_TRUE(std::isfinite(cpu.get(i)) && std::isfinite(ref.get(i)))
        << what << ": element " << i << " cpu " << cpu.get(i) << " ref " << ref.get(i);
  if (ref.numel() >= 32) {
    const double e = nmse(cpu, ref);
    if (std::getenv("STATS")) printf("STAT %s nmse %g\n", what.c_str(), e);
    EXPECT_LE(e, tol) << what << ": nmse " << e << " > " << tol;
    return;
  }
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = cpu.get(i), b = ref.get(i);
    if (!(std::fabs(a - b) <= std::sqrt(tol) * (std::fabs(b) + 1))) {
      ADD_FAILURE() << what << ": element " << i << " cpu " << a << " ref " << b;
      return;
    }
  }
}

void expect_close(const HostTensor& cpu, const HostTensor& ref, DType prec, const std::string& what) {
  expect_close(cpu, ref, nmse_tol(prec), what);
}

Shape with_last(Shape lead, int64_t d) {
  lead.push_back(d);
  return lead;
}

// ---- embedding -----------------------------------------------------------------------------

const std::vector<Shape> kIdShapes = {Shape{}, Shape{1}, Shape{7}, Shape{2, 33}};
constexpr int64_t kVocab = 11;  // small: random ids repeat
constexpr int64_t kEmbedWidths[] = {1, 5, 16, 64, 130};

TEST_P(BackendOpsAttention, EmbeddingBitExact) {
  LOOM_REQUIRE_OPS(OpKind::embedding);
  for (DType dt : kFloatTypes)
    for (const Shape& ids : kIdShapes)
      for (int64_t C : kEmbedWidths) {
        const std::string what = "embedding " + dn(dt) + " ids" + ids.str() + " C=" + std::to_string(C);
        OpCase oc(OpKind::embedding, {{ids, DType::i32}, {Shape{kVocab, C}, DType::f32}}, DTypeAttrs{dt});
        oc.fill_random(next_seed(), static_cast<int32_t>(kVocab));
        const Outputs o = run_both(oc);
        ASSERT_EQ(o.got.size(), 1u);
        EXPECT_EQ(o.got[0].shape, with_last(ids, C)) << what;
        expect_bytes_equal(o.got[0], o.ref[0], what);
        // And it is the table row, rounded once.
        const HostTensor& t = oc.input(1);
        for (int64_t n = 0; n < ids.numel(); ++n)
          for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(o.ref[0].get(n * C + c), round_to(dt, t.get(oc.input(0).get_i32(n) * C + c))) << what;
      }
}

TEST_P(BackendOpsAttention, EmbeddingGrad) {
  LOOM_REQUIRE_OPS(OpKind::embedding_grad);
  for (DType dt : kFloatTypes)
    for (const Shape& ids : kIdShapes)
      for (int64_t C : kEmbedWidths) {
        const std::string what = "embedding_grad dy=" + dn(dt) + " ids" + ids.str() + " C=" + std::to_string(C);
        OpCase oc(OpKind::embedding_grad, {{Shape{kVocab, C}, DType::f32}, {ids, DType::i32}, {with_last(ids, C), dt}});
        oc.fill_random(next_seed(), static_cast<int32_t>(kVocab));  // grad starts non-zero
        const Outputs o = run_both(oc);
        ASSERT_EQ(o.got.size(), 1u);
        expect_close(o.got[0], o.ref[0], DType::f32, what);
      }
}

// Rows whose id never occurs are untouched, and a repeated id gets the sum of its rows.
TEST_P(BackendOpsAttention, EmbeddingGradScatterAdd) {
  LOOM_REQUIRE_OPS(OpKind::embedding_grad);
  OpCase oc(OpKind::embedding_grad, {{Shape{4, 3}, DType::f32}, {Shape{5}, DType::i32}, {Shape{5, 3}, DType::f32}});
  const int32_t ids[5] = {2, 0, 2, 2, 0};
  for (int64_t i = 0; i < 12; ++i) oc.input(0).set(i, 100.f + static_cast<float>(i));
  for (int64_t n = 0; n < 5; ++n) oc.input(1).set_i32(n, ids[n]);
  for (int64_t i = 0; i < 15; ++i) oc.input(2).set(i, static_cast<float>(i + 1));
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    const HostTensor g = oc.run(*be).at(0);
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(g.get(0 * 3 + c), 100.f + c + (4 + c) + (13 + c)) << be->name();            // tokens 1, 4
      EXPECT_EQ(g.get(1 * 3 + c), 103.f + c) << be->name();                                 // never used
      EXPECT_EQ(g.get(2 * 3 + c), 106.f + c + (1 + c) + (7 + c) + (10 + c)) << be->name();  // tokens 0, 2, 3
      EXPECT_EQ(g.get(3 * 3 + c), 109.f + c) << be->name();
    }
  }
}

TEST(CpuOpsAttentionDeathTest, EmbeddingIdOutOfRange) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int32_t bad : {11, -1}) {
    OpCase fwd(OpKind::embedding, {{Shape{3}, DType::i32}, {Shape{kVocab, 4}, DType::f32}}, DTypeAttrs{DType::f32});
    fwd.fill_random(next_seed(), static_cast<int32_t>(kVocab));
    fwd.input(0).set_i32(1, bad);
    const std::string re = "embedding id " + std::to_string(bad) + " out of range \\[0, V = 11\\)";
    EXPECT_DEATH(
        {
          CpuBackend be;
          fwd.run(be);
        },
        re);
    EXPECT_DEATH(
        {
          ReferenceBackend be;
          fwd.run(be);
        },
        re);
    OpCase bwd(OpKind::embedding_grad,
               {{Shape{kVocab, 4}, DType::f32}, {Shape{3}, DType::i32}, {Shape{3, 4}, DType::bf16}});
    bwd.fill_random(next_seed(), static_cast<int32_t>(kVocab));
    bwd.input(1).set_i32(2, bad);
    EXPECT_DEATH(
        {
          CpuBackend be;
          bwd.run(be);
        },
        re);
    EXPECT_DEATH(
        {
          ReferenceBackend be;
          bwd.run(be);
        },
        re);
  }
}

TEST(CpuThreadsAttention, EmbeddingGrad) {
  for (DType dt : {DType::f32, DType::bf16}) {
    // Many tokens over few ids (long same-element add chains), width spanning many column blocks.
    OpCase oc(OpKind::embedding_grad,
              {{Shape{50, 300}, DType::f32}, {Shape{16, 40}, DType::i32}, {Shape{16, 40, 300}, dt}});
    oc.fill_random(next_seed(), 50);
    expect_thread_invariant(oc, "embedding_grad " + dn(dt));
  }
  OpCase fwd(OpKind::embedding, {{Shape{16, 40}, DType::i32}, {Shape{50, 300}, DType::f32}}, DTypeAttrs{DType::bf16});
  fwd.fill_random(next_seed(), 50);
  expect_thread_invariant(fwd, "embedding bf16");
}

// ---- attention -----------------------------------------------------------------------------

struct DtypePair {
  DType d, s;  // qkv dtype, softmax dtype
};
// Every qkv dtype with an f32 softmax (the tutorial's setting), and 16-bit softmaxes.
const DtypePair kAttnDtypes[] = {{DType::f32, DType::f32},  {DType::bf16, DType::f32},  {DType::f16, DType::f32},
                                 {DType::f32, DType::bf16}, {DType::bf16, DType::bf16}, {DType::f16, DType::f16},
                                 {DType::f16, DType::bf16}};

// H key/value heads, each with G query heads (G = 1: multi-head attention with H heads).
struct AttnShape {
  int64_t B, T, H, D;
  int32_t G = 1;
  std::string str() const {
    std::string s = "B=";
    s += std::to_string(B);
    s += " T=";
    s += std::to_string(T);
    s += " H=";
    s += std::to_string(H);
    s += " D=";
    s += std::to_string(D);
    s += " G=";
    s += std::to_string(G);
    return s;
  }
  Shape qkv() const { return Shape{B, T, H, (G + 2) * D}; }
  Shape out() const { return Shape{B, T, H * G, D}; }
};

std::vector<AttnShape> attn_shapes() {
  std::vector<AttnShape> v;
  for (int64_t T : {1, 7, 33})
    for (int64_t H : {1, 3})
      for (int64_t D : {4, 16}) v.push_back({2, T, H, D});
  v.push_back({1, 5, 2, 8});  // D^-0.5 not a power of two: the scale itself is rounded to d
  // Several of the CPU kernel's causal row blocks (64 rows): one row past a block, and a partial
  // last block.
  v.push_back({1, 65, 2, 8});
  v.push_back({2, 150, 2, 16});
  // The register-blocked products with K and V past L1 (64 KiB each).
  v.push_back({1, 256, 1, 64});
  // Grouped-query attention: groups of 2 and 4 query heads (one key/value head: multi-query),
  // through product() and, past a causal block, sgemm.
  v.push_back({2, 7, 3, 4, 2});
  v.push_back({2, 33, 1, 16, 4});
  v.push_back({1, 150, 2, 8, 2});
  return v;
}

std::string attn_what(const char* op, const DtypePair& p, bool causal, const AttnShape& s) {
  std::string w = op;
  w += " d=";
  w += dn(p.d);
  w += " s=";
  w += dn(p.s);
  w += causal ? " causal " : " full ";
  w += s.str();
  return w;
}

// The forward case, and the backward case fed with the forward's qkv, its (reference) lse and a
// random dout: a random lse would make exp(logits − lse) meaningless.
struct AttnCases {
  OpCase fwd, bwd;
};

AttnCases make_attention_cases(const DtypePair& p, bool causal, const AttnShape& s, int32_t window = 0,
                               float scale = 0.f) {
  const AttentionAttrs at{.causal = causal, .softmax_dtype = p.s, .group = s.G, .window = window, .scale = scale};
  const Shape qkv = s.qkv(), out = s.out(), lse{s.B, s.H * s.G, s.T};
  AttnCases c{OpCase(OpKind::attention, {{qkv, p.d}}, at),
              OpCase(OpKind::attention_grad, {{qkv, p.d}, {lse, DType::f32}, {out, p.d}}, at)};
  c.fwd.fill_random(next_seed());
  c.bwd.fill_random(next_seed());
  c.bwd.input(0) = c.fwd.input(0);
  ReferenceBackend ref;
  c.bwd.input(1) = c.fwd.run(ref).at(1);
  return c;
}

// Both cases on the backend under test and the reference: out, lse and dqkv close.
void expect_cases_close(AttnCases& c, const DtypePair& p, const std::string& what) {
  const Outputs o = run_both(c.fwd);
  expect_close(o.got[0], o.ref[0], coarser(p.d, p.s), what + " out");
  expect_close(o.got[1], o.ref[1], coarser(p.d, p.s), what + " lse");
  const Outputs g = run_both(c.bwd);
  expect_close(g.got[0], g.ref[0], coarser(p.d, p.s), what + " dqkv");
}

TEST_P(BackendOpsAttention, Attention) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad);
  for (const DtypePair& p : kAttnDtypes)
    for (bool causal : {false, true})
      for (const AttnShape& s : attn_shapes()) {
        AttnCases c = make_attention_cases(p, causal, s);
        const std::string what = attn_what("attention", p, causal, s);
        const Outputs o = run_both(c.fwd);
        ASSERT_EQ(o.got.size(), 2u) << what;
        expect_close(o.got[0], o.ref[0], coarser(p.d, p.s), what + " out");
        expect_close(o.got[1], o.ref[1], coarser(p.d, p.s), what + " lse");
        const Outputs g = run_both(c.bwd);
        ASSERT_EQ(g.got.size(), 1u) << what;
        expect_close(g.got[0], g.ref[0], coarser(p.d, p.s), attn_what("attention_grad", p, causal, s));
      }
}

// Sliding windows (transformers' sliding_window: query i sees keys i − W < j <= i), CPU against
// the reference, forward and backward: windows of one key, shorter than a row block, as long as
// one (64) and longer (100, and 129: past two blocks), over sequences from a single block to
// several (where the CPU kernel skips whole key blocks before a block's window), through product()
// and sgemm, with grouped queries.
TEST_P(BackendOpsAttention, SlidingWindow) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad);
  for (const DtypePair& p :
       {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}, DtypePair{DType::f16, DType::f16}})
    for (int32_t window : {1, 5, 64, 100, 129})
      for (const AttnShape& s : {AttnShape{2, 7, 3, 16}, AttnShape{1, 65, 2, 8}, AttnShape{2, 150, 2, 16},
                                 AttnShape{1, 256, 1, 64}, AttnShape{1, 150, 2, 8, 2}, AttnShape{1, 300, 1, 16}}) {
        AttnCases c = make_attention_cases(p, true, s, window);
        expect_cases_close(c, p, attn_what("attention", p, true, s) + " window=" + std::to_string(window));
      }
}

// The keys a row sees with a window W, near the CPU kernel's blocks of 64 rows: changing key j's k
// and v moves out row i exactly when i − W < j <= i (and leaves every other row bit for bit), and
// with dout on row i alone, dk and dv of key j are nonzero exactly then. A block of keys inside a
// row's window that the kernel skipped by mistake (a block's first key taken from its last row, or
// rounded up rather than down) leaves such a row unmoved, or such a gradient zero. Windows shorter
// and longer than a block and no multiple of it; keys and rows on both sides of block edges.
TEST_P(BackendOpsAttention, SlidingWindowSeesEveryKeyInsideIt) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad);
  Backend& be = testing::under_test();
  const AttnShape s{1, 200, 2, 16};
  const int64_t row = s.H * 3 * s.D, orow = s.H * s.D;  // floats per token of qkv, of out
  // Head h's q (part 0), k (1) or v (2) of token t in qkv, and its out row.
  const auto qkv_at = [&](int64_t t, int64_t h, int64_t part) { return t * row + (3 * h + part) * s.D; };
  const auto out_at = [&](int64_t t, int64_t h) { return t * orow + h * s.D; };
  // Whether the D elements of x from `at` are not all zero.
  const auto nonzero = [&](const HostTensor& x, int64_t at) {
    for (int64_t e = 0; e < s.D; ++e)
      if (x.get(at + e) != 0.f) return true;
    return false;
  };
  for (int32_t W : {1, 2, 63, 65, 100, 129}) {
    AttnCases c = make_attention_cases({DType::f32, DType::f32}, true, s, W);
    const std::string what = std::string(be.name()) + " window=" + std::to_string(W);
    const HostTensor base = c.fwd.run(be).at(0);
    HostTensor& qkv = c.fwd.input(0);
    for (int64_t j : {0, 62, 63, 64, 65, 127, 128, 129, 191, 192}) {
      const HostTensor kept = qkv;
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t e = qkv_at(j, h, 1); e < qkv_at(j, h, 3); ++e) qkv.set(e, qkv.get(e) + 1.f);
      HostTensor moved = c.fwd.run(be).at(0);
      qkv = kept;
      for (int64_t k = 0; k < moved.numel(); ++k) moved.set(k, moved.get(k) - base.get(k));
      for (int64_t i = 0; i < s.T; ++i)
        for (int64_t h = 0; h < s.H; ++h)
          ASSERT_EQ(nonzero(moved, out_at(i, h)), i - W < j && j <= i)
              << what << ": out row " << i << " head " << h << " after key " << j << " changed";
    }
    HostTensor& dout = c.bwd.input(2);
    const HostTensor random = dout;
    for (int64_t i : {63, 64, 65, 127, 128, 150, 191, 199}) {
      for (int64_t k = 0; k < dout.numel(); ++k) dout.set(k, k / orow == i ? random.get(k) : 0.f);
      const HostTensor dqkv = c.bwd.run(be).at(0);
      for (int64_t j = 0; j < s.T; ++j)
        for (int64_t h = 0; h < s.H; ++h) {
          const bool seen = i - W < j && j <= i;
          ASSERT_EQ(nonzero(dqkv, qkv_at(j, h, 2)), seen)
              << what << ": dv of key " << j << " head " << h << " with dout on row " << i;
          // With one key a row's softmax is constant: its dq and the key's dk are zero up to
          // rounding (exp of 0 in f32), so they are checked only where they must be exactly zero.
          if (W == 1 && seen) continue;
          ASSERT_EQ(nonzero(dqkv, qkv_at(j, h, 0)), seen && j == i)
              << what << ": dq of row " << j << " with dout on row " << i;
          ASSERT_EQ(nonzero(dqkv, qkv_at(j, h, 1)), seen)
              << what << ": dk of key " << j << " head " << h << " with dout on row " << i;
        }
    }
  }
}

// The window's definition, on both backends: row i of attention with window W is the last row of
// causal attention over the W tokens i − W + 1 .. i alone (attention does not see positions), bit
// for bit on the reference (masked keys add exact zeros to its double sums).
TEST_P(BackendOpsAttention, SlidingWindowIsAttentionOverTheLastTokens) {
  LOOM_REQUIRE_OPS(OpKind::attention);
  constexpr int32_t W = 3;
  const AttnShape s{1, 9, 2, 8}, sub{1, W, 2, 8};
  AttnCases c = make_attention_cases({DType::f32, DType::f32}, true, s, W);
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    const HostTensor out = c.fwd.run(*be).at(0);
    const int64_t row = s.H * 3 * s.D, orow = s.H * s.D;  // floats per token of qkv, of out
    for (int64_t i = W - 1; i < s.T; ++i) {
      OpCase part(OpKind::attention, {{sub.qkv(), DType::f32}}, AttentionAttrs{true, DType::f32});
      for (int64_t k = 0; k < W * row; ++k) part.input(0).set(k, c.fwd.input(0).get((i - W + 1) * row + k));
      const HostTensor want = part.run(*be).at(0);
      for (int64_t k = 0; k < orow; ++k) {
        const float got = out.get(i * orow + k), w = want.get((W - 1) * orow + k);
        if (be == &ref)
          ASSERT_EQ(got, w) << be->name() << " row " << i;
        else
          ASSERT_NEAR(got, w, 1e-6f * (1 + std::fabs(w))) << be->name() << " row " << i;
      }
    }
  }
}

// Positions [B, T] of packed rows: per row, examples of the given lengths in turn from a list
// (cycled), each token's position in its example; a row's tail that no example fills is padding,
// examples of one token (position 0).
HostTensor packed_positions(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  HostTensor pos(Shape{B, T}, DType::i32);
  size_t k = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T;) {
      const int64_t n = std::min(lengths[k++ % lengths.size()], T - t);
      for (int64_t i = 0; i < n; ++i, ++t) pos.set_i32(b * T + t, static_cast<int32_t>(i));
    }
  return pos;
}

// The attention cases with positions: examples of 1 to 100 tokens, so blocks of 64 query rows
// span several examples and examples span several blocks (the CPU kernel skips the key blocks
// before a block's first example), alone and with a window.
AttnCases make_packed_cases(const DtypePair& p, const AttnShape& s, int32_t window = 0) {
  const AttentionAttrs at{true, p.s, s.G, window};
  const Shape qkv = s.qkv(), out = s.out(), lse{s.B, s.H * s.G, s.T}, pos{s.B, s.T};
  AttnCases c{OpCase(OpKind::attention, {{qkv, p.d}, {pos, DType::i32}}, at),
              OpCase(OpKind::attention_grad, {{qkv, p.d}, {lse, DType::f32}, {out, p.d}, {pos, DType::i32}}, at)};
  c.fwd.fill_random(next_seed());
  c.bwd.fill_random(next_seed());
  c.fwd.input(1) = packed_positions(s.B, s.T, {5, 1, 70, 3, 100, 17, 1, 1, 40});
  c.bwd.input(0) = c.fwd.input(0);
  c.bwd.input(3) = c.fwd.input(1);
  ReferenceBackend ref;
  c.bwd.input(1) = c.fwd.run(ref).at(1);
  return c;
}

// Packed examples (attention's positions: block-diagonal causal), CPU against the reference.
TEST_P(BackendOpsAttention, PackedExamples) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad);
  for (const DtypePair& p :
       {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}, DtypePair{DType::f16, DType::f16}})
    for (int32_t window : {0, 5})
      for (const AttnShape& s : {AttnShape{2, 7, 3, 16}, AttnShape{1, 65, 2, 8}, AttnShape{2, 150, 2, 16},
                                 AttnShape{1, 256, 1, 64}, AttnShape{1, 150, 2, 8, 2}, AttnShape{1, 300, 1, 16}}) {
        AttnCases c = make_packed_cases(p, s, window);
        expect_cases_close(c, p, attn_what("attention", p, true, s) + " packed window=" + std::to_string(window));
      }
}

// The definition, on both backends: each example's rows of a packed row are causal attention over
// that example alone, and its gradient (every dout row of other examples zero) is the example's
// alone; bit for bit on the reference (masked keys add exact zeros to its double sums).
TEST_P(BackendOpsAttention, PackedExampleIsAttentionAlone) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad);
  const AttnShape s{1, 150, 2, 8, 2};
  const std::vector<int64_t> lengths = {70, 5, 1, 60, 14};  // fills the row exactly
  AttnCases c = make_packed_cases({DType::f32, DType::f32}, s, 0);
  c.fwd.input(1) = packed_positions(1, s.T, lengths);
  c.bwd.input(3) = c.fwd.input(1);
  const int64_t row = s.H * (s.G + 2) * s.D, orow = s.H * s.G * s.D;  // floats per token of qkv, of out
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    const HostTensor out = c.fwd.run(*be).at(0);
    int64_t first = 0;
    for (int64_t n : lengths) {
      const AttnShape sub{1, n, s.H, s.D, s.G};
      OpCase part(OpKind::attention, {{sub.qkv(), DType::f32}}, AttentionAttrs{true, DType::f32, s.G});
      for (int64_t k = 0; k < n * row; ++k) part.input(0).set(k, c.fwd.input(0).get(first * row + k));
      const HostTensor want = part.run(*be).at(0);
      for (int64_t k = 0; k < n * orow; ++k) {
        const float got = out.get(first * orow + k), w = want.get(k);
        if (be == &ref)
          ASSERT_EQ(got, w) << be->name() << " example at " << first << " element " << k;
        else
          ASSERT_NEAR(got, w, 1e-6f * (1 + std::fabs(w))) << be->name() << " example at " << first;
      }
      first += n;
    }
  }
}

// Large logits (q and k scaled by 10: logits ~ N(0, 100²) at D = 16): nearly one-hot rows whose
// small weights underflow in exp. The backward is ill-conditioned here: an f32 logit of magnitude
// ~100 carries ~1e-5 of rounding error, which exp(logit − lse) turns into a relative error of p,
// and dp − rowsum(p·dp) cancels; f32 vs double logits alone give dqkv an NMSE of ~1e-8 (the same
// with glibc's expf), so dqkv's f32 tolerance is 1e-6 in this test.
TEST_P(BackendOpsAttention, PeakedSoftmax) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad);
  for (const DtypePair& p : {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}})
    for (bool causal : {false, true}) {
      const AttnShape s{2, 33, 3, 16};
      AttnCases c = make_attention_cases(p, causal, s);
      HostTensor& qkv = c.fwd.input(0);
      for (int64_t i = 0; i < qkv.numel(); ++i)
        if (i % (3 * s.D) < 2 * s.D) qkv.set(i, 10.f * qkv.get(i));
      c.bwd.input(0) = qkv;
      ReferenceBackend ref;
      c.bwd.input(1) = c.fwd.run(ref).at(1);
      const std::string what = attn_what("attention peaked", p, causal, s);
      const Outputs o = run_both(c.fwd);
      expect_close(o.got[0], o.ref[0], p.d, what + " out");
      expect_close(o.got[1], o.ref[1], p.d, what + " lse");
      const Outputs g = run_both(c.bwd);
      expect_close(g.got[0], g.ref[0], p.d == DType::f32 ? 1e-6 : nmse_tol(p.d), what + " dqkv");
    }
}

// Exact properties of the definition, on the reference: a single key gives out = round_d(v) and
// lse = the one logit; causal row 0 sees only key 0; causal dq/dk of row 0 come only from key 0.
TEST_P(BackendOpsAttention, AttentionDefinitionSpotChecks) {
  LOOM_REQUIRE_OPS(OpKind::attention);
  for (DType d : kFloatTypes) {
    AttnCases c = make_attention_cases({d, DType::f32}, true, {1, 4, 1, 4});
    ReferenceBackend ref;
    for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
      const std::vector<HostTensor> o = c.fwd.run(*be);
      const HostTensor& qkv = c.fwd.input(0);
      double l0 = 0;
      for (int e = 0; e < 4; ++e) {
        // row 0: softmax over one key is exactly 1, so out = v[0] (already in d).
        EXPECT_EQ(o[0].get(e), qkv.get(8 + e)) << be->name() << " " << dn(d);
        l0 += static_cast<double>(round_to(d, qkv.get(e) * 0.5f)) * qkv.get(4 + e);
      }
      EXPECT_NEAR(o[1].get(0), l0, 1e-5 * (1 + std::fabs(l0))) << be->name() << " " << dn(d);
    }
  }
}

// Grouped-query attention is multi-head attention with each key/value head repeated for its group
// (transformers' repeat_kv): on the reference, out, lse and dq equal those of the repeated layout
// bit for bit, and dk, dv of a key/value head are the sums of its query heads' (f32, to rounding).
TEST(CpuOpsAttention, GroupedQueryEqualsRepeatedKeysAndValues) {
  const AttnShape gs{2, 9, 2, 4, 3}, ms{2, 9, 6, 4};  // 2 key/value heads of 3 queries; 6 heads
  AttnCases gqa = make_attention_cases({DType::f32, DType::f32}, true, gs);
  AttnCases mha = make_attention_cases({DType::f32, DType::f32}, true, ms);
  const HostTensor& x = gqa.fwd.input(0);
  const int64_t D = 4, G = 3;
  // mha(b, t, h, part, e) from gqa's row of key/value head h / G.
  auto gqa_at = [&](int64_t b, int64_t t, int64_t h, int part, int64_t e) {
    const int64_t slot = part == 0 ? h % G : G + part - 1;
    return ((b * 9 + t) * 2 + h / G) * (G + 2) * D + slot * D + e;
  };
  auto mha_at = [&](int64_t b, int64_t t, int64_t h, int part, int64_t e) {
    return ((b * 9 + t) * 6 + h) * 3 * D + part * D + e;
  };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 9; ++t)
      for (int64_t h = 0; h < 6; ++h)
        for (int part = 0; part < 3; ++part)
          for (int64_t e = 0; e < D; ++e)
            mha.fwd.input(0).set(mha_at(b, t, h, part, e), x.get(gqa_at(b, t, h, part, e)));
  ReferenceBackend ref;
  const std::vector<HostTensor> go = gqa.fwd.run(ref), mo = mha.fwd.run(ref);
  expect_bytes_equal(go[0], mo[0], "gqa out vs repeated");
  expect_bytes_equal(go[1], mo[1], "gqa lse vs repeated");
  gqa.bwd.input(1) = go[1];
  mha.bwd.input(0) = mha.fwd.input(0);
  mha.bwd.input(1) = mo[1];
  mha.bwd.input(2) = gqa.bwd.input(2);  // the same dout [B, T, 6, D]
  const HostTensor gd = gqa.bwd.run(ref).at(0), md = mha.bwd.run(ref).at(0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 9; ++t)
      for (int64_t h = 0; h < 6; ++h)
        for (int64_t e = 0; e < D; ++e) {
          ASSERT_EQ(gd.get(gqa_at(b, t, h, 0, e)), md.get(mha_at(b, t, h, 0, e))) << "dq";
          if (h % G != 0) continue;
          for (int part : {1, 2}) {
            double sum = 0;
            for (int64_t i = h; i < h + G; ++i) sum += md.get(mha_at(b, t, i, part, e));
            EXPECT_NEAR(gd.get(gqa_at(b, t, h, part, e)), sum, 1e-6 * (1 + std::fabs(sum))) << "part " << part;
          }
        }
}

TEST(CpuThreadsAttention, Attention) {
  for (const DtypePair& p :
       {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}, DtypePair{DType::f16, DType::bf16}})
    for (bool causal : {false, true})
      for (const AttnShape& s : {AttnShape{2, 33, 3, 16}, AttnShape{2, 150, 3, 16}, AttnShape{2, 70, 2, 16, 3}}) {
        AttnCases c = make_attention_cases(p, causal, s);
        expect_thread_invariant(c.fwd, attn_what("attention", p, causal, s));
        expect_thread_invariant(c.bwd, attn_what("attention_grad", p, causal, s));
      }
}

// The pair loop lowers nthreads-var inside its own region for OpenBLAS; that must not leak out,
// whether the region is active (many pairs) or not (one pair).
TEST(CpuThreadsAttention, LeavesThreadCountAlone) {
  ThreadCount tc(2);
  for (const AttnShape& s : {AttnShape{1, 3, 1, 4}, AttnShape{2, 64, 4, 16}}) {
    AttnCases c = make_attention_cases({DType::f32, DType::f32}, true, s);
    CpuBackend cpu;
    c.fwd.run(cpu);
    EXPECT_EQ(omp_get_max_threads(), 2) << s.str();
    c.bwd.run(cpu);
    EXPECT_EQ(omp_get_max_threads(), 2) << s.str();
  }
}

// ---- attention_decode ----------------------------------------------------------------------

// Runs attention_decode on `be` for positions 0..T-1 of `qkv` [B, T, H, 3D] (one token per run,
// the caches [B, Tmax, H, D] persisting between runs and starting as NaN, so reading a row that
// was not written yet poisons the output). Returns the outputs stacked as [B, T, H, D] and the
// final caches.
struct DecodeResult {
  HostTensor out, k_cache, v_cache;
};

HostTensor nan_tensor(const Shape& shape, DType d) {
  HostTensor t(shape, d);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, NAN);
  return t;
}

DecodeResult run_decode(Backend& be, const HostTensor& qkv, DType softmax_dtype, int64_t Tmax, int32_t G = 1,
                        int32_t window = 0, float scale = 0.f) {
  const int64_t B = qkv.shape[0], T = qkv.shape[1], KV = qkv.shape[2], D3 = qkv.shape[3], D = D3 / (G + 2);
  const int64_t H = KV * G;  // query heads: the output's; KV: the caches'
  const DType d = qkv.dtype;
  Graph g;
  const ValueId x = g.add_input("qkv", Shape{B, 1, KV, D3}, d);
  const ValueId kc = g.add_input("k_cache", Shape{B, Tmax, KV, D}, d);
  const ValueId vc = g.add_input("v_cache", Shape{B, Tmax, KV, D}, d);
  const ValueId pos = g.add_input("pos", Shape{}, DType::i32);
  const NodeId id = g.add_node(
      OpKind::attention_decode, {x, kc, vc, pos},
      AttentionAttrs{.causal = true, .softmax_dtype = softmax_dtype, .group = G, .window = window, .scale = scale},
      "test", Phase::forward);
  const ValueId out = g.node(id).out.at(0);
  g.mark_output(out);
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, g, plan_program(be, g, default_schedule(g)), &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  DecodeResult r{HostTensor(Shape{B, T, H, D}, d), HostTensor(Shape{B, Tmax, KV, D}, d),
                 HostTensor(Shape{B, Tmax, KV, D}, d)};
  if (!st.is_ok()) return r;
  const HostTensor nan = nan_tensor(Shape{B, Tmax, KV, D}, d);
  ex->upload(kc, nan.bytes.data());
  ex->upload(vc, nan.bytes.data());
  HostTensor step(Shape{B, 1, KV, D3}, d), o(Shape{B, 1, H, D}, d);
  for (int32_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < KV * D3; ++i) step.set(b * KV * D3 + i, qkv.get((b * T + t) * KV * D3 + i));
    ex->upload(x, step.bytes.data());
    ex->upload(pos, &t);
    ex->run(RunCtx{});
    ex->download(out, o.bytes.data());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < H * D; ++i) r.out.set((b * T + t) * H * D + i, o.get(b * H * D + i));
  }
  ex->download(kc, r.k_cache.bytes.data());
  ex->download(vc, r.v_cache.bytes.data());
  return r;
}

// The caches [B, Tmax, KV, D] after tokens 0..T-1 of qkv (s.H key/value heads) were stored: rows
// [0, T) hold exactly each token's key and value, rows [T, Tmax) are untouched (they started NaN).
void expect_caches_hold(const DecodeResult& r, const HostTensor& qkv, const AttnShape& s, const std::string& what) {
  const int64_t Tmax = r.k_cache.shape[1];
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < Tmax; ++t)
      for (int64_t i = 0; i < s.H * s.D; ++i) {  // H key/value heads: the caches' rows
        const int64_t h = i / s.D, e = i % s.D, c = ((b * Tmax + t) * s.H) * s.D + i;
        const int64_t q = ((b * s.T + t) * s.H + h) * (s.G + 2) * s.D + s.G * s.D + e;  // its key
        if (t < s.T) {
          ASSERT_EQ(r.k_cache.get(c), qkv.get(q)) << what << " k_cache row " << t;
          ASSERT_EQ(r.v_cache.get(c), qkv.get(q + s.D)) << what << " v_cache row " << t;
        } else {
          ASSERT_TRUE(std::isnan(r.k_cache.get(c)) && std::isnan(r.v_cache.get(c))) << what << " row " << t;
        }
      }
}

// Decoding positions 0..T-1 one at a time reproduces causal attention row by row: bit for bit on
// the reference backend (the masked keys add exact zeros to its double sums), to the dtype
// tolerance on the CPU (dot products instead of sgemm change f32 summation orders); CPU decode
// vs reference decode likewise. The caches hold exactly the tokens' k and v in rows [0, T) and
// rows [T, Tmax) are never touched (nor read: they are NaN).
TEST_P(BackendOpsAttention, AttentionDecodeMatchesAttention) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_decode);
  for (const DtypePair& p : kAttnDtypes)
    for (const AttnShape& s : attn_shapes()) {
      const std::string what = attn_what("attention_decode", p, true, s);
      OpCase full(OpKind::attention, {{s.qkv(), p.d}}, AttentionAttrs{true, p.s, s.G});
      full.fill_random(next_seed());
      const HostTensor& qkv = full.input(0);
      const Outputs att = run_both(full);
      const int64_t Tmax = s.T + 3;
      Backend& cpu = testing::under_test();
      ReferenceBackend ref;
      const DecodeResult dc = run_decode(cpu, qkv, p.s, Tmax, s.G);
      const DecodeResult dr = run_decode(ref, qkv, p.s, Tmax, s.G);
      expect_bytes_equal(dr.out, att.ref[0], what + " ref decode vs ref attention");
      expect_close(dc.out, att.got[0], coarser(p.d, p.s), what + " cpu decode vs cpu attention");
      expect_close(dc.out, dr.out, coarser(p.d, p.s), what + " cpu decode vs ref decode");
      for (const DecodeResult* r : {&dc, &dr}) expect_caches_hold(*r, qkv, s, what);
    }
}

// With a sliding window the same holds against windowed attention (decode reads only the
// window's cache rows).
TEST_P(BackendOpsAttention, AttentionDecodeWithWindowMatchesAttention) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_decode);
  for (const DtypePair& p : {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}})
    for (int32_t window : {1, 4, 40})
      for (const AttnShape& s : {AttnShape{2, 33, 3, 16}, AttnShape{1, 70, 2, 8, 2}}) {
        const std::string what = attn_what("attention_decode", p, true, s) + " window=" + std::to_string(window);
        OpCase full(OpKind::attention, {{s.qkv(), p.d}}, AttentionAttrs{true, p.s, s.G, window});
        full.fill_random(next_seed());
        const HostTensor& qkv = full.input(0);
        const Outputs att = run_both(full);
        ReferenceBackend ref;
        const DecodeResult dc = run_decode(testing::under_test(), qkv, p.s, s.T + 3, s.G, window);
        const DecodeResult dr = run_decode(ref, qkv, p.s, s.T + 3, s.G, window);
        expect_bytes_equal(dr.out, att.ref[0], what + " ref decode vs ref attention");
        expect_close(dc.out, att.got[0], coarser(p.d, p.s), what + " cpu decode vs cpu attention");
      }
}

// attrs.scale (Gemma 3's query_pre_attn_scalar^-0.5) replaces D^-0.5. Its definition on both
// backends: with D = 16 (D^-0.5 = 1/4 exactly) a scale of 1/8 is the default attention of q / 2,
// bit for bit on the reference. Then CPU against the reference with a scale no power of two
// gives (12^-0.5): forward, backward and the decoder, windowed and grouped too.
TEST_P(BackendOpsAttention, ScaleReplacesHeadDimScale) {
  LOOM_REQUIRE_OPS(OpKind::attention, OpKind::attention_grad, OpKind::attention_decode);
  const AttnShape s{2, 7, 4, 16, 2};
  AttnCases scaled = make_attention_cases({DType::f32, DType::f32}, true, s, 0, 0.125f);
  OpCase halved(OpKind::attention, {{s.qkv(), DType::f32}}, AttentionAttrs{.causal = true, .group = s.G});
  halved.input(0) = scaled.fwd.input(0);
  const int64_t parts = s.G + 2, rows = s.B * s.T * s.H;  // H: key/value heads
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < s.G * s.D; ++e) {  // the query slots of each key/value head
      const int64_t i = r * parts * s.D + e;
      halved.input(0).set(i, halved.input(0).get(i) / 2);
    }
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    const HostTensor got = scaled.fwd.run(*be).at(0), want = halved.run(*be).at(0);
    for (int64_t k = 0; k < got.shape.numel(); ++k) {
      if (be == &ref)
        ASSERT_EQ(got.get(k), want.get(k)) << be->name() << " element " << k;
      else
        ASSERT_NEAR(got.get(k), want.get(k), 1e-6f * (1 + std::fabs(want.get(k)))) << be->name() << " element " << k;
    }
  }
  const float scale = static_cast<float>(std::pow(12.0, -0.5));
  for (const DtypePair& p : {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}})
    for (int32_t window : {0, 4})
      for (const AttnShape& sh : {AttnShape{2, 9, 3, 16}, AttnShape{1, 70, 4, 8, 2}}) {
        const std::string what = attn_what("attention", p, true, sh) + " window=" + std::to_string(window) + " scale";
        AttnCases c = make_attention_cases(p, true, sh, window, scale);
        const Outputs o = run_both(c.fwd);
        expect_close(o.got[0], o.ref[0], coarser(p.d, p.s), what + " out");
        expect_close(o.got[1], o.ref[1], coarser(p.d, p.s), what + " lse");
        const Outputs g = run_both(c.bwd);
        expect_close(g.got[0], g.ref[0], coarser(p.d, p.s), what + " dqkv");
        const DecodeResult dc = run_decode(testing::under_test(), c.fwd.input(0), p.s, sh.T + 3, sh.G, window, scale);
        const DecodeResult dr = run_decode(ref, c.fwd.input(0), p.s, sh.T + 3, sh.G, window, scale);
        expect_bytes_equal(dr.out, o.ref[0], what + " ref decode vs ref attention");
        expect_close(dc.out, dr.out, coarser(p.d, p.s), what + " cpu decode vs ref decode");
      }
}

// Runs kv_cache_write on `be` for qkv [B, T, KV, (G+2)·D] into caches [B, Tmax, KV, D] that start
// as NaN; returns the caches (out stays empty).
DecodeResult run_cache_write(Backend& be, const HostTensor& qkv, int64_t Tmax, int32_t G) {
  const int64_t B = qkv.shape[0], KV = qkv.shape[2], D = qkv.shape[3] / (G + 2);
  const Shape cache{B, Tmax, KV, D};
  Graph g;
  const ValueId x = g.add_input("qkv", qkv.shape, qkv.dtype);
  const ValueId kc = g.add_input("k_cache", cache, qkv.dtype);
  const ValueId vc = g.add_input("v_cache", cache, qkv.dtype);
  g.add_node(OpKind::kv_cache_write, {x, kc, vc}, AttentionAttrs{true, DType::f32, G}, "prefill", Phase::forward);
  DecodeResult r{HostTensor(), nan_tensor(cache, qkv.dtype), nan_tensor(cache, qkv.dtype)};
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, g, plan_program(be, g, default_schedule(g)), &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!st.is_ok()) return r;
  ex->upload(x, qkv.bytes.data());
  ex->upload(kc, r.k_cache.bytes.data());
  ex->upload(vc, r.v_cache.bytes.data());
  ex->run(RunCtx{});
  ex->download(kc, r.k_cache.bytes.data());
  ex->download(vc, r.v_cache.bytes.data());
  return r;
}

// kv_cache_write of T tokens: the caches hold their keys and values in rows [0, T) exactly and the
// rows past them untouched (NaN), on both backends, for every dtype and grouped heads.
TEST_P(BackendOpsAttention, KvCacheWrite) {
  LOOM_REQUIRE_OPS(OpKind::kv_cache_write);
  for (const DtypePair& p : kAttnDtypes)
    for (const AttnShape& s : attn_shapes()) {
      OpCase full(OpKind::attention, {{s.qkv(), p.d}}, AttentionAttrs{true, p.s, s.G});
      full.fill_random(next_seed());
      const std::string what = attn_what("kv_cache_write", p, true, s);
      Backend& cpu = testing::under_test();
      ReferenceBackend ref;
      expect_caches_hold(run_cache_write(cpu, full.input(0), s.T + 3, s.G), full.input(0), s, what + " cpu");
      expect_caches_hold(run_cache_write(ref, full.input(0), s.T + 3, s.G), full.input(0), s, what + " reference");
    }
  // The shape rule: caches with fewer rows than tokens, in another dtype, or not persistent inputs.
  auto build = [](int64_t Tmax, DType cache_dt, bool cache_is_input) {
    Graph g;
    const ValueId x = g.add_input("qkv", Shape{2, 5, 3, 12}, DType::f32);
    ValueId kc = g.add_input("k_cache", Shape{2, Tmax, 3, 4}, cache_dt);
    if (!cache_is_input) kc = g.node(g.add_node(OpKind::cast, {kc}, DTypeAttrs{cache_dt}, "c", Phase::forward)).out[0];
    const ValueId vc = g.add_input("v_cache", Shape{2, Tmax, 3, 4}, cache_dt);
    g.add_node(OpKind::kv_cache_write, {x, kc, vc}, AttentionAttrs{true, DType::f32}, "w", Phase::forward);
  };
  EXPECT_NO_THROW(build(5, DType::f32, true));
  EXPECT_THROW(build(4, DType::f32, true), std::invalid_argument);
  EXPECT_THROW(build(5, DType::bf16, true), std::invalid_argument);
  EXPECT_THROW(build(5, DType::f32, false), std::invalid_argument);
}

TEST(CpuOpsAttention, AttentionDecodeShapeRule) {
  auto build = [](Shape qkv, Shape cache, DType cache_dt, bool causal, bool cache_is_input, Shape pos_shape) {
    Graph g;
    const ValueId x = g.add_input("qkv", qkv, DType::f32);
    ValueId kc = g.add_input("k_cache", cache, cache_dt);
    if (!cache_is_input) kc = g.node(g.add_node(OpKind::cast, {kc}, DTypeAttrs{cache_dt}, "c", Phase::forward)).out[0];
    const ValueId vc = g.add_input("v_cache", cache, cache_dt);
    const ValueId pos = g.add_input("pos", pos_shape, DType::i32);
    g.add_node(OpKind::attention_decode, {x, kc, vc, pos}, AttentionAttrs{causal, DType::f32}, "dec", Phase::forward);
  };
  const Shape qkv{2, 1, 3, 12}, cache{2, 9, 3, 4};
  EXPECT_NO_THROW(build(qkv, cache, DType::f32, true, true, Shape{}));
  EXPECT_THROW(build(qkv, cache, DType::f32, false, true, Shape{}), std::invalid_argument);                // not causal
  EXPECT_THROW(build(Shape{2, 2, 3, 12}, cache, DType::f32, true, true, Shape{}), std::invalid_argument);  // 2 tokens
  EXPECT_THROW(build(qkv, Shape{2, 9, 3, 5}, DType::f32, true, true, Shape{}), std::invalid_argument);     // head dim
  EXPECT_THROW(build(qkv, cache, DType::bf16, true, true, Shape{}), std::invalid_argument);  // cache dtype
  EXPECT_THROW(build(qkv, cache, DType::f32, true, false, Shape{}), std::invalid_argument);  // not persistent
  EXPECT_THROW(build(qkv, cache, DType::f32, true, true, Shape{1}), std::invalid_argument);  // pos not scalar
}

TEST(CpuOpsAttentionDeathTest, AttentionDecodePosOutOfRange) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int32_t bad : {4, -1}) {
    OpCase oc(OpKind::attention_decode,
              {{Shape{1, 1, 2, 12}, DType::f32},
               {Shape{1, 4, 2, 4}, DType::f32},
               {Shape{1, 4, 2, 4}, DType::f32},
               {Shape{}, DType::i32}},
              AttentionAttrs{true, DType::f32});
    oc.fill_random(next_seed());
    oc.input(3).set_i32(0, bad);
    const std::string re = "attention_decode pos " + std::to_string(bad) + " out of range \\[0, Tmax = 4\\)";
    EXPECT_DEATH(
        {
          CpuBackend be;
          oc.run(be);
        },
        re);
    EXPECT_DEATH(
        {
          ReferenceBackend be;
          oc.run(be);
        },
        re);
  }
}

// Enough (b, h) pairs and keys for the pair loop to go parallel: bitwise the same on 1-3 threads.
TEST(CpuThreadsAttention, AttentionDecode) {
  for (const DtypePair& p : {DtypePair{DType::f32, DType::f32}, DtypePair{DType::bf16, DType::f32}}) {
    OpCase full(OpKind::attention, {{Shape{4, 40, 8, 3 * 64}, p.d}}, AttentionAttrs{true, p.s});
    full.fill_random(next_seed());
    std::vector<DecodeResult> runs;
    for (int threads : {1, 2, 3}) {
      ThreadCount tc(threads);
      CpuBackend cpu;
      runs.push_back(run_decode(cpu, full.input(0), p.s, 40));
    }
    for (size_t r = 1; r < runs.size(); ++r)
      expect_bytes_equal(runs[r].out, runs[0].out, "attention_decode " + dn(p.d) + " threads");
  }
}

// ---- rope ---------------------------------------------------------------------------------

struct RopeShape {
  int64_t B, T, S;
  int32_t group;
  int64_t D;
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " S=" + std::to_string(S) +
           " group=" + std::to_string(group) + " D=" + std::to_string(D);
  }
};

// Llama 3.1's scaling with a short original context, so that positions up to 4096 meet all three
// bands of D = 64's frequencies.
RopeAttrs llama3_rope(int32_t group, bool inverse) {
  return RopeAttrs{.theta = 10000.f,
                   .group = group,
                   .inverse = inverse,
                   .llama3_factor = 8.f,
                   .low_freq_factor = 1.f,
                   .high_freq_factor = 4.f,
                   .original_max_position = 256};
}

// Positions drawn from [0, 4096): angles up to ~4096 radians, where the f32 angle matters.
OpCase make_rope_case(DType d, const RopeShape& r, bool inverse, bool llama3 = false) {
  OpCase oc(OpKind::rope, {{Shape{r.B, r.T, r.S, (r.group + 2) * r.D}, d}, {Shape{r.T}, DType::i32}},
            llama3 ? llama3_rope(r.group, inverse) : RopeAttrs{.theta = 10000.f, .group = r.group, .inverse = inverse});
  oc.fill_random(next_seed(), 4096);
  return oc;
}

// CPU vs reference over dtypes, both directions and shapes (one pair per head, odd lengths,
// groups of query heads); the value part is copied bit for bit by both.
TEST_P(BackendOpsAttention, Rope) {
  LOOM_REQUIRE_OPS(OpKind::rope);
  for (DType d : kFloatTypes)
    for (bool inverse : {false, true})
      for (const RopeShape& r :
           {RopeShape{1, 1, 1, 1, 2}, RopeShape{2, 7, 3, 1, 8}, RopeShape{1, 5, 1, 2, 6}, RopeShape{2, 33, 2, 3, 64}})
        for (bool llama3 : {false, true}) {
          const std::string what =
              "rope " + dn(d) + (inverse ? " inverse " : " ") + (llama3 ? "llama3 " : "") + r.str();
          OpCase oc = make_rope_case(d, r, inverse, llama3);
          const Outputs o = run_both(oc);
          ASSERT_EQ(o.got.size(), 1u) << what;
          expect_close(o.got[0], o.ref[0], d, what);
          const int64_t W = (r.group + 2) * r.D;
          for (int64_t row = 0; row < r.B * r.T * r.S; ++row)
            for (int64_t e = (r.group + 1) * r.D; e < W; ++e) {
              ASSERT_EQ(o.got[0].get(row * W + e), oc.input(0).get(row * W + e)) << what << " value part";
              ASSERT_EQ(o.ref[0].get(row * W + e), oc.input(0).get(row * W + e)) << what << " value part";
            }
        }
}

// Per-token positions [B, T] (packed rows): CPU against the reference, and each row (b, t) rotated
// as rope with positions [T] rotates it when its position is the same.
TEST_P(BackendOpsAttention, RopePerTokenPositions) {
  LOOM_REQUIRE_OPS(OpKind::rope);
  for (DType d : kFloatTypes)
    for (bool inverse : {false, true}) {
      const RopeShape r{2, 7, 3, 1, 8};
      OpCase per_token(OpKind::rope, {{Shape{r.B, r.T, r.S, (r.group + 2) * r.D}, d}, {Shape{r.B, r.T}, DType::i32}},
                       RopeAttrs{.theta = 10000.f, .group = r.group, .inverse = inverse});
      per_token.fill_random(next_seed(), 4096);
      const std::string what = "rope per token " + dn(d) + (inverse ? " inverse " : " ") + r.str();
      const Outputs o = run_both(per_token);
      expect_close(o.got[0], o.ref[0], d, what);
      for (int64_t b = 0; b < r.B; ++b) {
        OpCase one = make_rope_case(d, {1, r.T, r.S, r.group, r.D}, inverse);
        const int64_t n = r.T * r.S * (r.group + 2) * r.D;
        for (int64_t k = 0; k < n; ++k) one.input(0).set(k, per_token.input(0).get(b * n + k));
        for (int64_t t = 0; t < r.T; ++t) one.input(1).set_i32(t, per_token.input(1).get_i32(b * r.T + t));
        const HostTensor want = one.run(testing::under_test()).at(0);
        for (int64_t k = 0; k < n; ++k) ASSERT_EQ(o.got[0].get(b * n + k), want.get(k)) << what << " row " << b;
      }
    }
}

// The definition on both backends: position 0 is the identity; with D = 2 the one frequency is 1,
// so the angle is the position itself (transformers: cos(p)·x0 − sin(p)·x1, cos(p)·x1 + sin(p)·x0);
// the inverse undoes the rotation.
TEST_P(BackendOpsAttention, RopeDefinition) {
  LOOM_REQUIRE_OPS(OpKind::rope);
  ReferenceBackend ref;
  for (Backend* be : {&testing::under_test(), static_cast<Backend*>(&ref)}) {
    OpCase oc = make_rope_case(DType::f32, {1, 3, 1, 1, 2}, false);  // row: q0 q1 k0 k1 v0 v1
    for (int32_t t = 0; t < 3; ++t) oc.input(1).set_i32(t, t * 5);   // positions 0, 5, 10
    const HostTensor x = oc.input(0);
    const HostTensor y = oc.run(*be).at(0);
    for (int64_t e = 0; e < 6; ++e) EXPECT_EQ(y.get(e), x.get(e)) << be->name() << " position 0";
    for (int64_t t = 1; t < 3; ++t)
      for (int64_t h = 0; h < 2; ++h) {
        const double c = std::cos(5.0 * t), sn = std::sin(5.0 * t);
        const int64_t i = t * 6 + h * 2;
        EXPECT_NEAR(y.get(i), c * x.get(i) - sn * x.get(i + 1), 1e-6) << be->name() << " t=" << t;
        EXPECT_NEAR(y.get(i + 1), c * x.get(i + 1) + sn * x.get(i), 1e-6) << be->name() << " t=" << t;
      }
    OpCase back = make_rope_case(DType::f32, {1, 3, 1, 1, 2}, true);
    back.input(0) = y;
    back.input(1) = oc.input(1);
    const HostTensor z = back.run(*be).at(0);
    for (int64_t i = 0; i < 18; ++i) EXPECT_NEAR(z.get(i), x.get(i), 1e-6 * (1 + std::fabs(x.get(i)))) << be->name();
  }
}

// llama3 frequencies against REFERENCE-models.md's values for Llama 3.1 (theta 5e5, D = 128,
// factor 8, low 1, high 4, original 8192), computed there from transformers' formula: i = 0..28
// kept, 29..34 blended, 35..63 divided by 8; at i = 30 the default frequency is 1.553415 times the
// scaled one.
TEST(RopeFrequencies, Llama3MatchesTransformersBands) {
  const RopeAttrs plain{.theta = 500000.f};
  RopeAttrs l3 = plain;
  l3.llama3_factor = 8.f;
  l3.low_freq_factor = 1.f;
  l3.high_freq_factor = 4.f;
  l3.original_max_position = 8192;
  for (int64_t i = 0; i < 64; ++i) {
    const double ratio = double{rope_inv_freq(plain, 128, i)} / rope_inv_freq(l3, 128, i);
    if (i <= 28) {
      EXPECT_EQ(ratio, 1.0) << i;
    } else if (i >= 35) {
      EXPECT_NEAR(ratio, 8.0, 1e-6) << i;
    } else {
      EXPECT_TRUE(ratio > 1.0 + 1e-3 && ratio < 8.0 - 1e-3) << i << " " << ratio;
    }
  }
  EXPECT_NEAR(double{rope_inv_freq(plain, 128, 30)} / rope_inv_freq(l3, 128, 30), 1.553415, 2e-6);
  EXPECT_NEAR(double{rope_inv_freq(plain, 128, 40)} / rope_inv_freq(l3, 128, 40), 8.0, 1e-6);
  // The table is what the angle uses.
  const RopeCosSin cs = rope_cos_sin(l3, 128, 40, 1000);
  EXPECT_FLOAT_EQ(cs.cos, static_cast<float>(std::cos(1000.f * rope_inv_freq(l3, 128, 40))));
}

TEST(CpuThreadsAttention, Rope) {
  for (DType d : {DType::f32, DType::bf16}) {
    OpCase oc = make_rope_case(d, {4, 64, 4, 2, 64}, false);
    expect_thread_invariant(oc, "rope " + dn(d));
  }
}

}  // namespace
}  // namespace loom
