// The reference backend's fused optimizer entry points (backend.h, OptimHyper): plain loops in
// double, results rounded once to the fp32 parameter and moment buffers.
#include <cmath>

#include "backend/reference/reference.h"
#include "core/error.h"

namespace loom {

double ReferenceBackend::grad_sq_norm(std::span<const OptimTensor> ts) {
  double s = 0;
  for (const OptimTensor& t : ts)
    for (int64_t i = 0; i < t.n; ++i) {
      const double g = t.grad[i];
      s += g * g;
    }
  return s;
}

// Semantics in backend.h (OptimHyper). The updated moments enter u unrounded (double), then
// param and moments are rounded to f32 on store.
void ReferenceBackend::optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) {
  LOOM_ASSERT(h.count >= 1, "count is the step number after increment (>= 1)");
  const double b1 = h.b1, b2 = h.b2, lr = h.lr, eps = h.eps, eps_root = h.eps_root, scale = h.grad_scale;
  const double mom = h.momentum;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(h.count));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(h.count));
  for (const OptimTensor& t : ts) {
    const double wd = t.weight_decay;
    for (int64_t i = 0; i < t.n; ++i) {
      const double p = t.param[i];
      const double g = static_cast<double>(t.grad[i]) * scale;
      double u;
      if (h.kind == OptimKind::adam) {
        LOOM_ASSERT(t.mu && t.nu, "adam needs both moments");
        const double mu = b1 * static_cast<double>(t.mu[i]) + (1.0 - b1) * g;
        const double nu = b2 * static_cast<double>(t.nu[i]) + (1.0 - b2) * g * g;
        u = (mu / bc1) / (std::sqrt(nu / bc2 + eps_root) + eps) + wd * p;
        t.mu[i] = static_cast<float>(mu);
        t.nu[i] = static_cast<float>(nu);
      } else if (mom > 0) {
        LOOM_ASSERT(t.mu, "sgd with momentum needs its trace");
        const double m = g + mom * static_cast<double>(t.mu[i]);
        t.mu[i] = static_cast<float>(m);
        u = h.nesterov ? g + mom * m : m;
      } else {
        u = g;
      }
      t.param[i] = static_cast<float>(p - lr * u);
    }
  }
}

}  // namespace loom
