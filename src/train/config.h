// Run configuration: TOML files with the tutorials' key names, overridable on the command line
// as `section.key=value`. Every key is declared once in the schema (config.cpp) with its type,
// default and help text; unknown keys, wrong types and inconsistent values are UserErrors that
// name the key (and the file) and say how to fix it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "train/schedule.h"

namespace loom {

struct ModelConfig {
  std::string kind = "mlp_classifier";  // mlp_classifier | transformer
  DType dtype = DType::f32;             // compute dtype of activations
  int64_t hidden_size = 256;
  int64_t num_classes = 100;  // mlp_classifier
  double dropout_rate = 0.0;
  double layer_norm_eps = 1e-6;  // Flax's LayerNorm default
  // transformer (the Part 1.2 tutorial's keys)
  int64_t num_layers = 2;
  int64_t head_dim = 64;
  int64_t mlp_expansion = 4;
  int64_t vocab_size = 2048;
  int64_t num_outputs = 2048;
  int64_t max_seq_len = 512;
  DType softmax_dtype = DType::f32;
  bool causal_mask = true;
  std::string remat;                  // "", "none", or comma-separated MLP, Attn, Block
  std::string remat_policy = "nothing_saveable";
  std::string remat_save_names;       // save_only_these_names: comma-separated scope patterns
  bool scan_layers = false;           // parameter layout only: stacked [num_layers, ...] in files
  std::string block_order = "mlp_first";  // mlp_first (the tutorial) | attn_first (GPT-2)
  bool use_bias = true;
  bool tie_embeddings = false;
  std::string init = "flax";  // flax (the tutorial) | gpt2
  bool embed_dropout = false;
};

// optax.chain(clip_by_global_norm(clip_norm), <name>(schedule)) — clipping first when
// clip_norm > 0, then the optimizer with the learning-rate schedule.
struct OptimizerConfig {
  std::string name = "adam";  // sgd | adam | adamw
  double learning_rate = 1e-3;  // constant rate, or the schedule's peak_value
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, eps_root = 0.0;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  double weight_decay = 1e-4;  // adamw (Optax's default)
  std::string weight_decay_mask = "all";  // all | kernels (no biases, norms, embeddings) | ndim2 (nanoGPT)
  double clip_norm = 0.0;  // clip_by_global_norm before the optimizer; 0 = off
  int64_t num_minibatches = 1;
  ScheduleSpec schedule;  // kind constant uses learning_rate
  // float16 loss scaling (PyTorch GradScaler semantics); ignored for float32 / bfloat16.
  std::string loss_scale = "dynamic";  // dynamic | static | none
  double loss_scale_init = 65536.0;
  double loss_scale_growth = 2.0;
  double loss_scale_backoff = 0.5;
  int64_t loss_scale_interval = 2000;
};

struct DataConfig {
  std::string kind = "random_classification";  // random_classification | random_tokens | tokens
  std::string dir;            // tokens: a directory written by `loom prepare`
  int64_t batch_size = 512;
  int64_t num_inputs = 128;   // random_classification
  int64_t seq_len = 512;      // random_tokens
  int64_t vocab_size = 2048;  // random_tokens: tokens in [1, vocab_size)
};

struct TrainConfig {
  int64_t steps = 5;
  int64_t log_every = 1;
  std::string metrics_file;  // JSONL, one object per logged step ("" = none; runs write RUN/metrics.jsonl)
  int64_t eval_interval = 0;  // evaluate every N steps (0 = never; needs data.kind = tokens)
  int64_t eval_iters = 20;    // validation batches per evaluation
  int64_t checkpoint_interval = 0;  // save every N steps (0 = at evaluations and at the end)
  int64_t keep_last = 3;      // checkpoints kept (plus best/)
  int64_t sample_tokens = 0;  // print a sample of this many tokens at the end (0 = none)
};

struct Config {
  uint64_t seed = 0;
  std::string device = "auto";  // auto | cpu | reference
  int64_t threads = 0;          // 0 = all cores
  ModelConfig model;
  OptimizerConfig optimizer;
  DataConfig data;
  TrainConfig train;
  std::string source;  // the file it came from (for messages)
};

// Loads `path` (TOML), applies `overrides` ("section.key=value"), validates. Throws UserError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// A configuration from TOML text (a checkpoint's stored config); `source` names it in messages.
Config config_from_toml_text(const std::string& text, const std::string& source,
                             const std::vector<std::string>& overrides = {});
// The defaults with overrides applied (no file).
Config default_config(const std::vector<std::string>& overrides = {});
// Applies one override to `c` (exposed for tests).
void apply_override(Config& c, const std::string& assignment);
// Cross-key checks (batch divisible by minibatches, positive sizes, ...). Throws UserError.
void validate_config(const Config& c);
// Every key with its current value, as TOML text (for logs and checkpoint sidecars).
std::string config_to_toml(const Config& c);
// Help text: every key, its type, default and meaning.
std::string config_help();

}  // namespace loom
