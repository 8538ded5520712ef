#include "data/data.h"

#include <filesystem>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "data/chat_data.h"
#include "data/packing.h"
#include "data/token_data.h"

namespace loom {

int64_t Batch::targets(int64_t first, int64_t n) const {
  const auto per = static_cast<int64_t>(labels.size()) / batch_size;
  return std::count_if(labels.begin() + first * per, labels.begin() + (first + n) * per,
                       [](int32_t l) { return l >= 0; });
}

Batch token_batch(int64_t B, int64_t T, bool positions) {
  Batch b;
  b.batch_size = B;
  b.inputs.resize(static_cast<size_t>(B * T) * sizeof(int32_t));
  b.labels.resize(static_cast<size_t>(B * T));
  if (positions) b.positions.resize(static_cast<size_t>(B * T));
  return b;
}

Batch random_classification_batch(const DataConfig& d, const DataContext& cx) {
  Batch b;
  b.batch_size = d.batch_size;
  const int64_t n = d.batch_size * d.num_inputs;
  std::vector<float> x(static_cast<size_t>(n));
  const PhiloxKey kx = named_key(cx.seed, "data/inputs");
  for (int64_t i = 0; i < n; ++i) x[i] = rng_normal(kx, static_cast<uint64_t>(i));
  b.inputs.resize(x.size() * sizeof(float));
  std::memcpy(b.inputs.data(), x.data(), b.inputs.size());
  const PhiloxKey ky = named_key(cx.seed, "data/labels");
  b.labels.resize(static_cast<size_t>(d.batch_size));
  for (int64_t i = 0; i < d.batch_size; ++i) {
    const auto v = static_cast<int64_t>(rng_uniform(ky, static_cast<uint64_t>(i)) * static_cast<float>(cx.num_classes));
    b.labels[i] = static_cast<int32_t>(std::min<int64_t>(v, cx.num_classes - 1));
  }
  return b;
}

Batch random_tokens_batch(const DataConfig& d, const DataContext& cx) {
  Batch b;
  b.batch_size = d.batch_size;
  const int64_t B = d.batch_size, T = d.seq_len, V = d.vocab_size;
  const PhiloxKey key = named_key(cx.seed, "data/tokens");
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

bool rows_of_examples(const DataConfig& d) {
  if (d.kind != DataKind::tokens) return false;
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(d.dir) / "meta.json", ec) && read_token_meta(d.dir).chat;
}

DataSource::DataSource(const DataConfig& d, const DataContext& cx) {
  if (d.kind != DataKind::tokens) {
    fixed_ = make_batch(d, cx);
    return;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(d.dir, ec))
    throw UserError("data.dir = " + d.dir, "no such directory",
                    "prepare it with `loom prepare char INPUT " + d.dir +
                        "`, or point data.dir at a prepared one (in a config file a relative data.dir is relative to "
                        "that file; on the command line, to the current directory)");
  const TokenMeta meta = read_token_meta(d.dir);
  // A pretrained model's vocabulary is its tokenizer's: data with more tokens was tokenized with
  // another tokenizer, and no model.vocab_size can mend that.
  if (!cx.model_init_from.empty() && cx.model_vocab_size > 0 && meta.vocab_size > cx.model_vocab_size)
    throw UserError(meta.path,
                    "the data's vocabulary has " + std::to_string(meta.vocab_size) + " tokens but model.init_from (" +
                        cx.model_init_from + ") has " + std::to_string(cx.model_vocab_size) +
                        ": the data was tokenized with another tokenizer than the model's",
                    "point data.dir at data prepared with model.init_from's own tokenizer (a Hugging Face model's: "
                    "loom prepare hf " +
                        cx.model_init_from +
                        "/tokenizer.json INPUT OUTDIR), or drop model.init_from to train a new model");
  if (cx.model_vocab_size > 0 && meta.vocab_size > cx.model_vocab_size)
    throw UserError(meta.path,
                    "the data's vocabulary has " + std::to_string(meta.vocab_size) +
                        " tokens but model.vocab_size is " + std::to_string(cx.model_vocab_size),
                    "set model.vocab_size (and model.num_outputs) to at least " + std::to_string(meta.vocab_size));
  if (cx.model_num_outputs > 0 && meta.vocab_size > cx.model_num_outputs)
    throw UserError(meta.path,
                    "the data's vocabulary has " + std::to_string(meta.vocab_size) +
                        " tokens but model.num_outputs is " + std::to_string(cx.model_num_outputs) +
                        ": labels beyond the logits cannot be scored",
                    "set model.num_outputs to at least " + std::to_string(meta.vocab_size));
  tokenizer_ = meta.tokenizer;
  if (d.packing && !meta.chat)
    throw UserError("data.packing = true",
                    d.dir + " holds one stream of tokens, not examples (its meta.json has no \"chat\")",
                    "prepare the examples with `loom prepare chat`, or set data.packing = false");
  if (!meta.chat && d.loss_on != LossOn::auto_ && d.loss_on != LossOn::all)
    throw UserError("data.loss_on = " + std::string(choice_name(d.loss_on)),
                    d.dir + " holds one stream of tokens, every one a target (its meta.json has no \"chat\")",
                    "set data.loss_on = auto (or all), or prepare the examples with `loom prepare chat`");
  const auto open = [&](const char* split) {
    return std::make_unique<ChatSplit>(meta.chat ? open_chat_split(d.dir, split, d.loss_on)
                                                 : ChatSplit{TokenFile::open_split(d.dir, split), {}, {}, 0, "all"});
  };
  // A split whose rows hold no target would train or validate on nothing (a loss of 0).
  const auto check_targets = [&](const ExampleBatcher& rows, const ChatSplit& s) {
    if (rows.counts().targets > 0) return;
    throw UserError(s.tokens.path(),
                    "has no target token under data.loss_on = " + std::string(choice_name(d.loss_on)) + " (" +
                        s.loss_on + " tokens) within rows of data.seq_len = " + std::to_string(d.seq_len) +
                        ": its loss would be 0 (nothing to learn or to validate on)",
                    "set data.loss_on = all to train on every token, or check what the mask marks: the template's "
                    "assistant turns (`loom prepare chat --render-only`), --loss-on, and examples longer than "
                    "data.seq_len");
  };
  const auto mask = [](const ChatSplit& s) { return s.mask.empty() ? nullptr : s.mask.data(); };
  train_split_ = open("train");
  const TokenFile& train = train_split_->tokens;
  const int64_t mb = d.batch_size / cx.num_minibatches;
  if (meta.chat) {
    ExampleRows train_rows = pack_examples(train_split_->docs, d.seq_len, d.packing);
    int64_t cut = train_rows.truncated;
    train_rows_ =
        std::make_unique<ExampleBatcher>(std::move(train_rows), train, mask(*train_split_), d.batch_size, cx.seed);
    check_targets(*train_rows_, *train_split_);
    val_split_ = open("val");
    ExampleRows val_rows = pack_examples(val_split_->docs, d.seq_len, d.packing);
    cut += val_rows.truncated;
    if (val_rows.rows() > 0) {
      val_rows_ =
          std::make_unique<ExampleBatcher>(std::move(val_rows), val_split_->tokens, mask(*val_split_), mb, cx.seed);
      check_targets(*val_rows_, *val_split_);
    }
    if (cut > 0)
      std::fprintf(stderr,
                   "loom: note: %lld example(s) longer than data.seq_len = %lld cut to it (chat data trains on rows of "
                   "whole examples)\n",
                   static_cast<long long>(cut), static_cast<long long>(d.seq_len));
    return;
  }
  if (train.size() <= d.seq_len)
    throw UserError(train.path(),
                    "has " + std::to_string(train.size()) + " tokens, fewer than one window of data.seq_len + 1",
                    "use more text or a shorter data.seq_len");
  train_batcher_ =
      std::make_unique<TokenBatcher>(train, d.batch_size, d.seq_len, BatchMode::train, cx.seed, mask(*train_split_));
  val_split_ = open("val");
  if (val_split_->tokens.size() > d.seq_len)
    val_batcher_ =
        std::make_unique<TokenBatcher>(val_split_->tokens, mb, d.seq_len, BatchMode::val, cx.seed, mask(*val_split_));
}

DataSource::~DataSource() = default;

Batch DataSource::train_batch(int64_t step) const {
  if (train_rows_) return train_rows_->train_batch(static_cast<uint64_t>(step));
  return train_batcher_ ? train_batcher_->train_batch(static_cast<uint64_t>(step)) : fixed_;
}
TokenCounts DataSource::train_counts(int64_t step) const {
  if (train_rows_) return train_rows_->train_counts(static_cast<uint64_t>(step));
  if (train_batcher_) {  // windows of plain token data: every label a target
    const int64_t n = train_batcher_->batch_size() * train_batcher_->seq_len();
    return {n, n};
  }
  return {static_cast<int64_t>(fixed_.labels.size()), fixed_.targets(0, fixed_.batch_size)};
}

int64_t DataSource::val_batches(int64_t iters) const { return val_rows_ ? val_rows_->batches_per_pass() : iters; }

Batch DataSource::val_batch() { return val_rows_ ? val_rows_->val_batch() : val_batcher_->val_batch(); }
int64_t DataSource::val_position() const {
  if (val_rows_) return val_rows_->position();
  return val_batcher_ ? val_batcher_->position() : 0;
}
void DataSource::set_val_position(int64_t p) {
  if (val_rows_) val_rows_->set_position(p);
  if (val_batcher_) val_batcher_->set_position(p);
}

Batch make_batch(const DataConfig& d, const DataContext& cx) {
  return d.kind == DataKind::random_tokens ? random_tokens_batch(d, cx) : random_classification_batch(d, cx);
}

}  // namespace loom
