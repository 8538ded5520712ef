// Checkpoints (docs/ARCHITECTURE.md, "Checkpoints"): a directory per save,
//   RUN/ckpt_<step>/model.safetensors      the parameters alone, by scope path (stacked per layer
//                                          when model.scan_layers): usable without the rest
//   RUN/ckpt_<step>/optimizer.safetensors  the optimizer moments, "opt/mu/<path>", "opt/nu/<path>"
//   RUN/ckpt_<step>/state.json             config (TOML text), step, optimizer count, loss-scaler
//                                          state, seed, validation data position, best loss so far
//   RUN/ckpt_<step>/tokenizer.json         the data's tokenizer, when it has one
//   RUN/ckpt_<step>/tokenizer_config.json, chat_template.jinja, generation_config.json, ...
//                                          the files the tokenizer carries (HfTokenizer::companions)
// Every tensor carries its CRC-32C (io/safetensors.h), verified when it is read.
//
// Never losing work:
// - Saving streams tensors from the backend's buffers into RUN/.ckpt_<step>.tmp/ through one
//   kStreamBytes host buffer (io/safetensors.h), not a copy of the state; sharded optimizer state
//   reaches rank 0's buffer piece by piece from every rank (each stages its part of a piece in
//   kStreamBytes of its own), so no rank ever holds more of it than its shard. The file fsyncs,
//   then the directory is renamed into place; a crash or a full disk leaves the previous
//   checkpoints as they were.
// - Resuming checks the parameters and the moments as they stream past (checksums, finite values)
//   without keeping them; once the trainer is built, each rank reads what it holds of them (all of
//   a parameter it does not shard, its own slice of one it does) by offset, piece by piece into its
//   buffers. checkpoint_stream_bytes() is what either costs, counted by `loom memory` and the fit
//   check.
// - A state with a non-finite parameter is never written (save returns `nonfinite`), so every
//   checkpoint on disk is finite and pruning can never remove the last good one.
// - Replacing a directory (best/) exchanges the two atomically (renameat2 RENAME_EXCHANGE); pruning
//   first renames a checkpoint to .ckpt_<step>.del, so a kill mid-delete never leaves a half
//   checkpoint under a loadable name.
// - Where the file system refuses renameat2's flags (NFS, CephFS, 9p, FUSE; or LOOM_PLAIN_RENAME
//   is set) plain renames do it: one never replaces a non-empty directory, so a finished
//   checkpoint is never overwritten; a replacement moves the old one to .<name>.old first, and
//   remove_stale_checkpoint_files() puts it back if a kill came between the two renames.
// - Only loom's own checkpoint directory is ever replaced, pruned or removed: a save onto a user's
//   file, symbolic link or directory under a checkpoint's name fails naming it.
// - Format 1 checkpoints (moments inside model.safetensors) still load.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "runtime/executor.h"
#include "train/config.h"

namespace loom {

class Trainer;

struct CheckpointState {
  std::string config_toml;  // the run's effective configuration
  int64_t step = 0;         // optimizer steps completed
  int64_t opt_count = 0;    // Optax count (applied updates)
  double loss_scale = 1.0;
  int64_t scaler_tracker = 0, scaler_skipped = 0, scaler_consecutive = 0;
  uint64_t seed = 0;
  int64_t val_position = 0;
  double best_val_loss = -1;  // -1: none yet
  // A LoRA run (nn/lora.h): its checkpoints hold the adapters alone; the frozen base is
  // model.init_from's (or drawn from the seed), identified by this hash of its float32 values.
  std::string base_hash = {};  // "" for a run that trains every parameter
  int64_t format = 1;          // 1: the moments inside model.safetensors; 2: in optimizer.safetensors
};

// A checkpoint verified (checksums, finite values) and located, not held: its tensors are read
// from the files where they are needed (restore_checkpoint, load_checkpoint_params,
// read_checkpoint_params).
struct Checkpoint {
  CheckpointState state;
  std::vector<StEntry> params;   // in model.safetensors, by file-layout name
  std::vector<StEntry> moments;  // "opt/mu/<path>", "opt/nu/<path>" in moments_file
  std::string moments_file;      // optimizer.safetensors, or a format-1 checkpoint's model.safetensors
  std::string path;              // the checkpoint directory
};

struct SaveResult {
  bool saved = false;
  std::string nonfinite;  // when not saved: the first tensor holding a NaN or an infinity
};

// Writes the trainer's parameters and optimizer state into `dir` atomically (and the data's
// tokenizer as tokenizer.json, when given, so `loom sample` can decode). A non-finite parameter
// or moment writes nothing and is reported in the result. A write that fails (a full disk, a file
// past `ulimit -f`) leaves nothing of the new checkpoint and throws fail_write's UserError
// (core/write_error.h) naming the file, on every rank (a dist::AgreedError when there are several).
// Every rank of t.comm() calls it (sharded optimizer state streams to rank 0 in pieces); rank 0
// alone writes, and every rank returns its result.
SaveResult save_checkpoint(const Trainer& t, const CheckpointState& s, const std::string& dir,
                           const nlohmann::json* tokenizer = nullptr);
// Reads and verifies a checkpoint directory, or a run directory: its newest checkpoint that
// verifies (checksums, finite values, and the files and tensors with the shapes its own state.json
// makes: optimizer.safetensors with the moments when `with_optimizer`), each skipped one reported in `skipped`
// ("ckpt_000300: <why>") when given. Problems are UserErrors naming the file and the tensor.
// The parameters are verified as they are read and located, not kept; with `with_optimizer` the
// moments too, and without they are not read (sampling, fine-tuning; a format-1 checkpoint's, in
// model.safetensors, are checked with the parameters). `progress` is called between reads (at
// most 64 MiB apart): e.g. Comm::keep_alive, so that the other ranks of a job
// that wait for a slow load are told it goes on (a read that hangs tells them nothing).
Checkpoint load_checkpoint(const std::string& path, std::vector<std::string>* skipped = nullptr,
                           bool with_optimizer = true, const std::function<void()>& progress = {});
// Loads params and optimizer state into `t` (which must be built from a config whose model
// matches: otherwise a UserError naming the first differing model.* key). Each rank takes its
// part of sharded optimizer state, whatever the rank count that wrote the checkpoint.
void restore_checkpoint(Trainer& t, const Checkpoint& c);
// The host memory a save or a resume holds beside the run's own buffers, on every rank: one
// kStreamBytes buffer (rank 0's write buffer, another rank's staging, a reader's), whatever the
// model's size.
inline constexpr int64_t checkpoint_stream_bytes() { return static_cast<int64_t>(kStreamBytes); }
// Loads only the parameters (fine-tuning from a run: optimizer state fresh), each rank what it
// holds of them; `progress` as for load_checkpoint.
void restore_params(Trainer& t, const Checkpoint& c, const std::function<void()>& progress = {});
// Loads a checkpoint's parameters into `ex`, a program of its model: all of them, or for a LoRA
// run's checkpoint the frozen base from its configuration's model.init_from (or the seed's draw)
// then the adapters. A base whose hash differs from the one recorded is a UserError naming
// model.init_from's path.
void load_checkpoint_params(Executor& ex, const Checkpoint& c, const std::function<void()>& progress = {});
// The checkpoint's parameters read whole, by file-layout name (exports, which convert them all).
std::vector<StTensor> read_checkpoint_params(const Checkpoint& c);
// The CRC-32C of the frozen parameters' stored bytes (float32 values, or lora.base_dtype's bytes:
// a quantized base is hashed as quantized), in parameter order, as 8 hex digits; "" when every
// parameter trains or the program has no backward pass (an inference program's narrowed copies).
std::string base_hash(const Executor& ex);
// Whether `name` is one loom gives a checkpoint of a run directory, ckpt_<digits> (`step`: the
// digits' value).
bool is_checkpoint_name(const std::string& name, int64_t* step);
// Whether `path` is a checkpoint directory loom wrote: a directory, not a symbolic link, holding
// state.json. Nothing else under a checkpoint's name (best, ckpt_<digits>) is ever replaced,
// pruned or removed.
bool is_checkpoint_dir(const std::string& path);
// The ckpt_<step> directories of a run directory (is_checkpoint_dir), oldest first ({} if none).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);
// The latest ckpt_<step> directory in a run directory ("" if none).
std::string latest_checkpoint(const std::string& run_dir);
// Removes a checkpoint directory (ckpt_<step>, best): renamed to .<name>.del first, so a kill
// midway leaves only a name remove_stale_checkpoint_files() clears, never <name> without its
// state.json (which refuse_foreign_files would take for a user's directory).
void remove_checkpoint_dir(const std::string& path);
// Removes all but the newest `keep` (at least 1) ckpt_<step> directories.
void prune_checkpoints(const std::string& run_dir, int64_t keep);
// Removes what an interrupted save or prune left behind (.ckpt_*.tmp, .*.old, .ckpt_*.del), and
// renames a .<name>.old back to <name> when a kill cut a replacement short (nothing at <name>).
void remove_stale_checkpoint_files(const std::string& run_dir);
// "section.key" -> value of a config_to_toml text.
std::map<std::string, std::string> config_values(const std::string& toml_text);
// The first key (in key order) starting with `prefix` ("model.", or "" for any) whose value
// differs between two config_to_toml texts; "" if none.
std::string first_config_difference(const std::string& a_toml, const std::string& b_toml,
                                    const std::string& prefix = "");
// A checkpoint directory's state.json, checked (UserError naming the file), without its tensors.
CheckpointState read_checkpoint_state(const std::string& dir);
// The step recorded in a checkpoint directory's state.json (-1 when unreadable).
int64_t checkpoint_step(const std::string& dir);
// What a resume at `step` says when train.steps (`steps`) leaves nothing to train (steps <= step).
std::string nothing_to_train(int64_t step, int64_t steps);

}  // namespace loom
