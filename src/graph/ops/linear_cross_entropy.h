// The fused head's backward (linear_cross_entropy_grad, ops.def) forms its logits again: the share
// of its cost that does, which model.remat = auto counts as recompute (train/fit.h).
#pragma once
#include <cstdint>

#include "graph/graph.h"

namespace loom {

// The FLOPs of linear_cross_entropy_grad node `n` that recompute the forward's logits (2·rows·C·V
// and the softmax's 4 per logit); part of node_cost(g, n).flops.
int64_t linear_cross_entropy_recomputed_flops(const Graph& g, const Node& n);

}  // namespace loom
