#include "train/model_source.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "io/hf.h"
#include "io/param_io.h"
#include "nn/config_keys.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace loom {

namespace fs = std::filesystem;

ModelSource::ModelSource(const std::string& path) : path_(path), dir_(path) {
  std::error_code ec;
  if (is_hf_model_dir(path)) {
    HfConfig hf = read_hf_config(path);
    hf_ = true;
    config_.model = hf.model;
    config_.source = hf.path;
    for (ArchKey& k : hf.keys) {
      k.origin += " in " + hf.path;
      keys_.push_back(std::move(k));
    }
    description_ = "the Hugging Face " + hf.architecture + " in " + path;
    return;
  }
  std::string config_toml;
  if (fs::exists(fs::path(path) / "state.json", ec)) {
    config_toml = read_checkpoint_state(path).config_toml;
  } else {
    // A run directory: the configuration of its newest checkpoint whose state.json reads, as
    // load_params skips a damaged one too.
    const auto all = list_checkpoints(path);
    if (all.empty() && fs::exists(fs::path(path) / "config.toml", ec))
      load_checkpoint(path);  // throws: a run that stopped before its first checkpoint, and the fix
    if (all.empty())
      throw UserError(path,
                      fs::exists(path, ec) ? "is neither a Hugging Face model directory (config.json) nor a loom "
                                             "run or checkpoint (state.json, ckpt_<step>/)"
                                           : "does not exist",
                      "give a directory with config.json and model.safetensors, a run directory of `loom train "
                      "--out`, or one of its ckpt_<step> directories");
    for (auto it = all.rbegin(); it != all.rend() && config_toml.empty(); ++it) {
      try {
        config_toml = read_checkpoint_state(it->second).config_toml;
        dir_ = it->second;
      } catch (const UserError& e) {
        skipped_.push_back(fs::path(it->second).filename().string() + ": " + e.what());
      }
    }
    if (config_toml.empty()) {
      std::string reasons;
      for (const std::string& s : skipped_) reasons += "\n  " + s;
      throw UserError(path, "no checkpoint in it has a readable state.json:" + reasons,
                      "every checkpoint is damaged; start a new run (or restore the directory from a backup)");
    }
  }
  const std::string state = (fs::path(dir_) / "state.json").string();
  config_ = config_from_toml_text(config_toml, state);
  for (const KeySpec<ModelConfig>& k : model_keys())
    if (k.architecture) keys_.push_back({.key = k.key, .origin = state, .fixed = true});
  describe();
}

void ModelSource::describe() const {
  description_ = "the loom checkpoint " + dir_;
  for (const std::string& s : skipped_) description_ += " (skipping a damaged checkpoint: " + s + ")";
}

void ModelSource::load_params(Executor& ex, const std::function<void()>& progress) const {
  if (hf_) {
    // A LoRA program takes its frozen base from here; its adapters start fresh.
    load_hf_params(ex, config_.model, path_, nn::base_subset(ex.graph()), nullptr, kInitSliceValues, progress);
    return;
  }
  // The file layout is the checkpoint's (model.scan_layers), whatever the new run's is.
  load_checkpoint_params(ex, verified(progress), progress);
}

void ModelSource::load_params(Trainer& t) const {
  const auto progress = [&t] { t.comm().keep_alive(); };  // the other ranks wait for this one's disk
  if (!t.params_sharded()) return load_params(t.executor(), progress);
  // A Hugging Face tensor's slices pass through three buffers (its bytes as read, their float32
  // values, a run gathered for the shard): together the plan's checkpoint stream buffer.
  constexpr auto kSlice = static_cast<int64_t>(kStreamBytes / (3 * sizeof(float)));
  if (hf_)
    load_hf_params(t.model().graph, t.param_sink(), config_.model, path_, nn::ParamSubset::all, nullptr, kSlice,
                   progress);
  else
    restore_params(t, verified(progress), progress);
}

Checkpoint ModelSource::verified(const std::function<void()>& progress) const {
  std::vector<std::string> skipped;
  Checkpoint c = load_checkpoint(path_, &skipped, /*with_optimizer=*/false, progress);
  dir_ = c.path;
  skipped_ = std::move(skipped);
  describe();
  return c;
}

std::unique_ptr<Tokenizer> ModelSource::tokenizer() const {
  const fs::path file = fs::path(dir_) / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return nullptr;
  if (hf_) return HfTokenizer::load(file.string());
  std::ifstream f(file, std::ios::binary);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(file.string(), std::string("is not valid JSON (") + e.what() + ")", "the checkpoint is corrupted");
  }
  return Tokenizer::from_json(j, file.string());
}

}  // namespace loom
