#include "runtime/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace loom {

std::vector<std::string> scope_prefixes(const std::string& scope) {
  std::vector<std::string> out;
  if (scope.empty()) return out;
  for (size_t slash = scope.find('/'); slash != std::string::npos; slash = scope.find('/', slash + 1))
    out.push_back(scope.substr(0, slash));
  out.push_back(scope);
  return out;
}

namespace {

// Top-level span of a node inside its minibatch: recompute runs inside the backward.
const char* phase_group(Phase p) {
  switch (p) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
    case Phase::recompute:
      return "backward";
  }
  return "?";
}

std::string value_desc(const Value& v) {
  std::string s = v.shape.str();
  s += ' ';
  s += dtype_name(v.dtype);
  return s;
}

// What the trace needs about one schedule step, computed once.
struct StepInfo {
  std::string group;                  // forward | backward
  std::vector<std::string> path;      // nested spans between the phase span and the op
  std::vector<const char*> path_cat;  // "scope" or "remat"
  nlohmann::json args;                // the op's static args
  OpCost cost;
};

std::vector<StepInfo> step_infos(const Graph& g, const MemoryPlan& plan) {
  std::vector<StepInfo> infos(plan.schedule.size());
  for (size_t s = 0; s < plan.schedule.size(); ++s) {
    const Node& n = g.node(plan.schedule[s]);
    StepInfo& si = infos[s];
    si.group = phase_group(n.phase);
    si.cost = node_cost(g, n);
    auto add = [&](const std::string& name, const char* cat) {
      si.path.push_back(name);
      si.path_cat.push_back(cat);
    };
    if (n.phase == Phase::recompute) {
      // Inside the backward of the region: region scopes > rematted_computation > the rest.
      const int32_t r = g.outermost_region(n.region);
      const std::string rs = r >= 0 ? g.regions()[static_cast<size_t>(r)].scope : std::string();
      for (const std::string& p : scope_prefixes(rs)) add(p, "scope");
      add("rematted_computation", "remat");
      const bool under =
          rs.empty() || n.scope == rs ||
          (n.scope.size() > rs.size() && n.scope.compare(0, rs.size(), rs) == 0 && n.scope[rs.size()] == '/');
      for (const std::string& p : scope_prefixes(n.scope))
        if (!under || p.size() > rs.size()) add(p, "scope");
    } else {
      for (const std::string& p : scope_prefixes(n.scope)) add(p, "scope");
    }
    nlohmann::json ins = nlohmann::json::array(), outs = nlohmann::json::array();
    for (ValueId v : n.in) ins.push_back(value_desc(g.value(v)));
    for (ValueId v : n.out) outs.push_back(value_desc(g.value(v)));
    si.args = {{"scope", n.scope},       {"phase", phase_name(n.phase)},
               {"schedule_step", s},     {"inputs", ins},
               {"outputs", outs},        {"bytes", si.cost.bytes},
               {"flops", si.cost.flops}, {"arena_live_bytes", s < plan.live_bytes.size() ? plan.live_bytes[s] : 0}};
  }
  return infos;
}

bool closed(const SpanEvent& s) { return s.t_end_us >= s.t_begin_us; }

// Consecutive op events of one executor run: inside one minibatch span (span >= 0), or, without
// spans, split where the schedule step goes back.
struct OpGroup {
  size_t begin = 0, end = 0;
  int32_t span = -1;
};

std::vector<OpGroup> group_ops(const OpRecorder& rec) {
  const auto ops = rec.ops();
  const auto spans = rec.spans();
  std::vector<int32_t> mbs;
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i].kind == SpanKind::minibatch && closed(spans[i])) mbs.push_back(static_cast<int32_t>(i));
  std::vector<OpGroup> groups;
  size_t m = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpEvent& e = ops[i];
    while (m < mbs.size() && spans[static_cast<size_t>(mbs[m])].t_end_us < e.t_begin_us) ++m;
    int32_t span = -1;
    if (m < mbs.size()) {
      const SpanEvent& sp = spans[static_cast<size_t>(mbs[m])];
      if (sp.t_begin_us <= e.t_begin_us && e.t_end_us <= sp.t_end_us) span = mbs[m];
    }
    const bool fresh = groups.empty() || span != groups.back().span || (span < 0 && e.step <= ops[i - 1].step);
    if (fresh)
      groups.push_back(OpGroup{.begin = i, .end = i + 1, .span = span});
    else
      groups.back().end = i + 1;
  }
  return groups;
}

// Trace thread ids: the executor's ops and spans, and the gradient buckets' sums over ranks.
constexpr int kExecutorTid = 1, kCommunicationTid = 2;

struct XEvent {
  std::string name;
  const char* cat;
  int64_t b, e;  // ns from the trace origin
  int depth;
  nlohmann::json args;
  int tid = kExecutorTid;
};

double us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

}  // namespace

std::string chrome_trace(const Graph& g, const MemoryPlan& plan, const OpRecorder& rec, const TraceInfo& info) {
  const auto ops = rec.ops();
  const auto spans = rec.spans();
  const std::vector<StepInfo> infos = step_infos(g, plan);

  // Times as integer nanoseconds from the first event, so a parent's end is exactly its last
  // child's end.
  double origin = info.origin_us >= 0 ? info.origin_us : std::numeric_limits<double>::infinity();
  for (const OpEvent& e : ops) origin = std::min(origin, e.t_begin_us);
  for (const SpanEvent& s : spans) origin = std::min(origin, s.t_begin_us);
  bool communication = false;
  auto ns = [&](double t) { return static_cast<int64_t>(std::llround((t - origin) * 1000.0)); };

  std::vector<XEvent> xs;
  for (const SpanEvent& s : spans) {
    if (!closed(s)) continue;
    std::string name;
    nlohmann::json args;
    int depth = 1;
    switch (s.kind) {
      case SpanKind::train_step:
        name = "train_step ";
        name += std::to_string(s.index);
        args = {{"step", s.index}};
        depth = 0;
        break;
      case SpanKind::minibatch:
        name = "minibatch_";
        name += std::to_string(s.index);
        args = {{"minibatch", s.index}};
        break;
      case SpanKind::optimizer:
        name = "optimizer";
        args = {{"step", s.index}};
        break;
      case SpanKind::communication:
        name = "bucket_";
        name += std::to_string(s.index);
        args = {{"bucket", s.index}};
        depth = 0;
        communication = true;
        break;
    }
    xs.push_back(XEvent{.name = std::move(name),
                        .cat = span_kind_name(s.kind),
                        .b = ns(s.t_begin_us),
                        .e = ns(s.t_end_us),
                        .depth = depth,
                        .args = args,
                        .tid = s.kind == SpanKind::communication ? kCommunicationTid : kExecutorTid});
  }

  struct Open {
    const std::string* name;
    const char* cat;
    int64_t b;
  };
  for (const OpGroup& grp : group_ops(rec)) {
    const int base = grp.span >= 0 ? 2 : 0;
    std::vector<Open> stack;
    int64_t prev_end = 0;
    auto close_to = [&](size_t keep) {
      while (stack.size() > keep) {
        const Open o = stack.back();
        stack.pop_back();
        xs.push_back(XEvent{.name = *o.name,
                            .cat = o.cat,
                            .b = o.b,
                            .e = prev_end,
                            .depth = base + static_cast<int>(stack.size()),
                            .args = nlohmann::json::object()});
      }
    };
    for (size_t i = grp.begin; i < grp.end; ++i) {
      const OpEvent& e = ops[i];
      const StepInfo& si = infos.at(static_cast<size_t>(e.step));
      const int64_t b = ns(e.t_begin_us), en = ns(e.t_end_us);
      // The op's span path: its phase group, then its scopes.
      const size_t depth = 1 + si.path.size();
      auto name_at = [&](size_t k) -> const std::string* { return k == 0 ? &si.group : &si.path[k - 1]; };
      size_t common = 0;
      while (common < stack.size() && common < depth && *stack[common].name == *name_at(common)) ++common;
      close_to(common);
      for (size_t k = common; k < depth; ++k)
        stack.push_back(Open{.name = name_at(k), .cat = k == 0 ? "phase" : si.path_cat[k - 1], .b = b});
      nlohmann::json args = si.args;
      const double sec = static_cast<double>(en - b) * 1e-9;
      if (sec > 0) {
        args["GFLOP/s"] = static_cast<double>(si.cost.flops) / sec * 1e-9;
        args["GB/s"] = static_cast<double>(si.cost.bytes) / sec * 1e-9;
      }
      xs.push_back(XEvent{.name = op_name(g.node(plan.schedule[static_cast<size_t>(e.step)]).op),
                          .cat = "op",
                          .b = b,
                          .e = en,
                          .depth = base + static_cast<int>(depth),
                          .args = std::move(args)});
      prev_end = en;
    }
    close_to(0);
  }
  std::stable_sort(xs.begin(), xs.end(), [](const XEvent& a, const XEvent& b) {
    if (a.b != b.b) return a.b < b.b;
    if (a.e != b.e) return a.e > b.e;
    return a.depth < b.depth;
  });

  std::string out = "{\"displayTimeUnit\": \"ms\",\n\"otherData\": ";
  out += nlohmann::json{{"title", info.title},
                        {"arena_bytes", plan.arena_bytes},
                        {"live_bytes_peak", plan.lower_bound_bytes},
                        {"persistent_bytes", info.persistent_bytes},
                        {"dropped_events", rec.dropped()}}
             .dump();
  out += ",\n\"traceEvents\": [\n";
  bool first = true;
  auto emit = [&](const nlohmann::json& j) {
    if (!first) out += ",\n";
    first = false;
    out += j.dump();
  };
  const int pid = info.pid;
  emit({{"ph", "M"}, {"pid", pid}, {"name", "process_name"}, {"args", {{"name", info.process_name}}}});
  emit({{"ph", "M"}, {"pid", pid}, {"name", "process_sort_index"}, {"args", {{"sort_index", pid - 1}}}});
  auto thread = [&](int tid, const char* name) {
    emit({{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", "thread_name"}, {"args", {{"name", name}}}});
    emit({{"ph", "M"}, {"pid", pid}, {"tid", tid}, {"name", "thread_sort_index"}, {"args", {{"sort_index", tid}}}});
  };
  thread(kExecutorTid, "train step (executor)");
  if (communication) thread(kCommunicationTid, "communication (gradient buckets)");
  for (const XEvent& x : xs) {
    nlohmann::json j = {{"ph", "X"},    {"pid", pid},    {"tid", x.tid},        {"name", x.name},
                        {"cat", x.cat}, {"ts", us(x.b)}, {"dur", us(x.e - x.b)}};
    if (!x.args.empty()) j["args"] = x.args;
    emit(j);
  }
  for (const OpEvent& e : ops) {
    const auto s = static_cast<size_t>(e.step);
    const int64_t live = s < plan.live_bytes.size() ? plan.live_bytes[s] : 0;
    const double ts = us(ns(e.t_begin_us));
    emit({{"ph", "C"}, {"pid", pid}, {"name", "arena"}, {"ts", ts}, {"args", {{"live_bytes", live}}}});
    emit({{"ph", "C"},
          {"pid", pid},
          {"name", "memory"},
          {"ts", ts},
          {"args", {{"total_bytes", info.persistent_bytes + live}}}});
  }
  out += "\n]}\n";
  return out;
}

ProfileSummary summarize_profile(const Graph& g, const MemoryPlan& plan, const OpRecorder& rec,
                                 double ceiling_gflop_per_s, size_t top) {
  ProfileSummary s;
  s.dropped_events = rec.dropped();
  s.ceiling_gflop_per_s = ceiling_gflop_per_s;
  double step_total_ms = 0, optimizer_us = 0, communication_us = 0;
  for (const SpanEvent& sp : rec.spans()) {
    if (!closed(sp)) continue;
    const double dur = sp.t_end_us - sp.t_begin_us;
    if (sp.kind == SpanKind::train_step) {
      s.step_ms.push_back(dur / 1000.0);
      step_total_ms += dur / 1000.0;
    } else if (sp.kind == SpanKind::minibatch) {
      ++s.minibatches;
    } else if (sp.kind == SpanKind::optimizer) {
      optimizer_us += dur;
    } else {
      communication_us += dur;
    }
  }
  s.steps = static_cast<int64_t>(s.step_ms.size());
  if (!s.step_ms.empty()) {
    std::vector<double> v = s.step_ms;
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    s.median_step_ms = v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
    s.mean_step_ms = step_total_ms / static_cast<double>(v.size());
  }

  std::vector<OpCost> costs(plan.schedule.size());
  for (size_t i = 0; i < plan.schedule.size(); ++i) costs[i] = node_cost(g, g.node(plan.schedule[i]));
  double phase_us[kNumPhases] = {};  // indexed by Phase
  double total_flops = 0, model_flops = 0, total_bytes = 0, total_us = 0;
  std::map<std::string, OpTimeRow> rows, kinds;
  for (const OpEvent& e : rec.ops()) {
    const auto st = static_cast<size_t>(e.step);
    const Node& n = g.node(plan.schedule.at(st));
    const double dur = e.t_end_us - e.t_begin_us;
    const OpCost& c = costs[st];
    phase_us[static_cast<size_t>(n.phase)] += dur;
    total_flops += static_cast<double>(c.flops);
    if (n.phase != Phase::recompute) model_flops += static_cast<double>(c.flops);
    total_bytes += static_cast<double>(c.bytes);
    total_us += dur;
    std::string key = op_name(n.op);
    OpTimeRow& k = kinds[key];
    key += '\t';
    key += n.scope;
    key += '\t';
    key += phase_name(n.phase);
    OpTimeRow& r = rows[key];
    if (r.count == 0) r.op = op_name(n.op), r.scope = n.scope, r.phase = phase_name(n.phase);
    if (k.count == 0) k.op = op_name(n.op);
    for (OpTimeRow* x : {&r, &k}) {
      ++x->count;
      x->total_ms += dur / 1000.0;
      x->flops += static_cast<double>(c.flops);
      x->bytes += static_cast<double>(c.bytes);
    }
    ++s.op_events;
  }
  auto finish = [&](std::map<std::string, OpTimeRow>& m, size_t limit) {
    std::vector<OpTimeRow> v;
    for (auto& [key, r] : m) {
      r.share = total_us > 0 ? r.total_ms * 1000.0 / total_us : 0;
      if (r.total_ms > 0) {
        r.gflop_per_s = r.flops / (r.total_ms * 1e-3) * 1e-9;
        r.gb_per_s = r.bytes / (r.total_ms * 1e-3) * 1e-9;
      }
      v.push_back(r);
    }
    std::stable_sort(v.begin(), v.end(),
                     [](const OpTimeRow& a, const OpTimeRow& b) { return a.total_ms > b.total_ms; });
    if (v.size() > limit) v.resize(limit);
    return v;
  };
  s.top_ops = finish(rows, top);
  s.op_kinds = finish(kinds, kinds.size());

  const double nsteps = static_cast<double>(std::max<int64_t>(s.steps, 1));
  s.forward_ms = phase_us[static_cast<size_t>(Phase::forward)] / 1000.0 / nsteps;
  s.backward_ms = phase_us[static_cast<size_t>(Phase::backward)] / 1000.0 / nsteps;
  s.recompute_ms = phase_us[static_cast<size_t>(Phase::recompute)] / 1000.0 / nsteps;
  s.optimizer_ms = optimizer_us / 1000.0 / nsteps;
  s.communication_ms = communication_us / 1000.0 / nsteps;
  if (s.steps > 0)
    s.other_ms = std::max(0.0, step_total_ms / nsteps - s.forward_ms - s.backward_ms - s.recompute_ms - s.optimizer_ms);
  s.step_gflop = total_flops / nsteps * 1e-9;
  s.model_step_gflop = model_flops / nsteps * 1e-9;
  s.step_gbytes = total_bytes / nsteps * 1e-9;
  if (s.median_step_ms > 0) {
    s.achieved_gflop_per_s = s.step_gflop / (s.median_step_ms * 1e-3);
    s.achieved_model_gflop_per_s = s.model_step_gflop / (s.median_step_ms * 1e-3);
  }
  if (ceiling_gflop_per_s > 0) {
    s.fraction_of_ceiling = s.achieved_gflop_per_s / ceiling_gflop_per_s;
    s.mfu = s.achieved_model_gflop_per_s / ceiling_gflop_per_s;
  }
  return s;
}

nlohmann::json profile_summary_json(const ProfileSummary& s) {
  auto rows = [](const std::vector<OpTimeRow>& v, bool per_node) {
    nlohmann::json a = nlohmann::json::array();
    for (const OpTimeRow& r : v) {
      nlohmann::json j = {
          {"op", r.op},       {"count", r.count}, {"total_ms", r.total_ms},       {"share", r.share},
          {"flops", r.flops}, {"bytes", r.bytes}, {"gflop_per_s", r.gflop_per_s}, {"gb_per_s", r.gb_per_s}};
      if (per_node) {
        j["scope"] = r.scope;
        j["phase"] = r.phase;
      }
      a.push_back(j);
    }
    return a;
  };
  return {{"steps", s.steps},
          {"minibatches", s.minibatches},
          {"op_events", s.op_events},
          {"step_ms", s.step_ms},
          {"median_step_ms", s.median_step_ms},
          {"mean_step_ms", s.mean_step_ms},
          {"phase_ms_per_step",
           {{"forward", s.forward_ms},
            {"backward", s.backward_ms},
            {"recompute", s.recompute_ms},
            {"optimizer", s.optimizer_ms},
            {"other", s.other_ms}}},
          {"communication_ms_per_step", s.communication_ms},
          {"step_gflop", s.step_gflop},
          {"model_step_gflop", s.model_step_gflop},
          {"step_gbytes", s.step_gbytes},
          {"achieved_gflop_per_s", s.achieved_gflop_per_s},
          {"achieved_model_gflop_per_s", s.achieved_model_gflop_per_s},
          {"matmul_ceiling_gflop_per_s", s.ceiling_gflop_per_s},
          {"fraction_of_ceiling", s.fraction_of_ceiling},
          {"mfu", s.mfu},
          {"top_ops", rows(s.top_ops, true)},
          {"op_kinds", rows(s.op_kinds, false)},
          {"dropped_events", s.dropped_events}};
}

std::string format_profile_summary(const ProfileSummary& s) {
  std::string o = fmt::format("profiled {} step{} ({} minibatch runs, {} op executions): median step {:.2f} ms",
                              s.steps, s.steps == 1 ? "" : "s", s.minibatches, s.op_events, s.median_step_ms);
  if (!s.step_ms.empty()) {
    const auto [lo, hi] = std::minmax_element(s.step_ms.begin(), s.step_ms.end());
    o += fmt::format(" (min {:.2f}, max {:.2f})", *lo, *hi);
  }
  o += "\n";
  const double step = s.mean_step_ms > 0 ? s.mean_step_ms : 1;
  o += fmt::format("time per step by phase (mean step {:.2f} ms):\n", s.mean_step_ms);
  auto phase = [&](const char* name, double ms) {
    o += fmt::format("  {:<10} {:>10.2f} ms  {:>5.1f}%\n", name, ms, 100.0 * ms / step);
  };
  phase("forward", s.forward_ms);
  phase("backward", s.backward_ms);
  phase("recompute", s.recompute_ms);
  phase("optimizer", s.optimizer_ms);
  phase("other", s.other_ms);
  if (s.communication_ms > 0)
    o += fmt::format("  gradient sums over ranks {:.2f} ms per step, start to completion (alongside the backward)\n",
                     s.communication_ms);
  o += fmt::format("op traffic {:.3f} GB per step\n", s.step_gbytes);
  const bool ceiling = s.ceiling_gflop_per_s > 0;
  o += fmt::format("hardware FLOPs (every op run, recompute included): {:.3f} GFLOP per step, {:.2f} GFLOP/s{}\n",
                   s.step_gflop, s.achieved_gflop_per_s,
                   ceiling ? fmt::format(" = {:.1f}% of the ceiling", 100.0 * s.fraction_of_ceiling) : "");
  o += fmt::format("model FLOPs (forward + backward, no recompute):    {:.3f} GFLOP per step, {:.2f} GFLOP/s{}\n",
                   s.model_step_gflop, s.achieved_model_gflop_per_s,
                   ceiling ? fmt::format(" = MFU {:.1f}%", 100.0 * s.mfu) : "");
  o += ceiling ? fmt::format("ceiling: the measured {} matmul rate, {:.1f} GFLOP/s{}\n", s.ceiling_dtype,
                             s.ceiling_gflop_per_s, s.ceiling_kernel.empty() ? "" : " (" + s.ceiling_kernel + ")")
               : "ceiling: not measured\n";
  o += fmt::format("\n{} most expensive ops (total over the profiled steps):\n", s.top_ops.size());
  o += fmt::format("  {:<18} {:<34} {:<9} {:>6} {:>10} {:>6} {:>9} {:>8}\n", "op", "scope", "phase", "count",
                   "total ms", "%", "GFLOP/s", "GB/s");
  for (const OpTimeRow& r : s.top_ops)
    o += fmt::format("  {:<18} {:<34} {:<9} {:>6} {:>10.3f} {:>6.1f} {:>9.2f} {:>8.2f}\n", r.op,
                     r.scope.empty() ? "(root)" : r.scope, r.phase, r.count, r.total_ms, 100.0 * r.share, r.gflop_per_s,
                     r.gb_per_s);
  o += "\nper op kind:\n";
  o += fmt::format("  {:<18} {:>6} {:>10} {:>6} {:>9} {:>8}\n", "op", "count", "total ms", "%", "GFLOP/s", "GB/s");
  for (const OpTimeRow& r : s.op_kinds)
    o += fmt::format("  {:<18} {:>6} {:>10.3f} {:>6.1f} {:>9.2f} {:>8.2f}\n", r.op, r.count, r.total_ms,
                     100.0 * r.share, r.gflop_per_s, r.gb_per_s);
  if (s.dropped_events)
    o += fmt::format("\nwarning: {} events did not fit in the recorder and were dropped\n", s.dropped_events);
  return o;
}

}  // namespace loom
