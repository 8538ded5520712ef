#include "graph/op.h"

#include "graph/ops/rules.h"

namespace loom {

namespace {

#define LOOM_RULE_PTR_vjp(name) &vjp_##name
#define LOOM_RULE_PTR_none(name) nullptr
constexpr OpInfo kOpTable[] = {
// The parameters are spelled apart from the fields they fill (`name_`, `flags_`): a designator
// naming a macro parameter would be replaced by the argument.
#define LOOM_OP(name_, min_in, max_in, n_out, attr, flags_, grad) \
  {.name = #name_,                                                \
   .min_inputs = min_in,                                          \
   .max_inputs = max_in,                                          \
   .num_outputs = n_out,                                          \
   .flags = flags_,                                               \
   .attr_index = attr_index_of<attr>(),                           \
   .infer = &infer_##name_,                                       \
   .vjp = LOOM_RULE_PTR_##grad(name_),                            \
   .cost = &cost_##name_},
#include "graph/ops.def"
#undef LOOM_OP
};
#undef LOOM_RULE_PTR_vjp
#undef LOOM_RULE_PTR_none
static_assert(sizeof(kOpTable) / sizeof(kOpTable[0]) == kNumOps);

// A flag that refines another appears only with it.
constexpr bool flags_refine_their_base() {
  for (const OpInfo& op : kOpTable) {
    if ((op.flags & kOpDotNoBatchDims) && !(op.flags & kOpDot)) return false;
    if ((op.flags & kOpWritesGrad) && !(op.flags & kOpWritesInput0)) return false;
  }
  return true;
}
static_assert(flags_refine_their_base(), "kOpDotNoBatchDims needs kOpDot; kOpWritesGrad needs kOpWritesInput0");

}  // namespace

const OpInfo& op_info(OpKind k) {
  const auto i = static_cast<size_t>(k);
  LOOM_ASSERT(i < static_cast<size_t>(kNumOps), "bad op kind");
  return kOpTable[i];
}

OpCost node_cost(const Graph& g, const Node& n) { return op_info(n.op).cost(g, n); }

int64_t io_bytes(const Graph& g, const Node& n) {
  int64_t b = 0;
  for (ValueId v : n.in) b += g.value(v).bytes();
  for (ValueId v : n.out) b += g.value(v).bytes();
  return b;
}

OpCost elementwise_cost(const Graph& g, const Node& n, int64_t flops_per_element) {
  return OpCost{.flops = flops_per_element * g.value(n.out.at(0)).shape.numel(), .bytes = io_bytes(g, n)};
}

void op_fail(const Graph& g, const Node& n, const std::string& msg) {
  std::ostringstream os;
  os << "[" << op_name(n.op) << "] at '" << n.scope << "': " << msg << "; inputs:";
  for (size_t i = 0; i < n.in.size(); ++i) {
    const Value& v = g.value(n.in[i]);
    os << (i ? ", " : " ") << v.shape.str() << " " << dtype_name(v.dtype);
  }
  throw std::invalid_argument(os.str());
}

}  // namespace loom
