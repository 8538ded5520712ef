// The end-of-run summary of `loom train`: what the run reached and what it cost, each number
// named for what it is (nanoGPT and torchtitan users read the last loss and the validation loss,
// not an average over the whole run).
#pragma once
#include <cstdint>
#include <string>

#include "data/data.h"

namespace loom {

struct RunSummary {
  int64_t first_step = 1, last_step = 0;         // the steps this session ran (1-based, inclusive)
  int64_t total_steps = 0;                       // train.steps
  double last_loss = 0;                          // the training loss of the last step
  double last_val = -1, best_val = -1;           // -1: none (no evaluation, or no validation split)
  int64_t last_val_step = 0, best_val_step = 0;  // best_val_step 0: unknown (an older checkpoint)
  // Tokens (language models: the examples' tokens, padding left out) or examples trained on, and
  // the training targets among them: over the whole run, and over this session's steps.
  TokenCounts run_trained, session_trained;
  bool tokens = true;                                     // items are tokens (else examples)
  double wall_s = 0, step_s = 0, eval_s = 0, save_s = 0;  // this session: all, steps, evaluation, checkpoints
};

// "run summary (steps 1-2000 of 2000)" and one line per figure.
std::string format_run_summary(const RunSummary& s);

}  // namespace loom
