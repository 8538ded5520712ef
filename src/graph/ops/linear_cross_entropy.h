// The fused head's backward (linear_cross_entropy_grad, _grad_with_bias and _grad_input, ops.def)
// forms its logits again: the share of its cost that does, which model.remat = auto counts as
// recompute (train/fit.h).
#pragma once
#include <cstdint>

#include "graph/graph.h"

namespace loom {

// The FLOPs of node `n` that recompute the forward's logits (2·rows·C·V and the softmax's 4 per
// logit) when it is the fused head's backward (linear_cross_entropy_grad, _grad_with_bias or
// _grad_input); part of node_cost(g, n).flops. 0 for any other op.
int64_t linear_cross_entropy_recomputed_flops(const Graph& g, const Node& n);

}  // namespace loom
