// The remat (gradient checkpointing) pass, run after autodiff (docs/ARCHITECTURE.md, "Remat").
//
// A remat region is a scope opened with Scope::remat_region() (the tutorial's nn.remat around
// MLPBlock, AttentionBlock or TransformerBlock). After autodiff, every value produced inside a
// region that the policy does not save and that the backward reads is recomputed: the region's
// forward nodes needed for it are cloned with phase `recompute`, the backward reads the clones,
// and the clones are scheduled just before the first backward node that reads them — once per
// region per minibatch. The originals' last use is then in the forward, so the planner frees
// them there. A region's inputs and its outputs used by later forward nodes are always kept
// (they are what jax.checkpoint keeps: the function's arguments and results). Nested regions
// act as their outermost region. Clones run the same kernels on the same inputs with the same
// dropout streams, so gradients are bit-identical to no remat.
//
// Policies mirror jax.checkpoint_policies (LOOM_REMAT_POLICIES below; the key model.remat_policy).
// "Dots" are the ops flagged kOpDot in ops.def; kOpDotNoBatchDims marks those without batch dims.
#pragma once
#include <string>
#include <vector>

#include "core/choice.h"
#include "graph/graph.h"

#define LOOM_REMAT_POLICIES(X)                                                                      \
  X(nothing_saveable, "save nothing inside the region (the default)")                               \
  X(dots_saveable, "save matmul outputs (kOpDot: dense, and attention's batched dots)")             \
  X(dots_with_no_batch_dims_saveable, "save dense outputs only (attention's dots have batch dims)") \
  X(everything_saveable, "save everything (remat is a no-op)")                                      \
  X(save_only_these_names, "save values made in scopes matching model.remat_save_names ('*' glob)")

namespace loom {

LOOM_CHOICE(RematPolicyKind, "remat policy", LOOM_REMAT_POLICIES)

struct RematPolicy {
  RematPolicyKind kind = RematPolicyKind::nothing_saveable;
  std::vector<std::string> save_names;  // save_only_these_names patterns, e.g. "*/attn/qkv"
};

// Applies remat to `g` (forward nodes are [0, num_forward)) and returns the schedule: forward
// nodes, then backward nodes with each region's recompute inserted just in time. A region opened
// for model layer l (Graph::Region::layer) follows layer_policies[l] when there is one, so layers
// may differ (model.remat = auto); every other region follows `policy`.
std::vector<NodeId> apply_remat(Graph& g, NodeId num_forward, const RematPolicy& policy,
                                const std::vector<RematPolicy>& layer_policies = {});

// Glob match with '*' matching any run of characters (including '/').
bool scope_matches(const std::string& pattern, const std::string& scope);

}  // namespace loom
