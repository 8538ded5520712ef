#include "data/tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/unicode.h"

namespace loom {
namespace {

std::string hex(uint32_t v, int digits) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string s(static_cast<size_t>(digits), '0');
  for (int k = digits - 1; k >= 0; --k, v >>= 4) s[static_cast<size_t>(k)] = kDigits[v & 15];
  return s;
}

// "'a' (U+0061)", "'\n' (U+000A)", "'é' (U+00E9)": readable and unambiguous in a message.
std::string describe_char(char32_t c) {
  std::string s = "'";
  if (c == '\n')
    s += "\\n";
  else if (c == '\t')
    s += "\\t";
  else if (c == '\r')
    s += "\\r";
  else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0))
    s += "?";
  else
    utf8_append(s, c);
  s += "' (U+";
  s += hex(static_cast<uint32_t>(c), c > 0xFFFF ? 6 : 4);
  s += ")";
  return s;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    const int e = errno;
    std::string msg = "cannot be opened (";
    msg += std::strerror(e);
    msg += ")";
    throw UserError(path, msg, "check the path");
  }
  std::string s{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (f.bad()) throw UserError(path, "could not be read to the end", "check the file and the disk");
  return s;
}

}  // namespace

// ---- Tokenizer ------------------------------------------------------------------------------

bool same_tokens(const nlohmann::json& a, const nlohmann::json& b) {
  auto tokens_only = [](nlohmann::json j) {
    if (j.is_object()) j.erase("companions");
    return j;
  };
  return tokens_only(a) == tokens_only(b);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const nlohmann::json& j, const std::string& source) {
  const std::string fix = "prepare the data again with `loom prepare`";
  if (!j.is_object()) throw UserError(source, "\"tokenizer\" is not a JSON object", fix);
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = j.find(key);
    if (it == j.end()) {
      std::string msg = "\"tokenizer\" has no \"";
      msg += key;
      msg += "\" field";
      throw UserError(source, msg, fix);
    }
    return *it;
  };
  auto bad = [&](const char* key, const std::string& what) -> UserError {
    std::string msg = "\"tokenizer.";
    msg += key;
    msg += "\" ";
    msg += what;
    return UserError(source, msg, fix);
  };
  const nlohmann::json& kind_json = field("kind");
  if (!kind_json.is_string()) throw bad("kind", "is not a string");
  const std::optional<TokenizerKind> kind = parse_choice<TokenizerKind>(kind_json.get<std::string>());
  if (!kind)
    throw bad("kind", "is '" + kind_json.get<std::string>() + "'; loom knows " + choice_names<TokenizerKind>());
  std::unique_ptr<Tokenizer> tok;
  if (*kind == TokenizerKind::char_) {
    const nlohmann::json& chars = field("chars");
    if (!chars.is_string()) throw bad("chars", "is not a string");
    const std::string& s = chars.get_ref<const std::string&>();
    std::vector<char32_t> cps;
    for (size_t i = 0; i < s.size();) {
      char32_t c;
      const int len = utf8_decode(s, i, c);
      if (len == 0) throw bad("chars", "is not valid UTF-8");
      if (!cps.empty() && c <= cps.back()) throw bad("chars", "is not sorted by code point without repeats");
      cps.push_back(c);
      i += static_cast<size_t>(len);
    }
    if (cps.empty()) throw bad("chars", "is empty");
    tok = std::make_unique<CharTokenizer>(std::move(cps));
  } else if (*kind == TokenizerKind::gpt2) {
    const nlohmann::json& tokens = field("tokens");
    const nlohmann::json& merges = field("merges");
    if (!tokens.is_array()) throw bad("tokens", "is not an array");
    if (!merges.is_array()) throw bad("merges", "is not an array");
    std::vector<std::string> t, m;
    t.reserve(tokens.size());
    m.reserve(merges.size());
    for (const auto& x : tokens) {
      if (!x.is_string()) throw bad("tokens", "has an element that is not a string");
      t.push_back(x.get<std::string>());
    }
    for (const auto& x : merges) {
      if (!x.is_string()) throw bad("merges", "has an element that is not a string");
      m.push_back(x.get<std::string>());
    }
    std::string subject = source;
    subject += " (tokenizer)";
    tok = std::make_unique<Gpt2Tokenizer>(std::move(t), m, subject);
  } else {
    const nlohmann::json& t = field("tokenizer");
    if (!t.is_object()) throw bad("tokenizer", "is not an object");
    nlohmann::json companions = nlohmann::json::object();
    if (auto it = j.find("companions"); it != j.end()) {
      if (!it->is_object()) throw bad("companions", "is not an object");
      for (const auto& [name, file] : it->items()) {
        if (!std::ranges::any_of(HfTokenizer::kCompanionFiles, [&](const char* n) { return name == n; }) ||
            !file.is_string())
          throw bad("companions", "holds \"" + name + "\", which is not the text of a companion file");
      }
      companions = *it;
    }
    std::string subject = source;
    subject += " (tokenizer)";
    tok = std::make_unique<HfTokenizer>(t, subject, std::move(companions));
  }
  if (auto it = j.find("vocab_size"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() != tok->vocab_size()) {
      std::string what = "does not match the vocabulary it describes (";
      what += std::to_string(tok->vocab_size());
      what += " tokens)";
      throw bad("vocab_size", what);
    }
  }
  return tok;
}

// ---- CharTokenizer --------------------------------------------------------------------------

CharTokenizer::CharTokenizer(std::vector<char32_t> chars) : chars_(std::move(chars)) {
  std::fill(std::begin(ascii_), std::end(ascii_), -1);
  for (size_t i = 0; i < chars_.size(); ++i) {
    LOOM_ASSERT(i == 0 || chars_[i - 1] < chars_[i], "CharTokenizer: characters must be sorted and unique");
    const char32_t c = chars_[i];
    if (c < 128)
      ascii_[c] = static_cast<int32_t>(i);
    else
      stoi_.emplace(c, static_cast<int32_t>(i));
  }
}

CharTokenizer CharTokenizer::fit(std::string_view text, const std::string& subject) {
  if (text.empty())
    throw UserError(subject, "is empty: there are no characters to build a vocabulary from",
                    "give a non-empty text file");
  // A presence bit per code point: iterating it yields the characters already sorted, as
  // sorted(set(text)) does in prepare.py.
  std::vector<bool> seen(0x110000, false);
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    const int len = utf8_decode(text, i, c);
    if (len == 0) throw_invalid_utf8(text, i, subject);
    seen[c] = true;
    i += static_cast<size_t>(len);
  }
  std::vector<char32_t> chars;
  for (char32_t c = 0; c < 0x110000; ++c)
    if (seen[c]) chars.push_back(c);
  return CharTokenizer(std::move(chars));
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    const int len = utf8_decode(text, i, c);
    if (len == 0) throw_invalid_utf8(text, i, "char tokenizer input");
    int32_t id = -1;
    if (c < 128) {
      id = ascii_[c];
    } else if (auto it = stoi_.find(c); it != stoi_.end()) {
      id = it->second;
    }
    if (id < 0) {
      std::string msg = "character ";
      msg += describe_char(c);
      msg += " at character ";
      msg += std::to_string(ids.size());
      msg += " is not in the vocabulary of ";
      msg += std::to_string(chars_.size());
      msg += " characters";
      throw UserError("char tokenizer", msg,
                      "a char vocabulary has only the characters of the text it was prepared from; "
                      "use those, or prepare the data again from a text that has this character");
    }
    ids.push_back(id);
    i += static_cast<size_t>(len);
  }
  return ids;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      std::string msg = "token id ";
      msg += std::to_string(id);
      msg += " is outside the vocabulary [0, ";
      msg += std::to_string(vocab_size());
      msg += ")";
      throw UserError("char tokenizer", msg, "decode ids made with this tokenizer's data");
    }
    utf8_append(out, chars_[static_cast<size_t>(id)]);
  }
  return out;
}

nlohmann::json CharTokenizer::to_json() const {
  std::string chars;
  for (const char32_t c : chars_) utf8_append(chars, c);
  return {{"kind", choice_name(kind())}, {"vocab_size", vocab_size()}, {"chars", chars}};
}

// ---- Gpt2Tokenizer --------------------------------------------------------------------------

char32_t gpt2_byte_to_unicode(uint8_t b) {
  // bytes_to_unicode(): printable bytes keep their code point; the rest take 256, 257, ... in
  // byte order.
  auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF); };
  if (printable(b)) return b;
  char32_t n = 0;
  for (int x = 0; x < b; ++x)
    if (!printable(x)) ++n;
  return 256 + n;
}

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// The byte GPT-2 symbol `c` stands for (the inverse of gpt2_byte_to_unicode), or -1.
int symbol_byte(char32_t c) {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[gpt2_byte_to_unicode(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

bool utf8_valid(std::string_view s) {
  char32_t c;
  for (size_t i = 0; i < s.size();) {
    const int len = utf8_decode(s, i, c);
    if (len == 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string in_quotes(std::string_view s) {
  std::string q = "'";
  q += s;
  q += "'";
  return q;
}

}  // namespace

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Each `what` in `s` by `by`, left to right without overlap (Rust's str::replace).
std::string replace_all(std::string_view s, std::string_view what, std::string_view by) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0;;) {
    const size_t j = s.find(what, i);
    if (j == std::string_view::npos) {
      out.append(s.substr(i));
      return out;
    }
    out.append(s.substr(i, j - i));
    out.append(by);
    i = j + what.size();
  }
}

// The byte a ByteFallback token "<0xXX>" stands for, as tokenizers' decoder reads it (six bytes,
// u8::from_str_radix of the two in the middle, which also takes a '+' sign), or -1.
int fallback_byte(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  auto digit = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  const int hi = digit(t[3]), lo = digit(t[4]);
  if (lo < 0) return -1;
  if (t[3] == '+') return lo;
  return hi < 0 ? -1 : hi * 16 + lo;
}

// The length of the white space (Unicode White_Space) that `s` ends / starts with.
size_t trailing_space(std::string_view s) {
  size_t n = s.size();
  while (n > 0) {
    size_t i = n - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    char32_t c;
    if (utf8_decode(s, i, c) == 0 || classify(c) != kSpace) break;
    n = i;
  }
  return s.size() - n;
}
size_t leading_space(std::string_view s) {
  size_t i = 0;
  char32_t c;
  for (int len; i < s.size() && (len = utf8_decode(s, i, c)) > 0 && classify(c) == kSpace;)
    i += static_cast<size_t>(len);
  return i;
}

// A stretch of text between added tokens, or an added token (id >= 0).
struct Segment {
  size_t begin = 0, end = 0;
  int32_t id = -1;
};

// tokenizers' AddedVocabulary::find_matches: the added tokens of `set` (a BpeTokenizer::AddedSet)
// in `s`, leftmost first and the longest at one place, widened by lstrip / rstrip, with the
// stretches between them.
template <class AddedSet>
std::vector<Segment> find_added(std::string_view s, const AddedSet& set) {
  std::vector<Segment> out;
  size_t done = 0;  // end of the last segment
  for (size_t i = 0; i < s.size();) {
    const decltype(set.tokens.data()) best = [&] {
      for (const uint32_t k : set.by_first_byte[static_cast<unsigned char>(s[i])])  // longest first
        if (s.compare(i, set.tokens[k].content.size(), set.tokens[k].content) == 0) return &set.tokens[k];
      return decltype(set.tokens.data()){nullptr};
    }();
    if (best == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + best->content.size();
    if (best->token.lstrip) begin = std::max(begin - trailing_space(s.substr(0, begin)), done);
    if (best->token.rstrip) end += leading_space(s.substr(end));
    if (done < begin) out.push_back({done, begin});
    out.push_back({begin, end, best->token.id});
    done = end;
    i += best->content.size();  // the search goes on after the match itself, as the library's trie does
  }
  if (done < s.size()) out.push_back({done, s.size()});
  return out;
}

// Pieces of `p` split at the (begin, end) `matches` of a pattern with `behavior`
// (NormalizedString::split); empty pieces are dropped.
void split_at(const std::string& p, bool at_start, const std::vector<std::pair<size_t, size_t>>& matches,
              BpeTokenizer::SplitBehavior behavior, std::vector<std::pair<std::string, bool>>& out) {
  using B = BpeTokenizer::SplitBehavior;
  struct Span {
    size_t b, e;
    bool match;
  };
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev < b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (prev < p.size()) spans.push_back({prev, p.size(), false});
  std::vector<Span> kept;
  if (behavior == B::merged_with_next) {
    // A match joins the piece after it unless that piece is itself a match.
    for (size_t k = spans.size(); k-- > 0;) {
      const bool next_is_match = k + 1 < spans.size() && spans[k + 1].match;
      if (spans[k].match && !next_is_match && !kept.empty())
        kept.back().b = spans[k].b;
      else
        kept.push_back({spans[k].b, spans[k].e, false});
    }
    std::reverse(kept.begin(), kept.end());
  } else {
    for (size_t k = 0; k < spans.size(); ++k) {
      const bool prev_is_match = k > 0 && spans[k - 1].match;
      if (behavior == B::merged_with_previous && spans[k].match && !prev_is_match && !kept.empty())
        kept.back().e = spans[k].e;
      else if (!(behavior == B::removed && spans[k].match))
        kept.push_back({spans[k].b, spans[k].e, false});
    }
  }
  for (const Span& s : kept)
    if (s.b < s.e) out.emplace_back(p.substr(s.b, s.e - s.b), at_start && s.b == 0);
}

}  // namespace

BpeTokenizer::BpeTokenizer(Spec spec, const std::string& subject, const std::string& fix)
    : tokens_(std::move(spec.tokens)),
      in_model_(std::move(spec.in_model)),
      normalizers_(std::move(spec.normalizers)),
      pre_(std::move(spec.pre_tokenizers)),
      decoders_(std::move(spec.decoders)),
      has_decoder_(spec.has_decoder),
      byte_fallback_(spec.byte_fallback),
      fuse_unk_(spec.fuse_unk),
      ignore_merges_(spec.ignore_merges),
      nfc_(spec.nfc),
      unk_id_(spec.unk_id),
      start_id_(spec.start_id) {
  if (tokens_.empty()) throw UserError(subject, "has an empty vocabulary", fix);
  if (tokens_.size() > static_cast<size_t>(INT32_MAX)) throw UserError(subject, "has more than 2^31 - 1 tokens", fix);
  if (in_model_.empty()) in_model_.assign(tokens_.size(), true);
  LOOM_ASSERT(in_model_.size() == tokens_.size(), "BpeTokenizer: in_model must have one entry per token");
  index_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!index_.emplace(tokens_[id], static_cast<int32_t>(id)).second) {
      std::string msg = "token ";
      msg += in_quotes(tokens_[id]);
      msg += " appears twice (ids ";
      msg += std::to_string(index_[tokens_[id]]);
      msg += " and ";
      msg += std::to_string(id);
      msg += ")";
      throw UserError(subject, msg, fix);
    }
  }
  // Added tokens: an empty one is never matched (AddedVocabulary::add_tokens skips it); a
  // normalized one is matched by its normalized content.
  for (const AddedToken& a : spec.added) {
    LOOM_ASSERT(a.id >= 0 && static_cast<size_t>(a.id) < tokens_.size(), "BpeTokenizer: added id out of range");
    const std::string& content = tokens_[static_cast<size_t>(a.id)];
    if (content.empty()) continue;
    if (!a.normalized) {
      raw_added_.tokens.push_back({content, a});
      continue;
    }
    std::string n = normalize(content);
    if (n != content) decoded_as_.emplace(a.id, n);
    normalized_added_.tokens.push_back({std::move(n), a});
  }

  raw_added_.index();
  normalized_added_.index();
  for (const PreTokenizer& p : pre_) {
    if (p.kind == PreTokenizer::regex) patterns_.emplace_back(p.pattern, subject);
    if (p.kind == PreTokenizer::byte_level) byte_level_ = true;
  }
  for (const Decoder& d : decoders_) decodes_bytes_ |= d.kind == Decoder::byte_fallback;
  if (byte_level_) {
    // Every byte must have its one-symbol token, so that a byte-level encode never drops text.
    for (int b = 0; b < 256; ++b) {
      std::string sym;
      utf8_append(sym, gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
      if (find(sym) < 0 || !in_model_[static_cast<size_t>(find(sym))]) {
        std::string msg = "has no token for byte 0x";
        msg += hex(static_cast<uint32_t>(b), 2);
        msg += " (symbol ";
        msg += in_quotes(sym);
        msg += "); a byte-level BPE vocabulary needs all 256 byte symbols";
        throw UserError(subject, msg, fix);
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t id = byte_fallback_ ? find("<0x" + hex(static_cast<uint32_t>(b), 2) + ">") : -1;
    byte_token_[b] = id >= 0 && in_model_[static_cast<size_t>(id)] ? id : -1;
  }

  merge_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [a, b] = spec.merges[rank];
    const std::string ab = a + b;
    auto ia = index_.find(a), ib = index_.find(b), iab = index_.find(ab);
    for (auto [it, s] : {std::pair{ia, std::string_view(a)}, std::pair{ib, std::string_view(b)},
                         std::pair{iab, std::string_view(ab)}}) {
      if (it == index_.end()) {
        std::string msg = "merge ";
        msg += in_quotes(a + " " + b);
        msg += " (rank ";
        msg += std::to_string(rank);
        msg += "): ";
        msg += in_quotes(s);
        msg += " is not a token of the vocabulary";
        throw UserError(subject, msg, fix);
      }
    }
    const uint64_t key = static_cast<uint64_t>(ia->second) << 32 | static_cast<uint32_t>(ib->second);
    // A repeated pair takes its last rank, as collecting the merges into a map does.
    merge_[key] = static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(iab->second);
  }
}

void BpeTokenizer::AddedSet::index() {
  by_first_byte.assign(256, {});
  for (uint32_t k = 0; k < tokens.size(); ++k)
    by_first_byte[static_cast<unsigned char>(tokens[k].content[0])].push_back(k);
  for (std::vector<uint32_t>& list : by_first_byte)
    std::stable_sort(list.begin(), list.end(),
                     [&](uint32_t x, uint32_t y) { return tokens[x].content.size() > tokens[y].content.size(); });
}

int32_t BpeTokenizer::find(std::string_view token) const {
  auto it = index_.find(token);
  return it == index_.end() ? -1 : it->second;
}

bool BpeTokenizer::decodes_with_next(int32_t id) const {
  return decodes_bytes_ && id >= 0 && id < vocab_size() && fallback_byte(tokens_[static_cast<size_t>(id)]) >= 0;
}

namespace {
// The "a b" lines of vocab.bpe as pairs; a line that is not two symbols separated by one space is
// a UserError naming it.
std::vector<std::pair<std::string, std::string>> split_merges(const std::vector<std::string>& lines,
                                                              const std::string& subject, const std::string& fix) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(lines.size());
  for (size_t rank = 0; rank < lines.size(); ++rank) {
    const std::string& line = lines[rank];
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos) {
      std::string msg = "merge ";
      msg += in_quotes(line);
      msg += " (rank ";
      msg += std::to_string(rank);
      msg += ") is not two symbols separated by one space";
      throw UserError(subject, msg, fix);
    }
    out.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return out;
}

const char* kGpt2Fix = "use GPT-2's encoder.json and vocab.bpe (openai/gpt-2, models/124M), unmodified";

BpeTokenizer::Spec gpt2_spec(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                             const std::string& subject) {
  BpeTokenizer::Spec s;
  s.merges = split_merges(merges, subject, kGpt2Fix);
  for (size_t id = 0; id < tokens.size(); ++id)
    if (tokens[id] == kEndOfText) s.added.push_back({.id = s.start_id = static_cast<int32_t>(id)});
  s.tokens = std::move(tokens);
  s.pre_tokenizers = {{.kind = BpeTokenizer::PreTokenizer::regex, .pattern = std::string(kGpt2Pattern)},
                      {.kind = BpeTokenizer::PreTokenizer::byte_level}};
  s.decoders = {{.kind = BpeTokenizer::Decoder::byte_level}};
  return s;
}
}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                             const std::string& subject)
    : BpeTokenizer(gpt2_spec(std::move(tokens), merges, subject), subject, kGpt2Fix), merges_(merges) {}

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& encoder_json, const std::string& vocab_bpe) {
  const std::string fix = kGpt2Fix;
  nlohmann::json enc;
  {
    const std::string text = read_text_file(encoder_json);
    try {
      enc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      std::string msg = "is not valid JSON (";
      msg += e.what();
      msg += ")";
      throw UserError(encoder_json, msg, fix);
    }
  }
  if (!enc.is_object() || enc.empty())
    throw UserError(encoder_json, "is not a JSON object mapping token strings to ids", fix);
  const size_t n = enc.size();
  std::vector<std::string> tokens(n);
  std::vector<bool> have(n, false);
  for (const auto& [tok, id] : enc.items()) {
    if (!id.is_number_integer()) {
      std::string msg = "the id of token ";
      msg += in_quotes(tok);
      msg += " is not an integer";
      throw UserError(encoder_json, msg, fix);
    }
    const int64_t v = id.get<int64_t>();
    if (v < 0 || static_cast<uint64_t>(v) >= n || have[static_cast<size_t>(v)]) {
      std::string msg = "token ";
      msg += in_quotes(tok);
      msg += " has id ";
      msg += std::to_string(v);
      msg += "; the ids of its ";
      msg += std::to_string(n);
      msg += " tokens must be 0..";
      msg += std::to_string(n - 1);
      msg += ", each once";
      throw UserError(encoder_json, msg, fix);
    }
    have[static_cast<size_t>(v)] = true;
    tokens[static_cast<size_t>(v)] = tok;
  }

  std::vector<std::string> merges;
  {
    const std::string text = read_text_file(vocab_bpe);
    std::istringstream in(text);
    std::string line;
    for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line_no == 1 && line.starts_with("#")) continue;  // "#version: 0.2"
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos) {
        std::string msg = "line ";
        msg += std::to_string(line_no);
        msg += " (";
        msg += in_quotes(line);
        msg += ") is not a merge: two symbols separated by one space";
        throw UserError(vocab_bpe, msg, fix);
      }
      merges.push_back(std::move(line));
    }
  }
  std::string subject = encoder_json;
  subject += " + ";
  subject += vocab_bpe;
  return std::make_unique<Gpt2Tokenizer>(std::move(tokens), merges, subject);
}

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::load_dir(const std::string& dir) {
  std::string enc = dir, bpe = dir;
  if (!dir.empty() && dir.back() != '/') {
    enc += '/';
    bpe += '/';
  }
  enc += "encoder.json";
  bpe += "vocab.bpe";
  return load(enc, bpe);
}

std::string BpeTokenizer::normalize(std::string_view s) const {
  std::string out(s);
  for (const Normalizer& n : normalizers_) {
    if (n.kind == Normalizer::prepend && !out.empty()) out.insert(0, n.text);
    if (n.kind == Normalizer::replace) out = replace_all(out, n.text, n.by);
  }
  return out;
}

void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto it = index_.find(piece); it != index_.end() && in_model_[static_cast<size_t>(it->second)]) {
      out.push_back(it->second);
      return;
    }
  }
  // The word's symbols (BPE::merge_word): each character's token, else its byte tokens, else
  // the unknown token (fused with the unknown characters right after it when fuse_unk), else
  // nothing. A pending unknown token goes in when the next known character does, after byte
  // tokens that came between, as the library's loop does.
  struct Symbol {
    int32_t id;
    int64_t prev, next;  // neighbours in the word, -1 at the ends
    bool gone = false;   // merged into the symbol before it
  };
  std::vector<Symbol> w;
  w.reserve(piece.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int64_t>(w.size());
    w.push_back({id, n - 1, -1});
    if (n > 0) w[static_cast<size_t>(n - 1)].next = n;
  };
  bool unk_pending = false;
  for (size_t i = 0; i < piece.size();) {
    char32_t c;
    int len = utf8_decode(piece, i, c);
    if (len == 0) len = 1;  // only byte-level pieces hold such bytes, and their symbols are valid
    const std::string_view ch = piece.substr(i, static_cast<size_t>(len));
    i += static_cast<size_t>(len);
    if (auto it = index_.find(ch); it != index_.end() && in_model_[static_cast<size_t>(it->second)]) {
      if (unk_pending) add(unk_id_), unk_pending = false;
      add(it->second);
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(ch.begin(), ch.end(), [&](char b) { return byte_token_[static_cast<unsigned char>(b)] >= 0; })) {
      for (const char b : ch) add(byte_token_[static_cast<unsigned char>(b)]);
      continue;
    }
    if (unk_id_ < 0) continue;
    if (unk_pending && !fuse_unk_) add(unk_id_);
    unk_pending = true;
  }
  if (unk_pending) add(unk_id_);

  // Word::merge_all: the pair of lowest rank first, the leftmost among equal ranks.
  using Entry = std::pair<uint64_t, int64_t>;  // (rank << 32 | merged id, position of the left symbol)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  auto consider = [&](int64_t pos) {
    if (pos < 0) return;
    const Symbol& l = w[static_cast<size_t>(pos)];
    if (l.next < 0) return;
    auto it = merge_.find(static_cast<uint64_t>(l.id) << 32 | static_cast<uint32_t>(w[static_cast<size_t>(l.next)].id));
    if (it != merge_.end()) queue.emplace(it->second, pos);
  };
  for (int64_t p = 0; p + 1 < static_cast<int64_t>(w.size()); ++p) consider(p);
  while (!queue.empty()) {
    const auto [entry, pos] = queue.top();
    queue.pop();
    Symbol& l = w[static_cast<size_t>(pos)];
    if (l.gone || l.next < 0) continue;
    Symbol& r = w[static_cast<size_t>(l.next)];
    auto it = merge_.find(static_cast<uint64_t>(l.id) << 32 | static_cast<uint32_t>(r.id));
    if (it == merge_.end() || it->second != entry) continue;  // the pair there has changed since
    l.id = static_cast<int32_t>(entry & 0xFFFFFFFFu);
    r.gone = true;
    l.next = r.next;
    if (l.next >= 0) w[static_cast<size_t>(l.next)].prev = pos;
    consider(l.prev);
    consider(pos);
  }
  for (const Symbol& s : w)
    if (!s.gone) out.push_back(s.id);
}

void BpeTokenizer::encode_normalized(Piece piece, std::vector<int32_t>& ids, Cache& cache) const {
  std::vector<std::pair<std::string, bool>> pieces{{std::move(piece.text), piece.at_start}}, next;
  size_t regex = 0;
  for (const PreTokenizer& step : pre_) {
    next.clear();
    const PretokenRegex* pattern = step.kind == PreTokenizer::regex ? &patterns_[regex++] : nullptr;
    for (auto& [p, at_start] : pieces) {
      if (pattern != nullptr) {
        std::vector<std::string_view> views;
        pattern->split(p, views);
        for (const std::string_view v : views) next.emplace_back(std::string(v), at_start && v.data() == p.data());
      } else if (step.kind == PreTokenizer::byte_level) {
        std::string symbols;
        for (const char b : p) utf8_append(symbols, gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
        next.emplace_back(std::move(symbols), at_start);
      } else {
        std::string s = p;
        const std::string& lit = step.pattern;
        SplitBehavior behavior = step.behavior;
        if (step.kind == PreTokenizer::metaspace) {
          s = replace_all(s, " ", lit);
          const bool prepend =
              step.prepend == PrependScheme::always || (step.prepend == PrependScheme::first && at_start);
          if (prepend && !s.empty() && !s.starts_with(lit)) s.insert(0, lit);
          if (!step.split) {
            next.emplace_back(std::move(s), at_start);
            continue;
          }
          behavior = SplitBehavior::merged_with_next;
        }
        std::vector<std::pair<size_t, size_t>> matches;
        for (size_t i = s.find(lit); !lit.empty() && i != std::string::npos; i = s.find(lit, i + lit.size()))
          matches.emplace_back(i, i + lit.size());
        split_at(s, at_start, matches, behavior, next);
      }
    }
    pieces.swap(next);
  }
  for (const auto& [p, at_start] : pieces) {
    if (p.empty()) continue;
    // Words repeat a lot in real text; the library caches them the same way.
    auto it = cache.find(p);
    if (it == cache.end()) {
      std::vector<int32_t> word;
      bpe(p, word);
      it = cache.emplace(p, std::move(word)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
}

void BpeTokenizer::encode_stretch(std::string_view text, bool at_start, std::vector<int32_t>& ids, Cache& cache) const {
  const std::string normalized = normalize(text);
  for (const Segment& s : find_added(normalized, normalized_added_)) {
    if (s.id >= 0)
      ids.push_back(s.id);
    else
      encode_normalized({normalized.substr(s.begin, s.end - s.begin), at_start && s.begin == 0}, ids, cache);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  if (nfc_) {
    const NfcQuickCheck q = nfc_quick_check(text);
    if (q.result != NfcResult::yes) {
      char32_t c = 0;
      if (utf8_decode(text, q.offset, c) == 0) throw_invalid_utf8(text, q.offset, "text to tokenize");
      std::string msg = q.result == NfcResult::no ? "is not in Unicode NFC" : "may not be in Unicode NFC";
      msg += " (character ";
      msg += describe_char(c);
      msg += " at byte offset ";
      msg += std::to_string(q.offset);
      msg += "), and this tokenizer normalizes its input to NFC, which loom only checks";
      throw UserError("text to tokenize", msg,
                      "normalize the text to NFC first, e.g. python3 -c \"import sys, unicodedata; "
                      "sys.stdout.write(unicodedata.normalize('NFC', sys.stdin.read()))\" < IN > OUT");
    }
  }
  if (!byte_level_) utf8_length(text, "text to tokenize");  // the library takes only text
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  Cache cache;
  for (const Segment& s : find_added(text, raw_added_)) {
    if (s.id >= 0)
      ids.push_back(s.id);
    else
      encode_stretch(text.substr(s.begin, s.end - s.begin), s.begin == 0, ids, cache);
  }
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> t;
  t.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      std::string msg = "token id ";
      msg += std::to_string(id);
      msg += " is outside the vocabulary [0, ";
      msg += std::to_string(vocab_size());
      msg += ")";
      throw UserError(std::string(choice_name(kind())) + " tokenizer", msg,
                      "decode ids made with this tokenizer's data");
    }
    auto it = decoded_as_.find(id);
    t.push_back(it != decoded_as_.end() ? it->second : tokens_[static_cast<size_t>(id)]);
  }
  std::string out;
  if (!has_decoder_) {
    for (size_t k = 0; k < t.size(); ++k) (out += k > 0 ? " " : "") += t[k];
    return out;
  }
  for (const Decoder& d : decoders_) {
    std::vector<std::string> next;
    switch (d.kind) {
      case Decoder::byte_level: {  // each token's bytes, or its own UTF-8 when a character is no byte symbol
        std::string bytes;
        for (const std::string& s : t) {
          std::string b;
          bool all = true;
          for (size_t i = 0; all && i < s.size();) {
            char32_t c;
            const int len = utf8_decode(s, i, c);
            const int byte = len > 0 ? symbol_byte(c) : -1;
            all = byte >= 0;
            b += static_cast<char>(byte);
            i += static_cast<size_t>(std::max(len, 1));
          }
          bytes += all ? b : s;
        }
        next.push_back(utf8_lossy(bytes));
        break;
      }
      case Decoder::replace:
        for (const std::string& s : t) next.push_back(replace_all(s, d.text, d.by));
        break;
      case Decoder::byte_fallback: {
        std::string run;  // the bytes of the <0xXX> tokens so far
        size_t run_tokens = 0;
        auto end_run = [&] {
          if (run_tokens == 0) return;
          if (utf8_valid(run))
            next.push_back(run);
          else
            for (size_t k = 0; k < run_tokens; ++k) next.emplace_back(kReplacementChar);
          run.clear();
          run_tokens = 0;
        };
        for (const std::string& s : t) {
          if (const int b = fallback_byte(s); b >= 0) {
            run += static_cast<char>(b);
            ++run_tokens;
          } else {
            end_run();
            next.push_back(s);
          }
        }
        end_run();
        break;
      }
      case Decoder::fuse: {
        std::string all;
        for (const std::string& s : t) all += s;
        next.push_back(std::move(all));
        break;
      }
      case Decoder::strip:
        for (const std::string& s : t) {
          size_t b = 0, e = s.size();
          for (int64_t k = 0; k < d.left && s.compare(b, d.text.size(), d.text) == 0 && b < e; ++k) b += d.text.size();
          for (int64_t k = 0;
               k < d.right && e - b >= d.text.size() && s.compare(e - d.text.size(), d.text.size(), d.text) == 0; ++k)
            e -= d.text.size();
          next.push_back(s.substr(b, e - b));
        }
        break;
      case Decoder::metaspace:
        for (size_t k = 0; k < t.size(); ++k)
          next.push_back(replace_all(t[k], d.text, k == 0 && d.prepend != PrependScheme::never ? "" : " "));
        break;
    }
    t.swap(next);
  }
  for (const std::string& s : t) out += s;
  return out;
}

nlohmann::json Gpt2Tokenizer::to_json() const {
  return {{"kind", choice_name(kind())}, {"vocab_size", vocab_size()}, {"tokens", tokens()}, {"merges", merges_}};
}

// ---- DecodeStream ----------------------------------------------------------------------------

DecodeStream::DecodeStream(const Tokenizer& tok, std::span<const int32_t> context)
    : tok_(tok), ids_(context.begin(), context.end()), done_ids_(ids_.size()) {
  done_ = tok_.decode(ids_);
}

std::string DecodeStream::push(int32_t id) {
  ids_.push_back(id);
  size_t ready = ids_.size();  // the tokens whose text is final
  while (ready > done_ids_ && tok_.decodes_with_next(ids_[ready - 1])) --ready;
  if (ready == done_ids_) return {};
  const std::string text = tok_.decode(std::span(ids_).first(ready));
  if (text.size() <= done_.size() || text.ends_with("\xEF\xBF\xBD")) return {};
  // The text so far extends done_ for the supported decoders (a decoder changes a token's text
  // by the tokens before it only for the first token, which both decodes share); a context whose
  // own decoding ends in a character cut short is the one exception: then the text past done_'s
  // length goes out.
  std::string out = text.substr(done_.size());
  // Slide the window: it starts at the first token of the text just returned.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(done_ids_));
  done_ids_ = ready - done_ids_;
  done_ = tok_.decode(std::span(ids_).first(done_ids_));
  return out;
}

std::string DecodeStream::flush() {
  const std::string text = tok_.decode(ids_);
  std::string out = text.size() > done_.size() ? text.substr(done_.size()) : "";
  ids_.clear();
  done_.clear();
  done_ids_ = 0;
  return out;
}

// ---- GPT-2 pre-tokenization -----------------------------------------------------------------

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  static const PretokenRegex pattern(kGpt2Pattern, "GPT-2's pattern");
  std::vector<std::string_view> pieces;
  pattern.split(text, pieces);
  return pieces;
}

}  // namespace loom
