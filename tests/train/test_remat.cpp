// Gradient checkpointing (graph/passes/remat.h):
//   - recompute changes nothing: for every remat set × policy × dtype, with dropout on, the loss
//     and every gradient are bit-identical to no remat (small Transformer and MLP classifier);
//   - recompute does what it says, checked on the plan: MLP remat frees the MLP's hidden
//     activations before the backward; dots_saveable keeps matmul outputs and nothing else in the
//     region; Block keeps only block inputs across the forward/backward gap; recompute runs once
//     per region per minibatch, right before that region's backward;
//   - the plan is what runs: the executor's arena is exactly the planned size, and training with
//     every remat setting matches the reference backend run on a plan without buffer reuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "backend/registry.h"
#include "graph/passes/remat.h"
#include "io/param_io.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

std::vector<std::string> tiny_transformer(const std::string& dtype, const std::string& remat,
                                          const std::string& policy) {
  return {"model.kind=transformer",
          "model.dtype=" + dtype,
          "model.hidden_size=32",
          "model.num_layers=2",
          "model.head_dim=8",
          "model.vocab_size=31",
          "model.num_outputs=31",
          "model.max_seq_len=16",
          "model.dropout_rate=0.1",
          "data.kind=random_tokens",
          "data.batch_size=4",
          "data.seq_len=16",
          "data.vocab_size=31",
          "optimizer.num_minibatches=2",
          "model.remat=" + remat,
          "model.remat_policy=" + policy,
          "model.remat_save_names=*/attn/qkv,*/mlp/input_layer"};
}

struct StepResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<unsigned char>> grads;  // bytes of every gradient after the last step
};

StepResult train(const std::vector<std::string>& overrides, const std::string& device = "cpu", int steps = 2) {
  const Config c = default_config(overrides);
  auto be = make_backend(device);
  Trainer t(c, *be);
  EXPECT_EQ(t.executor().arena_bytes_allocated(), t.plan().arena_bytes) << "the executor allocates the plan";
  const Batch b = make_batch(c.data, data_context(c));
  StepResult r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(static_cast<float>(t.step(b).metrics.loss.mean()));
  for (StTensor& s : export_params(t.executor(), false, /*grads=*/true)) r.grads[s.name] = std::move(s.bytes);
  return r;
}

const char* kPolicies[] = {"nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                           "everything_saveable", "save_only_these_names"};

TEST(Remat, TransformerGradientsBitIdentical) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    const StepResult base = train(tiny_transformer(dtype, "none", "nothing_saveable"));
    for (const char* remat : {"MLP", "Attn", "MLP,Attn", "Block", "MLP,Attn,Block"})
      for (const char* policy : kPolicies) {
        const StepResult r = train(tiny_transformer(dtype, remat, policy));
        EXPECT_EQ(r.losses, base.losses) << dtype << " " << remat << " " << policy;
        EXPECT_TRUE(r.grads == base.grads) << dtype << " " << remat << " " << policy;
      }
  }
}

// The exact GELU's and SwiGLU's MLPs (silu_mul and its two-output backward) under every policy:
// recomputing the MLP, alone or in its block, changes no bits.
TEST(Remat, GeluAndSwigluMlpGradientsBitIdentical) {
  for (const char* dtype : {"float32", "bfloat16"})
    for (const char* mlp : {"gelu", "swiglu"}) {
      auto config = [&](const char* remat, const char* policy) {
        std::vector<std::string> o = tiny_transformer(dtype, remat, policy);
        o.push_back(std::string("model.mlp=") + mlp);
        o.push_back("model.intermediate_size=48");
        o.push_back("model.remat_save_names=*/mlp/gate_layer,*/mlp/input_layer");
        return o;
      };
      const StepResult base = train(config("none", "nothing_saveable"));
      for (const char* remat : {"MLP", "Block"})
        for (const char* policy : kPolicies) {
          const StepResult r = train(config(remat, policy));
          EXPECT_EQ(r.losses, base.losses) << dtype << " " << mlp << " " << remat << " " << policy;
          EXPECT_TRUE(r.grads == base.grads) << dtype << " " << mlp << " " << remat << " " << policy;
        }
    }
}

TEST(Remat, MlpClassifierGradientsBitIdentical) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    auto cfg = [&](const std::string& remat, const std::string& policy) {
      return std::vector<std::string>{
          "model.dtype=" + std::string(dtype), "model.dropout_rate=0.2", "data.batch_size=64",
          "optimizer.num_minibatches=2",       "model.remat=" + remat,   "model.remat_policy=" + policy,
          "model.remat_save_names=Dense_0"};
    };
    const StepResult base = train(cfg("none", "nothing_saveable"));
    for (const char* policy : kPolicies) {
      const StepResult r = train(cfg("MLP", policy));
      EXPECT_EQ(r.losses, base.losses) << dtype << " " << policy;
      EXPECT_TRUE(r.grads == base.grads) << dtype << " " << policy;
    }
  }
}

// Facts about a planned program: which forward values stay live into the backward.
struct Planned {
  TrainProgram prog;
  MemoryPlan plan;
  int32_t first_backward_step = 0;
  explicit Planned(const std::vector<std::string>& ov) : prog(build_train_program(default_config(ov))) {
    plan = plan_memory(prog.model.graph, prog.schedule);
    for (size_t s = 0; s < plan.schedule.size(); ++s)
      if (prog.model.graph.node(plan.schedule[s]).phase != Phase::forward) {
        first_backward_step = static_cast<int32_t>(s);
        break;
      }
  }
  // Forward-produced activations still read (directly or through a view) once the backward has
  // started. (Storage can outlive a value when an in-place op takes it over, so this looks at
  // reads, not at buffers.)
  std::vector<ValueId> kept_across_gap() const {
    const Graph& g = prog.model.graph;
    std::vector<int32_t> last_read(g.values().size(), -1);
    std::vector<ValueId> source(g.values().size());
    for (size_t v = 0; v < source.size(); ++v) source[v] = static_cast<ValueId>(v);
    for (size_t s = 0; s < plan.schedule.size(); ++s) {
      const Node& n = g.node(plan.schedule[s]);
      if (n.op == OpKind::reshape) source[n.out[0]] = source[n.in[0]];
      for (ValueId u : n.in) last_read[source[u]] = std::max(last_read[source[u]], static_cast<int32_t>(s));
    }
    std::vector<ValueId> out;
    for (NodeId n = 0; n < prog.num_forward; ++n)
      for (ValueId v : g.node(n).out)
        if (source[v] == v && last_read[v] >= first_backward_step && !g.value(v).is_output) out.push_back(v);
    return out;
  }
};

std::vector<std::string> plan_cfg(const std::string& remat, const std::string& policy = "nothing_saveable") {
  auto ov = tiny_transformer("float32", remat, policy);
  ov.push_back("model.dropout_rate=0");
  return ov;
}

TEST(Remat, MlpRematFreesHiddenActivationsBeforeBackward) {
  const Planned none(plan_cfg("none")), mlp(plan_cfg("MLP"));
  auto hidden_kept = [](const Planned& p) {
    int n = 0;
    for (ValueId v : p.kept_across_gap()) {
      const Node& prod = p.prog.model.graph.node(p.prog.model.graph.value(v).producer);
      if (prod.scope.find("/mlp") != std::string::npos && p.prog.model.graph.value(v).shape.last() == 4 * 32) ++n;
    }
    return n;
  };
  EXPECT_GT(hidden_kept(none), 0) << "without remat the MLP hidden activations are saved for the backward";
  EXPECT_EQ(hidden_kept(mlp), 0) << "with MLP remat none of them survives the forward";
  EXPECT_LT(mlp.plan.arena_bytes, none.plan.arena_bytes);
}

TEST(Remat, DotsSaveableKeepsOnlyMatmulOutputs) {
  const Planned p(plan_cfg("MLP,Attn", "dots_saveable"));
  const Graph& g = p.prog.model.graph;
  int dots = 0;
  for (ValueId v : p.kept_across_gap()) {
    const Node& prod = g.node(g.value(v).producer);
    if (prod.region < 0) continue;  // outside any region: not the policy's business
    // Inside a region only matmul outputs (dense, attention) and views of them are kept — plus
    // the region's outputs that later forward nodes read.
    const bool dot = prod.op == OpKind::dense || prod.op == OpKind::attention ||
                     (prod.op == OpKind::reshape && (g.node(g.value(prod.in[0]).producer).op == OpKind::dense ||
                                                     g.node(g.value(prod.in[0]).producer).op == OpKind::attention));
    bool region_output = false;
    for (NodeId n = 0; n < p.prog.num_forward; ++n)
      for (ValueId u : g.node(n).in)
        if (u == v && g.outermost_region(g.node(n).region) != g.outermost_region(prod.region)) region_output = true;
    EXPECT_TRUE(dot || region_output) << op_name(prod.op) << " at " << prod.scope << " kept across the gap";
    dots += dot;
  }
  EXPECT_GT(dots, 0);
}

TEST(Remat, BlockKeepsOnlyBlockInputs) {
  const Planned p(plan_cfg("Block"));
  const Graph& g = p.prog.model.graph;
  for (ValueId v : p.kept_across_gap()) {
    const Node& prod = g.node(g.value(v).producer);
    if (prod.region < 0) continue;
    // A value made inside block_l kept across the gap must be that block's output, i.e. the next
    // block's input (or the post-norm's).
    bool read_outside = false;
    for (NodeId n = 0; n < p.prog.num_forward; ++n)
      for (ValueId u : g.node(n).in)
        if (u == v && g.outermost_region(g.node(n).region) != g.outermost_region(prod.region)) read_outside = true;
    EXPECT_TRUE(read_outside) << op_name(prod.op) << " at " << prod.scope << " " << g.value(v).shape.str();
  }
}

TEST(Remat, RecomputeRunsOncePerRegionRightBeforeItsBackward) {
  const Planned p(plan_cfg("MLP,Attn"));
  const Graph& g = p.prog.model.graph;
  const auto& sched = p.plan.schedule;
  std::map<int32_t, int> runs;  // region -> number of contiguous recompute runs
  for (size_t s = 0; s < sched.size(); ++s) {
    const Node& n = g.node(sched[s]);
    if (n.phase != Phase::recompute) continue;
    const bool starts_run =
        s == 0 || g.node(sched[s - 1]).phase != Phase::recompute || g.node(sched[s - 1]).region != n.region;
    if (!starts_run) continue;
    ++runs[n.region];
    size_t e = s;
    while (e < sched.size() && g.node(sched[e]).phase == Phase::recompute) ++e;
    ASSERT_LT(e, sched.size());
    const Node& next = g.node(sched[e]);
    EXPECT_EQ(next.phase, Phase::backward);
    EXPECT_EQ(g.outermost_region(next.region), g.outermost_region(n.region))
        << "the recompute of " << n.scope << " must be followed by its region's backward";
  }
  EXPECT_EQ(runs.size(), 4u) << "2 layers × (MLP, Attn)";
  for (const auto& [r, k] : runs) EXPECT_EQ(k, 1) << g.regions()[r].scope;
}

TEST(Remat, PlannedCpuMatchesUnplannedReference) {
  for (const char* remat : {"none", "MLP,Attn", "Block"}) {
    auto ov = tiny_transformer("float32", remat, "nothing_saveable");
    const StepResult cpu = train(ov, "cpu", 3);
    // The reference backend on a plan where every buffer has its own bytes (no reuse at all).
    const Config c = default_config(ov);
    auto be = make_backend("reference");
    Trainer ref(c, *be, PlanOptions{false, false, {}});  // same init; compare losses step by step
    EXPECT_EQ(verify_plan(ref.model().graph, ref.plan()), "");
    const Batch b = make_batch(c.data, data_context(c));
    for (int s = 0; s < 3; ++s) {
      const double l = ref.step(b).metrics.loss.mean();
      EXPECT_NEAR(cpu.losses[s], l, 1e-5 * l) << remat << " step " << s + 1;
    }
  }
}

TEST(Remat, InplacePlanningChangesNoBits) {
  // The same training step with in-place buffer reuse on and off gives identical bits.
  const Config c = default_config(tiny_transformer("bfloat16", "none", "nothing_saveable"));
  const Batch b = make_batch(c.data, data_context(c));
  std::vector<std::vector<unsigned char>> results;
  for (bool inplace : {true, false}) {
    auto be = make_backend("cpu");
    Trainer t(c, *be, PlanOptions{inplace, true, {}});
    t.step(b);
    std::vector<unsigned char> all;
    for (const StTensor& s : export_params(t.executor(), false, true))
      all.insert(all.end(), s.bytes.begin(), s.bytes.end());
    results.push_back(all);
  }
  EXPECT_TRUE(results[0] == results[1]);
}

}  // namespace
}  // namespace loom
