// `loom prepare char|gpt2 INPUT OUTDIR [--val-fraction F] [--vocab DIR]` and
// `loom prepare hf TOKENIZER_JSON INPUT OUTDIR` (or `hf INPUT OUTDIR --tokenizer PATH`)
// (data/prepare.h).
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
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
  std::vector<std::string> paths;  // [TOKENIZER_JSON] INPUT OUTDIR
  double val_fraction = 0.1;
};
}  // namespace

CommandBody add_prepare_command(CLI::App& sub) {
  auto a = std::make_shared<PrepareArgs>();
  sub.add_option("tokenizer", a->tokenizer,
                 "char (sorted unique characters), gpt2 (GPT-2's byte-level BPE files) or hf (a Hugging Face "
                 "tokenizer.json with a BPE model: byte-level or SentencePiece-style)")
      ->required()
      ->check(CLI::IsMember(tokenizer_kind_names()));
  sub.add_option("paths", a->paths, "INPUT (UTF-8 text file) and OUTDIR; for hf: TOKENIZER_JSON INPUT OUTDIR")
      ->required()
      ->expected(2, 3)
      ->transform(home_path());
  sub.add_option("--val-fraction", a->val_fraction, "fraction of the text held out for validation (default 0.1)");
  sub.add_option("--vocab", a->vocab, "gpt2: directory with encoder.json and vocab.bpe")->transform(home_path());
  sub.add_option("--tokenizer", a->hf_tokenizer, "hf: tokenizer.json, or a directory holding it")
      ->transform(home_path());
  return [a] {
    const TokenizerKind kind = parse_choice_or_throw<TokenizerKind>(a->tokenizer, "prepare");
    const bool hf = kind == TokenizerKind::hf;
    std::vector<std::string> p = a->paths;
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
