// Parameters stored in the compute dtype, for programs that only read them (docs/ARCHITECTURE.md,
// "Sampling").
//
// A dense kernel or bias and an embedding table are rounded to the op's compute dtype each time
// they are read (ops.def: dense casts W and b, embedding gathers round_dtype(table[id])). A
// training step must keep the f32 masters (the optimizer updates them), but a program that never
// writes its parameters (the sampler's decoder and prefill) can round them once, when they are
// stored: narrow_params gives every parameter whose readers all round it to the same 16-bit dtype
// that dtype, so its buffer holds the rounded values in half the bytes and the kernels read them as
// they are: bit for bit the values they would otherwise round on every call. A parameter that any
// reader takes at full precision (LayerNorm and RMSNorm scale and bias) stays float32, and so does
// every parameter of a float32 model. The caller stores the f32 masters rounded to each parameter's dtype
// (io/param_io.h, upload_param: round to nearest even, the kernels' rounding).
#pragma once
#include <vector>

#include "graph/graph.h"

namespace loom {

// Retypes the parameters of the forward-only program g as above (Graph::set_param_dtype) and
// returns them. A node of another phase (a training graph) is a bug (LOOM_ASSERT).
std::vector<ValueId> narrow_params(Graph& g);

}  // namespace loom
