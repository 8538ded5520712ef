#include "data/packing.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace loom {

double ExampleRows::efficiency() const {
  const int64_t all = rows() * seq_len;
  return all > 0 ? static_cast<double>(used) / static_cast<double>(all) : 0.0;
}

ExampleRows pack_examples(const std::vector<int64_t>& docs, int64_t seq_len, bool packing) {
  LOOM_ASSERT(seq_len > 0, "pack_examples: seq_len must be positive");
  ExampleRows r;
  r.seq_len = seq_len;
  r.row_first.push_back(0);
  int64_t fill = 0;  // positions taken in the open row
  for (size_t k = 0; k + 1 < docs.size(); ++k) {
    const int64_t n = docs[k + 1] - docs[k] - 1;
    if (n < 1) continue;
    if (n > seq_len) ++r.truncated;
    const int64_t len = std::min(n, seq_len);
    if (fill > 0 && (!packing || fill + len > seq_len)) {
      r.row_first.push_back(static_cast<int64_t>(r.pieces.size()));
      fill = 0;
    }
    r.pieces.push_back({docs[k], len});
    fill += len;
    r.used += len;
  }
  if (fill > 0) r.row_first.push_back(static_cast<int64_t>(r.pieces.size()));
  return r;
}

ExampleBatcher::ExampleBatcher(ExampleRows rows, const TokenFile& tokens, const uint8_t* mask, int64_t batch_size,
                               uint64_t seed)
    : rows_(std::move(rows)), tokens_(&tokens), mask_(mask), batch_size_(batch_size), seed_(seed) {
  LOOM_ASSERT(batch_size > 0, "ExampleBatcher: batch_size must be positive");
  if (rows_.rows() == 0)
    throw UserError(tokens.path(), "has no example of two tokens or more: there is nothing to train on",
                    "prepare the data again with longer examples");
  row_counts_.resize(static_cast<size_t>(rows_.rows()));
  for (int64_t r = 0; r < rows_.rows(); ++r) {
    TokenCounts& c = row_counts_[static_cast<size_t>(r)];
    for (int64_t p = rows_.row_first[static_cast<size_t>(r)]; p < rows_.row_first[static_cast<size_t>(r) + 1]; ++p) {
      const ExampleRows::Piece& e = rows_.pieces[static_cast<size_t>(p)];
      c.tokens += e.positions;
      // The labels are tokens first + 1 .. first + positions (fill_row).
      c.targets += mask_ ? std::count(mask_ + e.first + 1, mask_ + e.first + 1 + e.positions, uint8_t{1}) : e.positions;
    }
    total_ += c;
  }
}

void ExampleBatcher::fill_row(Batch& b, int64_t slot, int64_t row) const {
  const int64_t T = rows_.seq_len;
  auto* inputs = reinterpret_cast<int32_t*>(b.inputs.data()) + slot * T;
  int32_t* labels = b.labels.data() + slot * T;
  int32_t* positions = b.positions.data() + slot * T;
  const TokenFile& f = *tokens_;
  int64_t t = 0;
  for (int64_t p = rows_.row_first[static_cast<size_t>(row)]; p < rows_.row_first[static_cast<size_t>(row) + 1]; ++p) {
    const ExampleRows::Piece& e = rows_.pieces[static_cast<size_t>(p)];
    for (int64_t i = 0; i < e.positions; ++i, ++t) {
      const int64_t at = e.first + i;
      inputs[t] = f[at];
      labels[t] = !mask_ || mask_[at + 1] ? f[at + 1] : kIgnoreLabel;
      positions[t] = static_cast<int32_t>(i);
    }
  }
  for (; t < T; ++t) {
    inputs[t] = 0;
    labels[t] = kIgnoreLabel;
    positions[t] = 0;
  }
}

std::vector<int64_t> ExampleBatcher::train_rows(uint64_t step) const {
  HostRng rng = HostRng(named_key(seed_, "data/train")).split(step);
  std::vector<int64_t> rows(static_cast<size_t>(batch_size_));
  for (int64_t& r : rows) r = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(rows_.rows())));
  return rows;
}

Batch ExampleBatcher::train_batch(uint64_t step) const {
  Batch b = token_batch(batch_size_, rows_.seq_len, true);
  const std::vector<int64_t> rows = train_rows(step);
  for (int64_t s = 0; s < batch_size_; ++s) fill_row(b, s, rows[static_cast<size_t>(s)]);
  return b;
}

TokenCounts ExampleBatcher::train_counts(uint64_t step) const {
  TokenCounts c;
  for (int64_t r : train_rows(step)) c += row_counts_[static_cast<size_t>(r)];
  return c;
}

Batch ExampleBatcher::val_batch() {
  Batch b = token_batch(batch_size_, rows_.seq_len, true);
  for (int64_t s = 0; s < batch_size_; ++s) {
    if (position_ + s < rows_.rows()) {
      fill_row(b, s, position_ + s);
    } else {  // past the last row: an empty row, all padding
      std::fill_n(b.labels.begin() + s * rows_.seq_len, rows_.seq_len, kIgnoreLabel);
    }
  }
  position_ = position_ + batch_size_ < rows_.rows() ? position_ + batch_size_ : 0;
  return b;
}

void ExampleBatcher::set_position(int64_t p) {
  if (p < 0 || p >= rows_.rows())
    throw UserError(tokens_->path(),
                    "position " + std::to_string(p) + " is not a row of its examples (0.." +
                        std::to_string(rows_.rows() - 1) + " for seq_len " + std::to_string(rows_.seq_len) + ")",
                    "resume with the data, data.seq_len and data.packing the checkpoint was made with");
  position_ = p % batch_size_ == 0 ? p : 0;
}

}  // namespace loom
