#pragma once
// Counter-based random numbers.
//
// Dropout masks must be recomputable in the backward pass (and by a CUDA
// kernel), so every random value is a pure function of (key, index): there
// is no generator state to save, restore or advance in lock step.
//
// Exact mapping, for reproducing the streams elsewhere bit for bit:
//   word(key, i)  = philox4x32_10(key, {lo32(i / 4), hi32(i / 4), 0, 0})[i % 4]
//   rng_uniform(key, i) = float(word(key, i) >> 8) * 2^-24
//       (exact in float32; values k * 2^-24 for k in [0, 2^24), so [0, 1))
//   rng_normal(key, i): let j = i & ~1, u1 = 1 - rng_uniform(key, j) (in
//       (0, 1], so the log is finite), u2 = rng_uniform(key, j + 1),
//       r = sqrt(-2 ln u1), t = 2 pi u2, all in double precision;
//       the result is float(r * cos(t)) for even i, float(r * sin(t)) for
//       odd i (Box-Muller, both outputs of each pair used).
// Words and uniforms are integer-exact, so any device reproduces them bit for
// bit. Normals go through libm log/sin/cos: bit-exact across host runs, but
// a device's transcendentals may differ in the last double ulp, which can
// (rarely) flip the final float rounding; generate normals on the host when
// exact agreement matters. uniform and normal read the same words, so use
// different keys (streams) for them if they must be independent.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

// Philox4x32-10 (Salmon et al., SC'11), identical to Random123's
// philox4x32_R(10, ...) and to cuRAND's Philox4_32_10 core: 128-bit counter,
// 64-bit key.
struct PhiloxKey {
  uint32_t k0, k1;
};
std::array<uint32_t, 4> philox4x32_10(PhiloxKey key, std::array<uint32_t, 4> ctr);

// Key for one random stream, from its coordinates: training seed, optimizer
// step, minibatch (micro-batch) index and stream id (e.g. the graph node).
// A chain of splitmix64 mixes, each a bijection on 64 bits:
//   h = mix(seed); h = mix(h ^ step); h = mix(h ^ (minibatch << 32 | stream))
//   key = {lo32(h), hi32(h)}
// where mix(x) is splitmix64's output for state x: z = x + 0x9E3779B97F4A7C15,
// z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9, z = (z ^ z >> 27) * 0x94D049BB133111EB,
// z ^ z >> 31. Distinct coordinates collide with probability ~2^-64 per pair.
// Keys are computed on the host and passed to kernels, so devices never need
// to reproduce this function.
PhiloxKey rng_key(uint64_t seed, uint64_t step, uint32_t minibatch, uint32_t stream);

// Uniform float in [0, 1) with 24 random bits (mapping above).
float rng_uniform(PhiloxKey key, uint64_t index);

// out[k] = rng_uniform(key, first + k) for k in [0, n), computing each
// Philox block once instead of once per element. Any first and n.
void rng_uniform_fill(PhiloxKey key, uint64_t first, size_t n, float* out);

// Standard normal (mapping above), used for parameter initialisation.
float rng_normal(PhiloxKey key, uint64_t index);

// out[k] = rng_normal(key, first + k) for k in [0, n), computing each Philox block and each
// Box-Muller pair once instead of once per element. Any first and n.
void rng_normal_fill(PhiloxKey key, uint64_t first, size_t n, float* out);

// Sequential, splittable generator for host-side code (init, data order)
// that wants "the next number" rather than indices. It is a cursor over the
// same stream: the k-th next_u32() is word(key, k) and the k-th
// next_uniform() alone would be rng_uniform(key, k), so results depend only
// on the key and how many words were drawn.
class HostRng {
 public:
  explicit HostRng(PhiloxKey key) : key_(key) {}

  uint32_t next_u32();
  // Consumes one word; same float as rng_uniform at that word's index.
  float next_uniform();
  // Uniform integer in [0, bound), unbiased: x % bound for the first 64-bit
  // draw x (two words, low then high) at or above 2^64 % bound, so the
  // number of words consumed varies. Requires bound > 0 (LOOM_ASSERT).
  uint64_t next_below(uint64_t bound);

  // An independent generator whose key is a hash of (this key, id) and whose
  // cursor starts at 0. Depends on neither cursor, so a child can be
  // recreated without replaying the parent.
  HostRng split(uint64_t id) const;

  PhiloxKey key() const { return key_; }

 private:
  PhiloxKey key_;
  uint64_t next_ = 0;                     // index of the next word
  uint64_t cached_block_ = ~uint64_t{0};  // i / 4 of the words in block_
  std::array<uint32_t, 4> block_{};
};

// Stable 32-bit hash (FNV-1a) of a name, used as an RNG stream id.
uint32_t name_hash(const std::string& s);
// Key of a named host-side stream ("init/<path>", "data/inputs", ...), disjoint from the
// (step, minibatch) keys dropout uses.
PhiloxKey named_key(uint64_t seed, const std::string& name);

}  // namespace loom
