// The tokens that end an assistant's turn, for a model with a chat template: where `loom sample
// --chat` stops (sample/chat.h), and what `loom export hf` lists as generation_config.json's
// eos_token_id, so that transformers' generate() stops there too (train/hf_export.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_data.h"
#include "data/jinja.h"
#include "data/tokenizer.h"

namespace loom {

// In order, each once and only where the tokenizer encodes it as one token: what the template
// writes after an assistant message's content (`<|im_end|>`, `<|eot_id|>`,
// `<end_of_turn>`, `</s>`: found by rendering a probe conversation, not from a list of names),
// tokenizer_config.json's eos_token, and `generation_config`'s eos_token_id (one or a list; the
// parsed generation_config.json, or null when there is none).
std::vector<int32_t> end_of_turn_ids(const ChatTemplate& t, const jinja::Json& generation_config, const Tokenizer& tok);

// What the template writes after an assistant message's content (trimmed) when the tokenizer
// encodes it as several tokens ("" otherwise): `loom sample --chat` then ends a reply where its
// text holds it, as transformers' stop strings end generate(); no single eos id can say it.
std::string end_of_turn_text(const ChatTemplate& t, const Tokenizer& tok);

}  // namespace loom
