// LoRA (PEFT's LoraConfig and lora.Linear, ../shared/REFERENCE-models.md §6): low-rank adapters on
// a transformer's dense layers, the rest of the model frozen. An adapted layer computes
//   y = base(x) + scale · B(A(dropout(x))),  scale = alpha / rank (alpha / √rank with rsLoRA),
// with A [in, r] drawn from U(±1/√in) (PEFT's kaiming_uniform_(a=√5)) and B [r, out] zeros, so a
// fresh adapter leaves the model's outputs as they were. The base parameters are created frozen
// (Scope::frozen): no gradients, no optimizer state, no weight-gradient products.
//
// Targets are PEFT's module names. Loom packs q, k and v into one qkv kernel; an adapter on
// q_proj alone adds its update into the q columns only (add_low_rank), so each PEFT module keeps
// its own A and B and an export is exact. GPT-2's c_attn is one module over the packed kernel:
// one A and a B per q, k, v slice, which laid end to end are c_attn's lora_B in (3, H, D) order.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/choice.h"
#include "graph/graph.h"

// PEFT's target module names (lora.targets). A swiglu transformer (Llama) has the first seven,
// a GELU one (GPT-2) the last three; all-linear is every dense layer but the output head.
#define LOOM_LORA_TARGETS(X)                                                      \
  X(q_proj, "q_proj", "the query columns of the packed qkv (Llama)")              \
  X(k_proj, "k_proj", "the key columns of the packed qkv (Llama)")                \
  X(v_proj, "v_proj", "the value columns of the packed qkv (Llama)")              \
  X(o_proj, "o_proj", "the attention's output projection (Llama)")                \
  X(gate_proj, "gate_proj", "the MLP's gate layer (Llama)")                       \
  X(up_proj, "up_proj", "the MLP's up layer (Llama)")                             \
  X(down_proj, "down_proj", "the MLP's output layer (Llama)")                     \
  X(c_attn, "c_attn", "the whole packed qkv, one A for q, k and v (GPT-2)")       \
  X(c_proj, "c_proj", "the attention's and the MLP's output projections (GPT-2)") \
  X(c_fc, "c_fc", "the MLP's input layer (GPT-2)")                                \
  X(all_linear, "all-linear", "every dense layer except the output head (the family's names)")

// How the frozen base's dense kernels are stored (lora.base_dtype): every dense layer of the
// transformer blocks, adapted or not, as QLoRA quantizes every nn.Linear; the embeddings, the
// output head and the norms stay float32 (PEFT and QLoRA keep them unquantized). The dense kernels
// widen the stored values to the compute dtype on the fly (core/quant.h for the two formats).
#define LOOM_LORA_BASE_DTYPES(X)                                                               \
  X(float32, "float32", "float32 masters, as in full training")                                \
  X(bfloat16, "bfloat16", "rounded to bfloat16 once at load: half the bytes")                  \
  X(int8, "int8", "int8 with a float32 absmax scale per output channel: about 1/4 of float32") \
  X(nf4, "nf4", "QLoRA's NF4, blocks of 64 with a float32 absmax each: about 1/7 of float32")

namespace loom {

LOOM_CHOICE_SPELLED(LoraBaseDType, "LoRA base storage", LOOM_LORA_BASE_DTYPES)

LOOM_CHOICE_SPELLED(LoraTarget, "LoRA target module", LOOM_LORA_TARGETS)

struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters, every parameter trains
  double alpha = 8;  // PEFT's lora_alpha
  double dropout = 0;
  ChoiceSet<LoraTarget> targets{LoraTarget::all_linear};
  bool use_rslora = false;
  // A PEFT adapter directory the adapters start from (adapter_config.json, adapter_model.safetensors:
  // io/peft.h); "" = PEFT's initialisation.
  std::string init_from;
  LoraBaseDType base_dtype = LoraBaseDType::float32;
  bool enabled() const { return rank > 0; }
  // The dtype (or quantized format) of the frozen base's dense kernels: f32 without LoRA.
  DType base_storage() const;
  // alpha / rank, or alpha / √rank with rsLoRA.
  float scale() const;
  bool operator==(const LoraConfig&) const = default;
};

namespace nn {

// The targets as module names of the model's family: all-linear expanded; `llama_names` picks
// Llama's names (a swiglu MLP) or GPT-2's. UserError naming lora.targets for a name the family
// lacks.
ChoiceSet<LoraTarget> lora_modules(const LoraConfig& c, bool llama_names);

// Where one B's update goes in the adapted layer's output y [..., W]: columns [offset, offset +
// width) of y's last dim, B's output features being `heads` × width (the packed qkv's key/value
// heads; 1 elsewhere). `suffix` names B ("b" alone, "b_q" for c_attn's slices).
struct LoraSlice {
  const char* suffix;
  int64_t offset, width, heads;
};

// y + the adapter's update: under `s` (frozen or not) the trainable parameters "<s>/a" [in, r]
// and "<s>/<slice.suffix>" [r, heads · width], one dropout of x [..., in] (when training), one
// product with A, per slice its B's product added into y's columns in `dtype` by one add_low_rank
// (the [..., heads · width] product is never stored).
ValueId lora_update(const Scope& s, ValueId x, ValueId y, std::span<const LoraSlice> slices, const LoraConfig& c,
                    DType dtype, bool train);

}  // namespace nn
}  // namespace loom
