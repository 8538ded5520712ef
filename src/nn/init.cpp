#include "nn/init.h"

#include <algorithm>
#include <cmath>

#include <omp.h>

namespace loom {

ParamDraw::ParamDraw(const Graph& g, const Param& p, uint64_t seed)
    : init_(p.init), key_(named_key(seed, "init/" + g.value(p.value).name)), numel_(g.value(p.value).shape.numel()) {}

void ParamDraw::fill(int64_t first, int64_t n, float* out) const {
  // Every element is a function of its index alone, so chunks can be drawn by any thread: the
  // transcendentals of the normals make drawing an 8B base take minutes on one core.
  constexpr int64_t kChunk = int64_t{1} << 12;
  if (n > kChunk && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) fill(first + c, std::min(kChunk, n - c), out + c);
    return;
  }
  const auto i0 = static_cast<uint64_t>(first);
  const auto count = static_cast<size_t>(n);
  switch (init_.kind) {
    case ParamInit::zeros:
      std::fill_n(out, count, 0.f);
      break;
    case ParamInit::ones:
      std::fill_n(out, count, 1.f);
      break;
    case ParamInit::normal:
      rng_normal_fill(key_, i0, count, out);
      for (size_t k = 0; k < count; ++k) out[k] *= init_.stddev;
      break;
    case ParamInit::truncated_normal:
      // Element i redraws at indices i, i+numel, i+2·numel, ... until |z| <= 2: deterministic per element.
      rng_normal_fill(key_, i0, count, out);
      for (size_t k = 0; k < count; ++k) {
        for (uint64_t j = i0 + k + static_cast<uint64_t>(numel_); std::fabs(out[k]) > 2.f; j += static_cast<uint64_t>(numel_))
          out[k] = rng_normal(key_, j);
        out[k] *= init_.stddev;
      }
      break;
    case ParamInit::uniform:  // torch's kaiming_uniform_ as PEFT calls it: U(-bound, bound)
      rng_uniform_fill(key_, i0, count, out);
      for (size_t k = 0; k < count; ++k) out[k] = init_.stddev * (2.f * out[k] - 1.f);
      break;
  }
}

void init_param(const Graph& g, const Param& p, uint64_t seed, std::vector<float>& out) {
  const ParamDraw draw(g, p, seed);
  out.resize(static_cast<size_t>(draw.numel()));
  draw.fill(0, draw.numel(), out.data());
}

}  // namespace loom
