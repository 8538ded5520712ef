// CPU kernels for attention and its backward op (graph/ops/attention.cpp has the formulas).
//
// One (batch, head) pair per iteration of an OpenMP loop (grouped-query attention: the forward's
// pairs are (batch, query head), each reading its group's K and V; the backward's are (batch,
// key/value head), running the group's query heads in turn, so that one thread owns its dK, dV). Each pair packs Q
// (scaled and rounded) as a contiguous f32 [T, D] matrix in its thread's span of the node's workspace (workspace.h); K
// (rounded to the softmax dtype), V and dO are packed likewise only when they need a conversion or
// rounding; f32 ones are read in place, with the tensor's row stride (small heads made the per-row
// copies a large part of the time). For product() (below), Kᵀ, and in the backward Vᵀ, are
// transposed into the workspace as [D, Tp] (T rounded up to whole vectors, zero padded), so that
// every product reads its right operand by rows. Results go straight into out / dqkv the same way
// when nothing rounds them. The pair then walks the query rows in blocks: per block it forms the
// logits against the keys the block sees, runs the masked softmax row by row in f32 and multiplies
// by V. The logits never leave the thread's workspace: only out and the f32 row statistics lse are
// stored, and the backward recomputes the logits from qkv and lse (flash-attention style memory).
//
// Products: a block's products are small (64×64×32 at nanoGPT's T = 64, D = 32), and there a
// dnnl_sgemm call spends about as long in its own overhead as in arithmetic. Where D is whole
// vectors and the keys a row block reaches are few enough (Geometry::hand, kHandMaxTD),
// simd::product() runs them instead (backend/cpu/simd/: register-blocked loops written with GCC
// vector types). Otherwise they go to a single-threaded sgemm.
//
// Determinism: a pair is computed start to finish by one thread, with single-threaded sgemm
// (nthreads-var lowered to 1 inside our region, as in dense.cpp) or product(), whose elements each
// sum over k in order, and fixed-order row sums, so the results depend only on the shapes and
// values, never on the thread count or the schedule.
//
// Causal masking: query rows [r0, r1) see only keys [0, r1), so each block of kBq rows computes
// its products against those keys and skips the blocks above the diagonal (with a sliding window
// or packed examples also the whole kBq-blocks of keys before the window or the example of row
// r0: Geometry::block_first_key); inside the diagonal
// block the masked weights are zeroed, and product() also leaves out the tiles and terms of it
// that are all masked (Skip). Without the mask one block covers all rows and keys. The backward's
// dV and dK (sums over query rows) accumulate block by block. Skipped and zeroed terms are exact
// zeros, so blocking changes only f32 summation orders, and the blocks depend only on T, never on
// the thread count. A masked logit is finfo(softmax_dtype).min in the reference; here it is −inf,
// left out of the row's max (or, past the row's width, its weight is set to 0 directly), which is
// the same thing: exp(min − max) is 0 in float for any finite row max (the diagonal is never
// masked). The elementwise row loops and the softmax's max and sum run over each row's keys
// rounded up to whole vectors (row_width), so the vectorised exp has no scalar tail: the extra
// entries are masked, their exp exactly 0, and sum_f32 assigns lanes by position, so the results
// are bit for bit those of loops over the keys alone. The backward's row sum Σ p·dp stays over
// the keys: GCC contracts dot_f32's products into FMAs differently in its vector body and its
// scalar tail, so moving products from one to the other would change roundings. A block's logits
// are stored with their row stride rounded up to whole vectors too (cp), which product() needs.
//
// FLOPs: forward 4·B·H·D per (query, key) pair computed; backward 8 per pair plus 2 to recompute
// the logits. Full attention computes T² pairs. Causal blocks through sgemm compute
// T·(T + kBq)/2 when kBq divides T (62.5% of T² at T = 256); product() trims the diagonal blocks
// to whole tiles, close to the T·(T + 1)/2 unmasked pairs the op's cost rule counts. With a window
// W every pass (forward, backward, and the decoder's one row) computes only the key blocks that
// reach into it: a block's rows from the first key of its first row rounded down to kBq, about
// T·(W + kBq) pairs (W a multiple of kBq; up to kBq − 1 keys more per row otherwise), against the
// W·(W + 1)/2 + (T − W)·W unmasked ones; packed examples likewise, about Σ n·(n + kBq) over a
// row's examples of n tokens. bench/families.py's window_ir counts the instructions.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_util.h"
#include "backend/cpu/simd/product.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Query rows per causal block. Smaller blocks skip more of the masked triangle (the diagonal
// blocks are computed whole) but make smaller sgemm calls; 64 balances the two (of 32, 48, 64 and
// 128 it is the fastest at T = 256, D = 64, one thread, forward plus backward).
constexpr int64_t kBq = 64;

// The row loops' widths are multiples of simd::kLanes (see row_width).
using simd::kLanes;
using simd::kW;
using simd::Prod;
using simd::Skip;
using simd::whole_vectors;

// kHandMaxTD bounds simd::product()'s domain besides whole vectors per head (see Geometry::hand):
// the keys one row block computes (Geometry::block_span: T, or about the window plus a block)
// times D at most this, and blocks of at most kBq query rows. Past it oneDNN's sgemm, which packs
// its operands into cache-sized panels, is the faster: in whole attention + attention_grad per
// step (docs/performance.md), product() wins with AVX-512 up to span·D = 131072 (T = 2048 at
// D = 64, T = 1024 at D = 128) and loses at 262144 (T = 4096 at D = 64); with AVX2's half-width
// vectors it wins up to 32768 and loses at 65536.
constexpr int64_t kHandMaxTD = kW == 16 ? 131072 : 32768;

// qkv [B, T, KV, (G+2)·D]: KV key/value heads, each with G query heads (H = KV·G).
struct Geometry {
  int64_t B, T, KV, G, H, D;
  DType d, s;  // qkv dtype, softmax dtype
  bool causal;
  int64_t window;  // 0: none (AttentionAttrs::window)
  float scale;     // round_d(D^-0.5), or of AttentionAttrs::scale
  // [B, T], each token's position in its example (packed rows, ops.def), or nullptr: one sequence.
  const int32_t* positions;
  explicit Geometry(const TensorArg& qkv, const AttentionAttrs& at, const int32_t* positions = nullptr)
      : B(qkv.shape[0]),
        T(qkv.shape[1]),
        KV(qkv.shape[2]),
        G(at.group),
        H(qkv.shape[2] * at.group),
        D(qkv.shape[3] / (at.group + 2)),
        d(qkv.dtype),
        s(at.softmax_dtype),
        causal(at.causal),
        window(at.window),
        scale(round_to(qkv.dtype, static_cast<float>(attention_scale(at, D)))),
        positions(positions) {}
  // Offset of element 0 of query head h's part (0 = its q, 1 = its group's k, 2 = v) of row (b, t)
  // in qkv / dqkv.
  int64_t qkv_at(int64_t b, int64_t t, int64_t h, int part) const {
    const int64_t slot = part == 0 ? h % G : G + part - 1;
    return ((b * T + t) * KV + h / G) * (G + 2) * D + slot * D;
  }
  int64_t qkv_ld() const { return KV * (G + 2) * D; }  // between rows t of qkv
  int64_t out_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }
  // Query row i of sequence b sees keys [first_key(b, i), keys(i)): the window's, and its own
  // example's (an example starts at i − positions[b, i]). Both never decrease with i.
  int64_t keys(int64_t i) const { return causal ? i + 1 : T; }
  int64_t first_key(int64_t b, int64_t i) const {
    const int64_t w = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
    return positions ? std::max<int64_t>(w, i - positions[b * T + i]) : w;
  }
  // Query rows per block, and the keys [block_first_key(b, r0), block_keys(r1)) that the block of
  // rows [r0, r1) computes: with a window or packed examples it starts at the first key of row r0
  // rounded down to a block (whole vectors, so Kᵀ's columns from it stay aligned), so a block's
  // work is O(window + kBq), or O(example + kBq): the pairs of a packed row are about the sum of its
  // examples' squares, not T². Keys outside a row's window or example inside that range are masked
  // like the causal ones.
  int64_t block_rows() const { return causal ? std::min(kBq, T) : T; }
  int64_t block_first_key(int64_t b, int64_t r0) const { return first_key(b, r0) / kBq * kBq; }
  int64_t block_keys(int64_t r1) const { return causal ? r1 : T; }
  // The width the row loops of row i run over in a block of c keys from k0: its keys rounded up to
  // whole vectors, so the vectorised exp has no scalar tail; past it the row is all masked (weight 0).
  int64_t row_width(int64_t i, int64_t k0, int64_t c) const { return std::min(c, whole_vectors(keys(i) - k0)); }
  // Columns of the transposed Kᵀ and Vᵀ, and the most a block's logits have per row.
  int64_t Tp() const { return whole_vectors(T); }
  // The most keys one row block computes: T, or with a window its span rounded out to blocks.
  int64_t block_span() const { return causal && window > 0 ? std::min(T, (window + 2 * kBq - 2) / kBq * kBq) : T; }
  // Whether the block products go through product() rather than sgemm.
  bool hand() const { return D % kW == 0 && block_span() * D <= kHandMaxTD && block_rows() <= kBq; }
  // Whether the pair loop is worth the pool: ~T²·D multiply-adds per pair.
  bool parallel() const { return B * H > 1 && B * H * T * T * D >= (int64_t{1} << 16); }
};

// p through product() when the geometry's heads suit it, else through sgemm (which computes the
// terms p.skip names too; they are exact zeros either way).
void mul(const Geometry& g, Prod p) {
  if (!g.causal) p.skip = Skip::none;
  const bool tb = p.Bt != nullptr;
  if (g.hand())
    simd::product(p);
  else
    sgemm_rm(p.ta, tb, p.M, p.N, p.K, 1.f, p.A, p.lda, tb ? p.Bt : p.B, tb ? p.ldbt : p.ldb, p.acc ? 1.f : 0.f, p.C,
             p.ldc);
}

// Pair (b, h)'s T rows of D elements in a tensor: element e of row t is at off + t·ld + e.
struct Slice {
  const TensorArg& x;
  int64_t off, ld;
};
Slice qkv_part(const Geometry& g, const TensorArg& qkv, int64_t b, int64_t h, int part) {
  return {qkv, g.qkv_at(b, 0, h, part), g.qkv_ld()};
}
Slice out_rows(const Geometry& g, const TensorArg& out, int64_t b, int64_t h) {
  return {out, g.out_at(b, 0, h), g.H * g.D};
}

// A pair's [T, D] f32 operand or result as the products see it: row t at p + t·ld. `copy`: p is
// scratch (a converted copy, or a result still to be stored), not the tensor's own rows.
struct Rows {
  float* p;
  int64_t ld;
  bool copy;
};

// The slice rounded to r as an operand: the tensor's own rows when they are f32 and r changes
// nothing (no packing: the products take the stride), else a converted copy in buf.
Rows operand(const Geometry& g, const Slice& s, DType r, float* buf) {
  if (s.x.dtype == DType::f32 && r == DType::f32) return {s.x.as<float>() + s.off, s.ld, false};
  for (int64_t t = 0; t < g.T; ++t) load_f32(s.x.data, s.x.dtype, s.off + t * s.ld, buf + t * g.D, g.D);
  if (rounding_changes(s.x.dtype, r)) round_inplace(buf, g.T * g.D, r);
  return {buf, g.D, true};
}

// Where a result bound for the slice is formed: straight in the tensor's rows when `in_place`
// (f32, and no rounding left to apply), else in buf until store() converts it.
Rows result(const Geometry& g, const Slice& s, bool in_place, float* buf) {
  return in_place ? Rows{s.x.as<float>() + s.off, s.ld, false} : Rows{buf, g.D, true};
}

// Converts a result formed in scratch into the slice (one formed in place is there already).
void store(const Geometry& g, const Rows& r, const Slice& s) {
  if (r.copy)
    for (int64_t t = 0; t < g.T; ++t) store_f32(r.p + t * g.D, s.x.data, s.x.dtype, s.off + t * s.ld, g.D);
}

// Q = round_s(round_d(q·scale)) of pair (b, h), packed [T, D] (the scaling needs a copy anyway).
void pack_q(const Geometry& g, const Slice& q, float* Q) {
  for (int64_t t = 0; t < g.T; ++t) {
    float* row = Q + t * g.D;
    load_f32(q.x.data, q.x.dtype, q.off + t * q.ld, row, g.D);
    for (int64_t e = 0; e < g.D; ++e) row[e] *= g.scale;
  }
  round_inplace(Q, g.T * g.D, g.d);
  if (rounding_changes(g.d, g.s)) round_inplace(Q, g.T * g.D, g.s);
}

// Xt = Xᵀ of the pair's rows X, [D, Tp] (row e at Xt + e·Tp), zero past column T (the logits'
// padding columns read it; zeros keep them finite and cheap). D is whole vectors (g.hand()):
// kW×kW blocks go through registers, the rows past the last whole block element by element.
void transpose(const Geometry& g, const Rows& x, float* Xt) {
  const int64_t Tp = g.Tp();
  int64_t t0 = 0;
  for (; t0 + kW <= g.T; t0 += kW)
    for (int64_t e0 = 0; e0 < g.D; e0 += kW) simd::transpose_block(x.p + t0 * x.ld + e0, x.ld, Xt + e0 * Tp + t0, Tp);
  for (int64_t e = 0; e < g.D; ++e) {
    float* row = Xt + e * Tp;
    for (int64_t t = t0; t < g.T; ++t) row[t] = x.p[t * x.ld + e];
    std::fill(row + g.T, row + Tp, 0.f);
  }
}

// S = round_s(Q[r0, r1)·K[k0, k0 + c)ᵀ) (Kt = Kᵀ when g.hand()), [r1 − r0, c] with row stride
// whole_vectors(c), with the masked logits within each row's width set to −inf: they drop out of
// the row's max, and exp of them is exactly 0, so the row loops run over whole vectors instead of
// each row's own length (its sums gain only exact zeros). Past its width a row is left unset
// (product() may skip it).
void logits(const Geometry& g, const float* Q, const Rows& K, const float* Kt, int64_t b, int64_t r0, int64_t r1,
            int64_t k0, int64_t c, float* S) {
  const int64_t cp = whole_vectors(c);
  mul(g, {false, r1 - r0, c, g.D, Q + r0 * g.D, g.D, Kt ? Kt + k0 : nullptr, g.Tp(), S, cp, false, Skip::cols, r0 - k0,
          K.p + k0 * K.ld, K.ld});
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int64_t i = r0; i < r1; ++i) {
    float* row = S + (i - r0) * cp;
    const int64_t w = g.row_width(i, k0, c);
    round_inplace(row, w, g.s);
    std::fill(row + g.keys(i) - k0, row + w, kMasked);
    std::fill(row, row + g.first_key(b, i) - k0, kMasked);
  }
}

// A row of n logits (already round_s'd; masked ones −inf, which get weight 0) becomes the weights
// w = round_d(round_s(softmax)) in place (f32 max, exp and sum); returns the row's
// lse = max + log Σ exp.
float softmax_weights(const Geometry& g, float* row, int64_t n) {
  const float mx = max_f32(row, n);
  for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - mx);
  const float sum = sum_f32(row, n);
  for (int64_t j = 0; j < n; ++j) row[j] /= sum;
  if (g.s != DType::f32) round_inplace(row, n, g.s);
  if (rounding_changes(g.s, g.d)) round_inplace(row, n, g.d);
  return mx + std::log(sum);
}

// One pair's f32 blocks in its thread's span of the workspace, taken in the order of the fields
// (designated initializers are evaluated in order). Forward: Q, and K, V and O [T, D]
// (used when their tensors need converting, see operand and result), Kᵀ [D, Tp] (product() only)
// and one row block's logits, then weights [bq, Tp].
struct ForwardBlocks {
  float *Q, *K, *V, *O, *Kt, *S;
};
ForwardBlocks forward_blocks(Bump& b, const Geometry& g) {
  const int64_t TD = g.T * g.D, nt = g.hand() ? g.D * g.Tp() : 0, block = g.block_rows() * g.Tp();
  return {.Q = b.take<float>(TD),
          .K = b.take<float>(TD),
          .V = b.take<float>(TD),
          .O = b.take<float>(TD),
          .Kt = b.take<float>(nt),
          .S = b.take<float>(block)};
}
// Backward: Q, K, V, dO, dQ, dK, dV [T, D] (K to dV as in the forward), Kᵀ and Vᵀ [D, Tp], and two
// row blocks [bq, Tp]: P, and W, dP, dS in turn.
struct BackwardBlocks {
  float *Q, *K, *V, *dO, *dQ, *dK, *dV, *Kt, *Vt, *P, *dS;
};
BackwardBlocks backward_blocks(Bump& b, const Geometry& g) {
  const int64_t TD = g.T * g.D, nt = g.hand() ? g.D * g.Tp() : 0, block = g.block_rows() * g.Tp();
  return {.Q = b.take<float>(TD),
          .K = b.take<float>(TD),
          .V = b.take<float>(TD),
          .dO = b.take<float>(TD),
          .dQ = b.take<float>(TD),
          .dK = b.take<float>(TD),
          .dV = b.take<float>(TD),
          .Kt = b.take<float>(nt),
          .Vt = b.take<float>(nt),
          .P = b.take<float>(block),
          .dS = b.take<float>(block)};
}

// Per thread of the pair loop (team threads), a span that `Layout` carves one pair's blocks from.
// The forward's loop is over (batch, query head) pairs, the backward's over (batch, key/value
// head) pairs (kPerKvHead), whose group of query heads adds into one dK and dV.
struct PairSpans {
  PerThread<std::byte> pair;
  int team;
};
// The largest sgemm call (sgemm_call_bytes) a pair makes through mul(): each product of each row
// block of cpu_attention (grad false) or cpu_attention_grad, with the strides operand() and
// result() give its operands. A block's first key depends on the data with packed rows (`packed`:
// positions): then every multiple of kBq from the window's first key to the block's own first row.
int64_t largest_pair_call(const Geometry& g, bool grad, bool packed) {
  if (g.hand() || g.B * g.H == 0 || g.T == 0) return 0;
  const int64_t T = g.T, D = g.D, bq = g.block_rows();
  const bool f32 = g.d == DType::f32, both_f32 = f32 && g.s == DType::f32;
  // Row strides: K (rounded to s) and V read in place when f32, else packed [T, D]; out and dout
  // [B, T, H, D]; dQ and dK formed in place when nothing rounds them, dV when f32.
  const int64_t k_ld = both_f32 ? g.qkv_ld() : D, v_ld = f32 ? g.qkv_ld() : D, o_ld = f32 ? g.H * D : D;
  const int64_t dqk_ld = both_f32 ? g.qkv_ld() : D, dv_ld = f32 ? g.qkv_ld() : D;
  int64_t most = 0;
  const auto call = [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    most = std::max(most, sgemm_call_bytes(ta, tb, M, N, K, lda, ldb, ldc));
  };
  std::vector<char> seen(2 * static_cast<size_t>(T + 1));  // (whole block?, keys) already counted
  for (int64_t r0 = 0; r0 < T; r0 += bq) {
    const int64_t r1 = std::min(T, r0 + bq), m = r1 - r0;
    const int64_t first = g.window > 0 ? std::max<int64_t>(0, r0 - g.window + 1) : 0;
    for (int64_t k0 = first / kBq * kBq; k0 <= (packed ? r0 : first) / kBq * kBq; k0 += kBq) {
      const int64_t c = g.block_keys(r1) - k0, cp = whole_vectors(c);
      char& done = seen[static_cast<size_t>((m == bq ? T + 1 : 0) + c)];
      if (done) continue;
      done = 1;
      call(false, true, m, c, D, D, k_ld, cp);  // logits: Q·Kᵀ
      if (!grad) {
        call(false, false, m, D, c, cp, v_ld, o_ld);  // W·V
        continue;
      }
      call(true, false, c, D, m, cp, o_ld, dv_ld);    // dV += Wᵀ·dO
      call(false, true, m, c, D, o_ld, v_ld, cp);     // dP = dO·Vᵀ
      call(false, false, m, D, c, cp, k_ld, dqk_ld);  // dQ = dS·K
      call(true, false, c, D, m, cp, D, dqk_ld);      // dK += dSᵀ·Q
    }
  }
  return most;
}

template <auto Layout, bool kPerKvHead>
PairSpans pair_spans(Bump& ws, const KernelArgs& a) {
  const Geometry g(a.in[0], std::get<AttentionAttrs>(a.node.attrs));
  Bump one = Bump::counter(1);
  if (g.B * g.H > 0 && g.T > 0) Layout(one, g);
  const int team = ws.team(g.parallel(), kPerKvHead ? g.B * g.KV : g.B * g.H);
  // The backward (the loop over key/value heads) has positions as input 3, the forward as input 1.
  ws.library(largest_pair_call(g, kPerKvHead, a.in.size() > (kPerKvHead ? 3u : 1u)), team);
  return {ws.per_thread<std::byte>(one.used(), team), team};
}
}  // namespace

// Per pair: S = round_s(Q·Kᵀ); per row p = softmax (f32 max/exp/sum, round_s when 16-bit),
// lse = max + log Σ, w = round_d(p) (masked: 0); out = round_d(W·V).
void cpu_attention(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& out = a.out[0];
  const Geometry g(qkv, at, a.in.size() > 1 ? a.in[1].as<const int32_t>() : nullptr);
  LOOM_ASSERT(out.shape == (Shape{g.B, g.T, g.H, g.D}) && out.dtype == g.d);
  LOOM_ASSERT(a.out[1].shape == (Shape{g.B, g.H, g.T}) && a.out[1].dtype == DType::f32);
  float* lse = a.out[1].as<float>();
  const int64_t T = g.T, D = g.D, pairs = g.B * g.H;
  if (pairs == 0 || T == 0) return;
  Bump ws(a.workspace);
  const PairSpans sp = pair_spans<forward_blocks, false>(ws, a);
#pragma omp parallel for schedule(dynamic, 1) num_threads(sp.team)
  for (int64_t pr = 0; pr < pairs; ++pr) {
    omp_set_num_threads(1);  // this implicit task's copy: the sgemm runs single-threaded
    const int64_t b = pr / g.H, h = pr % g.H, bq = g.block_rows();
    Bump mine_ws(mine(sp.pair));
    const ForwardBlocks fb = forward_blocks(mine_ws, g);
    float* Q = fb.Q;
    float* S = fb.S;
    pack_q(g, qkv_part(g, qkv, b, h, 0), Q);
    const Rows K = operand(g, qkv_part(g, qkv, b, h, 1), g.s, fb.K);
    if (g.hand()) transpose(g, K, fb.Kt);
    const Rows V = operand(g, qkv_part(g, qkv, b, h, 2), DType::f32, fb.V);
    const Slice o = out_rows(g, out, b, h);
    const Rows O = result(g, o, g.d == DType::f32, fb.O);
    for (int64_t r0 = 0; r0 < T; r0 += bq) {
      const int64_t r1 = std::min(T, r0 + bq), k0 = g.block_first_key(b, r0), c = g.block_keys(r1) - k0;
      const int64_t cp = whole_vectors(c);
      logits(g, Q, K, fb.Kt, b, r0, r1, k0, c, S);
      for (int64_t i = r0; i < r1; ++i) {
        float* row = S + (i - r0) * cp;
        const int64_t w = g.row_width(i, k0, c);
        lse[pr * T + i] = softmax_weights(g, row, w);
        std::fill(row + w, row + c, 0.f);
      }
      mul(g, {false, r1 - r0, D, c, S, cp, V.p + k0 * V.ld, V.ld, O.p + r0 * O.ld, O.ld, false, Skip::k_hi, r0 - k0});
    }
    store(g, O, o);
  }
}

// Per pair, with P recomputed from lse:
//   P = round_s(exp(round_s(Q·Kᵀ) − lse)) (masked 0), W = round_d(P)
//   dV = round_d(Wᵀ·dO)                  dP = round_s(round_d(dO·Vᵀ))
//   dS = round_s(P·(dP − rowsum(P·dP)))   dK = round_d(round_s(dSᵀ·Q))
//   dQ = round_d(round_d(round_s(dS·K))·scale)
void cpu_attention_grad(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& dout = a.in[2];
  const TensorArg& dqkv = a.out[0];
  const Geometry g(qkv, at, a.in.size() > 3 ? a.in[3].as<const int32_t>() : nullptr);
  LOOM_ASSERT(a.in[1].shape == (Shape{g.B, g.H, g.T}) && a.in[1].dtype == DType::f32);
  LOOM_ASSERT(dout.shape == (Shape{g.B, g.T, g.H, g.D}) && dout.dtype == g.d);
  LOOM_ASSERT(dqkv.shape == qkv.shape && dqkv.dtype == g.d);
  const float* lse = a.in[1].as<const float>();
  const int64_t T = g.T, D = g.D, pairs = g.B * g.H;
  if (pairs == 0 || T == 0) return;
  // W differs from P only when rounding p to d changes it.
  const bool w_is_p = !rounding_changes(g.s, g.d);
  Bump ws(a.workspace);
  const PairSpans sp = pair_spans<backward_blocks, true>(ws, a);
  // One (batch, key/value head) pair per iteration: its K and V are packed once, and the query
  // heads of its group add into its dK and dV in turn (so no two threads write the same rows).
#pragma omp parallel for schedule(dynamic, 1) num_threads(sp.team)
  for (int64_t kp = 0; kp < g.B * g.KV; ++kp) {
    omp_set_num_threads(1);
    const int64_t b = kp / g.KV, h0 = kp % g.KV * g.G, bq = g.block_rows(), Tp = g.Tp();
    Bump mine_ws(mine(sp.pair));
    const BackwardBlocks bb = backward_blocks(mine_ws, g);
    float* Q = bb.Q;
    float* Kt = bb.Kt;
    float* Vt = bb.Vt;
    float* P = bb.P;    // one row block's probabilities
    float* dS = bb.dS;  // the block's W, then dP, then dS
    const Rows K = operand(g, qkv_part(g, qkv, b, h0, 1), g.s, bb.K);
    const Rows V = operand(g, qkv_part(g, qkv, b, h0, 2), DType::f32, bb.V);
    if (g.hand()) {
      transpose(g, K, Kt);
      transpose(g, V, Vt);
    }
    // dQ and dK are rounded to s before they are stored, dV only to d. dQ's scaling is no rounding
    // step: it is applied in place below.
    const bool in_place = g.d == DType::f32 && g.s == DType::f32;
    const Slice dk = qkv_part(g, dqkv, b, h0, 1), dv = qkv_part(g, dqkv, b, h0, 2);
    const Rows dK = result(g, dk, in_place, bb.dK);
    const Rows dV = result(g, dv, g.d == DType::f32, bb.dV);
    // The row blocks of every query head of the group add into dK and dV, each reaching keys [0, c) only.
    for (int64_t t = 0; t < T; ++t) {
      std::fill_n(dK.p + t * dK.ld, D, 0.f);
      std::fill_n(dV.p + t * dV.ld, D, 0.f);
    }
    for (int64_t h = h0; h < h0 + g.G; ++h) {
      const int64_t pr = b * g.H + h;
      pack_q(g, qkv_part(g, qkv, b, h, 0), Q);
      const Rows dO = operand(g, out_rows(g, dout, b, h), DType::f32, bb.dO);
      const Slice dq = qkv_part(g, dqkv, b, h, 0);
      const Rows dQ = result(g, dq, in_place, bb.dQ);
      for (int64_t r0 = 0; r0 < T; r0 += bq) {
        const int64_t r1 = std::min(T, r0 + bq), m = r1 - r0, k0 = g.block_first_key(b, r0);
        const int64_t c = g.block_keys(r1) - k0, cp = whole_vectors(c);
        logits(g, Q, K, Kt, b, r0, r1, k0, c, P);
        // P, W and dS are zero past each row's width, up to the padded stride cp (so the whole
        // block rounds and copies as one run).
        for (int64_t i = r0; i < r1; ++i) {
          float* row = P + (i - r0) * cp;
          const int64_t w = g.row_width(i, k0, c);
          const float l = lse[pr * T + i];
          for (int64_t j = 0; j < w; ++j) row[j] = exp_f32(row[j] - l);
          std::fill(row + w, row + cp, 0.f);
        }
        round_inplace(P, m * cp, g.s);
        // dV[k0, k0 + c) += W[r0, r1)ᵀ·dO[r0, r1)
        const float* W = P;
        if (!w_is_p) {
          std::copy(P, P + m * cp, dS);
          round_inplace(dS, m * cp, g.d);
          W = dS;
        }
        mul(g, {true, c, D, m, W, cp, dO.p + r0 * dO.ld, dO.ld, dV.p + k0 * dV.ld, dV.ld, true, Skip::k_lo, r0 - k0});
        // dP = round_s(round_d(dO[r0, r1)·V[k0, k0 + c)ᵀ)), then dS row by row in place.
        mul(g, {false, m, c, D, dO.p + r0 * dO.ld, dO.ld, Vt ? Vt + k0 : nullptr, Tp, dS, cp, false, Skip::cols,
                r0 - k0, V.p + k0 * V.ld, V.ld});
        round_inplace(dS, m * cp, g.d);
        if (rounding_changes(g.d, g.s)) round_inplace(dS, m * cp, g.s);
        for (int64_t i = r0; i < r1; ++i) {
          float* ds = dS + (i - r0) * cp;
          const float* p = P + (i - r0) * cp;
          const int64_t n = g.keys(i) - k0, w = g.row_width(i, k0, c);
          // The row sum over the keys only (see the header: FMA contraction differs in dot_f32's tail).
          const float rs = dot_f32(p, ds, n);
          for (int64_t j = 0; j < w; ++j) ds[j] = p[j] * (ds[j] - rs);
          std::fill(ds + n, ds + cp, 0.f);
        }
        round_inplace(dS, m * cp, g.s);
        // dQ[r0, r1) = dS·K[k0, k0 + c), dK[k0, k0 + c) += dSᵀ·Q[r0, r1)
        mul(g, {false, m, D, c, dS, cp, K.p + k0 * K.ld, K.ld, dQ.p + r0 * dQ.ld, dQ.ld, false, Skip::k_hi, r0 - k0});
        mul(g, {true, c, D, m, dS, cp, Q + r0 * D, D, dK.p + k0 * dK.ld, dK.ld, true, Skip::k_lo, r0 - k0});
      }
      const bool round_dq_d = rounding_changes(g.s, g.d);
      for (int64_t t = 0; t < T; ++t) {
        float* q = dQ.p + t * dQ.ld;
        round_inplace(q, D, g.s);
        if (round_dq_d) round_inplace(q, D, g.d);
        for (int64_t e = 0; e < D; ++e) q[e] *= g.scale;
      }
      store(g, dQ, dq);
    }
    for (int64_t t = 0; t < T; ++t) round_inplace(dK.p + t * dK.ld, D, g.s);
    store(g, dK, dk);
    store(g, dV, dv);
  }
}

// One decoding step (KV cache): copy the token's k, v (one per key/value head) into cache row pos,
// then per (b, h), h a query head reading its group's cache rows, one query against rows [0, pos]
// (with a window W, rows [pos − W + 1, pos] only): logits by dot products (f32, fixed order), the
// same softmax and roundings as cpu_attention, out = round_d(Σ_j w_j·v_j) accumulated over j in
// order. The work is tiny (B·H·(pos+1)·D multiply-adds), so pairs go parallel only when there are
// enough of them.
// Workspace, per thread: q, a cache row (k or v), o [D] and the weights [Tmax] (sized for the
// longest prefix: the plan cannot know pos).
namespace {
// Token t of qkv's keys and values (one per key/value head) into row `row` of the caches
// [B, Tmax, KV, D]: exact copies, the caches have qkv's dtype.
void store_kv(const Geometry& g, const TensorArg& qkv, const TensorArg& kc, const TensorArg& vc, int64_t t,
              int64_t row) {
  const auto esz = static_cast<int64_t>(dtype_size(g.d));
  const int64_t Tmax = kc.shape[1], n = g.D * esz;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t kv = 0; kv < g.KV; ++kv) {
      const auto* src = static_cast<const char*>(qkv.data) + g.qkv_at(b, t, kv * g.G, 1) * esz;
      const int64_t dst = ((b * Tmax + row) * g.KV + kv) * n;
      std::memcpy(static_cast<char*>(kc.data) + dst, src, static_cast<size_t>(n));
      std::memcpy(static_cast<char*>(vc.data) + dst, src + n, static_cast<size_t>(n));
    }
}

// Asks for the cache lines of elements [off, off + n) of t.
void prefetch_row(const TensorArg& t, int64_t off, int64_t n) {
  const auto* p = static_cast<const char*>(t.data);
  const auto size = static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t byte = off * size; byte < (off + n) * size; byte += 64) __builtin_prefetch(p + byte);
}
bool decode_parallel(int64_t pairs, int64_t n, int64_t D) { return pairs > 1 && pairs * n * D >= (int64_t{1} << 16); }
struct DecodeSpans {
  PerThread<float> q, row, o, w;
  int team;
};
DecodeSpans attention_decode_spans(Bump& ws, const KernelArgs& a) {
  const Geometry g(a.in[0], std::get<AttentionAttrs>(a.node.attrs));
  const int64_t Tmax = a.in[1].shape[1], pairs = g.B * g.H;
  const int team = ws.team(decode_parallel(pairs, Tmax, g.D), pairs);
  return {.q = ws.per_thread<float>(g.D, team),
          .row = ws.per_thread<float>(g.D, team),
          .o = ws.per_thread<float>(g.D, team),
          .w = ws.per_thread<float>(Tmax, team),
          .team = team};
}
}  // namespace

void cpu_attention_decode(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& kc = a.in[1];
  const TensorArg& vc = a.in[2];
  const TensorArg& out = a.out[0];
  const Geometry g(qkv, at);  // T = 1
  const int64_t Tmax = kc.shape[1], D = g.D;
  const int32_t pos = *a.in[3].as<const int32_t>();
  LOOM_ASSERT(pos >= 0 && pos < Tmax,
              "attention_decode pos " + std::to_string(pos) + " out of range [0, Tmax = " + std::to_string(Tmax) + ")");
  // Row t of query head h's key/value head in a cache [B, Tmax, KV, D].
  auto cache_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tmax + t) * g.KV + h / g.G) * D; };
  store_kv(g, qkv, kc, vc, 0, pos);
  // Rows [lo, pos] (a window's last rows), n of them: w[j] is row lo + j's weight.
  const int64_t lo = g.first_key(0, pos), n = int64_t{pos} + 1 - lo, pairs = g.B * g.H;
  const bool round_q_d = g.d != DType::f32, round_s = rounding_changes(g.d, g.s);
  // bf16 caches read in place: the same products as on widened copies, without a copy per row
  // (perf put this op, copying row by row, at a quarter of a bf16 GPT-2 token's time).
  const bool bf16_rows = kc.dtype == DType::bf16 && vc.dtype == DType::bf16 && !round_s;
  Bump ws(a.workspace);
  const DecodeSpans sp = attention_decode_spans(ws, a);
#pragma omp parallel for schedule(static) num_threads(sp.team) if (decode_parallel(pairs, n, D))
  for (int64_t pr = 0; pr < pairs; ++pr) {
    const int64_t b = pr / g.H, h = pr % g.H;
    float* q = sp.q.mine();
    float* k = sp.row.mine();  // a cache row as f32: k_j, then v_j
    float* o = sp.o.mine();
    float* w = sp.w.mine();
    load_f32(qkv.data, g.d, g.qkv_at(b, 0, h, 0), q, D);
    for (int64_t e = 0; e < D; ++e) q[e] *= g.scale;
    if (round_q_d) round_inplace(q, D, g.d);
    if (round_s) round_inplace(q, D, g.s);
    for (int64_t j = 0; j < n; ++j) {
      // A head's rows lie KV·D apart: prefetched 8 ahead, as the hardware does not, since loading
      // these rows is most of the op's time when decoding.
      if (j + 8 < n) prefetch_row(kc, cache_at(b, lo + j + 8, h), D);
      if (bf16_rows) {  // the row read as bf16, widened inside the dot product
        w[j] = dot_f32(q, kc.as<uint16_t>() + cache_at(b, lo + j, h), D);
        continue;
      }
      const float* kj = row_f32(kc, cache_at(b, lo + j, h), D, k);
      if (round_s) {
        if (kj != k) std::copy(kj, kj + D, k);
        round_inplace(k, D, g.s);
        kj = k;
      }
      w[j] = dot_f32(q, kj, D);
    }
    if (g.s != DType::f32) round_inplace(w, n, g.s);
    softmax_weights(g, w, n);
    std::fill(o, o + D, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      if (j + 8 < n) prefetch_row(vc, cache_at(b, lo + j + 8, h), D);
      if (bf16_rows) {
        const uint16_t* vj = vc.as<uint16_t>() + cache_at(b, lo + j, h);
        for (int64_t e = 0; e < D; ++e) o[e] += w[j] * bf16_to_f32(vj[e]);
        continue;
      }
      const float* vj = row_f32(vc, cache_at(b, lo + j, h), D, k);
      for (int64_t e = 0; e < D; ++e) o[e] += w[j] * vj[e];
    }
    store_f32(o, out.data, g.d, g.out_at(b, 0, h), D);
  }
}

KernelScratch cpu_workspace_attention(const KernelArgs& a) {
  return workspace_of<pair_spans<forward_blocks, false>>(a);
}
KernelScratch cpu_workspace_attention_grad(const KernelArgs& a) {
  return workspace_of<pair_spans<backward_blocks, true>>(a);
}
// Rows 0..T-1 of the caches, token by token: a copy of B·T·KV·2·D elements, far below the
// prefill's products, so one thread.
void cpu_kv_cache_write(const KernelArgs& a) {
  const Geometry g(a.in[0], std::get<AttentionAttrs>(a.node.attrs));
  for (int64_t t = 0; t < g.T; ++t) store_kv(g, a.in[0], a.in[1], a.in[2], t, t);
}

KernelScratch cpu_workspace_attention_decode(const KernelArgs& a) { return workspace_of<attention_decode_spans>(a); }
LOOM_CPU_NO_WORKSPACE(kv_cache_write)

}  // namespace loom

namespace loom {

// RoPE: the cos/sin table [P, D], P the positions (T, or B·T per-token ones of packed rows; per
// position: D/2 cosines, then D/2 sines, sines negated for the inverse) is built once per call, then each (b, t, row)
// of qkv is widened into its thread's row buffer, its rotated heads turned pair by pair in f32 and the row stored back
// (the value part unchanged): a row is read whole before it is written, so the op may run in place.
namespace {
struct RopeSpans {
  float* table;
  PerThread<float> row;
  int team;
};
RopeSpans rope_spans(Bump& ws, const KernelArgs& a) {
  const Shape& s = a.in[0].shape;
  const int64_t rows = s[0] * s[1] * s[2];
  const int team = ws.team(rows * s[3] >= kParallelMin, rows);
  return {.table = ws.take<float>(a.in[1].shape.numel() * (s[3] / (std::get<RopeAttrs>(a.node.attrs).group + 2))),
          .row = ws.per_thread<float>(s[3], team),
          .team = team};
}
}  // namespace

void cpu_rope(const KernelArgs& a) {
  const auto& at = std::get<RopeAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t T = x.shape[1], S = x.shape[2], W = x.shape[3], rows = x.shape[0] * T * S;
  const int64_t parts = at.group + 2, D = W / parts, half = D / 2;
  LOOM_ASSERT(y.shape == x.shape && y.dtype == x.dtype);
  const int32_t* positions = a.in[1].as<const int32_t>();
  const int64_t P = a.in[1].shape.numel();  // T, or B·T per-token positions
  Bump ws(a.workspace);
  const RopeSpans sp = rope_spans(ws, a);
  // One region for both loops: the table's implicit barrier is all that separates them.
#pragma omp parallel num_threads(sp.team)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < P; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const RopeCosSin cs = rope_cos_sin(at, D, i, positions[t]);
        sp.table[t * D + i] = cs.cos;
        sp.table[t * D + half + i] = at.inverse ? -cs.sin : cs.sin;
      }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* buf = sp.row.mine();
      const float* cos = sp.table + (r / S % P) * D;
      const float* sin = cos + half;
      load_f32(x.data, x.dtype, r * W, buf, W);
      for (int64_t p = 0; p + 1 < parts; ++p) {
        float* x1 = buf + p * D;
        float* x2 = x1 + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float u = x1[i], v = x2[i];
          x1[i] = u * cos[i] - v * sin[i];
          x2[i] = v * cos[i] + u * sin[i];
        }
      }
      store_f32(buf, y.data, y.dtype, r * W, W);
    }
  }
}

KernelScratch cpu_workspace_rope(const KernelArgs& a) { return workspace_of<rope_spans>(a); }

}  // namespace loom
