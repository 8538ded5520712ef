#include "io/peft.h"

#include <cstring>

#include "core/error.h"
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
  const bool conv1d = nn::hf_model_map(c).model_type == "gpt2";
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

}  // namespace loom
