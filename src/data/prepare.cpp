#include "data/prepare.h"

#include "data/token_data.h"

namespace loom {
namespace {

// 1003854 -> "1,003,854", as nanoGPT prints its counts.
std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  if (v < 0) out.insert(out.begin(), '-');
  return out;
}

}  // namespace

int run_prepare(TokenizerKind kind, const std::string& input, const std::string& out_dir, double val_fraction,
                const std::string& vocab, FILE* out) {
  const PreparedDataset r = prepare_dataset(kind, input, out_dir, val_fraction, vocab);
  std::fprintf(out, "prepared %s with the %s tokenizer\n", input.c_str(), std::string(choice_name(kind)).c_str());
  std::fprintf(out, "  length of text in characters: %s\n", with_commas(r.characters).c_str());
  std::fprintf(out, "  vocab size: %s\n", with_commas(r.vocab_size).c_str());
  std::fprintf(out, "  train has %s tokens\n", with_commas(r.train_tokens).c_str());
  std::fprintf(out, "  val has %s tokens\n", with_commas(r.val_tokens).c_str());
  std::fprintf(out, "  token files: %s\n", r.format.c_str());
  std::fprintf(out, "  wrote %s, %s, %s\n", r.train_path.c_str(), r.val_path.c_str(), r.meta_path.c_str());
  return 0;
}

}  // namespace loom
