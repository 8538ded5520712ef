// CPU kernels for attention and its backward op (graph/ops/attention.cpp has the formulas).
//
// One (batch, head) pair per iteration of an OpenMP loop. Each pair packs its operands into
// contiguous f32 [T, D] matrices in per-thread scratch (Q scaled and rounded, K rounded to the
// softmax dtype, V, dO), forms the [T, T] logits with a single-threaded sgemm, runs the
// masked softmax row by row in f32 and multiplies by V with another sgemm. The [T, T] matrices
// never leave the thread's scratch: only out and the f32 row statistics lse are stored, and the
// backward recomputes the logits from qkv and lse (flash-attention style memory).
//
// Determinism: a pair is computed start to finish by one thread, with single-threaded sgemm
// (nthreads-var lowered to 1 inside our region, as in dense.cpp) and fixed-order row sums, so
// the results depend only on the shapes and values, never on the thread count or the schedule.
//
// Causal masking computes the full T×T product and zeroes the masked weights (skipping masked
// blocks is later work). A masked logit is finfo(softmax_dtype).min in the reference; here it
// is simply left out of the row's max and sum, which is the same thing: exp(min − max) is 0 in
// float for any finite row max (the diagonal is never masked).
//
// FLOPs: forward 4·B·H·T²·D; backward 8·B·H·T²·D plus 2·B·H·T²·D to recompute the logits.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cpu/cpu_util.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// Row-major C[M, N] = op(A)·op(B), single-threaded (called inside our own parallel loop).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float* C, int64_t ldc) {
  sgemm_rm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
}

struct Geometry {
  int64_t B, T, H, D;
  DType d, s;     // qkv dtype, softmax dtype
  bool causal;
  float scale;    // round_d(D^-0.5)
  explicit Geometry(const TensorArg& qkv, const AttentionAttrs& at)
      : B(qkv.shape[0]), T(qkv.shape[1]), H(qkv.shape[2]), D(qkv.shape[3] / 3), d(qkv.dtype),
        s(at.softmax_dtype), causal(at.causal),
        scale(round_to(qkv.dtype, static_cast<float>(std::pow(static_cast<double>(qkv.shape[3] / 3), -0.5)))) {}
  // Offset of element 0 of part (0 = q, 1 = k, 2 = v) of row (b, t, h) in qkv / dqkv.
  int64_t qkv_at(int64_t b, int64_t t, int64_t h, int part) const { return ((b * T + t) * H + h) * 3 * D + part * D; }
  int64_t out_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }
  // Number of keys query row i sees.
  int64_t keys(int64_t i) const { return causal ? i + 1 : T; }
  // Whether the pair loop is worth the pool: ~T²·D multiply-adds per pair.
  bool parallel() const { return B * H > 1 && B * H * T * T * D >= (int64_t{1} << 16); }
};

// Packs Q = round_s(round_d(q·scale)) and K = round_s(k) of pair (b, h) as [T, D] f32.
void pack_qk(const TensorArg& qkv, const Geometry& g, int64_t b, int64_t h, float* Q, float* K) {
  const bool round_q_d = g.d != DType::f32, round_s = rounding_changes(g.d, g.s);
  for (int64_t t = 0; t < g.T; ++t) {
    float* q = Q + t * g.D;
    float* k = K + t * g.D;
    load_f32(qkv.data, g.d, g.qkv_at(b, t, h, 0), q, g.D);
    load_f32(qkv.data, g.d, g.qkv_at(b, t, h, 1), k, g.D);
    for (int64_t e = 0; e < g.D; ++e) q[e] *= g.scale;
    if (round_q_d) round_inplace(q, g.D, g.d);
    if (round_s) {
      round_inplace(q, g.D, g.s);
      round_inplace(k, g.D, g.s);
    }
  }
}

// S = round_s(Q·Kᵀ), [T, T].
void logits(const Geometry& g, const float* Q, const float* K, float* S) {
  gemm(false, true, g.T, g.T, g.D, Q, g.D, K, g.D, S, g.T);
  if (g.s != DType::f32)
    for (int64_t i = 0; i < g.T; ++i) round_inplace(S + i * g.T, g.keys(i), g.s);
}

}  // namespace

// Per pair: S = round_s(Q·Kᵀ); per row p = softmax (f32 max/exp/sum, round_s when 16-bit),
// lse = max + log Σ, w = round_d(p) (masked: 0); out = round_d(W·V).
void cpu_attention(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& out = a.out[0];
  const Geometry g(qkv, at);
  LOOM_ASSERT(out.shape == (Shape{g.B, g.T, g.H, g.D}) && out.dtype == g.d);
  LOOM_ASSERT(a.out[1].shape == (Shape{g.B, g.H, g.T}) && a.out[1].dtype == DType::f32);
  float* lse = a.out[1].as<float>();
  const int64_t T = g.T, D = g.D, pairs = g.B * g.H;
  if (pairs == 0 || T == 0) return;
#pragma omp parallel for schedule(dynamic, 1) if (g.parallel())
  for (int64_t pr = 0; pr < pairs; ++pr) {
    omp_set_num_threads(1);  // this implicit task's copy: the sgemm runs single-threaded
    const int64_t b = pr / g.H, h = pr % g.H;
    float* Q = scratch(0, 4 * T * D + T * T);
    float* K = Q + T * D;
    float* V = K + T * D;
    float* O = V + T * D;
    float* S = O + T * D;
    pack_qk(qkv, g, b, h, Q, K);
    for (int64_t t = 0; t < T; ++t) load_f32(qkv.data, g.d, g.qkv_at(b, t, h, 2), V + t * D, D);
    logits(g, Q, K, S);
    for (int64_t i = 0; i < T; ++i) {
      float* row = S + i * T;
      const int64_t n = g.keys(i);
      const float mx = max_f32(row, n);
      for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - mx);
      const float sum = sum_f32(row, n);
      for (int64_t j = 0; j < n; ++j) row[j] /= sum;
      if (g.s != DType::f32) round_inplace(row, n, g.s);
      if (rounding_changes(g.s, g.d)) round_inplace(row, n, g.d);
      std::fill(row + n, row + T, 0.f);
      lse[pr * T + i] = mx + std::log(sum);
    }
    gemm(false, false, T, D, T, S, T, V, D, O, D);
    for (int64_t t = 0; t < T; ++t) store_f32(O + t * D, out.data, g.d, g.out_at(b, t, h), D);
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
  const Geometry g(qkv, at);
  LOOM_ASSERT(a.in[1].shape == (Shape{g.B, g.H, g.T}) && a.in[1].dtype == DType::f32);
  LOOM_ASSERT(dout.shape == (Shape{g.B, g.T, g.H, g.D}) && dout.dtype == g.d);
  LOOM_ASSERT(dqkv.shape == qkv.shape && dqkv.dtype == g.d);
  const float* lse = a.in[1].as<const float>();
  const int64_t T = g.T, D = g.D, pairs = g.B * g.H;
  if (pairs == 0 || T == 0) return;
  // W differs from P only when rounding p to d changes it.
  const bool w_is_p = !rounding_changes(g.s, g.d);
#pragma omp parallel for schedule(dynamic, 1) if (g.parallel())
  for (int64_t pr = 0; pr < pairs; ++pr) {
    omp_set_num_threads(1);
    const int64_t b = pr / g.H, h = pr % g.H;
    float* Q = scratch(0, 7 * T * D + 2 * T * T);
    float* K = Q + T * D;
    float* V = K + T * D;
    float* dO = V + T * D;
    float* dQ = dO + T * D;
    float* dK = dQ + T * D;
    float* dV = dK + T * D;
    float* P = dV + T * D;
    float* dS = P + T * T;  // holds W, then dP, then dS
    pack_qk(qkv, g, b, h, Q, K);
    for (int64_t t = 0; t < T; ++t) {
      load_f32(qkv.data, g.d, g.qkv_at(b, t, h, 2), V + t * D, D);
      load_f32(dout.data, g.d, g.out_at(b, t, h), dO + t * D, D);
    }
    logits(g, Q, K, P);
    for (int64_t i = 0; i < T; ++i) {
      float* row = P + i * T;
      const int64_t n = g.keys(i);
      const float l = lse[pr * T + i];
      for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - l);
      if (g.s != DType::f32) round_inplace(row, n, g.s);
      std::fill(row + n, row + T, 0.f);
    }
    // dV = Wᵀ·dO
    const float* W = P;
    if (!w_is_p) {
      std::copy(P, P + T * T, dS);
      for (int64_t i = 0; i < T; ++i) round_inplace(dS + i * T, g.keys(i), g.d);
      W = dS;
    }
    gemm(true, false, T, D, T, W, T, dO, D, dV, D);
    // dP = round_s(round_d(dO·Vᵀ)), then dS row by row in place.
    gemm(false, true, T, T, D, dO, D, V, D, dS, T);
    for (int64_t i = 0; i < T; ++i) {
      float* ds = dS + i * T;
      const float* p = P + i * T;
      const int64_t n = g.keys(i);
      if (g.d != DType::f32) round_inplace(ds, n, g.d);
      if (rounding_changes(g.d, g.s)) round_inplace(ds, n, g.s);
      const float rs = dot_f32(p, ds, n);
      for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - rs);
      if (g.s != DType::f32) round_inplace(ds, n, g.s);
      std::fill(ds + n, ds + T, 0.f);
    }
    gemm(false, false, T, D, T, dS, T, K, D, dQ, D);  // dQ = dS·K
    gemm(true, false, T, D, T, dS, T, Q, D, dK, D);   // dK = dSᵀ·Q
    const bool round_dq_d = rounding_changes(g.s, g.d);
    for (int64_t t = 0; t < T; ++t) {
      float* dq = dQ + t * D;
      float* dk = dK + t * D;
      if (g.s != DType::f32) {
        round_inplace(dq, D, g.s);
        round_inplace(dk, D, g.s);
      }
      if (round_dq_d) round_inplace(dq, D, g.d);
      for (int64_t e = 0; e < D; ++e) dq[e] *= g.scale;
      store_f32(dq, dqkv.data, g.d, g.qkv_at(b, t, h, 0), D);
      store_f32(dk, dqkv.data, g.d, g.qkv_at(b, t, h, 1), D);
      store_f32(dV + t * D, dqkv.data, g.d, g.qkv_at(b, t, h, 2), D);
    }
  }
}

// One decoding step (KV cache): copy the token's k, v into cache row pos, then per (b, h) one
// query against rows [0, pos]: logits by dot products (f32, fixed order), the same softmax and
// roundings as cpu_attention, out = round_d(Σ_j w_j·v_j) accumulated over j in order. The work is
// tiny (B·H·(pos+1)·D multiply-adds), so pairs go parallel only when there are enough of them.
void cpu_attention_decode(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& kc = a.in[1];
  const TensorArg& vc = a.in[2];
  const TensorArg& out = a.out[0];
  const Geometry g(qkv, at);  // T = 1
  const int64_t Tmax = kc.shape[1], D = g.D;
  const int32_t pos = *a.in[3].as<const int32_t>();
  LOOM_ASSERT(pos >= 0 && pos < Tmax, "attention_decode pos " + std::to_string(pos) + " out of range [0, Tmax = " +
                                          std::to_string(Tmax) + ")");
  const size_t esz = dtype_size(g.d);
  auto cache_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * Tmax + t) * g.H + h) * D; };
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h) {  // exact copies: the caches have qkv's dtype
      const auto* src = static_cast<const char*>(qkv.data) + g.qkv_at(b, 0, h, 1) * static_cast<int64_t>(esz);
      std::memcpy(static_cast<char*>(kc.data) + cache_at(b, pos, h) * static_cast<int64_t>(esz), src, D * esz);
      std::memcpy(static_cast<char*>(vc.data) + cache_at(b, pos, h) * static_cast<int64_t>(esz), src + D * esz, D * esz);
    }
  const int64_t n = int64_t{pos} + 1, pairs = g.B * g.H;
  const bool round_q_d = g.d != DType::f32, round_s = rounding_changes(g.d, g.s);
#pragma omp parallel for schedule(static) if (pairs > 1 && pairs * n * D >= (int64_t{1} << 16))
  for (int64_t pr = 0; pr < pairs; ++pr) {
    const int64_t b = pr / g.H, h = pr % g.H;
    float* q = scratch(0, 3 * D + n);
    float* k = q + D;
    float* o = k + D;
    float* w = o + D;
    load_f32(qkv.data, g.d, g.qkv_at(b, 0, h, 0), q, D);
    for (int64_t e = 0; e < D; ++e) q[e] *= g.scale;
    if (round_q_d) round_inplace(q, D, g.d);
    if (round_s) round_inplace(q, D, g.s);
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = row_f32(kc, cache_at(b, j, h), D, 1);
      if (round_s) {
        std::copy(kj, kj + D, k);
        round_inplace(k, D, g.s);
        kj = k;
      }
      w[j] = dot_f32(q, kj, D);
    }
    if (g.s != DType::f32) round_inplace(w, n, g.s);
    const float mx = max_f32(w, n);
    for (int64_t j = 0; j < n; ++j) w[j] = exp_f32(w[j] - mx);
    const float sum = sum_f32(w, n);
    for (int64_t j = 0; j < n; ++j) w[j] /= sum;
    if (g.s != DType::f32) round_inplace(w, n, g.s);
    if (rounding_changes(g.s, g.d)) round_inplace(w, n, g.d);
    std::fill(o, o + D, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = row_f32(vc, cache_at(b, j, h), D, 1);
      for (int64_t e = 0; e < D; ++e) o[e] += w[j] * vj[e];
    }
    store_f32(o, out.data, g.d, g.out_at(b, 0, h), D);
  }
}

}  // namespace loom
