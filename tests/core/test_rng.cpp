#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <set>
#include <vector>

#include "core/rng.h"

namespace loom {
namespace {

using Block = std::array<uint32_t, 4>;

// Known-answer tests from Random123's kat_vectors (philox4x32 10 rounds).
TEST(Rng, PhiloxKnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0}, {0, 0, 0, 0}), (Block{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}),
            (Block{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0xa4093822, 0x299f31d0}, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}),
            (Block{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The documented mapping, spelled out independently of rng.cpp's helpers.
float mapped_uniform(PhiloxKey key, uint64_t i) {
  const uint64_t b = i / 4;
  const Block w = philox4x32_10(key, {static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 0, 0});
  return static_cast<float>(w[i % 4] >> 8) / 16777216.0f;
}

TEST(Rng, UniformFollowsDocumentedMapping) {
  const PhiloxKey key = rng_key(7, 3, 1, 42);
  // Includes indices whose block number needs the high counter word.
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{4}, uint64_t{1} << 34,
                     (uint64_t{1} << 34) + 3, ~uint64_t{0}, uint64_t{0x123456789abcdef}}) {
    EXPECT_EQ(rng_uniform(key, i), mapped_uniform(key, i)) << i;
  }
  // Block number 2^32 must differ from block 0, i.e. the high word is used.
  EXPECT_NE(rng_uniform(key, 0), rng_uniform(key, uint64_t{1} << 34));
}

TEST(Rng, UniformRange) {
  const PhiloxKey key = rng_key(1, 0, 0, 0);
  for (uint64_t i = 0; i < 200000; ++i) {
    const float u = rng_uniform(key, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
  // The extremes of the 24-bit mapping are exact and inside [0, 1).
  EXPECT_LT(static_cast<float>(0xffffffffu >> 8) * 0x1p-24f, 1.0f);
}

TEST(Rng, FillMatchesScalarForAnyOffsetAndLength) {
  const PhiloxKey key = rng_key(99, 5, 2, 7);
  std::vector<uint64_t> firsts = {1001, (uint64_t{1} << 34) - 3, ~uint64_t{0} - 2};
  for (uint64_t f = 0; f < 9; ++f) firsts.push_back(f);
  for (uint64_t first : firsts) {
    for (size_t n = 0; n < 40; n += (n < 18 ? 1 : 7)) {
      // Sentinel one past the end checks that fill writes exactly n.
      std::vector<float> out(n + 1, -1.0f), normal(n + 1, -1.0f);
      rng_uniform_fill(key, first, n, out.data());
      rng_normal_fill(key, first, n, normal.data());
      for (size_t k = 0; k < n; ++k) {
        // first + k wraps past 2^64 - 1 like the scalar index does.
        ASSERT_EQ(out[k], rng_uniform(key, first + k)) << first << " " << n << " " << k;
        ASSERT_EQ(normal[k], rng_normal(key, first + k)) << first << " " << n << " " << k;
      }
      EXPECT_EQ(out[n], -1.0f);
      EXPECT_EQ(normal[n], -1.0f);
    }
  }
}

TEST(Rng, UniformMeanAndVariance) {
  const size_t n = 1 << 20;
  std::vector<float> u(n);
  rng_uniform_fill(rng_key(2024, 1, 0, 3), 0, n, u.data());
  double sum = 0, sum_sq = 0;
  std::vector<size_t> hist(16, 0);
  for (float x : u) {
    sum += x;
    sum_sq += double{x} * x;
    ++hist[static_cast<size_t>(x * 16)];
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Standard errors: 0.29 / sqrt(n) = 2.8e-4 for the mean, 8.6e-5 for the
  // variance; 6 sigma bounds make a false failure practically impossible.
  EXPECT_NEAR(mean, 0.5, 6 * 2.8e-4);
  EXPECT_NEAR(var, 1.0 / 12, 6 * 8.6e-5);
  // Each of 16 bins expects n/16 = 65536 with sd ~ 248.
  for (size_t c : hist) EXPECT_NEAR(static_cast<double>(c), n / 16.0, 6 * 248.0);
}

TEST(Rng, DeterministicAndKeySensitive) {
  const PhiloxKey a = rng_key(1, 2, 3, 4);
  EXPECT_EQ(rng_uniform(a, 12345), rng_uniform(rng_key(1, 2, 3, 4), 12345));
  // Changing any coordinate changes the stream.
  for (PhiloxKey b : {rng_key(2, 2, 3, 4), rng_key(1, 3, 3, 4), rng_key(1, 2, 4, 4), rng_key(1, 2, 3, 5)}) {
    int same = 0;
    for (uint64_t i = 0; i < 64; ++i) same += rng_uniform(a, i) == rng_uniform(b, i);
    EXPECT_LE(same, 2);
  }
}

TEST(Rng, KeysDistinctOverGrid) {
  std::set<uint64_t> keys;
  size_t count = 0;
  // Small coordinates are where a weak hash (e.g. plain xor/add of the
  // fields) collides, so sweep them densely, plus some large seeds/steps.
  for (uint64_t seed :
       {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{42}, uint64_t{1} << 32, ~uint64_t{0}}) {
    for (uint64_t step = 0; step < 64; ++step) {
      for (uint32_t mb = 0; mb < 8; ++mb) {
        for (uint32_t stream = 0; stream < 64; ++stream) {
          const PhiloxKey k = rng_key(seed, step, mb, stream);
          keys.insert((uint64_t{k.k1} << 32) | k.k0);
          ++count;
        }
      }
    }
  }
  EXPECT_EQ(keys.size(), count);
}

TEST(Rng, NormalMeanAndStd) {
  const PhiloxKey key = rng_key(5, 0, 0, 1);
  const size_t n = 1 << 20;
  double sum = 0, sum_sq = 0, sum_4 = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double z = rng_normal(key, i);
    ASSERT_TRUE(std::isfinite(z)) << i;
    sum += z;
    sum_sq += z * z;
    sum_4 += z * z * z * z;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Standard errors: 1/sqrt(n) ~ 9.8e-4 (mean), sqrt(2/n) ~ 1.4e-3 (var),
  // sqrt(96/n) ~ 9.6e-3 (fourth moment, 3 for a normal).
  EXPECT_NEAR(mean, 0.0, 6 * 9.8e-4);
  EXPECT_NEAR(var, 1.0, 6 * 1.4e-3);
  EXPECT_NEAR(sum_4 / n, 3.0, 6 * 9.6e-3);
}

TEST(Rng, NormalFollowsDocumentedMapping) {
  const PhiloxKey key = rng_key(8, 0, 0, 2);
  for (uint64_t i :
       {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{10}, uint64_t{11}, (uint64_t{1} << 40) + 1}) {
    const uint64_t j = i & ~uint64_t{1};
    const double r = std::sqrt(-2.0 * std::log(1.0 - mapped_uniform(key, j)));
    const double t = 2 * std::numbers::pi * mapped_uniform(key, j + 1);
    const double want = (i & 1) ? r * std::sin(t) : r * std::cos(t);
    EXPECT_EQ(rng_normal(key, i), static_cast<float>(want)) << i;
  }
}

TEST(Rng, HostRngIsACursorOverTheStream) {
  const PhiloxKey key = rng_key(11, 0, 0, 0);
  HostRng g(key);
  for (uint64_t i = 0; i < 10; ++i) {
    const uint64_t b = i / 4;
    EXPECT_EQ(g.next_u32(), philox4x32_10(key, {static_cast<uint32_t>(b), 0, 0, 0})[i % 4]);
  }
  for (uint64_t i = 10; i < 20; ++i) EXPECT_EQ(g.next_uniform(), rng_uniform(key, i));
}

TEST(Rng, HostRngSplit) {
  HostRng parent(rng_key(3, 0, 0, 0));
  HostRng a = parent.split(0);
  parent.next_u32();  // advancing the parent must not change its children
  HostRng a2 = parent.split(0);
  HostRng b = parent.split(1);
  EXPECT_EQ(a.key().k0, a2.key().k0);
  EXPECT_EQ(a.key().k1, a2.key().k1);
  EXPECT_FALSE(a.key().k0 == b.key().k0 && a.key().k1 == b.key().k1);
  EXPECT_FALSE(a.key().k0 == parent.key().k0 && a.key().k1 == parent.key().k1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next_u32(), a2.next_u32());
}

TEST(RngDeathTest, NextBelowZeroAborts) {
  HostRng g(rng_key(4, 0, 0, 0));
  EXPECT_DEATH(g.next_below(0), "positive bound");
}

TEST(Rng, HostRngNextBelow) {
  HostRng g(rng_key(4, 0, 0, 0));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(g.next_below(1), 0u);
  // Uniform over a non-power-of-two range: counts within 6 sigma.
  const uint64_t bound = 6;
  const int n = 600000;
  std::vector<int> hist(bound, 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t x = g.next_below(bound);
    ASSERT_LT(x, bound);
    ++hist[x];
  }
  for (int c : hist) EXPECT_NEAR(c, n / 6.0, 6 * std::sqrt(n * (1.0 / 6) * (5.0 / 6)));
  // Large bounds (rejection zone near half of 2^64) still terminate and stay in range.
  const uint64_t big = (uint64_t{1} << 63) + 1;
  for (int i = 0; i < 1000; ++i) EXPECT_LT(g.next_below(big), big);
}

}  // namespace
}  // namespace loom
