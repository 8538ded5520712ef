#include "data/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

const char* kFix = "use the tokenizer.json of a byte-level BPE model (GPT-2, SmolLM, Llama 3, Qwen2), unmodified";

class SpecReader {
 public:
  SpecReader(const nlohmann::json& j, const std::string& subject) : j_(j), subject_(subject) {}

  BpeTokenizer::Spec read() {
    if (!j_.is_object()) fail("the file", "is not a JSON object");
    read_model();
    read_added_tokens();
    read_normalizer(field(j_, "normalizer", "normalizer"));
    bool byte_level = false;
    read_pre_tokenizer(field(j_, "pre_tokenizer", "pre_tokenizer"), "pre_tokenizer", byte_level);
    if (!byte_level) fail("pre_tokenizer", "has no ByteLevel step: loom reads byte-level BPE tokenizers (GPT-2 style)");
    const nlohmann::json& dec = field(j_, "decoder", "decoder");
    if (!dec.is_null() && type_of(dec, "decoder") != "ByteLevel")
      fail("decoder", "is " + type_of(dec, "decoder") + "; loom decodes byte-level BPE (ByteLevel)");
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

  void set_token(int64_t id, const std::string& s, const std::string& where) {
    if (id < 0 || id >= INT32_MAX) fail(where, "has id " + std::to_string(id) + ", outside [0, 2^31 - 1)");
    const auto i = static_cast<size_t>(id);
    if (i >= spec_.tokens.size()) {
      spec_.tokens.resize(i + 1);
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
    if (type != "BPE") fail("model.type", "is " + type + "; loom reads byte-level BPE models (\"BPE\")");
    if (get_or(m, "dropout", 0.0, "model") != 0.0) fail("model.dropout", "is set: BPE dropout is not supported");
    if (get_or(m, "byte_fallback", false, "model"))
      fail("model.byte_fallback", "is true: SentencePiece-style BPE (Llama 2, Mistral) is not supported");
    if (!get_or(m, "continuing_subword_prefix", std::string(), "model").empty() ||
        !get_or(m, "end_of_word_suffix", std::string(), "model").empty())
      fail("model", "has a continuing_subword_prefix or end_of_word_suffix: not a byte-level BPE");
    spec_.ignore_merges = get_or(m, "ignore_merges", false, "model");
    const nlohmann::json& vocab = field(m, "vocab", "model.vocab");
    if (!vocab.is_object() || vocab.empty()) fail("model.vocab", "is not a non-empty object of token -> id");
    for (const auto& [tok, id] : vocab.items()) {
      if (!id.is_number_integer()) fail("model.vocab", "gives token '" + tok + "' an id that is not an integer");
      set_token(id.get<int64_t>(), tok, "model.vocab");
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
      for (const char* flag : {"single_word", "lstrip", "rstrip"})
        if (get_or(t, flag, false, "added_tokens[]"))
          fail("added_tokens", "has '" + s + "' with " + flag + " = true, which loom does not support");
      set_token(id.get<int64_t>(), s, "added_tokens");
      spec_.specials.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    for (size_t i = 0; i < have_.size(); ++i)
      if (!have_[i])
        fail("model.vocab",
             "has no token with id " + std::to_string(i) + " (nor has added_tokens): ids must be 0..N-1");
  }

  void read_normalizer(const nlohmann::json& n) {
    if (n.is_null()) return;
    const std::string type = type_of(n, "normalizer");
    if (type == "NFC") {
      spec_.nfc = true;
    } else if (type == "Sequence") {
      const nlohmann::json& list = field(n, "normalizers", "normalizer.normalizers");
      if (!list.is_array()) fail("normalizer.normalizers", "is not an array");
      for (const nlohmann::json& x : list) read_normalizer(x);
    } else {
      fail("normalizer", "is " + type + "; loom supports none or NFC (which it checks rather than applies)");
    }
  }

  // Appends the split patterns of pre-tokenizer `p` to spec_.patterns.
  void read_pre_tokenizer(const nlohmann::json& p, const std::string& where, bool& byte_level) {
    if (p.is_null()) return;
    const std::string type = type_of(p, where);
    if (byte_level) fail(where, "comes after the ByteLevel step, which must be the last");
    if (type == "Sequence") {
      const nlohmann::json& list = field(p, "pretokenizers", where + ".pretokenizers");
      if (!list.is_array()) fail(where + ".pretokenizers", "is not an array");
      for (size_t k = 0; k < list.size(); ++k)
        read_pre_tokenizer(list[k], where + ".pretokenizers[" + std::to_string(k) + "]", byte_level);
    } else if (type == "ByteLevel") {
      if (get_or(p, "add_prefix_space", false, where))
        fail(where + ".add_prefix_space", "is true; loom supports false (GPT-2, Llama 3, Qwen2, SmolLM)");
      if (get_or(p, "use_regex", true, where)) spec_.patterns.emplace_back(kGpt2Pattern);
      byte_level = true;
    } else if (type == "Split") {
      if (get_or(p, "behavior", std::string("Isolated"), where) != "Isolated")
        fail(where + ".behavior", "is not Isolated, the one loom supports");
      if (get_or(p, "invert", false, where)) fail(where + ".invert", "is true, which loom does not support");
      const nlohmann::json& pat = field(p, "pattern", where + ".pattern");
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        spec_.patterns.push_back(pat["Regex"].get<std::string>());
      } else if (pat.contains("String") && pat["String"].is_string()) {
        std::string escaped;  // the literal string as a pattern
        for (const char c : pat["String"].get<std::string>()) {
          const auto u = static_cast<unsigned char>(c);
          if (u < 0x80 && !std::isalnum(u)) escaped += '\\';
          escaped += c;
        }
        spec_.patterns.push_back(std::move(escaped));
      } else {
        fail(where + ".pattern", "is neither {\"Regex\": ...} nor {\"String\": ...}");
      }
    } else if (type == "Digits") {
      spec_.patterns.emplace_back(get_or(p, "individual_digits", false, where) ? R"(\p{N})" : R"(\p{N}+)");
    } else {
      fail(where, "is " + type + "; loom supports ByteLevel, Split, Digits and Sequence");
    }
  }

  // The first SpecialToken of a TemplateProcessing "single" template, searched through Sequences.
  std::string template_start(const nlohmann::json& p) const {
    if (!p.is_object()) return {};
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
      for (const nlohmann::json& x : p["processors"])
        if (std::string s = template_start(x); !s.empty()) return s;
    } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array() && !p["single"].empty()) {
      const nlohmann::json& first = p["single"][0];
      if (first.contains("SpecialToken") && first["SpecialToken"].contains("id") &&
          first["SpecialToken"]["id"].is_string())
        return first["SpecialToken"]["id"].get<std::string>();
    }
    return {};
  }

  void read_start_token() {
    std::string start = template_start(j_.contains("post_processor") ? j_["post_processor"] : nlohmann::json());
    if (start.empty()) start = "<|endoftext|>";
    for (const int32_t id : spec_.specials)
      if (spec_.tokens[static_cast<size_t>(id)] == start) spec_.start_id = id;
  }

  const nlohmann::json& j_;
  const std::string& subject_;
  BpeTokenizer::Spec spec_;
  std::vector<bool> have_;
};

}  // namespace

HfTokenizer::HfTokenizer(nlohmann::json tokenizer_json, const std::string& subject)
    : BpeTokenizer(SpecReader(tokenizer_json, subject).read(), subject, kFix), json_(std::move(tokenizer_json)) {}

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
  std::ifstream f(file, std::ios::binary);
  if (!f) throw UserError(file, "cannot be opened", "give a tokenizer.json, or a directory that holds one");
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(file, std::string("is not valid JSON (") + e.what() + ")", kFix);
  }
  return std::make_unique<HfTokenizer>(std::move(j), file);
}

nlohmann::json HfTokenizer::to_json() const {
  return {{"kind", "hf"}, {"vocab_size", vocab_size()}, {"tokenizer", json_}};
}

}  // namespace loom
