// Run configuration: TOML files with the tutorials' key names, overridable on the command line
// as `section.key=value`. Every key is declared once, in the table of the room that owns it
// (core/config_key.h rows: model.* in nn/config_keys.h, optimizer.* in optim/config.h, data.* in
// data/config.h, train.* in train/train_keys.cpp, seed, device and threads in config.cpp) with its
// type, default and help text, and the room checks its own keys beside its table; unknown keys,
// wrong types and inconsistent values are UserErrors that name the key (and the file) and say how
// to fix it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "core/choice.h"
#include "data/config.h"
#include "nn/config.h"
#include "optim/config.h"

#define LOOM_ON_NONFINITE(X)                                                                                \
  X(stop, "end the run with a message, keeping the last good checkpoint (a diverged state is never saved)") \
  X(skip, "drop that step's update, count it, and go on (train.max_skipped_steps still applies)")

namespace loom {

LOOM_CHOICE(OnNonFinite, "non-finite policy", LOOM_ON_NONFINITE)

struct TrainConfig {
  int64_t steps = 5;
  int64_t log_every = 1;
  std::string metrics_file;         // JSONL, one object per logged step ("" = none; runs write RUN/metrics.jsonl)
  bool tensorboard = false;         // also a TensorBoard event file in the run directory
  int64_t eval_interval = 0;        // evaluate every N steps (0 = never; needs data.kind = tokens)
  int64_t eval_iters = 20;          // validation batches per evaluation (plain token data; chat data: one pass)
  int64_t checkpoint_interval = 0;  // save every N steps (0 = at evaluations and at the end)
  int64_t keep_last = 3;            // checkpoints kept (plus best/)
  int64_t sample_tokens = 0;        // print a sample of this many tokens at the end (0 = none)
  OnNonFinite on_nonfinite = OnNonFinite::stop;
  int64_t max_skipped_steps = 25;  // stop after this many skipped steps in a row, any dtype (0 = never)
  int64_t bucket_kib = 4096;       // gradient buckets summed over ranks during the backward (train/trainer.h)
  std::string memory_budget;       // model.remat = auto fits this ("20GiB"; "" = what the fit check allows)
  // Seconds a rank waits for the others in a collective (dist::Comm::set_timeout).
  double collective_timeout = 300;
};

// The train.* keys (core/config_key.h rows; train/train_keys.cpp), in `loom help config` order.
const std::vector<KeySpec<TrainConfig>>& train_keys();
// The checks of train.* alone: a UserError naming the key.
void validate_train(const TrainConfig& c);

struct Config {
  uint64_t seed = 0;
  Device device = Device::auto_;
  int64_t threads = 0;  // 0 = all cores
  ModelConfig model;
  OptimizerConfig optimizer;
  DataConfig data;
  TrainConfig train;
  std::string source;  // the file it came from (for messages)
};

// Path keys (data.dir, train.metrics_file, model.init_from): a relative path set in a config file is relative to
// that file's directory, one set by an override to the current directory; `~` and `~/...` are the
// home directory. Both become absolute when read, so the saved configuration (config.toml, a
// checkpoint's state) names the same files from anywhere. A checkpoint's stored configuration
// keeps what it holds (older ones hold paths relative to where that run was started): an empty
// `base` leaves a relative path relative.
std::string resolve_path(const std::string& path, const std::filesystem::path& base);

// Loads `path` (TOML), applies `overrides` ("section.key=value"), takes the architecture keys of
// model.init_from when set (train/model_source.h: keys the file or the overrides do not give are
// set from it; a given key that contradicts it is a UserError naming both values), validates.
// Throws UserError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// A configuration from TOML text (a checkpoint's stored config, whose model.init_from was resolved
// when it was made and is not read again); `source` names it in messages.
Config config_from_toml_text(const std::string& text, const std::string& source,
                             const std::vector<std::string>& overrides = {});
// The defaults with overrides applied (no file), and model.init_from as load_config does.
Config default_config(const std::vector<std::string>& overrides = {});
// Applies one override to `c` (exposed for tests).
void apply_override(Config& c, const std::string& assignment);
// Every room's checks of its own keys (model, optimizer, data, train: positive sizes, ...), then
// the checks across rooms (batch divisible by minibatches, ...). Throws UserError naming the file
// and the key.
void validate_config(const Config& c);
// Every key with its current value, as TOML text (for logs and checkpoint sidecars).
std::string config_to_toml(const Config& c);
// Help text: every key, its type, default and meaning.
std::string config_help();
// Every key and its type column ("int", "number", "bool", "string", "size", "dtype", "choice", "choices"), for tests.
struct ConfigKeyInfo {
  std::string key, type;
  std::vector<std::string> choices;  // a choice key's names
};
std::vector<ConfigKeyInfo> config_keys();
// The shape of one minibatch of `minibatch` examples as c's model reads it (from data.*).
ModelInput model_input(const Config& c, int64_t minibatch);
// The facts outside `data.*` that c's data source needs (seed, classes, vocabulary, minibatches).
DataContext data_context(const Config& c);

}  // namespace loom
