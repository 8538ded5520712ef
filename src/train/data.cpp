#include "train/data.h"

#include <cstring>

#include "core/rng.h"
#include "train/init.h"
#include "train/token_data.h"

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

DataSource::DataSource(const Config& c) {
  if (c.data.kind != "tokens") {
    fixed_ = make_batch(c);
    return;
  }
  const TokenMeta meta = read_token_meta(c.data.dir);
  if (meta.vocab_size > c.model.vocab_size)
    throw UserError(meta.path, "the data's vocabulary has " + std::to_string(meta.vocab_size) +
                                   " tokens but model.vocab_size is " + std::to_string(c.model.vocab_size),
                    "set model.vocab_size (and model.num_outputs) to at least " + std::to_string(meta.vocab_size));
  tokenizer_ = meta.tokenizer;
  train_file_ = std::make_unique<TokenFile>(TokenFile::open_split(c.data.dir, "train"));
  const int64_t mb = c.data.batch_size / c.optimizer.num_minibatches;
  if (train_file_->size() <= c.data.seq_len)
    throw UserError(train_file_->path(), "has " + std::to_string(train_file_->size()) + " tokens, fewer than one window of data.seq_len + 1",
                    "use more text or a shorter data.seq_len");
  train_batcher_ = std::make_unique<TokenBatcher>(*train_file_, c.data.batch_size, c.data.seq_len, BatchMode::train, c.seed);
  val_file_ = std::make_unique<TokenFile>(TokenFile::open_split(c.data.dir, "val"));
  if (val_file_->size() > c.data.seq_len)
    val_batcher_ = std::make_unique<TokenBatcher>(*val_file_, mb, c.data.seq_len, BatchMode::val, c.seed);
}

DataSource::~DataSource() = default;

Batch DataSource::train_batch(int64_t step) const {
  return train_batcher_ ? train_batcher_->train_batch(static_cast<uint64_t>(step)) : fixed_;
}
Batch DataSource::val_batch() { return val_batcher_->val_batch(); }
int64_t DataSource::val_position() const { return val_batcher_ ? val_batcher_->position() : 0; }
void DataSource::set_val_position(int64_t p) {
  if (val_batcher_) val_batcher_->set_position(p);
}

Batch make_batch(const Config& c) {
  return c.data.kind == "random_tokens" ? random_tokens_batch(c) : random_classification_batch(c);
}

}  // namespace loom
