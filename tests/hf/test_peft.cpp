// PEFT LoRA adapters (src/io/peft.h) against tests/golden/hf/peft_{gpt2, llama_untied}: adapters
// PEFT itself wrote for the gpt2 and llama_untied fixtures (every linear layer, random lora_A and
// lora_B) and PeftModel's logits on the fixture's ids (tools/check_peft.py). loom, started from the
// base with the same lora.* keys and the adapter's tensors loaded, computes the same logits (within
// 1e-5 of their range), on both backends; and what `loom export peft` writes of those adapters is
// PEFT's file again, name for name and bit for bit. `loom export peft` end to end: a run's
// adapters, and the errors for what has none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/registry.h"
#include "graph/passes/plan.h"
#include "io/param_io.h"
#include "io/peft.h"
#include "nn/models.h"
#include "support/files.h"
#include "train/checkpoint.h"
#include "train/hf_export.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::hf_golden;
using testing::TempDir;
using testing::user_error;

std::map<std::string, StTensor> read_by_name(const std::string& file) {
  std::map<std::string, StTensor> out;
  for (StTensor& t : read_safetensors(file)) out.emplace(t.name, std::move(t));
  return out;
}

// The fixture's base with its adapter's lora.* keys (adapter_config.json), for the fixture's [2, 8] ids.
Config peft_config(const std::string& fixture, const std::string& device = "cpu") {
  std::ifstream f(hf_golden("peft_" + fixture + "/adapter_config.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  std::string targets;
  for (const auto& t : j["target_modules"]) targets += (targets.empty() ? "" : ",") + t.get<std::string>();
  return default_config({"model.init_from=" + hf_golden(fixture), "device=" + device, "data.kind=random_tokens",
                         "data.batch_size=2", "data.seq_len=8", "data.vocab_size=2",
                         "lora.rank=" + std::to_string(j["r"].get<int64_t>()),
                         "lora.alpha=" + std::to_string(j["lora_alpha"].get<double>()), "lora.targets=" + targets});
}

class Peft : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, Peft, ::testing::Values("gpt2", "llama_untied"));

TEST_P(Peft, LogitsWithTheAdapterEqualPeftModels) {
  const std::map<std::string, StTensor> adapter =
      read_by_name(hf_golden("peft_" + GetParam() + "/adapter_model.safetensors"));
  const std::map<std::string, StTensor> expected =
      read_by_name(hf_golden("peft_" + GetParam() + "/expected.safetensors"));
  std::map<std::string, const StTensor*> peft;
  for (const auto& [name, t] : adapter) peft[name] = &t;
  for (const std::string device : {"cpu", "reference"}) {
    const Config c = peft_config(GetParam(), device);
    auto be = make_backend(c.device);
    nn::ModelGraph m = nn::build_model(c.model, model_input(c, 2), /*train=*/false);
    std::unique_ptr<Executor> ex;
    ASSERT_TRUE(Executor::create(*be, m.graph, plan_program(*be, m.graph, default_schedule(m.graph)), &ex).is_ok());
    ModelSource(c.model.init_from).load_params(*ex);  // the frozen base
    const std::vector<StTensor> loom = peft_to_loom(c.model, peft, "adapter_model.safetensors");
    ASSERT_FALSE(loom.empty());
    for (const StTensor& t : loom)
      upload_param(*ex, m.graph.input_by_name(t.name), reinterpret_cast<const float*>(t.bytes.data()));
    for (const auto& [v, bytes] : m.constants) ex->upload(v, bytes.data());
    ex->upload(m.inputs, expected.at("inputs").bytes.data());
    std::vector<int32_t> labels(16, 0);
    ex->upload(m.labels, labels.data());
    ex->run(RunCtx{c.seed, 0, 0});
    std::vector<float> got(static_cast<size_t>(m.graph.value(m.output).shape.numel()));
    ex->download(m.output, got.data());
    const StTensor& want = expected.at("logits");
    ASSERT_EQ(got.size(), static_cast<size_t>(want.shape.numel()));
    double max_abs = 0, range = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double w = load_as_f32(want.bytes.data(), want.dtype, i);
      max_abs = std::max(max_abs, std::abs(got[i] - w));
      range = std::max(range, std::abs(w));
    }
    EXPECT_LE(max_abs, 1e-5 * range) << GetParam() << " " << device << ": max abs diff " << max_abs << " of range "
                                     << range;
  }
}

TEST_P(Peft, LoomsExportOfTheAdapterIsPeftsFile) {
  const std::map<std::string, StTensor> adapter =
      read_by_name(hf_golden("peft_" + GetParam() + "/adapter_model.safetensors"));
  std::map<std::string, const StTensor*> peft;
  for (const auto& [name, t] : adapter) peft[name] = &t;
  const Config c = peft_config(GetParam());
  const std::vector<StTensor> loom = peft_to_loom(c.model, peft, "adapter_model.safetensors");
  std::map<std::string, const StTensor*> by_path;
  for (const StTensor& t : loom) by_path[t.name] = &t;
  const std::vector<StTensor> back = loom_to_peft(c.model, by_path);
  ASSERT_EQ(back.size(), adapter.size());
  for (const StTensor& t : back) {
    ASSERT_TRUE(adapter.count(t.name)) << t.name;
    EXPECT_EQ(t.shape, adapter.at(t.name).shape) << t.name;
    EXPECT_TRUE(t.bytes == adapter.at(t.name).bytes) << t.name;
  }
  std::ifstream f(hf_golden("peft_" + GetParam() + "/adapter_config.json"));
  const nlohmann::json want = nlohmann::json::parse(f), got = peft_adapter_config(c.model);
  for (const char* key : {"peft_type", "r", "lora_alpha", "fan_in_fan_out", "use_rslora", "bias", "task_type"})
    EXPECT_EQ(got[key], want[key]) << key;
  EXPECT_EQ(got["target_modules"].get<std::set<std::string>>(), want["target_modules"].get<std::set<std::string>>());
}

// A LoRA run on the Llama fixture, trained two steps, saved and exported: the export holds the
// run's adapters (read back through peft_to_loom, equal bit for bit); the whole-model export and
// an export of a run without adapters are refused, naming the other command.
TEST(PeftExport, ARunsAdaptersComeBackFromItsExport) {
  TempDir d;
  const Config c = default_config({"model.init_from=" + hf_golden("llama_untied"), "data.kind=random_tokens",
                                   "data.batch_size=2", "data.seq_len=8", "data.vocab_size=300", "lora.rank=4",
                                   "lora.targets=q_proj,v_proj,down_proj", "optimizer.learning_rate=0.01"});
  auto be = make_backend("cpu");
  Trainer t(c, *be);
  ModelSource(c.model.init_from).load_params(t.executor());
  const Batch b = make_batch(c.data, data_context(c));
  t.step(b);
  t.step(b);
  ASSERT_TRUE(save_checkpoint(t, CheckpointState{.config_toml = config_to_toml(c)}, d.path("ckpt")).saved);
  const HfExport r = export_peft(d.path("ckpt"), d.path("out"));
  EXPECT_EQ(r.architecture, "LlamaForCausalLM");
  const std::map<std::string, StTensor> file = read_by_name(d.path("out/adapter_model.safetensors"));
  EXPECT_EQ(file.size(), 2u * 3u * 2u) << "A and B of three modules in two layers";
  EXPECT_TRUE(file.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  std::map<std::string, const StTensor*> peft;
  for (const auto& [name, x] : file) peft[name] = &x;
  int nonzero_b = 0;
  for (const StTensor& x : peft_to_loom(c.model, peft, "out")) {
    const std::vector<float> want = t.param(x.name);
    std::vector<float> got(want.size());
    std::memcpy(got.data(), x.bytes.data(), x.bytes.size());
    EXPECT_EQ(got, want) << x.name;
    nonzero_b += x.name.ends_with("/b") && std::any_of(got.begin(), got.end(), [](float v) { return v != 0; });
  }
  EXPECT_EQ(nonzero_b, 6) << "every B trained";
  std::ifstream f(d.path("out/adapter_config.json"));
  EXPECT_EQ(nlohmann::json::parse(f)["base_model_name_or_path"], hf_golden("llama_untied"));
  EXPECT_NE(user_error([&] { export_hf(d.path("ckpt"), d.path("whole")); }).find("is a LoRA run"), std::string::npos);
  EXPECT_NE(user_error([&] { export_peft(hf_golden("llama_untied"), d.path("none")); }).find("Hugging Face"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d.path("whole")));
}

}  // namespace
}  // namespace loom
