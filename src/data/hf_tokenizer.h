// A Hugging Face tokenizer.json with a BPE model, byte-level (GPT-2, SmolLM, Llama 3, Qwen2) or
// SentencePiece-style (Llama 2, TinyLlama, Mistral, Gemma), encoding and decoding exactly as the
// `tokenizers` library does with add_special_tokens=False and skip_special_tokens=False
// (data/tokenizer.h's BpeTokenizer says how): a training corpus gets no BOS/EOS added by the
// post-processor; added tokens written in the text ("<|endoftext|>", "[INST]") are matched.
//
// What loom reads (anything else is a UserError naming the field and what loom supports):
//   model          "BPE" without dropout, continuing_subword_prefix or end_of_word_suffix;
//                  byte_fallback, unk_token (which must be in the vocab), fuse_unk and
//                  ignore_merges honoured; "merges" as "a b" strings or ["a", "b"] pairs; vocab +
//                  added tokens must be ids 0..N-1
//   added_tokens   lstrip, rstrip and normalized honoured; single_word must be false
//   normalizer     null, Prepend, Replace (a String pattern), NFC (which loom checks rather than
//                  applies: it refuses text that is not, or may not be, in NFC), or a Sequence
//   pre_tokenizer  null, Metaspace (replacement, prepend_scheme or the legacy add_prefix_space,
//                  split), Split (a Regex pattern with behavior Isolated; a String pattern with
//                  Isolated, Removed, MergedWithPrevious or MergedWithNext; not inverted), Digits,
//                  ByteLevel (add_prefix_space false, with or without use_regex; the last step),
//                  or a Sequence; regex patterns run on data/regex.h's matcher
//   decoder        null (tokens joined by ' ', as the library does), ByteLevel, Replace (a String
//                  pattern), ByteFallback, Fuse, Strip, Metaspace, or a Sequence
//   post_processor only a TemplateProcessing's "single" template (also inside a Sequence): its
//                  SpecialTokens before the sequence are leading_special_ids() (Llama's <s>,
//                  Gemma's <bos>, Llama 3's <|begin_of_text|>), the first of them the start
//                  token of `loom sample` (start_id), else the added token "<|endoftext|>"
//                  (GPT-2, SmolLM, Qwen2); tokens after the sequence are not added
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer.h"

namespace loom {

class HfTokenizer final : public BpeTokenizer {
 public:
  // The files of a Hugging Face model directory that travel with its tokenizer, so that an export
  // (train/hf_export.h) gives back the chat format and the generation defaults: transformers'
  // apply_chat_template reads the chat template (chat_template.jinja, which transformers 5
  // writes, or tokenizer_config.json's "chat_template") and the special tokens.
  static constexpr const char* kCompanionFiles[] = {"tokenizer_config.json", "special_tokens_map.json",
                                                    "chat_template.jinja", "generation_config.json"};

  // From the parsed tokenizer.json and the companion files found beside it ({file name: its text,
  // unchanged}, names from kCompanionFiles); `subject` (its path) names it in errors.
  HfTokenizer(nlohmann::json tokenizer_json, const std::string& subject,
              nlohmann::json companions = nlohmann::json::object());
  // `path` is a tokenizer.json or a directory holding one; the companion files in that directory
  // come along. A missing, unreadable or malformed file is a UserError naming it.
  static std::unique_ptr<HfTokenizer> load(const std::string& path);

  TokenizerKind kind() const override { return TokenizerKind::hf; }
  // {"kind": "hf", "vocab_size": V, "tokenizer": <the tokenizer.json object, unchanged>,
  //  "companions": {file name: text} (only when there are any)}
  nlohmann::json to_json() const override;
  std::vector<int32_t> leading_special_ids() const override { return leading_; }
  const nlohmann::json& tokenizer_json() const { return json_; }
  // {file name: text} of the companion files it came with (an empty object when none); the
  // .json ones hold a JSON object.
  const nlohmann::json& companions() const { return companions_; }
  // Replaces one of them (`name` from kCompanionFiles): `loom prepare chat --template FILE` makes
  // its template the one that travels.
  void set_companion(const std::string& name, std::string text);

 private:
  nlohmann::json json_;
  nlohmann::json companions_;
  std::vector<int32_t> leading_;  // leading_special_ids()
};

}  // namespace loom
