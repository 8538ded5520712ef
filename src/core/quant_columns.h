// Quantizing a kernel a slab of columns at a time (core/quant.h's formats), so that a large frozen
// kernel can be drawn and quantized from bounded slices without a float32 copy of all of it
// (io/param_io.h's init_param_in); quantize_kernel is these slabs over the whole kernel.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace loom {

// The columns n0 of W [K, N] that a slab can start at: multiples of this (1 for i8; for nf4 the
// columns whose first element n·K starts a block of 64).
int64_t quant_column_step(DType dt, int64_t K);

// Quantizes columns [n0, n1) of W [K, N] alone, given as wt = Wᵀ's rows [n1 - n0, K] (row n - n0
// is W[:, n]), writing exactly the bytes of out (quant_bytes(dt, {K, N})) that those columns
// define: their codes and scales, the bytes quantize_kernel writes there. n0 and n1 are
// multiples of quant_column_step (n1 may be N; LOOM_ASSERT). The padding after the last code is
// not written: start from a zeroed buffer.
void quantize_columns(DType dt, const float* wt, int64_t K, int64_t N, int64_t n0, int64_t n1, void* out);

}  // namespace loom
