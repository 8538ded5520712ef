#include "train/data.h"

#include <cstring>

#include "core/rng.h"
#include "train/init.h"

namespace loom {

Batch random_classification_batch(const Config& c) {
  Batch b;
  b.batch_size = c.data.batch_size;
  const int64_t n = c.data.batch_size * c.data.num_inputs;
  std::vector<float> x(static_cast<size_t>(n));
  const PhiloxKey kx = named_key(c.seed, "data/inputs");
  for (int64_t i = 0; i < n; ++i) x[i] = rng_normal(kx, static_cast<uint64_t>(i));
  b.inputs.resize(x.size() * sizeof(float));
  std::memcpy(b.inputs.data(), x.data(), b.inputs.size());
  const PhiloxKey ky = named_key(c.seed, "data/labels");
  b.labels.resize(static_cast<size_t>(c.data.batch_size));
  for (int64_t i = 0; i < c.data.batch_size; ++i) {
    const auto v = static_cast<int64_t>(rng_uniform(ky, static_cast<uint64_t>(i)) * static_cast<float>(c.model.num_classes));
    b.labels[i] = static_cast<int32_t>(std::min<int64_t>(v, c.model.num_classes - 1));
  }
  return b;
}

}  // namespace loom
