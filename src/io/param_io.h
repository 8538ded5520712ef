// Parameters (and gradients) to and from safetensors tensors, in the file layout of
// nn/param_layout.h (per layer, or stacked for model.scan_layers).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "nn/param_layout.h"
#include "runtime/executor.h"

namespace loom {

// Every parameter (or, with `grads`, every trainable one's gradient) as float32 tensors, named by
// file layout. The parameters must be float32 masters (not narrowed: LOOM_ASSERT), here and in
// param_sources; `subset` picks the trainable or frozen ones of a LoRA run (nn/param_layout.h).
std::vector<StTensor> export_params(const Executor& ex, bool scan_layers, bool grads = false,
                                    const std::string& prefix = {});
// The same tensors as sources that read the executor's buffers piecewise (stream_safetensors):
// saving them costs no host copy of the parameters.
std::vector<StSource> param_sources(const Executor& ex, bool scan_layers, const std::string& prefix = {},
                                    nn::ParamSubset subset = nn::ParamSubset::all);
// Loads every parameter of `subset` from `tensors` (looked up by file-layout name with `prefix`),
// each through upload_param. A missing tensor, a wrong shape or a non-float32 dtype is a UserError
// naming `file` and the tensor.
void import_params(Executor& ex, const std::map<std::string, const StTensor*>& tensors, bool scan_layers,
                   const std::string& file, const std::string& prefix = {},
                   nn::ParamSubset subset = nn::ParamSubset::all);
// Where a streamed load (import_params from located tensors, io/hf.h's load_hf_params) stores the
// parameters of a graph: every element into an executor's buffers (executor_sink), or only some
// elements of each, e.g. a ZeRO-3 rank's slice (train/trainer.h, Trainer::param_sink). The load
// reads only the kept elements wherever the file's layout keeps them contiguous.
struct ParamSink {
  // The elements [first, second) of parameter p that are stored.
  std::function<std::pair<int64_t, int64_t>(ValueId p)> keep;
  // Stores values [n] at elements [at, at + n) of p, which lie within keep(p).
  std::function<void(ValueId p, int64_t at, const float* values, size_t n)> store;
  // The executor that holds every element, when the sink is executor_sink(*ex): a quantized kernel
  // (a LoRA base) is quantized whole into it. Null for a sink that keeps parts.
  Executor* ex = nullptr;
};
// Every element of every parameter into ex, rounded to its dtype (store_param_values).
ParamSink executor_sink(Executor& ex);
// The same from the located tensors of `file` (scan_safetensors), read piecewise through one
// kStreamBytes buffer into `sink`: no host copy of a parameter, except a quantized kernel, which is
// quantized whole. `progress` is called before every read (Comm::keep_alive: the other ranks wait
// for this one's disk).
void import_params(const Graph& g, const ParamSink& sink, const std::map<std::string, const StEntry*>& entries,
                   bool scan_layers, const std::string& file, const std::string& prefix = {},
                   nn::ParamSubset subset = nn::ParamSubset::all, const std::function<void()>& progress = {});
// Stores the float32 master `values` of parameter p (its numel floats) in ex, rounded to the
// parameter's dtype: to nearest even, the dense and embedding kernels' rounding, for one narrowed
// to the compute dtype (graph/passes/narrow_params.h) or a LoRA base in bfloat16; quantized by
// core/quant.h for an int8 or nf4 base kernel; as they are for a float32 one.
void upload_param(Executor& ex, ValueId p, const float* values);
// Stores values [n] at elements [at, at + n) of parameter p (not quantized), rounded to its dtype
// as upload_param rounds them; `scratch` holds the rounded bytes between calls.
void store_param_values(Executor& ex, ValueId p, int64_t at, const float* values, size_t n,
                        std::vector<unsigned char>& scratch);
// Draws parameter p's initial values from `seed` (nn/init.h) into ex as upload_param stores them,
// `slice` values at a time: no host copy of the whole float32 tensor. A quantized kernel is drawn
// in slabs of whole columns (core/quant.h's quantize_columns) into one host copy of its stored
// bytes. The stored bytes equal upload_param's of init_param's values, whatever `slice`.
inline constexpr int64_t kInitSliceValues = int64_t{1} << 20;  // 4 MiB of float32
void init_param_in(Executor& ex, const Param& p, uint64_t seed, int64_t slice = kInitSliceValues);
// Parameter p's values as float32 [numel]: as stored, widened from a 16-bit dtype, or a quantized
// kernel's dequantized values (core/quant.h), in the parameter's row-major layout.
std::vector<float> download_param(const Executor& ex, ValueId p);
// The parameters of graph `g` as float32 tensors named by path (one per layer), cut out of
// `tensors` in the file layout (stacked for scan_layers), with import_params' checks: a file's
// parameters without an executor.
std::vector<StTensor> params_by_path(const Graph& g, const std::map<std::string, const StTensor*>& tensors,
                                     bool scan_layers, const std::string& file,
                                     nn::ParamSubset subset = nn::ParamSubset::all);

}  // namespace loom
