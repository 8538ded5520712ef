// The CPU backend's fused optimizer passes (backend.h, OptimHyper). All tensors are cut into
// fixed-size chunks (the cut depends only on the tensor sizes) and one OpenMP loop runs over
// every chunk of every tensor, so a step costs one parallel region, not one per parameter.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"

namespace loom {

using namespace cpuk;

namespace {

constexpr int64_t kOptChunk = int64_t{1} << 14;

struct Chunk {
  const OptimTensor* t;
  int64_t begin, end;
};

std::vector<Chunk> chunks_of(std::span<const OptimTensor> ts) {
  std::vector<Chunk> cs;
  for (const OptimTensor& t : ts)
    for (int64_t b = 0; b < t.n; b += kOptChunk) cs.push_back({&t, b, std::min(t.n, b + kOptChunk)});
  return cs;
}

int64_t total_elems(std::span<const OptimTensor> ts) {
  int64_t n = 0;
  for (const OptimTensor& t : ts) n += t.n;
  return n;
}

}  // namespace

// Σ grad² in double: each chunk sums with kLanes interleaved partial sums, folded pairwise, and
// the chunk sums are added in order, so the result depends only on the tensors, not on the thread
// count. 32 lanes are 4 independent AVX-512 (8 AVX2) accumulator chains, so that the pass is bound
// by memory, not by the add latency.
double CpuBackend::grad_sq_norm(std::span<const OptimTensor> ts) {
  constexpr int kLanes = 32;
  const std::vector<Chunk> cs = chunks_of(ts);
  std::vector<double> part(cs.size());
  const auto nc = static_cast<int64_t>(cs.size());
#pragma omp parallel for schedule(static) if (total_elems(ts) >= kParallelMin)
  for (int64_t k = 0; k < nc; ++k) {
    const Chunk& c = cs[static_cast<size_t>(k)];
    const float* g = c.t->grad;
    double acc[kLanes] = {};
    int64_t i = c.begin;
    for (; i + kLanes <= c.end; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const double v = g[i + l];
        acc[l] += v * v;
      }
    for (int l = 0; i < c.end; ++i, ++l) {
      const double v = g[i];
      acc[l] += v * v;
    }
    part[static_cast<size_t>(k)] = fold_lanes(acc);
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

// Semantics in backend.h (OptimHyper). Adam in float, with bc = 1 − b^count computed once per call
// in float (optax's bias_correction).
void CpuBackend::optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) {
  LOOM_ASSERT(h.count >= 1, "count is the step number after increment (>= 1)");
  const bool adam = h.kind == OptimKind::adam;
  const bool trace = !adam && h.momentum > 0.f;
  for (const OptimTensor& t : ts)
    LOOM_ASSERT(t.n == 0 || (t.param && t.grad && (!(adam || trace) || t.mu) && (!adam || t.nu)),
                "optimizer state missing for this optimizer");
  const float b1 = h.b1, b2 = h.b2, lr = h.lr, eps = h.eps, eps_root = h.eps_root, scale = h.grad_scale;
  const float one_m_b1 = 1.f - b1, one_m_b2 = 1.f - b2, mom = h.momentum;
  const bool nesterov = h.nesterov;
  const float bc1 = 1.f - std::pow(b1, static_cast<float>(h.count));
  const float bc2 = 1.f - std::pow(b2, static_cast<float>(h.count));
  const std::vector<Chunk> cs = chunks_of(ts);
  const auto nc = static_cast<int64_t>(cs.size());
#pragma omp parallel for schedule(static) if (total_elems(ts) >= kParallelMin)
  for (int64_t k = 0; k < nc; ++k) {
    const Chunk& c = cs[static_cast<size_t>(k)];
    float* __restrict p = c.t->param;
    const float* __restrict gr = c.t->grad;
    float* __restrict mu = c.t->mu;
    float* __restrict nu = c.t->nu;
    const float wd = c.t->weight_decay;
    if (adam) {
      for (int64_t i = c.begin; i < c.end; ++i) {
        const float g = gr[i] * scale;
        const float m = b1 * mu[i] + one_m_b1 * g;
        const float v = b2 * nu[i] + one_m_b2 * (g * g);
        mu[i] = m;
        nu[i] = v;
        const float u = (m / bc1) / (std::sqrt(v / bc2 + eps_root) + eps) + wd * p[i];
        p[i] -= lr * u;
      }
    } else if (trace) {
      for (int64_t i = c.begin; i < c.end; ++i) {
        const float g = gr[i] * scale;
        const float m = g + mom * mu[i];
        mu[i] = m;
        p[i] -= lr * (nesterov ? g + mom * m : m);
      }
    } else {
      for (int64_t i = c.begin; i < c.end; ++i) p[i] -= lr * (gr[i] * scale);
    }
  }
}

}  // namespace loom
