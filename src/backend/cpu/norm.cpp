// CPU kernels for layer_norm, rms_norm and their backward ops (graph/ops/norm.cpp). Statistics in
// f32, one row per iteration, OpenMP over rows; per-thread row buffers and the backward's partial
// sums in the node's workspace (workspace.h). RMS normalisation is layer normalisation with the
// mean taken as 0 and no bias: each kernel is a template on kCentred that serves both.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_util.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {
// Per thread: x's row widened (when x is not f32) and y's row before its store (when y is not f32).
struct LayerNormSpans {
  PerThread<float> x, y;
  int team;
};
LayerNormSpans layer_norm_spans(Bump& ws, const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  const int team = ws.team(R * C >= kParallelMin, R);
  return {.x = ws.per_thread<float>(row_floats(x, C), team),
          .y = ws.per_thread<float>(row_floats(a.out[0], C), team),
          .team = team};
}
}  // namespace

// Per row of C elements: mean = Σx/C, var = Σ(x − mean)²/C (two passes, f32), rstd =
// 1/sqrtf(var + eps), y = round_dtype((x − mean)·rstd·scale + bias); mean and rstd stored as f32.
// Not centred: var = Σx²/C, y = round_dtype(x·rstd·scale), rstd stored. Inputs (x, scale[, bias]),
// outputs (y[, mean], rstd).
namespace {
template <bool kCentred>
void cpu_norm(const KernelArgs& a) {
  const auto& at = std::get<LayerNormAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(a.in[1].shape.numel() == C && a.in[1].dtype == DType::f32 && y.shape == x.shape);
  if constexpr (kCentred) {
    LOOM_ASSERT(a.in[2].shape.numel() == C && a.in[2].dtype == DType::f32);
  }
  LOOM_ASSERT(a.out[1].shape.numel() == R && a.out.back().shape.numel() == R);
  const float* scale = a.in[1].as<float>();
  const float offset = at.unit_offset ? 1.f : 0.f;
  const float* bias = kCentred ? a.in[2].as<float>() : nullptr;
  float* mean_out = kCentred ? a.out[1].as<float>() : nullptr;
  float* rstd_out = a.out[kCentred ? 2 : 1].as<float>();
  const auto fc = static_cast<float>(C);
  Bump ws(a.workspace);
  const LayerNormSpans s = layer_norm_spans(ws, a);
#pragma omp parallel for schedule(static) num_threads(s.team)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = row_f32(x, r * C, C, s.x.mine());
    float* t = y.dtype == DType::f32 ? y.as<float>() + r * C : s.y.mine();
    if constexpr (kCentred) {
      const float mean = sum_f32(xr, C) / fc;
      for (int64_t c = 0; c < C; ++c) t[c] = xr[c] - mean;
      const float var = dot_f32(t, t, C) / fc;
      const float rstd = 1.f / std::sqrt(var + at.eps);
      for (int64_t c = 0; c < C; ++c) t[c] = t[c] * rstd * scale[c] + bias[c];
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    } else {
      const float rstd = 1.f / std::sqrt(dot_f32(xr, xr, C) / fc + at.eps);
      for (int64_t c = 0; c < C; ++c) t[c] = xr[c] * rstd * (offset + scale[c]);
      rstd_out[r] = rstd;
    }
    if (y.dtype != DType::f32) store_f32(t, y.data, y.dtype, r * C, C);
  }
}
}  // namespace

// With the saved statistics: xhat = (x − mean)·rstd, g = dy·scale,
// dx = rstd·(g − mean_row(g) − xhat·mean_row(g·xhat)), dscale = Σ_rows dy·xhat, dbias = Σ_rows dy;
// not centred, mean = 0 and the mean_row(g) term goes. Inputs (dy, x, scale[, mean], rstd),
// outputs (dx, dscale[, dbias]). dscale/dbias: the rows are split into a number of chunks that depends only on R; each
// chunk accumulates its rows in order into its own partial rows, and the partials are added in chunk order, so the
// result does not depend on the thread count.
namespace {
constexpr int64_t kMaxChunks = 32;
// The partial sums ([chunks, C] for dscale, then [chunks, C] for dbias, also taken when not centred)
// and per thread xhat, g and
// the rows of dy and x widened (when they are not f32).
struct LayerNormGradSpans {
  float* part;
  PerThread<float> xhat, g, dy, x;
  int team;
};
LayerNormGradSpans layer_norm_grad_spans(Bump& ws, const KernelArgs& a) {
  const TensorArg& x = a.in[1];
  const int64_t C = x.shape.last(), R = x.shape.rows(), nchunks = std::min(R, kMaxChunks);
  const int team = ws.team(R * C >= kParallelMin, nchunks);
  // In the order the fields are declared: designated initializers are evaluated in that order.
  return {.part = ws.take<float>(2 * nchunks * C),
          .xhat = ws.per_thread<float>(C, team),
          .g = ws.per_thread<float>(C, team),
          .dy = ws.per_thread<float>(row_floats(a.in[0], C), team),
          .x = ws.per_thread<float>(row_floats(x, C), team),
          .team = team};
}

template <bool kCentred>
void cpu_norm_grad(const KernelArgs& a) {
  const TensorArg& dy = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t C = x.shape.last(), R = x.shape.rows();
  LOOM_ASSERT(dy.shape == x.shape && dx.shape == x.shape);
  LOOM_ASSERT(a.in[2].shape.numel() == C && a.in[2].dtype == DType::f32);
  for (size_t i = 3; i < a.in.size(); ++i) LOOM_ASSERT(a.in[i].shape.numel() == R && a.in[i].dtype == DType::f32);
  for (size_t i = 1; i < a.out.size(); ++i) LOOM_ASSERT(a.out[i].shape.numel() == C);
  const float* scale = a.in[2].as<float>();
  const float offset = std::get<LayerNormAttrs>(a.node.attrs).unit_offset ? 1.f : 0.f;
  const float* mean_in = kCentred ? a.in[3].as<float>() : nullptr;
  const float* rstd_in = a.in[kCentred ? 4 : 3].as<float>();
  float* dscale = a.out[1].as<float>();
  float* dbias = kCentred ? a.out[2].as<float>() : nullptr;
  if (R == 0) {
    std::fill(dscale, dscale + C, 0.f);
    if (dbias) std::fill(dbias, dbias + C, 0.f);
    return;
  }
  const int64_t nchunks = std::min(R, kMaxChunks);
  Bump ws(a.workspace);
  const LayerNormGradSpans s = layer_norm_grad_spans(ws, a);
  float* part = s.part;
  const auto fc = static_cast<float>(C);
#pragma omp parallel for schedule(static) num_threads(s.team)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    float* ds = part + ch * C;
    float* db = part + (nchunks + ch) * C;
    std::fill(ds, ds + C, 0.f);
    std::fill(db, db + C, 0.f);
    float* xhat = s.xhat.mine();
    float* g = s.g.mine();
    for (int64_t r = ch * R / nchunks; r < (ch + 1) * R / nchunks; ++r) {
      const float* dyr = row_f32(dy, r * C, C, s.dy.mine());
      const float* xr = row_f32(x, r * C, C, s.x.mine());
      const float mean = kCentred ? mean_in[r] : 0.f, rstd = rstd_in[r];
      // The rows never overlap; without `omp simd` GCC gives up on the alias checks and this
      // loop stays scalar.
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        xhat[c] = (xr[c] - mean) * rstd;
        g[c] = dyr[c] * (offset + scale[c]);
        ds[c] += dyr[c] * xhat[c];
        db[c] += dyr[c];
      }
      const float g_mean = kCentred ? sum_f32(g, C) / fc : 0.f;
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
    if (dbias) dbias[c] = b;
  }
}
}  // namespace

void cpu_layer_norm(const KernelArgs& a) { cpu_norm<true>(a); }
void cpu_rms_norm(const KernelArgs& a) { cpu_norm<false>(a); }
void cpu_layer_norm_grad(const KernelArgs& a) { cpu_norm_grad<true>(a); }
void cpu_rms_norm_grad(const KernelArgs& a) { cpu_norm_grad<false>(a); }

KernelScratch cpu_workspace_layer_norm(const KernelArgs& a) { return workspace_of<layer_norm_spans>(a); }
KernelScratch cpu_workspace_layer_norm_grad(const KernelArgs& a) { return workspace_of<layer_norm_grad_spans>(a); }
KernelScratch cpu_workspace_rms_norm(const KernelArgs& a) { return workspace_of<layer_norm_spans>(a); }
KernelScratch cpu_workspace_rms_norm_grad(const KernelArgs& a) { return workspace_of<layer_norm_grad_spans>(a); }

// qk_norm and its backward: one packed row (b, t, s) of W = (G+2)·D elements per iteration, widened
// into the thread's row buffer, each of its G query heads and its key head normalised there in f32
// as rms_norm's rows, the row stored (the value part unchanged). The backward's dq_scale and
// dk_scale sum over row chunks that depend only on the row count, as norm_grad's, so the result does
// not depend on the thread count.
namespace {
struct QkNormSpans {
  float* part;  // backward: [chunks, 2·D] partial dq_scale, dk_scale
  PerThread<float> row, dy;
  int team;
};
template <bool kGrad>
QkNormSpans qk_norm_spans(Bump& ws, const KernelArgs& a) {
  const Shape& s = a.in[kGrad ? 1 : 0].shape;
  const int64_t W = s[3], rows = s.numel() / W, D = W / (std::get<QkNormAttrs>(a.node.attrs).group + 2);
  const int64_t nchunks = std::min(rows, kMaxChunks);
  const int team = ws.team(rows * W >= kParallelMin, kGrad ? nchunks : rows);
  return {.part = kGrad ? ws.take<float>(nchunks * 2 * D) : nullptr,
          .row = ws.per_thread<float>(W, team),
          .dy = ws.per_thread<float>(kGrad ? W : 0, team),
          .team = team};
}
}  // namespace

void cpu_qk_norm(const KernelArgs& a) {
  const auto& at = std::get<QkNormAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t W = x.shape[3], parts = at.group + 2, D = W / parts, rows = x.shape.numel() / W;
  LOOM_ASSERT(y.shape == x.shape && y.dtype == x.dtype && a.out[1].shape.numel() == rows * (parts - 1));
  const float* q_scale = a.in[1].as<float>();
  const float* k_scale = a.in[2].as<float>();
  const float offset = at.unit_offset ? 1.f : 0.f;
  float* rstd_out = a.out[1].as<float>();
  const auto fd = static_cast<float>(D);
  Bump ws(a.workspace);
  const QkNormSpans sp = qk_norm_spans<false>(ws, a);
#pragma omp parallel for schedule(static) num_threads(sp.team)
  for (int64_t r = 0; r < rows; ++r) {
    float* buf = sp.row.mine();
    load_f32(x.data, x.dtype, r * W, buf, W);
    for (int64_t p = 0; p + 1 < parts; ++p) {
      float* h = buf + p * D;
      const float* scale = p < at.group ? q_scale : k_scale;
      const float rstd = 1.f / std::sqrt(dot_f32(h, h, D) / fd + at.eps);
      for (int64_t c = 0; c < D; ++c) h[c] = h[c] * rstd * (offset + scale[c]);
      rstd_out[r * (parts - 1) + p] = rstd;
    }
    store_f32(buf, y.data, y.dtype, r * W, W);
  }
}

void cpu_qk_norm_grad(const KernelArgs& a) {
  const auto& at = std::get<QkNormAttrs>(a.node.attrs);
  const TensorArg& dy = a.in[0];
  const TensorArg& x = a.in[1];
  const TensorArg& dx = a.out[0];
  const int64_t W = x.shape[3], parts = at.group + 2, D = W / parts, rows = x.shape.numel() / W;
  LOOM_ASSERT(dy.shape == x.shape && dx.shape == x.shape && a.in[4].shape.numel() == rows * (parts - 1));
  const float* scales[2] = {a.in[2].as<float>(), a.in[3].as<float>()};
  const float* rstd_in = a.in[4].as<float>();
  const float offset = at.unit_offset ? 1.f : 0.f;
  float* dscale[2] = {a.out[1].as<float>(), a.out[2].as<float>()};
  if (rows == 0) {
    for (float* d : dscale) std::fill(d, d + D, 0.f);
    return;
  }
  const int64_t nchunks = std::min(rows, kMaxChunks);
  Bump ws(a.workspace);
  const QkNormSpans sp = qk_norm_spans<true>(ws, a);
  const auto fd = static_cast<float>(D);
#pragma omp parallel for schedule(static) num_threads(sp.team)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    float* part = sp.part + ch * 2 * D;
    std::fill(part, part + 2 * D, 0.f);
    float* xr = sp.row.mine();
    float* dyr = sp.dy.mine();
    for (int64_t r = ch * rows / nchunks; r < (ch + 1) * rows / nchunks; ++r) {
      load_f32(x.data, x.dtype, r * W, xr, W);
      load_f32(dy.data, dy.dtype, r * W, dyr, W);
      for (int64_t p = 0; p + 1 < parts; ++p) {
        const int k = p == at.group ? 1 : 0;
        const float* scale = scales[k];
        float* ds = part + k * D;
        float* xh = xr + p * D;  // becomes xhat
        float* g = dyr + p * D;  // becomes g = dy·scale, then dx
        const float rstd = rstd_in[r * (parts - 1) + p];
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) {
          xh[c] *= rstd;
          ds[c] += g[c] * xh[c];
          g[c] *= offset + scale[c];
        }
        const float gx_mean = dot_f32(g, xh, D) / fd;
        for (int64_t c = 0; c < D; ++c) g[c] = rstd * (g[c] - xh[c] * gx_mean);
      }
      store_f32(dyr, dx.data, dx.dtype, r * W, W);  // the value part: dy's, unchanged
    }
  }
#pragma omp parallel for schedule(static) if (nchunks * 2 * D >= kParallelMin)
  for (int64_t c = 0; c < 2 * D; ++c) {
    float s = 0.f;
    for (int64_t ch = 0; ch < nchunks; ++ch) s += sp.part[ch * 2 * D + c];
    dscale[c / D][c % D] = s;
  }
}

KernelScratch cpu_workspace_qk_norm(const KernelArgs& a) { return workspace_of<qk_norm_spans<false>>(a); }
KernelScratch cpu_workspace_qk_norm_grad(const KernelArgs& a) { return workspace_of<qk_norm_spans<true>>(a); }

}  // namespace loom
