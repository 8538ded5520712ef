// Tokenizers for real-text training: a character-level vocabulary fitted to the text
// (shakespeare_char's prepare.py), GPT-2's byte-level BPE loaded from the standard
// `encoder.json` + `vocab.bpe`, and the byte-level BPE of a Hugging Face tokenizer.json
// (data/hf_tokenizer.h). A tokenizer serialises itself to JSON (`to_json`), which
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
#include <utility>
#include <vector>

#include "data/regex.h"
#include "data/unicode.h"

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
  // "char", "gpt2" or "hf": the "kind" field of to_json().
  virtual std::string kind() const = 0;
  // The token a generation with an empty prompt starts from (GPT-2's "<|endoftext|>", a
  // tokenizer.json's beginning-of-text token), or -1 when the vocabulary has none.
  virtual int32_t start_id() const { return -1; }
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

// Byte-level BPE: GPT-2's (openai/gpt-2 src/encoder.py) and that of tokenizer.json files whose
// model is "BPE" under a ByteLevel pre-tokenizer (data/hf_tokenizer.h). encode():
//  1. special tokens (the added tokens of a tokenizer.json; "<|endoftext|>" for GPT-2's files)
//     are matched literally, leftmost first and the longest where several start at one place
//     (`tokenizers`' added vocabulary; tiktoken's allowed_special="all"), each encoded as its
//     one id; the text between them is encoded on its own;
//  2. the pre-tokenizer splits each such stretch: each pattern of Spec::patterns in turn splits
//     every piece the previous one made (PretokenRegex::split); GPT-2's one pattern is
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  3. each piece's UTF-8 bytes become byte symbols through bytes_to_unicode; with
//     ignore_merges a piece that is a whole token is that token (Llama 3);
//  4. the BPE loop merges the adjacent pair of lowest merge rank, all its non-overlapping
//     occurrences left to right, until no adjacent pair has a rank (the same result as
//     `tokenizers`' priority queue: a merged token's pairs always rank later);
//  5. the resulting symbols are looked up in the vocabulary.
//
// decode returns the raw bytes (GPT-2 decodes them with errors="replace"; loom does not, so
// decode(encode(s)) == s for any byte string, and ids that cut a character in two give bytes
// that are not valid UTF-8); a special token decodes to its text.
class BpeTokenizer : public Tokenizer {
 public:
  struct Spec {
    std::vector<std::string> tokens;                          // id -> token string
    std::vector<std::pair<std::string, std::string>> merges;  // in rank order
    std::vector<int32_t> specials;                            // ids matched literally in the text
    std::vector<std::string> patterns;                        // the pre-tokenizer's splits, in order
    bool ignore_merges = false;
    bool nfc = false;  // the text must be in NFC (a tokenizer.json normalizer loom only checks)
    int32_t start_id = -1;
  };
  // Checks: tokens are unique, every byte symbol is a token, every token that is not special is
  // made of byte symbols, each merge has two parts that are tokens and whose concatenation is a
  // token, every pattern compiles. Violations are UserErrors naming `subject` (and the merge) with
  // `fix` as the hint.
  BpeTokenizer(Spec spec, const std::string& subject, const std::string& fix);

  // A text that must be in NFC and is not (or may not be: nfc_quick_check says maybe) is a
  // UserError naming the character.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t start_id() const override { return start_id_; }

  // The id of token string `token`, or -1.
  int32_t find(std::string_view token) const;
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  void encode_ordinary(std::string_view text, std::vector<int32_t>& ids,
                       std::unordered_map<std::string_view, std::vector<int32_t>>& cache) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;                      // id -> token string (byte symbols, UTF-8; specials as given)
  std::vector<std::string> decoded_;                     // id -> the raw bytes it stands for
  std::unordered_map<std::string_view, int32_t> index_;  // token string -> id (views of tokens_)
  std::unordered_map<std::string_view, int32_t> whole_;  // ignore_merges: raw bytes -> id
  int32_t byte_id_[256];                                 // byte -> id of its one-symbol token
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<uint64_t, uint64_t> merge_;
  std::vector<PretokenRegex> patterns_;
  std::vector<std::vector<int32_t>> specials_by_byte_;  // first byte -> special ids, longest first
  bool ignore_merges_ = false, nfc_ = false;
  int32_t start_id_ = -1;
};

// GPT-2's files: encoder.json and vocab.bpe, GPT-2's pattern, "<|endoftext|>" special.
class Gpt2Tokenizer final : public BpeTokenizer {
 public:
  // `tokens[id]` is the token string (byte symbols, or a special such as "<|endoftext|>");
  // `merges` are the "a b" lines of vocab.bpe in rank order. `subject` names the source in
  // errors; BpeTokenizer's checks apply, and a merge that is not two symbols separated by one
  // space is a UserError naming it.
  Gpt2Tokenizer(std::vector<std::string> tokens, const std::vector<std::string>& merges, const std::string& subject);
  // Loads the standard files: `encoder_json` maps token string -> id (ids must be exactly
  // 0..N-1), `vocab_bpe` has a "#version" first line and then one "a b" merge per line. A
  // missing, unreadable or malformed file is a UserError naming it.
  static std::unique_ptr<Gpt2Tokenizer> load(const std::string& encoder_json, const std::string& vocab_bpe);
  // load(dir/encoder.json, dir/vocab.bpe).
  static std::unique_ptr<Gpt2Tokenizer> load_dir(const std::string& dir);

  std::string kind() const override { return "gpt2"; }
  // {"kind": "gpt2", "vocab_size": V, "tokens": [token string by id], "merges": ["a b", ...]}
  nlohmann::json to_json() const override;

  // The id of "<|endoftext|>", or -1 when the vocabulary has none.
  int32_t eot_id() const { return start_id(); }

 private:
  std::vector<std::string> merges_;  // rank -> "a b" (kept for to_json)
};

// GPT-2's pre-tokenization of UTF-8 `text` into pieces that concatenate back to `text` (step 2
// above with GPT-2's pattern). Bytes that are not valid UTF-8 count as one "other" character
// each (neither letter, number nor space), so any byte string splits and round-trips.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);
// GPT-2's pattern (also what a tokenizer.json's ByteLevel pre-tokenizer with use_regex splits by).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode(): the code point standing for byte b in token strings. Printable
// bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the other 68 map to
// U+0100.. in byte order (so ' ' is U+0120 'Ġ' and '\n' is U+010A 'Ċ').
char32_t gpt2_byte_to_unicode(uint8_t b);

}  // namespace loom
