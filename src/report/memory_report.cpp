#include "report/memory_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "graph/passes/plan.h"
#include "nn/models.h"

namespace loom {

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UserError(what, "'" + text + "' is not a size", "write e.g. 24GiB, 512MiB or 16GB");
  }
  const std::string unit = text.substr(used);
  double mult = 1;
  if (unit == "" || unit == "B")
    mult = 1;
  else if (unit == "KiB")
    mult = 1024.0;
  else if (unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else
    throw UserError(what, "unknown unit '" + unit + "'", "use B, KiB, MiB, GiB, KB, MB or GB");
  if (!(v > 0)) throw UserError(what, "must be positive", "write e.g. 24GiB");
  return static_cast<int64_t>(v * mult);
}

MemoryReport memory_report(const Config& c, size_t top, PlanOptions opts) {
  MemoryReport r;
  const auto t0 = std::chrono::steady_clock::now();
  TrainProgram prog = build_train_program(c);
  const Graph& g = prog.model.graph;
  const MemoryPlan p = plan_memory(g, prog.schedule, opts);
  r.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  r.params_bytes = p.param_bytes;
  r.grads_bytes = p.grad_bytes;
  r.num_params = p.param_bytes / 4;
  const OptimizerName opt = c.optimizer.name;
  const int64_t moments =
      (opt == OptimizerName::adam || opt == OptimizerName::adamw) ? 2 : (c.optimizer.momentum > 0 ? 1 : 0);
  r.optimizer_bytes = moments * p.param_bytes;
  r.activations_bytes = p.arena_bytes;
  r.inputs_bytes = p.input_bytes;
  r.workspace_bytes = 0;  // kernel scratch is not planned yet (docs/memory-study.md)
  r.total_bytes =
      r.params_bytes + r.grads_bytes + r.optimizer_bytes + r.activations_bytes + r.inputs_bytes + r.workspace_bytes;
  r.lower_bound_bytes = p.lower_bound_bytes;
  r.peak_step = p.peak_step;
  r.num_steps = static_cast<int32_t>(p.schedule.size());
  if (!p.schedule.empty()) {
    const Node& n = g.node(p.schedule[p.peak_step]);
    r.peak_op = op_name(n.op);
    r.peak_scope = n.scope;
    r.peak_phase = phase_name(n.phase);
  }
  for (const BufferInfo& b : p.buffers) {
    if (b.first > p.peak_step || b.last < p.peak_step) continue;
    const Value& v = g.value(b.value);
    const Node& prod = g.node(v.producer);
    BufferRow row{prod.scope,
                  op_name(prod.op),
                  v.shape,
                  v.dtype,
                  b.bytes,
                  b.first,
                  b.last,
                  phase_name(g.node(p.schedule[b.first]).phase),
                  phase_name(g.node(p.schedule[b.last]).phase)};
    r.largest_at_peak.push_back(row);
  }
  std::stable_sort(r.largest_at_peak.begin(), r.largest_at_peak.end(),
                   [](const BufferRow& a, const BufferRow& b) { return a.bytes > b.bytes; });
  if (r.largest_at_peak.size() > top) r.largest_at_peak.resize(top);
  r.config_summary =
      fmt::format("{} {} ({}), {} layers, batch {} in {} minibatch{}, remat '{}' ({})", choice_name(c.model.kind),
                  dtype_name(c.model.dtype), c.source.empty() ? "defaults" : c.source,
                  nn::model_kind(c.model.kind).language_model ? c.model.num_layers : 1, c.data.batch_size,
                  c.optimizer.num_minibatches, c.optimizer.num_minibatches == 1 ? "" : "es",
                  choice_set_name(c.model.remat), choice_name(c.model.remat_policy));
  return r;
}

std::string format_memory_report(const MemoryReport& r) {
  std::string o = fmt::format("memory plan: {}\n{} parameters; planned in {:.1f} ms ({} schedule steps)\n\n",
                              r.config_summary, r.num_params, r.plan_ms, r.num_steps);
  auto line = [&](const char* name, int64_t b, const char* note) {
    o += fmt::format("  {:<13} {:>16} B  {:>12}  {}\n", name, b, format_bytes(b), note);
  };
  line("params", r.params_bytes, "float32 masters");
  line("grads", r.grads_bytes, "float32, accumulated in place over minibatches");
  line("optimizer", r.optimizer_bytes, "moments, float32");
  line("activations", r.activations_bytes, "arena peak (one minibatch's forward + backward)");
  line("inputs", r.inputs_bytes, "one minibatch of token ids / features and the loss seed");
  line("workspace", r.workspace_bytes, "kernel scratch (not planned yet)");
  o += fmt::format("  {:<13} {:>16} B  {:>12}\n\n", "total", r.total_bytes, format_bytes(r.total_bytes));
  const double frag =
      r.lower_bound_bytes ? 100.0 * (r.activations_bytes - r.lower_bound_bytes) / r.lower_bound_bytes : 0;
  o += fmt::format("arena peak {} vs live-bytes lower bound {} ({:.1f}% above)\n", format_bytes(r.activations_bytes),
                   format_bytes(r.lower_bound_bytes), frag);
  o += fmt::format("peak at schedule step {} of {}: {} {} in {}\n\n", r.peak_step, r.num_steps, r.peak_phase, r.peak_op,
                   scope_label(r.peak_scope));
  o += fmt::format("{} largest buffers live at the peak:\n", r.largest_at_peak.size());
  o += fmt::format("  {:<34} {:<18} {:<24} {:<9} {:>10}  {}\n", "scope", "op", "shape", "dtype", "MiB",
                   "live range (steps)");
  for (const BufferRow& b : r.largest_at_peak)
    o += fmt::format("  {:<34} {:<18} {:<24} {:<9} {:>10.1f}  {}-{} ({} -> {})\n", scope_label(b.scope), b.op,
                     b.shape.str(), dtype_name(b.dtype), b.bytes / 1048576.0, b.first, b.last, b.first_phase,
                     b.last_phase);
  return o;
}

nlohmann::json memory_report_json(const MemoryReport& r) {
  nlohmann::json bufs = nlohmann::json::array();
  for (const BufferRow& b : r.largest_at_peak) {
    std::vector<int64_t> shape(b.shape.dims.begin(), b.shape.dims.begin() + b.shape.rank);
    bufs.push_back({{"scope", b.scope},
                    {"op", b.op},
                    {"shape", shape},
                    {"dtype", dtype_name(b.dtype)},
                    {"bytes", b.bytes},
                    {"first_step", b.first},
                    {"last_step", b.last}});
  }
  return {{"config", r.config_summary},
          {"total_bytes", r.total_bytes},
          {"params_bytes", r.params_bytes},
          {"grads_bytes", r.grads_bytes},
          {"optimizer_bytes", r.optimizer_bytes},
          {"activations_bytes", r.activations_bytes},
          {"inputs_bytes", r.inputs_bytes},
          {"workspace_bytes", r.workspace_bytes},
          {"lower_bound_bytes", r.lower_bound_bytes},
          {"num_params", r.num_params},
          {"peak_step", r.peak_step},
          {"num_steps", r.num_steps},
          {"peak_op", r.peak_op},
          {"peak_scope", r.peak_scope},
          {"plan_ms", r.plan_ms},
          {"largest_at_peak", bufs}};
}

}  // namespace loom
