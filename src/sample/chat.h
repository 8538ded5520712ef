// Chatting with a model: `loom sample RUN --chat MESSAGE`, or `--chat -` for a conversation read
// from stdin, one user message per line. Each turn renders the whole conversation with the
// model's chat template (data/chat_data.h: transformers' apply_chat_template with
// add_generation_prompt), tokenizes it, and generates the reply (sample/sample.h's sampling) until
// an end-of-turn token or o.tokens tokens. The reply is streamed to the output and joins the
// conversation as the assistant's message, so later turns see it. The Sampler feeds only what its
// caches do not hold when the new context extends the previous one (it does whenever the template
// renders earlier turns as they were and the reply re-tokenizes to the tokens drawn).
//
// The template: --template FILE, else the checkpoint directory's chat_template.jinja or
// tokenizer_config.json (data/chat_data.h's load_chat_template: a Hugging Face model's own; a loom
// checkpoint's, carried by its tokenizer from `loom prepare chat` or `loom prepare hf`).
// The end-of-turn tokens: data/end_of_turn.h's, with the checkpoint directory's
// generation_config.json.
// Turn k (from 0) samples with seed + k.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/chat_data.h"
#include "data/tokenizer.h"
#include "sample/sample.h"

namespace loom {

// Answers o.chat, or every non-empty line of o.in when it is "-", with `s` (its parameters
// loaded), writing each reply and a newline to o.out. `dir` holds the checkpoint's files. No
// template (neither --template nor dir/tokenizer_config.json with one) is a UserError naming the
// checkpoint and both fixes; template errors are UserErrors naming it. Returns 0.
int run_chat(const SampleOptions& o, const std::string& dir, const Tokenizer& tok, Sampler& s);

}  // namespace loom
