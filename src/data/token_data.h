// Real-text token data in nanoGPT's layout: a data directory holds
//   train.bin, val.bin  the token ids as raw little-endian uint16 (uint32 when the vocabulary has
//                       more than 65536 tokens), nothing else (np.memmap-able)
//   meta.json           {"format": "uint16" | "uint32", "vocab_size", "train_tokens", "val_tokens",
//                        "source": the text's absolute path, "tokenizer": Tokenizer::to_json()}
// `prepare_dataset` (the `loom prepare` command) makes it from a text file; `TokenFile` maps a
// .bin read-only and checks it; `TokenBatcher` cuts it into (inputs, labels) batches.
//
//   prepare_dataset(TokenizerKind::char_, "data/tinyshakespeare.txt", "data/shakespeare_char");
//   TokenMeta meta = read_token_meta("data/shakespeare_char");
//   TokenFile train = TokenFile::open_split("data/shakespeare_char", "train");
//   TokenBatcher batches(train, /*batch_size=*/64, /*seq_len=*/256, BatchMode::train, seed);
//   Batch b = batches.train_batch(step);  // a pure function of (seed, step): resume is exact
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "data/data.h"
#include "data/tokenizer.h"

namespace loom {

inline constexpr int64_t kMaxUint16Vocab = 65536;  // ids a uint16 token file holds (0 .. 65535)

// What prepare_dataset wrote.
struct PreparedDataset {
  TokenizerKind kind = TokenizerKind::char_;
  std::string format;      // "uint16" | "uint32"
  int64_t characters = 0;  // code points of the input text
  int64_t vocab_size = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::string train_path, val_path, meta_path;
};

// Tokenizes the UTF-8 text file `input_path` and writes out_dir/{train.bin, val.bin, meta.json}
// (out_dir is created if needed). As nanoGPT's shakespeare prepare.py files do, the *text* is
// split: with n code points, the first int(n * (1 - val_fraction)) characters are the training
// text and the rest the validation text, each encoded on its own (for "char" that is the same as
// splitting the tokens; tiny Shakespeare gives 1,003,854 train and 111,540 val tokens).
//   kind "char": the vocabulary is fitted to the whole text (CharTokenizer::fit);
//   kind "gpt2": GPT-2's BPE from vocab/{encoder.json, vocab.bpe};
//   kind "hf": the BPE of the tokenizer.json `vocab` (or vocab/tokenizer.json), with
//     `tokenizers`' ids (data/hf_tokenizer.h).
// Token files are uint16 for vocabularies of at most 65536 tokens, uint32 above.
// Each file is written to "<name>.tmp", fsync'ed and renamed, and an old meta.json is removed
// first and written last, so an interrupted run never leaves a meta.json that describes other
// .bin files. UserErrors: val_fraction not in (0, 1), a missing, unreadable, empty
// or non-UTF-8 input, a text too short to give both splits a token, no `vocab` for "gpt2" or
// "hf", a text the tokenizer refuses (not in NFC for an NFC tokenizer), and files that cannot be
// written.
PreparedDataset prepare_dataset(TokenizerKind kind, const std::string& input_path, const std::string& out_dir,
                                double val_fraction = 0.1, const std::string& vocab = {});

// meta.json of a data directory, checked: format "uint16" (1 <= vocab_size <= 65536) or "uint32"
// (vocab_size < 2^31), token counts >= 0, a "tokenizer" object. Problems are UserErrors naming the
// file and the key.
struct TokenMeta {
  int token_bytes = 2;  // 2: uint16, 4: uint32
  int64_t vocab_size = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::string source;
  bool chat = false;         // a "chat" entry: loss masks beside the tokens (data/chat_data.h)
  nlohmann::json tokenizer;  // Tokenizer::from_json rebuilds it
  std::string path;          // of meta.json, for messages
};
TokenMeta read_token_meta(const std::string& data_dir);

// A .bin token file of `token_bytes`-byte tokens (2 or 4), memory-mapped read-only for its
// lifetime. Opening checks it once: it exists, is not empty, has a whole number of tokens, has
// `expected_tokens` tokens when that is >= 0, and every token is < vocab_size; each failure is a
// UserError naming the file (and for a bad token, its index, byte offset and id). Move-only.
class TokenFile {
 public:
  TokenFile(const std::string& path, int64_t vocab_size, int64_t expected_tokens = -1, int token_bytes = 2);
  // data_dir/<split>.bin checked against data_dir/meta.json (vocab size and token count).
  static TokenFile open_split(const std::string& data_dir, const std::string& split);
  ~TokenFile();
  TokenFile(TokenFile&& o) noexcept;
  TokenFile& operator=(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return static_cast<int64_t>(bytes_) / width_; }  // tokens
  // Token i (0 <= i < size()), decoded little-endian whatever the host's byte order.
  int32_t operator[](int64_t i) const {
    const unsigned char* p = data_ + width_ * i;
    if (width_ == 2) return static_cast<int32_t>(p[0] | (p[1] << 8));
    return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                                static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
  }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& path() const { return path_; }

 private:
  void unmap();

  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
  int64_t vocab_size_ = 0;
  int width_ = 2;  // bytes per token
};

enum class BatchMode { train, val };

// Batches of windows of seq_len + 1 consecutive tokens: inputs = window[0:T] and labels =
// window[1:T+1], both int32 [batch_size, seq_len] row-major (Batch::inputs holds the int32s as
// bytes), as nanoGPT's get_batch. With a loss mask (one byte per token of the file, chat data's
// S_mask.bin) a label is kIgnoreLabel where the mask of the token it names (the predicted one,
// window[t+1]) is 0. The file and the mask must outlive the batcher.
//
// train: the batch of optimizer step `step` has window starts
//     HostRng(named_key(seed, "data/train")).split(step).next_below(n - T), drawn batch_size
//   times in row order (n = tokens in the file; starts uniform in [0, n - T - 1] as
//   torch.randint(len(data) - block_size) gives). It depends on nothing but (seed, step), so a
//   resumed run sees exactly the batches it would have seen.
// val: walks the file in order. Each window starts seq_len after the previous one, so the labels
//   of one pass (val_windows_per_pass() windows) are tokens 1 .. W * seq_len, each once; a
//   window that would run past the end wraps to position 0. position() is where the next window starts; save it with a
//   checkpoint and give it back with set_position().
class TokenBatcher {
 public:
  // A file with fewer than seq_len + 1 tokens is a UserError naming it. batch_size and seq_len
  // must be positive (LOOM_ASSERT).
  TokenBatcher(const TokenFile& file, int64_t batch_size, int64_t seq_len, BatchMode mode, uint64_t seed = 0,
               const uint8_t* mask = nullptr);

  // train mode only (LOOM_ASSERT).
  Batch train_batch(uint64_t step) const;
  // val mode only (LOOM_ASSERT): the next batch_size windows; advances position().
  Batch val_batch();
  // train_batch(step) or val_batch(), by mode.
  Batch next(uint64_t step) { return mode_ == BatchMode::train ? train_batch(step) : val_batch(); }

  int64_t position() const { return position_; }
  // p must be a window start that fits, 0 <= p <= size - seq_len - 1; otherwise a UserError (a
  // checkpoint's position that does not fit this file means the data changed).
  void set_position(int64_t p);
  void reset() { position_ = 0; }
  // Windows in one pass over the file: floor((n - 1) / seq_len).
  int64_t val_windows_per_pass() const { return (file_->size() - 1) / seq_len_; }

  int64_t batch_size() const { return batch_size_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  void fill_row(Batch& b, int64_t row, int64_t start) const;

  const TokenFile* file_;
  const uint8_t* mask_;  // [file size] or nullptr: every label is a target
  int64_t batch_size_, seq_len_;
  BatchMode mode_;
  uint64_t seed_;
  int64_t position_ = 0;
};

}  // namespace loom
