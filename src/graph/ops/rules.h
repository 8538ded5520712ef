// Declarations of every op's shape rule (infer_<op>) and VJP rule (vjp_<op>), generated from
// the op table. Definitions live in one file per op family in this directory.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "graph/autodiff.h"
#include "graph/graph.h"

namespace loom {

#define LOOM_RULE_DECL_vjp(name) void vjp_##name(VjpCtx&);
#define LOOM_RULE_DECL_none(name)
#define LOOM_OP(name, min_in, max_in, n_out, attr, flags, grad) \
  void infer_##name(const Graph&, const Node&, ValueDesc*);     \
  LOOM_RULE_DECL_##grad(name)
#include "graph/ops.def"
#undef LOOM_OP
#undef LOOM_RULE_DECL_vjp
#undef LOOM_RULE_DECL_none

// Throws std::invalid_argument: "[dense] at 'block_0/mlp/input_layer': <msg>; inputs: x
// [16, 128] float32, ...". Shape rules call it; after them, kernels may assume valid inputs.
[[noreturn]] void op_fail(const Graph& g, const Node& n, const std::string& msg);

inline const Value& in_val(const Graph& g, const Node& n, int i) { return g.value(n.in.at(i)); }

template <class T>
const T& attrs_of(const Node& n) {
  return std::get<T>(n.attrs);
}

}  // namespace loom
