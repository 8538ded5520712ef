#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom {
namespace {

float bits_f32(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }

// A 16-bit float format described by numbers only, so the reference below
// shares no code or bit tricks with the implementation under test.
struct Format {
  int mant_bits;  // explicit fraction bits
  int exp_bits;
  int bias;
  double max_finite;  // largest finite value
  uint16_t (*encode)(float);
  float (*decode)(uint16_t);
};

const Format kF16{10, 5, 15, 65504.0, f32_to_f16, f16_to_f32};
const Format kBF16{7, 8, 127, std::ldexp(2.0 - std::ldexp(1.0, -7), 127), f32_to_bf16, bf16_to_f32};

// Value of a bit pattern straight from the IEEE definition.
double ref_decode(const Format& fmt, uint16_t h) {
  const int sign = h >> 15;
  const int e = (h >> fmt.mant_bits) & ((1 << fmt.exp_bits) - 1);
  const int m = h & ((1 << fmt.mant_bits) - 1);
  double v;
  if (e == (1 << fmt.exp_bits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(m, 1 - fmt.bias - fmt.mant_bits);
  } else {
    v = std::ldexp((1 << fmt.mant_bits) + m, e - fmt.bias - fmt.mant_bits);
  }
  return sign ? -v : v;
}

// Nearest representable value to finite x, ties to even, in double: the
// quantum is 2^(exponent - mant_bits), with the exponent clamped at the
// subnormal range. x has at most 24 significant bits, so x / quantum is
// exact and rint (default rounding mode: nearest-even) does the rounding.
double ref_round(const Format& fmt, double x) {
  if (x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int min_exp = 1 - fmt.bias;
  const int exp = std::max(e - 1, min_exp);
  const double quantum = std::ldexp(1.0, exp - fmt.mant_bits);
  const double r = std::rint(x / quantum) * quantum;
  if (std::fabs(r) > fmt.max_finite) return std::copysign(INFINITY, x);
  return r;
}

// Checks encode(x) against the reference, by value and by sign (which makes
// it a bit-pattern check, since decode is verified injective on non-NaNs).
void expect_matches_reference(const Format& fmt, float x) {
  const uint16_t h = fmt.encode(x);
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(ref_decode(fmt, h))) << std::hexfloat << x;
    EXPECT_EQ(h >> 15, f32_bits(x) >> 31);
    return;
  }
  const double want = ref_round(fmt, x);
  const double got = ref_decode(fmt, h);
  ASSERT_EQ(got, want) << std::hexfloat << "x=" << x << " bits=0x" << std::hex << f32_bits(x) << " got=0x" << h;
  ASSERT_EQ(std::signbit(got), std::signbit(x)) << std::hexfloat << x;
}

TEST(DType, Metadata) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_STREQ(dtype_name(DType::f32), "float32");
  EXPECT_STREQ(dtype_name(DType::bf16), "bfloat16");
  EXPECT_STREQ(dtype_name(DType::f16), "float16");
  EXPECT_STREQ(dtype_name(DType::i32), "int32");
  EXPECT_TRUE(dtype_is_float(DType::f32));
  EXPECT_TRUE(dtype_is_float(DType::bf16));
  EXPECT_TRUE(dtype_is_float(DType::f16));
  EXPECT_FALSE(dtype_is_float(DType::i32));
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto dt = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(dt)), dt);
  }
  EXPECT_EQ(dtype_from_name("fp32"), DType::f32);
  EXPECT_EQ(dtype_from_name("bf16"), DType::bf16);
  EXPECT_EQ(dtype_from_name("fp16"), DType::f16);
  EXPECT_EQ(dtype_from_name("i32"), DType::i32);
  EXPECT_EQ(dtype_from_name("Float32"), std::nullopt);
  EXPECT_EQ(dtype_from_name(""), std::nullopt);
  EXPECT_EQ(dtype_from_name("float64"), std::nullopt);
}

// An out-of-range DType is a loom bug: it aborts with the value, it does not
// throw or read out of bounds.
// The quantized kernel formats after the element types (core/quant.h) have no elements: the
// element functions abort on them too.
TEST(DTypeDeathTest, OutOfRangeDTypeAborts) {
  const auto bad = static_cast<DType>(static_cast<int>(DType::nf4) + 1);
  EXPECT_DEATH(dtype_size(bad), "DType value 6");
  EXPECT_DEATH(dtype_name(bad), "DType value 6");
  EXPECT_DEATH(dtype_is_float(bad), "DType value 6");
  EXPECT_DEATH(round_to(bad, 1.0f), "DType value 6");
  EXPECT_DEATH(load_as_f32(nullptr, bad, 0), "DType value 6");
  EXPECT_DEATH(store_from_f32(nullptr, bad, 0, 1.0f), "DType value 6");
  EXPECT_DEATH(dtype_size(DType::i8), "DType value 4");
  EXPECT_DEATH(load_as_f32(nullptr, DType::nf4, 0), "DType value 5");
  uint16_t v = 0;
  EXPECT_DEATH(convert(&v, static_cast<DType>(200), &v, DType::f16, 1), "DType value 200");
  EXPECT_DEATH(convert(&v, DType::f16, &v, static_cast<DType>(200), 1), "DType value 200");
}

TEST(DType, DecodeMatchesDefinitionForAllPatterns) {
  for (const Format* fmt : {&kF16, &kBF16}) {
    for (uint32_t i = 0; i < 65536; ++i) {
      const auto h = static_cast<uint16_t>(i);
      const double want = ref_decode(*fmt, h);
      const float got = fmt->decode(h);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << std::hex << h;
        EXPECT_EQ(f32_bits(got) >> 31, i >> 15u) << std::hex << h;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
        ASSERT_EQ(std::signbit(got), (i >> 15) != 0) << std::hex << h;
      }
    }
  }
}

TEST(DType, F16NaNIsQuietAfterWidening) {
  // 0x7c01 is a signalling NaN; widening quiets it and keeps the payload.
  EXPECT_EQ(f32_bits(f16_to_f32(0x7c01)), 0x7fc02000u);
  EXPECT_EQ(f32_bits(f16_to_f32(0xfe00)), 0xffc00000u);
}

TEST(DType, RoundTripEveryPattern) {
  for (const Format* fmt : {&kF16, &kBF16}) {
    const uint16_t quiet_bit = static_cast<uint16_t>(1u << (fmt->mant_bits - 1));
    for (uint32_t i = 0; i < 65536; ++i) {
      const auto h = static_cast<uint16_t>(i);
      const float f = fmt->decode(h);
      const uint16_t back = fmt->encode(f);
      if (std::isnan(f)) {
        // Same sign and payload, quiet bit set.
        EXPECT_EQ(back, h | quiet_bit) << std::hex << h;
      } else {
        ASSERT_EQ(back, h) << std::hex << h;
      }
    }
  }
}

TEST(DType, F16EdgeCases) {
  // Ties to even, both directions: 1 + 2^-11 is halfway between 1 (even)
  // and 1 + 2^-10 (odd); 1 + 3 * 2^-11 between 1 + 2^-10 (odd) and
  // 1 + 2^-9 (even).
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)), 0x3c01);
  EXPECT_EQ(f32_to_f16(-(1.0f + 0x1p-11f)), 0xbc00);
  EXPECT_EQ(f32_to_f16(-(1.0f + 3 * 0x1p-11f)), 0xbc02);
  // Largest finite and overflow: 65520 is the tie between 65504 and 2^16.
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_f32(0xfc00), -INFINITY);
  // NaN: stays NaN, keeps sign, quiet, never collapses to inf even when only
  // low payload bits are set.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0xff800001u, 0xffffffffu}) {
    const uint16_t h = f32_to_f16(bits_f32(nan));
    EXPECT_EQ(h & 0x7e00, 0x7e00) << std::hex << nan;
    EXPECT_EQ(h >> 15, nan >> 31) << std::hex << nan;
    EXPECT_TRUE(std::isnan(f16_to_f32(h)));
  }
  EXPECT_EQ(f32_to_f16(bits_f32(0x7fc00000u)), 0x7e00);
  // Signed zeros.
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  // Subnormals: smallest is 2^-24; 2^-25 is a tie that goes to even 0.
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 0.0f)), 0x0000);
  EXPECT_EQ(f32_to_f16(0x1p-30f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  // Halfway between subnormals k and k + 1: (k + 0.5) * 2^-24.
  EXPECT_EQ(f32_to_f16(1.5f * 0x1p-24f), 0x0002);  // 1|2 -> 2
  EXPECT_EQ(f32_to_f16(2.5f * 0x1p-24f), 0x0002);  // 2|3 -> 2
  EXPECT_EQ(f32_to_f16(3.5f * 0x1p-24f), 0x0004);  // 3|4 -> 4
  EXPECT_EQ(f32_to_f16(std::nextafter(2.5f * 0x1p-24f, 1.0f)), 0x0003);
  // Normal/subnormal boundary: 2^-14 is the smallest normal, 0x03ff the
  // largest subnormal; their midpoint ties to the even 0x0400.
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03ff);
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);
  EXPECT_EQ(f32_to_f16(std::nextafter(1023.5f * 0x1p-24f, 0.0f)), 0x03ff);
  EXPECT_EQ(f32_to_f16(1022.5f * 0x1p-24f), 0x03fe);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-14f, 0.0f)), 0x0400);
}

TEST(DType, BF16EdgeCases) {
  // Ties to even: 1 + 2^-8 between 1 (even) and 1 + 2^-7 (odd); 1 + 3 * 2^-8
  // between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 3 * 0x1p-8f, 0.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
  EXPECT_EQ(f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  // Largest finite (0x1.fep127) and overflow at the midpoint 0x1.ffp127.
  const float max_bf16 = 0x1.fep127f;
  EXPECT_EQ(f32_to_bf16(max_bf16), 0x7f7f);
  EXPECT_EQ(bf16_to_f32(0x7f7f), max_bf16);
  EXPECT_EQ(f32_to_bf16(std::nextafter(0x1.ffp127f, 0.0f)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(0x1.ffp127f), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-0x1.ffp127f), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(bf16_to_f32(0x7f80), INFINITY);
  EXPECT_EQ(bf16_to_f32(0xff80), -INFINITY);
  // NaN: only low payload bits set must still be NaN, not inf.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0xffc00000u}) {
    const uint16_t h = f32_to_bf16(bits_f32(nan));
    EXPECT_EQ(h & 0x7fc0, 0x7fc0) << std::hex << nan;
    EXPECT_EQ(h >> 15, nan >> 31) << std::hex << nan;
    EXPECT_TRUE(std::isnan(bf16_to_f32(h)));
  }
  EXPECT_EQ(f32_to_bf16(bits_f32(0x7fc00000u)), 0x7fc0);
  // Signed zeros.
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(bf16_to_f32(0x8000)));
  // Subnormals: smallest is 2^-133; 2^-134 ties to even 0.
  EXPECT_EQ(f32_to_bf16(0x1p-133f), 0x0001);
  EXPECT_EQ(bf16_to_f32(0x0001), 0x1p-133f);
  EXPECT_EQ(f32_to_bf16(0x1p-134f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0x1p-134f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::nextafter(0x1p-134f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_bf16(std::nextafter(0x1p-134f, 0.0f)), 0x0000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(1.5f * 0x1p-133f), 0x0002);
  EXPECT_EQ(f32_to_bf16(2.5f * 0x1p-133f), 0x0002);
  EXPECT_EQ(f32_to_bf16(3.5f * 0x1p-133f), 0x0004);
  // Normal/subnormal boundary: 2^-126 is 0x0080, 0x007f the largest
  // subnormal; their midpoint ties to the even 0x0080.
  EXPECT_EQ(f32_to_bf16(0x1p-126f), 0x0080);
  EXPECT_EQ(bf16_to_f32(0x007f), 127 * 0x1p-133f);
  EXPECT_EQ(f32_to_bf16(127.5f * 0x1p-133f), 0x0080);
  EXPECT_EQ(f32_to_bf16(std::nextafter(127.5f * 0x1p-133f, 0.0f)), 0x007f);
  EXPECT_EQ(f32_to_bf16(126.5f * 0x1p-133f), 0x007e);
}

// Random floats of every exponent, with mantissas biased towards the
// interesting cases: exact ties, one ulp either side of a tie, and values
// that round up into the next binade.
void check_against_reference(const Format& fmt) {
  std::mt19937 gen(12345);
  std::uniform_int_distribution<uint32_t> bits;
  const int dropped = 23 - fmt.mant_bits;  // float32 fraction bits rounded off
  const uint32_t half = 1u << (dropped - 1);
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t exp = 0; exp < 256; ++exp) {
      for (int k = 0; k < 2000; ++k) {
        uint32_t mant = bits(gen) & 0x7fffffu;
        switch (k % 5) {
          case 0:  // exact tie
            mant = (mant & ~((half << 1) - 1)) | half;
            break;
          case 1:  // just above a tie
            mant = (mant & ~((half << 1) - 1)) | (half + 1);
            break;
          case 2:  // just below a tie
            mant = (mant & ~((half << 1) - 1)) | (half - 1);
            break;
          case 3:  // top kept bits all ones: rounding may carry into the exponent
            mant |= 0x7fffffu & ~(half - 1);
            break;
          default:
            break;
        }
        expect_matches_reference(fmt, bits_f32(sign << 31 | exp << 23 | mant));
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
  for (int k = 0; k < 4'000'000; ++k) {
    expect_matches_reference(fmt, bits_f32(bits(gen)));
    if (testing::Test::HasFatalFailure()) return;
  }
  // Every float in and around the subnormal range of the target, densely.
  const uint32_t lo = fmt.mant_bits == 10 ? f32_bits(0x1p-26f) : 0u;
  const uint32_t hi = fmt.mant_bits == 10 ? f32_bits(0x1p-13f) : f32_bits(0x1p-125f);
  for (uint32_t u = lo; u <= hi; u += 7) {
    expect_matches_reference(fmt, bits_f32(u));
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(DType, F32ToF16MatchesReference) { check_against_reference(kF16); }
TEST(DType, F32ToBF16MatchesReference) { check_against_reference(kBF16); }

TEST(DType, LoadStoreAndRoundTo) {
  std::vector<unsigned char> buf(16);
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto dt = static_cast<DType>(i);
    store_from_f32(buf.data() + 1, dt, 2, 3.0f);  // misaligned on purpose
    EXPECT_EQ(load_as_f32(buf.data() + 1, dt, 2), 3.0f) << dtype_name(dt);
  }
  EXPECT_EQ(round_to(DType::f32, 0.1f), 0.1f);
  EXPECT_EQ(round_to(DType::bf16, 1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(round_to(DType::f16, 1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_to(DType::f16, 1e5f), INFINITY);
  EXPECT_EQ(round_to(DType::i32, -2.7f), -2.0f);
  EXPECT_EQ(f32_to_i32(2.7f), 2);
  EXPECT_EQ(f32_to_i32(-2.7f), -2);
  EXPECT_EQ(f32_to_i32(NAN), 0);
  EXPECT_EQ(f32_to_i32(3e9f), INT32_MAX);
  EXPECT_EQ(f32_to_i32(2147483648.0f), INT32_MAX);
  EXPECT_EQ(f32_to_i32(-2147483648.0f), INT32_MIN);
  EXPECT_EQ(f32_to_i32(-INFINITY), INT32_MIN);
  EXPECT_EQ(f32_to_i32(2147483520.0f), 2147483520);
}

// Source values for convert tests, as float32; each is stored into the
// source dtype first, so what the source buffer holds is exactly known.
const std::vector<float> kConvertValues = {
    0.0f,           -0.0f,      1.0f,     -1.0f,    2.5f,      -2.5f,    0.1f,     1.0f + 0x1p-8f, 1.0f + 0x1p-11f,
    3.0f + 0x1p-9f, 65504.0f,   65520.0f, -1e6f,    1e30f,     0x1p-24f, 0x1p-25f, 0x1p-133f,      0x1.fep127f,
    16777217.0f,    123456.75f, -7.0f,    INFINITY, -INFINITY, NAN,      -NAN,     3e9f,           -3e9f};

TEST(DType, ConvertEveryPair) {
  const size_t n = kConvertValues.size();
  for (int s = 0; s < kNumDTypes; ++s) {
    const auto sdt = static_cast<DType>(s);
    std::vector<unsigned char> src(n * dtype_size(sdt));
    for (size_t i = 0; i < n; ++i) store_from_f32(src.data(), sdt, i, kConvertValues[i]);
    for (int d = 0; d < kNumDTypes; ++d) {
      const auto ddt = static_cast<DType>(d);
      SCOPED_TRACE(std::string(dtype_name(sdt)) + " -> " + dtype_name(ddt));
      std::vector<unsigned char> dst(n * dtype_size(ddt));
      convert(src.data(), sdt, dst.data(), ddt, n);
      if (sdt == ddt) {
        EXPECT_EQ(src, dst);
        continue;
      }
      // Every source value here is exact in float32 (the int32 ones are
      // small or powers of two, or round the same either way), so convert
      // must equal load-then-store.
      std::vector<unsigned char> want(dst.size());
      for (size_t i = 0; i < n; ++i) {
        store_from_f32(want.data(), ddt, i, load_as_f32(src.data(), sdt, i));
      }
      EXPECT_EQ(dst, want);
    }
  }
}

TEST(DType, ConvertIntsCorrectlyRounded) {
  // int32 -> bfloat16 must round once: via float32, 2^24 + 2^16 + 1 would
  // become 2^24 + 2^16 and then tie down to 2^24.
  const std::vector<int32_t> ints = {0,
                                     1,
                                     -1,
                                     255,
                                     257,
                                     -257,
                                     (1 << 24) + (1 << 16) + 1,
                                     -((1 << 24) + (1 << 16) + 1),
                                     (1 << 24) + (1 << 16),
                                     (1 << 24) + 3 * (1 << 16),
                                     INT32_MAX,
                                     INT32_MIN,
                                     INT32_MIN + 1,
                                     65519,
                                     65520,
                                     2049,
                                     2051,
                                     (1 << 30) + (1 << 22) + 1};
  const size_t n = ints.size();
  std::vector<uint16_t> bf(n), hf(n);
  std::vector<float> f(n);
  convert(ints.data(), DType::i32, bf.data(), DType::bf16, n);
  convert(ints.data(), DType::i32, hf.data(), DType::f16, n);
  convert(ints.data(), DType::i32, f.data(), DType::f32, n);
  std::vector<int32_t> back(n);
  convert(f.data(), DType::f32, back.data(), DType::i32, n);
  for (size_t i = 0; i < n; ++i) {
    const double x = ints[i];
    SCOPED_TRACE(ints[i]);
    EXPECT_EQ(static_cast<double>(bf16_to_f32(bf[i])), ref_round(kBF16, x));
    EXPECT_EQ(static_cast<double>(f16_to_f32(hf[i])), ref_round(kF16, x));
    EXPECT_EQ(f[i], static_cast<float>(ints[i]));
    EXPECT_EQ(back[i], f32_to_i32(f[i]));
  }
  EXPECT_EQ(bf16_to_f32(bf[6]), 16777216.0f + 131072.0f);
  EXPECT_EQ(bf16_to_f32(bf[7]), -(16777216.0f + 131072.0f));
}

TEST(DType, ConvertInPlaceAndEmpty) {
  std::vector<uint16_t> v = {f32_to_bf16(1.5f), f32_to_bf16(-3.0f), f32_to_bf16(1e20f)};
  convert(v.data(), DType::bf16, v.data(), DType::f16, v.size());
  EXPECT_EQ(v[0], f32_to_f16(1.5f));
  EXPECT_EQ(v[1], f32_to_f16(-3.0f));
  EXPECT_EQ(v[2], 0x7c00);
  convert(nullptr, DType::f32, nullptr, DType::f16, 0);
  convert(nullptr, DType::f32, nullptr, DType::f32, 0);
}

}  // namespace
}  // namespace loom
