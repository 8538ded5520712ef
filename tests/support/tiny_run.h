// Test support: a tiny language-model run on disk, as the run and dist tests drive it through the
// loom command: a char-level dataset prepared from a repeated line, and a small GPT config over it
// (attention-first blocks, tied embeddings, dropout, AdamW with clipping and a warmup-cosine
// schedule, 2 minibatches of batch 4 × 16 tokens, 20 steps, validation every 5).
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

#include "support/run_loom.h"

namespace loom::testing {

struct TinyRun {
  std::filesystem::path data, config;
  RunResult prepared;  // `loom prepare` of the text
};

inline TinyRun make_tiny_run(const std::filesystem::path& dir) {
  TinyRun t;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "To be, or not to be, that is the question. ";
  std::ofstream(dir / "text.txt") << text;
  t.data = dir / "data";
  t.prepared = run_loom("prepare char " + (dir / "text.txt").string() + " " + t.data.string());
  t.config = dir / "tiny.toml";
  std::ofstream(t.config) << R"(seed = 7
[model]
kind = "transformer"
block_order = "attn_first"
hidden_size = 32
num_layers = 2
head_dim = 8
vocab_size = 20
num_outputs = 20
max_seq_len = 16
dropout_rate = 0.1
use_bias = false
tie_embeddings = true
init = "gpt2"
[optimizer]
name = "adamw"
learning_rate = 3e-3
weight_decay = 0.1
clip_norm = 1.0
schedule = "warmup_cosine_decay"
warmup_steps = 5
decay_steps = 20
end_value = 1e-4
num_minibatches = 2
[data]
kind = "tokens"
dir = ")" + t.data.string() + R"("
batch_size = 4
seq_len = 16
[train]
steps = 20
log_every = 1
eval_interval = 5
eval_iters = 3
)";
  return t;
}

}  // namespace loom::testing
