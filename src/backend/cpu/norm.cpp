// CPU kernels for layer_norm and its backward op (graph/ops/norm.cpp). Statistics in f32, one
// row per iteration, OpenMP over rows.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_util.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

// Per row of C elements: mean = Σx/C, var = Σ(x − mean)²/C (two passes, f32), rstd =
// 1/sqrtf(var + eps), y = round_dtype((x − mean)·rstd·scale + bias); mean and rstd stored as f32.
void cpu_layer_norm(const KernelArgs& a) {
  const auto& at = std::get<LayerNormAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(a.in[1].shape.numel() == C && a.in[2].shape.numel() == C && y.shape == x.shape);
  LOOM_ASSERT(a.in[1].dtype == DType::f32 && a.in[2].dtype == DType::f32);
  LOOM_ASSERT(a.out[1].shape.numel() == R && a.out[2].shape.numel() == R);
  const float* scale = a.in[1].as<float>();
  const float* bias = a.in[2].as<float>();
  float* mean_out = a.out[1].as<float>();
  float* rstd_out = a.out[2].as<float>();
  const auto fc = static_cast<float>(C);
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = row_f32(x, r * C, C, 0);
    float* t = y.dtype == DType::f32 ? y.as<float>() + r * C : scratch(1, C);
    const float mean = sum_f32(xr, C) / fc;
    for (int64_t c = 0; c < C; ++c) t[c] = xr[c] - mean;
    const float var = dot_f32(t, t, C) / fc;
    const float rstd = 1.f / std::sqrt(var + at.eps);
    for (int64_t c = 0; c < C; ++c) t[c] = t[c] * rstd * scale[c] + bias[c];
    if (y.dtype != DType::f32) store_f32(t, y.data, y.dtype, r * C, C);
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// With the saved statistics: xhat = (x − mean)·rstd, g = dy·scale,
// dx = rstd·(g − mean_row(g) − xhat·mean_row(g·xhat)), dscale = Σ_rows dy·xhat, dbias = Σ_rows dy.
// dscale/dbias: the rows are split into a number of chunks that depends only on R; each chunk
// accumulates its rows in order into its own partial rows, and the partials are added in chunk
// order, so the result does not depend on the thread count.
void cpu_layer_norm_grad(const KernelArgs& a) {
  const TensorArg& dy = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(dy.shape == x.shape && dx.shape == x.shape);
  LOOM_ASSERT(a.in[2].shape.numel() == C && a.in[2].dtype == DType::f32);
  LOOM_ASSERT(a.in[3].shape.numel() == R && a.in[3].dtype == DType::f32);
  LOOM_ASSERT(a.in[4].shape.numel() == R && a.in[4].dtype == DType::f32);
  LOOM_ASSERT(a.out[1].shape.numel() == C && a.out[2].shape.numel() == C);
  const float* scale = a.in[2].as<float>();
  const float* mean_in = a.in[3].as<float>();
  const float* rstd_in = a.in[4].as<float>();
  float* dscale = a.out[1].as<float>();
  float* dbias = a.out[2].as<float>();
  if (R == 0) {
    std::fill(dscale, dscale + C, 0.f);
    std::fill(dbias, dbias + C, 0.f);
    return;
  }
  constexpr int64_t kMaxChunks = 32;
  const int64_t nchunks = std::min(R, kMaxChunks);
  // Partial sums: [nchunks][C] for dscale, then [nchunks][C] for dbias.
  float* part = scratch(kOuterSlot + 0, 2 * nchunks * C);
  const auto fc = static_cast<float>(C);
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    float* ds = part + ch * C;
    float* db = part + (nchunks + ch) * C;
    std::fill(ds, ds + C, 0.f);
    std::fill(db, db + C, 0.f);
    float* xhat = scratch(2, C);
    float* g = scratch(3, C);
    for (int64_t r = ch * R / nchunks; r < (ch + 1) * R / nchunks; ++r) {
      const float* dyr = row_f32(dy, r * C, C, 0);
      const float* xr = row_f32(x, r * C, C, 1);
      const float mean = mean_in[r], rstd = rstd_in[r];
      // The rows never overlap; without `omp simd` GCC gives up on the alias checks and this
      // loop stays scalar.
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        xhat[c] = (xr[c] - mean) * rstd;
        g[c] = dyr[c] * scale[c];
        ds[c] += dyr[c] * xhat[c];
        db[c] += dyr[c];
      }
      const float g_mean = sum_f32(g, C) / fc;
      const float gx_mean = dot_f32(g, xhat, C) / fc;
      // g becomes dx (f32) in place, then is stored in x's dtype.
      for (int64_t c = 0; c < C; ++c) g[c] = rstd * (g[c] - g_mean - xhat[c] * gx_mean);
      store_f32(g, dx.data, dx.dtype, r * C, C);
    }
  }
#pragma omp parallel for schedule(static) if (nchunks * C >= kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    float s = 0.f, b = 0.f;
    for (int64_t ch = 0; ch < nchunks; ++ch) {
      s += part[ch * C + c];
      b += part[(nchunks + ch) * C + c];
    }
    dscale[c] = s;
    dbias[c] = b;
  }
}

}  // namespace loom
