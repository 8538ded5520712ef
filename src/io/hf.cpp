#include "io/hf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.h"
#include "nn/models/hf_arch.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const std::string& path, const std::string& fix) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot be opened", fix);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("is not valid JSON (") + e.what() + ")", fix);
  }
}

// Where one Hugging Face tensor's values sit in loom's parameter (nn/models/hf_arch.h's layouts):
// run(hf_offset, loom_offset, n) for each run of n consecutive floats in both, in element
// offsets into p.hf_shape and p.shape.
template <class Run>
void for_each_run(const nn::HfParam& p, const nn::HfModelMap& m, Run&& run) {
  const int64_t D = m.head_dim, n = p.hf_shape.numel();
  switch (p.layout) {
    case nn::HfLayout::same:
      run(0, 0, n);
      return;
    case nn::HfLayout::qkv_columns: {  // rows of (3, H, D) <-> rows of (H, 3, D)
      const int64_t H = m.heads, C = H * D;
      for (int64_t r = 0; r < n / (3 * C); ++r)
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t h = 0; h < H; ++h) run(r * 3 * C + s * C + h * D, r * 3 * C + h * 3 * D + s * D, D);
      return;
    }
    case nn::HfLayout::transposed: {  // hf [a, b] <-> loom [b, a]
      const int64_t a = p.hf_shape[0], b = n / a;
      for (int64_t i = 0; i < a; ++i)
        for (int64_t k = 0; k < b; ++k) run(i * b + k, k * a + i, 1);
      return;
    }
    case nn::HfLayout::qkv_rows: {  // hf row (j·slots + s)·D + d <-> loom [c, j, (slot + s)·D + d]
      const int64_t C = p.hf_shape.rank == 2 ? p.hf_shape[1] : 1, width = p.shape.numel() / C,
                    per_head = width / m.kv_heads;
      for (int64_t r = 0; r < p.hf_shape[0]; ++r) {
        const int64_t col = r / (p.slots * D) * per_head + p.slot * D + r % (p.slots * D);
        for (int64_t c = 0; c < C; ++c) run(r * C + c, c * width + col, 1);
      }
      return;
    }
  }
}

// `t`'s values as float32 (float32, bfloat16 and float16 files).
std::vector<float> to_f32(const StTensor& t, const std::string& source) {
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
    throw UserError(source, "tensor '" + t.name + "' is " + dtype_name(t.dtype) + ", not a float",
                    "save the checkpoint in float32, bfloat16 or float16");
  std::vector<float> v(static_cast<size_t>(t.shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.bytes.data(), t.dtype, i);
  return v;
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "config.json", ec);
}

HfConfig read_hf_config(const std::string& dir) {
  HfConfig out;
  out.path = (fs::path(dir) / "config.json").string();
  const nlohmann::json j = read_json(out.path, "give a Hugging Face model directory (config.json, model.safetensors)");
  if (!j.is_object()) throw UserError(out.path, "is not a JSON object", "use the config.json transformers wrote");
  std::string type = j.value("model_type", "");
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    out.architecture = (*a)[0].get<std::string>();
  const nn::HfArchitecture* arch = nn::find_hf_architecture(type, out.architecture);
  if (arch) {
    out.architecture = arch->architecture;
    arch->read_config(nn::HfConfigJson(j, out.path), out.model, out.keys);
    return out;
  }
  const std::string what = out.architecture.empty() ? "model_type \"" + type + "\"" : out.architecture;
  std::string fix = "loom imports ";
  const auto rows = nn::hf_architectures();
  for (size_t i = 0; i < rows.size(); ++i)
    fix += std::string(i == 0 ? "" : i + 1 == rows.size() ? " and " : ", ") + std::string(rows[i]->listed_as);
  fix += " checkpoints";
  if (const std::string_view why = nn::hf_near_miss(type); !why.empty())
    throw UserError(out.path, what + " " + std::string(why), fix);
  throw UserError(out.path, what + " is not an architecture loom can run", fix);
}

nlohmann::json hf_config_json(const ModelConfig& c, int32_t bos_id, int32_t eos_id) {
  const nn::HfArchitecture& arch = nn::hf_architecture_of(c);
  nlohmann::json j = arch.write_config(c, arch.tensor_map(c));
  // null, not absent: the config classes' defaults (GPT-2's 50256, Llama's 1 and 2) may be outside
  // the vocabulary or mean other tokens.
  j["bos_token_id"] = bos_id >= 0 ? nlohmann::json(bos_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = eos_id >= 0 ? nlohmann::json(eos_id) : nlohmann::json(nullptr);
  return j;
}

std::vector<StTensor> read_hf_tensors(const std::string& dir, std::string* file) {
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  const bool one = fs::is_regular_file(single, ec);
  if (file) *file = (one ? single : index).string();
  if (one) return read_safetensors(single.string());
  if (!fs::is_regular_file(index, ec))
    throw UserError(dir, "has neither model.safetensors nor model.safetensors.index.json",
                    "loom reads safetensors checkpoints; convert a pytorch_model.bin with transformers' "
                    "save_pretrained(DIR, safe_serialization=True)");
  const std::string fix = "use the index and shards save_pretrained wrote, complete";
  const nlohmann::json j = read_json(index.string(), fix);
  auto wm = j.find("weight_map");
  if (!j.is_object() || wm == j.end() || !wm->is_object() || wm->empty())
    throw UserError(index.string(), "has no \"weight_map\" object", fix);
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> the tensors it should hold
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos)
      throw UserError(index.string(), "the shard of tensor '" + name + "' is not a file name in the directory", fix);
    by_shard[shard.get<std::string>()].push_back(name);
  }
  std::vector<StTensor> out;
  for (const auto& [shard, names] : by_shard) {
    const std::string path = (fs::path(dir) / shard).string();
    std::vector<StTensor> ts = read_safetensors(path);
    std::set<std::string> held;
    for (const StTensor& t : ts) held.insert(t.name);
    for (const std::string& n : names)
      if (!held.count(n))
        throw UserError(path, "does not hold tensor '" + n + "', which " + index.filename().string() + " puts there",
                        fix);
    for (StTensor& t : ts) out.push_back(std::move(t));
  }
  return out;
}

std::vector<StTensor> hf_to_loom(const ModelConfig& c, const std::vector<StTensor>& hf, const std::string& source) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  const std::string fix = "the checkpoint must hold exactly the parameters its config.json describes";
  std::map<std::string, const nn::HfParam*> expected;
  for (const nn::HfParam& p : map.params) expected[p.hf_name] = &p;
  std::map<std::string, const StTensor*> found;
  const StTensor* tied_head = nullptr;
  for (const StTensor& t : hf) {
    if (map.is_buffer && map.is_buffer(t.name)) continue;
    if (t.name == "lm_head.weight" && !expected.count(t.name)) {
      tied_head = &t;
      continue;
    }
    // Files written from the base model class (GPT2Model: the original GPT-2 hub checkpoint) lack
    // the prefix.
    const std::string name =
        expected.count(t.name) || !expected.count(map.prefix + t.name) ? t.name : map.prefix + t.name;
    if (!expected.count(name))
      throw UserError(
          source, "tensor '" + t.name + "' is not a parameter of " + map.architecture + " as config.json has it", fix);
    if (!found.emplace(name, &t).second)
      throw UserError(source, "tensor '" + name + "' is there twice (with and without '" + map.prefix + "')", fix);
  }
  std::vector<StTensor> out;  // in the order of their first tensor in the map
  std::map<std::string, size_t> index;
  for (const nn::HfParam& p : map.params) {
    LOOM_ASSERT(!p.path.empty(), "hf_to_loom: a model from config.json has every bias its architecture has");
    auto it = found.find(p.hf_name);
    if (it == found.end()) throw UserError(source, "tensor '" + p.hf_name + "' is missing", fix);
    const StTensor& t = *it->second;
    if (t.shape != p.hf_shape)
      throw UserError(
          source, "tensor '" + p.hf_name + "' is " + t.shape.str() + "; config.json's model needs " + p.hf_shape.str(),
          fix);
    const std::vector<float> v = to_f32(t, source);
    if (auto [at, added] = index.emplace(p.path, out.size()); added)
      out.push_back(
          {p.path, DType::f32, p.shape, std::vector<unsigned char>(static_cast<size_t>(p.shape.numel()) * 4)});
    auto* dst = reinterpret_cast<float*>(out[index.at(p.path)].bytes.data());
    for_each_run(p, map, [&](int64_t h, int64_t l, int64_t n) {
      std::memcpy(dst + l, v.data() + h, static_cast<size_t>(n) * 4);
    });
  }
  if (tied_head) {  // it must be the embedding (transformers would tie it and drop its values)
    const std::vector<float> head = to_f32(*tied_head, source);
    const StTensor& table = out[index.at("embed/embedding")];
    if (tied_head->shape != table.shape || std::memcmp(head.data(), table.bytes.data(), table.bytes.size()) != 0)
      throw UserError(
          source,
          "tensor 'lm_head.weight' differs from '" + map.params.front().hf_name + "', but config.json ties them",
          "set tie_word_embeddings as the checkpoint was trained");
  }
  return out;
}

std::vector<StTensor> loom_to_hf(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  std::vector<StTensor> out;
  out.reserve(map.params.size());
  for (const nn::HfParam& p : map.params) {
    out.push_back(
        {p.hf_name, DType::f32, p.hf_shape, std::vector<unsigned char>(static_cast<size_t>(p.hf_shape.numel()) * 4)});
    if (p.path.empty()) continue;  // a bias the model lacks: zero
    auto it = loom.find(p.path);
    // The same row-major values: a quantized LoRA base kernel is stored as its [K, N] product.
    LOOM_ASSERT(it != loom.end() && it->second->dtype == DType::f32 && it->second->shape.numel() == p.shape.numel(),
                "loom_to_hf: parameter '" + p.path + "' is missing or misshapen");
    const auto* src = reinterpret_cast<const float*>(it->second->bytes.data());
    auto* dst = reinterpret_cast<float*>(out.back().bytes.data());
    for_each_run(p, map,
                 [&](int64_t h, int64_t l, int64_t n) { std::memcpy(dst + h, src + l, static_cast<size_t>(n) * 4); });
  }
  return out;
}

}  // namespace loom
