// The profiler (docs/profiling.md), on a tiny Transformer:
//   - trace.json is Chrome Trace Event format with process/thread names; every complete event
//     nests inside its parent chain train_step > minibatch > forward|backward > scopes > op, the
//     optimizer span sits in its train step, recompute is grouped in rematted_computation spans
//     inside the backward (only with remat on); ops carry scope, shapes, dtypes, bytes and FLOPs;
//     the two counter tracks have one sample per op and peak at the plan's live-bytes peak;
//   - summary.json has the step time, phases, top ops, per-kind rates and the ceiling fraction;
//   - memory.html is self-contained and holds the plot and the table, and model.remat = auto's
//     frontier when given (`loom memory --fit`, whose text columns are checked too);
//   - the cost rules, the recorder (off by default, bounded) and the commands.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "backend/registry.h"
#include "core/format.h"
#include "data/data.h"
#include "graph/passes/plan.h"
#include "report/ceiling.h"
#include "report/memory_html.h"
#include "report/memory_report.h"
#include "report/profile.h"
#include "runtime/profiler.h"
#include "support/run_loom.h"
#include "train/config.h"
#include "train/fit.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> tiny(const std::string& remat, int minibatches = 2, const std::string& dtype = "float32") {
  return {"model.kind=transformer", "model.dtype=" + dtype,
          "model.hidden_size=32",   "model.num_layers=2",
          "model.head_dim=8",       "model.vocab_size=31",
          "model.num_outputs=31",   "model.max_seq_len=16",
          "model.dropout_rate=0.1", "data.kind=random_tokens",
          "data.batch_size=4",      "data.seq_len=16",
          "data.vocab_size=31",     "optimizer.num_minibatches=" + std::to_string(minibatches),
          "model.remat=" + remat};
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "loom_test_profile" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Profiled {
  Config config;
  TrainProgram prog;
  MemoryPlan plan;
  ProfileOutput out;
  json trace, summary;
  std::string html;
};

Profiled profile(const std::vector<std::string>& ov, const std::string& name, int steps = 2, bool ceiling = false) {
  Profiled p;
  p.config = default_config(ov);
  p.prog = build_train_program(p.config);
  p.plan = plan_training(p.config, p.prog);
  auto be = make_backend("cpu");
  DataSource data(p.config.data, data_context(p.config));
  ProfileOptions o;
  o.steps = steps;
  o.warmup = 1;
  o.out_dir = temp_dir(name).string();
  o.measure_ceiling = ceiling;
  o.log = nullptr;
  p.out = run_profile(p.config, *be, data, o);
  p.trace = json::parse(read(p.out.trace_path));
  p.summary = json::parse(read(p.out.summary_path));
  p.html = read(p.out.html_path);
  return p;
}

int64_t to_ns(double us) { return std::llround(us * 1000.0); }

// Complete events rebuilt into a tree: each event's ancestors, outermost first.
struct XNode {
  const json* ev;
  int64_t b, e;
  std::vector<const json*> chain;
};

std::vector<XNode> nest(const json& trace) {
  std::vector<XNode> xs;
  for (const json& ev : trace.at("traceEvents"))
    if (ev.at("ph") == "X") xs.push_back({&ev, to_ns(ev.at("ts")), to_ns(ev.at("ts")) + to_ns(ev.at("dur")), {}});
  std::stable_sort(xs.begin(), xs.end(),
                   [](const XNode& a, const XNode& b) { return a.b != b.b ? a.b < b.b : a.e > b.e; });
  std::vector<const XNode*> stack;
  for (XNode& x : xs) {
    while (!stack.empty() && !(stack.back()->b <= x.b && x.e <= stack.back()->e)) {
      // Popping is only right when the open span ended before this one begins: anything else is
      // a partial overlap, which no viewer can draw as nesting.
      EXPECT_LE(stack.back()->e, x.b) << "'" << (*x.ev)["name"] << "' overlaps '" << (*stack.back()->ev)["name"]
                                      << "' without nesting";
      stack.pop_back();
    }
    for (const XNode* s : stack) x.chain.push_back(s->ev);
    stack.push_back(&x);
  }
  return xs;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

void check_trace(const Profiled& p, bool remat) {
  const json& t = p.trace;
  ASSERT_TRUE(t.contains("traceEvents"));
  // Metadata: the process and thread names.
  bool process = false, thread = false;
  for (const json& ev : t["traceEvents"]) {
    if (ev["ph"] != "M") continue;
    if (ev["name"] == "process_name") process = starts_with(ev["args"]["name"], "loom");
    if (ev["name"] == "thread_name") thread = !ev["args"]["name"].get<std::string>().empty();
  }
  EXPECT_TRUE(process && thread) << "process_name and thread_name metadata";

  const int64_t steps = 2, nmb = p.config.optimizer.num_minibatches;
  const auto nodes = static_cast<int64_t>(p.plan.schedule.size());
  int64_t ops = 0, remat_spans = 0, recompute_ops = 0, step_spans = 0, mb_spans = 0, opt_spans = 0;
  for (const XNode& x : nest(t)) {
    const json& ev = *x.ev;
    const std::string name = ev["name"];
    const std::string cat = ev["cat"];
    std::vector<std::string> chain;
    for (const json* a : x.chain) chain.push_back((*a)["name"]);
    if (cat == "train_step") {
      ++step_spans;
      EXPECT_TRUE(chain.empty()) << name;
      EXPECT_TRUE(starts_with(name, "train_step ")) << name;
    } else if (cat == "minibatch") {
      ++mb_spans;
      ASSERT_EQ(chain.size(), 1u) << name;
      EXPECT_TRUE(starts_with(chain[0], "train_step ")) << name;
      EXPECT_TRUE(starts_with(name, "minibatch_")) << name;
    } else if (cat == "optimizer") {
      ++opt_spans;
      ASSERT_EQ(chain.size(), 1u) << name;
      EXPECT_TRUE(starts_with(chain[0], "train_step ")) << name;
    } else if (cat == "remat") {
      ++remat_spans;
      EXPECT_EQ(name, "rematted_computation");
      ASSERT_GE(chain.size(), 3u);
      EXPECT_EQ(chain[2], "backward") << "recompute runs inside the backward";
    } else if (cat == "op") {
      ++ops;
      ASSERT_GE(chain.size(), 3u) << name << " at " << ev["args"]["scope"];
      EXPECT_TRUE(starts_with(chain[0], "train_step ")) << name;
      EXPECT_TRUE(starts_with(chain[1], "minibatch_")) << name;
      const std::string phase = ev["args"]["phase"];
      EXPECT_EQ(chain[2], phase == "forward" ? "forward" : "backward") << name << " (" << phase << ")";
      // Below the phase: the scope prefixes, with rematted_computation inserted for recompute.
      std::vector<std::string> below(chain.begin() + 3, chain.end());
      const auto it = std::find(below.begin(), below.end(), "rematted_computation");
      EXPECT_EQ(it != below.end(), phase == "recompute") << name << " at " << ev["args"]["scope"];
      if (phase == "recompute") {
        ++recompute_ops;
        below.erase(it);
      }
      EXPECT_EQ(below, scope_prefixes(ev["args"]["scope"])) << name;
      // Args: shapes and dtypes of inputs and outputs, bytes, FLOPs.
      const json& a = ev["args"];
      for (const char* k : {"scope", "inputs", "outputs", "bytes", "flops", "schedule_step"})
        EXPECT_TRUE(a.contains(k)) << name << " lacks " << k;
      EXPECT_FALSE(a["inputs"].empty()) << name;
      for (const json& d : a["inputs"]) EXPECT_NE(d.get<std::string>().find(']'), std::string::npos) << d;
      if (name == "dense") {
        EXPECT_GT(a["flops"].get<int64_t>(), 0);
        EXPECT_GT(a["bytes"].get<int64_t>(), 0);
        EXPECT_NE(a["outputs"][0].get<std::string>().find(dtype_name(p.config.model.dtype)), std::string::npos)
            << a["outputs"];
      }
    } else {
      // phase and scope spans
      EXPECT_TRUE(cat == "phase" || cat == "scope") << cat;
      if (cat == "phase") {
        EXPECT_TRUE(name == "forward" || name == "backward") << name;
        ASSERT_EQ(chain.size(), 2u) << name;
        EXPECT_TRUE(starts_with(chain[1], "minibatch_"));
      }
    }
  }
  EXPECT_EQ(step_spans, steps);
  EXPECT_EQ(mb_spans, steps * nmb);
  EXPECT_EQ(opt_spans, steps);
  EXPECT_EQ(ops, steps * nmb * nodes) << "one op span per executed node";
  if (remat) {
    EXPECT_GT(remat_spans, 0);
    EXPECT_GT(recompute_ops, 0);
  } else {
    EXPECT_EQ(remat_spans, 0);
    EXPECT_EQ(recompute_ops, 0);
  }

  // Counter tracks: one sample per op; the arena's peaks at the plan's live-bytes peak; the total
  // adds the persistent memory.
  int64_t arena_samples = 0, total_samples = 0, arena_max = 0, total_max = 0;
  for (const json& ev : t["traceEvents"]) {
    if (ev["ph"] != "C") continue;
    if (ev["name"] == "arena") {
      ++arena_samples;
      arena_max = std::max(arena_max, ev["args"]["live_bytes"].get<int64_t>());
    } else if (ev["name"] == "memory") {
      ++total_samples;
      total_max = std::max(total_max, ev["args"]["total_bytes"].get<int64_t>());
    }
  }
  EXPECT_EQ(arena_samples, ops);
  EXPECT_EQ(total_samples, ops);
  EXPECT_EQ(arena_max, p.plan.lower_bound_bytes);
  EXPECT_LE(arena_max, p.plan.arena_bytes);
  const int64_t opt_bytes = 2 * p.plan.param_bytes;  // adam: mu and nu
  EXPECT_EQ(total_max, arena_max + p.plan.param_bytes + p.plan.grad_bytes + p.plan.input_bytes + opt_bytes);
}

void check_summary(const json& s, bool remat) {
  for (const char* k : {"median_step_ms", "step_ms", "phase_ms_per_step", "top_ops", "op_kinds", "achieved_gflop_per_s",
                        "matmul_ceiling_gflop_per_s", "fraction_of_ceiling", "step_gflop"})
    EXPECT_TRUE(s.contains(k)) << k;
  EXPECT_EQ(s["steps"], 2);
  EXPECT_GT(s["median_step_ms"].get<double>(), 0);
  for (const char* k : {"forward", "backward", "recompute", "optimizer"})
    EXPECT_TRUE(s["phase_ms_per_step"].contains(k)) << k;
  EXPECT_GT(s["phase_ms_per_step"]["forward"].get<double>(), 0);
  EXPECT_GT(s["phase_ms_per_step"]["backward"].get<double>(), 0);
  EXPECT_GT(s["phase_ms_per_step"]["optimizer"].get<double>(), 0);
  if (remat)
    EXPECT_GT(s["phase_ms_per_step"]["recompute"].get<double>(), 0);
  else
    EXPECT_EQ(s["phase_ms_per_step"]["recompute"].get<double>(), 0);
  ASSERT_FALSE(s["top_ops"].empty());
  EXPECT_LE(s["top_ops"].size(), 15u);
  double prev = 1e300;
  for (const json& r : s["top_ops"]) {
    for (const char* k : {"op", "scope", "phase", "count", "total_ms"}) EXPECT_TRUE(r.contains(k)) << k;
    EXPECT_GT(r["count"].get<int64_t>(), 0);
    EXPECT_LE(r["total_ms"].get<double>(), prev) << "sorted by total time";
    prev = r["total_ms"];
  }
  bool dense = false;
  for (const json& r : s["op_kinds"]) {
    EXPECT_TRUE(r.contains("gflop_per_s") && r.contains("gb_per_s"));
    if (r["op"] == "dense") dense = r["gflop_per_s"].get<double>() > 0 && r["gb_per_s"].get<double>() > 0;
  }
  EXPECT_TRUE(dense) << "dense achieves some GFLOP/s and GB/s";
  EXPECT_GT(s["step_gflop"].get<double>(), 0);
  EXPECT_GT(s["achieved_gflop_per_s"].get<double>(), 0);
}

void check_html(const std::string& html) {
  for (const char* bad : {"http://", "https://", "src=", "<link"})
    EXPECT_EQ(html.find(bad), std::string::npos) << "memory.html must be self-contained; found " << bad;
  for (const char* need : {"<svg id=\"plot\"", "<table class=\"bufs\" id=\"buffers\"", "id=\"buffer-rows\"",
                           "id=\"plan-data\"", "<script>", "<style>"})
    EXPECT_NE(html.find(need), std::string::npos) << need;
}

TEST(Profile, TraceWithRemat) {
  const Profiled p = profile(tiny("MLP,Attn"), "remat");
  check_trace(p, /*remat=*/true);
  check_summary(p.summary, true);
  check_html(p.html);
}

TEST(Profile, TraceWithoutRemat) {
  const Profiled p = profile(tiny("none", 1), "noremat");
  check_trace(p, /*remat=*/false);
  check_summary(p.summary, false);
}

TEST(Profile, Bfloat16AndCeiling) {
  const Profiled p = profile(tiny("MLP", 2, "bfloat16"), "bf16", 2, /*ceiling=*/true);
  check_trace(p, true);
  EXPECT_GT(p.summary["matmul_ceiling_gflop_per_s"].get<double>(), 0);
  const double f = p.summary["fraction_of_ceiling"];
  EXPECT_GT(f, 0);
  EXPECT_LT(f, 1.5);
  // bf16 activations show up in the op args.
  bool bf16 = false;
  for (const json& ev : p.trace["traceEvents"])
    if (ev["ph"] == "X" && ev["name"] == "dense" &&
        ev["args"]["outputs"][0].get<std::string>().find("bfloat16") != std::string::npos)
      bf16 = true;
  EXPECT_TRUE(bf16);
}

// The data a memory.html page draws from (its <script id="plan-data">).
json page_data(const std::string& html) {
  const size_t a = html.find("id=\"plan-data\">") + 15, b = html.find("</script>", a);
  return json::parse(html.substr(a, b - a));
}

TEST(Profile, MemoryHtmlFromThePlanAlone) {
  const Config c = default_config(tiny("MLP,Attn"));
  const TrainProgram prog = build_train_program(c);
  const MemoryPlan plan = plan_training(c, prog);
  const std::string html = memory_html(prog, plan, "tiny <transformer> & co", 1234);
  check_html(html);
  EXPECT_NE(html.find("tiny &lt;transformer&gt; &amp; co"), std::string::npos) << "the title is escaped";
  // Without a frontier the page has no frontier section and no frontier data.
  EXPECT_EQ(html.find("id=\"frontier"), std::string::npos);
  EXPECT_EQ(html.find("__FRONTIER__"), std::string::npos);
  // Every buffer is in the embedded data.
  const json d = page_data(html);
  EXPECT_FALSE(d.contains("frontier"));
  EXPECT_EQ(d["buffers"].size(), plan.buffers.size());
  EXPECT_EQ(d["live"].size(), plan.schedule.size());
  EXPECT_EQ(d["optimizer_bytes"], 1234);
}

// With model.remat = auto's frontier (`loom memory --fit --html`): its section, and every point
// (budget, choice, planned total, recompute, predicted step time) and the chosen one in the data
// the page draws from (tests/profile/check_memory_html.sh checks the drawing in a browser).
TEST(Profile, MemoryHtmlWithTheFitFrontier) {
  Fitter f(default_config(tiny("auto", 1)));
  FitFrontier fr{.points = f.frontier(3), .ceiling_flops = 1e9, .chosen = std::nullopt};
  ASSERT_EQ(fr.points.size(), 4u);
  const int64_t budget = fr.points[2].budget;
  fr.chosen = Fitter::FitPoint{.budget = budget, .choice = f.fit(budget), .seconds = 0, .plans = 0};
  const Config c = f.apply(fr.chosen->choice);
  const TrainProgram prog = build_train_program(c);
  const std::string html = memory_html(prog, plan_training(c, prog), "fit", -1, &fr);
  check_html(html);
  for (const char* need : {"<svg id=\"frontier\"", "id=\"frontier-rows\""})
    EXPECT_NE(html.find(need), std::string::npos) << need;
  const json d = page_data(html)["frontier"];
  ASSERT_EQ(d["points"].size(), fr.points.size());
  for (size_t i = 0; i < fr.points.size(); ++i) {
    const FitChoice& x = fr.points[i].choice;
    const json& p = d["points"][i];
    EXPECT_EQ(p["budget_bytes"], fr.points[i].budget);
    EXPECT_EQ(p["choice"], describe_choice(x));
    EXPECT_EQ(p["total_bytes"], x.total_bytes);
    EXPECT_LE(x.total_bytes, fr.points[i].budget);
    EXPECT_EQ(p["recompute_flops"], x.recompute_flops);
    EXPECT_DOUBLE_EQ(p["predicted_step_seconds"].get<double>(), (x.step_flops + x.recompute_flops) / 1e9);
  }
  EXPECT_GT(d["points"].back()["recompute_flops"].get<double>(), 0) << "the smallest budget recomputes";
  EXPECT_EQ(d["chosen"]["budget_bytes"], budget);
  EXPECT_EQ(d["chosen"]["choice"], describe_choice(fr.chosen->choice));
}

TEST(Profile, CostRules) {
  const Config c = default_config(tiny("none", 1));
  const TrainProgram prog = build_train_program(c);
  const Graph& g = prog.model.graph;
  bool dense = false, attn = false, attn_grad = false, reshape = false;
  for (const Node& n : g.nodes()) {
    const OpCost cost = node_cost(g, n);
    int64_t io = 0;
    for (ValueId v : n.in) io += g.value(v).bytes();
    for (ValueId v : n.out) io += g.value(v).bytes();
    EXPECT_GE(cost.flops, 0) << op_name(n.op);
    if (n.op == OpKind::dense) {
      const Shape& x = g.value(n.in[0]).shape;
      EXPECT_EQ(cost.flops, 2 * x.rows() * x.last() * g.value(n.out[0]).shape.last());
      EXPECT_EQ(cost.bytes, io);
      dense = true;
    } else if (n.op == OpKind::attention || n.op == OpKind::attention_grad) {
      const Shape& q = g.value(n.in[0]).shape;  // [B, T, H, 3D], causal
      const int64_t units = q[0] * q[2] * (q[1] * (q[1] + 1) / 2) * (q[3] / 3);
      EXPECT_EQ(cost.flops, (n.op == OpKind::attention ? 4 : 10) * units);
      (n.op == OpKind::attention ? attn : attn_grad) = true;
    } else if (n.op == OpKind::reshape) {
      EXPECT_EQ(cost.flops, 0);
      EXPECT_EQ(cost.bytes, 0);
      reshape = true;
    } else if (n.op == OpKind::dense_grad_weight || n.op == OpKind::dense_grad_input) {
      EXPECT_GT(cost.flops, 0);
    }
  }
  EXPECT_TRUE(dense && attn && attn_grad);
  (void)reshape;
}

// The SwiGLU and exact-GELU MLPs' ops are costed per element of their output (graph/ops/activation.cpp's
// counts): silu_mul 5, its backward 10, gelu_erf 24, its backward 30.
TEST(Profile, MlpCostRules) {
  std::map<OpKind, int64_t> per_element = {
      {OpKind::silu_mul, 5}, {OpKind::silu_mul_grad, 10}, {OpKind::gelu_erf, 24}, {OpKind::gelu_erf_grad, 30}};
  std::set<OpKind> seen;
  for (const char* mlp : {"swiglu", "gelu"}) {
    std::vector<std::string> o = tiny("none", 1);
    o.push_back(std::string("model.mlp=") + mlp);
    const TrainProgram prog = build_train_program(default_config(o));
    const Graph& g = prog.model.graph;
    for (const Node& n : g.nodes()) {
      const auto it = per_element.find(n.op);
      if (it == per_element.end()) continue;
      seen.insert(n.op);
      EXPECT_EQ(node_cost(g, n).flops, it->second * g.value(n.out[0]).shape.numel()) << op_name(n.op);
    }
  }
  EXPECT_EQ(seen.size(), per_element.size());
}

TEST(Profile, RecorderOffByDefaultAndBounded) {
  const Config c = default_config(tiny("none", 1));
  auto be = make_backend("cpu");
  Trainer t(c, *be);
  EXPECT_EQ(t.executor().recorder(), nullptr);
  const Batch b = make_batch(c.data, data_context(c));
  OpRecorder small(*be, 5, 1);
  t.set_recorder(&small);
  t.step(b);
  t.set_recorder(nullptr);
  EXPECT_EQ(small.ops().size(), 5u);
  EXPECT_EQ(small.spans().size(), 1u);
  EXPECT_EQ(small.dropped(), t.plan().schedule.size() - 5 + 2) << "1 minibatch and 1 optimizer span dropped";
  for (size_t i = 0; i < small.ops().size(); ++i) {
    EXPECT_EQ(small.ops()[i].step, static_cast<int32_t>(i));
    EXPECT_LE(small.ops()[i].t_begin_us, small.ops()[i].t_end_us);
  }
  t.step(b);  // detached: nothing more recorded
  EXPECT_EQ(small.ops().size(), 5u);
  EXPECT_EQ(small.dropped(), t.plan().schedule.size() - 5 + 2);
}

TEST(Profile, StepWindow) {
  EXPECT_EQ(parse_step_window("3:5").first, 3);
  EXPECT_EQ(parse_step_window("3:5").last, 5);
  EXPECT_EQ(parse_step_window("4").last, 4);
  EXPECT_THROW(parse_step_window("5:3"), UserError);
  EXPECT_THROW(parse_step_window("0:2"), UserError);
  EXPECT_THROW(parse_step_window("a:b"), UserError);
}

testing::RunResult run(const std::string& args) { return testing::run_loom(args, LOOM_SOURCE_DIR); }

std::string joined(const std::vector<std::string>& ov) {
  std::string s;
  for (const std::string& o : ov) {
    s += " '";
    s += o;
    s += "'";
  }
  return s;
}

// MFU's numbers (report/ceiling.h): model FLOPs leave the recompute out; the ceiling is measured
// once, cached, and only ever raised.
TEST(Mfu, ModelFlopsAndTheCachedCeiling) {
  auto be = make_backend("reference");
  const Trainer remat(default_config(tiny("MLP,Attn")), *be), plain(default_config(tiny("none")), *be);
  const FlopCounts r = step_flops(remat), p = step_flops(plain);
  EXPECT_LT(r.model, r.hardware) << "remat recomputes forward work";
  EXPECT_DOUBLE_EQ(r.model, p.model) << "the model's FLOPs do not depend on remat";
  EXPECT_DOUBLE_EQ(p.model, p.hardware);

  const fs::path cache = temp_dir("ceiling_cache");
  setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const fs::path file = ceiling_cache_file();
  EXPECT_EQ(file, cache / "loom" / "matmul_ceiling.json");
  EXPECT_GT(matmul_ceiling_flops(*be, DType::f32, nullptr), 0) << "measured (the reference backend: quickly)";
  const std::string key = ceiling_cache_key(*be, DType::f32);
  fs::create_directories(file.parent_path());
  const json first = json::parse(read(file));
  ASSERT_TRUE(first.contains(key)) << "cached, busy or not: " << first.dump();
  EXPECT_GT(first[key]["gflops"].get<double>(), 0);
  // GFLOP/s far above what this machine measures, from an idle machine.
  std::ofstream(file) << json{{key, {{"gflops", 1e6}, {"busy", false}}}}.dump();
  EXPECT_EQ(matmul_ceiling_flops(*be, DType::f32, nullptr), 1e15) << "read from the cache, not measured";
  measure_matmul_ceiling(*be, DType::f32, nullptr);
  EXPECT_EQ(json::parse(read(file))[key]["gflops"].get<double>(), 1e6) << "a lower measurement never replaces it";
  // A busy entry is used as it is, and any idle measurement replaces it.
  std::ofstream(file) << json{{key, {{"gflops", 1e6}, {"busy", true}}}}.dump();
  EXPECT_EQ(matmul_ceiling_flops(*be, DType::f32, nullptr), 1e15);
  unsetenv("XDG_CACHE_HOME");
}

TEST(ProfileCli, ProfileCommand) {
  const fs::path d = temp_dir("cli_profile");
  const testing::RunResult r =
      run("profile" + joined(tiny("MLP,Attn")) + " --steps 2 --warmup 1 --no-ceiling --out " + d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("median step"), std::string::npos) << r.out;
  for (const char* f : {"trace.json", "summary.json", "memory.html"}) EXPECT_TRUE(fs::exists(d / f)) << f;
  const json s = json::parse(read(d / "summary.json"));
  EXPECT_EQ(s["steps"], 2);
  // Remat recomputes forward work: the hardware did more FLOPs than the model needs, and the
  // summary says which is which.
  EXPECT_LT(s["model_step_gflop"].get<double>(), s["step_gflop"].get<double>());
  EXPECT_NE(r.out.find("hardware FLOPs (every op run, recompute included)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model FLOPs (forward + backward, no recompute)"), std::string::npos) << r.out;
  EXPECT_TRUE(s["machine_load"]["measured"].get<bool>()) << s["machine_load"].dump();
  EXPECT_NE(r.out.find("machine load during the profile"), std::string::npos) << r.out;
}

// Other processes busy on every core during the profile: the summary warns that its figures
// measure the contention.
TEST(ProfileCli, WarnsWhenTheMachineIsBusy) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::vector<pid_t> burners;
  for (long i = 0; i < cpus; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (volatile uint64_t x = 0;; x = x + 1) {
      }
    }
    burners.push_back(pid);
  }
  const fs::path d = temp_dir("cli_busy");
  // Enough steps for /proc/stat's 10 ms ticks to sample the window (not the load average): a step
  // of this model takes about 2 ms of CPU, so 50 take at least 0.1 s: above the 50 ms minimum
  // even on a machine twice as fast.
  std::vector<std::string> bigger = tiny("none");
  for (const char* o : {"model.hidden_size=64", "model.head_dim=16", "model.max_seq_len=64", "data.seq_len=64"})
    bigger.push_back(o);
  const testing::RunResult r =
      run("profile" + joined(bigger) + " --steps 50 --warmup 1 --no-ceiling --out " + d.string());
  for (pid_t pid : burners) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("WARNING: other processes competed for loom's cores"), std::string::npos) << r.out;
  const json load = json::parse(read(d / "summary.json"))["machine_load"];
  EXPECT_TRUE(load["contended"].get<bool>()) << load.dump();
  EXPECT_FALSE(load["from_loadavg"].get<bool>()) << "sampled from /proc/stat: " << load.dump();
}

TEST(ProfileCli, TrainWindow) {
  const fs::path d = temp_dir("cli_train");
  const testing::RunResult r =
      run("train" + joined(tiny("MLP")) + " --steps 4 --profile " + d.string() + " --profile-steps 2:3");
  ASSERT_EQ(r.status, 0) << r.out;
  const json s = json::parse(read(d / "summary.json"));
  EXPECT_EQ(s["steps"], 2);
  const json t = json::parse(read(d / "trace.json"));
  std::vector<std::string> steps;
  for (const json& ev : t["traceEvents"])
    if (ev["ph"] == "X" && ev["cat"] == "train_step") steps.push_back(ev["name"]);
  EXPECT_EQ(steps, (std::vector<std::string>{"train_step 2", "train_step 3"}));
}

TEST(ProfileCli, MemoryHtmlFlag) {
  const fs::path d = temp_dir("cli_memory");
  const testing::RunResult r = run("memory" + joined(tiny("MLP,Attn")) + " --html " + (d / "m.html").string());
  ASSERT_EQ(r.status, 0) << r.out;
  check_html(read(d / "m.html"));
  EXPECT_FALSE(page_data(read(d / "m.html")).contains("frontier"));
}

// An --html path that cannot be written (a directory) is the user's to fix: exit status 2, the
// flag named.
TEST(ProfileCli, MemoryHtmlToADirectoryIsAUserError) {
  const fs::path d = temp_dir("cli_memory_dir");
  const testing::RunResult r = run("memory" + joined(tiny("MLP,Attn")) + " --html " + d.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--html " + d.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix:"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_directory(d));
}

// `loom memory CONFIG --fit --json`'s frontier rows (run from the source tree, so CONFIG is the
// default configs/shakespeare_char.toml), without the choice for the budget that follows them
// with model.remat = auto.
json fit_rows(const std::vector<std::string>& ov) {
  const testing::RunResult j = run("memory" + joined(ov) + " --fit --json");
  EXPECT_EQ(j.status, 0) << j.out;
  json rows = json::array();
  for (json& x : json::parse(j.out.substr(j.out.find("[\n"))))  // after what measuring the ceiling said
    if (!x["chosen"].get<bool>()) rows.push_back(std::move(x));
  return rows;
}

// `loom memory CONFIG model.remat=auto --budget B --json`: the choice `loom memory` plans for B.
json auto_plan(const std::vector<std::string>& ov, int64_t budget, const std::string& more = "") {
  const testing::RunResult m = run("memory" + joined(ov) + " --budget " + std::to_string(budget) + " --json" + more);
  EXPECT_EQ(m.status, 0) << m.out;
  return json::parse(m.out.substr(m.out.find("{\n")));
}

// `loom memory --fit`: a row per budget whose columns say what --fit --json holds (budget,
// planned total, recompute share, the layers' choice), and with --budget the choice for it, the one
// `loom memory` plans for that budget; with --html the page holds the same frontier and draws the
// chosen plan.
TEST(ProfileCli, FitPrintsTheFrontier) {
  const std::vector<std::string> ov = tiny("auto", 1);
  const json rows = fit_rows(ov);
  ASSERT_GT(rows.size(), 2u);
  const int64_t budget = rows[rows.size() / 2]["budget_bytes"];
  const fs::path d = temp_dir("cli_fit");
  const testing::RunResult r =
      run("memory" + joined(ov) + " --fit --budget " + std::to_string(budget) + " --html " + (d / "m.html").string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  size_t head = 0;
  while (head < lines.size() && lines[head].find("planned") == std::string::npos) ++head;
  ASSERT_LT(head + rows.size(), lines.size()) << r.out;
  for (const char* col : {"budget", "planned", "recompute", "step (s)", "head", "choice"})
    EXPECT_NE(lines[head].find(col), std::string::npos) << col << " in " << lines[head];
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& x = rows[i];
    const std::string& l = lines[head + 1 + i];
    const double share = 100 * x["recompute_flops"].get<double>() / x["step_flops"].get<double>();
    for (const std::string& field : {format_bytes(x["budget_bytes"]), format_bytes(x["total_bytes"]),
                                     fmt::format("{:.1f}%", share), x["layers"].get<std::string>()})
      EXPECT_NE(l.find(field), std::string::npos) << field << " in row " << i << ": " << l;
  }
  const json m = auto_plan(ov, budget);
  const json& chosen = m["remat_auto"];
  EXPECT_NE(r.out.find(fmt::format("budget {}: {}, planned {}, recompute +{:.1f}% FLOPs", format_bytes(budget),
                                   chosen["choice"].get<std::string>(), format_bytes(chosen["total_bytes"]),
                                   100 * chosen["recompute_flops"].get<double>() / chosen["step_flops"].get<double>())),
            std::string::npos)
      << r.out;
  const std::string html = read(d / "m.html");
  check_html(html);
  const json page = page_data(html);
  EXPECT_EQ(page["frontier"]["points"].size(), rows.size());
  EXPECT_EQ(page["frontier"]["chosen"]["choice"], chosen["choice"]);
  // The plan drawn is the chosen one's.
  EXPECT_EQ(page["arena_bytes"], m["activations_bytes"].get<int64_t>() + m["workspace_bytes"].get<int64_t>());
  // --json holds the choice for --budget too: the frontier's rows, then it, marked chosen.
  const testing::RunResult j = run("memory" + joined(ov) + " --fit --json --budget " + std::to_string(budget));
  ASSERT_EQ(j.status, 0) << j.out;
  const json with = json::parse(j.out.substr(j.out.find("[\n")));
  ASSERT_EQ(with.size(), rows.size() + 1);
  EXPECT_TRUE(with.back()["chosen"].get<bool>());
  EXPECT_EQ(with.back()["budget_bytes"], budget);
  EXPECT_EQ(with.back()["choice"], chosen["choice"]);
  EXPECT_GT(with.back()["fit_seconds"].get<double>(), 0) << "the time it took to choose";
}

// What --fit cannot honour is refused, not ignored, and a bad --ranks says what it takes.
TEST(ProfileCli, FitRefusesFlagsItCannotHonour) {
  const std::vector<std::string> ov = tiny("auto", 1);
  const testing::RunResult sweep = run("memory" + joined(ov) + " --fit --sweep model.num_layers=1,2");
  EXPECT_EQ(sweep.status, 2) << sweep.out;
  EXPECT_NE(sweep.out.find("--fit: does not combine with --sweep"), std::string::npos) << sweep.out;
  const testing::RunResult inplace = run("memory" + joined(ov) + " --fit --no-inplace");
  EXPECT_EQ(inplace.status, 2) << inplace.out;
  EXPECT_NE(inplace.out.find("--no-inplace"), std::string::npos) << inplace.out;
  const testing::RunResult empty = run("memory" + joined(ov) + " --budget ''");
  EXPECT_EQ(empty.status, 2) << empty.out;
  EXPECT_NE(empty.out.find("--budget: is empty"), std::string::npos) << empty.out;
  for (const char* ranks : {"0", "-2", "abc"}) {
    const testing::RunResult r = run("memory" + joined(ov) + " --ranks " + ranks);
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("whole number of ranks >= 1"), std::string::npos) << ranks << ": " << r.out;
  }
}

// loom profile with model.remat = auto: its header names the minibatches of the choice it runs.
TEST(ProfileCli, ProfileHeaderNamesTheMinibatchesRematAutoChose) {
  const std::vector<std::string> ov = tiny("auto", 1);
  const json rows = fit_rows(ov);
  ASSERT_FALSE(rows.empty());
  const int64_t minibatches = rows.back()["num_minibatches"];
  ASSERT_GT(minibatches, 1) << rows.back();
  const fs::path d = temp_dir("cli_profile_auto");
  const testing::RunResult r = run(
      "profile" + joined(ov) + " train.memory_budget=" + std::to_string(rows.back()["budget_bytes"].get<int64_t>()) +
      " --steps 1 --warmup 0 --no-ceiling --out " + d.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(fmt::format("loom profile: transformer float32, hidden 32, 2 layers, head_dim 8, vocab 31, "
                                   "seq 16, batch 4 in {} minibatches",
                                   minibatches)),
            std::string::npos)
      << r.out;
}

// --fit plans model.remat = auto's choices whatever remat the configuration names, and with
// model.head_chunk = auto the head's too.
TEST(ProfileCli, FitTakesHeadChunkAutoFromAConfigWithoutRematAuto) {
  std::vector<std::string> ov = tiny("none", 1);
  ov.push_back("model.head_chunk=auto");
  const testing::RunResult r = run("memory" + joined(ov) + " --fit --budget 1GiB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\nbudget 1.00 GiB: 2×none in 1 minibatch, head plain"), std::string::npos) << r.out;
}

// A --sweep row of model.remat = auto that no choice fits is a row saying so (with --json, its
// error), and the sweep goes on to the next.
TEST(ProfileCli, SweepRowThatNoRematChoiceFitsSaysSo) {
  const std::string sweep = "memory" + joined(tiny("none", 1)) + " --sweep model.remat=none,auto,Block --budget 1KiB";
  const testing::RunResult text = run(sweep);
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("(no remat choice fits: --budget: no choice fits 1.0 KiB"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\nBlock "), std::string::npos) << "the row after it:\n" << text.out;
  const testing::RunResult j = run(sweep + " --json");
  ASSERT_EQ(j.status, 0) << j.out;
  const json rows = json::parse(j.out.substr(j.out.find("[\n")));
  ASSERT_EQ(rows.size(), 3u) << j.out;
  EXPECT_TRUE(rows[0].contains("report"));
  EXPECT_FALSE(rows[1].contains("report"));
  EXPECT_NE(rows[1]["error"].get<std::string>().find("no choice fits"), std::string::npos) << rows[1];
  EXPECT_FALSE(rows[1]["fits_budget"].get<bool>());
  EXPECT_TRUE(rows[2].contains("report"));
}

// model.remat = auto without --fit: the page draws the frontier with the choice for --budget, the
// one printed beside it.
TEST(ProfileCli, MemoryHtmlWithRematAutoDrawsTheFrontier) {
  const std::vector<std::string> ov = tiny("auto", 1);
  const json rows = fit_rows(ov);
  ASSERT_GT(rows.size(), 2u);
  const int64_t budget = rows[1]["budget_bytes"];
  const fs::path d = temp_dir("cli_auto_html");
  const json m = auto_plan(ov, budget, " --html " + (d / "m.html").string());
  const json page = page_data(read(d / "m.html"));
  EXPECT_EQ(page["frontier"]["points"].size(), rows.size());
  EXPECT_EQ(page["frontier"]["chosen"]["budget_bytes"], budget);
  EXPECT_EQ(page["frontier"]["chosen"]["choice"], m["remat_auto"]["choice"]);
}

}  // namespace
}  // namespace loom
