// Run configuration: TOML files with the tutorials' key names, overridable on the command line
// as `section.key=value`. Every key is declared once in the schema (config.cpp) with its type,
// default and help text; unknown keys, wrong types and inconsistent values are UserErrors that
// name the key (and the file) and say how to fix it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom {

struct ModelConfig {
  std::string kind = "mlp_classifier";  // mlp_classifier
  DType dtype = DType::f32;             // compute dtype of activations
  int64_t hidden_size = 256;
  int64_t num_classes = 100;
  double dropout_rate = 0.0;
  double layer_norm_eps = 1e-6;  // Flax's LayerNorm default
};

struct OptimizerConfig {
  std::string name = "adam";
  double learning_rate = 1e-3;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int64_t num_minibatches = 1;
};

struct DataConfig {
  std::string kind = "random_classification";  // the tutorial's fixed random batch
  int64_t batch_size = 512;
  int64_t num_inputs = 128;
};

struct TrainConfig {
  int64_t steps = 5;
  int64_t log_every = 1;
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
