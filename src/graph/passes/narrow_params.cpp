#include "graph/passes/narrow_params.h"

#include <optional>

#include "core/error.h"

namespace loom {

namespace {

// The readers of each value: (node, input index).
using Readers = std::vector<std::vector<std::pair<NodeId, size_t>>>;

// The dtype every reader of v rounds it to before use, looking through views; nullopt when a
// reader takes it at full precision, when readers disagree, or when nothing reads it. The readers
// that round are an allow-list, as ggml's in-place ops are: dense's kernel and bias (cast to the
// compute dtype) and embedding's table (round_dtype of the rows it gathers).
std::optional<DType> rounded_read(const Graph& g, const Readers& readers, ValueId v) {
  std::optional<DType> dt;
  for (const auto& [id, i] : readers[static_cast<size_t>(v)]) {
    const Node& n = g.node(id);
    std::optional<DType> r;
    if (n.op == OpKind::reshape)
      r = rounded_read(g, readers, n.out[0]);
    else if (n.op == OpKind::dense && i >= 1)
      r = std::get<DenseAttrs>(n.attrs).compute;
    else if (n.op == OpKind::embedding && i == 1)
      r = std::get<DTypeAttrs>(n.attrs).dtype;
    if (!r || (dt && *dt != *r)) return std::nullopt;
    dt = r;
  }
  return dt;
}

}  // namespace

std::vector<ValueId> narrow_params(Graph& g) {
  Readers readers(g.values().size());
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.node(static_cast<NodeId>(id));
    LOOM_ASSERT(n.phase == Phase::forward, "narrow_params on a program with " + std::string(phase_name(n.phase)) +
                                               " nodes: a training step needs its f32 masters");
    for (size_t i = 0; i < n.in.size(); ++i) readers[static_cast<size_t>(n.in[i])].emplace_back(id, i);
  }
  std::vector<ValueId> narrowed;
  for (const Param& p : g.params()) {
    if (g.value(p.value).dtype != DType::f32) continue;  // a LoRA base stored as lora.base_dtype says
    const std::optional<DType> dt = rounded_read(g, readers, p.value);
    if (!dt || *dt == DType::f32) continue;
    g.set_param_dtype(p.value, *dt);
    narrowed.push_back(p.value);
  }
  return narrowed;
}

}  // namespace loom
