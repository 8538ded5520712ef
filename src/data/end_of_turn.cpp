#include "data/end_of_turn.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace loom {

using jinja::Json;

namespace {

// The tokenizer's ids for `text`; none when it cannot encode it (a character outside the vocabulary).
std::vector<int32_t> encode_or_none(const Tokenizer& tok, const std::string& text) {
  try {
    return tok.encode(text);
  } catch (const UserError&) {
    return {};
  }
}

// What the template writes right after an assistant message's content, trimmed of white space
// ("" when the template raises on the probe or writes nothing there).
std::string after_assistant_turn(const ChatTemplate& t) {
  const std::string probe = "loom-end-of-turn-probe";
  const Json messages =
      Json::array({{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", probe}}});
  std::string text;
  try {
    text = render_messages(t, messages, Json(nullptr), false);
  } catch (const UserError&) {
    return {};
  }
  const size_t at = text.rfind(probe);
  if (at == std::string::npos) return {};
  const std::string rest = text.substr(at + probe.size());
  const size_t first = rest.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  return rest.substr(first, rest.find_last_not_of(" \t\r\n") + 1 - first);
}

}  // namespace

std::vector<int32_t> end_of_turn_ids(const ChatTemplate& t, const Json& generation_config, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  const auto add = [&](int32_t id) {
    if (id >= 0 && id < tok.vocab_size() && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  if (const std::vector<int32_t> m = encode_or_none(tok, after_assistant_turn(t)); m.size() == 1) add(m[0]);
  if (const std::vector<int32_t> e = encode_or_none(tok, t.eos_token); e.size() == 1) add(e[0]);
  if (generation_config.is_object() && generation_config.contains("eos_token_id")) {
    const Json& e = generation_config["eos_token_id"];
    for (const Json& v : e.is_array() ? e : Json::array({e}))
      if (v.is_number_integer()) add(v.get<int32_t>());
  }
  return ids;
}

std::string end_of_turn_text(const ChatTemplate& t, const Tokenizer& tok) {
  const std::string text = after_assistant_turn(t);
  return encode_or_none(tok, text).size() == 1 ? std::string() : text;
}

}  // namespace loom
