// Reference kernels for layer_norm, rms_norm and their backward ops (graph/ops/norm.cpp). RMS
// normalisation is layer normalisation with the mean taken as 0 and no bias: one kernel serves
// both, told which by `centred`.
#include <cmath>
#include <vector>

#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::st;

namespace {

// Per row of C elements: mean = Σx/C (0 when not centred), var = Σ(x − mean)²/C (two passes),
// rstd = 1/sqrt(var + eps), y = round_dtype((x − mean)·rstd·scale (+ bias)); the statistics (mean
// when centred, then rstd) stored as f32. Inputs (x, scale[, bias]), outputs (y[, mean], rstd).
void ref_norm(const KernelArgs& a, bool centred) {
  const auto& at = std::get<LayerNormAttrs>(a.node.attrs);
  const double offset = at.unit_offset ? 1.0 : 0.0;
  const TensorArg& x = a.in[0];
  const TensorArg& scale = a.in[1];
  const TensorArg* bias = centred ? &a.in[2] : nullptr;
  const TensorArg& y = a.out[0];
  const TensorArg* mean_out = centred ? &a.out[1] : nullptr;
  const TensorArg& rstd_out = a.out[centred ? 2 : 1];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(scale.shape.numel() == C && (!bias || bias->shape.numel() == C) && y.shape == x.shape);
  LOOM_ASSERT((!mean_out || mean_out->shape.numel() == R) && rstd_out.shape.numel() == R);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t base = r * C;
    double sum = 0;
    if (centred)
      for (int64_t c = 0; c < C; ++c) sum += ld(x, base + c);
    const double mean = sum / static_cast<double>(C);
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = ld(x, base + c) - mean;
      sq += d * d;
    }
    const double var = sq / static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + static_cast<double>(at.eps));
    for (int64_t c = 0; c < C; ++c)
      st(y, base + c, (ld(x, base + c) - mean) * rstd * (offset + ld(scale, c)) + (bias ? ld(*bias, c) : 0.0));
    if (mean_out) st(*mean_out, r, mean);
    st(rstd_out, r, rstd);
  }
}

// With the saved statistics: xhat = (x − mean)·rstd, g = dy·scale,
// dx = rstd·(g − mean_row(g) − xhat·mean_row(g·xhat)), dscale = Σ_rows dy·xhat, dbias = Σ_rows dy;
// not centred, mean = 0 and the mean_row(g) term goes (it is the mean's derivative).
// Inputs (dy, x, scale[, mean], rstd), outputs (dx, dscale[, dbias]).
void ref_norm_grad(const KernelArgs& a, bool centred) {
  const double offset = std::get<LayerNormAttrs>(a.node.attrs).unit_offset ? 1.0 : 0.0;
  const TensorArg& dy = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& scale = a.in[2];
  const TensorArg* mean_in = centred ? &a.in[3] : nullptr;
  const TensorArg& rstd_in = a.in[centred ? 4 : 3];
  const TensorArg& dx = a.out[0];
  const TensorArg& dscale = a.out[1];
  const TensorArg* dbias = centred ? &a.out[2] : nullptr;
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(dy.shape == x.shape && dx.shape == x.shape && scale.shape.numel() == C);
  LOOM_ASSERT((!mean_in || mean_in->shape.numel() == R) && rstd_in.shape.numel() == R);
  LOOM_ASSERT(dscale.shape.numel() == C && (!dbias || dbias->shape.numel() == C));
  std::vector<double> ds(static_cast<size_t>(C), 0.0), db(static_cast<size_t>(C), 0.0);
  std::vector<double> xhat(static_cast<size_t>(C)), g(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t base = r * C;
    const double mean = mean_in ? ld(*mean_in, r) : 0.0, rstd = ld(rstd_in, r);
    double g_sum = 0, gx_sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      const double d = ld(dy, base + c);
      xhat[i] = (ld(x, base + c) - mean) * rstd;
      g[i] = d * (offset + ld(scale, c));
      g_sum += g[i];
      gx_sum += g[i] * xhat[i];
      ds[i] += d * xhat[i];
      db[i] += d;
    }
    const double g_mean = centred ? g_sum / static_cast<double>(C) : 0.0;
    const double gx_mean = gx_sum / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      st(dx, base + c, rstd * (g[i] - g_mean - xhat[i] * gx_mean));
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    st(dscale, c, ds[static_cast<size_t>(c)]);
    if (dbias) st(*dbias, c, db[static_cast<size_t>(c)]);
  }
}

}  // namespace

void ref_layer_norm(const KernelArgs& a) { ref_norm(a, /*centred=*/true); }
void ref_rms_norm(const KernelArgs& a) { ref_norm(a, /*centred=*/false); }
void ref_layer_norm_grad(const KernelArgs& a) { ref_norm_grad(a, /*centred=*/true); }
void ref_rms_norm_grad(const KernelArgs& a) { ref_norm_grad(a, /*centred=*/false); }

// qk_norm: per packed row of W = (G+2)·D elements, heads p < G use q_scale and head G k_scale;
// each is rms_norm'd in double (rstd stored per head), the value part copied. Inputs (qkv, q_scale,
// k_scale), outputs (y, rstd).
void ref_qk_norm(const KernelArgs& a) {
  const auto& at = std::get<QkNormAttrs>(a.node.attrs);
  const double offset = at.unit_offset ? 1.0 : 0.0;
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const TensorArg& rstd_out = a.out[1];
  const int64_t W = x.shape[3], parts = at.group + 2, D = W / parts, rows = x.shape.numel() / W;
  LOOM_ASSERT(y.shape == x.shape && rstd_out.shape.numel() == rows * (parts - 1));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p + 1 < parts; ++p) {
      const TensorArg& scale = a.in[p < at.group ? 1 : 2];
      const int64_t base = r * W + p * D;
      double sq = 0;
      for (int64_t c = 0; c < D; ++c) sq += ld(x, base + c) * ld(x, base + c);
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(D) + static_cast<double>(at.eps));
      for (int64_t c = 0; c < D; ++c) st(y, base + c, ld(x, base + c) * rstd * (offset + ld(scale, c)));
      st(rstd_out, r * (parts - 1) + p, rstd);
    }
    for (int64_t e = (parts - 1) * D; e < W; ++e) st(y, r * W + e, ld(x, r * W + e));
  }
}

// rms_norm_grad per normalised head (xhat = x·rstd, g = dy·scale, dx = rstd·(g − xhat·mean(g·xhat)),
// dscale = Σ dy·xhat over the heads that use it); the value part of dx is dy. Inputs (dy, qkv,
// q_scale, k_scale, rstd), outputs (dqkv, dq_scale, dk_scale).
void ref_qk_norm_grad(const KernelArgs& a) {
  const auto& at = std::get<QkNormAttrs>(a.node.attrs);
  const double offset = at.unit_offset ? 1.0 : 0.0;
  const TensorArg& dy = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& rstd_in = a.in[4];
  const TensorArg& dx = a.out[0];
  const int64_t W = x.shape[3], parts = at.group + 2, D = W / parts, rows = x.shape.numel() / W;
  LOOM_ASSERT(dy.shape == x.shape && dx.shape == x.shape && rstd_in.shape.numel() == rows * (parts - 1));
  std::vector<double> ds(static_cast<size_t>(2 * D), 0.0), xhat(static_cast<size_t>(D)), g(static_cast<size_t>(D));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p + 1 < parts; ++p) {
      const bool key = p == at.group;
      const TensorArg& scale = a.in[key ? 3 : 2];
      double* dscale = ds.data() + (key ? D : 0);
      const int64_t base = r * W + p * D;
      const double rstd = ld(rstd_in, r * (parts - 1) + p);
      double gx_sum = 0;
      for (int64_t c = 0; c < D; ++c) {
        const auto i = static_cast<size_t>(c);
        const double d = ld(dy, base + c);
        xhat[i] = ld(x, base + c) * rstd;
        g[i] = d * (offset + ld(scale, c));
        gx_sum += g[i] * xhat[i];
        dscale[c] += d * xhat[i];
      }
      const double gx_mean = gx_sum / static_cast<double>(D);
      for (int64_t c = 0; c < D; ++c) {
        const auto i = static_cast<size_t>(c);
        st(dx, base + c, rstd * (g[i] - xhat[i] * gx_mean));
      }
    }
    for (int64_t e = (parts - 1) * D; e < W; ++e) st(dx, r * W + e, ld(dy, r * W + e));
  }
  for (int64_t c = 0; c < D; ++c) {
    st(a.out[1], c, ds[static_cast<size_t>(c)]);
    st(a.out[2], c, ds[static_cast<size_t>(D + c)]);
  }
}

}  // namespace loom
