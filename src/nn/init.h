// Parameter initialisation: each parameter is drawn from loom's counter RNG keyed by
// (seed, its path), so values do not depend on creation order or on which other parameters exist,
// and each element is a function of its index alone: a tensor drawn in slices gets the values it
// has drawn whole.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "graph/graph.h"

namespace loom {

// The initial values of one parameter, any range of its elements at a time.
class ParamDraw {
 public:
  ParamDraw(const Graph& g, const Param& p, uint64_t seed);
  int64_t numel() const { return numel_; }
  // Elements [first, first + n) of the parameter in row-major order into out.
  void fill(int64_t first, int64_t n, float* out) const;

 private:
  ParamInit init_;
  PhiloxKey key_;
  int64_t numel_;
};

// Fills `out` (p.value's numel floats) with the parameter's initial values.
void init_param(const Graph& g, const Param& p, uint64_t seed, std::vector<float>& out);

}  // namespace loom
