// Reference kernels for layer_norm and its backward op (graph/ops/norm.cpp).
#include <cmath>
#include <vector>

#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::st;

// Per row of C elements: mean = Σx/C, var = Σ(x − mean)²/C (two passes), rstd = 1/sqrt(var + eps),
// y = round_dtype((x − mean)·rstd·scale + bias); mean and rstd are stored as f32.
void ref_layer_norm(const KernelArgs& a) {
  const auto& at = std::get<LayerNormAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& scale = a.in[1];
  const TensorArg& bias = a.in[2];
  const TensorArg& y = a.out[0];
  const TensorArg& mean_out = a.out[1];
  const TensorArg& rstd_out = a.out[2];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(scale.shape.numel() == C && bias.shape.numel() == C && y.shape == x.shape);
  LOOM_ASSERT(mean_out.shape.numel() == R && rstd_out.shape.numel() == R);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t base = r * C;
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += ld(x, base + c);
    const double mean = sum / static_cast<double>(C);
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = ld(x, base + c) - mean;
      sq += d * d;
    }
    const double var = sq / static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + static_cast<double>(at.eps));
    for (int64_t c = 0; c < C; ++c) st(y, base + c, (ld(x, base + c) - mean) * rstd * ld(scale, c) + ld(bias, c));
    st(mean_out, r, mean);
    st(rstd_out, r, rstd);
  }
}

// With the saved statistics: xhat = (x − mean)·rstd, g = dy·scale,
// dx = rstd·(g − mean_row(g) − xhat·mean_row(g·xhat)), dscale = Σ_rows dy·xhat, dbias = Σ_rows dy.
void ref_layer_norm_grad(const KernelArgs& a) {
  const TensorArg& dy = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& scale = a.in[2];
  const TensorArg& mean_in = a.in[3];
  const TensorArg& rstd_in = a.in[4];
  const TensorArg& dx = a.out[0];
  const TensorArg& dscale = a.out[1];
  const TensorArg& dbias = a.out[2];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(dy.shape == x.shape && dx.shape == x.shape && scale.shape.numel() == C);
  LOOM_ASSERT(mean_in.shape.numel() == R && rstd_in.shape.numel() == R);
  LOOM_ASSERT(dscale.shape.numel() == C && dbias.shape.numel() == C);
  std::vector<double> ds(static_cast<size_t>(C), 0.0), db(static_cast<size_t>(C), 0.0);
  std::vector<double> xhat(static_cast<size_t>(C)), g(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t base = r * C;
    const double mean = ld(mean_in, r), rstd = ld(rstd_in, r);
    double g_sum = 0, gx_sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      const double d = ld(dy, base + c);
      xhat[i] = (ld(x, base + c) - mean) * rstd;
      g[i] = d * ld(scale, c);
      g_sum += g[i];
      gx_sum += g[i] * xhat[i];
      ds[i] += d * xhat[i];
      db[i] += d;
    }
    const double g_mean = g_sum / static_cast<double>(C), gx_mean = gx_sum / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<size_t>(c);
      st(dx, base + c, rstd * (g[i] - g_mean - xhat[i] * gx_mean));
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    st(dscale, c, ds[static_cast<size_t>(c)]);
    st(dbias, c, db[static_cast<size_t>(c)]);
  }
}

}  // namespace loom
