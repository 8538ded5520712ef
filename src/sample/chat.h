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
// generation_config.json. When what the template writes after an assistant message is several
// tokens, the reply ends where its decoded text holds it (a stop string, as transformers'
// generate(stop_strings=...)), and that text and any after it are neither printed nor kept in
// the reply.
// Turn k (from 0) samples with seed + k.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/chat_data.h"
#include "data/tokenizer.h"
#include "sample/sample.h"

namespace loom {

// A stop string matched against the tail of the decoded text.
class StopString {
 public:
  explicit StopString(std::string text) : stop_(std::move(text)) {}
  // Where the stop string begins in `text` (npos when it is not there or empty): a token may
  // carry text past its end.
  size_t find(const std::string& text) const;
  // How many bytes at the end of `text` could be the start of the stop string: held back from
  // the output until the next tokens tell.
  size_t held(const std::string& text) const;

 private:
  std::string stop_;
};

// Answers o.chat, or every non-empty line of o.in when it is "-", with `s` (its parameters
// loaded), writing each reply and a newline to o.out. `dir` holds the checkpoint's files. No
// template (neither --template nor dir/tokenizer_config.json with one) is a UserError naming the
// checkpoint and both fixes; template errors are UserErrors naming it. Returns 0.
int run_chat(const SampleOptions& o, const std::string& dir, const Tokenizer& tok, Sampler& s);

}  // namespace loom
