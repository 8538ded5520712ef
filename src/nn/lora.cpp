#include "nn/lora.h"

#include <cmath>

#include "core/error.h"
#include "nn/config_keys.h"
#include "nn/layers.h"
#include "nn/models.h"

namespace loom {

float LoraConfig::scale() const {
  const double r = static_cast<double>(rank);
  return static_cast<float>(alpha / (use_rslora ? std::sqrt(r) : r));
}

DType LoraConfig::base_storage() const {
  if (!enabled()) return DType::f32;
  switch (base_dtype) {
    case LoraBaseDType::float32:
      return DType::f32;
    case LoraBaseDType::bfloat16:
      return DType::bf16;
    case LoraBaseDType::int8:
      return DType::i8;
    case LoraBaseDType::nf4:
      return DType::nf4;
  }
  LOOM_ASSERT(false, "a LoraBaseDType enumerator");
}

namespace {
bool lora_on(const ModelConfig& c) { return c.lora.enabled(); }
}  // namespace

#define REF(member) LOOM_KEY_REF(ModelConfig, lora.member)

std::vector<KeySpec<ModelConfig>> lora_keys() {
  using namespace keys;
  return {
      integer<ModelConfig>("lora.rank",
                           "LoRA rank r: adapters on the lora.targets layers, every other parameter frozen (0 = off: "
                           "full training)",
                           REF(rank)),
      only_if(number<ModelConfig>("lora.alpha", "PEFT's lora_alpha: the update is scaled by alpha / rank", REF(alpha)),
              lora_on),
      only_if(number<ModelConfig>("lora.dropout", "dropout on the adapters' input, in [0, 1)", REF(dropout)), lora_on),
      only_if(choice_set<ModelConfig>("lora.targets", "PEFT's target_modules", REF(targets)), lora_on),
      only_if(
          boolean<ModelConfig>("lora.use_rslora", "rank-stabilised LoRA: scale alpha / sqrt(rank)", REF(use_rslora)),
          lora_on),
      only_if(path<ModelConfig>("lora.init_from",
                                "start the adapters from this PEFT adapter directory (adapter_config.json, "
                                "adapter_model.safetensors; \"\" = PEFT's initialisation)",
                                REF(init_from)),
              lora_on),
      only_if(choice<ModelConfig>("lora.base_dtype",
                                  "storage of the frozen base's dense kernels (the blocks' layers; embeddings, head "
                                  "and norms stay float32), widened to model.dtype inside the dense kernels",
                                  REF(base_dtype)),
              lora_on),
  };
}

#undef REF

void validate_lora(const ModelConfig& c) {
  check_key(c.lora.rank >= 0, "lora.rank", "must be >= 0", "e.g. 16, or 0 to train every parameter");
  check_key(!c.lora.enabled() || nn::model_kind(c.kind).language_model, "lora.rank",
            "LoRA adapts a transformer's dense layers; this model.kind has none", "set lora.rank = 0");
}

namespace nn {

ChoiceSet<LoraTarget> lora_modules(const LoraConfig& c, bool llama_names) {
  using T = LoraTarget;
  const ChoiceSet<T> llama{T::q_proj, T::k_proj, T::v_proj, T::o_proj, T::gate_proj, T::up_proj, T::down_proj};
  const ChoiceSet<T> gpt2{T::c_attn, T::c_proj, T::c_fc};
  const ChoiceSet<T>& family = llama_names ? llama : gpt2;
  if (c.targets.has(T::all_linear)) return family;
  if (c.targets.empty())
    throw UserError("lora.targets", "names no module", "e.g. all-linear, or q_proj,v_proj (PEFT's target_modules)");
  for (size_t i = 0; i < choices_of(T{}).size(); ++i) {
    const auto t = static_cast<T>(i);
    if (c.targets.has(t) && !family.has(t))
      throw UserError("lora.targets",
                      std::string("names ") + std::string(choice_name(t)) + ", which a " +
                          (llama_names ? "swiglu (Llama-style)" : "GELU (GPT-2-style)") + " transformer lacks",
                      std::string("use ") + choice_set_name(family) + " or all-linear");
  }
  return c.targets;
}

ValueId lora_update(const Scope& s, ValueId x, ValueId y, std::span<const LoraSlice> slices, const LoraConfig& c,
                    DType dtype, bool train) {
  const Scope t = s.frozen(false);
  const int64_t in = t.graph().value(x).shape.last(), r = c.rank;
  // PEFT's kaiming_uniform_(a=√5) on lora_A [r, in]: U(±1/√in).
  const ValueId a =
      t.param("a", Shape{in, r}, ParamInit{ParamInit::uniform, static_cast<float>(1.0 / std::sqrt(double(in)))});
  const ValueId xa = t.op1(OpKind::dense, {dropout(t, x, static_cast<float>(c.dropout), train), a},
                           DenseAttrs{.compute = dtype, .low_rank = true});  // [..., r]
  for (const LoraSlice& sl : slices) {
    const ValueId b = t.param(sl.suffix, Shape{r, sl.heads * sl.width}, ParamInit{ParamInit::zeros, 0});
    y = t.op1(OpKind::add_low_rank, {y, xa, b},
              ColumnsAttrs{.offset = sl.offset, .width = sl.width, .scale = c.scale(), .compute = dtype});
  }
  return y;
}

}  // namespace nn
}  // namespace loom
