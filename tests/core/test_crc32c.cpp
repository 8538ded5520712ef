// CRC-32C (core/crc32c.h): the standard check value, agreement with a bitwise definition at every
// length around the hardware path's block boundaries, and chaining.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/crc32c.h"

namespace {

// The definition, one bit at a time.
uint32_t crc_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

std::vector<unsigned char> bytes(size_t n) {
  std::vector<unsigned char> v(n);
  uint32_t x = 12345;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(loom::crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(loom::crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, MatchesBitwiseDefinitionAtEveryBoundary) {
  const auto v = bytes(3 * 4096 * 2 + 64);
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4095}, size_t{12287}, size_t{12288},
                   size_t{12289}, size_t{12288 + 13}, size_t{24576}, v.size()}) {
    EXPECT_EQ(loom::crc32c(v.data(), n), crc_bitwise(v.data(), n)) << "n = " << n;
    EXPECT_EQ(loom::crc32c_portable(v.data(), n), crc_bitwise(v.data(), n)) << "n = " << n;
  }
}

TEST(Crc32c, ChainsLikeOneBuffer) {
  const auto v = bytes(20000);
  for (size_t cut : {size_t{0}, size_t{3}, size_t{4096}, size_t{12289}, size_t{19999}}) {
    const uint32_t a = loom::crc32c(v.data(), cut);
    EXPECT_EQ(loom::crc32c(v.data() + cut, v.size() - cut, a), loom::crc32c(v.data(), v.size())) << "cut " << cut;
  }
}

}  // namespace
