// Optimizers and schedules against values computed by Optax itself (tests/golden/optax.json,
// written by tools/jax_golden.py): schedules at chosen steps, two updates of sgd, sgd with
// momentum, adam, adamw with and without a weight-decay mask, and clip_by_global_norm chained
// before adam with the global norm above and below the threshold. Run on both backends.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "graph/passes/plan.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "runtime/executor.h"

namespace loom {
namespace {

using nlohmann::json;

const json& golden() {
  static const json j = [] {
    std::ifstream f(std::string(LOOM_SOURCE_DIR) + "/tests/golden/optax.json");
    EXPECT_TRUE(f.good()) << "missing tests/golden/optax.json";
    return json::parse(f);
  }();
  return j;
}

std::vector<float> flat(const json& a) {
  std::vector<float> out;
  if (a.is_array()) {
    for (const json& x : a) {
      auto sub = flat(x);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  } else {
    out.push_back(a.get<float>());
  }
  return out;
}

Shape shape_of(const json& a) {
  Shape s;
  const json* p = &a;
  while (p->is_array()) {
    s.push_back(static_cast<int64_t>(p->size()));
    p = &(*p)[0];
  }
  return s;
}

TEST(Optax, Schedules) {
  const json& g = golden();
  const auto steps = g["schedule_steps"].get<std::vector<int64_t>>();
  for (const auto& [name, sch] : g["schedules"].items()) {
    const json& k = sch["kwargs"];
    ScheduleSpec s;
    s.kind = name == "warmup_cosine_decay" ? ScheduleKind::warmup_cosine_decay : ScheduleKind::warmup_exponential_decay;
    s.init_value = k["init_value"];
    s.value = k["peak_value"];
    s.warmup_steps = k["warmup_steps"];
    if (k.contains("decay_steps")) s.decay_steps = k["decay_steps"];
    if (k.contains("end_value")) {
      s.end_value = k["end_value"];
      s.has_end_value = true;
    }
    if (k.contains("exponent")) s.exponent = k["exponent"];
    if (k.contains("transition_steps")) s.transition_steps = k["transition_steps"];
    if (k.contains("decay_rate")) s.decay_rate = k["decay_rate"];
    if (k.contains("transition_begin")) s.transition_begin = k["transition_begin"];
    if (k.contains("staircase")) s.staircase = k["staircase"];
    validate_schedule(s, "optimizer.");
    const auto want = sch["values"].get<std::vector<double>>();
    ASSERT_EQ(want.size(), steps.size());
    for (size_t i = 0; i < steps.size(); ++i)
      // Optax evaluates in float32, loom in double: agree to float32 rounding.
      EXPECT_NEAR(schedule_value(s, steps[i]), want[i], 2e-6 * std::fabs(want[i]) + 1e-12)
          << name << " at step " << steps[i];
  }
}

TEST(Optax, CosineScheduleRejectsDecayNotAfterWarmup) {
  ScheduleSpec s;
  s.kind = ScheduleKind::warmup_cosine_decay;
  s.warmup_steps = 10;
  s.decay_steps = 10;
  EXPECT_THROW(validate_schedule(s, "optimizer."), UserError);
}

// A graph holding just the three parameters, so the Optimizer runs on real backend buffers.
struct Harness {
  std::unique_ptr<Backend> be;
  Graph g;
  std::unique_ptr<Executor> ex;
  std::unique_ptr<Optimizer> opt;
  std::vector<std::string> names{"kernel", "bias", "embedding"};

  Harness(const std::string& device, OptimizerConfig c, const json& params) : be(make_backend(device)) {
    for (const auto& n : names)
      g.add_param(n, shape_of(params[n]), {.role = n == "kernel" ? ParamRole::kernel : ParamRole::other});
    const Status st = Executor::create(*be, g, plan_memory(g, default_schedule(g)), &ex);
    EXPECT_TRUE(st.is_ok()) << st.message();
    for (const auto& n : names) ex->upload(g.input_by_name(n), flat(params[n]).data());
    opt = std::make_unique<Optimizer>(c, DType::f32, *be, g, *ex);
  }
  void set_grads(const json& grads, float scale = 1.f) {
    for (const auto& n : names) {
      auto v = flat(grads[n]);
      for (float& x : v) x *= scale;
      ex->upload(g.grad_of(g.input_by_name(n)), v.data());
    }
  }
  std::vector<float> param(const std::string& n) {
    std::vector<float> v(static_cast<size_t>(g.value(g.input_by_name(n)).shape.numel()));
    ex->download(g.input_by_name(n), v.data());
    return v;
  }
};

void expect_params(Harness& h, const json& want, const std::string& what) {
  for (const auto& n : h.names) {
    const auto got = h.param(n);
    const auto exp = flat(want[n]);
    ASSERT_EQ(got.size(), exp.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], exp[i], 2e-6 * std::fabs(exp[i]) + 2e-7) << what << " " << n << "[" << i << "]";
  }
}

void run_case(const std::string& device, const std::string& key, OptimizerConfig c) {
  const json& g = golden();
  Harness h(device, c, g["params"]);
  const json& steps = g["optimizers"][key]["steps"];
  for (size_t s = 0; s < steps.size(); ++s) {
    h.set_grads(g["grads"][s]);
    h.opt->step();
    expect_params(h, steps[s]["params"], device + " " + key + " step " + std::to_string(s + 1));
  }
}

class OptaxOnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(OptaxOnBackend, Sgd) {
  OptimizerConfig c;
  c.name = OptimizerName::sgd;
  c.learning_rate = 0.1;
  run_case(GetParam(), "sgd", c);
  c.momentum = 0.9;
  run_case(GetParam(), "sgd_momentum", c);
}

TEST_P(OptaxOnBackend, Adam) {
  OptimizerConfig c;
  c.name = OptimizerName::adam;
  c.learning_rate = 1e-2;
  run_case(GetParam(), "adam", c);
}

TEST_P(OptaxOnBackend, AdamwWithAndWithoutMask) {
  OptimizerConfig c;
  c.name = OptimizerName::adamw;
  c.learning_rate = 1e-2;
  c.weight_decay = 0.1;
  run_case(GetParam(), "adamw", c);
  c.weight_decay_mask = WeightDecayMask::kernels;  // excludes bias and embedding, as the golden's mask does
  run_case(GetParam(), "adamw_masked", c);
}

TEST_P(OptaxOnBackend, ClipByGlobalNormThenAdam) {
  const json& g = golden();
  for (const char* key : {"norm_above_1", "norm_below_1"}) {
    const json& cs = g["clip_by_global_norm"][key];
    OptimizerConfig c;
    c.name = OptimizerName::adam;
    c.learning_rate = 1e-2;
    c.clip_norm = 1.0;
    Harness h(GetParam(), c, g["params"]);
    for (size_t s = 0; s < cs["steps"].size(); ++s) {
      h.set_grads(cs["grads"][s]);
      const OptimizerReport r = h.opt->step();
      EXPECT_NEAR(r.grad_norm, cs["global_norms"][s].get<double>(), 1e-5 * cs["global_norms"][s].get<double>());
      expect_params(h, cs["steps"][s]["params"], std::string(key) + " step " + std::to_string(s + 1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, OptaxOnBackend, ::testing::Values("cpu", "reference"));

// GradScaler's rule (REFERENCE.md §3.2): back off and skip on inf/nan, grow after the interval.
TEST(LossScaler, FollowsGradScaler) {
  LossScaler s;
  s.enabled = s.dynamic = true;
  s.scale = 65536;
  s.interval = 3;
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale, 65536);
  s.update(false);
  EXPECT_EQ(s.scale, 131072);
  EXPECT_EQ(s.tracker, 0);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale, 65536);
  EXPECT_EQ(s.tracker, 0);
  EXPECT_EQ(s.skipped, 1);
  LossScaler st;
  st.enabled = true;  // static: never changes, still counts skips
  st.scale = 128;
  st.update(true);
  st.update(false);
  EXPECT_EQ(st.scale, 128);
  EXPECT_EQ(st.skipped, 1);
}

// The scale has a floor (a scale halving towards 0 would skip every step forever), and skipped
// steps are counted, in a row too, whether scaling is on or not (float32 and bfloat16 runs).
TEST(LossScaler, FloorAndSkipCountsInEveryDtype) {
  LossScaler s;
  s.enabled = s.dynamic = true;
  s.scale = 8;
  s.min_scale = 1;
  for (int i = 0; i < 10; ++i) s.update(true);
  EXPECT_EQ(s.scale, 1);
  EXPECT_EQ(s.skipped, 10);
  EXPECT_EQ(s.consecutive, 10);
  s.update(false);
  EXPECT_EQ(s.consecutive, 0);
  LossScaler off;  // float32: no scaling, still counted
  off.update(true);
  off.update(true);
  EXPECT_EQ(off.skipped, 2);
  EXPECT_EQ(off.consecutive, 2);
  EXPECT_EQ(off.scale, 1);
}

TEST(LossScaler, NonFiniteLossSkipsTheUpdateInFloat32) {
  OptimizerConfig c;
  auto be = make_backend("cpu");
  Graph gr;
  const ValueId p = gr.add_param("kernel", Shape{2}, {});
  std::unique_ptr<Executor> ex;
  ASSERT_TRUE(Executor::create(*be, gr, plan_memory(gr, default_schedule(gr)), &ex).is_ok());
  const std::vector<float> start = {1.f, 2.f}, grads = {0.5f, 0.5f};
  ex->upload(p, start.data());
  ex->upload(gr.grad_of(p), grads.data());
  Optimizer opt(c, DType::f32, *be, gr, *ex);
  const OptimizerReport r = opt.step(/*loss_finite=*/false);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.nonfinite, NonFinite::loss);
  EXPECT_EQ(opt.scaler().skipped, 1);
  EXPECT_EQ(opt.count(), 0);
  std::vector<float> after(2);
  ex->download(p, after.data());
  EXPECT_EQ(after, start);
}

TEST(LossScaler, NonFiniteGradientsSkipTheUpdate) {
  const json& g = golden();
  OptimizerConfig c;
  c.name = OptimizerName::adam;
  c.learning_rate = 1e-2;
  c.loss_scale = LossScaleMode::dynamic;
  c.loss_scale_init = 1024;
  auto be = make_backend("cpu");
  Graph gr;
  const ValueId p = gr.add_param("kernel", Shape{3, 4}, {});
  std::unique_ptr<Executor> ex;
  ASSERT_TRUE(Executor::create(*be, gr, plan_memory(gr, default_schedule(gr)), &ex).is_ok());
  ex->upload(p, flat(g["params"]["kernel"]).data());
  Optimizer opt(c, DType::f16, *be, gr, *ex);
  EXPECT_EQ(opt.loss_scale(), 1024);
  std::vector<float> grads(12, 1.f);
  grads[5] = INFINITY;
  ex->upload(gr.grad_of(p), grads.data());
  const OptimizerReport r = opt.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(opt.loss_scale(), 512);
  EXPECT_EQ(opt.count(), 0);
  std::vector<float> after(12);
  ex->download(p, after.data());
  EXPECT_EQ(after, flat(g["params"]["kernel"])) << "a skipped step must not touch the parameters";
  // Finite gradients scaled by 512 update like unscaled ones.
  for (float& x : grads) x = 0.5f * 512;
  ex->upload(gr.grad_of(p), grads.data());
  const OptimizerReport r2 = opt.step();
  EXPECT_FALSE(r2.skipped);
  EXPECT_NEAR(r2.grad_norm, std::sqrt(12 * 0.25), 1e-6);
  EXPECT_EQ(opt.count(), 1);
}

}  // namespace
}  // namespace loom
