// A LoRA run (nn/lora.h) as a user drives it: fine-tune a loom run's model with adapters, resume
// bit-exactly, with checkpoints holding the adapters and their optimizer state only, and a
// changed base model refused at resume, naming its path.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "support/files.h"
#include "support/run_fixture.h"

namespace fs = std::filesystem;

namespace {

using namespace loom::testing;

bool is_adapter(const std::string& name) { return name.find("/lora_") != std::string::npos; }

TEST(LoraRun, ResumeIsBitExactAndCheckpointsHoldTheAdaptersOnly) {
  const Fixture& fx = fixture();
  const fs::path base = scratch("lora_base"), straight = scratch("lora_straight"), split = scratch("lora_split");
  Result r = run("train " + fx.config.string() + " train.steps=5 --out " + base.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string lora =
      " lora.rank=4 lora.alpha=8 lora.dropout=0.1 lora.targets=c_attn,c_fc model.init_from=" + base.string() +
      " train.steps=10";
  r = run("train " + fx.config.string() + lora + " --out " + straight.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train " + fx.config.string() + lora + " train.steps=5 --out " + split.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train --resume " + split.string() + " train.steps=10");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(logged_losses(straight / "metrics.jsonl"), logged_losses(split / "metrics.jsonl"));
  const auto a = loom::read_safetensors((straight / "ckpt_000010" / "model.safetensors").string());
  const auto b = loom::read_safetensors((split / "ckpt_000010" / "model.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 12u) << "per layer c_attn's a, b_q, b_k, b_v and c_fc's a, b";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(is_adapter(a[i].name)) << a[i].name;
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << a[i].name;
  }
  for (const auto& t : loom::read_safetensors((straight / "ckpt_000010" / "optimizer.safetensors").string()))
    EXPECT_TRUE(is_adapter(t.name)) << t.name;
  const auto state = nlohmann::json::parse(std::ifstream(straight / "ckpt_000010" / "state.json"));
  EXPECT_EQ(state["base_init_from"].get<std::string>(), base.string());
  EXPECT_EQ(state["base_crc32c"].get<std::string>().size(), 8u);

  // The base run goes on: its newest checkpoint is no longer the model the adapters were trained on.
  r = run("train --resume " + base.string() + " train.steps=7");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train --resume " + split.string() + " train.steps=12");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.init_from = " + base.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is not the base model"), std::string::npos) << r.out;
}

}  // namespace

// A LoRA run with the head and the loss fused (model.head_chunk: the frozen head's backward forms
// dx alone) trains from a loom run's model as the plain head's run does: the same training and
// validation losses, to float32 rounding, step by step.
TEST(LoraRun, TrainsWithTheFusedHeadAsWithThePlainOne) {
  const Fixture& fx = fixture();
  const fs::path base = scratch("lora_head_base"), plain = scratch("lora_head_plain"),
                 fused = scratch("lora_head_fused");
  Result r = run("train " + fx.config.string() + " train.steps=3 --out " + base.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string lora = " lora.rank=4 lora.alpha=8 model.init_from=" + base.string() + " train.steps=10";
  r = run("train " + fx.config.string() + lora + " --out " + plain.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train " + fx.config.string() + lora + " model.head_chunk=8 --out " + fused.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<double> a = logged_losses(plain / "metrics.jsonl"), b = logged_losses(fused / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u) << "10 steps and 2 evaluations";
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "entry " << i;
}

// An NF4 base (lora.base_dtype): the base run's checkpoint is quantized at load, deterministically,
// so a resumed run re-quantizes it to the same bytes (base_crc32c hashes them) and continues
// bit-exactly; a changed base is refused as for a float32 one.
TEST(LoraRun, AnNf4BaseResumesBitExactAndAChangedBaseIsRefused) {
  const Fixture& fx = fixture();
  const fs::path base = scratch("qlora_base"), straight = scratch("qlora_straight"), split = scratch("qlora_split");
  Result r = run("train " + fx.config.string() + " train.steps=3 --out " + base.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string lora = " lora.rank=4 lora.base_dtype=nf4 model.init_from=" + base.string() + " train.steps=10";
  r = run("train " + fx.config.string() + lora + " --out " + straight.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train " + fx.config.string() + lora + " train.steps=5 --out " + split.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train --resume " + split.string() + " train.steps=10");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(logged_losses(straight / "metrics.jsonl"), logged_losses(split / "metrics.jsonl"));
  r = run("train --resume " + base.string() + " train.steps=7");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train --resume " + split.string() + " train.steps=12");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("is not the base model"), std::string::npos) << r.out;
}

// A LoRA run's checkpoints hold its adapters only: as model.init_from of a run without LoRA (or
// with other adapters) it is refused at the configuration, naming the fix.
TEST(LoraRun, AsInitFromWithoutItsAdaptersIsRefusedNamingTheMerge) {
  const Fixture& fx = fixture();
  const fs::path base = scratch("lora_from_base"), adapted = scratch("lora_from_adapted"),
                 plain = scratch("lora_from_plain");
  Result r = run("train " + fx.config.string() + " train.steps=3 --out " + base.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("train " + fx.config.string() + " lora.rank=4 model.init_from=" + base.string() + " train.steps=3 --out " +
          adapted.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string from = " model.init_from=" + adapted.string() + " train.steps=2 --out " + plain.string();
  for (const std::string shard : {"none", "state+grads", "params"}) {
    r = run("train " + fx.config.string() + from + " optimizer.shard=" + shard + " train.eval_interval=0 --overwrite");
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("is a LoRA run"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("loom export hf " + adapted.string()), std::string::npos) << r.out;
  }
  r = run("train " + fx.config.string() + from + " lora.rank=8 --overwrite");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("whose adapters have lora.rank = 4"), std::string::npos) << r.out;
}
