// Parameter initialisation: each parameter is drawn from loom's counter RNG keyed by
// (seed, its path), so values do not depend on creation order or on which other parameters exist.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "graph/graph.h"

namespace loom {

// Fills `out` (p.value's numel floats) with the parameter's initial values.
void init_param(const Graph& g, const Param& p, uint64_t seed, std::vector<float>& out);

}  // namespace loom
