// Reference kernels for attention and its backward op (graph/ops/attention.cpp has the formulas).
//
// Literal transcriptions, one (batch, head) pair at a time: every sum in double, the [T, T]
// logits held in a local buffer, masked logits set to finfo(softmax_dtype).min exactly as the
// tutorial's jnp.where does. round_s (rs below) is the identity for softmax_dtype f32: the double
// oracle keeps those intermediates exact; round_d (rnd(d, ·)) always rounds, d being the dtype of
// qkv and of every stored result.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::rnd;
using refk::st;

namespace {

// jnp.finfo(dt).min: the most negative finite value.
double finfo_min(DType dt) {
  switch (dt) {
    case DType::bf16:
      return -static_cast<double>(bf16_to_f32(0x7f7f));
    case DType::f16:
      return -static_cast<double>(f16_to_f32(0x7bff));
    default:
      return -static_cast<double>(std::numeric_limits<float>::max());
  }
}

// The dims and the index maps of qkv [B, T, KV, (G+2)·D], out [B, T, H, D], lse [B, H, T]
// (H = KV·G query heads; G = 1: qkv [B, T, H, 3D]).
struct Dims {
  int64_t B, T, KV, G, H, D;
  Dims(const Shape& qkv, const AttentionAttrs& at)
      : B(qkv[0]), T(qkv[1]), KV(qkv[2]), G(at.group), H(qkv[2] * at.group), D(qkv[3] / (at.group + 2)) {}
  // Element d of part (0 = q, 1 = k, 2 = v) of query head h's operands at row (b, t): its own
  // query, its key/value head's key and value.
  int64_t qkv(int64_t b, int64_t t, int64_t h, int part, int64_t d) const {
    const int64_t slot = part == 0 ? h % G : G + part - 1;
    return ((b * T + t) * KV + h / G) * (G + 2) * D + slot * D + d;
  }
  int64_t out(int64_t b, int64_t t, int64_t h, int64_t d) const { return ((b * T + t) * H + h) * D + d; }
  int64_t lse(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * T + t; }
};

// Whether query row i of sequence b sees key row j: the attributes' mask and, with the optional
// positions [B, T] (`pos`, nullptr without), keys of the query's own example only.
struct Mask {
  const AttentionAttrs& at;
  const TensorArg* pos;
  int64_t T;
  bool sees(int64_t b, int64_t i, int64_t j) const {
    return at.sees(i, j) && (!pos || j >= i - refk::ld_i32(*pos, b * T + i));
  }
};
Mask mask_of(const KernelArgs& a, size_t positions_input, int64_t T) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  return {at, a.in.size() > positions_input ? &a.in[positions_input] : nullptr, T};
}

// One (b, h) pair's operands: qs = round_s(round_d(q·scale)), ks = round_s(k), and the logits
// round_s(qs·ksᵀ) with the mask applied, all [T, D] / [T, T] row-major.
struct Operands {
  std::vector<double> qs, ks, logits;
};

Operands operands(const TensorArg& qkv, const Dims& n, int64_t b, int64_t h, const AttentionAttrs& at, const Mask& m) {
  const DType d = qkv.dtype, s = at.softmax_dtype;
  auto rs = [s](double x) { return s == DType::f32 ? x : rnd(s, x); };
  // JAX: query * D**-0.5 (or attrs.scale) with the Python scalar cast to the query's dtype.
  const double scale = rnd(d, attention_scale(at, n.D));
  const auto T = static_cast<size_t>(n.T), D = static_cast<size_t>(n.D);
  Operands o{std::vector<double>(T * D), std::vector<double>(T * D), std::vector<double>(T * T)};
  for (int64_t t = 0; t < n.T; ++t)
    for (int64_t e = 0; e < n.D; ++e) {
      const auto k = static_cast<size_t>(t * n.D + e);
      o.qs[k] = rs(rnd(d, ld(qkv, n.qkv(b, t, h, 0, e)) * scale));
      o.ks[k] = rs(ld(qkv, n.qkv(b, t, h, 1, e)));
    }
  for (int64_t i = 0; i < n.T; ++i)
    for (int64_t j = 0; j < n.T; ++j) {
      double acc = 0;
      for (int64_t e = 0; e < n.D; ++e)
        acc += o.qs[static_cast<size_t>(i * n.D + e)] * o.ks[static_cast<size_t>(j * n.D + e)];
      o.logits[static_cast<size_t>(i * n.T + j)] = m.sees(b, i, j) ? rs(acc) : finfo_min(s);
    }
  return o;
}

}  // namespace

// out = round_d(round_d(softmax(logits))·v), lse = log Σ exp(logits), per (b, h) and query row.
void ref_attention(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& out = a.out[0];
  const TensorArg& lse = a.out[1];
  const Dims n(qkv.shape, at);
  const DType d = qkv.dtype, s = at.softmax_dtype;
  LOOM_ASSERT(out.shape == (Shape{n.B, n.T, n.H, n.D}) && out.dtype == d);
  LOOM_ASSERT(lse.shape == (Shape{n.B, n.H, n.T}) && lse.dtype == DType::f32);
  const Mask m = mask_of(a, 1, n.T);
  std::vector<double> w(static_cast<size_t>(n.T));
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h) {
      const Operands o = operands(qkv, n, b, h, at, m);
      for (int64_t i = 0; i < n.T; ++i) {
        const double* l = o.logits.data() + i * n.T;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n.T; ++j) mx = std::fmax(mx, l[j]);
        double sum = 0;
        for (int64_t j = 0; j < n.T; ++j) sum += std::exp(l[j] - mx);
        for (int64_t j = 0; j < n.T; ++j) {
          double p = std::exp(l[j] - mx) / sum;
          if (s != DType::f32) p = rnd(s, p);
          w[static_cast<size_t>(j)] = rnd(d, p);
        }
        for (int64_t e = 0; e < n.D; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < n.T; ++j) acc += w[static_cast<size_t>(j)] * ld(qkv, n.qkv(b, j, h, 2, e));
          st(out, n.out(b, i, h, e), acc);
        }
        st(lse, n.lse(b, h, i), mx + std::log(sum));
      }
    }
}

// (qkv, lse, dout) -> dqkv, JAX's VJP with p recomputed from the saved lse:
//   p = round_s(exp(logits − lse)) (masked: 0), w = round_d(p)
//   dv = round_d(wᵀ·dout), dp = round_s(round_d(dout·vᵀ)), ds = round_s(p·(dp − rowsum(p·dp)))
//   dk = round_d(round_s(dsᵀ·qs)), dq = round_d(round_d(round_s(ds·ks))·scale)
void ref_attention_grad(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& lse = a.in[1];
  const TensorArg& dout = a.in[2];
  const TensorArg& dqkv = a.out[0];
  const Dims n(qkv.shape, at);
  const DType d = qkv.dtype, s = at.softmax_dtype;
  auto rs = [s](double x) { return s == DType::f32 ? x : rnd(s, x); };
  LOOM_ASSERT(lse.shape == (Shape{n.B, n.H, n.T}) && lse.dtype == DType::f32);
  LOOM_ASSERT(dout.shape == (Shape{n.B, n.T, n.H, n.D}) && dqkv.shape == qkv.shape && dqkv.dtype == d);
  const double scale = rnd(d, attention_scale(at, n.D));
  const Mask m = mask_of(a, 3, n.T);
  const auto TT = static_cast<size_t>(n.T * n.T), TD = static_cast<size_t>(n.T * n.D);
  std::vector<double> p(TT), ds(TT), dk(TD), dv(TD);  // dk, dv: the sums over a group's heads
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h) {
      if (h % n.G == 0) {
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
      }
      const Operands o = operands(qkv, n, b, h, at, m);
      for (int64_t i = 0; i < n.T; ++i) {
        const double l_i = ld(lse, n.lse(b, h, i));
        for (int64_t j = 0; j < n.T; ++j) {
          const auto k = static_cast<size_t>(i * n.T + j);
          p[k] = m.sees(b, i, j) ? rs(std::exp(o.logits[k] - l_i)) : 0.0;
        }
      }
      // dv[j] = round_d(Σ_heads Σ_i w[i, j]·dout[i])
      for (int64_t j = 0; j < n.T; ++j)
        for (int64_t e = 0; e < n.D; ++e)
          for (int64_t i = 0; i < n.T; ++i)
            dv[static_cast<size_t>(j * n.D + e)] +=
                rnd(d, p[static_cast<size_t>(i * n.T + j)]) * ld(dout, n.out(b, i, h, e));
      // dp, then ds row by row.
      for (int64_t i = 0; i < n.T; ++i) {
        double* dsr = ds.data() + i * n.T;
        const double* pr = p.data() + i * n.T;
        for (int64_t j = 0; j < n.T; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < n.D; ++e) acc += ld(dout, n.out(b, i, h, e)) * ld(qkv, n.qkv(b, j, h, 2, e));
          dsr[j] = rs(rnd(d, acc));  // dp, for now
        }
        double row = 0;
        for (int64_t j = 0; j < n.T; ++j) row += pr[j] * dsr[j];
        for (int64_t j = 0; j < n.T; ++j) dsr[j] = rs(pr[j] * (dsr[j] - row));
      }
      // dk[j] = round_d(round_s(Σ_heads Σ_i ds[i, j]·qs[i])), dq[i] = round_d(round_d(round_s(Σ_j ds[i,
      // j]·ks[j]))·scale)
      for (int64_t j = 0; j < n.T; ++j)
        for (int64_t e = 0; e < n.D; ++e)
          for (int64_t i = 0; i < n.T; ++i)
            dk[static_cast<size_t>(j * n.D + e)] +=
                ds[static_cast<size_t>(i * n.T + j)] * o.qs[static_cast<size_t>(i * n.D + e)];
      if (h % n.G == n.G - 1)
        for (int64_t j = 0; j < n.T; ++j)
          for (int64_t e = 0; e < n.D; ++e) {
            st(dqkv, n.qkv(b, j, h, 1, e), rs(dk[static_cast<size_t>(j * n.D + e)]));
            st(dqkv, n.qkv(b, j, h, 2, e), dv[static_cast<size_t>(j * n.D + e)]);
          }
      for (int64_t i = 0; i < n.T; ++i)
        for (int64_t e = 0; e < n.D; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < n.T; ++j)
            acc += ds[static_cast<size_t>(i * n.T + j)] * o.ks[static_cast<size_t>(j * n.D + e)];
          st(dqkv, n.qkv(b, i, h, 0, e), rnd(d, rs(acc)) * scale);
        }
    }
}

namespace {
// Row t of qkv's keys and values into row `row` of the caches [B, Tmax, KV, D]: exact copies (the
// caches have qkv's dtype).
void store_kv(const TensorArg& qkv, const TensorArg& kc, const TensorArg& vc, const Dims& n, int64_t t, int64_t row) {
  const int64_t Tmax = kc.shape[1];
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; h += n.G)
      for (int64_t e = 0; e < n.D; ++e) {
        const int64_t c = ((b * Tmax + row) * n.KV + h / n.G) * n.D + e;
        st(kc, c, ld(qkv, n.qkv(b, t, h, 1, e)));
        st(vc, c, ld(qkv, n.qkv(b, t, h, 2, e)));
      }
}
}  // namespace

// Writes k, v of the token into cache row pos, then the attention of its query over rows [lo, pos]
// (lo = 0, or with a window the first row it sees): ref_attention's row pos (masked keys
// contribute exp(finfo_min − max) = 0 there, exactly).
void ref_attention_decode(const KernelArgs& a) {
  const auto& at = std::get<AttentionAttrs>(a.node.attrs);
  const TensorArg& qkv = a.in[0];
  const TensorArg& kc = a.in[1];
  const TensorArg& vc = a.in[2];
  const TensorArg& out = a.out[0];
  const Dims n(qkv.shape, at);  // T = 1
  const int64_t Tmax = kc.shape[1];
  const int32_t pos = refk::ld_i32(a.in[3], 0);
  LOOM_ASSERT(pos >= 0 && pos < Tmax,
              "attention_decode pos " + std::to_string(pos) + " out of range [0, Tmax = " + std::to_string(Tmax) + ")");
  const DType d = qkv.dtype, s = at.softmax_dtype;
  auto rs = [s](double x) { return s == DType::f32 ? x : rnd(s, x); };
  const double scale = rnd(d, attention_scale(at, n.D));
  // Row t of query head h's key/value head in a cache [B, Tmax, KV, D].
  auto cache = [&](int64_t b, int64_t t, int64_t h, int64_t e) { return ((b * Tmax + t) * n.KV + h / n.G) * n.D + e; };
  store_kv(qkv, kc, vc, n, 0, pos);
  std::vector<double> l(static_cast<size_t>(pos) + 1);
  int64_t lo = 0;
  while (!at.sees(pos, lo)) ++lo;
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = lo; j <= pos; ++j) {
        double acc = 0;
        for (int64_t e = 0; e < n.D; ++e)
          acc += rs(rnd(d, ld(qkv, n.qkv(b, 0, h, 0, e)) * scale)) * rs(ld(kc, cache(b, j, h, e)));
        l[static_cast<size_t>(j)] = rs(acc);
        mx = std::fmax(mx, rs(acc));
      }
      double sum = 0;
      for (int64_t j = lo; j <= pos; ++j) sum += std::exp(l[static_cast<size_t>(j)] - mx);
      for (int64_t j = lo; j <= pos; ++j) {
        double p = std::exp(l[static_cast<size_t>(j)] - mx) / sum;
        if (s != DType::f32) p = rnd(s, p);
        l[static_cast<size_t>(j)] = rnd(d, p);  // w
      }
      for (int64_t e = 0; e < n.D; ++e) {
        double acc = 0;
        for (int64_t j = lo; j <= pos; ++j) acc += l[static_cast<size_t>(j)] * ld(vc, cache(b, j, h, e));
        st(out, n.out(b, 0, h, e), acc);
      }
    }
}

// Rows 0..T-1 of the caches from the T tokens' keys and values.
void ref_kv_cache_write(const KernelArgs& a) {
  const Dims n(a.in[0].shape, std::get<AttentionAttrs>(a.node.attrs));
  for (int64_t t = 0; t < n.T; ++t) store_kv(a.in[0], a.in[1], a.in[2], n, t, t);
}

}  // namespace loom

namespace loom {

// Each rotated head's pairs (i, i + D/2) in double from the shared f32 cos/sin table, one rounding to
// the dtype; the value part copied. Each pair is read before it is written (the op runs in place).
void ref_rope(const KernelArgs& a) {
  const auto& at = std::get<RopeAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t B = x.shape[0], T = x.shape[1], S = x.shape[2], W = x.shape[3];
  const int64_t parts = at.group + 2, D = W / parts, half = D / 2;
  LOOM_ASSERT(y.shape == x.shape && y.dtype == x.dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t pos = refk::ld_i32(a.in[1], a.in[1].shape.rank == 2 ? b * T + t : t);
      for (int64_t r = 0; r < S; ++r) {
        const int64_t row = ((b * T + t) * S + r) * W;
        for (int64_t p = 0; p + 1 < parts; ++p)
          for (int64_t i = 0; i < half; ++i) {
            const RopeCosSin cs = rope_cos_sin(at, D, i, pos);
            const double c = cs.cos, s = at.inverse ? -double{cs.sin} : double{cs.sin};
            const int64_t i1 = row + p * D + i, i2 = i1 + half;
            const double x1 = ld(x, i1), x2 = ld(x, i2);
            st(y, i1, x1 * c - x2 * s);
            st(y, i2, x2 * c + x1 * s);
          }
        for (int64_t e = (parts - 1) * D; e < W; ++e) st(y, row + e, ld(x, row + e));
      }
    }
}

}  // namespace loom
