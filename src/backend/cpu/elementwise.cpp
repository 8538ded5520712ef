// CPU kernels for the elementwise structure ops (graph/ops/elementwise.cpp): dropout, reshape,
// cast, add and in-place gradient accumulation. OpenMP over fixed blocks of elements.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_util.h"
#include "backend/kernel_math.h"
#include "core/rng.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

// convert() over n elements, in parallel blocks.
void convert_par(const void* src, DType sdt, void* dst, DType ddt, int64_t n) {
  const size_t ss = dtype_size(sdt), ds = dtype_size(ddt);
  const int64_t nb = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlock, len = std::min(kBlock, n - off);
    convert(static_cast<const unsigned char*>(src) + static_cast<size_t>(off) * ss, sdt,
            static_cast<unsigned char*>(dst) + static_cast<size_t>(off) * ds, ddt, static_cast<size_t>(len));
  }
}

}  // namespace

// Inverted dropout: element i is kept iff kmath::dropout_keep(rng_uniform(key, i), keep) with
// key = rng_key(seed, step, minibatch, stream) and keep = 1 − rate (float); kept elements are
// x / keep (one float division, then the dtype rounding: the same value as the reference's
// double division, since double rounding through f32 is innocuous for one operation), dropped
// ones 0. rate 0 is an exact copy. Uniforms are drawn per block with rng_uniform_fill.
void cpu_dropout(const KernelArgs& a) {
  const auto& at = std::get<DropoutAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t n = x.shape.numel();
  LOOM_ASSERT(y.shape.numel() == n && y.dtype == x.dtype);
  if (at.rate == 0.f) {
    convert_par(x.data, x.dtype, y.data, y.dtype, n);
    return;
  }
  const float keep = 1.f - at.rate;
  const PhiloxKey key = rng_key(a.run.seed, a.run.step, a.run.minibatch, at.stream);
  const int64_t nb = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin / 4)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlock, len = std::min(kBlock, n - off);
    float u[kBlock], v[kBlock];
    rng_uniform_fill(key, static_cast<uint64_t>(off), static_cast<size_t>(len), u);
    load_f32(x.data, x.dtype, off, v, len);
    for (int64_t i = 0; i < len; ++i) v[i] = kmath::dropout_keep(u[i], keep) ? v[i] / keep : 0.f;
    store_f32(v, y.data, y.dtype, off, len);
  }
}

// A view: the planner aliases the output to the input's storage, so there is nothing to do.
void cpu_reshape(const KernelArgs& a) {
  LOOM_ASSERT(a.in[0].data == a.out[0].data, "reshape's output must alias its input");
  LOOM_ASSERT(a.in[0].shape.numel() == a.out[0].shape.numel());
}

// Element-wise conversion with the core rounding rules (one correct rounding per element).
void cpu_cast(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  LOOM_ASSERT(x.shape.numel() == y.shape.numel());
  convert_par(x.data, x.dtype, y.data, y.dtype, x.shape.numel());
}

// y[i] = round(a[i] + b[i mod numel(b)]): b's shape is a suffix of a's. Floats add in f32 and
// round once to the dtype (for 16-bit inputs the f32 sum rounds to the same value as the exact
// sum would); int32 adds exactly with two's-complement wraparound, like the reference. A 16-bit b
// is widened block by block beside a when it has a's shape (a residual add), and once into the
// workspace when it is broadcast (a bias).
namespace {
bool widen_b_once(const KernelArgs& a) {
  const TensorArg& b = a.in[1];
  return b.dtype != DType::i32 && needs_f32_copy(b, DType::f32) && b.shape.numel() < a.in[0].shape.numel();
}
float* add_b_f32(Bump& ws, const KernelArgs& a) {
  return widen_b_once(a) ? ws.take<float>(a.in[1].shape.numel()) : nullptr;
}
}  // namespace

void cpu_add(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& bt = a.in[1];
  const TensorArg& y = a.out[0];
  const int64_t n = x.shape.numel(), nb = bt.shape.numel();
  LOOM_ASSERT(y.shape.numel() == n && y.dtype == x.dtype && bt.dtype == x.dtype && (nb > 0 || n == 0));
  if (n == 0) return;
  const int64_t nblk = ceil_div(n, kBlock);
  if (y.dtype == DType::i32) {
    const auto* xs = x.as<const uint32_t>();
    const auto* bs = bt.as<const uint32_t>();
    auto* ys = y.as<uint32_t>();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t off = blk * kBlock, end = std::min(n, off + kBlock);
      for (int64_t i = off, j = off % nb; i < end;) {
        const int64_t len = std::min(end - i, nb - j);
        for (int64_t k = 0; k < len; ++k) ys[i + k] = xs[i + k] + bs[j + k];
        i += len;
        j = 0;
      }
    }
    return;
  }
  Bump ws(a.workspace);
  float* b_wide = add_b_f32(ws, a);
  // b as f32 for all of it (its own memory, or widened once), or nullptr: widened per block.
  const float* bs = bt.dtype == DType::f32 || widen_b_once(a) ? f32_rounded(bt, DType::f32, b_wide) : nullptr;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t off = blk * kBlock, len = std::min(kBlock, n - off);
    float v[kBlock];
    load_f32(x.data, x.dtype, off, v, len);
    if (!bs) {  // b has a's shape: its block beside a's
      float w[kBlock];
      load_f32(bt.data, bt.dtype, off, w, len);
      for (int64_t k = 0; k < len; ++k) v[k] += w[k];
      store_f32(v, y.data, y.dtype, off, len);
      continue;
    }
    for (int64_t i = 0, j = off % nb; i < len;) {
      const int64_t seg = std::min(len - i, nb - j);
      for (int64_t k = 0; k < seg; ++k) v[i + k] += bs[j + k];
      i += seg;
      j = 0;
    }
    store_f32(v, y.data, y.dtype, off, len);
  }
}

// grad[i] += ct[i] (grad[i] = ct[i] in minibatch 0 when the attrs say so), in place in the
// persistent fp32 gradient buffer (input 0); no outputs.
void cpu_grad_accumulate(const KernelArgs& a) {
  const TensorArg& acc = a.in[0];
  const TensorArg& ct = a.in[1];
  const int64_t n = acc.shape.numel();
  LOOM_ASSERT(acc.dtype == DType::f32 && ct.dtype == DType::f32 && ct.shape.numel() == n);
  const bool assign =
      std::get<GradAccumulateAttrs>(a.node.attrs).assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  float* g = acc.as<float>();
  const int64_t nb = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlock, len = std::min(kBlock, n - off);
    if (assign) {
      std::copy_n(ct.as<float>() + off, len, g + off);
      continue;
    }
    const float* c = ct.as<float>() + off;  // ct is f32 (the op's shape rule)
    for (int64_t i = 0; i < len; ++i) g[off + i] += c[i];
  }
}

// add_low_rank (ops.def): per row m of u and head h, the product's columns in blocks of kBlock,
// each formed in f32 (k in order, kLanes columns at a time so they stay in registers), rounded to
// c, and added into out's columns while the block is in cache; y's other columns are copied first
// (nothing moves when the planner ran the op in place). OpenMP over rows. The products are exact
// and only their order of summation differs from the reference's (r terms).
namespace {
struct LowRankSpans {
  float* v;  // [r, N]: V rounded to c, transposed when stored [N, r]
  float* u;  // [M, r]: u rounded to c, when it needs a copy
};
LowRankSpans low_rank_spans(Bump& ws, const KernelArgs& a) {
  const auto& at = std::get<ColumnsAttrs>(a.node.attrs);
  return {ws.take<float>(a.in[2].shape.numel()),
          needs_f32_copy(a.in[1], at.compute) ? ws.take<float>(a.in[1].shape.numel()) : nullptr};
}
}  // namespace

void cpu_add_low_rank(const KernelArgs& a) {
  constexpr int64_t kLanes = 64;
  const auto& at = std::get<ColumnsAttrs>(a.node.attrs);
  const TensorArg& y = a.in[0];
  const TensorArg& u = a.in[1];
  const TensorArg& v = a.in[2];
  const TensorArg& out = a.out[0];
  const int64_t r = u.shape.last(), M = u.shape.rows(), N = r > 0 ? v.shape.numel() / r : 0;
  const int64_t W = y.shape.last(), H = at.width > 0 ? N / at.width : 0;
  Bump ws(a.workspace);
  const LowRankSpans s = low_rank_spans(ws, a);
  load_f32(v.data, v.dtype, 0, s.v, v.shape.numel());
  if (at.transpose_v) {  // [N, r] -> [r, N] (V is small: r·N elements)
    std::vector<float> t(s.v, s.v + r * N);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < r; ++k) s.v[k * N + n] = t[static_cast<size_t>(n * r + k)];
  }
  round_inplace(s.v, r * N, at.compute);
  const float* uf = f32_rounded(u, at.compute, s.u);
  if (out.data != y.data) std::memcpy(out.data, y.data, static_cast<size_t>(y.shape.numel() * dtype_size(y.dtype)));
  const float scale = at.scale;
#pragma omp parallel for schedule(static) if (M * N * (r + 1) >= kParallelMin)
  for (int64_t m = 0; m < M; ++m) {
    const float* um = uf + m * r;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j0 = 0; j0 < at.width; j0 += kBlock) {
        const int64_t len = std::min(kBlock, at.width - j0);
        const float* vb = s.v + h * at.width + j0;
        float acc[kBlock], yb[kBlock];
        for (int64_t j = 0; j < len; j += kLanes) {
          float t[kLanes] = {};
          if (len - j >= kLanes) {
            for (int64_t k = 0; k < r; ++k)
              for (int64_t l = 0; l < kLanes; ++l) t[l] += um[k] * vb[k * N + j + l];
          } else {
            for (int64_t k = 0; k < r; ++k)
              for (int64_t l = 0; l < len - j; ++l) t[l] += um[k] * vb[k * N + j + l];
          }
          std::copy_n(t, std::min(kLanes, len - j), acc + j);
        }
        round_inplace(acc, len, at.compute);
        const int64_t off = (m * H + h) * W + at.offset + j0;
        load_f32(out.data, out.dtype, off, yb, len);
        for (int64_t j = 0; j < len; ++j) yb[j] += scale * acc[j];
        store_f32(yb, out.data, out.dtype, off, len);
      }
  }
}
KernelScratch cpu_workspace_add_low_rank(const KernelArgs& a) { return workspace_of<low_rank_spans>(a); }

// scale·dy[r, o + j]: the f32 product is the reference's exact double product rounded. OpenMP over rows.
void cpu_take_columns(const KernelArgs& a) {
  const auto& at = std::get<ColumnsAttrs>(a.node.attrs);
  const TensorArg& dy = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t W = dy.shape.last(), rows = y.shape.numel() / at.width;
#pragma omp parallel for schedule(static) if (y.shape.numel() >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < at.width; c0 += kBlock) {
      const int64_t len = std::min(kBlock, at.width - c0);
      float v[kBlock];
      load_f32(dy.data, dy.dtype, r * W + at.offset + c0, v, len);
      for (int64_t k = 0; k < len; ++k) v[k] *= at.scale;
      store_f32(v, y.data, y.dtype, r * at.width + c0, len);
    }
}

KernelScratch cpu_workspace_add(const KernelArgs& a) { return workspace_of<add_b_f32>(a); }
LOOM_CPU_NO_WORKSPACE(dropout)
LOOM_CPU_NO_WORKSPACE(reshape)
LOOM_CPU_NO_WORKSPACE(cast)
LOOM_CPU_NO_WORKSPACE(grad_accumulate)
LOOM_CPU_NO_WORKSPACE(take_columns)

}  // namespace loom
