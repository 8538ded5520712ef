// Reference kernels for the elementwise structure ops (graph/ops/elementwise.cpp): dropout,
// reshape, cast, add and in-place gradient accumulation.
#include "backend/kernel_math.h"
#include "backend/reference/util.h"
#include "core/rng.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::st;

// Inverted dropout: element i is kept iff kmath::dropout_keep(rng_uniform(key, i), keep) with
// key = rng_key(seed, step, minibatch, stream) and keep = 1 − rate; kept elements are x / keep,
// dropped ones 0. rate 0 is an exact copy.
void ref_dropout(const KernelArgs& a) {
  const auto& at = std::get<DropoutAttrs>(a.node.attrs);
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t n = x.shape.numel();
  LOOM_ASSERT(y.shape.numel() == n && y.dtype == x.dtype);
  if (at.rate == 0.f) {
    convert(x.data, x.dtype, y.data, y.dtype, static_cast<size_t>(n));
    return;
  }
  const float keep = 1.f - at.rate;
  const PhiloxKey key = rng_key(a.run.seed, a.run.step, a.run.minibatch, at.stream);
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = kmath::dropout_keep(rng_uniform(key, static_cast<uint64_t>(i)), keep);
    st(y, i, kept ? ld(x, i) / static_cast<double>(keep) : 0.0);
  }
}

// A view: the planner aliases the output to the input's storage, so there is nothing to do.
void ref_reshape(const KernelArgs& a) {
  LOOM_ASSERT(a.in[0].data == a.out[0].data, "reshape's output must alias its input");
  LOOM_ASSERT(a.in[0].shape.numel() == a.out[0].shape.numel());
}

// Element-wise conversion with the core rounding rules (one correct rounding per element).
void ref_cast(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& y = a.out[0];
  LOOM_ASSERT(x.shape.numel() == y.shape.numel());
  convert(x.data, x.dtype, y.data, y.dtype, static_cast<size_t>(x.shape.numel()));
}

// y[i] = round(a[i] + b[i mod numel(b)]): b's shape is a suffix of a's. Floats add in double and
// round once; int32 adds exactly with two's-complement wraparound.
void ref_add(const KernelArgs& a) {
  const TensorArg& x = a.in[0];
  const TensorArg& b = a.in[1];
  const TensorArg& y = a.out[0];
  const int64_t n = x.shape.numel(), nb = b.shape.numel();
  LOOM_ASSERT(y.shape.numel() == n && (nb > 0 || n == 0));
  if (y.dtype == DType::i32) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t s = static_cast<uint32_t>(refk::ld_i32(x, i)) + static_cast<uint32_t>(refk::ld_i32(b, i % nb));
      refk::st_i32(y, i, static_cast<int32_t>(s));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) st(y, i, ld(x, i) + ld(b, i % nb));
}

// y + scale·round_c(Σ_k round_c(u[m, k])·round_c(V[k, n])) in double over the columns
// (ops.def), rounded once; y's other columns copied.
void ref_add_low_rank(const KernelArgs& a) {
  const auto& at = std::get<ColumnsAttrs>(a.node.attrs);
  const TensorArg& y = a.in[0];
  const TensorArg& u = a.in[1];
  const TensorArg& v = a.in[2];
  const TensorArg& out = a.out[0];
  const int64_t r = u.shape.last(), M = u.shape.rows(), N = v.shape.numel() / std::max<int64_t>(r, 1);
  const int64_t W = y.shape.last(), H = N / at.width;
  const DType c = at.compute;
  for (int64_t i = 0; i < y.shape.numel(); ++i) st(out, i, ld(y, i));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k)
        acc += refk::rnd(c, ld(u, m * r + k)) * refk::rnd(c, ld(v, at.transpose_v ? n * r + k : k * N + n));
      const int64_t i = (m * H + n / at.width) * W + at.offset + n % at.width;
      st(out, i, ld(y, i) + double{at.scale} * refk::rnd(c, acc));
    }
}

// scale·dy[r, o + j] in double, rounded once.
void ref_take_columns(const KernelArgs& a) {
  const auto& at = std::get<ColumnsAttrs>(a.node.attrs);
  const TensorArg& dy = a.in[0];
  const TensorArg& y = a.out[0];
  const int64_t W = dy.shape.last(), rows = y.shape.numel() / at.width;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < at.width; ++j) st(y, r * at.width + j, double{at.scale} * ld(dy, r * W + at.offset + j));
}

// grad[i] += ct[i] (grad[i] = ct[i] in minibatch 0 when the attrs say so), in place in the
// persistent fp32 gradient buffer (input 0); no outputs.
void ref_grad_accumulate(const KernelArgs& a) {
  const TensorArg& acc = a.in[0];
  const TensorArg& ct = a.in[1];
  LOOM_ASSERT(acc.dtype == DType::f32 && acc.shape.numel() == ct.shape.numel());
  const bool assign =
      std::get<GradAccumulateAttrs>(a.node.attrs).assign_in_first_minibatch && a.run.minibatch == a.run.first_minibatch;
  for (int64_t i = 0; i < acc.shape.numel(); ++i) st(acc, i, assign ? ld(ct, i) : ld(acc, i) + ld(ct, i));
}

}  // namespace loom
