// Training data sources. A batch is host memory for the model's `inputs` and `labels` values,
// examples laid out row-major, so minibatch i is a contiguous slice.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/config.h"

namespace loom {

// A label that is no training target (a context token of chat data, data/chat_data.h): the loss
// ops skip rows whose label is negative (graph/ops.def) and the loss is divided by the targets
// counted here, so such a token weighs nothing in the loss, its gradient or the metrics.
inline constexpr int32_t kIgnoreLabel = -1;

struct Batch {
  std::vector<unsigned char> inputs;  // batch_size examples, inputs_bytes_per_example each
  std::vector<int32_t> labels;        // batch_size × labels_per_example; kIgnoreLabel: no target
  // Rows of whole examples (rows_of_examples): [batch_size, T], each token's position in its
  // example (data/packing.h); empty otherwise.
  std::vector<int32_t> positions;
  int64_t batch_size = 0;
  // Training targets (labels >= 0) in examples [first, first + n).
  int64_t targets(int64_t first, int64_t n) const;
};

// What training batches hold: tokens (for a language model the positions holding a token, padding
// left out; for classification, examples) and the training targets among them (labels >= 0).
struct TokenCounts {
  int64_t tokens = 0, targets = 0;
  TokenCounts& operator+=(const TokenCounts& o) {
    tokens += o.tokens;
    targets += o.targets;
    return *this;
  }
};

// A zeroed batch of B token rows of T: int32 inputs and labels, and positions when `positions`.
Batch token_batch(int64_t B, int64_t T, bool positions);

// The tutorial's classification batch: inputs ~ N(0, 1) [batch, num_inputs] f32 and labels
// uniform in [0, num_classes), drawn from the seed. The same batch every step, as in the tutorial.
Batch random_classification_batch(const DataConfig& d, const DataContext& cx);

// The tutorial's language-model batch: tokens [batch, seq_len] uniform in [1, vocab_size) from
// the seed; inputs are the tokens shifted right with a 0 in front, labels are the tokens.
Batch random_tokens_batch(const DataConfig& d, const DataContext& cx);

// The configured data source's batch for the fixed-batch kinds (as in the tutorials).
Batch make_batch(const DataConfig& d, const DataContext& cx);

class TokenBatcher;
class ExampleBatcher;
struct ChatSplit;

// Whether the data's rows hold whole examples with their positions (Batch::positions): token data
// in a directory from `loom prepare chat`. Reads data.dir/meta.json when it exists (a malformed
// one is a UserError); false for the other kinds and for a directory without one.
bool rows_of_examples(const DataConfig& d);

// Where training and validation batches come from. random_classification / random_tokens: one
// fixed batch every step, no validation split. tokens: data.dir prepared by `loom prepare`;
// training batch k is a pure function of (seed, k) (random windows), so a resumed run sees the
// same batches; validation walks val.bin deterministically from a position that is checkpointed.
// A directory from `loom prepare chat` (meta.json has "chat") is read with its loss masks (a
// label whose token the mask marks 0 is kIgnoreLabel) in rows of whole examples, packed or one
// per row by data.packing (data/packing.h); an example cut to data.seq_len is reported once on
// stderr with the count. data.packing on other data is a UserError.
// data.loss_on picks the targets (data/chat_data.h: ChatSplit); a chat split without a target is a
// UserError naming its files and the fixes, as is a loss_on other than auto or all on plain token
// data.
class DataSource {
 public:
  DataSource(const DataConfig& d, const DataContext& cx);  // throws UserError for missing or invalid data
  ~DataSource();
  Batch train_batch(int64_t step) const;
  // The counts of train_batch(step) without building it: tokens and targets of its rows of
  // examples, or every label of a window or fixed batch.
  TokenCounts train_counts(int64_t step) const;
  bool has_val() const { return val_batcher_ != nullptr || val_rows_ != nullptr; }
  Batch val_batch();  // the next validation batch (data.batch_size / num_minibatches rows)
  // The validation batches of one evaluation: for rows of examples one pass over the split (each
  // row once, the last batch padded with empty rows; it starts at row 0, see ExampleBatcher),
  // whatever `iters`; for windows of plain token data `iters` (train.eval_iters) batches, going on
  // where the previous evaluation stopped.
  int64_t val_batches(int64_t iters) const;
  int64_t val_position() const;
  void set_val_position(int64_t p);
  // The tokenizer description from the data's meta.json (nullptr for the random kinds).
  const nlohmann::json* tokenizer_json() const { return tokenizer_.is_null() ? nullptr : &tokenizer_; }

 private:
  Batch fixed_;
  std::unique_ptr<ChatSplit> train_split_, val_split_;  // tokens, and masks for chat data
  std::unique_ptr<TokenBatcher> train_batcher_, val_batcher_;
  std::unique_ptr<ExampleBatcher> train_rows_, val_rows_;  // chat data instead of the batchers
  nlohmann::json tokenizer_;
};

}  // namespace loom
