#include "graph/passes/remat.h"

#include <unordered_map>

namespace loom {

bool scope_matches(const std::string& pat, const std::string& s) {
  // Iterative glob with backtracking over the last '*'.
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && pat[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pat.size() && pat[p] == s[i]) {
      ++p;
      ++i;
    } else if (star != std::string::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

namespace {

bool policy_saves(const RematPolicy& p, const Node& n) {
  if (p.kind == RematPolicyKind::everything_saveable) return true;
  if (p.kind == RematPolicyKind::dots_saveable) return op_info(n.op).flags & kOpDot;
  if (p.kind == RematPolicyKind::dots_with_no_batch_dims_saveable) return op_info(n.op).flags & kOpDotNoBatchDims;
  if (p.kind == RematPolicyKind::save_only_these_names) {
    for (const std::string& pat : p.save_names)
      if (scope_matches(pat, n.scope)) return true;
  }
  return false;
}

}  // namespace

std::vector<NodeId> apply_remat(Graph& g, NodeId num_fwd, const RematPolicy& policy,
                                const std::vector<RematPolicy>& layer_policies) {
  const NodeId num_nodes = static_cast<NodeId>(g.nodes().size());
  std::vector<NodeId> schedule;
  for (NodeId i = 0; i < num_fwd; ++i) schedule.push_back(i);
  auto policy_of = [&](int32_t r) -> const RematPolicy& {
    const int32_t l = g.regions()[static_cast<size_t>(r)].layer;
    return l >= 0 && static_cast<size_t>(l) < layer_policies.size() ? layer_policies[static_cast<size_t>(l)] : policy;
  };
  bool any_recomputes = false;
  for (int32_t r = 0; r < static_cast<int32_t>(g.regions().size()); ++r)
    any_recomputes = any_recomputes || policy_of(r).kind != RematPolicyKind::everything_saveable;
  if (!any_recomputes) {
    for (NodeId i = num_fwd; i < num_nodes; ++i) schedule.push_back(i);
    return schedule;
  }

  const size_t nv = g.values().size();
  std::vector<int32_t> region_of(nv, -1);  // outermost region of each forward-produced value
  std::vector<bool> saved(nv, true);
  std::vector<int32_t> node_region(static_cast<size_t>(num_fwd), -1);
  for (NodeId i = 0; i < num_fwd; ++i) {
    const Node& n = g.node(i);
    const int32_t r = g.outermost_region(n.region);
    node_region[i] = r;
    if (r < 0) continue;
    const bool view = op_info(n.op).flags & kOpView;
    for (ValueId o : n.out) {
      region_of[o] = r;
      // A view is as available as its source: saved if the source is saved or from outside.
      saved[o] = view ? (region_of[n.in[0]] != r || saved[n.in[0]]) : policy_saves(policy_of(r), n);
    }
  }
  // Region outputs (read by forward nodes outside the region) and program outputs are kept.
  for (NodeId i = 0; i < num_fwd; ++i)
    for (ValueId v : g.node(i).in)
      if (region_of[v] >= 0 && region_of[v] != node_region[i]) saved[v] = true;
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
    if (g.value(v).is_output) saved[v] = true;

  // Values the backward reads that must be recomputed, closed over their in-region producers.
  std::vector<bool> required(nv, false);
  for (NodeId b = num_fwd; b < num_nodes; ++b)
    for (ValueId v : g.node(b).in)
      if (region_of[v] >= 0 && !saved[v]) required[v] = true;
  std::vector<bool> clone(static_cast<size_t>(num_fwd), false);
  for (NodeId i = num_fwd - 1; i >= 0; --i) {
    const Node& n = g.node(i);
    if (node_region[i] < 0) continue;
    bool need = false;
    for (ValueId o : n.out) need = need || required[o];
    if (!need) continue;
    clone[i] = true;
    for (ValueId u : n.in)
      if (region_of[u] == node_region[i] && !saved[u]) required[u] = true;
  }

  // Clone in forward order; map original values to their recomputed copies.
  std::unordered_map<ValueId, ValueId> copy_of;
  std::unordered_map<int32_t, std::vector<NodeId>> clones_by_region;
  for (NodeId i = 0; i < num_fwd; ++i) {
    if (!clone[i]) continue;
    const Node n = g.node(i);  // a copy: add_node may reallocate the node list
    std::vector<ValueId> in = n.in;
    for (ValueId& u : in)
      if (auto it = copy_of.find(u); it != copy_of.end()) u = it->second;
    const NodeId c = g.add_node(n.op, in, n.attrs, n.scope, Phase::recompute, n.region);
    for (size_t k = 0; k < n.out.size(); ++k) copy_of[n.out[k]] = g.node(c).out[k];
    clones_by_region[node_region[i]].push_back(c);
  }
  std::unordered_map<ValueId, int32_t> clone_region;
  for (const auto& [orig, cp] : copy_of) clone_region[cp] = region_of[orig];

  // The backward reads the copies; each region's copies run just before their first reader.
  std::vector<bool> inserted(g.regions().size(), false);
  for (NodeId b = num_fwd; b < num_nodes; ++b) {
    Node& n = g.node_mut(b);
    for (ValueId& v : n.in) {
      auto it = copy_of.find(v);
      if (it == copy_of.end()) continue;
      v = it->second;
      const int32_t r = clone_region[v];
      if (!inserted[r]) {
        inserted[r] = true;
        for (NodeId c : clones_by_region[r]) schedule.push_back(c);
      }
    }
    schedule.push_back(b);
  }
  return schedule;
}

}  // namespace loom
