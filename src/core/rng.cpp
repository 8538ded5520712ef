#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace loom {

namespace {

// Philox4x32 multipliers and Weyl key increments (golden ratio and
// sqrt(3) - 1), from Salmon et al. / Random123.
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;

std::array<uint32_t, 4> philox_round(PhiloxKey key, std::array<uint32_t, 4> c) {
  const uint64_t p0 = uint64_t{kM0} * c[0];
  const uint64_t p1 = uint64_t{kM1} * c[2];
  return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ key.k0, static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ key.k1, static_cast<uint32_t>(p0)};
}

// splitmix64 output for state x (Steele et al. 2014): a bijective mixer.
uint64_t mix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

PhiloxKey key_from_u64(uint64_t h) { return {static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32)}; }

// The four words of indices [4 * b, 4 * b + 4).
std::array<uint32_t, 4> block(PhiloxKey key, uint64_t b) {
  return philox4x32_10(key, {static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 0, 0});
}

// Top 24 bits, so every result is exactly representable and < 1.
float word_to_uniform(uint32_t w) { return static_cast<float>(w >> 8) * 0x1p-24f; }

}  // namespace

std::array<uint32_t, 4> philox4x32_10(PhiloxKey key, std::array<uint32_t, 4> ctr) {
  ctr = philox_round(key, ctr);
  for (int r = 1; r < 10; ++r) {
    key.k0 += kW0;
    key.k1 += kW1;
    ctr = philox_round(key, ctr);
  }
  return ctr;
}

PhiloxKey rng_key(uint64_t seed, uint64_t step, uint32_t minibatch, uint32_t stream) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ step);
  h = mix64(h ^ ((uint64_t{minibatch} << 32) | stream));
  return key_from_u64(h);
}

float rng_uniform(PhiloxKey key, uint64_t index) { return word_to_uniform(block(key, index / 4)[index % 4]); }

void rng_uniform_fill(PhiloxKey key, uint64_t first, size_t n, float* out) {
  uint64_t i = first;
  size_t k = 0;
  while (k < n) {
    const std::array<uint32_t, 4> w = block(key, i / 4);
    const size_t lane = i % 4;
    const size_t take = std::min<size_t>(4 - lane, n - k);
    for (size_t j = 0; j < take; ++j) out[k + j] = word_to_uniform(w[lane + j]);
    k += take;
    i += take;
  }
}

namespace {
// Box-Muller's radius and angle of the pair of normals at indices j and j + 1 (j even: the two
// words share a block).
struct NormalPair {
  double r, t;
};
NormalPair normal_pair(const std::array<uint32_t, 4>& w, size_t lane) {
  const double u1 = 1.0 - word_to_uniform(w[lane]);
  const double u2 = word_to_uniform(w[lane + 1]);
  return {std::sqrt(-2.0 * std::log(u1)), 2 * std::numbers::pi * u2};
}
}  // namespace

float rng_normal(PhiloxKey key, uint64_t index) {
  const uint64_t j = index & ~uint64_t{1};
  const NormalPair p = normal_pair(block(key, j / 4), j % 4);
  return static_cast<float>((index & 1) != 0 ? p.r * std::sin(p.t) : p.r * std::cos(p.t));
}

void rng_normal_fill(PhiloxKey key, uint64_t first, size_t n, float* out) {
  uint64_t i = first;
  size_t k = 0;
  while (k < n) {
    const std::array<uint32_t, 4> w = block(key, i / 4);
    for (size_t lane = i % 4 & ~size_t{1}; lane < 4 && k < n; lane += 2) {
      const NormalPair p = normal_pair(w, lane);
      if (i % 2 == 0) {
        out[k++] = static_cast<float>(p.r * std::cos(p.t));
        ++i;
      }
      if (k < n) {
        out[k++] = static_cast<float>(p.r * std::sin(p.t));
        ++i;
      }
    }
  }
}

uint32_t HostRng::next_u32() {
  const uint64_t b = next_ / 4;
  if (b != cached_block_) {
    block_ = block(key_, b);
    cached_block_ = b;
  }
  return block_[next_++ % 4];
}

float HostRng::next_uniform() { return word_to_uniform(next_u32()); }

uint64_t HostRng::next_below(uint64_t bound) {
  LOOM_ASSERT(bound > 0, "HostRng::next_below needs a positive bound");
  // 2^64 mod bound: rejecting draws below it leaves a multiple of bound
  // equally likely values.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t lo = next_u32();
    const uint64_t x = lo | (uint64_t{next_u32()} << 32);
    if (x >= threshold) return x % bound;
  }
}

HostRng HostRng::split(uint64_t id) const {
  const uint64_t parent = (uint64_t{key_.k1} << 32) | key_.k0;
  return HostRng(key_from_u64(mix64(mix64(parent) ^ id)));
}

uint32_t name_hash(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

PhiloxKey named_key(uint64_t seed, const std::string& name) {
  // Step UINT64_MAX is never a training step, so these keys never meet dropout's.
  return rng_key(seed, UINT64_MAX, 0, name_hash(name));
}

}  // namespace loom
