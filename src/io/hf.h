// Hugging Face model directories, in and out (docs/ARCHITECTURE.md, "Hugging Face checkpoints"):
//   config.json                     the architecture (transformers' config class fields)
//   model.safetensors               the parameters by transformers' names, or shards listed by
//   model.safetensors.index.json    {"weight_map": {tensor name: shard file}}
// Which loom parameter is which tensor is each architecture's row (nn/models/hf_arch.h); this file reads and writes the files and
// converts the tensors (float32, bfloat16 and float16 in; float32 out), whole (hf_to_loom) or in
// bounded slices straight into an executor's parameters (load_hf_params).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/param_io.h"
#include "io/safetensors.h"
#include "nn/config.h"
#include "nn/models/hf_arch.h"

namespace loom {

struct HfConfig {
  std::string path;           // of config.json
  std::string architecture;   // "GPT2LMHeadModel"
  ModelConfig model;          // loom's defaults with every key of `keys` set
  std::vector<ArchKey> keys;  // origins name config.json's keys
  nn::HfAbsentKeys absent;    // the integer keys config.json lacks, read as its class's defaults
};

// True when `dir` holds a config.json, i.e. is a Hugging Face model directory (a loom run holds
// config.toml, a loom checkpoint state.json).
bool is_hf_model_dir(const std::string& dir);

// Reads dir/config.json: the model is named by model_type, or by architectures without it, and
// each architecture's row (nn/models/hf_arch.h; GPT-2's in nn/models/gpt2/, Llama's in
// nn/models/llama/) says which model.* keys its keys set. Missing keys take transformers' config
// class defaults. An architecture or an option loom cannot run exactly (Qwen2's q/k/v biases,
// Qwen3's q/k norms, another activation, rope scaling in rope_parameters or rope_scaling, a GPT-2
// with an untied head, unscaled or layer-scaled attention, cross-attention) is a UserError naming
// the file and the key. Tensors that contradict a model whose config.json lacks keys the
// architecture reads (hf_to_loom, load_hf_params) are a UserError naming config.json and those
// keys, with the defaults they were read as.
HfConfig read_hf_config(const std::string& dir);

// config.json for `c` (nn::hf_model_map(c) must accept it), as transformers writes it for the
// architecture that claims `c`; bos/eos token ids when >= 0 (null otherwise).
nlohmann::json hf_config_json(const ModelConfig& c, int32_t bos_id = -1, int32_t eos_id = -1);

// Every tensor of dir/model.safetensors, or of the shards dir/model.safetensors.index.json lists
// (each listed tensor must be in its shard); `file` (when given) gets the path of the file or
// index read, for messages. No weights file, a bad index or a damaged file is a UserError naming
// the file.
std::vector<StTensor> read_hf_tensors(const std::string& dir, std::string* file = nullptr);

// The parameters of model `c` (per layer, loom paths, float32) from a Hugging Face checkpoint's
// tensors `hf`: names mapped (with or without the base model's prefix, "transformer." or
// "model.", which files written from GPT2Model lack), shapes checked, float32/bfloat16/float16
// converted, laid out as the architecture's map says (GPT-2's c_attn columns permuted, Llama's
// matrices transposed and q/k/v packed). Buffers (GPT-2's causal masks h.<l>.attn.bias and
// .masked_bias, Llama's rotary_emb.inv_freq; HfModelMap::is_buffer) are skipped, and the lm_head.weight of a tied model must equal the
// embedding. A missing, extra or misshapen tensor, or another dtype, is a UserError naming
// `source` (the file) and the tensor.
std::vector<StTensor> hf_to_loom(const ModelConfig& c, const std::vector<StTensor>& hf, const std::string& source);

// Stores the parameters of `subset` of ex's model `c` from the Hugging Face directory `dir` (files
// as read_hf_tensors finds them, checked as hf_to_loom checks them; `file` gets the file or index
// read): exactly the values upload_param stores from hf_to_loom's tensors, but read, converted and
// stored about `slice` values at a time, so the load holds no whole tensor on the host. A
// quantized base kernel is quantized in slabs of whole columns (core/quant_columns.h) into one
// host copy of its stored bytes, as init_param_in draws one. The files are scanned (checksums)
// once before any value is stored. `progress` is called before every read, scans included
// (Comm::keep_alive: the other ranks wait for this one's disk).
void load_hf_params(Executor& ex, const ModelConfig& c, const std::string& dir, nn::ParamSubset subset,
                    std::string* file = nullptr, int64_t slice = kInitSliceValues,
                    const std::function<void()>& progress = {});
// The same into `sink` (io/param_io.h), for graph g: of each parameter only the elements the sink
// keeps are stored (a ZeRO-3 rank's slice), and only the rows of a Hugging Face tensor that reach
// them are read. A row-major tensor, or one whose columns are permuted within a row (GPT-2's
// c_attn), is read about as far as the slice reaches; a transposed or q/k/v-packed one (Llama's
// matrices) spreads every row over the whole parameter, so each rank reads all of it, still
// `slice` values at a time, one tensor after another. A quantized kernel needs an executor sink.
void load_hf_params(const Graph& g, const ParamSink& sink, const ModelConfig& c, const std::string& dir,
                    nn::ParamSubset subset, std::string* file = nullptr, int64_t slice = kInitSliceValues,
                    const std::function<void()>& progress = {});

// The inverse: `loom` maps every parameter path of `c` to its float32 tensor (per layer); the
// result holds transformers' names and layouts, float32, in the order of nn::hf_model_map (zero
// biases for a model without biases).
std::vector<StTensor> loom_to_hf(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom);

}  // namespace loom
