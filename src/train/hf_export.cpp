#include "train/hf_export.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>

#include "backend/registry.h"
#include "core/error.h"
#include "core/write_error.h"
#include "data/chat_data.h"
#include "data/end_of_turn.h"
#include "data/hf_tokenizer.h"
#include "io/hf.h"
#include "io/param_io.h"
#include "io/peft.h"
#include "nn/models.h"
#include "nn/models/hf_arch.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"
#include "train/model_source.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.flush();
  if (!f) fail_write(path.string(), "cannot write it", errno);
}

void write_json(const fs::path& path, const nlohmann::json& j) { write_text(path, j.dump(2) + "\n"); }

// Refuses an OUTDIR that exists and is not an empty directory (nothing is overwritten).
void refuse_existing(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec) || (fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) return;
  if (!fs::is_directory(out_dir, ec))
    throw UserError(out_dir, "is a file; the export writes a directory of files there",
                    "give the name of a new directory (nothing is overwritten); loom export gguf writes one file");
  throw UserError(out_dir, "exists and is not an empty directory", "choose a new directory (nothing is overwritten)");
}

// OUTDIR's staging directory, beside it (a failed export leaves no OUTDIR): `write` fills it, then
// it is renamed into place. An OUTDIR that exists and is not empty is refused.
void write_dir(const std::string& out_dir, const std::function<void(const fs::path&)>& write) {
  refuse_existing(out_dir);
  std::error_code ec;
  fs::path out = fs::absolute(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "DIR/"
  const fs::path staging = out.string() + ".loom-export.tmp";
  fs::remove_all(staging, ec);
  fs::create_directories(staging);
  try {
    write(staging);
    fs::rename(staging, out);  // onto a missing or empty directory
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace

nlohmann::json hf_export_config(const ModelConfig& m, int32_t start, const std::vector<int32_t>& eos) {
  nlohmann::json j = hf_config_json(m, start, start);
  if (!eos.empty()) j["eos_token_id"] = eos.size() == 1 ? nlohmann::json(eos[0]) : nlohmann::json(eos);
  if (m.init_from.empty() || !is_hf_model_dir(m.init_from)) return j;
  std::ifstream f(fs::path(m.init_from) / "config.json");
  const nlohmann::json source = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!source.is_object()) return j;
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if (source.contains(key)) j[key] = source[key];
  return j;
}

nlohmann::json hf_export_companions(const ModelConfig& m, const HfTokenizer& tok) {
  nlohmann::json files = tok.companions();
  if (m.init_from.empty() || !is_hf_model_dir(m.init_from)) return files;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(fs::path(m.init_from) / "tokenizer.json", ec)) return files;
  const nlohmann::json source = HfTokenizer::load(m.init_from)->companions();
  for (const auto& [name, content] : source.items())
    if (!files.contains(name)) files[name] = content;
  return files;
}

namespace {

// The end of turn of an export whose files (in `dir`, from `companions`) carry a chat template, as
// hf_export.h says: `generation` is generation_config.json's object, `eos` its eos_token_id
// list; `changed` says whether it differs from the carried file (none: an empty object).
struct ChatEnd {
  jinja::Json generation;
  std::vector<int32_t> eos;
  bool changed = false;
};
// nullopt when the files carry no chat template. A template loom's Jinja cannot read is a
// UserError (load_chat_template's).
std::optional<ChatEnd> chat_end(const fs::path& dir, const nlohmann::json& companions, const Tokenizer& tok) {
  const auto parsed = [&](const char* name) {
    return companions.contains(name) ? jinja::Json::parse(companions[name].get<std::string>()) : jinja::Json::object();
  };
  const jinja::Json config = parsed("tokenizer_config.json");
  if (!companions.contains("chat_template.jinja") && !(config.is_object() && config.contains("chat_template")))
    return std::nullopt;
  ChatEnd e{.generation = parsed("generation_config.json"), .eos = {}, .changed = false};
  if (!e.generation.is_object()) return std::nullopt;  // not a generation config to add to
  const jinja::Json own = e.generation.value("eos_token_id", jinja::Json(nullptr));
  for (const jinja::Json& v : own.is_array() ? own : jinja::Json::array({own}))
    if (v.is_number_integer()) e.eos.push_back(v.get<int32_t>());
  const size_t n = e.eos.size();
  for (int32_t id : end_of_turn_ids(load_chat_template(dir.string(), ""), e.generation, tok))
    if (std::find(e.eos.begin(), e.eos.end(), id) == e.eos.end()) e.eos.push_back(id);
  if (e.eos.empty()) return std::nullopt;  // no end of turn the tokenizer has as one token
  if (e.eos.size() > n) {
    e.generation["eos_token_id"] = e.eos.size() == 1 ? jinja::Json(e.eos[0]) : jinja::Json(e.eos);
    e.changed = true;
  }
  return e;
}

// ChatEnd's generation config with config.json's bos_token_id and pad_token_id where it names none.
void fill_special_ids(ChatEnd& e, const nlohmann::json& config) {
  for (const char* key : {"bos_token_id", "pad_token_id"})
    if (!e.generation.contains(key) && config.contains(key) && !config[key].is_null()) {
      e.generation[key] = jinja::Json::parse(config[key].dump());
      e.changed = true;
    }
}

// A LoRA run's model with its adapters merged, in transformers' names: W += scale · B·A for each
// PEFT module, as PEFT's merge_and_unload does (GPT-2's Conv1D weights are stored [in, out]: the
// transpose). The base comes from model.init_from (or the seed), checked against the checkpoint's
// hash, as for `loom eval`.
std::vector<StTensor> merged_lora_tensors(const Config& c, const Checkpoint& ck, const nn::HfModelMap& map) {
  const std::unique_ptr<Backend> be = make_backend(Device::cpu);
  Evaluator ev(c, *be);
  load_checkpoint_params(ev.executor(), ck);
  const std::vector<StTensor> params = export_params(ev.executor(), /*scan_layers=*/false);
  std::map<std::string, const StTensor*> by_path;
  for (const StTensor& t : params) by_path[t.name] = &t;
  std::vector<StTensor> hf = loom_to_hf(c.model, by_path);
  std::map<std::string, StTensor*> by_name;
  for (StTensor& t : hf) by_name[t.name] = &t;
  const std::vector<StTensor> adapters = loom_to_peft(c.model, by_path);
  std::map<std::string, const StTensor*> adapter;
  for (const StTensor& t : adapters) adapter[t.name] = &t;
  const double scale = c.model.lora.scale();
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight";
  for (const auto& [name, a] : adapter) {
    if (!name.ends_with(a_suffix)) continue;
    const std::string module = name.substr(prefix.size(), name.size() - prefix.size() - a_suffix.size());
    const StTensor& b = *adapter.at(prefix + module + ".lora_B.weight");
    StTensor& w = *by_name.at(module + ".weight");
    const int64_t r = a->shape[0], in = a->shape[1], out = b.shape[0];
    const bool conv1d = map.conv1d;  // [in, out]
    const auto* av = reinterpret_cast<const float*>(a->bytes.data());
    const auto* bv = reinterpret_cast<const float*>(b.bytes.data());
    auto* wv = reinterpret_cast<float*>(w.bytes.data());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double{bv[o * r + k]} * double{av[k * in + i]};
        wv[conv1d ? i * out + o : o * in + i] += static_cast<float>(scale * d);
      }
  }
  return hf;
}

}  // namespace

HfCheckpoint read_hf_checkpoint(const std::string& run_or_checkpoint, LoraMerge merge) {
  const ModelSource src(run_or_checkpoint);
  if (src.is_hf())
    throw UserError(run_or_checkpoint, "is a Hugging Face directory already",
                    "export a loom run or checkpoint (loom train --out DIR)");
  nn::HfModelMap map = nn::hf_model_map(src.config().model);  // refuses what transformers cannot hold
  const bool lora = src.config().model.lora.enabled();
  if (lora && merge == LoraMerge::refuse)
    throw UserError(run_or_checkpoint, "is a LoRA run: its checkpoints hold the adapters, not the model",
                    "export the adapters with loom export peft, or the merged model with --merge");
  if (!lora && merge == LoraMerge::merge)
    throw UserError("--merge", "asks to merge adapters, but " + run_or_checkpoint + " is no LoRA run (no lora.rank)",
                    "drop --merge: a full run's checkpoints hold the whole model");
  std::vector<std::string> skipped;
  const Checkpoint ck = load_checkpoint(run_or_checkpoint, &skipped, /*with_optimizer=*/false);
  Config stored = config_from_toml_text(ck.state.config_toml, (fs::path(ck.path) / "state.json").string());
  std::vector<StTensor> tensors;
  if (lora) {
    tensors = merged_lora_tensors(stored, ck, map);
    stored.model.lora = {};  // the merged model is a plain one
  } else {
    // The checkpoint's parameters by path (unstacked when it was saved with model.scan_layers).
    const std::vector<StTensor> stored_params = read_checkpoint_params(ck);
    std::map<std::string, const StTensor*> by_name;
    for (const StTensor& t : stored_params) by_name[t.name] = &t;
    const nn::ModelGraph g = nn::build_model(stored.model, model_input(stored, 1), /*train=*/false);
    const std::vector<StTensor> params = params_by_path(g.graph, by_name, stored.model.transformer.scan_layers,
                                                        (fs::path(ck.path) / "model.safetensors").string());
    std::map<std::string, const StTensor*> by_path;
    for (const StTensor& t : params) by_path[t.name] = &t;
    tensors = loom_to_hf(stored.model, by_path);
  }
  return {.checkpoint = ck.path,
          .config = std::move(stored),
          .map = std::move(map),
          .tensors = std::move(tensors),
          .tokenizer = src.tokenizer(),
          .skipped = std::move(skipped)};
}

HfExport export_peft(const std::string& run_or_checkpoint, const std::string& out_dir) {
  refuse_existing(out_dir);  // before the checkpoint is read
  const ModelSource src(run_or_checkpoint);
  if (src.is_hf())
    throw UserError(run_or_checkpoint, "is a Hugging Face directory", "export a loom LoRA run or checkpoint");
  const ModelConfig& m = src.config().model;
  if (!m.lora.enabled())
    throw UserError(run_or_checkpoint, "trained every parameter: it has no LoRA adapters",
                    "train with lora.rank > 0 (PEFT adapters), or use loom export hf (the whole model)");
  const nn::HfModelMap map = nn::hf_model_map(m);  // refuses what transformers cannot hold
  std::vector<std::string> skipped;
  const Checkpoint ck = load_checkpoint(run_or_checkpoint, &skipped, /*with_optimizer=*/false);
  const std::vector<StTensor> stored_params = read_checkpoint_params(ck);
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& t : stored_params) by_name[t.name] = &t;
  const nn::ModelGraph g = nn::build_model(m, model_input(src.config(), 1), /*train=*/false);
  const std::vector<StTensor> adapters =
      params_by_path(g.graph, by_name, m.transformer.scan_layers, (fs::path(ck.path) / "model.safetensors").string(),
                     nn::ParamSubset::trainable);
  std::map<std::string, const StTensor*> by_path;
  for (const StTensor& t : adapters) by_path[t.name] = &t;
  HfExport r{.checkpoint = ck.path,
             .architecture = map.architecture,
             .files = {},
             .tokenizer_note = {},
             .end_of_turn_note = {},
             .skipped = std::move(skipped)};
  write_dir(out_dir, [&](const fs::path& dir) {
    write_safetensors((dir / "adapter_model.safetensors").string(), loom_to_peft(m, by_path), {{"format", "pt"}});
    write_json(dir / "adapter_config.json", peft_adapter_config(m));
  });
  r.files = {"adapter_model.safetensors", "adapter_config.json"};
  return r;
}

HfExport export_hf(const std::string& run_or_checkpoint, const std::string& out_dir, LoraMerge lora) {
  refuse_existing(out_dir);  // before the checkpoint is read
  const HfCheckpoint hc = read_hf_checkpoint(run_or_checkpoint, lora);
  HfExport r{.checkpoint = hc.checkpoint,
             .architecture = hc.map.architecture,
             .files = {},
             .tokenizer_note = {},
             .end_of_turn_note = {},
             .skipped = hc.skipped};
  const Tokenizer* tok = hc.tokenizer.get();
  const int32_t start = tok ? tok->start_id() : -1;
  const auto* hf = dynamic_cast<const HfTokenizer*>(tok);
  write_dir(out_dir, [&](const fs::path& dir) {
    write_safetensors((dir / "model.safetensors").string(), hc.tensors, {{"format", "pt"}});
    r.files.push_back("model.safetensors");
    r.files.push_back("config.json");  // written last: its eos may be the chat template's
    std::optional<ChatEnd> end;
    if (hf) {
      write_json(dir / "tokenizer.json", hf->tokenizer_json());
      r.files.push_back("tokenizer.json");
      const nlohmann::json companions = hf_export_companions(hc.config.model, *hf);
      for (const char* name : HfTokenizer::kCompanionFiles) {
        if (!companions.contains(name)) continue;
        write_text(dir / name, companions[name].get<std::string>());
        r.files.push_back(name);
      }
      try {
        end = chat_end(dir, companions, *hf);
      } catch (const UserError& e) {
        r.end_of_turn_note = e.what();
      }
    }
    const nlohmann::json config = hf_export_config(hc.config.model, start, end ? end->eos : std::vector<int32_t>{});
    write_json(dir / "config.json", config);
    if (end) {
      fill_special_ids(*end, config);
      if (end->changed) {
        if (std::find(r.files.begin(), r.files.end(), "generation_config.json") == r.files.end())
          r.files.push_back("generation_config.json");
        write_text(dir / "generation_config.json", end->generation.dump(2) + "\n");
      }
    }
  });
  if (!hf) {
    r.tokenizer_note = tok ? "its " + std::string(choice_name(tok->kind())) +
                                 " tokenizer has no tokenizer.json (prepare the data with "
                                 "`loom prepare hf` to carry one)"
                           : "the run has no tokenizer";
  }
  return r;
}

}  // namespace loom
