// The quantized kernel formats (core/quant.h) against a reference written here from the published
// schemes (../shared/REFERENCE-models.md §7), independently of core/quant.cpp:
//   - NF4: bitsandbytes' code values and its CUDA kernel's 15 decision thresholds (dQuantizeNF4, as
//     literals: the implementation derives them as midpoints), blocks of 64 along the flattened
//     PyTorch weight [out, in], float32 absmax per block, two codes per byte with the first in the
//     high nibble; the packed codes, the absmaxes and the dequantized values compared bit for bit,
//     on shapes whose blocks cross output channels, end short and have an odd element count, with
//     values exactly on thresholds (they take the lower code) and a block of zeros;
//   - int8: per output channel scale = absmax / 127, q = nearest (ties to even), w = q · scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/quant.h"
#include "core/rng.h"

namespace loom {
namespace {

constexpr float kCodes[16] = {-1.0f,
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
// dQuantizeNF4's comparisons, ascending (the kernel walks them as a binary tree of strict >), as
// nvcc reads its float literals.
constexpr float kThresholds[15] = {
    -0.8480964004993439f,  -0.6106329262256622f,   -0.4599952697753906f, -0.33967943489551544f, -0.23460740596055984f,
    -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f, 0.1202552504837513f,   0.2035212516784668f,
    0.2920137718319893f,   0.3893125355243683f,    0.5016634166240692f,  0.6427869200706482f,   0.8614784181118011f};

// W [K, N] (loom's layout) with N(0, 1) values, some rows scaled up so absmaxes differ.
std::vector<float> random_kernel(int64_t K, int64_t N, uint64_t seed) {
  std::vector<float> w(static_cast<size_t>(K * N));
  const PhiloxKey key = rng_key(seed, 0, 0, 0);
  for (size_t i = 0; i < w.size(); ++i) w[i] = rng_normal(key, i) * (i % 7 == 0 ? 3.f : 1.f);
  return w;
}

struct Nf4 {
  std::vector<unsigned char> packed;  // ceil(numel / 2) bytes
  std::vector<float> absmax;
  std::vector<float> dequant;  // in the flattened [N, K] order
};
// The published scheme over PyTorch's weight Wᵀ [N, K], row-major.
Nf4 reference_nf4(const std::vector<float>& w, int64_t K, int64_t N) {
  std::vector<float> flat(static_cast<size_t>(K * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) flat[static_cast<size_t>(n * K + k)] = w[static_cast<size_t>(k * N + n)];
  Nf4 r;
  std::vector<int> codes(flat.size());
  for (size_t b0 = 0; b0 < flat.size(); b0 += 64) {
    const size_t b1 = std::min(flat.size(), b0 + 64);
    float m = 0;
    for (size_t i = b0; i < b1; ++i) m = std::max(m, std::fabs(flat[i]));
    r.absmax.push_back(m);
    for (size_t i = b0; i < b1; ++i) {
      int c = 7;
      if (m > 0) {
        float xn = flat[i] / m;
        xn = std::min(1.f, std::max(-1.f, xn));
        c = 0;
        while (c < 15 && xn > kThresholds[c]) ++c;
      }
      codes[i] = c;
      r.dequant.push_back(kCodes[c] * m);
    }
  }
  for (size_t i = 0; i < codes.size(); i += 2)
    r.packed.push_back(static_cast<unsigned char>(codes[i] << 4 | (i + 1 < codes.size() ? codes[i + 1] : 0)));
  return r;
}

void expect_nf4_matches(const std::vector<float>& w, int64_t K, int64_t N, const std::string& what) {
  const Nf4 ref = reference_nf4(w, K, N);
  std::vector<unsigned char> q(static_cast<size_t>(quant_bytes(DType::nf4, Shape{K, N})));
  quantize_kernel(DType::nf4, w.data(), K, N, q.data());
  // Codes padded to 4 bytes, then the absmaxes.
  const size_t code_bytes = (ref.packed.size() + 3) / 4 * 4;
  ASSERT_EQ(q.size(), code_bytes + 4 * ref.absmax.size()) << what;
  for (size_t i = 0; i < ref.packed.size(); ++i) ASSERT_EQ(q[i], ref.packed[i]) << what << ": packed byte " << i;
  for (size_t b = 0; b < ref.absmax.size(); ++b) {
    float a;
    std::memcpy(&a, q.data() + code_bytes + 4 * b, 4);
    ASSERT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(ref.absmax[b])) << what << ": absmax " << b;
  }
  std::vector<float> deq(static_cast<size_t>(K * N));
  dequantize_tile(DType::nf4, q.data(), K, N, 0, N, 0, K, deq.data(), K);
  for (size_t i = 0; i < deq.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(deq[i]), std::bit_cast<uint32_t>(ref.dequant[i])) << what << ": element " << i;
    const int64_t n = static_cast<int64_t>(i) / K, k = static_cast<int64_t>(i) % K;
    ASSERT_EQ(static_cast<float>(dequantize_exact(DType::nf4, q.data(), K, N, k, n)), deq[i]) << what;
  }
}

TEST(Quant, Nf4CodesAbsmaxAndValuesAreBitsandbytes) {
  // Blocks of 64 within channels (K = 128), across channels (K = 40), a short last block and an
  // odd element count (7 × 9 = 63).
  for (const auto& [K, N] : std::vector<std::pair<int64_t, int64_t>>{{128, 6}, {40, 13}, {7, 9}, {1, 1}})
    expect_nf4_matches(random_kernel(K, N, static_cast<uint64_t>(K * 100 + N)), K, N,
                       std::to_string(K) + "x" + std::to_string(N));
}

// Away from the thresholds (more than 1e-6 from each) the code is the nearest code value, found
// by distance in double: the thresholds separate the codes.
TEST(Quant, Nf4CodeIsTheNearestCodeValue) {
  const int64_t K = 64, N = 16;
  const std::vector<float> w = random_kernel(K, N, 11);
  std::vector<unsigned char> q(static_cast<size_t>(quant_bytes(DType::nf4, Shape{K, N})));
  quantize_kernel(DType::nf4, w.data(), K, N, q.data());
  int checked = 0;
  for (int64_t n = 0; n < N; ++n) {
    float absmax = 0;
    for (int64_t k = 0; k < K; ++k) absmax = std::max(absmax, std::fabs(w[static_cast<size_t>(k * N + n)]));
    for (int64_t k = 0; k < K; ++k) {
      const double xn = w[static_cast<size_t>(k * N + n)] / absmax;
      if (std::any_of(std::begin(kThresholds), std::end(kThresholds),
                      [&](float t) { return std::fabs(xn - t) < 1e-6; }))
        continue;
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::fabs(xn - kCodes[c]) < std::fabs(xn - kCodes[best])) best = c;
      const int64_t i = n * K + k;
      const int got = i % 2 == 0 ? q[static_cast<size_t>(i / 2)] >> 4 : q[static_cast<size_t>(i / 2)] & 15;
      ASSERT_EQ(got, best) << n << "," << k;
      ++checked;
    }
  }
  EXPECT_GT(checked, K * N - 10);
}

TEST(Quant, Nf4ValuesOnThresholdsTakeTheLowerCodeAndZeroBlocksDequantizeToZero) {
  // One output channel of 64 inputs (one block, absmax 1): every threshold exactly, each code value
  // and a few between; a second channel of zeros.
  const int64_t K = 64, N = 2;
  std::vector<float> w(static_cast<size_t>(K * N), 0.f);
  std::vector<float> col;
  col.push_back(1.f);
  for (float t : kThresholds) col.push_back(t);
  for (float c : kCodes) col.push_back(c);
  for (float t : kThresholds) col.push_back(std::nextafter(t, 2.f));
  while (col.size() < 64) col.push_back(-0.5f);
  for (int64_t k = 0; k < K; ++k) w[static_cast<size_t>(k * N)] = col[static_cast<size_t>(k)];
  expect_nf4_matches(w, K, N, "thresholds");
  std::vector<unsigned char> q(static_cast<size_t>(quant_bytes(DType::nf4, Shape{K, N})));
  quantize_kernel(DType::nf4, w.data(), K, N, q.data());
  EXPECT_EQ(q[0] >> 4, 15) << "1.0";
  EXPECT_EQ(q[0] & 15, 0) << "the first threshold goes to the lower code";
  EXPECT_EQ(q[32], 0x77) << "a block of zeros is code 7 (0.0)";
}

TEST(Quant, Int8PerChannelAbsmax) {
  for (const auto& [K, N] : std::vector<std::pair<int64_t, int64_t>>{{130, 7}, {3, 5}}) {
    std::vector<float> w = random_kernel(K, N, 7);
    for (int64_t k = 0; k < K; ++k) w[static_cast<size_t>(k * N + N - 1)] = 0.f;  // a zero channel
    std::vector<unsigned char> q(static_cast<size_t>(quant_bytes(DType::i8, Shape{K, N})));
    ASSERT_EQ(q.size(), static_cast<size_t>(K * N + 4 * N));
    quantize_kernel(DType::i8, w.data(), K, N, q.data());
    for (int64_t n = 0; n < N; ++n) {
      float absmax = 0;
      for (int64_t k = 0; k < K; ++k) absmax = std::max(absmax, std::fabs(w[static_cast<size_t>(k * N + n)]));
      const float scale = absmax / 127.f;
      float stored;
      std::memcpy(&stored, q.data() + K * N + 4 * n, 4);
      ASSERT_EQ(std::bit_cast<uint32_t>(stored), std::bit_cast<uint32_t>(scale)) << n;
      std::vector<float> deq(static_cast<size_t>(K));
      dequantize_tile(DType::i8, q.data(), K, N, n, n + 1, 0, K, deq.data(), K);
      for (int64_t k = 0; k < K; ++k) {
        const double x = w[static_cast<size_t>(k * N + n)];
        const double code = scale == 0 ? 0 : std::max(-127.0, std::min(127.0, std::nearbyint(x / scale)));
        ASSERT_EQ(static_cast<int8_t>(q[static_cast<size_t>(n * K + k)]), static_cast<int8_t>(code)) << n << "," << k;
        ASSERT_EQ(deq[static_cast<size_t>(k)], static_cast<float>(code) * scale) << n << "," << k;
        EXPECT_LE(std::fabs(deq[static_cast<size_t>(k)] - x), 0.5 * scale + 1e-6 * absmax);
      }
    }
  }
}

}  // namespace
}  // namespace loom
