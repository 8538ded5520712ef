// Checkpoints (docs/ARCHITECTURE.md, "Checkpoints"): a directory per save,
//   RUN/ckpt_<step>/model.safetensors   params by scope path (stacked per layer when
//                                       model.scan_layers), plus the optimizer moments under
//                                       "opt/mu/<path>" and "opt/nu/<path>"
//   RUN/ckpt_<step>/state.json          config (TOML text), step, optimizer count, loss-scaler
//                                       state, seed, validation data position, metrics so far
// Saving writes RUN/.ckpt_<step>.tmp/ and renames it into place, so a crash or a full disk never
// leaves a half-written checkpoint and never harms an earlier one; old checkpoints beyond
// keep_last are removed only after the new one is in place. RUN/best is the best validation loss
// so far (same layout).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "train/config.h"

namespace loom {

class Trainer;

struct CheckpointState {
  std::string config_toml;  // the run's effective configuration
  int64_t step = 0;         // optimizer steps completed
  int64_t opt_count = 0;    // Optax count (applied updates)
  double loss_scale = 1.0;
  int64_t scaler_tracker = 0, scaler_skipped = 0;
  uint64_t seed = 0;
  int64_t val_position = 0;
  double best_val_loss = -1;  // -1: none yet
};

struct Checkpoint {
  CheckpointState state;
  std::vector<StTensor> tensors;  // params and optimizer moments
  std::string path;               // the checkpoint directory
};

// Writes the trainer's parameters and optimizer state into `dir` atomically (and the data's
// tokenizer as tokenizer.json, when given, so `loom sample` can decode). Every rank of t.comm()
// calls it (sharded optimizer state is gathered); rank 0 alone writes.
void save_checkpoint(const Trainer& t, const CheckpointState& s, const std::string& dir,
                     const nlohmann::json* tokenizer = nullptr);
// Reads and validates a checkpoint directory (or a run directory: its latest checkpoint).
// Truncated/corrupted files, missing tensors or a bad state.json are UserErrors naming the file.
Checkpoint load_checkpoint(const std::string& path);
// Loads params and optimizer state into `t` (which must be built from a config whose model
// matches: otherwise a UserError naming the first differing model.* key). Each rank takes its
// part of sharded optimizer state, whatever the rank count that wrote the checkpoint.
void restore_checkpoint(Trainer& t, const Checkpoint& c);
// The latest ckpt_<step> directory in a run directory ("" if none).
std::string latest_checkpoint(const std::string& run_dir);
// Removes all but the newest `keep` ckpt_<step> directories.
void prune_checkpoints(const std::string& run_dir, int64_t keep);
// "section.key" -> value of a config_to_toml text.
std::map<std::string, std::string> config_values(const std::string& toml_text);
// The first key (in key order) starting with `prefix` ("model.", or "" for any) whose value
// differs between two config_to_toml texts; "" if none.
std::string first_config_difference(const std::string& a_toml, const std::string& b_toml,
                                    const std::string& prefix = "");

}  // namespace loom
