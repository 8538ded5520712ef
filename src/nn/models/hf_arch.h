// A Hugging Face architecture as a table row: what a family folder (nn/models/<family>/) says
// about one `transformers` model class, as data that io/hf.h interprets. A row holds
//   - its names: the architecture ("GPT2LMHeadModel") and config.json's model_type ("gpt2");
//   - config.json in and out: which loom model.* keys its keys set (with their origins, for
//     messages) and the config.json of a loom model;
//   - the tensor map: which loom parameter is which tensor, with its name, shape and layout there
//     (HfLayout: the layout transforms io/hf.cpp applies, shared by every architecture).
// io/hf.cpp reads and writes the files, converts dtypes and applies the layouts; it never names
// an architecture. The rows are listed in nn/models/registry.h (LOOM_HF_ARCHITECTURES).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/shape.h"
#include "nn/config.h"

namespace loom::nn {

enum class HfLayout {
  same,         // the same row-major values
  qkv_columns,  // GPT-2's c_attn: the last axis is (3, H, D) in the file, (H, 3, D) in loom
  transposed,   // nn.Linear's weight: [a, b] in the file is loom's [b, a] (loom's shape flattened to 2-D)
  qkv_rows,     // Llama's q/k/v_proj [KV·slots·D, C]: transposed into slots [slot, slot + slots) of
                // each key/value head of loom's [C, KV, (G+2)·D]; three tensors share one parameter;
                // their biases [KV·slots·D] likewise into loom's [KV, (G+2)·D] (C = 1)
};

struct HfParam {
  std::string hf_name;  // "transformer.h.0.attn.c_attn.weight"
  Shape hf_shape;       // [C, 3C]
  std::string path;     // "block_0/attn/qkv/kernel"; "" for a bias the model lacks (zero)
  Shape shape;          // [C, H, 3D]
  HfLayout layout = HfLayout::same;
  int64_t slot = 0, slots = 0;  // qkv_rows: the part of each key/value head's (G+2)·D columns
};

struct HfModelMap {
  std::string architecture;  // "GPT2LMHeadModel"
  std::string model_type;    // config.json's "model_type": "gpt2"
  std::string prefix;        // of the base model's tensors ("transformer.", "model."), which files
                             // written from the base model class (GPT2Model) lack
  int64_t heads = 0, head_dim = 0, kv_heads = 0;
  // Whether the blocks' linear weights are stored [in, out] (GPT-2's Conv1D) rather than torch's
  // [out, in]: merges, PEFT's fan_in_fan_out and the GGUF export transpose by it.
  bool conv1d = false;
  std::vector<HfParam> params;  // every parameter of the model, in the HF file order
  // Buffers older checkpoints saved beside the parameters (GPT-2's causal masks, Llama's rotary
  // inverse frequencies): skipped on import.
  bool (*is_buffer)(const std::string& hf_name) = nullptr;
};

// config.json's keys the file lacks, each with the config class's default it was read as
// ({"hidden_size", "4096"}).
using HfAbsentKeys = std::vector<std::pair<std::string, std::string>>;

// Reads one config.json's keys, with the config class's default when a key is absent or null; a
// value of the wrong type, or an option loom does not run (fail), is a UserError naming the file
// and the key. `absent` (when given) collects the integer keys read that the file lacks (not those
// it gives as null): the sizes and counts that decide the tensors' shapes and how many there are,
// so that tensors contradicting a default can be blamed on the missing key.
class HfConfigJson {
 public:
  HfConfigJson(const nlohmann::json& j, const std::string& path, HfAbsentKeys* absent = nullptr)
      : j_(j), path_(path), absent_(absent) {}
  // The same file, read with another config class's defaults: a key absent or null in the file
  // takes its value in `defaults` (an object) before the caller's default (a row that reads its
  // config as a relative's does: Qwen3's defaults through Llama's reader).
  HfConfigJson(const HfConfigJson& file, const nlohmann::json& defaults)
      : j_(file.j_), path_(file.path_), defaults_(&defaults), absent_(file.absent_) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const nlohmann::json* find(const char* key) const;     // nullptr: absent or null
  bool present(const char* key) const;                   // in the file, null or not
  int64_t integer(const char* key, int64_t dflt) const;  // positive
  double number(const char* key, double dflt) const;     // positive
  bool boolean(const char* key, bool dflt) const;
  std::string text(const char* key, const std::string& dflt) const;

 private:
  // Records `key`, read as `value`, when the file lacks it.
  void note_absent(const char* key, int64_t value) const;

  const nlohmann::json& j_;
  const std::string& path_;
  const nlohmann::json* defaults_ = nullptr;
  HfAbsentKeys* absent_ = nullptr;
};

// One `transformers` architecture loom reads and writes.
struct HfArchitecture {
  std::string_view architecture;  // "GPT2LMHeadModel"
  std::string_view model_type;    // "gpt2"
  // How the refusal of an unknown architecture lists it: "GPT2LMHeadModel (model_type \"gpt2\")".
  std::string_view listed_as;
  // Whether this architecture is the one a loom model `c` exports as (the first row that claims a
  // model is asked for its map, which may still refuse it).
  bool (*claims)(const ModelConfig& c);
  // config.json -> `m` (loom's defaults on entry) and the model.* keys it decides, their origins
  // naming config.json's keys.
  void (*read_config)(const HfConfigJson& j, ModelConfig& m, std::vector<ArchKey>& keys);
  // The config.json of `c` (without bos/eos, which io adds), given its map.
  nlohmann::json (*write_config)(const ModelConfig& c, const HfModelMap& map);
  // The map of `c`'s parameters; a model this architecture cannot hold is a UserError naming the
  // model.* key.
  HfModelMap (*tensor_map)(const ModelConfig& c);
  // llama.cpp's name for it (general.architecture of a GGUF file: train/gguf_export.h), "" when
  // llama.cpp runs no such model.
  std::string_view gguf_architecture = {};
  // Whether llama.cpp's architecture rotates adjacent pairs (2j, 2j+1) where transformers rotates
  // (j, j + D/2) (its "llama" rope type), so that the export permutes q_proj's and k_proj's rows
  // within each head.
  bool gguf_rotate_pairs = false;
  // Whether llama.cpp's converter writes attention.key_length and value_length even where the
  // heads split the width (H·D = C): it does for architectures whose config.json has head_dim.
  bool gguf_head_lengths = false;
};

// Every architecture of LOOM_HF_ARCHITECTURES, in its order.
std::span<const HfArchitecture* const> hf_architectures();
// The architecture config.json names by `model_type` and `architecture` (either may be "", not
// both), or nullptr.
const HfArchitecture* find_hf_architecture(std::string_view model_type, std::string_view architecture);
// Why loom refuses a known relative of its architectures (model_type "qwen2": its q/k/v biases),
// or "" for a model_type loom knows nothing about.
std::string_view hf_near_miss(std::string_view model_type);

// The map of `c`'s parameters, by the first architecture that claims `c`. A model that no
// `transformers` architecture loom knows can hold (the tutorial's mlp_first blocks, an untied head
// with its bias, RMSNorm with a GELU MLP, ...) is a UserError naming the model.* key.
HfModelMap hf_model_map(const ModelConfig& c);
// The architecture hf_model_map(c) uses.
const HfArchitecture& hf_architecture_of(const ModelConfig& c);

// Helpers for the rows' tensor maps.
// Refuses a model `architecture` cannot hold, naming the key and what the architecture needs.
struct HfNeeds {
  const char* architecture;
  const char* variant;
  void operator()(bool ok, const char* key, const std::string& problem) const;
};
// Appends the entries of one architecture's map (prefix added to the names; a bias of a model
// without biases has no loom path).
struct HfMapBuilder {
  HfModelMap& m;
  bool use_bias;
  void operator()(const std::string& hf, Shape hf_shape, std::string path, Shape shape,
                  HfLayout layout = HfLayout::same, int64_t slot = 0, int64_t slots = 0) const;
};
// The checks every decoder architecture makes: a causal transformer with attention first, and
// none of Gemma 3's options (sliding_window_pattern, rope_local_theta, query_pre_attn_scalar,
// scale_embeddings).
void hf_check_decoder(const ModelConfig& c, const HfNeeds& need);

// The sizes a rotary decoder's config.json gives (the Llama-style rows, Gemma 3), as its row read
// them with its config class's defaults.
struct HfDecoderSizes {
  int64_t hidden_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0;  // num_attention_heads, num_key_value_heads
  int64_t head_dim = 0, intermediate_size = 0, vocab_size = 0;
  int64_t max_positions = 0;    // max_position_embeddings
  double norm_eps = 0;          // rms_norm_eps
  bool tie_embeddings = false;  // tie_word_embeddings
  bool qkv_bias = false;        // biases on q_proj, k_proj and v_proj (Qwen2) and on no other layer
};
// Sets `m` (loom's defaults on entry) to the transformer of these sizes with what every such row
// shares: block_order attn_first, position rope, causal attention, no biases but qkv_bias, no
// embedding dropout, GPT-2's init; returns the model.* keys it decides, their origins naming
// config.json's keys or `architecture`. The row then sets its norm, MLP, window and own options
// and appends their keys.
std::vector<ArchKey> hf_read_decoder(const std::string& architecture, const HfDecoderSizes& s, ModelConfig& m);

// Rotary embeddings as config.json gives them (Llama-style rows): rope_theta, and the rope type
// with its parameters from rope_parameters (transformers 5) or rope_scaling (4.x; 5 lets a
// non-null one win). Sets m's model.rope_* keys and appends them to `keys`; a rope_type other
// than default and llama3 is refused naming the key. `max_positions` is the model's
// max_position_embeddings, llama3's original_max_position_embeddings when neither gives it.
void hf_read_rope(const HfConfigJson& j, int64_t max_positions, ModelConfig& m, std::vector<ArchKey>& keys);
// config.json's rope keys for `c`, in both spellings: rope_parameters (transformers 5) and
// rope_theta plus rope_scaling (4.x, which ignores rope_parameters).
nlohmann::json hf_rope_json(const ModelConfig& c);

}  // namespace loom::nn
