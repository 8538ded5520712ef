// Row primitives of the softmax losses (loss.cpp, linear_cross_entropy.cpp): a row's label, its
// exps and their sum, and jnp.argmax of a row, in f32 with fixed-order sums.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_util.h"

namespace loom::cpuk {

// Row r's label of the loss ops (labels [rows] i32 over V classes), negative when the row is
// ignored (ops.def, cross_entropy); one >= V is a bug in the caller.
inline int32_t label_at(const TensorArg& labels, int64_t r, int64_t V) {
  const int32_t l = labels.as<const int32_t>()[r];
  LOOM_ASSERT(l < V, "label " + std::to_string(l) + " out of range [0, " + std::to_string(V) + ")");
  return l;
}

// e[c] = exp(x[c] − max) for a row of C elements; returns {max, Σ e} (fixed-order sum).
// max ignores NaNs (like fmax); a row of NaNs or −inf propagates NaN through the exps. exp_f32,
// not libm's scalar expf: the logits are the largest tensor of a GPT-2 step (50257 per token).
struct RowExp {
  float max, sum;
};
inline RowExp row_exp(const float* x, int64_t C, float* e) {
  const float mx = max_f32(x, C);
  for (int64_t c = 0; c < C; ++c) e[c] = exp_f32(x[c] - mx);
  return {mx, sum_f32(e, C)};
}

// jnp.argmax of a row of n > 0: the first NaN if there is one (argmax takes NaN for the largest),
// else the first element equal to the row's max. Vectorised passes: the max and the NaN count,
// then chunks searched for a hit with one vector compare each, and only the chunk that has one
// element by element (a scalar scan made accuracy cost twice the cross-entropy over the same row).
inline int64_t argmax_row(const float* x, int64_t n) {
  const float mx = max_f32(x, n);  // NaNs never win its compare
  int64_t nans = 0;
#pragma omp simd reduction(+ : nans)
  for (int64_t c = 0; c < n; ++c) nans += x[c] != x[c];
  // The first c with hit(c), one vector compare per chunk until a chunk has one.
  const auto first = [&](auto hit) -> int64_t {
    constexpr int64_t kChunk = 64;
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t c1 = std::min(n, c0 + kChunk);
      int64_t any = 0;
#pragma omp simd reduction(+ : any)
      for (int64_t c = c0; c < c1; ++c) any += hit(x[c]);
      if (any > 0)
        for (int64_t c = c0;; ++c)
          if (hit(x[c])) return c;
    }
    return 0;  // a row of n > 0 always has a hit
  };
  return nans > 0 ? first([](float v) { return v != v; }) : first([mx](float v) { return v == mx; });
}

}  // namespace loom::cpuk
