// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, SmolLM, Llama 3, Qwen2 and
// their kin), encoding exactly as the `tokenizers` library does with add_special_tokens=False:
// a training corpus gets no BOS/EOS added by the post-processor; special tokens written in the
// text ("<|endoftext|>") are matched as tokens.
//
// What loom reads (anything else is a UserError naming the field and what loom supports):
//   model          "BPE" without dropout, byte_fallback, continuing_subword_prefix or
//                  end_of_word_suffix; "merges" as "a b" strings or ["a", "b"] pairs;
//                  "ignore_merges" (Llama 3) honoured; vocab + added tokens must be ids 0..N-1
//   added_tokens   all matched literally in the text (leftmost, longest); single_word, lstrip
//                  and rstrip must be false
//   normalizer     null, or NFC (Qwen2) — loom does not normalize, it checks that the text is
//                  already in NFC (nfc_quick_check) and refuses text that is not or may not be
//   pre_tokenizer  ByteLevel (add_prefix_space false, with or without use_regex), alone or last
//                  in a Sequence after Split (a Regex or String pattern, behavior Isolated, not
//                  inverted) and Digits steps (individual_digits splits like \p{N}, otherwise
//                  like \p{N}+); patterns run on data/regex.h's matcher
//   decoder        null or ByteLevel
//   post_processor only read for the start token of `loom sample` (start_id): the first
//                  SpecialToken of a TemplateProcessing's "single" template (Llama 3's
//                  <|begin_of_text|>), else the added token "<|endoftext|>" (GPT-2, SmolLM, Qwen2)
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer.h"

namespace loom {

class HfTokenizer final : public BpeTokenizer {
 public:
  // From the parsed tokenizer.json; `subject` (its path) names it in errors.
  HfTokenizer(nlohmann::json tokenizer_json, const std::string& subject);
  // `path` is a tokenizer.json or a directory holding one. A missing, unreadable or malformed
  // file is a UserError naming it.
  static std::unique_ptr<HfTokenizer> load(const std::string& path);

  TokenizerKind kind() const override { return TokenizerKind::hf; }
  // {"kind": "hf", "vocab_size": V, "tokenizer": <the tokenizer.json object, unchanged>}
  nlohmann::json to_json() const override;
  const nlohmann::json& tokenizer_json() const { return json_; }

 private:
  nlohmann::json json_;
};

}  // namespace loom
