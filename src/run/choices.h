// `loom eval RUN --choices FILE.jsonl`: multiple-choice accuracy by log-likelihood, as
// lm-evaluation-harness scores HellaSwag, ARC, PIQA and the like.
//
// FILE holds one question per line: {"context": "...", "choices": ["...", ...], "label": i} (the
// index of the right choice; other keys are ignored). Each choice is the continuation exactly as
// written: lm-eval's target_delimiter (a space) is part of the choice or the context here. For
// each choice the model scores ll = Σ log p(continuation token | everything before it); as
// lm-eval's _encode_pair, white space at the end of the context moves to the start of the
// continuation, the context is encoded alone and context + continuation whole, and the
// continuation's tokens are the whole's after as many as the context has.
//   acc       the choice with the largest ll is the label (the first of equal ones wins)
//   acc_norm  the same with ll divided by the choice's length in characters (code points: lm-eval
//             divides by len() of the choice's Python string)
// A context too long for the model keeps its last tokens (the sampler's sliding window); the
// count of such questions is printed as a note and is "cut_contexts" in --json.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "sample/sample.h"

namespace loom {

struct ChoiceQuestion {
  std::string context;
  std::vector<std::string> choices;
  int64_t label = 0;
  int64_t line = 0;  // 1-based line in the file
};

// The questions of a JSON Lines file (blank lines skipped). A bad line is a UserError naming
// "PATH:LINE" and the field; an empty file too.
std::vector<ChoiceQuestion> read_choices(const std::string& path);

// Σ log p(cont[i] | ctx, cont[:i]) under the model of `s` (ctx non-empty), in double.
double continuation_loglikelihood(Sampler& s, std::span<const int32_t> ctx, std::span<const int32_t> cont);

// Per question: the log-likelihood of each choice, and whether acc and acc_norm count it.
struct ChoiceResult {
  std::vector<double> loglikelihoods;
  bool correct = false, correct_norm = false;
  bool cut = false;  // a choice's context + continuation did not fit the model: scored on a window
};
ChoiceResult score_question(Sampler& s, const Tokenizer& tok, const ChoiceQuestion& q, const std::string& where);

// `loom eval SOURCE --choices FILE`: SOURCE is a run, a checkpoint or a Hugging Face directory
// with its tokenizer. Prints acc and acc_norm (or one JSON object with `json`). Returns 0.
int run_choices(const std::string& source, const std::string& path, bool json, std::FILE* out);

}  // namespace loom
