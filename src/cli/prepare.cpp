// `loom prepare char|gpt2 INPUT OUTDIR [--val-fraction F] [--vocab DIR]` and
// `loom prepare hf TOKENIZER_JSON INPUT OUTDIR` (or `hf INPUT OUTDIR --tokenizer PATH`)
// (data/prepare.h), and `loom prepare chat MODEL_DIR DATA.jsonl OUTDIR` (data/chat_data.h).
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "data/chat_data.h"
#include "data/prepare.h"

namespace loom::cli {

namespace {
std::vector<std::string> tokenizer_kind_names() {
  std::vector<std::string> names;
  for (const ChoiceInfo& c : choices_of(TokenizerKind{})) names.emplace_back(c.name);
  return names;
}

struct PrepareArgs {
  std::string tokenizer, vocab, hf_tokenizer;
  std::string chat_template, loss_on, eos_token;  // chat
  bool render_only = false, add_generation_prompt = false;
  std::vector<std::string> paths;  // [TOKENIZER_JSON] INPUT OUTDIR
  double val_fraction = 0.1;
  int64_t block_size = 1024;  // chat: the packing report's rows
};
}  // namespace

CommandBody add_prepare_command(CLI::App& sub) {
  auto a = std::make_shared<PrepareArgs>();
  std::vector<std::string> kinds = tokenizer_kind_names();
  kinds.emplace_back("chat");
  sub.add_option(
         "tokenizer", a->tokenizer,
         "char (sorted unique characters), gpt2 (GPT-2's byte-level BPE files) or hf (a Hugging Face "
         "tokenizer.json with a BPE model: byte-level or SentencePiece-style), or chat (JSON Lines chat/instruction "
         "data rendered with a model's chat template)")
      ->required()
      ->check(CLI::IsMember(kinds));
  sub.add_option("paths", a->paths,
                 "INPUT (UTF-8 text file) and OUTDIR; for hf: TOKENIZER_JSON INPUT OUTDIR; for chat: MODEL_DIR "
                 "DATA.jsonl OUTDIR")
      ->required()
      ->expected(2, 3)
      ->transform(home_path());
  sub.add_option("--val-fraction", a->val_fraction, "fraction of the text held out for validation (default 0.1)");
  sub.add_option("--block-size", a->block_size,
                 "chat: the data.seq_len to report the packing efficiency at (share of non-padding tokens with and "
                 "without data.packing; default 1024, TRL's max_length)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--vocab", a->vocab, "gpt2: directory with encoder.json and vocab.bpe")->transform(home_path());
  sub.add_option("--tokenizer", a->hf_tokenizer, "hf: tokenizer.json, or a directory holding it")
      ->transform(home_path());
  sub.add_option("--template", a->chat_template, "chat: a Jinja chat template file instead of the model's")
      ->transform(home_path());
  sub.add_option("--loss-on", a->loss_on,
                 "chat: the training targets: assistant (conversational default), completion (prompt-completion "
                 "default) or all")
      ->check(CLI::IsMember({"all", "completion", "assistant"}));
  sub.add_option("--eos-token", a->eos_token,
                 "chat: the end-of-text token appended to plain text and string completions (default: the model's "
                 "eos_token, as TRL's)");
  sub.add_flag("--render-only", a->render_only,
               "chat: print each example as the template renders it, one JSON line each, and write nothing "
               "(MODEL_DIR DATA.jsonl)");
  sub.add_flag("--add-generation-prompt", a->add_generation_prompt,
               "chat --render-only: render with add_generation_prompt=true");
  return [a] {
    std::vector<std::string> p = a->paths;
    if (a->tokenizer == "chat") {
      const size_t want = a->render_only ? 2 : 3;
      if (p.size() != want)
        throw UserError(
            "prepare chat",
            a->render_only ? "--render-only takes MODEL_DIR DATA.jsonl" : "takes MODEL_DIR DATA.jsonl OUTDIR",
            "e.g. loom prepare chat models/SmolLM2-135M-Instruct chats.jsonl data/chats");
      ChatOptions o{p[0], p[1], a->render_only ? std::string() : p[2], a->chat_template, a->loss_on, a->val_fraction};
      o.block_size = a->block_size;
      o.eos_token = a->eos_token;
      return a->render_only ? run_render_chat(o, a->add_generation_prompt) : run_prepare_chat(o);
    }
    const TokenizerKind kind = parse_choice_or_throw<TokenizerKind>(a->tokenizer, "prepare");
    const bool hf = kind == TokenizerKind::hf;
    std::string vocab = hf ? a->hf_tokenizer : a->vocab;
    if (hf && p.size() == 3) {
      if (!vocab.empty())
        throw UserError("--tokenizer", "is given twice: as --tokenizer and as the first of three paths",
                        "give either loom prepare hf TOKENIZER_JSON INPUT OUTDIR or hf INPUT OUTDIR --tokenizer PATH");
      vocab = p[0];
      p.erase(p.begin());
    }
    if (p.size() != 2)
      throw UserError("prepare " + a->tokenizer,
                      "takes INPUT OUTDIR" + std::string(hf ? " (after TOKENIZER_JSON)" : ""),
                      "e.g. loom prepare char data/tinyshakespeare.txt data/shakespeare_char");
    return run_prepare(kind, p[0], p[1], a->val_fraction, vocab);
  };
}

}  // namespace loom::cli
