// PEFT LoRA adapters (../shared/REFERENCE-models.md §6): loom's adapters (nn/lora.h) under the
// names and layouts peft.PeftModel.from_pretrained reads from adapter_model.safetensors, for a
// model a Hugging Face architecture row holds (nn/models/hf_arch.h gives the module paths).
//   loom "<layer>/lora_<module>/a" [in, r]   base_model.model.<hf module>.lora_A.weight [r, in]
//   loom "<layer>/lora_<module>/b" [r, out]  base_model.model.<hf module>.lora_B.weight [out, r]
// c_attn's three B slices b_q, b_k, b_v, laid end to end, are its lora_B rows in (3, H, D) order.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "nn/config.h"
#include "runtime/executor.h"

namespace loom {

struct PeftTensor {
  std::string name;                // "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
  std::vector<std::string> paths;  // the loom parameters, transposed and stacked by rows in this order
};

// The adapter tensors of the LoRA model `c` (lora.rank > 0), in parameter order. A model no
// architecture row holds is the row's UserError naming the model.* key.
std::vector<PeftTensor> peft_tensor_map(const ModelConfig& c);
// The PEFT module names the adapters sit on ("q_proj", "c_attn", ...): target_modules.
std::vector<std::string> peft_target_modules(const ModelConfig& c);
// adapter_config.json: LoraConfig's fields as PEFT writes them; base_model_name_or_path is
// model.init_from.
nlohmann::json peft_adapter_config(const ModelConfig& c);

// loom parameters by path -> PEFT tensors (float32), and back; a missing tensor or a wrong shape
// is a UserError naming `source`.
std::vector<StTensor> loom_to_peft(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom);
std::vector<StTensor> peft_to_loom(const ModelConfig& c, const std::map<std::string, const StTensor*>& peft,
                                   const std::string& source);

// Loads the PEFT adapter directory `dir` (adapter_config.json, adapter_model.safetensors, float32,
// bfloat16 or float16) into the trainable parameters of `ex`, built from `c`. The adapter must be
// the one `c` describes: its r, lora_alpha, use_rslora and target_modules are checked against the
// lora.* keys (a UserError naming the key and the value the adapter has); a missing file or
// tensor, or a wrong shape, is a UserError naming the file.
void load_peft_adapter(Executor& ex, const ModelConfig& c, const std::string& dir);

}  // namespace loom
