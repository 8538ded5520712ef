// The Hugging Face commands as a user runs them (the loom binary): prepare text with a
// tokenizer.json, fine-tune a GPT-2 or a Llama directory with --init-from, sample from the
// directory itself, export the run; and the README's Llama fine-tuning example.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "support/files.h"
#include "support/run_loom.h"

namespace loom {
namespace {

using testing::hf_golden;
using testing::read_file;
using testing::run_loom;
using testing::TempDir;
using testing::write_file;

// A fixture directory and what loom says about it.
struct CliFixture {
  std::string dir, vocab, architecture, layers;  // "gpt2", "320", "GPT2LMHeadModel", "n_layer = 2"
};
class HfCli : public ::testing::TestWithParam<CliFixture> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, HfCli,
                         ::testing::Values(CliFixture{"gpt2", "320", "GPT2LMHeadModel", "n_layer = 2"},
                                           CliFixture{"llama_untied", "321", "LlamaForCausalLM",
                                                      "num_hidden_layers = 2"}),
                         [](const auto& info) { return info.param.dir; });

TEST_P(HfCli, PrepareFineTuneAndSample) {
  const CliFixture& f = GetParam();
  const std::string model = hf_golden(f.dir);
  TempDir d;
  write_file(d.path("text.txt"), read_file(LOOM_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 20000));
  auto r = run_loom("prepare hf " + model + "/tokenizer.json " + d.path("text.txt") + " " + d.path("data"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("vocab size: " + f.vocab), std::string::npos) << r.out;
  write_file(d.path("ft.toml"), R"(
[optimizer]
name = "adamw"
learning_rate = 1e-3
[data]
kind = "tokens"
dir = ")" + d.path("data") + R"("
batch_size = 4
seq_len = 32
[train]
steps = 3
sample_tokens = 8
)");
  r = run_loom("train " + d.path("ft.toml") + " --init-from " + model + " --out " + d.path("run"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from the Hugging Face " + f.architecture + " in " + model), std::string::npos)
      << r.out;
  // The run's own checkpoint samples, and so does the directory it started from.
  r = run_loom("sample " + d.path("run") + " --tokens 5 --prompt ROMEO:");
  EXPECT_EQ(r.status, 0) << r.out;
  r = run_loom("sample " + model + " --tokens 5 --prompt ROMEO: --temperature 0");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("ROMEO:", 0), 0u) << r.out;
  // The run exported, and the export sampled greedily, as the run itself.
  r = run_loom("export hf " + d.path("run") + " " + d.path("hf"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("as " + f.architecture + " to " + d.path("hf") +
                       ": model.safetensors, config.json, "
                       "tokenizer.json"),
            std::string::npos)
      << r.out;
  // Flags that do not apply are refused, not ignored, and nothing is written.
  for (const auto& [flags, named] : {std::pair{"hf " + d.path("run") + " " + d.path("hf2") + " --merge", "--merge"},
                                     std::pair{"peft " + d.path("run") + " " + d.path("hf2") + " --merge", "--merge"},
                                     std::pair{"hf " + d.path("run") + " " + d.path("hf2") + " --type bf16", "--type"},
                                     std::pair{"gguf " + d.path("run") + " " + d.path("no/dir/m.gguf"), "no/dir"}}) {
    r = run_loom("export " + flags);
    EXPECT_EQ(r.status, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(named), std::string::npos) << flags << "\n" << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(d.path("hf2")));
  EXPECT_FALSE(std::filesystem::exists(d.path("no")));
  const auto from_run = run_loom("sample " + d.path("run") + " --tokens 20 --prompt ROMEO: --temperature 0");
  const auto from_export = run_loom("sample " + d.path("hf") + " --tokens 20 --prompt ROMEO: --temperature 0");
  EXPECT_EQ(from_export.status, 0) << from_export.out;
  EXPECT_EQ(from_export.out, from_run.out);
  // A config that contradicts the checkpoint stops before anything runs.
  r = run_loom("train " + d.path("ft.toml") + " model.num_layers=3 --init-from " + model + " --out " + d.path("run2"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.num_layers: is 3, but the model of model.init_from has " + f.layers), std::string::npos)
      << r.out;
}

// The README's second worked example as written (configs/llama_finetune.toml, its default
// init_from: the random-weight Llama fixture standing in for a downloaded model), shortened.
TEST(HfCliExample, LlamaFineTuneThenSample) {
  TempDir d;
  const std::string model = hf_golden("llama_tied");
  auto r = run_loom("prepare hf " + model + "/tokenizer.json " LOOM_SOURCE_DIR "/data/tinyshakespeare.txt " +
                    d.path("data"));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_loom("train " LOOM_SOURCE_DIR "/configs/llama_finetune.toml data.dir=" + d.path("data") +
               " train.steps=30 train.eval_interval=15 optimizer.decay_steps=30 --out " + d.path("run"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from the Hugging Face LlamaForCausalLM in " + model), std::string::npos) << r.out;
  // It learns: the validation loss at step 30 is below the one at step 15.
  const auto at = [&](const std::string& step) {
    const size_t p = r.out.find("step " + step + ": val loss ");
    return p == std::string::npos ? -1.0 : std::stod(r.out.substr(p + step.size() + 16));
  };
  EXPECT_GT(at("15"), at("30")) << r.out;
  EXPECT_GT(at("30"), 0) << r.out;
  r = run_loom("sample " + d.path("run") + " --prompt ROMEO: --tokens 20");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("ROMEO:", 0), 0u) << r.out;
}

// The README's LoRA example (configs/llama_finetune.toml with lora.*), shortened: the adapters
// learn, the run samples, `loom export peft` writes PEFT's two files, and `loom export hf --merge`
// a model that continues a prompt greedily as the LoRA run does; without --merge export hf says
// what to use; `loom export gguf` merges.
TEST(HfCliExample, LoraFineTuneThenExportPeftAndMerged) {
  TempDir d;
  auto r = run_loom("prepare hf " + hf_golden("llama_tied") +
                    "/tokenizer.json " LOOM_SOURCE_DIR "/data/tinyshakespeare.txt " + d.path("data"));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_loom("train " LOOM_SOURCE_DIR "/configs/llama_finetune.toml data.dir=" + d.path("data") +
               " lora.rank=8 lora.alpha=16 optimizer.learning_rate=3e-3 train.steps=40 train.eval_interval=20"
               " optimizer.decay_steps=40 --out " +
               d.path("run"));
  ASSERT_EQ(r.status, 0) << r.out;
  const auto at = [&](const std::string& step) {
    const size_t p = r.out.find("step " + step + ": val loss ");
    return p == std::string::npos ? -1.0 : std::stod(r.out.substr(p + step.size() + 16));
  };
  EXPECT_GT(at("20"), at("40")) << r.out;
  EXPECT_GT(at("40"), 0) << r.out;
  r = run_loom("export peft " + d.path("run") + " " + d.path("adapter"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(d.path("adapter/adapter_config.json")));
  EXPECT_TRUE(std::filesystem::exists(d.path("adapter/adapter_model.safetensors")));
  r = run_loom("export hf " + d.path("run") + " " + d.path("hf"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("loom export peft, or the merged model with --merge"), std::string::npos) << r.out;
  r = run_loom("export hf " + d.path("run") + " " + d.path("merged") + " --merge");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string sample = " --prompt ROMEO: --tokens 16 --temperature 0";
  const auto lora = run_loom("sample " + d.path("run") + sample);
  const auto merged = run_loom("sample " + d.path("merged") + sample);
  ASSERT_EQ(lora.status, 0) << lora.out;
  EXPECT_EQ(merged.out, lora.out);
  r = run_loom("export gguf " + d.path("run") + " " + d.path("m.gguf"));
  EXPECT_EQ(r.status, 0) << r.out;
}

// lora.init_from starts the adapters from someone else's PEFT adapter (the fixture PEFT wrote): a
// step at learning rate 0 exports the same adapter tensors; an adapter of another rank is refused
// naming lora.rank and the adapter's r.
TEST(HfCliExample, LoraStartsFromAPeftAdapter) {
  TempDir d;
  write_file(d.path("t.toml"), R"(
[optimizer]
name = "sgd"
learning_rate = 0.0
[data]
kind = "random_tokens"
vocab_size = 300
batch_size = 2
seq_len = 8
[train]
steps = 1
)");
  const std::string adapter = hf_golden("peft_llama_untied");
  const std::string base = "train " + d.path("t.toml") + " --init-from " + hf_golden("llama_untied") +
                           " lora.rank=4 lora.alpha=8 lora.init_from=" + adapter;
  auto r = run_loom(base + " --out " + d.path("run"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("adapters from the PEFT adapter in " + adapter), std::string::npos) << r.out;
  r = run_loom("export peft " + d.path("run") + " " + d.path("out"));
  ASSERT_EQ(r.status, 0) << r.out;
  std::map<std::string, StTensor> want;
  for (StTensor& t : read_safetensors(adapter + "/adapter_model.safetensors")) want.emplace(t.name, std::move(t));
  const std::vector<StTensor> got = read_safetensors(d.path("out/adapter_model.safetensors"));
  EXPECT_EQ(got.size(), want.size());
  for (const StTensor& t : got) {
    ASSERT_TRUE(want.count(t.name)) << t.name;
    EXPECT_EQ(t.bytes, want.at(t.name).bytes) << t.name;
  }
  r = run_loom("train " + d.path("t.toml") + " --init-from " + hf_golden("llama_untied") +
               " lora.rank=8 lora.alpha=8 lora.init_from=" + adapter + " --out " + d.path("run8"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("lora.rank: is 8 but " + adapter + "/adapter_config.json has r = 4"), std::string::npos)
      << r.out;
}

// Data prepared with another tokenizer than the model's is refused before anything runs.
TEST(HfCliExample, DataOfAnotherTokenizerIsRefused) {
  TempDir d;
  write_file(d.path("text.txt"), read_file(LOOM_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 5000));
  auto r = run_loom("prepare hf " + hf_golden("gpt2/tokenizer.json") + " " + d.path("text.txt") + " " + d.path("data"));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_loom("train " LOOM_SOURCE_DIR "/configs/llama_finetune.toml data.dir=" + d.path("data") +
               " data.seq_len=16 train.steps=1 --out " + d.path("run"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("tokenizer is not the one of model.init_from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loom prepare hf " + hf_golden("llama_tied") + "/tokenizer.json"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(d.path("run/config.toml")));
}

// README, "Paths": model.init_from in a config file is relative to that file, like data.dir; on the
// command line (an override or --init-from), to the current directory.
TEST(HfCliPaths, InitFromIsRelativeToTheConfigFileOrTheWorkingDirectory) {
  namespace fs = std::filesystem;
  TempDir d;
  const fs::path project = d.path("project");
  fs::create_directories(project / "configs");
  fs::create_directories(project / "models");
  fs::copy(hf_golden("gpt2"), project / "models" / "gpt2");
  write_file((project / "text.txt").string(), read_file(LOOM_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 5000));
  auto r = run_loom("prepare hf " + hf_golden("gpt2/tokenizer.json") + " " + (project / "text.txt").string() + " " +
                    (project / "data").string());
  ASSERT_EQ(r.status, 0) << r.out;
  write_file((project / "configs" / "ft.toml").string(), R"(
[model]
init_from = "../models/gpt2"
[data]
kind = "tokens"
dir = "../data"
batch_size = 2
seq_len = 16
[train]
steps = 1
)");
  // Run from d, away from the config file's directory.
  r = run_loom("train project/configs/ft.toml --out run1", d.path());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from the Hugging Face GPT2LMHeadModel in " + (project / "models" / "gpt2").string()),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      read_file(d.path("run1/config.toml")).find("init_from = \"" + (project / "models" / "gpt2").string() + "\""),
      std::string::npos)
      << "the saved config names the model absolutely";
  // An override is relative to the working directory: d/models/gpt2 is not there.
  r = run_loom("train project/configs/ft.toml model.init_from=models/gpt2 --out run2", d.path());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("model.init_from = " + d.path("models/gpt2") + ": no such directory"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("relative to that file"), std::string::npos) << "the fix explains the rule: " << r.out;
  r = run_loom("train project/configs/ft.toml --init-from project/models/gpt2 --out run3", d.path());
  EXPECT_EQ(r.status, 0) << r.out;
}

}  // namespace
}  // namespace loom
