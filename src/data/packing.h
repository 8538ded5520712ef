// Rows of whole examples for chat data (data/chat_data.h): the layout of `data.packing`.
//
// An example of n tokens [s, s + n) of a split gives n − 1 (input, label) positions: inputs
// tokens[s, s + n − 1), labels tokens[s + 1, s + n) (kIgnoreLabel where the loss mask is 0). A row
// has T = data.seq_len positions:
//   packing    examples in file order fill each row greedily: an example goes into the current
//              row when its positions fit, else it starts the next row (TRL's packing keeps whole
//              examples too, but may reorder them: best-fit decreasing).
//   no packing one example per row (TRL's default).
// An example with more than T positions is cut to its first T (TRL truncates at max_length);
// one of fewer than 2 tokens has no positions and is left out. The rest of a row is padding:
// input 0, label kIgnoreLabel, position 0 (each padding token an example of one, which attends
// to itself only: it costs no attention and no loss). A token's position is its index in its
// example, so position embeddings restart and attention stays within the example
// (nn::ModelInput::packed).
#pragma once
#include <cstdint>
#include <vector>

#include "data/data.h"
#include "data/token_data.h"

namespace loom {

struct ExampleRows {
  struct Piece {
    int64_t first = 0;      // the example's first token in the split
    int64_t positions = 0;  // its positions in the row (tokens − 1, at most T)
  };
  int64_t seq_len = 0;
  std::vector<int64_t> row_first;  // [rows + 1]: row r holds pieces [row_first[r], row_first[r + 1])
  std::vector<Piece> pieces;       // in row order
  int64_t truncated = 0;           // examples cut to seq_len positions
  int64_t used = 0;                // positions holding a token (the rest is padding)

  int64_t rows() const { return static_cast<int64_t>(row_first.size()) - 1; }
  // The share of positions that are not padding (packing efficiency); 0 without rows.
  double efficiency() const;
};

// The rows of the examples `docs` (chat data's S_docs.bin offsets: example k is tokens
// [docs[k], docs[k + 1])) for rows of seq_len positions (> 0), packed or one example per row.
ExampleRows pack_examples(const std::vector<int64_t>& docs, int64_t seq_len, bool packing);

// Batches of ExampleRows over one split: inputs, labels and positions int32 [batch_size, T].
// train: batch `step`'s rows are HostRng(named_key(seed, "data/train")).split(step).next_below(rows),
//   drawn batch_size times in order: a pure function of (seed, step), as TokenBatcher's windows.
// val: passes over the rows in order: a batch holds the next batch_size rows from position(),
//   the slots past the last row empty (padding: no token, no target), and after the batch that
//   holds the last row position() is 0 again, so each pass of batches_per_pass() batches from row
//   0 holds every row exactly once (an evaluation of chat data is one such pass).
// The tokens and the mask (nullptr: every label a target) must outlive the batcher.
class ExampleBatcher {
 public:
  // A split without rows is a UserError naming the token file.
  ExampleBatcher(ExampleRows rows, const TokenFile& tokens, const uint8_t* mask, int64_t batch_size, uint64_t seed);
  Batch train_batch(uint64_t step) const;
  // train_batch(step)'s non-padding tokens and targets, from counts kept per row.
  TokenCounts train_counts(uint64_t step) const;
  // The whole split's rows: their tokens (positions holding one) and targets.
  TokenCounts counts() const { return total_; }
  Batch val_batch();
  int64_t batches_per_pass() const { return (rows_.rows() + batch_size_ - 1) / batch_size_; }
  int64_t position() const { return position_; }
  // p must be a row, 0 <= p < rows; otherwise a UserError (the data or data.seq_len changed). A
  // row that starts no batch of a pass (a checkpoint of an older loom, whose evaluations stopped
  // mid-pass) starts the next pass at row 0 instead.
  void set_position(int64_t p);
  const ExampleRows& rows() const { return rows_; }

 private:
  void fill_row(Batch& b, int64_t slot, int64_t row) const;
  // The rows of train batch `step`, a pure function of (seed, step).
  std::vector<int64_t> train_rows(uint64_t step) const;

  ExampleRows rows_;
  std::vector<TokenCounts> row_counts_;  // [rows]
  TokenCounts total_;
  const TokenFile* tokens_;
  const uint8_t* mask_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t position_ = 0;
};

}  // namespace loom
