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

Batch random_tokens_batch(const Config& c) {
  Batch b;
  b.batch_size = c.data.batch_size;
  const int64_t B = c.data.batch_size, T = c.data.seq_len, V = c.data.vocab_size;
  const PhiloxKey key = named_key(c.seed, "data/tokens");
  std::vector<int32_t> inputs(static_cast<size_t>(B * T));
  b.labels.resize(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) {
    const auto u = static_cast<int64_t>(rng_uniform(key, static_cast<uint64_t>(i)) * static_cast<float>(V - 1));
    b.labels[i] = static_cast<int32_t>(1 + std::min<int64_t>(u, V - 2));
  }
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) inputs[r * T + t] = t == 0 ? 0 : b.labels[r * T + t - 1];
  b.inputs.resize(inputs.size() * 4);
  std::memcpy(b.inputs.data(), inputs.data(), b.inputs.size());
  return b;
}

Batch make_batch(const Config& c) {
  return c.data.kind == "random_tokens" ? random_tokens_batch(c) : random_classification_batch(c);
}

}  // namespace loom
