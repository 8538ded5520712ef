// Tokenizers for real-text training: a character-level vocabulary fitted to the text
// (shakespeare_char's prepare.py), GPT-2's byte-level BPE loaded from the standard
// `encoder.json` + `vocab.bpe`, and the BPE of a Hugging Face tokenizer.json, byte-level or
// SentencePiece-style (data/hf_tokenizer.h). A tokenizer serialises itself to JSON (`to_json`), which
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

#include "core/choice.h"
#include "data/regex.h"
#include "data/unicode.h"

namespace loom {

// The tokenizers `loom prepare` makes and meta.json names (its "kind").
#define LOOM_TOKENIZER_KINDS(X)                                                     \
  X(char_, "the sorted unique characters of the text (nanoGPT's shakespeare_char)") \
  X(gpt2, "GPT-2's byte-level BPE files (encoder.json, vocab.bpe)")                 \
  X(hf, "a Hugging Face tokenizer.json with a BPE model (byte-level or SentencePiece-style)")
LOOM_CHOICE(TokenizerKind, "tokenizer kind", LOOM_TOKENIZER_KINDS)

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of UTF-8 `text`. A text the tokenizer cannot represent (a character outside a
  // char vocabulary, invalid UTF-8 for a char vocabulary) is a UserError naming it.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`. An id outside [0, vocab_size()) is a UserError naming it.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Whether the text token `id` decodes to can still change with the tokens after it (a
  // ByteFallback <0xXX> byte, whose run decodes as a whole); DecodeStream holds such tokens back.
  virtual bool decodes_with_next(int32_t /*id*/) const { return false; }
  // Ids are exactly [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  // The "kind" field of to_json().
  virtual TokenizerKind kind() const = 0;
  // The token a generation with an empty prompt starts from (GPT-2's "<|endoftext|>", a
  // tokenizer.json's beginning-of-text token), or -1 when the vocabulary has none.
  virtual int32_t start_id() const { return -1; }
  // The special tokens the tokenizer's post-processor puts before a single text when special tokens
  // are added (the `tokenizers` library's add_special_tokens=True: Llama's and Gemma's BOS); none
  // for tokenizers without one.
  virtual std::vector<int32_t> leading_special_ids() const { return {}; }
  // Everything needed to rebuild this tokenizer: {"kind": kind(), "vocab_size": ..., ...}.
  virtual nlohmann::json to_json() const = 0;

  // Rebuilds a tokenizer from to_json()'s output. `source` names where the JSON came from (the
  // meta.json path) for errors: a missing or malformed field is a UserError naming `source` and
  // the key.
  static std::unique_ptr<Tokenizer> from_json(const nlohmann::json& j, const std::string& source);
};

// Whether two to_json() outputs give the same ids for every text: the files an hf tokenizer
// carries beside it (HfTokenizer::companions: chat template, generation defaults) do not count.
bool same_tokens(const nlohmann::json& a, const nlohmann::json& b);

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
  TokenizerKind kind() const override { return TokenizerKind::char_; }
  // {"kind": "char", "vocab_size": V, "chars": "<the V characters in id order, as one string>"}
  nlohmann::json to_json() const override;

  const std::vector<char32_t>& chars() const { return chars_; }

 private:
  std::vector<char32_t> chars_;                 // itos
  std::unordered_map<char32_t, int32_t> stoi_;  // non-ASCII characters
  int32_t ascii_[128];                          // stoi for ASCII, -1 when absent
};

// BPE as the `tokenizers` library runs it (models/bpe), with the normalizers, pre-tokenizers and
// decoders of the byte-level families (GPT-2, SmolLM, Llama 3, Qwen2) and of the SentencePiece
// families (Llama 2, TinyLlama, Mistral, Gemma). GPT-2's own files (encoder.py) are the byte-level
// case. encode() gives the ids of `tokenizers`' encode(text, add_special_tokens=False):
//  1. added tokens are cut out of the text: first those with normalized = false, matched in the
//     raw text, then those with normalized = true, matched (by their normalized content) in each
//     normalized stretch; leftmost first, the longest where several start at one place; lstrip /
//     rstrip widen a match over the white space before / after it;
//  2. each stretch between added tokens is normalized on its own (Prepend, Replace; NFC is only
//     checked, see Spec::nfc);
//  3. the pre-tokenizer steps split it in turn (a regex's matches isolated, a literal's with its
//     behaviour, Metaspace's ' ' -> '▁' with its prepend scheme, ByteLevel's bytes -> symbols);
//  4. each piece is one token if ignore_merges and it is a token; otherwise its characters are
//     looked up (a character that is no token becomes its <0xXX> byte tokens with byte_fallback,
//     else the unknown token, consecutive ones fused with fuse_unk, else it is dropped), and
//     merges apply by rank, the lowest first and the leftmost among equals (Word::merge_all).
// decode() gives `tokenizers`' decode(ids, skip_special_tokens=False): the token strings through
// the decoder steps, concatenated (with no decoder: joined by ' '). ByteLevel decodes to bytes
// and then to text as Rust's String::from_utf8_lossy does (utf8_lossy), so ids that cut a
// character give U+FFFD; ByteFallback turns a run of <0xXX> tokens into its text, or one U+FFFD
// per byte when the run is not valid UTF-8.
class BpeTokenizer : public Tokenizer {
 public:
  // How a pre-tokenizer's matches become pieces (tokenizers' SplitDelimiterBehavior).
  enum class SplitBehavior : uint8_t { isolated, removed, merged_with_previous, merged_with_next };
  // Metaspace's prepend_scheme: where '▁' goes in front of a piece that does not start with one.
  enum class PrependScheme : uint8_t { always, first, never };
  struct Normalizer {
    enum Kind : uint8_t { prepend, replace } kind;
    std::string text{}, by{};  // prepend: `text` to a non-empty stretch; replace: each `text` by `by`
  };
  struct PreTokenizer {
    enum Kind : uint8_t { regex, literal, metaspace, byte_level } kind;
    std::string pattern{};  // regex: isolated matches; literal: the string; metaspace: the replacement
    SplitBehavior behavior = SplitBehavior::isolated;  // literal
    PrependScheme prepend = PrependScheme::always;     // metaspace
    bool split = true;                                 // metaspace: split before each replacement
  };
  struct Decoder {
    enum Kind : uint8_t { byte_level, replace, byte_fallback, fuse, strip, metaspace } kind;
    std::string text{}, by{};     // replace: each `text` by `by`; strip, metaspace: `text` is the character
    int64_t left = 0, right = 0;  // strip: at most this many at each end
    PrependScheme prepend = PrependScheme::always;  // metaspace: drops the replacement in token 0 unless never
  };
  struct AddedToken {
    int32_t id = 0;
    bool lstrip = false, rstrip = false;
    bool normalized = false;  // matched in the normalized text, by its normalized content
  };
  struct Spec {
    std::vector<std::string> tokens;                          // id -> token string
    std::vector<bool> in_model;                               // id -> in the BPE model's vocab (empty: all)
    std::vector<std::pair<std::string, std::string>> merges;  // in rank order
    std::vector<AddedToken> added;                            // matched in the text
    std::vector<Normalizer> normalizers;
    std::vector<PreTokenizer> pre_tokenizers;  // byte_level, if any, last
    std::vector<Decoder> decoders;
    bool has_decoder = true;  // false: decode joins the token strings with ' '
    bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
    bool nfc = false;  // the text must be in NFC (a tokenizer.json normalizer loom only checks)
    int32_t unk_id = -1, start_id = -1;
  };
  // Checks: tokens are unique, each merge has two parts that are tokens and whose concatenation
  // is a token, every pattern compiles, and a byte-level pipeline has a token for each of the 256
  // byte symbols. Violations are UserErrors naming `subject` (and the merge) with `fix` as the hint.
  BpeTokenizer(Spec spec, const std::string& subject, const std::string& fix);

  // A text that must be in NFC and is not (or may not be: nfc_quick_check says maybe) is a
  // UserError naming the character, as is text that is not UTF-8 for a pipeline that is not
  // byte-level (a byte-level one takes any bytes).
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  bool decodes_with_next(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t start_id() const override { return start_id_; }

  // The id of token string `token`, or -1.
  int32_t find(std::string_view token) const;
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  struct Piece {
    std::string text;
    bool at_start = false;  // begins at offset 0 of the original text (Metaspace "first")
  };
  struct Added {  // an added token as matched: its content (normalized for `normalized` ones)
    std::string content;
    AddedToken token;
  };
  struct AddedSet {
    std::vector<Added> tokens;
    std::vector<std::vector<uint32_t>> by_first_byte;  // indices into tokens, longest first
    void index();
  };
  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;
  void encode_stretch(std::string_view text, bool at_start, std::vector<int32_t>& ids, Cache& cache) const;
  void encode_normalized(Piece piece, std::vector<int32_t>& ids, Cache& cache) const;
  std::string normalize(std::string_view s) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;                      // id -> token string
  std::unordered_map<std::string_view, int32_t> index_;  // token string -> id (views of tokens_)
  std::vector<bool> in_model_;
  std::unordered_map<uint64_t, uint64_t> merge_;  // (left id << 32 | right id) -> (rank << 32 | merged id)
  AddedSet raw_added_, normalized_added_;
  // A normalized added token decodes as its normalized content (AddedVocabulary::simple_id_to_token).
  std::unordered_map<int32_t, std::string> decoded_as_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_;
  std::vector<PretokenRegex> patterns_;  // of the regex steps, in order
  std::vector<Decoder> decoders_;
  int32_t byte_token_[256];  // byte_fallback: id of "<0xXX>", -1 when absent
  bool has_decoder_ = true, byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false, nfc_ = false;
  bool byte_level_ = false, decodes_bytes_ = false;
  int32_t unk_id_ = -1, start_id_ = -1;
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

  TokenizerKind kind() const override { return TokenizerKind::gpt2; }
  // {"kind": "gpt2", "vocab_size": V, "tokens": [token string by id], "merges": ["a b", ...]}
  nlohmann::json to_json() const override;

  // The id of "<|endoftext|>", or -1 when the vocabulary has none.
  int32_t eot_id() const { return start_id(); }

 private:
  std::vector<std::string> merges_;  // rank -> "a b" (kept for to_json)
};

// Prints generated text as it comes, as `tokenizers`' DecodeStream does: push(id) returns the
// text that decoding the tokens so far adds to the text of those before, once it is final, that
// is when it does not end in U+FFFD (a character whose bytes have not all come) and leaves out
// trailing tokens that decode with the next ones (Tokenizer::decodes_with_next). flush() returns
// the rest, as decode() of everything gives it. So the pieces concatenate to the decode() of all
// the tokens after the context, minus the decode() of the context, and each is whole characters.
// Only a suffix of the tokens is decoded each time: a window that starts a little before the
// text not yet returned, so that what a decoder does to the first token (Strip, Metaspace) is
// the same in both decodes it compares.
class DecodeStream {
 public:
  // `context`: the tokens already printed as text (the prompt).
  DecodeStream(const Tokenizer& tok, std::span<const int32_t> context);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;  // the window
  std::string done_;          // decode() of ids_[:done_ids_]: returned, or the context's
  size_t done_ids_ = 0;
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
