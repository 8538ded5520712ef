#include "data/tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
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
  const nlohmann::json& kind = field("kind");
  if (!kind.is_string()) throw bad("kind", "is not a string");
  std::unique_ptr<Tokenizer> tok;
  if (kind == "char") {
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
  } else if (kind == "gpt2") {
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
  } else if (kind == "hf") {
    const nlohmann::json& t = field("tokenizer");
    if (!t.is_object()) throw bad("tokenizer", "is not an object");
    std::string subject = source;
    subject += " (tokenizer)";
    tok = std::make_unique<HfTokenizer>(t, subject);
  } else {
    std::string what = "is '";
    what += kind.get<std::string>();
    what += "'; loom knows 'char', 'gpt2' and 'hf'";
    throw bad("kind", what);
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
  return {{"kind", "char"}, {"vocab_size", vocab_size()}, {"chars", chars}};
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

std::string in_quotes(std::string_view s) {
  std::string q = "'";
  q += s;
  q += "'";
  return q;
}

}  // namespace

BpeTokenizer::BpeTokenizer(Spec spec, const std::string& subject, const std::string& fix)
    : tokens_(std::move(spec.tokens)), ignore_merges_(spec.ignore_merges), nfc_(spec.nfc), start_id_(spec.start_id) {
  if (tokens_.empty()) throw UserError(subject, "has an empty vocabulary", fix);
  if (tokens_.size() > static_cast<size_t>(INT32_MAX)) throw UserError(subject, "has more than 2^31 - 1 tokens", fix);
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
  std::vector<bool> special(tokens_.size(), false);
  specials_by_byte_.resize(256);
  for (const int32_t id : spec.specials) {
    LOOM_ASSERT(id >= 0 && static_cast<size_t>(id) < tokens_.size(), "BpeTokenizer: special id out of range");
    if (tokens_[static_cast<size_t>(id)].empty()) throw UserError(subject, "has an empty special token", fix);
    special[static_cast<size_t>(id)] = true;
    specials_by_byte_[static_cast<unsigned char>(tokens_[static_cast<size_t>(id)][0])].push_back(id);
  }
  for (std::vector<int32_t>& ids : specials_by_byte_)
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t x, int32_t y) {
      return tokens_[static_cast<size_t>(x)].size() > tokens_[static_cast<size_t>(y)].size();
    });

  // Byte symbols: every byte must have its one-symbol token, and every token's symbols must be
  // byte symbols, so that encode never fails and decode knows each token's bytes.
  std::unordered_map<char32_t, uint8_t> byte_of;
  for (int b = 0; b < 256; ++b) {
    const char32_t u = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    byte_of.emplace(u, static_cast<uint8_t>(b));
    std::string sym;
    utf8_append(sym, u);
    auto it = index_.find(sym);
    if (it == index_.end()) {
      std::string msg = "has no token for byte 0x";
      msg += hex(static_cast<uint32_t>(b), 2);
      msg += " (symbol ";
      msg += in_quotes(sym);
      msg += "); a byte-level BPE vocabulary needs all 256 byte symbols";
      throw UserError(subject, msg, fix);
    }
    byte_id_[b] = it->second;
  }
  decoded_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    std::string& bytes = decoded_[id];
    if (special[id]) {  // its text, not byte symbols
      bytes = t;
      continue;
    }
    bool ok = !t.empty();
    for (size_t i = 0; ok && i < t.size();) {
      char32_t c;
      const int len = utf8_decode(t, i, c);
      auto it = len > 0 ? byte_of.find(c) : byte_of.end();
      if (it == byte_of.end()) {
        ok = false;
      } else {
        bytes += static_cast<char>(it->second);
        i += static_cast<size_t>(len);
      }
    }
    if (!ok) {
      std::string msg = "token ";
      msg += std::to_string(id);
      msg += " (";
      msg += in_quotes(t);
      msg += ") is not a string of GPT-2 byte symbols";
      throw UserError(subject, msg, fix);
    }
  }
  if (ignore_merges_) {
    whole_.reserve(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); ++id)
      if (!special[id]) whole_.emplace(decoded_[id], static_cast<int32_t>(id));
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
    // A repeated pair takes its last rank, as dict(zip(merges, range(len(merges)))) does.
    merge_[key] = static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(iab->second);
  }
  patterns_.reserve(spec.patterns.size());
  for (const std::string& p : spec.patterns) patterns_.emplace_back(p, subject);
}

int32_t BpeTokenizer::find(std::string_view token) const {
  auto it = index_.find(token);
  return it == index_.end() ? -1 : it->second;
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
    if (tokens[id] == kEndOfText) s.specials.push_back(s.start_id = static_cast<int32_t>(id));
  s.tokens = std::move(tokens);
  s.patterns.emplace_back(kGpt2Pattern);
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

void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto it = whole_.find(piece); it != whole_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> w;
  w.reserve(piece.size());
  for (const char ch : piece) w.push_back(byte_id_[static_cast<unsigned char>(ch)]);
  while (w.size() > 1) {
    // The adjacent pair of lowest rank; entries are (rank << 32 | merged id), so the smallest
    // entry is the lowest rank.
    uint64_t best = UINT64_MAX;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = merge_.find(static_cast<uint64_t>(w[i]) << 32 | static_cast<uint32_t>(w[i + 1]));
      if (it != merge_.end() && it->second < best) best = it->second, best_i = i;
    }
    if (best == UINT64_MAX) break;
    const auto merged = static_cast<int32_t>(best & 0xFFFFFFFFu);
    const int32_t a = w[best_i], b = w[best_i + 1];
    // Merge every occurrence, left to right, without overlap (encoder.py's inner loop).
    size_t o = 0;
    for (size_t i = 0; i < w.size();) {
      if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
        w[o++] = merged;
        i += 2;
      } else {
        w[o++] = w[i++];
      }
    }
    w.resize(o);
  }
  out.insert(out.end(), w.begin(), w.end());
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& ids,
                                   std::unordered_map<std::string_view, std::vector<int32_t>>& cache) const {
  std::vector<std::string_view> pieces{text}, next;
  for (const PretokenRegex& p : patterns_) {
    next.clear();
    for (const std::string_view piece : pieces) p.split(piece, next);
    pieces.swap(next);
  }
  for (const std::string_view piece : pieces) {
    // Words repeat a lot in real text; encoder.py caches them the same way.
    auto it = cache.find(piece);
    if (it == cache.end()) {
      std::vector<int32_t> p;
      bpe(piece, p);
      it = cache.emplace(piece, std::move(p)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
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
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  size_t start = 0;  // of the text not encoded yet
  for (size_t i = 0; i < text.size(); ++i) {
    // The longest special token starting here, if any (leftmost-longest).
    for (const int32_t id : specials_by_byte_[static_cast<unsigned char>(text[i])]) {
      const std::string& s = tokens_[static_cast<size_t>(id)];
      if (text.compare(i, s.size(), s) != 0) continue;
      if (start < i) encode_ordinary(text.substr(start, i - start), ids, cache);
      ids.push_back(id);
      start = i + s.size();
      i = start - 1;
      break;
    }
  }
  if (start < text.size()) encode_ordinary(text.substr(start), ids, cache);
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      std::string msg = "token id ";
      msg += std::to_string(id);
      msg += " is outside the vocabulary [0, ";
      msg += std::to_string(vocab_size());
      msg += ")";
      throw UserError(kind() + " tokenizer", msg, "decode ids made with this tokenizer's data");
    }
    out += decoded_[static_cast<size_t>(id)];
  }
  return out;
}

nlohmann::json Gpt2Tokenizer::to_json() const {
  return {{"kind", "gpt2"}, {"vocab_size", vocab_size()}, {"tokens", tokens()}, {"merges", merges_}};
}

// ---- GPT-2 pre-tokenization -----------------------------------------------------------------

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  static const PretokenRegex pattern(kGpt2Pattern, "GPT-2's pattern");
  std::vector<std::string_view> pieces;
  pattern.split(text, pieces);
  return pieces;
}

}  // namespace loom
