#include "data/chat_data.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/token_data.h"
#include "data/tokenizer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using jinja::Json;

std::string read_whole(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError(path, "is a directory, not " + what, "give the path of the file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot be opened", "check the path of " + what);
  std::string s{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (f.bad()) throw UserError(path, "could not be read to the end", "check the file and the disk");
  return s;
}

const char* kFormats =
    "each line must be one of {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}, {\"prompt\": ..., "
    "\"completion\": ...} or {\"text\": ...}";

// A list of messages: objects with a role (system, user, assistant or tool) and a content
// (a string, or a list of content parts as multimodal templates take).
void check_messages(const Json& m, const std::string& where, const std::string& field) {
  if (!m.is_array() || m.empty())
    throw UserError(where, "\"" + field + "\" must be a non-empty list of messages", kFormats);
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string f = field + "[" + std::to_string(i) + "]";
    if (!m[i].is_object()) throw UserError(where, f + " is not an object", "write {\"role\": ..., \"content\": ...}");
    auto role = m[i].find("role");
    if (role == m[i].end() || !role->is_string())
      throw UserError(where, f + ".role is missing or not a string", "give system, user, assistant or tool");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw UserError(where, f + ".role is \"" + r + "\"", "roles are system, user, assistant and tool");
    auto content = m[i].find("content");
    const bool tool_call = r == "assistant" && m[i].contains("tool_calls");
    if (content == m[i].end()) {
      if (!tool_call) throw UserError(where, f + ".content is missing", "give the message's text as \"content\"");
    } else if (!content->is_string() && !content->is_array() && !(tool_call && content->is_null())) {
      throw UserError(where, f + ".content is not a string (or a list of content parts)",
                      "give the message's text as a JSON string");
    }
  }
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// tokenizer_config.json's special token: a string, or an AddedToken {"content": ...}.
std::string token_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

// `path` as a JSON object; an empty object when the file does not exist (an optional file).
Json optional_json(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Json::object();
  Json j;
  try {
    j = Json::parse(read_whole(path, "a JSON file"));
  } catch (const Json::exception& e) {
    throw UserError(path, std::string("is not valid JSON (") + e.what() + ")", "give the model's own file");
  }
  if (!j.is_object()) throw UserError(path, "is not a JSON object", "give the model's own file");
  return j;
}

// The special tokens transformers' tokenizer has (and gives templates): tokenizer_config.json's,
// then special_tokens_map.json's for the ones it lacks.
Json special_tokens(const std::string& model_dir) {
  Json specials = Json::object();
  for (const char* file : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const Json config = optional_json((fs::path(model_dir) / file).string());
    for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
      if (config.contains(k) && !specials.contains(k))
        if (std::string v = token_text(config[k]); !v.empty()) specials[k] = v;
    if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array() &&
        !specials.contains("additional_special_tokens")) {
      Json extra = Json::array();
      for (const auto& v : config["additional_special_tokens"])
        if (std::string t = token_text(v); !t.empty()) extra.push_back(t);
      specials["additional_special_tokens"] = extra;
    }
  }
  return specials;
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::conversational:
      return "conversational";
    case ChatFormat::prompt_completion:
      return "prompt-completion";
    case ChatFormat::text:
      return "text";
  }
  return "?";
}

// ---- reading --------------------------------------------------------------------------------

ChatExample parse_chat_line(const std::string& line_text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(line_text);
  } catch (const Json::exception& e) {
    throw UserError(where, std::string("is not valid JSON (") + e.what() + ")", "write one JSON object per line");
  }
  if (!j.is_object()) throw UserError(where, "is not a JSON object", kFormats);
  ChatExample ex;
  if (j.contains("messages")) {
    ex.format = ChatFormat::conversational;
    check_messages(j["messages"], where, "messages");
    ex.messages = j["messages"];
    ex.tools = j.value("tools", Json(nullptr));
    if (!ex.tools.is_null() && !ex.tools.is_array())
      throw UserError(where, "\"tools\" is not a list", "give the tools as a list of JSON schemas");
  } else if (j.contains("prompt") || j.contains("completion")) {
    ex.format = ChatFormat::prompt_completion;
    for (const char* k : {"prompt", "completion"})
      if (!j.contains(k)) throw UserError(where, std::string("\"") + k + "\" is missing", kFormats);
    ex.prompt = j["prompt"];
    ex.completion = j["completion"];
    if (ex.prompt.is_string() != ex.completion.is_string() || (!ex.prompt.is_string() && !ex.prompt.is_array()))
      throw UserError(where, "\"prompt\" and \"completion\" must both be strings or both be lists of messages",
                      kFormats);
    if (ex.prompt.is_array()) {
      check_messages(ex.prompt, where, "prompt");
      check_messages(ex.completion, where, "completion");
    }
  } else if (j.contains("text")) {
    ex.format = ChatFormat::text;
    if (!j["text"].is_string()) throw UserError(where, "\"text\" is not a string", "give the text as a JSON string");
    ex.text = j["text"].get<std::string>();
  } else {
    throw UserError(where, "has none of the keys \"messages\", \"prompt\"/\"completion\" or \"text\"", kFormats);
  }
  return ex;
}

std::vector<ChatExample> read_chat_jsonl(const std::string& path) {
  const std::string all = read_whole(path, "the JSON Lines data");
  std::vector<ChatExample> out;
  int64_t line_no = 0;
  for (size_t at = 0; at < all.size();) {
    size_t end = all.find('\n', at);
    if (end == std::string::npos) end = all.size();
    std::string line = all.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    ChatExample ex = parse_chat_line(line, where);
    ex.line = line_no;
    if (!out.empty() && ex.format != out.front().format)
      throw UserError(where,
                      std::string("is ") + chat_format_name(ex.format) + " but line " +
                          std::to_string(out.front().line) + " is " + chat_format_name(out.front().format),
                      "give every line of a file the same format");
    out.push_back(std::move(ex));
  }
  if (out.empty()) throw UserError(path, "holds no examples", "give one JSON object per line");
  return out;
}

// ---- templates ------------------------------------------------------------------------------

ChatTemplate load_chat_template(const std::string& model_dir, const std::string& template_path) {
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  Json config = Json::object();
  std::error_code ec;
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (!fs::exists(config_path, ec) && template_path.empty() && !fs::is_regular_file(jinja_path, ec))
    throw UserError(model_dir, "holds no chat template (neither tokenizer_config.json nor chat_template.jinja)",
                    "give the template with --template FILE, or the directory of a model with one");
  if (fs::exists(config_path, ec)) {
    try {
      config = Json::parse(read_whole(config_path, "the tokenizer configuration"));
    } catch (const Json::exception& e) {
      throw UserError(config_path, std::string("is not valid JSON (") + e.what() + ")",
                      "give the model's tokenizer_config.json");
    }
    if (!config.is_object())
      throw UserError(config_path, "is not a JSON object", "give the model's tokenizer_config.json");
  }
  std::string source, text;
  // transformers 5 saves the template as its own file, which it prefers to tokenizer_config.json's.
  if (!template_path.empty() || fs::is_regular_file(jinja_path, ec)) {
    source = template_path.empty() ? jinja_path : template_path;
    text = read_whole(source, "the chat template");
  } else {
    source = config_path + " chat_template";
    const Json& t = config.contains("chat_template") ? config["chat_template"] : Json(nullptr);
    if (t.is_string()) {
      text = t.get<std::string>();
    } else if (t.is_array()) {
      for (const auto& named : t)
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string())
          text = named["template"].get<std::string>();
      if (text.empty())
        throw UserError(config_path, "\"chat_template\" is a list without a template named \"default\"",
                        "give the template to use with --template FILE");
    } else {
      throw UserError(config_path, "has no \"chat_template\" string",
                      "give a chat template with --template FILE (a Jinja file as transformers uses)");
    }
  }
  ChatTemplate ct{jinja::Template(text, source), special_tokens(model_dir), {}, source, text};
  ct.eos_token = ct.specials.value("eos_token", "");
  return ct;
}

std::string resolve_eos_token(const std::string& model_dir, const std::string& given, const Tokenizer* tok) {
  std::string eos = given, from = "--eos-token";
  if (eos.empty()) {
    eos = special_tokens(model_dir).value("eos_token", "");
    from = "the eos_token of " + model_dir + "/tokenizer_config.json or special_tokens_map.json";
  }
  std::unique_ptr<HfTokenizer> loaded;
  const auto tokenizer = [&]() -> const Tokenizer& {
    if (!tok) tok = (loaded = HfTokenizer::load(model_dir)).get();
    return *tok;
  };
  for (const char* file : {"config.json", "generation_config.json"}) {
    if (!eos.empty()) break;
    const Json j = optional_json((fs::path(model_dir) / file).string());
    const Json id = j.is_object() ? j.value("eos_token_id", Json()) : Json();
    const Json& first = id.is_array() && !id.empty() ? id[0] : id;
    if (!first.is_number_integer()) continue;
    const auto v = first.get<int64_t>();
    from = model_dir + "/" + file + "'s eos_token_id " + std::to_string(v);
    if (v < 0 || v >= tokenizer().vocab_size())
      throw UserError(from, "is not an id of the tokenizer (" + std::to_string(tokenizer().vocab_size()) + " tokens)",
                      "give the end-of-text token with --eos-token TOKEN");
    const auto id32 = static_cast<int32_t>(v);
    eos = tokenizer().decode(std::span<const int32_t>(&id32, 1));
  }
  if (eos.empty())
    throw UserError(model_dir,
                    "names no end-of-text token: no \"eos_token\" in tokenizer_config.json or "
                    "special_tokens_map.json, no \"eos_token_id\" in config.json or generation_config.json",
                    "give it with --eos-token TOKEN (TRL's eos_token): plain text and string completions end with it so "
                    "the model learns to stop");
  // TRL refuses an eos_token that is not one token of the vocabulary; so does loom.
  std::vector<int32_t> ids;
  try {
    ids = tokenizer().encode(eos);
  } catch (const UserError&) {
  }
  if (ids.size() != 1)
    throw UserError(from, "is \"" + eos + "\", which the tokenizer encodes as " + std::to_string(ids.size()) +
                              " tokens, not one",
                    "give a token of the vocabulary with --eos-token TOKEN");
  return eos;
}

std::string render_messages(const ChatTemplate& t, const Json& messages, const Json& tools,
                            bool add_generation_prompt, jinja::Spans* generation_spans) {
  Json ctx = t.specials;
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  return t.tmpl.render(ctx, generation_spans);
}

// ---- rendering and masks --------------------------------------------------------------------

namespace {

std::string default_loss_on(ChatFormat f) {
  return f == ChatFormat::conversational ? "assistant" : f == ChatFormat::prompt_completion ? "completion" : "all";
}

void check_loss_on(ChatFormat f, const std::string& loss_on) {
  const bool ok = loss_on == "all" || (f == ChatFormat::conversational && loss_on == "assistant") ||
                  (f == ChatFormat::prompt_completion && loss_on == "completion");
  if (!ok)
    throw UserError("--loss-on", "is '" + loss_on + "', which " + chat_format_name(f) + " data does not have",
                    std::string("use ") + default_loss_on(f) + (f == ChatFormat::text ? "" : " or all") + " for " +
                        chat_format_name(f) + " data");
}

// Template errors happen per example: name the data line first.
template <class F>
auto at_example(const std::string& where, F&& f) {
  try {
    return f();
  } catch (const UserError& e) {
    throw UserError(where, e.what(), e.hint());
  }
}

}  // namespace

RenderedExample render_example(const ChatTemplate& t, const ChatExample& ex, const std::string& loss_on,
                               const std::string& where) {
  check_loss_on(ex.format, loss_on);
  RenderedExample r;
  if (ex.format == ChatFormat::text) {
    r.text = ex.text;
    if (!ends_with(r.text, t.eos_token)) r.text += t.eos_token;
    r.add_special_tokens = true;
  } else if (ex.format == ChatFormat::prompt_completion && ex.prompt.is_string()) {
    r.add_special_tokens = true;
    const std::string& p = ex.prompt.get_ref<const std::string&>();
    std::string c = ex.completion.get<std::string>();
    if (!ends_with(c, t.eos_token)) c += t.eos_token;
    r.text = p + c;
    if (loss_on == "completion") r.targets.emplace_back(p.size(), r.text.size());
  } else if (ex.format == ChatFormat::prompt_completion) {
    Json all = ex.prompt;
    for (const auto& m : ex.completion) all.push_back(m);
    const std::string prompt = at_example(where, [&] { return render_messages(t, ex.prompt, nullptr, true); });
    r.text = at_example(where, [&] { return render_messages(t, all, nullptr, false); });
    if (loss_on == "completion") {
      if (r.text.compare(0, prompt.size(), prompt) != 0)
        throw UserError(where,
                        "the template's rendering of the prompt (with the generation prompt) is not the start of "
                        "its rendering of prompt + completion, so the completion cannot be found",
                        "use --loss-on all, or a template that renders the prompt the same either way");
      r.targets.emplace_back(prompt.size(), r.text.size());
    }
  } else if (loss_on == "assistant" && t.tmpl.has_generation()) {
    jinja::Spans spans;
    r.text = at_example(where, [&] { return render_messages(t, ex.messages, ex.tools, false, &spans); });
    for (const auto& s : spans)
      if (s.second > s.first) r.targets.push_back(s);
  } else {
    r.text = at_example(where, [&] { return render_messages(t, ex.messages, ex.tools, false); });
    if (loss_on == "assistant") {
      for (size_t i = 0; i < ex.messages.size(); ++i) {
        if (ex.messages[i]["role"] != "assistant") continue;
        const Json before(ex.messages.begin(), ex.messages.begin() + static_cast<long>(i));
        const Json through(ex.messages.begin(), ex.messages.begin() + static_cast<long>(i) + 1);
        const std::string start = at_example(where, [&] { return render_messages(t, before, ex.tools, true); });
        const std::string end = at_example(where, [&] { return render_messages(t, through, ex.tools, false); });
        const bool ok = r.text.compare(0, start.size(), start) == 0 && r.text.compare(0, end.size(), end) == 0 &&
                        end.size() >= start.size();
        if (!ok)
          throw UserError(where,
                          "the template renders messages[:" + std::to_string(i) + "] (with the generation prompt) or " +
                              "messages[:" + std::to_string(i + 1) +
                              "] as something other than the start of the whole conversation, so loom cannot tell "
                              "which text is assistant turn " +
                              std::to_string(i) + " (the template rewrites earlier turns when later ones follow)",
                          "use --loss-on all, or a template that renders each turn the same whatever follows or "
                          "marks the assistant's text with {% generation %} blocks");
        if (end.size() > start.size()) r.targets.emplace_back(start.size(), end.size());
      }
    }
  }
  if (loss_on == "all") r.targets.emplace_back(0, r.text.size());
  return r;
}

namespace {

// The text's ids and mask (1 = a token with a byte in a target span), without special tokens.
TokenizedExample tokenize_text(const Tokenizer& tok, const RenderedExample& r) {
  TokenizedExample out;
  auto is_target = [&](size_t b, size_t e) {
    return b < e &&
           std::any_of(r.targets.begin(), r.targets.end(), [&](const auto& s) { return b < s.second && s.first < e; });
  };
  // The text is tokenized whole, as transformers does; each token's bytes come from decoding it
  // alone, which spells the text back exactly for byte-level BPE.
  out.ids = tok.encode(r.text);
  std::vector<size_t> ends;
  size_t at = 0;
  bool spelled = true;
  for (int32_t id : out.ids) {
    const std::string piece = tok.decode(std::span<const int32_t>(&id, 1));
    if (r.text.compare(at, piece.size(), piece) != 0) {
      spelled = false;
      break;
    }
    at += piece.size();
    ends.push_back(at);
  }
  if (spelled && at == r.text.size()) {
    for (size_t k = 0; k < out.ids.size(); ++k) out.mask.push_back(is_target(k ? ends[k - 1] : 0, ends[k]) ? 1 : 0);
    return out;
  }
  // A tokenizer whose tokens do not spell the text byte for byte (one that normalizes it): encode
  // the stretches between span edges apart, so every token lies on one side of an edge.
  std::vector<size_t> cuts = {0, r.text.size()};
  for (const auto& [b, e] : r.targets) cuts.insert(cuts.end(), {b, e});
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  out.ids.clear();
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const std::vector<int32_t> part = tok.encode(std::string_view(r.text).substr(cuts[c], cuts[c + 1] - cuts[c]));
    out.ids.insert(out.ids.end(), part.begin(), part.end());
    out.mask.insert(out.mask.end(), part.size(), is_target(cuts[c], cuts[c + 1]) ? 1 : 0);
  }
  return out;
}

}  // namespace

TokenizedExample tokenize_example(const Tokenizer& tok, const RenderedExample& r) {
  TokenizedExample out = tokenize_text(tok, r);
  if (r.add_special_tokens) {
    const std::vector<int32_t> lead = tok.leading_special_ids();
    out.ids.insert(out.ids.begin(), lead.begin(), lead.end());
    out.mask.insert(out.mask.begin(), lead.size(), 0);
  }
  return out;
}

// ---- writing --------------------------------------------------------------------------------

namespace {

// Little-endian `width`-byte integers to `path` (a file in the scratch directory).
template <class T>
void write_le(const std::string& path, const std::vector<T>& values, int width) {
  std::vector<char> bytes(values.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < values.size(); ++i)
    for (int b = 0; b < width; ++b)
      bytes[i * static_cast<size_t>(width) + static_cast<size_t>(b)] =
          static_cast<char>((static_cast<uint64_t>(values[i]) >> (8 * b)) & 0xFF);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw UserError(path, "could not be written", "check the free space and permissions of the output directory");
}

struct Split {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<uint64_t> docs = {0};
  int64_t targets = 0;
};

// Files a data directory holds; OUTDIR may be replaced only when it holds nothing else.
bool is_data_file(const std::string& name) {
  return name == "meta.json" || ends_with(name, ".bin") || ends_with(name, ".tmp") ||
         std::find(std::begin(HfTokenizer::kCompanionFiles), std::end(HfTokenizer::kCompanionFiles), name) !=
             std::end(HfTokenizer::kCompanionFiles);
}

// Moves the finished scratch directory to out_dir: renamed into place when out_dir does not exist
// or is empty; an existing data directory is renamed aside first and removed after.
void install_dir(const std::string& scratch, const std::string& out_dir) {
  std::error_code ec;
  const std::string fix = "choose a new or empty OUTDIR, or one that holds only a data directory's files";
  if (fs::exists(out_dir, ec)) {
    if (!fs::is_directory(out_dir, ec)) throw UserError(out_dir, "exists and is not a directory", fix);
    for (const auto& entry : fs::directory_iterator(out_dir, ec))
      if (!entry.is_regular_file() || !is_data_file(entry.path().filename().string()))
        throw UserError(out_dir, "holds '" + entry.path().filename().string() + "', which loom prepare does not write",
                        fix);
    const std::string old = out_dir + ".old-" + std::to_string(::getpid());
    fs::rename(out_dir, old, ec);
    if (ec) throw UserError(out_dir, "cannot be replaced (" + ec.message() + ")", fix);
    fs::rename(scratch, out_dir, ec);
    if (ec) {
      fs::rename(old, out_dir);
      throw UserError(out_dir, "cannot be replaced (" + ec.message() + ")", fix);
    }
    fs::remove_all(old, ec);
    return;
  }
  fs::rename(scratch, out_dir, ec);
  if (ec) throw UserError(out_dir, "cannot be created (" + ec.message() + ")", fix);
}

bool has_messages(const ChatExample& ex) {
  return ex.format == ChatFormat::conversational || (ex.format == ChatFormat::prompt_completion && ex.prompt.is_array());
}

// Only what the examples need: the template for messages, the eos_token for text and string
// completions (`tok`: the model's tokenizer, or null to load it only if the eos must be spelled).
ChatTemplate template_for(const ChatOptions& o, const std::vector<ChatExample>& examples, const Tokenizer* tok) {
  ChatTemplate t = std::any_of(examples.begin(), examples.end(), has_messages)
                       ? load_chat_template(o.model_dir, o.template_path)
                       : ChatTemplate();
  if (!std::all_of(examples.begin(), examples.end(), has_messages))
    t.eos_token = resolve_eos_token(o.model_dir, o.eos_token, tok);
  return t;
}

}  // namespace

PreparedChat prepare_chat(const ChatOptions& o) {
  if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0))
    throw UserError("--val-fraction", "is " + std::to_string(o.val_fraction) + "; it must be in (0, 1)",
                    "give the share of the examples kept for validation, e.g. 0.1");
  const std::unique_ptr<HfTokenizer> tok = HfTokenizer::load(o.model_dir);
  const std::vector<ChatExample> examples = read_chat_jsonl(o.data_path);
  const bool templated = std::any_of(examples.begin(), examples.end(), has_messages);
  const ChatTemplate t = template_for(o, examples, tok.get());
  // The template used travels with the tokenizer (into meta.json, OUTDIR, every checkpoint and exports).
  if (templated && !o.template_path.empty()) tok->set_companion("chat_template.jinja", t.text);
  PreparedChat r;
  r.eos_token = t.eos_token;
  r.format = examples.front().format;
  r.loss_on = o.loss_on.empty() ? default_loss_on(r.format) : o.loss_on;
  check_loss_on(r.format, r.loss_on);
  const auto n = static_cast<int64_t>(examples.size());
  const auto n_train = static_cast<int64_t>(static_cast<double>(n) * (1.0 - o.val_fraction));
  if (n_train < 1 || n_train >= n)
    throw UserError(o.data_path,
                    "has " + std::to_string(n) +
                        " examples: too few for both a train and a val split with "
                        "--val-fraction " +
                        std::to_string(o.val_fraction),
                    "give more examples or another --val-fraction");

  // The mask holds the format's targets whatever --loss-on says (data.loss_on chooses at train
  // time); only when --loss-on all was asked for and the template hides them does it mark all.
  Split splits[2];
  const auto tokenize_all = [&] {
    for (Split& s : splits) s = Split{};
    for (int64_t k = 0; k < n; ++k) {
      const ChatExample& ex = examples[static_cast<size_t>(k)];
      const std::string where = o.data_path + ":" + std::to_string(ex.line);
      const TokenizedExample te = tokenize_example(*tok, render_example(t, ex, r.mask_on, where));
      Split& s = splits[k < n_train ? 0 : 1];
      s.ids.insert(s.ids.end(), te.ids.begin(), te.ids.end());
      s.mask.insert(s.mask.end(), te.mask.begin(), te.mask.end());
      s.docs.push_back(s.ids.size());
      s.targets += std::count(te.mask.begin(), te.mask.end(), uint8_t{1});
    }
  };
  r.mask_on = default_loss_on(r.format);
  try {
    tokenize_all();
  } catch (const UserError&) {
    if (r.loss_on != "all" || r.mask_on == "all") throw;
    r.mask_on = "all";
    tokenize_all();
  }
  const int width = tok->vocab_size() > kMaxUint16Vocab ? 4 : 2;
  r.token_format = width == 2 ? "uint16" : "uint32";
  r.vocab_size = tok->vocab_size();
  r.out_dir = o.out_dir;
  for (int s = 0; s < 2; ++s) {
    r.examples[s] = static_cast<int64_t>(splits[s].docs.size()) - 1;
    r.tokens[s] = static_cast<int64_t>(splits[s].ids.size());
    r.targets[s] = splits[s].targets;
    const std::vector<int64_t> docs(splits[s].docs.begin(), splits[s].docs.end());
    r.packed[s] = pack_examples(docs, o.block_size, true);
    r.padded[s] = pack_examples(docs, o.block_size, false);
  }

  // Everything goes into a scratch directory beside OUTDIR, renamed into place at the end.
  std::error_code ec;
  const fs::path out = fs::path(o.out_dir).lexically_normal();
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  const std::string scratch =
      (parent / ("." + out.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  fs::remove_all(scratch, ec);
  if (!fs::create_directory(scratch, ec))
    throw UserError(o.out_dir, "cannot be written: creating '" + scratch + "' failed (" + ec.message() + ")",
                    "check the permissions of the output directory's parent");
  try {
    const char* names[2] = {"train", "val"};
    for (int s = 0; s < 2; ++s) {
      const std::string base = (fs::path(scratch) / names[s]).string();
      write_le(base + ".bin", splits[s].ids, width);
      write_le(base + "_mask.bin", splits[s].mask, 1);
      write_le(base + "_docs.bin", splits[s].docs, 8);
    }
    for (const auto& [name, text] : tok->companions().items()) {
      std::ofstream c(fs::path(scratch) / name, std::ios::binary | std::ios::trunc);
      c << text.get<std::string>();
      c.close();
      if (!c) throw UserError(scratch + "/" + name, "could not be written", "check the free space of the output disk");
    }
    Json chat = {{"data_format", chat_format_name(r.format)},
                 {"loss_on", r.loss_on},
                 {"mask_on", r.mask_on},
                 {"template", templated ? Json(t.source) : Json(nullptr)},
                 {"train_examples", r.examples[0]},
                 {"val_examples", r.examples[1]},
                 {"train_target_tokens", r.targets[0]},
                 {"val_target_tokens", r.targets[1]},
                 {"mask", "uint8"},
                 {"docs", "uint64"}};
    const std::string source = fs::absolute(o.data_path, ec).lexically_normal().string();
    // Keys in token_data.h's order, the (large) tokenizer last.
    std::string meta =
        "{\n  \"format\": \"" + r.token_format + "\",\n  \"vocab_size\": " + std::to_string(r.vocab_size) +
        ",\n  \"train_tokens\": " + std::to_string(r.tokens[0]) +
        ",\n  \"val_tokens\": " + std::to_string(r.tokens[1]) +
        ",\n  \"source\": " + Json(source).dump(-1, ' ', false, Json::error_handler_t::replace) +
        ",\n  \"chat\": " + chat.dump(-1, ' ', false, Json::error_handler_t::replace) +
        ",\n  \"tokenizer\": " + tok->to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n}\n";
    std::ofstream f(fs::path(scratch) / "meta.json", std::ios::binary | std::ios::trunc);
    f << meta;
    f.close();
    if (!f) throw UserError(scratch + "/meta.json", "could not be written", "check the free space of the output disk");
    install_dir(scratch, o.out_dir);
  } catch (...) {
    fs::remove_all(scratch, ec);
    throw;
  }
  return r;
}

namespace {

// data.loss_on against meta.json's "chat": which targets `s` trains on (the header's table).
void apply_loss_on(ChatSplit& s, const Json& chat, LossOn loss_on, const std::string& mask_path) {
  const std::string recorded = chat.value("loss_on", std::string("all"));
  // Data from before "mask_on" marked what it was prepared with.
  const std::string mask_on = chat.value("mask_on", recorded);
  const std::string format = chat.value("data_format", std::string("text"));
  s.loss_on = loss_on == LossOn::auto_ ? recorded : std::string(choice_name(loss_on));
  const std::string key = "data.loss_on = " + std::string(choice_name(loss_on));
  if (s.loss_on == "all") {
    s.mask.clear();
    s.targets = s.tokens.size();
    return;
  }
  const std::string has = format == "conversational" ? "assistant" : format == "prompt-completion" ? "completion" : "";
  if (s.loss_on != has)
    throw UserError(
        key,
        "asks for the " + s.loss_on + " tokens, but " + mask_path + " belongs to " + format + " data, which has none",
        "use data.loss_on = auto or all" + (has.empty() ? std::string() : " or " + has) + " for " + format + " data");
  if (mask_on != s.loss_on)
    throw UserError(key,
                    "asks for the " + s.loss_on + " tokens, but " + mask_path +
                        " marks every token (prepared with --loss-on all by an older loom, or by a template that "
                        "rewrites earlier turns, so the " +
                        s.loss_on + " tokens could not be found)",
                    "prepare the data again with `loom prepare chat` (its mask then holds the " + s.loss_on +
                        " tokens), or use data.loss_on = all");
}

}  // namespace

ChatSplit open_chat_split(const std::string& data_dir, const std::string& split, LossOn loss_on) {
  const fs::path dir(data_dir);
  const std::string fix = "prepare the data directory again: loom prepare chat MODEL_DIR DATA.jsonl DIR";
  ChatSplit s{TokenFile::open_split(data_dir, split), {}, {}, 0, {}};
  const Json meta = Json::parse(read_whole((dir / "meta.json").string(), "meta.json"), nullptr, false);
  const Json chat = meta.is_object() ? meta.value("chat", Json()) : Json();
  const std::string count_key = split + "_target_tokens";
  if (!chat.is_object() || !chat.contains(count_key) || !chat[count_key].is_number_integer())
    throw UserError((dir / "meta.json").string(), "has no \"chat\" entry with \"" + count_key + "\"",
                    "this is not a chat data directory; " + fix);
  const std::string mask_path = (dir / (split + "_mask.bin")).string();
  const std::string mask = read_whole(mask_path, "the loss mask");
  if (static_cast<int64_t>(mask.size()) != s.tokens.size())
    throw UserError(mask_path,
                    "has " + std::to_string(mask.size()) + " bytes for " + std::to_string(s.tokens.size()) + " tokens",
                    fix);
  s.mask.assign(mask.begin(), mask.end());
  for (size_t i = 0; i < s.mask.size(); ++i) {
    if (s.mask[i] > 1) throw UserError(mask_path, "byte " + std::to_string(i) + " is not 0 or 1", fix);
    s.targets += s.mask[i];
  }
  if (s.targets != chat[count_key].get<int64_t>())
    throw UserError(mask_path,
                    "marks " + std::to_string(s.targets) + " targets but meta.json says " +
                        std::to_string(chat[count_key].get<int64_t>()),
                    fix);
  apply_loss_on(s, chat, loss_on, mask_path);
  const std::string docs_path = (dir / (split + "_docs.bin")).string();
  const std::string docs = read_whole(docs_path, "the example boundaries");
  if (docs.size() % 8 != 0 || docs.size() < 16)
    throw UserError(docs_path, "is not two or more uint64 offsets (" + std::to_string(docs.size()) + " bytes)", fix);
  for (size_t k = 0; k < docs.size() / 8; ++k) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = v << 8 | static_cast<unsigned char>(docs[k * 8 + static_cast<size_t>(b)]);
    const auto off = static_cast<int64_t>(v);
    if (off < (k ? s.docs.back() : 0) || off > s.tokens.size() || (k == 0 && off != 0))
      throw UserError(
          docs_path,
          "offset " + std::to_string(k) + " (" + std::to_string(v) + ") is not in order between 0 and the token count",
          fix);
    s.docs.push_back(off);
  }
  if (s.docs.back() != s.tokens.size())
    throw UserError(docs_path,
                    "ends at token " + std::to_string(s.docs.back()) + ", not at the token count " +
                        std::to_string(s.tokens.size()),
                    fix);
  return s;
}

int run_prepare_chat(const ChatOptions& o, FILE* out) {
  const PreparedChat r = prepare_chat(o);
  const std::string masks =
      r.mask_on == r.loss_on ? "" : "; the masks mark the " + r.mask_on + " tokens, for data.loss_on";
  std::fprintf(out, "prepared %s (%s data, loss on %s%s)\n", o.data_path.c_str(), chat_format_name(r.format),
               r.loss_on.c_str(), masks.c_str());
  std::fprintf(out, "  vocab size: %lld, token files: %s\n", static_cast<long long>(r.vocab_size),
               r.token_format.c_str());
  const char* names[2] = {"train", "val"};
  for (int s = 0; s < 2; ++s)
    std::fprintf(out, "  %s has %lld examples, %lld tokens, %lld target tokens (%.1f%%)\n", names[s],
                 static_cast<long long>(r.examples[s]), static_cast<long long>(r.tokens[s]),
                 static_cast<long long>(r.targets[s]),
                 r.tokens[s] ? 100.0 * static_cast<double>(r.targets[s]) / static_cast<double>(r.tokens[s]) : 0.0);
  for (int s = 0; s < 2; ++s)
    std::fprintf(out,
                 "  %s at block size %lld: packed %lld rows, %.1f%% tokens (data.packing = true); one example per "
                 "row %lld rows, %.1f%% tokens; %lld examples cut to the block\n",
                 names[s], static_cast<long long>(o.block_size), static_cast<long long>(r.packed[s].rows()),
                 100.0 * r.packed[s].efficiency(), static_cast<long long>(r.padded[s].rows()),
                 100.0 * r.padded[s].efficiency(), static_cast<long long>(r.packed[s].truncated));
  if (!r.eos_token.empty())
    std::fprintf(out, "  text and string completions end with the eos token %s\n",
                 jinja::python_json(Json(r.eos_token)).c_str());
  std::fprintf(out,
               "  wrote %s: {train,val}.bin, {train,val}_mask.bin, {train,val}_docs.bin, meta.json and the tokenizer's "
               "files\n",
               o.out_dir.c_str());
  for (int s = 0; s < 2; ++s)
    if (r.targets[s] == 0 && r.loss_on != "all")
      std::fprintf(out,
                   "  warning: %s has no target tokens (loss on %s): `loom train` refuses it unless data.loss_on = "
                   "all; check the template's turns with --render-only, and --loss-on\n",
                   names[s], r.mask_on.c_str());
  return 0;
}

int run_render_chat(const ChatOptions& o, bool add_generation_prompt, FILE* out) {
  const std::vector<ChatExample> examples = read_chat_jsonl(o.data_path);
  const ChatTemplate t = template_for(o, examples, nullptr);
  int status = 0;
  for (const ChatExample& ex : examples) {
    Json line;
    try {
      if (ex.format == ChatFormat::conversational) {
        line["text"] = render_messages(t, ex.messages, ex.tools, add_generation_prompt);
      } else if (ex.format == ChatFormat::prompt_completion && ex.prompt.is_array()) {
        Json all = ex.prompt;
        for (const auto& m : ex.completion) all.push_back(m);
        line["text"] = render_messages(t, all, nullptr, add_generation_prompt);
      } else {
        line["text"] = render_example(t, ex, "all", o.data_path).text;
      }
    } catch (const UserError& e) {
      line = {{"error", e.what()}};
      status = 1;
    }
    std::fprintf(out, "%s\n", jinja::python_json(line).c_str());
  }
  return status;
}

}  // namespace loom
