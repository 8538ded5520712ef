// Declarations of every op's shape rule (infer_<op>), cost rule (cost_<op>) and VJP rule
// (vjp_<op>), generated from the op table. Definitions live in one file per op family in this directory.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "graph/graph.h"
#include "graph/passes/autodiff.h"

namespace loom {

#define LOOM_RULE_DECL_vjp(name) void vjp_##name(VjpCtx&);
#define LOOM_RULE_DECL_none(name)
#define LOOM_OP(name, min_in, max_in, n_out, attr, flags, grad) \
  void infer_##name(const Graph&, const Node&, ValueDesc*);     \
  OpCost cost_##name(const Graph&, const Node&);                \
  LOOM_RULE_DECL_##grad(name)
#include "graph/ops.def"
#undef LOOM_OP
#undef LOOM_RULE_DECL_vjp
#undef LOOM_RULE_DECL_none

// Throws std::invalid_argument: "[dense] at 'block_0/mlp/input_layer': <msg>; inputs: x
// [16, 128] float32, ...". Shape rules call it; after them, kernels may assume valid inputs.
[[noreturn]] void op_fail(const Graph& g, const Node& n, const std::string& msg);

// Σ bytes of the node's inputs and outputs at their dtypes (cost rules).
int64_t io_bytes(const Graph& g, const Node& n);
// {flops_per_element × numel(output 0), io_bytes}: the cost of an elementwise or row-wise op.
OpCost elementwise_cost(const Graph& g, const Node& n, int64_t flops_per_element);

inline const Value& in_val(const Graph& g, const Node& n, int i) { return g.value(n.in.at(i)); }

template <class T>
const T& attrs_of(const Node& n) {
  return std::get<T>(n.attrs);
}

}  // namespace loom
