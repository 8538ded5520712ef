// `loom prepare char|gpt2 INPUT OUTDIR [--val-fraction F] [--vocab DIR]` (data/prepare.h).
#include <memory>
#include <string>

#include "cli/command.h"
#include "data/prepare.h"

namespace loom::cli {

namespace {
struct PrepareArgs {
  std::string tokenizer, input, out_dir, vocab;
  double val_fraction = 0.1;
};
}  // namespace

CommandBody add_prepare_command(CLI::App& sub) {
  auto a = std::make_shared<PrepareArgs>();
  sub.add_option("tokenizer", a->tokenizer, "char (sorted unique characters) or gpt2 (byte-level BPE)")
      ->required()
      ->check(CLI::IsMember({"char", "gpt2"}));
  sub.add_option("input", a->input, "UTF-8 text file")->required()->transform(home_path());
  sub.add_option("outdir", a->out_dir, "output directory")->required()->transform(home_path());
  sub.add_option("--val-fraction", a->val_fraction, "fraction of the text held out for validation (default 0.1)");
  sub.add_option("--vocab", a->vocab, "gpt2: directory with encoder.json and vocab.bpe")->transform(home_path());
  return [a] { return run_prepare(a->tokenizer, a->input, a->out_dir, a->val_fraction, a->vocab); };
}

}  // namespace loom::cli
