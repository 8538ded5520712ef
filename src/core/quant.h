// Quantized storage of a frozen dense kernel (lora.base_dtype = int8 | nf4, nn/lora.h): the
// formats DType::i8 and DType::nf4, and the one definition of what each stores and dequantizes to.
//
// A kernel W [K, N] (loom's layout: y = x·W) is quantized as Wᵀ [N, K] flattened row-major, the
// order of PyTorch's nn.Linear weight [out, in] that bitsandbytes quantizes: element (n, k) is
// number i = n·K + k. Both formats are symmetric absmax schemes with float32 scales:
//
//   i8 (one scale per output channel n, ../shared/REFERENCE-models.md §7's per-row int8):
//     absmax_n = max_k |W[k, n]|, scale_n = fl32(absmax_n / 127),
//     q = clamp(rint(W[k, n] / scale_n), -127, 127) (quotient in double, nearest with ties to
//     even; q = 0 where scale_n = 0), dequantized w = fl32(q · scale_n).
//     Bytes: the codes int8 [N, K], then the scales float32 [N].
//   nf4 (bitsandbytes' quantize_4bit with quant_type nf4, blocksize 64, no double quantization):
//     blocks of 64 consecutive elements i (the last one shorter when N·K % 64 != 0),
//     absmax_b = max |w| over the block (float32), xn = fl32(w / absmax_b) clamped to [-1, 1], and
//     the code is the number of kNf4Thresholds strictly below xn: the nearest of the 16 kNf4Codes,
//     a value on a threshold taking the lower one. The thresholds are bitsandbytes' CUDA kernel's
//     float literals (dQuantizeNF4); some are an ulp off the float32 midpoints of adjacent codes,
//     and the kernel's are the ones QLoRA weights were made with. A block of zeros (absmax 0)
//     gets code 7 (0.0) where bitsandbytes would divide by zero. Dequantized w = fl32(code · absmax_b).
//     Bytes: two codes per byte, element 2j in the high nibble and 2j + 1 in the low one (a last odd
//     element's partner 0), padded to a multiple of 4 bytes; then the absmax float32 [ceil(N·K / 64)].
//
// "fl32(a · b)" is the float32 product, which is also the exact product rounded once to float32:
// the reference backend dequantizes in double and rounds once, the CPU multiplies in float32, and
// both get these values bit for bit. A dense kernel then rounds them to its compute dtype like any
// float32 kernel.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/shape.h"

namespace loom {

// bitsandbytes' NF4 code values (get_4bit_type("nf4")), ascending; 0.0 is code 7.
inline constexpr float kNf4Codes[16] = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};
// dQuantizeNF4's decision thresholds between adjacent codes, ascending.
inline constexpr float kNf4Thresholds[15] = {
    -0.8480964004993439f,  -0.6106329262256622f,   -0.4599952697753906f, -0.33967943489551544f, -0.23460740596055984f,
    -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f, 0.1202552504837513f,   0.2035212516784668f,
    0.2920137718319893f,   0.3893125355243683f,    0.5016634166240692f,  0.6427869200706482f,   0.8614784181118011f};
inline constexpr int64_t kNf4Block = 64;

// Bytes of a quantized kernel of `shape` [K, N] in format dt (i8 or nf4); LOOM_ASSERT on another
// dtype or a rank other than 2.
int64_t quant_bytes(DType dt, const Shape& shape);

// Quantizes W [K, N] (float32, loom's layout) into out (quant_bytes(dt, {K, N}) bytes) as above.
void quantize_kernel(DType dt, const float* w, int64_t K, int64_t N, void* out);

// The dequantized W[k, n] for n in [n0, n1), k in [k0, k1), as float32, into
// out[(n - n0) · ld + (k - k0)] (a tile of Wᵀ).
void dequantize_tile(DType dt, const void* q, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t k0, int64_t k1,
                     float* out, int64_t ld);

// The exact product code · scale of W[k, n], in double (rounded once to float32, it is the value
// dequantize_tile gives): the reference backend's dequantization.
double dequantize_exact(DType dt, const void* q, int64_t K, int64_t N, int64_t k, int64_t n);

}  // namespace loom
