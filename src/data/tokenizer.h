// Tokenizers for real-text training (nanoGPT's two): a character-level vocabulary fitted to the
// text (shakespeare_char's prepare.py) and GPT-2's byte-level BPE loaded from the standard
// `encoder.json` + `vocab.bpe`. A tokenizer serialises itself to JSON (`to_json`), which
// `loom prepare` stores in the data's meta.json, so a training run or `loom sample` rebuilds the
// exact tokenizer with `Tokenizer::from_json` without the original text or vocabulary files.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of UTF-8 `text`. A text the tokenizer cannot represent (a character outside a
  // char vocabulary, invalid UTF-8 for a char vocabulary) is a UserError naming it.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`. An id outside [0, vocab_size()) is a UserError naming it.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids are exactly [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  // "char" or "gpt2": the "kind" field of to_json().
  virtual std::string kind() const = 0;
  // Everything needed to rebuild this tokenizer: {"kind": kind(), "vocab_size": ..., ...}.
  virtual nlohmann::json to_json() const = 0;

  // Rebuilds a tokenizer from to_json()'s output. `source` names where the JSON came from (the
  // meta.json path) for errors: a missing or malformed field is a UserError naming `source` and
  // the key.
  static std::unique_ptr<Tokenizer> from_json(const nlohmann::json& j, const std::string& source);
};

// nanoGPT's shakespeare_char vocabulary: the sorted unique characters of the text, id = rank
// (stoi/itos). Characters are Unicode code points of UTF-8 text, sorted by code point (what
// Python's sorted(set(str)) does), so non-ASCII text works. One difference from prepare.py:
// Python's text mode turns "\r\n" into "\n" while reading; loom keeps '\r' as a character, so
// decode(encode(s)) == s byte for byte (tiny Shakespeare has no '\r').
class CharTokenizer final : public Tokenizer {
 public:
  // `chars` must be strictly increasing code points (LOOM_ASSERT).
  explicit CharTokenizer(std::vector<char32_t> chars);
  // The vocabulary of `text` (UTF-8; invalid UTF-8 or an empty text is a UserError naming
  // `subject`, e.g. the input file).
  static CharTokenizer fit(std::string_view text, const std::string& subject);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(chars_.size()); }
  std::string kind() const override { return "char"; }
  // {"kind": "char", "vocab_size": V, "chars": "<the V characters in id order, as one string>"}
  nlohmann::json to_json() const override;

  const std::vector<char32_t>& chars() const { return chars_; }

 private:
  std::vector<char32_t> chars_;                 // itos
  std::unordered_map<char32_t, int32_t> stoi_;  // non-ASCII characters
  int32_t ascii_[128];                          // stoi for ASCII, -1 when absent
};

// GPT-2's byte-level BPE (openai/gpt-2 src/encoder.py), bit-compatible with its encode():
//  1. the text is split into pieces by the pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     (gpt2_pretokenize below, written by hand: std::regex has no \p{..});
//  2. each piece's UTF-8 bytes become byte symbols through bytes_to_unicode;
//  3. the BPE loop merges the adjacent pair of lowest merge rank (line order of vocab.bpe), all
//     its non-overlapping occurrences left to right, until no adjacent pair has a rank;
//  4. the resulting symbols are looked up in encoder.json.
// Special tokens: "<|endoftext|>", when encoder.json has it, is matched literally in the text
// and encoded as its one id (tiktoken's allowed_special="all"); the text between specials is
// pre-tokenized separately, as tiktoken does. GPT-2's encoder.py itself has no specials.
//
// decode returns the raw bytes (GPT-2 decodes them with errors="replace"; loom does not, so
// decode(encode(s)) == s for any byte string, and ids that cut a character in two give bytes
// that are not valid UTF-8).
class Gpt2Tokenizer final : public Tokenizer {
 public:
  // `tokens[id]` is the token string (byte symbols, or a special such as "<|endoftext|>");
  // `merges` are the "a b" lines of vocab.bpe in rank order. `subject` names the source in
  // errors. Checks: tokens are unique, every byte symbol is a token, every other token is made
  // of byte symbols, each merge has two parts that are tokens and whose concatenation is a
  // token. Violations are UserErrors naming `subject` (and the line for merges).
  Gpt2Tokenizer(std::vector<std::string> tokens, const std::vector<std::string>& merges, const std::string& subject);
  // Loads the standard files: `encoder_json` maps token string -> id (ids must be exactly
  // 0..N-1), `vocab_bpe` has a "#version" first line and then one "a b" merge per line. A
  // missing, unreadable or malformed file is a UserError naming it.
  static std::unique_ptr<Gpt2Tokenizer> load(const std::string& encoder_json, const std::string& vocab_bpe);
  // load(dir/encoder.json, dir/vocab.bpe).
  static std::unique_ptr<Gpt2Tokenizer> load_dir(const std::string& dir);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  std::string kind() const override { return "gpt2"; }
  // {"kind": "gpt2", "vocab_size": V, "tokens": [token string by id], "merges": ["a b", ...]}
  nlohmann::json to_json() const override;

  // The id of "<|endoftext|>", or -1 when the vocabulary has none.
  int32_t eot_id() const { return eot_id_; }

 private:
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;   // id -> token string (byte symbols, UTF-8)
  std::vector<std::string> merges_;   // rank -> "a b" (kept for to_json)
  std::vector<std::string> decoded_;  // id -> the raw bytes it stands for
  int32_t byte_id_[256];              // byte -> id of its one-symbol token
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<uint64_t, uint64_t> merge_;
  int32_t eot_id_ = -1;
};

// GPT-2's pre-tokenization of UTF-8 `text` into pieces that concatenate back to `text`
// (step 1 above). Character classes, matching the Python `regex` module that encoder.py uses:
//   \s     Unicode White_Space: U+0009-000D, 0020, 0085, 00A0, 1680, 2000-200A, 2028, 2029,
//          202F, 205F, 3000;
//   \p{L}  general category L* and \p{N} category N*: exact range tables generated from the
//          `regex` module 2026.5.9 (Unicode 17), so no approximation for assigned code points.
// Bytes that are not valid UTF-8 count as one "other" character each (neither letter, number
// nor space), so any byte string splits and round-trips.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// GPT-2's bytes_to_unicode(): the code point standing for byte b in token strings. Printable
// bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the other 68 map to
// U+0100.. in byte order (so ' ' is U+0120 'Ġ' and '\n' is U+010A 'Ċ').
char32_t gpt2_byte_to_unicode(uint8_t b);

// Appends the UTF-8 encoding of code point `c` to `out`.
void utf8_append(std::string& out, char32_t c);
// Number of code points of UTF-8 `text`. Invalid UTF-8 (a bad lead or continuation byte, an
// overlong form, a surrogate, a value above U+10FFFF, a truncated sequence) is a UserError
// naming `subject` and the byte offset.
int64_t utf8_length(std::string_view text, const std::string& subject);
// Byte offset where code point `k` (0 <= k <= length) starts in valid UTF-8 `text`.
size_t utf8_offset(std::string_view text, int64_t k);

}  // namespace loom
