// A model to start from (model.init_from) or to sample from (`loom sample DIR`): a loom
// checkpoint, a loom run directory (its newest checkpoint that verifies), or a Hugging Face model
// directory (io/hf.h: config.json + model.safetensors or shards).
//
// Fine-tuning takes the parameters only: the optimizer state, step and schedule start fresh, as
// nanoGPT's init_from does. The architecture keys come from the source (keys()); train/config.cpp
// sets them in the configuration being loaded and refuses a configuration that contradicts one.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "runtime/executor.h"
#include "train/config.h"

namespace loom {

class Trainer;
struct Checkpoint;

class ModelSource {
 public:
  // Reads the source's configuration (config.json, or the checkpoint's state.json), not its
  // tensors. A path that is neither is a UserError naming it.
  explicit ModelSource(const std::string& path);

  bool is_hf() const { return hf_; }
  // The configuration it was made with: a loom checkpoint's own; for a Hugging Face directory
  // loom's defaults with the architecture set.
  const Config& config() const { return config_; }
  // The model.* keys it decides, each with where its value comes from: a loom checkpoint's are the
  // rows marked `architecture` (nn/config_keys.h), a Hugging Face model's those its config.json gives.
  const std::vector<ArchKey>& keys() const { return keys_; }
  // "the Hugging Face GPT2LMHeadModel in DIR", "the loom checkpoint DIR". Once load_params has
  // read a run directory, DIR is the checkpoint it loaded, followed by each newer one it skipped
  // as damaged: " (skipping a damaged checkpoint: ckpt_<step>: <why>)".
  const std::string& description() const { return description_; }

  // Loads every parameter of `ex`, a program built from a model whose architecture keys equal
  // keys()' (the training or decoding program). Reads and verifies the tensors (a loom run
  // directory: its newest checkpoint that verifies); problems are UserErrors naming the file and
  // the tensor. `progress` is called before every read (Comm::keep_alive).
  void load_params(Executor& ex, const std::function<void()>& progress = {}) const;
  // The same into a trainer, each rank what it holds: with sharded parameters (optimizer.shard =
  // params) only its slice of each, read by offset (io/hf.h's load_hf_params into a sink;
  // restore_params for a loom checkpoint) through bounded buffers, never a whole parameter. Each
  // rank tells the others, which may wait for it in a collective meanwhile, that it is busy
  // (Comm::keep_alive) before every read, so a slow disk is not taken for a hung rank.
  void load_params(Trainer& t) const;
  // The directory holding its files (a run directory's newest checkpoint whose state.json reads;
  // once load_params has read it, the checkpoint it loaded), where tokenizer_config.json and
  // generation_config.json are when it has them.
  const std::string& dir() const { return dir_; }
  // The newer checkpoints of a run directory passed over as damaged ("ckpt_<step>: <why>"): those
  // whose state.json does not read, and once load_params has verified the tensors, every one it skipped.
  const std::vector<std::string>& skipped() const { return skipped_; }
  // The tokenizer saved with it (tokenizer.json), or nullptr when it has none.
  std::unique_ptr<Tokenizer> tokenizer() const;

 private:
  // A loom checkpoint's parameters, verified: the newest of a run directory's that verifies, which
  // dir_ and description_ then name (with those skipped).
  Checkpoint verified(const std::function<void()>& progress) const;
  // Sets description_ from dir_ and skipped_.
  void describe() const;

  std::string path_;
  mutable std::string dir_;  // the directory holding the files (a checkpoint's): the loaded one once known
  bool hf_ = false;
  Config config_;
  std::vector<ArchKey> keys_;
  mutable std::string description_;
  mutable std::vector<std::string> skipped_;
};

}  // namespace loom
