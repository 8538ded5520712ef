// Flax-like layers over a Scope: each creates its parameters by path under the scope and records
// forward nodes. Layers build graphs; they never run them.
#pragma once
#include <cstdint>

#include "graph/graph.h"

namespace loom::nn {

// Flax's lecun_normal(): truncated normal (±2σ) with variance 1/fan_in, corrected for truncation.
ParamInit lecun_normal(int64_t fan_in);
// `init` for a dense layer's kernel (ParamRole::kernel: what optimizer.weight_decay_mask = kernels
// decays).
ParamInit as_kernel(ParamInit init);

// nn.Dense(features, dtype): kernel [in, features] (lecun_normal), bias [features] (zeros).
ValueId dense(const Scope& s, ValueId x, int64_t features, DType dtype, bool use_bias = true);
// nn.LayerNorm(dtype): scale (ones) and bias (zeros) of [C], fp32 statistics, output in dtype.
// use_bias = false: no bias parameter (nanoGPT's LayerNorm(bias=False)).
ValueId layer_norm(const Scope& s, ValueId x, DType dtype, float eps, bool use_bias = true);
// transformers' LlamaRMSNorm: scale (ones) of [C], no bias, fp32 statistics, output in dtype.
// unit_offset: Gemma's RMSNorm, the scale used is 1 + scale, whose parameter starts at zeros.
ValueId rms_norm(const Scope& s, ValueId x, DType dtype, float eps, bool unit_offset = false);
// nn.Dropout(rate): identity when rate is 0 or not training (Flax returns its input unchanged).
ValueId dropout(const Scope& s, ValueId x, float rate, bool train);
ValueId cast(const Scope& s, ValueId x, DType dtype);

}  // namespace loom::nn
