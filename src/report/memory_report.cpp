#include "report/memory_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "backend/registry.h"
#include "core/error.h"
#include "graph/passes/plan.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "runtime/executor.h"
#include "train/evaluator.h"

namespace loom {

MemoryPlan plan_training(const Config& c, const TrainProgram& prog, PlanOptions opts) {
  const std::unique_ptr<Backend> be = make_backend(c.device);
  return plan_program(*be, prog.model.graph, prog.schedule, opts, resolve_threads(static_cast<int>(c.threads)));
}

MemoryReport memory_report(const Config& c, size_t top, PlanOptions opts, int ranks) {
  MemoryReport r;
  r.ranks = ranks;
  r.grad_shard = c.optimizer.shard == OptimizerShard::state_grads || c.optimizer.shard == OptimizerShard::params;
  r.param_shard = c.optimizer.shard == OptimizerShard::params;
  const auto t0 = std::chrono::steady_clock::now();
  TrainProgram prog = build_train_program(c, ranks);
  const Graph& g = prog.model.graph;
  const MemoryPlan p = plan_training(c, prog, rank_plan_options(c, prog, ranks, opts));
  r.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  const RankMemory rank = rank_memory(c, prog, ranks);
  r.params_bytes = p.param_bytes + rank.param_shard_elems * static_cast<int64_t>(sizeof(float));
  r.base_storage = choice_name(c.model.lora.base_dtype);
  for (const Param& q : g.params())
    if (!q.trainable()) r.frozen_params_bytes += g.value(q.value).bytes();
  r.grads_bytes = p.grad_bytes + rank.grad_shard_elems * static_cast<int64_t>(sizeof(float));
  r.num_params = 0;  // elements: a LoRA base may be stored in fewer bytes than float32 (lora.base_dtype)
  for (const Param& q : g.params()) r.num_params += g.value(q.value).shape.numel();
  r.optimizer_bytes = optimizer_moments(c.optimizer) * rank.optimizer_elems * static_cast<int64_t>(sizeof(float));
  r.communication_bytes = rank.comm_buffer_bytes;
  r.checkpoint_bytes = rank.checkpoint_stream_bytes;
  r.activations_bytes = p.arena_bytes;
  r.inputs_bytes = p.input_bytes;
  r.library_bytes = p.library_bytes;
  r.workspace_threads = p.workspace_threads;
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
    if (b.value == kNoValue) {
      const Node& n = g.node(p.schedule[b.first]);
      if (b.first == p.peak_step) r.workspace_bytes = b.bytes;
      if (b.bytes > r.max_workspace_bytes) {
        r.max_workspace_bytes = b.bytes;
        r.max_workspace_op = op_name(n.op);
        r.max_workspace_scope = n.scope;
      }
    }
    if (b.first > p.peak_step || b.last < p.peak_step) continue;
    const std::string first_phase = phase_name(g.node(p.schedule[b.first]).phase);
    const std::string last_phase = phase_name(g.node(p.schedule[b.last]).phase);
    if (b.value == kNoValue) {
      const Node& n = g.node(p.schedule[b.first]);
      r.largest_at_peak.push_back(BufferRow{.workspace = true,
                                            .scope = n.scope,
                                            .op = op_name(n.op),
                                            .shape = Shape{},
                                            .dtype = DType::f32,
                                            .bytes = b.bytes,
                                            .first = b.first,
                                            .last = b.last,
                                            .first_phase = first_phase,
                                            .last_phase = last_phase});
      continue;
    }
    const Value& v = g.value(b.value);
    // None: a gradient or a gathered parameter planned in the arena.
    const Node* prod = v.producer >= 0 ? &g.node(v.producer) : nullptr;
    r.largest_at_peak.push_back(BufferRow{.workspace = false,
                                          .scope = prod ? prod->scope : v.name,
                                          .op = prod ? op_name(prod->op) : b.gathered ? "gathered parameter" : "gradient",
                                          .shape = v.shape,
                                          .dtype = v.dtype,
                                          .bytes = b.bytes,
                                          .first = b.first,
                                          .last = b.last,
                                          .first_phase = first_phase,
                                          .last_phase = last_phase});
  }
  // The arena is the activations and, at the peak, the running node's workspace.
  r.activations_bytes = p.arena_bytes - r.workspace_bytes;
  if (Evaluator::during_training(c)) r.evaluation_bytes = Evaluator::planned_bytes(c, ranks, p.arena_bytes);
  r.total_bytes = r.params_bytes + r.grads_bytes + r.optimizer_bytes + r.activations_bytes + r.inputs_bytes +
                  r.workspace_bytes + r.library_bytes + r.communication_bytes + r.checkpoint_bytes + r.evaluation_bytes;
  std::stable_sort(r.largest_at_peak.begin(), r.largest_at_peak.end(),
                   [](const BufferRow& a, const BufferRow& b) { return a.bytes > b.bytes; });
  if (r.largest_at_peak.size() > top) r.largest_at_peak.resize(top);
  r.config_summary =
      fmt::format("{} {} ({}), {} layers, batch {} in {} minibatch{}, remat '{}' ({})", choice_name(c.model.kind),
                  dtype_name(c.model.dtype), c.source.empty() ? "defaults" : c.source,
                  nn::model_kind(c.model.kind).language_model ? c.model.transformer.num_layers : 1, c.data.batch_size,
                  c.optimizer.num_minibatches, c.optimizer.num_minibatches == 1 ? "" : "es",
                  choice_set_name(c.model.remat), choice_name(c.model.remat_policy));
  if (!c.model.remat_layers.empty()) r.config_summary += " chose " + describe_layers(c.model.remat_layers);
  if (ranks > 1)
    r.config_summary += fmt::format("; per rank of {}, optimizer.shard = {}", ranks, choice_name(c.optimizer.shard));
  return r;
}

std::string format_shard_modes(const Config& c, int ranks, PlanOptions opts) {
  const std::string together = fmt::format("{} on 1 host", ranks);
  std::string o =
      fmt::format("per rank of {} (optimizer.shard):\n  {:<12} {:>11} {:>13} {:>11} {:>11} {:>11} {:>11} {:>11}\n",
                  ranks, "shard", "total", together, "params", "grads", "optimizer", "activations", "comm bufs");
  for (size_t i = 0; i < choices_of(OptimizerShard{}).size(); ++i) {
    Config m = c;
    m.optimizer.shard = static_cast<OptimizerShard>(i);
    if (m.optimizer.shard == OptimizerShard::params) {  // what it does not shard yet is refused
      try {
        validate_config(m);
      } catch (const UserError& e) {
        o += fmt::format("  {:<12} not with this configuration: {}\n", choice_name(m.optimizer.shard), e.what());
        continue;
      }
    }
    const MemoryReport r = memory_report(m, 0, opts, ranks);
    o += fmt::format("  {:<12} {:>11} {:>13} {:>11} {:>11} {:>11} {:>11} {:>11}\n", choice_name(m.optimizer.shard),
                     format_bytes(r.total_bytes), format_bytes(r.total_bytes * ranks), format_bytes(r.params_bytes),
                     format_bytes(r.grads_bytes), format_bytes(r.optimizer_bytes), format_bytes(r.activations_bytes),
                     format_bytes(r.communication_bytes));
  }
  o += fmt::format(
      "  (`loom train` refuses a job whose ranks on one machine need more together than it has "
      "available: the \"{}\" column when all of them run there)\n",
      together);
  return o;
}

std::string format_memory_report(const MemoryReport& r) {
  std::string o = fmt::format("memory plan: {}\n{} parameters; planned in {:.1f} ms ({} schedule steps)\n\n",
                              r.config_summary, r.num_params, r.plan_ms, r.num_steps);
  auto line = [&](const char* name, int64_t b, const char* note) {
    o += fmt::format("  {:<13} {:>16} B  {:>12}  {}\n", name, b, format_bytes(b), note);
  };
  const std::string frozen =
      r.frozen_params_bytes == 0
          ? std::string("float32 masters")
          : fmt::format("{} frozen base (LoRA; blocks' dense kernels {}), {} trainable adapters (float32 masters)",
                        format_bytes(r.frozen_params_bytes), r.base_storage,
                        format_bytes(r.params_bytes - r.frozen_params_bytes));
  line("params", r.params_bytes,
       r.ranks > 1 && r.param_shard
           ? "float32, this rank's shard (each parameter is gathered into the arena for its uses)"
           : frozen.c_str());
  line("grads", r.grads_bytes,
       r.ranks > 1 && r.grad_shard ? "float32, this rank's shard (the whole gradients are working memory, in the arena)"
                                   : "float32, accumulated in place over minibatches");
  line("optimizer", r.optimizer_bytes, "moments, float32");
  line("activations", r.activations_bytes, "arena less the workspace at the peak (one minibatch's forward + backward)");
  line("inputs", r.inputs_bytes, "one minibatch of token ids / features and the loss seed");
  line("workspace", r.workspace_bytes, "kernel scratch of the node at the peak, in the arena");
  line("library", r.library_bytes,
       "what the libraries of the running kernel allocate for themselves (oneDNN sgemm's packing buffers, one "
       "per thread), the most of any node: host memory beside the arena");
  if (r.ranks > 1) line("communication", r.communication_bytes, "gradient buckets' staging and receive buffers");
  line("checkpoint", r.checkpoint_bytes,
       "a save's or a resume's stream buffer (host memory; never a copy of the state)");
  if (r.evaluation_bytes > 0)
    line("evaluation", r.evaluation_bytes,
         "the validation program's inputs, and its arena unless it fits in the training arena, which it "
         "borrows between steps (train.eval_interval; it shares the parameters, or under optimizer.shard = "
         "params gathers them there)");
  o += fmt::format("  {:<13} {:>16} B  {:>12}\n\n", "total", r.total_bytes, format_bytes(r.total_bytes));
  const int64_t arena = r.activations_bytes + r.workspace_bytes;
  const double frag = r.lower_bound_bytes ? 100.0 * (arena - r.lower_bound_bytes) / r.lower_bound_bytes : 0;
  o += fmt::format("arena {} vs live-bytes lower bound {} ({:.1f}% above)\n", format_bytes(arena),
                   format_bytes(r.lower_bound_bytes), frag);
  if (r.max_workspace_bytes > 0)
    o += fmt::format("largest kernel workspace {:.2f} MiB ({} in {}), sized for {} thread{}\n",
                     r.max_workspace_bytes / 1048576.0, r.max_workspace_op, scope_label(r.max_workspace_scope),
                     r.workspace_threads, r.workspace_threads == 1 ? "" : "s");
  o += fmt::format("peak at schedule step {} of {}: {} {} in {}\n\n", r.peak_step, r.num_steps, r.peak_phase, r.peak_op,
                   scope_label(r.peak_scope));
  o += fmt::format("{} largest buffers live at the peak:\n", r.largest_at_peak.size());
  o += fmt::format("  {:<34} {:<18} {:<24} {:<9} {:>10}  {}\n", "scope", "op", "shape", "dtype", "MiB",
                   "live range (steps)");
  for (const BufferRow& b : r.largest_at_peak)
    o += fmt::format("  {:<34} {:<18} {:<24} {:<9} {:>10.1f}  {}-{} ({} -> {})\n", scope_label(b.scope), b.op,
                     b.workspace ? "-" : b.shape.str(), b.workspace ? "workspace" : dtype_name(b.dtype),
                     b.bytes / 1048576.0, b.first, b.last, b.first_phase, b.last_phase);
  return o;
}

namespace {
double predicted_step_seconds(const FitChoice& f, double ceiling_flops) {
  return ceiling_flops > 0 ? (f.step_flops + f.recompute_flops) / ceiling_flops : 0;
}
}  // namespace

std::string format_fit_frontier(const std::vector<Fitter::FitPoint>& points, double ceiling_flops) {
  std::string o = fmt::format("{:>11} {:>11} {:>10} {:>10} {:>9} {:>6} {:>6}  {}\n", "budget", "planned",
                              "recompute", "step (s)", "fit (ms)", "plans", "head", "choice (layers from the first; minibatches)");
  for (const Fitter::FitPoint& p : points) {
    const FitChoice& f = p.choice;
    o += fmt::format("{:>11} {:>11} {:>9.1f}% {:>10} {:>9.1f} {:>6} {:>6}  {}; {}{}\n", format_bytes(p.budget),
                     format_bytes(f.total_bytes), 100 * f.recompute_flops / f.step_flops,
                     ceiling_flops > 0 ? fmt::format("{:.3f}", predicted_step_seconds(f, ceiling_flops)) : "-",
                     1e3 * p.seconds, p.plans, f.head_chunk == 0 ? std::string("plain") : std::to_string(f.head_chunk),
                     describe_layers(f.layers), f.num_minibatches,
                     f.proven_least ? "" : " (not proven least)");
  }
  return o;
}

nlohmann::json fit_choice_json(const FitChoice& f) {
  return {{"total_bytes", f.total_bytes},
          {"choice", describe_choice(f)},
          {"layers", describe_layers(f.layers)},
          {"num_minibatches", f.num_minibatches},
          {"head_chunk", f.head_chunk},
          {"recompute_flops", f.recompute_flops},
          {"step_flops", f.step_flops},
          {"proven_least", f.proven_least}};
}

nlohmann::json fit_frontier_json(const std::vector<Fitter::FitPoint>& points, double ceiling_flops) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Fitter::FitPoint& p : points) {
    nlohmann::json row = fit_choice_json(p.choice);
    row["budget_bytes"] = p.budget;
    row["predicted_step_seconds"] = predicted_step_seconds(p.choice, ceiling_flops);
    row["fit_seconds"] = p.seconds;
    row["full_plans"] = p.plans;
    rows.push_back(row);
  }
  return rows;
}

nlohmann::json memory_report_json(const MemoryReport& r) {
  nlohmann::json bufs = nlohmann::json::array();
  for (const BufferRow& b : r.largest_at_peak) {
    std::vector<int64_t> shape(b.shape.dims.begin(), b.shape.dims.begin() + b.shape.rank);
    if (b.workspace) shape.clear();
    bufs.push_back({{"kind", b.workspace ? "workspace" : "activation"},
                    {"scope", b.scope},
                    {"op", b.op},
                    {"shape", shape},
                    {"dtype", b.workspace ? "-" : dtype_name(b.dtype)},
                    {"bytes", b.bytes},
                    {"first_step", b.first},
                    {"last_step", b.last}});
  }
  return {{"config", r.config_summary},
          {"total_bytes", r.total_bytes},
          {"params_bytes", r.params_bytes},
          {"frozen_params_bytes", r.frozen_params_bytes},
          {"grads_bytes", r.grads_bytes},
          {"optimizer_bytes", r.optimizer_bytes},
          {"activations_bytes", r.activations_bytes},
          {"inputs_bytes", r.inputs_bytes},
          {"workspace_bytes", r.workspace_bytes},
          {"library_bytes", r.library_bytes},
          {"max_workspace_bytes", r.max_workspace_bytes},
          {"workspace_threads", r.workspace_threads},
          {"communication_bytes", r.communication_bytes},
          {"evaluation_bytes", r.evaluation_bytes},
          {"checkpoint_bytes", r.checkpoint_bytes},
          {"ranks", r.ranks},
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
