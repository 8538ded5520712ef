#include "data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

const char* kFix =
    "use the tokenizer.json of a BPE model, byte-level (GPT-2, SmolLM, Llama 3, Qwen2) or SentencePiece-style "
    "(Llama 2, TinyLlama, Mistral, Gemma), unmodified";

using Spec = BpeTokenizer::Spec;
using PreTokenizer = BpeTokenizer::PreTokenizer;
using Decoder = BpeTokenizer::Decoder;
using PrependScheme = BpeTokenizer::PrependScheme;
using SplitBehavior = BpeTokenizer::SplitBehavior;

// The SpecialTokens a TemplateProcessing "single" template puts before its sequence (searched
// through Sequences of processors), by their names; none without such a post-processor.
std::vector<std::string> leading_special_tokens(const nlohmann::json& tokenizer_json) {
  std::vector<std::string> names;
  const auto visit = [&](const auto& self, const nlohmann::json& p) -> bool {
    if (!p.is_object()) return false;
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
      for (const nlohmann::json& x : p["processors"])
        if (self(self, x)) return true;
    } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array()) {
      for (const nlohmann::json& piece : p["single"]) {
        if (!piece.contains("SpecialToken")) break;
        const nlohmann::json& t = piece["SpecialToken"];
        if (t.contains("id") && t["id"].is_string()) names.push_back(t["id"].get<std::string>());
      }
      return true;
    }
    return false;
  };
  if (tokenizer_json.contains("post_processor")) visit(visit, tokenizer_json["post_processor"]);
  return names;
}

class SpecReader {
 public:
  SpecReader(const nlohmann::json& j, const std::string& subject) : j_(j), subject_(subject) {}

  Spec read() {
    if (!j_.is_object()) fail("the file", "is not a JSON object");
    read_model();
    read_added_tokens();
    read_normalizer(field(j_, "normalizer", "normalizer"), "normalizer");
    read_pre_tokenizer(field(j_, "pre_tokenizer", "pre_tokenizer"), "pre_tokenizer");
    const nlohmann::json& dec = field(j_, "decoder", "decoder");
    spec_.has_decoder = !dec.is_null();
    read_decoder(dec, "decoder");
    read_start_token();
    return std::move(spec_);
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    std::string msg = where == "the file" ? "" : "\"" + where + "\" ";
    msg += what;
    throw UserError(subject_, msg, kFix);
  }
  // j[key], which must exist (null counts).
  const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) const {
    auto it = j.find(key);
    if (it == j.end()) fail(where, "is missing");
    return *it;
  }
  std::string type_of(const nlohmann::json& j, const std::string& where) const {
    if (!j.is_object()) fail(where, "is not an object");
    const nlohmann::json& t = field(j, "type", where + ".type");
    if (!t.is_string()) fail(where + ".type", "is not a string");
    return t.get<std::string>();
  }
  // j[key] when present and not null, else `dflt`; it must be of json type `want`.
  template <class T>
  T get_or(const nlohmann::json& j, const char* key, T dflt, const std::string& where) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    try {
      return it->get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(where + "." + key, "has the wrong type");
    }
  }
  // A {"String": s} pattern (the only kind loom's Replace and literal splits take); non-empty.
  std::string string_pattern(const nlohmann::json& p, const std::string& where) const {
    const nlohmann::json& pat = field(p, "pattern", where + ".pattern");
    if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string())
      fail(where + ".pattern", "is not {\"String\": ...}, the form loom supports here");
    std::string s = pat["String"].get<std::string>();
    if (s.empty()) fail(where + ".pattern", "is the empty string");
    return s;
  }
  // One character (Metaspace's replacement, Strip's content).
  std::string one_char(const nlohmann::json& j, const char* key, const std::string& dflt,
                       const std::string& where) const {
    std::string s = get_or(j, key, dflt, where);
    char32_t c;
    if (s.empty() || utf8_decode(s, 0, c) != static_cast<int>(s.size()))
      fail(where + "." + key, "is '" + s + "', not one character");
    return s;
  }
  PrependScheme prepend_scheme(const nlohmann::json& j, const std::string& where) const {
    // The legacy add_prefix_space = false means "never" (Metaspace's deserializer).
    if (!get_or(j, "add_prefix_space", true, where)) return PrependScheme::never;
    const std::string s = get_or(j, "prepend_scheme", std::string("always"), where);
    if (s == "always") return PrependScheme::always;
    if (s == "first") return PrependScheme::first;
    if (s == "never") return PrependScheme::never;
    fail(where + ".prepend_scheme", "is '" + s + "'; it is always, first or never");
  }

  void set_token(int64_t id, const std::string& s, const std::string& where) {
    if (id < 0 || id >= INT32_MAX) fail(where, "has id " + std::to_string(id) + ", outside [0, 2^31 - 1)");
    const auto i = static_cast<size_t>(id);
    if (i >= spec_.tokens.size()) {
      spec_.tokens.resize(i + 1);
      spec_.in_model.resize(i + 1, false);
      have_.resize(i + 1, false);
    }
    if (have_[i] && spec_.tokens[i] != s)
      fail(where, "gives id " + std::to_string(id) + " to '" + s + "' and to '" + spec_.tokens[i] + "'");
    spec_.tokens[i] = s;
    have_[i] = true;
  }

  void read_model() {
    const nlohmann::json& m = field(j_, "model", "model");
    const std::string type = type_of(m, "model");
    if (type != "BPE") fail("model.type", "is " + type + "; loom reads BPE models (\"BPE\")");
    if (get_or(m, "dropout", 0.0, "model") != 0.0) fail("model.dropout", "is set: BPE dropout is not supported");
    if (!get_or(m, "continuing_subword_prefix", std::string(), "model").empty() ||
        !get_or(m, "end_of_word_suffix", std::string(), "model").empty())
      fail("model", "has a continuing_subword_prefix or end_of_word_suffix, which loom does not support");
    spec_.ignore_merges = get_or(m, "ignore_merges", false, "model");
    spec_.byte_fallback = get_or(m, "byte_fallback", false, "model");
    spec_.fuse_unk = get_or(m, "fuse_unk", false, "model");
    const nlohmann::json& vocab = field(m, "vocab", "model.vocab");
    if (!vocab.is_object() || vocab.empty()) fail("model.vocab", "is not a non-empty object of token -> id");
    for (const auto& [tok, id] : vocab.items()) {
      if (!id.is_number_integer()) fail("model.vocab", "gives token '" + tok + "' an id that is not an integer");
      set_token(id.get<int64_t>(), tok, "model.vocab");
      spec_.in_model[static_cast<size_t>(id.get<int64_t>())] = true;
    }
    const std::string unk = get_or(m, "unk_token", std::string(), "model");
    if (!unk.empty()) {
      auto it = vocab.find(unk);
      if (it == vocab.end()) fail("model.unk_token", "is '" + unk + "', which is not in model.vocab");
      spec_.unk_id = static_cast<int32_t>(it->get<int64_t>());
    }
    const nlohmann::json& merges = field(m, "merges", "model.merges");
    if (!merges.is_array()) fail("model.merges", "is not an array");
    spec_.merges.reserve(merges.size());
    for (const nlohmann::json& x : merges) {
      if (x.is_string()) {  // "a b"
        const std::string& line = x.get_ref<const std::string&>();
        const size_t sp = line.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
          fail("model.merges", "has '" + line + "', not two symbols separated by one space");
        spec_.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
      } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
        spec_.merges.emplace_back(x[0].get<std::string>(), x[1].get<std::string>());
      } else {
        fail("model.merges", "has an element that is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  }

  void read_added_tokens() {
    const nlohmann::json& added = field(j_, "added_tokens", "added_tokens");
    if (!added.is_array()) fail("added_tokens", "is not an array");
    for (const nlohmann::json& t : added) {
      if (!t.is_object()) fail("added_tokens", "has an element that is not an object");
      const nlohmann::json& id = field(t, "id", "added_tokens[].id");
      const nlohmann::json& content = field(t, "content", "added_tokens[].content");
      if (!id.is_number_integer() || !content.is_string())
        fail("added_tokens", "has an element whose id is not an integer or whose content is not a string");
      const std::string s = content.get<std::string>();
      if (get_or(t, "single_word", false, "added_tokens[]"))
        fail("added_tokens", "has '" + s + "' with single_word = true, which loom does not support");
      set_token(id.get<int64_t>(), s, "added_tokens");
      // AddedToken's defaults: normalized unless special.
      const bool special = get_or(t, "special", false, "added_tokens[]");
      spec_.added.push_back({.id = static_cast<int32_t>(id.get<int64_t>()),
                             .lstrip = get_or(t, "lstrip", false, "added_tokens[]"),
                             .rstrip = get_or(t, "rstrip", false, "added_tokens[]"),
                             .normalized = get_or(t, "normalized", !special, "added_tokens[]")});
    }
    for (size_t i = 0; i < have_.size(); ++i)
      if (!have_[i])
        fail("model.vocab",
             "has no token with id " + std::to_string(i) + " (nor has added_tokens): ids must be 0..N-1");
  }

  void read_normalizer(const nlohmann::json& n, const std::string& where) {
    if (n.is_null()) return;
    const std::string type = type_of(n, where);
    if (type == "NFC") {
      spec_.nfc = true;
    } else if (type == "Prepend") {
      spec_.normalizers.push_back(
          {.kind = BpeTokenizer::Normalizer::prepend, .text = get_or(n, "prepend", std::string(), where)});
    } else if (type == "Replace") {
      spec_.normalizers.push_back({.kind = BpeTokenizer::Normalizer::replace,
                                   .text = string_pattern(n, where),
                                   .by = get_or(n, "content", std::string(), where)});
    } else if (type == "Sequence") {
      const nlohmann::json& list = field(n, "normalizers", where + ".normalizers");
      if (!list.is_array()) fail(where + ".normalizers", "is not an array");
      for (size_t k = 0; k < list.size(); ++k)
        read_normalizer(list[k], where + ".normalizers[" + std::to_string(k) + "]");
    } else {
      fail(where,
           "is " + type + "; loom supports NFC (which it checks rather than applies), Prepend, Replace and Sequence");
    }
  }

  void read_pre_tokenizer(const nlohmann::json& p, const std::string& where) {
    if (p.is_null()) return;
    const std::string type = type_of(p, where);
    if (!spec_.pre_tokenizers.empty() && spec_.pre_tokenizers.back().kind == PreTokenizer::byte_level)
      fail(where, "comes after the ByteLevel step, which must be the last");
    if (type == "Sequence") {
      const nlohmann::json& list = field(p, "pretokenizers", where + ".pretokenizers");
      if (!list.is_array()) fail(where + ".pretokenizers", "is not an array");
      for (size_t k = 0; k < list.size(); ++k)
        read_pre_tokenizer(list[k], where + ".pretokenizers[" + std::to_string(k) + "]");
    } else if (type == "ByteLevel") {
      if (get_or(p, "add_prefix_space", false, where))
        fail(where + ".add_prefix_space", "is true; loom supports false (GPT-2, Llama 3, Qwen2, SmolLM)");
      if (get_or(p, "use_regex", true, where))
        spec_.pre_tokenizers.push_back({.kind = PreTokenizer::regex, .pattern = std::string(kGpt2Pattern)});
      spec_.pre_tokenizers.push_back({.kind = PreTokenizer::byte_level});
    } else if (type == "Metaspace") {
      spec_.pre_tokenizers.push_back({.kind = PreTokenizer::metaspace,
                                      .pattern = one_char(p, "replacement", "\xE2\x96\x81", where),
                                      .prepend = prepend_scheme(p, where),
                                      .split = get_or(p, "split", true, where)});
    } else if (type == "Split") {
      if (get_or(p, "invert", false, where)) fail(where + ".invert", "is true, which loom does not support");
      const std::string behavior = get_or(p, "behavior", std::string("Isolated"), where);
      const nlohmann::json& pat = field(p, "pattern", where + ".pattern");
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        if (behavior != "Isolated")
          fail(where + ".behavior", "is " + behavior + "; loom splits on a Regex with Isolated");
        spec_.pre_tokenizers.push_back({.kind = PreTokenizer::regex, .pattern = pat["Regex"].get<std::string>()});
        return;
      }
      const std::pair<const char*, SplitBehavior> behaviors[] = {
          {"Isolated", SplitBehavior::isolated},
          {"Removed", SplitBehavior::removed},
          {"MergedWithPrevious", SplitBehavior::merged_with_previous},
          {"MergedWithNext", SplitBehavior::merged_with_next}};
      const auto* b =
          std::find_if(std::begin(behaviors), std::end(behaviors), [&](auto& x) { return behavior == x.first; });
      if (b == std::end(behaviors))
        fail(where + ".behavior",
             "is " + behavior + "; loom supports Isolated, Removed, MergedWithPrevious and MergedWithNext");
      spec_.pre_tokenizers.push_back(
          {.kind = PreTokenizer::literal, .pattern = string_pattern(p, where), .behavior = b->second});
    } else if (type == "Digits") {
      spec_.pre_tokenizers.push_back(
          {.kind = PreTokenizer::regex,
           .pattern = get_or(p, "individual_digits", false, where) ? R"(\p{N})" : R"(\p{N}+)"});
    } else {
      fail(where, "is " + type + "; loom supports ByteLevel, Metaspace, Split, Digits and Sequence");
    }
  }

  void read_decoder(const nlohmann::json& d, const std::string& where) {
    if (d.is_null()) return;
    const std::string type = type_of(d, where);
    if (type == "Sequence") {
      const nlohmann::json& list = field(d, "decoders", where + ".decoders");
      if (!list.is_array()) fail(where + ".decoders", "is not an array");
      for (size_t k = 0; k < list.size(); ++k) read_decoder(list[k], where + ".decoders[" + std::to_string(k) + "]");
    } else if (type == "ByteLevel") {
      spec_.decoders.push_back({.kind = Decoder::byte_level});
    } else if (type == "Replace") {
      spec_.decoders.push_back({.kind = Decoder::replace,
                                .text = string_pattern(d, where),
                                .by = get_or(d, "content", std::string(), where)});
    } else if (type == "ByteFallback") {
      spec_.decoders.push_back({.kind = Decoder::byte_fallback});
    } else if (type == "Fuse") {
      spec_.decoders.push_back({.kind = Decoder::fuse});
    } else if (type == "Strip") {
      const int64_t left = get_or(d, "start", int64_t{0}, where), right = get_or(d, "stop", int64_t{0}, where);
      if (left < 0 || right < 0) fail(where, "has a negative start or stop");
      spec_.decoders.push_back(
          {.kind = Decoder::strip, .text = one_char(d, "content", " ", where), .left = left, .right = right});
    } else if (type == "Metaspace") {
      spec_.decoders.push_back({.kind = Decoder::metaspace,
                                .text = one_char(d, "replacement", "\xE2\x96\x81", where),
                                .prepend = prepend_scheme(d, where)});
    } else {
      fail(where,
           "is " + type + "; loom decodes ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence");
    }
  }

  void read_start_token() {
    const std::vector<std::string> leading = leading_special_tokens(j_);
    const std::string start = leading.empty() ? "<|endoftext|>" : leading[0];
    for (const BpeTokenizer::AddedToken& a : spec_.added)
      if (spec_.tokens[static_cast<size_t>(a.id)] == start) spec_.start_id = a.id;
  }

  const nlohmann::json& j_;
  const std::string& subject_;
  Spec spec_;
  std::vector<bool> have_;
};

}  // namespace

HfTokenizer::HfTokenizer(nlohmann::json tokenizer_json, const std::string& subject, nlohmann::json companions)
    : BpeTokenizer(SpecReader(tokenizer_json, subject).read(), subject, kFix),
      json_(std::move(tokenizer_json)),
      companions_(std::move(companions)) {
  // An added token written in the text encodes as itself.
  for (const std::string& name : leading_special_tokens(json_))
    if (const std::vector<int32_t> ids = encode(name); ids.size() == 1) leading_.push_back(ids[0]);
}

namespace {

std::string read_text_file(const std::string& file, const std::string& fix) {
  std::ifstream f(file, std::ios::binary);
  if (!f) throw UserError(file, "cannot be opened", fix);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

nlohmann::json parse_json(const std::string& text, const std::string& file, const std::string& fix) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(file, std::string("is not valid JSON (") + e.what() + ")", fix);
  }
}

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
  nlohmann::json j =
      parse_json(read_text_file(file, "give a tokenizer.json, or a directory that holds one"), file, kFix);
  // Kept as text: transformers writes numbers (model_max_length = 1e30 as an integer) that a
  // round trip through a parser would change.
  nlohmann::json companions = nlohmann::json::object();
  const std::string fix = "fix or remove it: it travels with the tokenizer into exports";
  for (const std::string name : kCompanionFiles) {
    const fs::path beside = fs::path(file).parent_path() / name;
    std::error_code ec;
    if (!fs::is_regular_file(beside, ec)) continue;
    std::string text = read_text_file(beside.string(), fix);
    if (name.ends_with(".json") && !parse_json(text, beside.string(), fix).is_object())
      throw UserError(beside.string(), "is not a JSON object", fix);
    companions[name] = std::move(text);
  }
  return std::make_unique<HfTokenizer>(std::move(j), file, std::move(companions));
}

void HfTokenizer::set_companion(const std::string& name, std::string text) {
  LOOM_ASSERT(std::ranges::any_of(kCompanionFiles, [&](const char* n) { return name == n; }),
              "not a companion file name");
  companions_[name] = std::move(text);
}

nlohmann::json HfTokenizer::to_json() const {
  nlohmann::json j = {{"kind", choice_name(kind())}, {"vocab_size", vocab_size()}, {"tokenizer", json_}};
  if (!companions_.empty()) j["companions"] = companions_;
  return j;
}

}  // namespace loom
