// Row vector times matrix, c[0, n) = a[0, K) · op(B)[K, n): the M = 1 products of decoding one
// token (backend/cpu/dense.cpp sends them here instead of a GEMM call). At M = 1 a product reads
// each element of B once and does one multiply-add with it, so it runs at the speed B streams from
// memory; a GEMM library's packing and blocking for reuse only add passes over B.
//
// op(B) is B ([K, N] rows of stride ldb) or Bᵀ when tb (B stored [N, K], rows of stride ldb: the
// tied head's layout). Elements are f32, or bfloat16 bits for both a and B (widened exactly: the
// products of bf16 values are exact in f32, so this is the bf16 product with f32 accumulation).
//
// Summation order: without tb every c[n] is one chain of fused multiply-adds over k = 0, 1, …;
// with tb c[n] sums 4·kW chains over k (k's blocks of kW taken in turn by four vectors, lane l of a
// vector the elements ≡ l mod kW), the vectors added pairwise and their lanes folded pairwise, then
// the K mod kW tail in order. An element's result depends only on the operands and the column range
// of its call (GCC may contract a vector body and a scalar tail differently). dense.cpp's K chunks
// are fixed by the shape and its column tiles by the shape and the machine, so results do not
// depend on the thread count.
#pragma once
#include <cstdint>

namespace loom::simd {

void gemv(bool tb, int64_t N, int64_t K, const float* a, const float* B, int64_t ldb, float* c);
void gemv(bool tb, int64_t N, int64_t K, const uint16_t* a, const uint16_t* B, int64_t ldb, float* c);

}  // namespace loom::simd
