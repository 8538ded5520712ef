#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace loom {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}
constexpr auto kTables = make_tables();

}  // namespace

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = kTables[7][w & 0xFF] ^ kTables[6][(w >> 8) & 0xFF] ^ kTables[5][(w >> 16) & 0xFF] ^
        kTables[4][(w >> 24) & 0xFF] ^ kTables[3][(w >> 32) & 0xFF] ^ kTables[2][(w >> 40) & 0xFF] ^
        kTables[1][(w >> 48) & 0xFF] ^ kTables[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

namespace {

#if defined(__SSE4_2__)
constexpr size_t kBlock = 4096;

// The raw CRC register moved past n zero bytes is linear in the register over GF(2). `ZeroShift`
// holds that map for kBlock zero bytes as four byte-sliced tables (zlib's crc32_combine idea), so
// three independent streams over consecutive blocks can be joined with 8 lookups.
struct ZeroShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  ZeroShift() {
    // Columns of the one-zero-bit operator, squared up to 8·kBlock bits.
    std::array<uint32_t, 32> m{}, sq{};
    m[0] = kPoly;
    for (int i = 1; i < 32; ++i) m[i] = 1u << (i - 1);
    auto apply = [](const std::array<uint32_t, 32>& op, uint32_t v) {
      uint32_t r = 0;
      for (int i = 0; v; ++i, v >>= 1)
        if (v & 1u) r ^= op[i];
      return r;
    };
    for (size_t bits = 1; bits < 8 * kBlock; bits *= 2) {
      for (int i = 0; i < 32; ++i) sq[i] = apply(m, m[i]);
      m = sq;
    }
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = apply(m, b << (8 * k));
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

uint32_t crc_hw(const unsigned char* p, size_t n, uint32_t c) {
  // Three streams over consecutive blocks hide the instruction's 3-cycle latency.
  static const ZeroShift shift;
  while (n >= 3 * kBlock) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t a, b, d;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kBlock + i, 8);
      std::memcpy(&d, p + 2 * kBlock + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, d);
    }
    // crc(A ++ B) = shift(crc(A), |B|) ^ crc0(B) for the raw (non-inverted) register used here.
    c = shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c = shift(c) ^ static_cast<uint32_t>(c2);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__SSE4_2__)
  return ~crc_hw(static_cast<const unsigned char*>(data), n, ~crc);
#else
  return crc32c_portable(data, n, crc);
#endif
}

}  // namespace loom
