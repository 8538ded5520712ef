// `loom prepare char|gpt2|hf INPUT OUTDIR [--val-fraction 0.1] [--vocab DIR | --tokenizer PATH]`: the command body,
// for the CLI to call. It turns a text file into a token data directory (train.bin, val.bin,
// meta.json; see data/token_data.h) and prints a short summary, as nanoGPT's prepare.py does.
#pragma once
#include <cstdio>
#include <string>

#include "data/tokenizer.h"

namespace loom {

// Runs prepare_dataset(kind, input, out_dir, val_fraction, vocab) and prints the vocab size, the
// train/val token counts, the token format and the files written to `out`. Returns 0 (the exit status);
// every problem is a UserError from prepare_dataset, for the CLI to print.
int run_prepare(TokenizerKind kind, const std::string& input, const std::string& out_dir, double val_fraction,
                const std::string& vocab, FILE* out = stdout);

}  // namespace loom
