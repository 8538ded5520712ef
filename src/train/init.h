// Parameter initialisation: each parameter is drawn from loom's counter RNG keyed by
// (seed, its path), so values do not depend on creation order or on which other parameters exist.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "graph/graph.h"

namespace loom {

// Stable 32-bit hash (FNV-1a) of a name, used as an RNG stream id.
uint32_t name_hash(const std::string& s);
// Key of a named host-side stream ("init/<path>", "data/inputs", ...), disjoint from the
// (step, minibatch) keys dropout uses.
PhiloxKey named_key(uint64_t seed, const std::string& name);

// Fills `out` (p.value's numel floats) with the parameter's initial values.
void init_param(const Graph& g, const Param& p, uint64_t seed, std::vector<float>& out);

}  // namespace loom
