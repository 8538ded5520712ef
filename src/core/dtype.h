#pragma once
// Element types of tensors and the conversions between them.
//
// Conversion contract (all functions below):
//   * Narrowing to a 16-bit float rounds to nearest, ties to even, exactly as
//     IEEE 754 (and numpy float16 / ml_dtypes bfloat16) do for every finite
//     input, subnormal inputs and outputs included. Finite values whose
//     rounded magnitude exceeds the largest finite value become +-inf
//     (float16: |x| >= 65520; bfloat16: |x| >= 0x1.ffp127).
//   * +-inf and +-0 keep their sign.
//   * NaN stays NaN with its sign. Narrowing keeps the top payload bits and
//     sets the quiet bit (the x86 F16C / AVX512-BF16 behaviour), so a NaN can
//     never truncate into an infinity. Libraries disagree on NaN payloads
//     (numpy keeps signalling NaNs, ml_dtypes/PyTorch canonicalise), so
//     payload bits are the one thing not matched bit for bit.
//   * Widening is exact. float16 -> float32 quiets signalling NaNs (as F16C
//     vcvtph2ps does); bfloat16 -> float32 is a plain 16-bit shift, because
//     that is what every bf16 implementation (CUDA, PyTorch, ml_dtypes) does
//     and hot loops depend on it being one instruction.
//   * float -> int32 truncates toward zero, saturates to [INT32_MIN,
//     INT32_MAX] and maps NaN to 0 (CUDA __float2int_rz semantics), so it is
//     defined for every input instead of being UB as static_cast would be.
//   * int32 -> float rounds to nearest even (correctly rounded to the target
//     type, without double rounding through float32).
//
// Element memory is accessed with memcpy, so buffers need no particular
// alignment and may be any storage (std::byte arrays etc.).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace loom {

// The element types f32 … i32, then the quantized storage formats of a frozen dense kernel W [K, N]
// (lora.base_dtype): i8 (int8 codes, a float32 scale per output channel) and nf4 (QLoRA's 4-bit
// codes, a float32 absmax per block of 64). A format has no element size: its buffers hold codes
// and scales together (core/quant.h), and only the dense kernels and upload_param read or write one.
enum class DType : uint8_t { f32, bf16, f16, i32, i8, nf4 };
// The element types: DType values 0 .. kNumDTypes - 1 (convert() and dtype_size take only these).
inline constexpr int kNumDTypes = 4;
inline bool dtype_is_quantized(DType dt) { return dt == DType::i8 || dt == DType::nf4; }

// A DType value outside the enum is a bug in loom, not bad input (user text
// goes through dtype_from_name): every function here taking a DType aborts
// on one, like a failed LOOM_ASSERT (core/error.h).

// Bytes per element: 4, 2, 2, 4 (a quantized format aborts: quant_bytes in core/quant.h).
size_t dtype_size(DType dt);
// Canonical names "float32", "bfloat16", "float16", "int32", "int8", "nf4".
const char* dtype_name(DType dt);
// Accepts the element types' canonical names and the short aliases "fp32", "f32",
// "bf16", "fp16", "f16", "i32" (case-sensitive); anything else (the quantized
// formats too: no tensor file or compute dtype is one) is nullopt.
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_float(DType dt);

namespace detail {
// The abort for out-of-range DTypes, out of line so the switches in the
// inline helpers below stay small and their valid cases pay nothing.
[[noreturn]] void bad_dtype(DType dt);
}  // namespace detail

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // Truncating a NaN with only low payload bits would give inf.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // bfloat16 is the top half of a float32 with the same exponent range, so
  // RNE is: add just under half an ulp, plus one if the kept lsb is odd.
  // Subnormals need no special case, and a carry out of the mantissa
  // correctly bumps the exponent (up to inf).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {
    if (a == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  // 65520 = halfway between 65504 (max finite) and 65536; the tie goes to
  // the even neighbour 65536, which does not exist, hence >=.
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {
    // Normal result: rebias the exponent (127 -> 15) and round away the low
    // 13 mantissa bits; a mantissa carry correctly bumps the exponent.
    uint32_t r = a - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Below 2^-25 (half the smallest subnormal, itself a tie to even 0) the
  // result is zero. This also covers float32 zeros and subnormals, which
  // have no implicit leading bit for the code below.
  if (a <= 0x33000000u) return sign;
  // Subnormal result in units of 2^-24: value = m * 2^(e - 150), so the
  // count of units is m >> (126 - e), with shift in [14, 24] here.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126u - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  // q == 0x400 (rounded up to the smallest normal) is the right encoding.
  return static_cast<uint16_t>(sign | q);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x03ffu;
  uint32_t bits;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (m != 0 ? 0x00400000u | (m << 13) : 0u);
  } else if (e != 0) {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    bits = sign;
  } else {
    // Subnormal m * 2^-24: normalise so the leading 1 lands on bit 10.
    const uint32_t shift = static_cast<uint32_t>(std::countl_zero(m)) - 21u;
    bits = sign | ((113u - shift) << 23) | (((m << shift) & 0x03ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Truncating, saturating, NaN -> 0 (see the contract at the top).
inline int32_t f32_to_i32(float f) {
  if (f != f) return 0;
  // Both bounds are exact floats: -2^31 and 2^31.
  if (f <= -2147483648.0f) return INT32_MIN;
  if (f >= 2147483648.0f) return INT32_MAX;
  return static_cast<int32_t>(f);
}

// Element i of the buffer p, holding elements of type dt, as float32.
// int32 values beyond 2^24 are rounded to nearest even.
inline float load_as_f32(const void* p, DType dt, size_t i) {
  const auto* b = static_cast<const unsigned char*>(p);
  switch (dt) {
    case DType::f32: {
      float v;
      std::memcpy(&v, b + i * 4, 4);
      return v;
    }
    case DType::bf16: {
      uint16_t v;
      std::memcpy(&v, b + i * 2, 2);
      return bf16_to_f32(v);
    }
    case DType::f16: {
      uint16_t v;
      std::memcpy(&v, b + i * 2, 2);
      return f16_to_f32(v);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, b + i * 4, 4);
      return static_cast<float>(v);
    }
    case DType::i8:
    case DType::nf4:
      break;  // no elements: core/quant.h
  }
  detail::bad_dtype(dt);
}

// Stores v as element i of the buffer p of type dt, rounding as above.
inline void store_from_f32(void* p, DType dt, size_t i, float v) {
  auto* b = static_cast<unsigned char*>(p);
  switch (dt) {
    case DType::f32:
      std::memcpy(b + i * 4, &v, 4);
      return;
    case DType::bf16: {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(b + i * 2, &h, 2);
      return;
    }
    case DType::f16: {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(b + i * 2, &h, 2);
      return;
    }
    case DType::i32: {
      const int32_t x = f32_to_i32(v);
      std::memcpy(b + i * 4, &x, 4);
      return;
    }
    case DType::i8:
    case DType::nf4:
      break;  // no elements: core/quant.h
  }
  detail::bad_dtype(dt);
}

// The float32 value v becomes after a store to dt and a load back: identity
// for f32, RNE rounding for the 16-bit floats, truncation for i32. Reference
// kernels use it to emulate low-precision storage of f32 results.
inline float round_to(DType dt, float v) {
  switch (dt) {
    case DType::f32:
      return v;
    case DType::bf16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::f16:
      return f16_to_f32(f32_to_f16(v));
    case DType::i32:
      return static_cast<float>(f32_to_i32(v));
    case DType::i8:
    case DType::nf4:
      break;  // no elements: core/quant.h
  }
  detail::bad_dtype(dt);
}

// Converts n elements from src (type src_dt) to dst (type dst_dt), for every
// pair of dtypes, with the rounding rules at the top of this file; each
// result is the single correct rounding of the source value. src and dst
// must not overlap, except that src == dst is allowed when both dtypes have
// the same size (in-place cast).
void convert(const void* src, DType src_dt, void* dst, DType dst_dt, size_t n);

}  // namespace loom
