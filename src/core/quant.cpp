#include "core/quant.h"
#include "core/quant_columns.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace loom {

namespace {

int64_t nf4_code_bytes(int64_t numel) { return (numel + 7) / 8 * 4; }  // two per byte, padded to 4 bytes

int nf4_code(float xn) {
  int c = 0;
  for (float t : kNf4Thresholds) c += xn > t ? 1 : 0;
  return c;
}

float load_f32_at(const unsigned char* p, int64_t i) {
  float v;
  std::memcpy(&v, p + i * 4, 4);
  return v;
}

// The code and the scale of element i = n·K + k.
struct Coded {
  float code, scale;
};
inline Coded coded(DType dt, const unsigned char* q, int64_t K, int64_t N, int64_t i) {
  if (dt == DType::i8) {
    const auto c = static_cast<int8_t>(q[i]);
    return {static_cast<float>(c), load_f32_at(q + N * K, i / K)};
  }
  const unsigned char b = q[i / 2];
  const int c = (i % 2 == 0) ? b >> 4 : b & 15;
  return {kNf4Codes[c], load_f32_at(q + nf4_code_bytes(N * K), i / kNf4Block)};
}

}  // namespace

int64_t quant_bytes(DType dt, const Shape& shape) {
  LOOM_ASSERT(shape.rank == 2 && dtype_is_quantized(dt), "a quantized kernel is [K, N] in int8 or nf4");
  const int64_t K = shape[0], N = shape[1], numel = K * N;
  if (dt == DType::i8) return numel + 4 * N;
  return nf4_code_bytes(numel) + 4 * ((numel + kNf4Block - 1) / kNf4Block);
}

int64_t quant_column_step(DType dt, int64_t K) {
  LOOM_ASSERT(dtype_is_quantized(dt) && K > 0, "quant_column_step: int8 or nf4, K > 0");
  return dt == DType::i8 ? 1 : kNf4Block / std::gcd(K, kNf4Block);
}

void quantize_columns(DType dt, const float* wt, int64_t K, int64_t N, int64_t n0, int64_t n1, void* out) {
  auto* q = static_cast<unsigned char*>(out);
  const int64_t step = quant_column_step(dt, K);
  LOOM_ASSERT(0 <= n0 && n0 <= n1 && n1 <= N && n0 % step == 0 && (n1 % step == 0 || n1 == N),
              "quantize_columns: the columns must start and end on a block boundary");
  if (dt == DType::i8) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* row = wt + (n - n0) * K;
      float absmax = 0.f;
      for (int64_t k = 0; k < K; ++k) absmax = std::max(absmax, std::fabs(row[k]));
      const float scale = absmax / 127.f;
      std::memcpy(q + N * K + n * 4, &scale, 4);
      for (int64_t k = 0; k < K; ++k) {
        const double r = scale == 0.f ? 0.0 : std::nearbyint(double(row[k]) / scale);
        q[n * K + k] = static_cast<unsigned char>(static_cast<int8_t>(std::clamp(r, -127.0, 127.0)));
      }
    }
    return;
  }
  LOOM_ASSERT(dt == DType::nf4, "quantize_columns: int8 or nf4");
  // Elements i in [n0·K, n1·K) are wt[i - n0·K]; the range starts on a block (an even element).
  const int64_t i0 = n0 * K, i1 = n1 * K;
  unsigned char* scales = q + nf4_code_bytes(N * K);
  for (int64_t b0 = i0; b0 < i1; b0 += kNf4Block) {
    const int64_t b1 = std::min(i1, b0 + kNf4Block);
    float absmax = 0.f;
    for (int64_t i = b0; i < b1; ++i) absmax = std::max(absmax, std::fabs(wt[i - i0]));
    std::memcpy(scales + b0 / kNf4Block * 4, &absmax, 4);
    for (int64_t i = b0; i < b1; i += 2) {
      const auto code = [&](int64_t e) {
        return e >= b1 ? 0 : absmax == 0.f ? 7 : nf4_code(std::clamp(wt[e - i0] / absmax, -1.f, 1.f));
      };
      q[i / 2] = static_cast<unsigned char>(code(i) << 4 | code(i + 1));
    }
  }
}

void quantize_kernel(DType dt, const float* w, int64_t K, int64_t N, void* out) {
  std::memset(out, 0, static_cast<size_t>(quant_bytes(dt, Shape{K, N})));
  if (K * N == 0) return;
  // Wᵀ a slab of columns at a time (about 1 MiB of floats), so no transposed copy of all of W.
  const int64_t step = quant_column_step(dt, K);
  const int64_t slab = std::max<int64_t>(1, (int64_t{1} << 18) / (K * step)) * step;
  std::vector<float> wt(static_cast<size_t>(std::min(slab, N) * K));
  for (int64_t n0 = 0; n0 < N; n0 += slab) {
    const int64_t n1 = std::min(N, n0 + slab);
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < K; ++k) wt[static_cast<size_t>((n - n0) * K + k)] = w[k * N + n];
    quantize_columns(dt, wt.data(), K, N, n0, n1, out);
  }
}

void dequantize_tile(DType dt, const void* q, int64_t K, int64_t N, int64_t n0, int64_t n1, int64_t k0, int64_t k1,
                     float* out, int64_t ld) {
  const auto* p = static_cast<const unsigned char*>(q);
  for (int64_t n = n0; n < n1; ++n) {
    float* row = out + (n - n0) * ld - k0;
    if (dt == DType::i8) {
      const float scale = load_f32_at(p + N * K, n);
      const auto* c = reinterpret_cast<const int8_t*>(p + n * K);
      for (int64_t k = k0; k < k1; ++k) row[k] = static_cast<float>(c[k]) * scale;
      continue;
    }
    const unsigned char* scales = p + nf4_code_bytes(N * K);
    for (int64_t k = k0; k < k1;) {  // a run of k within one block at a time
      const int64_t i0 = n * K + k, end = std::min(k1, k + kNf4Block - i0 % kNf4Block);
      const float scale = load_f32_at(scales, i0 / kNf4Block);
      for (; k < end; ++k) {
        const int64_t i = n * K + k;
        const unsigned char b = p[i / 2];
        row[k] = kNf4Codes[(i % 2 == 0) ? b >> 4 : b & 15] * scale;
      }
    }
  }
}

double dequantize_exact(DType dt, const void* q, int64_t K, int64_t N, int64_t k, int64_t n) {
  const Coded c = coded(dt, static_cast<const unsigned char*>(q), K, N, n * K + k);
  return double(c.code) * double(c.scale);
}

}  // namespace loom
