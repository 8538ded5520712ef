#include "nn/init.h"

#include <cmath>

namespace loom {

void init_param(const Graph& g, const Param& p, uint64_t seed, std::vector<float>& out) {
  const Value& v = g.value(p.value);
  const int64_t n = v.shape.numel();
  out.assign(static_cast<size_t>(n), 0.f);
  const PhiloxKey key = named_key(seed, "init/" + v.name);
  switch (p.init.kind) {
    case ParamInit::zeros:
      break;
    case ParamInit::ones:
      for (float& x : out) x = 1.f;
      break;
    case ParamInit::normal:
      for (int64_t i = 0; i < n; ++i) out[i] = p.init.stddev * rng_normal(key, static_cast<uint64_t>(i));
      break;
    case ParamInit::truncated_normal:
      // Element i redraws at indices i, i+n, i+2n, ... until |z| <= 2: deterministic per element.
      for (int64_t i = 0; i < n; ++i) {
        float z;
        uint64_t j = static_cast<uint64_t>(i);
        do {
          z = rng_normal(key, j);
          j += static_cast<uint64_t>(n);
        } while (std::fabs(z) > 2.f);
        out[i] = p.init.stddev * z;
      }
      break;
    case ParamInit::uniform:  // torch's kaiming_uniform_ as PEFT calls it: U(-bound, bound)
      for (int64_t i = 0; i < n; ++i) out[i] = p.init.stddev * (2.f * rng_uniform(key, static_cast<uint64_t>(i)) - 1.f);
      break;
  }
}

}  // namespace loom
