// Chat and instruction data: `loom prepare chat MODEL_DIR DATA.jsonl OUTDIR` reads JSON Lines in
// the three formats TRL's SFTTrainer accepts, renders conversations with the model's chat
// template (data/jinja.h), tokenizes them with the model's tokenizer.json, and stores beside the
// tokens a loss mask and the examples' boundaries.
//
// Input, one JSON object per line (blank lines are skipped; other keys are ignored):
//   conversational     {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...],
//                       "tools": [...] (optional, given to the template)}
//   prompt-completion  {"prompt": "...", "completion": "..."}, or both lists of messages
//   text               {"text": "..."}
// Every line has the same format. A bad line is a UserError naming "FILE:LINE" and the field.
//
// Rendering, as transformers' apply_chat_template and TRL do:
//   conversational     template(messages); the variables are messages, tools (null when the line
//                      has none), documents (null), add_generation_prompt, and the special tokens
//                      of tokenizer_config.json, else special_tokens_map.json (bos_token, ...)
//   prompt-completion  strings: prompt + completion + eos_token (TRL appends the EOS when the
//                      completion does not end with it); messages: template(prompt + completion)
//   text               text + eos_token (likewise only when the text does not end with it)
// The rendered text is tokenized whole. Text and string prompt-completion examples get the
// tokenizer's leading special tokens (Tokenizer::leading_special_ids: Llama's and Gemma's BOS) in
// front, as TRL's tokenization with add_special_tokens does; rendered templates write their own. Only data
// with messages needs a template; text and string prompt-completion data need only the
// eos_token (resolve_eos_token).
//
// Loss masks (which tokens are training targets), `loss_on`:
//   assistant   (conversational default) the assistant turns. A template with {% generation %}
//               blocks marks them itself: the targets are exactly the bytes rendered inside the
//               blocks (transformers' return_assistant_tokens_mask; such a template may rewrite
//               earlier turns, as Qwen3's drops their reasoning). Otherwise a turn's text is
//               found by rendering prefixes, as TRL does for templates without generation
//               blocks: turn i spans from the end of template(messages[:i], add_generation_prompt=true)
//               to the end of template(messages[:i+1]); both must be prefixes of the whole
//               rendering, otherwise it is a UserError (the template rewrites earlier turns when
//               later ones come; use --loss-on all).
//   completion  (prompt-completion default) the completion and its EOS
//   all         (text's only choice) every token
// A token is a target when any of its bytes lies in a target span.
//
// S_mask.bin always marks the format's targets (assistant / completion / all for text), whatever
// --loss-on says: --loss-on is the default recorded in meta.json, and a run picks its targets with
// data.loss_on (data/config.h) from the stored mask:
//   auto        the recorded loss_on
//   all         every token of every example (the mask is not read; padding is never a target)
//   assistant   the mask, on conversational data only
//   completion  the mask, on prompt-completion data only
// A choice the data's format has not is a UserError naming data.loss_on. With --loss-on all and a
// template that hides the assistant turns (see above) the mask marks every token and meta.json
// says so ("mask_on": "all"); data.loss_on = assistant on it is a UserError. Data written before
// "mask_on" existed marks what its loss_on says (all ones for "all") and trains as it did.
//
// The output directory holds token_data.h's train.bin, val.bin and meta.json (so every reader of
// token data reads it) and, per split S:
//   S_mask.bin  one byte per token of S.bin: 1 = a training target, 0 = context only
//   S_docs.bin  little-endian uint64 offsets, examples + 1 of them: example k is tokens
//               [docs[k], docs[k+1]) of S.bin (docs[0] = 0, the last = the token count)
// OUTDIR also holds the tokenizer's companion files (tokenizer_config.json, special_tokens_map.json,
// chat_template.jinja, generation_config.json: those the model directory has; --template FILE
// becomes chat_template.jinja), where a user and transformers look for the template.
// meta.json gains "chat": {"data_format", "loss_on", "mask_on", "template", "train_examples",
// "val_examples", "train_target_tokens", "val_target_tokens", "mask": "uint8",
// "docs": "uint64"}. The template travels with the data for `loom sample --chat` and exports: the
// tokenizer in meta.json carries the model directory's tokenizer_config.json,
// chat_template.jinja and generation_config.json (HfTokenizer::companions; --template FILE
// becomes its chat_template.jinja), and every checkpoint of a run on the data writes them out
// (train/checkpoint.h). Examples are split in file order: the first
// floor(n * (1 - val_fraction)) train, the rest val. Everything is written into a scratch
// directory beside OUTDIR and renamed into place, so an interrupted or failed run leaves OUTDIR as
// it was.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/jinja.h"
#include "data/packing.h"
#include "data/token_data.h"

namespace loom {

class Tokenizer;

enum class ChatFormat { conversational, prompt_completion, text };
const char* chat_format_name(ChatFormat f);

struct ChatExample {
  ChatFormat format = ChatFormat::text;
  jinja::Json messages;            // conversational
  jinja::Json tools;               // conversational: the line's "tools", or null
  jinja::Json prompt, completion;  // prompt-completion: two strings or two message lists
  std::string text;                // text
  int64_t line = 0;                // 1-based line in the file
};

// The examples of a JSON Lines file. `path` names it in errors ("PATH:LINE: field ...").
std::vector<ChatExample> read_chat_jsonl(const std::string& path);
// One line's example; `where` is "PATH:LINE" for errors.
ChatExample parse_chat_line(const std::string& line_text, const std::string& where);

// A model's chat template with the variables transformers gives it.
// A default ChatTemplate has no template (it renders every conversation as ""): enough for text
// and string prompt-completion data, which need only eos_token.
struct ChatTemplate {
  jinja::Template tmpl{std::string_view(), "no chat template"};
  jinja::Json specials = jinja::Json::object();  // {"bos_token": "<s>", "eos_token": "</s>", ...}
  std::string eos_token;  // appended to text and string completions; "" when the configs name none
  std::string source;     // where the template came from, for meta.json
  std::string text;       // the template's Jinja source
};
// From model_dir/tokenizer_config.json ("chat_template": a string, or a list of {"name",
// "template"} of which "default" is used; special tokens as strings or {"content": ...}), the
// template replaced by model_dir/chat_template.jinja when there is one (transformers 5 writes
// it), and by the file `template_path` when it is not empty. A missing config is only
// an error when `template_path` is empty (then the template must come from it).
// The special tokens missing from tokenizer_config.json come from special_tokens_map.json.
ChatTemplate load_chat_template(const std::string& model_dir, const std::string& template_path);

// The end-of-text token appended to text and string completions, as TRL's SFTTrainer does:
// `given` (--eos-token) when not empty, else the eos_token of model_dir's tokenizer_config.json
// (a string or {"content": ...}), else of special_tokens_map.json, else config.json's, else
// generation_config.json's eos_token_id (the first of a list) spelled by the tokenizer. `tok` is
// model_dir's tokenizer (loaded from model_dir when null and an id must be spelled). None of
// them, or a token the tokenizer does not encode as one id, is a UserError naming the files and
// --eos-token: TRL refuses an eos_token outside the vocabulary too, and text without an end
// trains a model that never stops.
std::string resolve_eos_token(const std::string& model_dir, const std::string& given, const Tokenizer* tok);

// template(messages) with transformers' variables; with `generation_spans`, also the byte ranges
// its {% generation %} blocks wrote (jinja::Template::render).
std::string render_messages(const ChatTemplate& t, const jinja::Json& messages, const jinja::Json& tools,
                            bool add_generation_prompt, jinja::Spans* generation_spans = nullptr);

// An example's text and its target spans (byte ranges [first, second) of text).
struct RenderedExample {
  std::string text;
  std::vector<std::pair<size_t, size_t>> targets;
  // Text and string prompt-completion examples are tokenized as TRL tokenizes them, with the
  // tokenizer's special tokens: its post-processor's leading ones (the BOS) go first, no target.
  // A template writes its own.
  bool add_special_tokens = false;
};
// `loss_on` is "all", "completion" or "assistant" (checked against the format: a UserError
// naming --loss-on otherwise). Template errors are UserErrors naming `where`.
RenderedExample render_example(const ChatTemplate& t, const ChatExample& ex, const std::string& loss_on,
                               const std::string& where);

// Token ids of the text and their mask (1 = target), per the rule above.
struct TokenizedExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};
TokenizedExample tokenize_example(const Tokenizer& tok, const RenderedExample& r);

struct ChatOptions {
  std::string model_dir;  // holds tokenizer.json and tokenizer_config.json
  std::string data_path;  // JSON Lines
  std::string out_dir;
  std::string template_path;  // replaces the config's chat_template when not empty
  std::string loss_on;        // "" = the format's default
  double val_fraction = 0.1;
  // The data.seq_len the data will be trained at, for the packing report (data/packing.h); 1024 is
  // TRL's default max_length.
  int64_t block_size = 1024;
  std::string eos_token = {};  // --eos-token: replaces the model's (resolve_eos_token)
};

struct PreparedChat {
  ChatFormat format = ChatFormat::text;
  std::string loss_on, token_format;
  std::string eos_token;  // appended to text and string completions ("" when the data has none)
  std::string mask_on;  // what S_mask.bin marks: the format's targets, or "all" (see above)
  int64_t vocab_size = 0;
  int64_t examples[2] = {0, 0};  // train, val
  int64_t tokens[2] = {0, 0};
  int64_t targets[2] = {0, 0};
  // At ChatOptions::block_size, per split: the rows of data.packing = true and false (their
  // efficiency: the share of non-padding positions) and the examples cut to the block.
  ExampleRows packed[2], padded[2];
  std::string out_dir;
};

// Reads, renders, tokenizes and writes (see above). UserErrors: the data, the template, the
// tokenizer, a val_fraction outside (0, 1), too few examples for both splits, an OUTDIR that holds
// files other than a data directory's.
PreparedChat prepare_chat(const ChatOptions& o);

// prepare_chat and a summary on `out` (examples, tokens, target tokens per split, the packing
// efficiency with and without data.packing at the block size). Returns 0.
int run_prepare_chat(const ChatOptions& o, FILE* out = stdout);

// `--render-only`: each example of the file rendered (conversational: template(messages);
// conversational prompt-completion: template(prompt + completion); strings: as above), one JSON
// line per example, {"text": "..."} or {"error": "..."} when the template raised or failed; no
// tokenizer.json is needed. Returns 0 when every example rendered, 1 otherwise.
int run_render_chat(const ChatOptions& o, bool add_generation_prompt, FILE* out = stdout);

// One split of a chat data directory, read and checked against each other and meta.json:
// S.bin as a TokenFile, S_mask.bin (one byte, 0 or 1, per token), S_docs.bin (uint64 offsets,
// 0 first, non-decreasing, the token count last), the target count of meta.json's "chat"; then
// `loss_on` (data.loss_on) resolved as above. A missing, short or inconsistent file is a
// UserError naming it.
struct ChatSplit {
  TokenFile tokens;
  std::vector<uint8_t> mask;  // [tokens.size()]; empty: every token is a target (loss_on "all")
  std::vector<int64_t> docs;  // [examples + 1]
  int64_t targets = 0;        // tokens marked as targets (ones in mask, or every token)
  std::string loss_on;        // what the run trains on: "all", "assistant" or "completion"
};
ChatSplit open_chat_split(const std::string& data_dir, const std::string& split, LossOn loss_on = LossOn::auto_);

}  // namespace loom
