#include "io/peft.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/param_io.h"
#include "nn/models.h"
#include "nn/models/hf_arch.h"
#include "nn/models/transformer/transformer.h"

namespace loom {

namespace {

const char* kPeftPrefix = "base_model.model.";

// The adapters of `c` by path with their shapes, in parameter order.
std::vector<std::pair<std::string, Shape>> adapter_params(const ModelConfig& c) {
  const nn::ModelGraph m = nn::build_model(c, ModelInput{.batch = 1, .num_inputs = 0, .seq_len = 1}, false);
  std::vector<std::pair<std::string, Shape>> out;
  for (const Param& p : m.graph.params())
    if (p.trainable()) out.emplace_back(m.graph.value(p.value).name, m.graph.value(p.value).shape);
  return out;
}

// "block_0/attn/qkv/lora_q_proj/a" -> ("block_0/attn/qkv", "q_proj", "a").
struct AdapterPath {
  std::string layer, module, leaf;
};
AdapterPath split_adapter(const std::string& path) {
  const size_t leaf = path.rfind('/'), site = path.rfind("/lora_", leaf);
  LOOM_ASSERT(leaf != std::string::npos && site != std::string::npos, "'" + path + "' is no adapter");
  return {path.substr(0, site), path.substr(site + 6, leaf - site - 6), path.substr(leaf + 1)};
}

// transposed [cols, rows] of a row-major f32 [rows, cols] block, written at `dst`.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

}  // namespace

std::vector<PeftTensor> peft_tensor_map(const ModelConfig& c) {
  const nn::HfModelMap hf = nn::hf_model_map(c);
  std::vector<PeftTensor> out;
  std::map<std::string, size_t> b_of_site;  // where a site's lora_B entry is
  for (const auto& [path, shape] : adapter_params(c)) {
    const AdapterPath a = split_adapter(path);
    const std::string kernel = a.layer + "/kernel", suffix = "." + a.module + ".weight";
    const nn::HfParam* base = nullptr;
    for (const nn::HfParam& p : hf.params)
      if (p.path == kernel && p.hf_name.ends_with(suffix)) base = &p;
    LOOM_ASSERT(base, "no " + hf.architecture + " module for the adapter '" + path + "'");
    const std::string module = kPeftPrefix + base->hf_name.substr(0, base->hf_name.size() - std::strlen(".weight"));
    if (a.leaf == "a") {
      out.push_back({module + ".lora_A.weight", {path}});
      continue;
    }
    const std::string site = a.layer + "/" + a.module;
    if (!b_of_site.count(site)) {
      b_of_site[site] = out.size();
      out.push_back({module + ".lora_B.weight", {}});
    }
    out[b_of_site[site]].paths.push_back(path);
  }
  return out;
}

std::vector<std::string> peft_target_modules(const ModelConfig& c) {
  std::vector<std::string> out;
  const ChoiceSet<LoraTarget> m = nn::lora_modules(c.lora, nn::gated_mlp(c));
  for (size_t i = 0; i < choices_of(LoraTarget{}).size(); ++i)
    if (m.has(static_cast<LoraTarget>(i))) out.emplace_back(choice_name(static_cast<LoraTarget>(i)));
  return out;
}

nlohmann::json peft_adapter_config(const ModelConfig& c) {
  // GPT-2's Conv1D layers store [in, out]: PEFT sets fan_in_fan_out for them (it changes only how
  // a merge transposes B·A, not the tensors).
  const bool conv1d = nn::hf_model_map(c).conv1d;
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", c.init_from},
          {"revision", nullptr},
          {"inference_mode", true},
          {"r", c.lora.rank},
          {"lora_alpha", c.lora.alpha},
          {"lora_dropout", c.lora.dropout},
          {"target_modules", peft_target_modules(c)},
          {"bias", "none"},
          {"fan_in_fan_out", conv1d},
          {"use_rslora", c.lora.use_rslora},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()}};
}

std::vector<StTensor> loom_to_peft(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom) {
  std::vector<StTensor> out;
  for (const PeftTensor& t : peft_tensor_map(c)) {
    // Each loom parameter [a, b] (A [in, r], B [r, w]) becomes b rows of a: A [r, in], B [Σ w, r].
    std::vector<float> v;
    int64_t rows = 0, cols = 0;
    for (const std::string& p : t.paths) {
      const StTensor& s = *loom.at(p);
      const size_t at = v.size();
      v.resize(at + static_cast<size_t>(s.shape.numel()));
      transpose(reinterpret_cast<const float*>(s.bytes.data()), s.shape[0], s.shape[1], v.data() + at);
      rows += s.shape[1];
      cols = s.shape[0];
    }
    StTensor o{.name = t.name, .dtype = DType::f32, .shape = Shape{rows, cols}, .bytes = {}};
    o.bytes.resize(v.size() * sizeof(float));
    std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
    out.push_back(std::move(o));
  }
  return out;
}

std::vector<StTensor> peft_to_loom(const ModelConfig& c, const std::map<std::string, const StTensor*>& peft,
                                   const std::string& source) {
  std::map<std::string, Shape> shapes;
  for (const auto& [path, shape] : adapter_params(c)) shapes[path] = shape;
  std::vector<StTensor> out;
  for (const PeftTensor& t : peft_tensor_map(c)) {
    auto it = peft.find(t.name);
    if (it == peft.end())
      throw UserError(source, "tensor '" + t.name + "' is missing",
                      "the adapter must target " + nlohmann::json(peft_target_modules(c)).dump() + " with lora.rank " +
                          std::to_string(c.lora.rank));
    const StTensor& s = *it->second;
    // Each loom parameter [a, b] is the transposed block of rows [at, at + b) of s [Σ b, a].
    int64_t rows = 0;
    for (const std::string& p : t.paths) rows += shapes.at(p)[1];
    const Shape want{rows, shapes.at(t.paths[0])[0]};
    if (s.dtype != DType::f32 || s.shape != want)
      throw UserError(source,
                      "tensor '" + t.name + "' is " + dtype_name(s.dtype) + s.shape.str() +
                          ", loom's adapter needs float32" + want.str(),
                      "the adapter was trained with another rank or on another model");
    const auto* src = reinterpret_cast<const float*>(s.bytes.data());
    for (const std::string& p : t.paths) {
      const Shape& sh = shapes.at(p);
      StTensor o{.name = p, .dtype = DType::f32, .shape = sh, .bytes = std::vector<unsigned char>(sh.numel() * 4)};
      transpose(src, sh[1], sh[0], reinterpret_cast<float*>(o.bytes.data()));
      src += sh.numel();
      out.push_back(std::move(o));
    }
  }
  return out;
}

void load_peft_adapter(Executor& ex, const ModelConfig& c, const std::string& dir) {
  const std::string config_path = (std::filesystem::path(dir) / "adapter_config.json").string();
  std::ifstream f(config_path, std::ios::binary);
  if (!f) throw UserError(config_path, "cannot be opened", "give lora.init_from a PEFT adapter directory");
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw UserError(config_path, "is not a JSON object", "give a PEFT adapter's adapter_config.json");
  if (j.value("peft_type", "LORA") != "LORA")
    throw UserError(config_path, "is a " + j.value("peft_type", std::string()) + " adapter", "give a LoRA adapter");
  auto differs = [&](const char* key, const std::string& theirs, const std::string& what) {
    throw UserError(key, "is " + what + " but " + config_path + " has " + theirs,
                    "set " + std::string(key) + " to the adapter's value");
  };
  const nlohmann::json r = j.value("r", nlohmann::json());
  if (!r.is_number_integer() || r.get<int64_t>() != c.lora.rank)
    differs("lora.rank", "r = " + r.dump(), std::to_string(c.lora.rank));
  const nlohmann::json alpha = j.value("lora_alpha", nlohmann::json());
  if (!alpha.is_number() || alpha.get<double>() != c.lora.alpha)
    differs("lora.alpha", "lora_alpha = " + alpha.dump(), nlohmann::json(c.lora.alpha).dump());
  if (j.value("use_rslora", false) != c.lora.use_rslora)
    differs("lora.use_rslora", "use_rslora = " + nlohmann::json(j.value("use_rslora", false)).dump(),
            c.lora.use_rslora ? "true" : "false");
  std::vector<std::string> want = peft_target_modules(c), theirs;
  const nlohmann::json t = j.value("target_modules", nlohmann::json());
  if (t.is_array())
    for (const nlohmann::json& m : t) theirs.push_back(m.is_string() ? m.get<std::string>() : m.dump());
  std::ranges::sort(want);
  std::ranges::sort(theirs);
  if (theirs != want) differs("lora.targets", "target_modules = " + t.dump(), nlohmann::json(want).dump());

  const std::string file = (std::filesystem::path(dir) / "adapter_model.safetensors").string();
  std::vector<StTensor> tensors = read_safetensors(file);
  for (StTensor& s : tensors) {  // PEFT saves in the base model's dtype
    if (s.dtype == DType::f32) continue;
    if (s.dtype != DType::bf16 && s.dtype != DType::f16)
      throw UserError(file, "tensor '" + s.name + "' is " + dtype_name(s.dtype), "save the adapter in float32");
    std::vector<unsigned char> wide(static_cast<size_t>(s.shape.numel()) * 4);
    for (int64_t i = 0; i < s.shape.numel(); ++i) {
      uint16_t h;
      std::memcpy(&h, s.bytes.data() + 2 * i, 2);
      const float v = s.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
      std::memcpy(wide.data() + 4 * i, &v, 4);
    }
    s.bytes = std::move(wide);
    s.dtype = DType::f32;
  }
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& s : tensors) by_name[s.name] = &s;
  const std::vector<StTensor> loom = peft_to_loom(c, by_name, file);
  std::map<std::string, const StTensor*> by_path;
  for (const StTensor& s : loom) by_path[s.name] = &s;
  import_params(ex, by_path, /*scan_layers=*/false, file, "", nn::ParamSubset::trainable);
}

}  // namespace loom
