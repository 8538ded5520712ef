#include "core/dtype.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace loom {

namespace detail {
void bad_dtype(DType dt) {
  assert_fail(__FILE__, __LINE__, "dt is a DType enumerator", "DType value " + std::to_string(static_cast<int>(dt)));
}
}  // namespace detail

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i8:
    case DType::nf4:
      break;
  }
  detail::bad_dtype(dt);
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    case DType::i32:
      return "int32";
    case DType::i8:
      return "int8";
    case DType::nf4:
      return "nf4";
  }
  detail::bad_dtype(dt);
}

std::optional<DType> dtype_from_name(std::string_view name) {
  struct Entry {
    std::string_view name;
    DType dt;
  };
  static constexpr Entry kNames[] = {
      {"float32", DType::f32}, {"fp32", DType::f32},    {"f32", DType::f32},  {"bfloat16", DType::bf16},
      {"bf16", DType::bf16},   {"float16", DType::f16}, {"fp16", DType::f16}, {"f16", DType::f16},
      {"int32", DType::i32},   {"i32", DType::i32},
  };
  for (const Entry& e : kNames) {
    if (e.name == name) return e.dt;
  }
  return std::nullopt;
}

bool dtype_is_float(DType dt) {
  switch (dt) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
      return true;
    case DType::i32:
    case DType::i8:
    case DType::nf4:
      return false;
  }
  detail::bad_dtype(dt);
}

namespace {

// Compile-time view of a dtype: its storage type and exact/rounding
// conversions through float32. Going through float32 is a single rounding
// for every pair except int32 -> bfloat16 (handled separately below):
// 16-bit floats widen exactly, and int32 -> float16 only rounds inexactly
// in float32 for |x| > 2^24, which overflows float16 either way.
template <DType dt>
struct Traits;

template <>
struct Traits<DType::f32> {
  using T = float;
  static float to_f32(float v) { return v; }
  static float from_f32(float v) { return v; }
};
template <>
struct Traits<DType::bf16> {
  using T = uint16_t;
  static float to_f32(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t from_f32(float v) { return f32_to_bf16(v); }
};
template <>
struct Traits<DType::f16> {
  using T = uint16_t;
  static float to_f32(uint16_t v) { return f16_to_f32(v); }
  static uint16_t from_f32(float v) { return f32_to_f16(v); }
};
template <>
struct Traits<DType::i32> {
  using T = int32_t;
  static float to_f32(int32_t v) { return static_cast<float>(v); }
  static int32_t from_f32(float v) { return f32_to_i32(v); }
};

// int32 -> float32 -> bfloat16 would round twice: 2^24 + 2^16 + 1 rounds
// (tie, to even) to 2^24 + 2^16 in float32, which then ties down to 2^24,
// while the correct bfloat16 result is 2^24 + 2^17. Keep the top 24
// significant bits and fold every lower bit into a sticky lsb instead: the
// float32 value is then exact or strictly between the same two bfloat16
// neighbours as x, on the same side of their midpoint, so the final
// rounding is correct.
uint16_t i32_to_bf16(int32_t x) {
  const bool neg = x < 0;
  // Negate in unsigned arithmetic so INT32_MIN is fine.
  const uint32_t mag = neg ? 0u - static_cast<uint32_t>(x) : static_cast<uint32_t>(x);
  const int drop = static_cast<int>(std::bit_width(mag)) - 24;
  float f;
  if (drop <= 0) {
    f = static_cast<float>(mag);
  } else {
    const uint32_t sticky = (mag & ((1u << drop) - 1u)) != 0 ? 1u : 0u;
    f = std::ldexp(static_cast<float>((mag >> drop) | sticky), drop);
  }
  return f32_to_bf16(neg ? -f : f);
}

template <DType S, DType D>
void convert_loop(const void* src, void* dst, size_t n) {
  using ST = typename Traits<S>::T;
  using DT = typename Traits<D>::T;
  if constexpr (S == D) {
    // Bit-exact copy (NaN payloads included); memmove makes src == dst fine.
    if (n != 0) std::memmove(dst, src, n * sizeof(ST));
  } else {
    const auto* s = static_cast<const unsigned char*>(src);
    auto* d = static_cast<unsigned char*>(dst);
    for (size_t i = 0; i < n; ++i) {
      ST x;
      std::memcpy(&x, s + i * sizeof(ST), sizeof(ST));
      DT y;
      if constexpr (S == DType::i32 && D == DType::bf16) {
        y = i32_to_bf16(x);
      } else {
        y = Traits<D>::from_f32(Traits<S>::to_f32(x));
      }
      std::memcpy(d + i * sizeof(DT), &y, sizeof(DT));
    }
  }
}

using ConvertFn = void (*)(const void*, void*, size_t);

template <DType S>
constexpr ConvertFn kRow[kNumDTypes] = {convert_loop<S, DType::f32>, convert_loop<S, DType::bf16>,
                                        convert_loop<S, DType::f16>, convert_loop<S, DType::i32>};

// Indexed [src][dst] by the enum values, which are 0..kNumDTypes-1.
constexpr const ConvertFn* kTable[kNumDTypes] = {kRow<DType::f32>, kRow<DType::bf16>, kRow<DType::f16>,
                                                 kRow<DType::i32>};

}  // namespace

void convert(const void* src, DType src_dt, void* dst, DType dst_dt, size_t n) {
  const auto s = static_cast<size_t>(src_dt);
  const auto d = static_cast<size_t>(dst_dt);
  if (s >= kNumDTypes) detail::bad_dtype(src_dt);
  if (d >= kNumDTypes) detail::bad_dtype(dst_dt);
  kTable[s][d](src, dst, n);
}

}  // namespace loom
