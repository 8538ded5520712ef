#include "graph/passes/autodiff.h"

#include <stdexcept>

#include "graph/ops/rules.h"

namespace loom {

std::vector<ValueId> VjpCtx::emit(OpKind op, std::vector<ValueId> in, Attrs attrs) {
  const NodeId id = g.add_node(op, std::move(in), std::move(attrs), node.scope, Phase::backward, node.region);
  return g.node(id).out;
}

NodeId build_backward(Graph& g, ValueId loss, ValueId seed) {
  const Value& lv = g.value(loss);
  if (lv.shape.numel() != 1 || lv.dtype != DType::f32)
    throw std::invalid_argument("build_backward: the loss must be a scalar float32 value");
  const NodeId num_fwd = static_cast<NodeId>(g.nodes().size());

  // Forward sweep: which values depend on a parameter (only those need cotangents).
  std::vector<bool> needs(g.values().size(), false);
  for (const Param& p : g.params()) needs[p.value] = p.trainable();
  for (NodeId i = 0; i < num_fwd; ++i) {
    const Node& n = g.node(i);
    if (!op_info(n.op).vjp) continue;
    bool any = false;
    for (ValueId v : n.in) any = any || needs[v];
    for (ValueId v : n.out) needs[v] = any;
  }

  // Reverse sweep. ct[v] is the summed cotangent of activation v so far; low[v] its low-rank
  // terms (VjpCtx::in_low_rank) that found no other cotangent to be added into yet.
  std::vector<ValueId> ct(g.values().size(), kNoValue);
  std::vector<std::vector<VjpCtx::LowRank>> low(g.values().size());
  ct[loss] = seed;
  // Emits a backward node in node n's scope and region (n a copy: emitting grows the node storage).
  const auto emit1 = [&](const Node& n, OpKind op, std::vector<ValueId> in, Attrs attrs) {
    return g.node(g.add_node(op, std::move(in), std::move(attrs), n.scope, Phase::backward, n.region)).out.at(0);
  };
  // d + each low-rank term of v.
  const auto add_low = [&](const Node& n, ValueId v, ValueId d) {
    for (const VjpCtx::LowRank& t : low[v]) d = emit1(n, OpKind::add_low_rank, {d, t.u, t.v}, t.attrs);
    low[v].clear();
    return d;
  };
  // Low-rank term t of v on its own: u·op(V) as dense_grad_input forms it.
  const auto form = [&](const Node& n, ValueId v, const VjpCtx::LowRank& t) {
    return emit1(
        n, OpKind::dense_grad_input, {t.u, t.v},
        DenseGradAttrs{.compute = t.attrs.compute, .out_dtype = g.value(v).dtype, .transpose_w = !t.attrs.transpose_v});
  };
  for (NodeId i = num_fwd - 1; i >= 0; --i) {
    const Node n = g.node(i);
    const OpInfo& info = op_info(n.op);
    for (ValueId v : n.out) {  // low-rank terms alone: the first one formed (u·Vᵀ), the others added
      if (ct[v] != kNoValue || low[v].empty()) continue;
      const VjpCtx::LowRank t = low[v].front();
      low[v].erase(low[v].begin());
      ct[v] = add_low(n, v, form(n, v, t));
    }
    bool has_ct = false;
    for (ValueId v : n.out) has_ct = has_ct || ct[v] != kNoValue;
    if (!has_ct || !info.vjp) continue;
    std::vector<bool> in_needs;
    bool any_needed = false;
    for (ValueId v : n.in) {
      in_needs.push_back(needs[v]);
      any_needed = any_needed || needs[v];
    }
    if (!any_needed) continue;
    std::vector<ValueId> out_ct;
    for (ValueId v : n.out) out_ct.push_back(ct[v]);
    VjpCtx c{.g = g,
             .fwd = i,
             .node = n,
             .out_ct = std::move(out_ct),
             .needs = std::move(in_needs),
             .in_ct = std::vector<ValueId>(n.in.size(), kNoValue),
             .in_low_rank = std::vector<VjpCtx::LowRank>(n.in.size())};
    info.vjp(c);
    for (size_t j = 0; j < c.node.in.size(); ++j) {
      const ValueId x = c.node.in[j];
      ValueId d = c.in_ct[j];
      if (const VjpCtx::LowRank& t = c.in_low_rank[j]; t.u != kNoValue && c.needs[j]) {
        LOOM_ASSERT(d == kNoValue, "a rule gives an input either a cotangent or a low-rank term");
        if (!g.param_of(x)) {  // held until another cotangent of x comes (or x's producer needs it)
          low[x].push_back(t);
          if (ct[x] != kNoValue) ct[x] = add_low(c.node, x, ct[x]);
          continue;
        }
        d = form(c.node, x, t);  // a parameter's gradient, accumulated as any other
      }
      if (d == kNoValue || !c.needs[j]) continue;
      // Every cotangent has its primal's shape and dtype (checked here, once, for all rules).
      const Value& xv = g.value(x);
      const Value& dv = g.value(d);
      LOOM_ASSERT(xv.shape == dv.shape && xv.dtype == dv.dtype,
                  std::string("VJP of ") + op_name(c.node.op) + " at '" + c.node.scope + "' gave " + dv.shape.str() +
                      dtype_name(dv.dtype) + " for input " + xv.shape.str() + dtype_name(xv.dtype));
      if (const Param* p = g.param_of(x)) {
        g.add_node(OpKind::grad_accumulate, {p->grad, d}, GradAccumulateAttrs{}, c.node.scope, Phase::backward,
                   c.node.region);
      } else if (ct[x] == kNoValue) {
        ct[x] = add_low(c.node, x, d);
      } else {
        ct[x] = c.emit1(OpKind::add, {ct[x], d});
      }
    }
  }
  return num_fwd;
}

std::vector<ValueId> mark_first_grad_writes(Graph& g, const std::vector<NodeId>& schedule, bool one_minibatch) {
  // Per gradient buffer: whether its first writer in the schedule assigns or scatter-adds.
  enum class First : uint8_t { none, assigns, scatters };
  std::vector<First> first(g.values().size(), First::none);
  for (NodeId id : schedule) {
    Node& n = g.node_mut(id);
    if (!(op_info(n.op).flags & kOpWritesGrad) || first[n.in[0]] != First::none) continue;
    // A writer that covers every element has assign_in_first_minibatch (ops.def, kOpWritesGrad).
    first[n.in[0]] = std::visit(
        [one_minibatch](auto& a) {
          if constexpr (requires { a.assign_in_first_minibatch; }) {
            a.assign_in_first_minibatch = true;
            if constexpr (requires { a.assigns_always; }) a.assigns_always = one_minibatch;
            return First::assigns;
          } else {
            return First::scatters;
          }
        },
        n.attrs);
  }
  std::vector<ValueId> to_zero;
  for (const Param& p : g.params())
    if (p.trainable() && first[p.grad] != First::assigns) to_zero.push_back(p.grad);
  return to_zero;
}

}  // namespace loom
