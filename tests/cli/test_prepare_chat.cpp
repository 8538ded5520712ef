// `loom prepare chat MODEL_DIR DATA.jsonl OUTDIR` as a user runs it (the installed binary, from a
// scratch directory): the summary, the files, --loss-on, --template, --render-only, and a bad
// line's message and status.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_loom.h"

namespace {

namespace fs = std::filesystem;
using Result = loom::testing::RunResult;

const fs::path& scratch() {
  static const fs::path dir = [] {
    const auto d = fs::temp_directory_path() / ("loom_test_prepare_chat_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

Result run(const std::string& args) { return loom::testing::run_loom(args, scratch().string(), LOOM_INSTALLED_BINARY); }

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A model directory with the gpt2 tokenizer fixture and a ChatML template written for the test.
fs::path model() {
  const fs::path m = scratch() / "model";
  fs::create_directories(m);
  fs::copy_file(std::string(LOOM_SOURCE_DIR) + "/tests/golden/hf/tokenizers/gpt2.json", m / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  const nlohmann::json config = {
      {"chat_template",
       "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
       "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
      {"eos_token", "<|endoftext|>"}};
  write(m / "tokenizer_config.json", config.dump());
  return m;
}

std::string conversations(int n) {
  std::string s;
  for (int k = 0; k < n; ++k)
    s += R"({"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": ")" + std::to_string(k) +
         R"( + 2"}, {"role": "assistant", "content": ")" + std::to_string(k + 2) + R"("}]})" + "\n";
  return s;
}

TEST(PrepareChat, WritesTokensMasksAndReportsTargets) {
  const fs::path m = model();
  write(scratch() / "chat.jsonl", conversations(10));
  const Result r = run("prepare chat " + m.string() + " chat.jsonl out");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("conversational data, loss on assistant"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train has 9 examples"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train at block size 1024: packed 1 rows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("val has 1 examples"), std::string::npos) << r.out;
  for (const char* f :
       {"train.bin", "val.bin", "train_mask.bin", "val_mask.bin", "train_docs.bin", "val_docs.bin", "meta.json"})
    EXPECT_TRUE(fs::exists(scratch() / "out" / f)) << f;
  const auto meta = nlohmann::json::parse(read(scratch() / "out/meta.json"));
  const int64_t tokens = meta["train_tokens"], targets = meta["chat"]["train_target_tokens"];
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(scratch() / "out/train_mask.bin")), tokens);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(scratch() / "out/train.bin")), 2 * tokens);  // uint16
  EXPECT_NE(r.out.find(std::to_string(targets) + " target tokens"), std::string::npos) << r.out;
  EXPECT_GT(targets, 0);
  EXPECT_LT(targets, tokens);

  // --loss-on all is the default it records (data.loss_on = auto); the masks still mark the
  // assistant turns, for data.loss_on = assistant.
  const Result all = run("prepare chat " + m.string() + " chat.jsonl out_all --loss-on all");
  ASSERT_EQ(all.status, 0) << all.out;
  EXPECT_NE(all.out.find("loss on all; the masks mark the assistant tokens"), std::string::npos) << all.out;
  const auto meta_all = nlohmann::json::parse(read(scratch() / "out_all/meta.json"));
  EXPECT_EQ(meta_all["chat"]["loss_on"], "all");
  EXPECT_EQ(meta_all["chat"]["mask_on"], "assistant");
  EXPECT_EQ(meta_all["chat"]["train_target_tokens"], targets);
  EXPECT_EQ(read(scratch() / "out_all/train_mask.bin"), read(scratch() / "out/train_mask.bin"));
  EXPECT_EQ(meta_all["train_tokens"], tokens);

  // Conversations without an assistant turn have no targets: prepare warns.
  std::string users;
  for (int k = 0; k < 5; ++k)
    users += R"({"messages": [{"role": "user", "content": "hi"}]})"
             "\n";
  write(scratch() / "users.jsonl", users);
  const Result none = run("prepare chat " + m.string() + " users.jsonl out_none");
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_NE(none.out.find("warning: train has no target tokens (loss on assistant)"), std::string::npos) << none.out;
}

// The template, the special tokens and generation_config.json go with the data's tokenizer into
// every checkpoint of a run on it, so `loom sample RUN --chat` answers with them.
TEST(PrepareChat, TheTemplateTravelsToTheRunsCheckpoints) {
  const fs::path m = model();
  write(m / "generation_config.json", R"({"eos_token_id": 50256})");
  write(scratch() / "travel.jsonl", conversations(12));
  Result r = run("prepare chat " + m.string() + " travel.jsonl travel");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto companions = nlohmann::json::parse(read(scratch() / "travel/meta.json"))["tokenizer"]["companions"];
  EXPECT_EQ(companions["tokenizer_config.json"], read(m / "tokenizer_config.json"));
  EXPECT_EQ(companions["generation_config.json"], read(m / "generation_config.json"));
  // OUTDIR holds them too, where a user (and transformers) looks for the template.
  for (const char* f : {"tokenizer_config.json", "generation_config.json"})
    EXPECT_EQ(read(scratch() / "travel" / f), read(m / f)) << f;
  write(scratch() / "travel.toml", R"([model]
kind = "transformer"
hidden_size = 16
num_layers = 1
head_dim = 8
vocab_size = 50257
num_outputs = 50257
max_seq_len = 128
[data]
kind = "tokens"
dir = "travel"
batch_size = 2
seq_len = 128
[train]
steps = 2
eval_interval = 0
)");
  // Rows of 128 hold whole conversations (about 81 tokens each), assistant turn included: a row cut
  // before it would have no target, which `loom train` refuses.
  r = run("train travel.toml --out travel_run");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* f : {"tokenizer_config.json", "generation_config.json"})
    EXPECT_EQ(read(scratch() / "travel_run/ckpt_000002" / f), read(m / f)) << f;
  r = run("sample travel_run --chat '3 + 2' --tokens 4");
  EXPECT_EQ(r.status, 0) << r.out;
  // --template FILE: that template travels.
  write(scratch() / "own.jinja", "{% for m in messages %}{{ m['content'] }}\n{% endfor %}");
  r = run("prepare chat " + m.string() + " travel.jsonl travel_own --template own.jinja --loss-on all");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(
      nlohmann::json::parse(read(scratch() / "travel_own/meta.json"))["tokenizer"]["companions"]["chat_template.jinja"],
      read(scratch() / "own.jinja"));
  EXPECT_EQ(read(scratch() / "travel_own/chat_template.jinja"), read(scratch() / "own.jinja"));
  // Preparing into it again replaces it (its files are a data directory's).
  r = run("prepare chat " + m.string() + " travel.jsonl travel_own --template own.jinja --loss-on all");
  EXPECT_EQ(r.status, 0) << r.out;
}

// A train split without a target token trains on nothing: prepare says so (loom train refuses it).
TEST(PrepareChat, WarnsWhenASplitHasNoTargets) {
  const fs::path m = model();
  std::string lines;
  for (int k = 0; k < 5; ++k) lines += R"({"messages": [{"role": "user", "content": "no answer"}]})" "\n";
  write(scratch() / "unanswered.jsonl", lines);
  Result r = run("prepare chat " + m.string() + " unanswered.jsonl unanswered --val-fraction 0.2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning: train has no target tokens (loss on assistant)"), std::string::npos) << r.out;
  r = run("prepare chat " + m.string() + " unanswered.jsonl unanswered --val-fraction 0.2 --loss-on all");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
}

// Plain text needs no template: tokenizer.json and the eos are enough, and each text ends with it.
TEST(PrepareChat, TextNeedsOnlyTheTokenizerAndTheEos) {
  const fs::path m = scratch() / "bare_model";
  fs::create_directories(m);
  fs::copy_file(std::string(LOOM_SOURCE_DIR) + "/tests/golden/hf/tokenizers/gpt2.json", m / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  write(scratch() / "text.jsonl", "{\"text\": \"a b\"}\n{\"text\": \"c\"}\n");
  Result r = run("prepare chat " + m.string() + " text.jsonl text_out --val-fraction 0.5");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("names no end-of-text token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--eos-token"), std::string::npos) << r.out;
  r = run("prepare chat " + m.string() + " text.jsonl text_out --val-fraction 0.5 --eos-token '<|endoftext|>'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("end with the eos token \"<|endoftext|>\""), std::string::npos) << r.out;
  const std::string train = read(scratch() / "text_out/train.bin");
  ASSERT_GE(train.size(), 2u);
  EXPECT_EQ(train.substr(train.size() - 2), std::string(2, '\0'));  // uint16 id 0, <|endoftext|>
}

TEST(PrepareChat, RenderOnlyPrintsTheTemplatesText) {
  const fs::path m = model();
  write(scratch() / "one.jsonl", R"({"messages": [{"role": "user", "content": "Hi"}]})"
                                 "\n");
  Result r = run("prepare chat " + m.string() + " one.jsonl --render-only --add-generation-prompt");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  write(scratch() / "mine.jinja", "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}{% endfor %}");
  r = run("prepare chat " + m.string() + " one.jsonl --render-only --template mine.jinja");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], "[USER] Hi");
}

TEST(PrepareChat, BadLineIsNamedAndNothingIsWritten) {
  const fs::path m = model();
  write(scratch() / "bad.jsonl",
        conversations(3) + R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]})" + "\n");
  const Result r = run("prepare chat " + m.string() + " bad.jsonl bad_out");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("bad.jsonl:4: messages[1].content is missing"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(scratch() / "bad_out"));
  // A template construct loom does not render is named with its line.
  write(scratch() / "call.jinja", "x\n{% call f() %}{% endcall %}");
  write(scratch() / "good.jsonl", conversations(3));
  const Result t = run("prepare chat " + m.string() + " good.jsonl bad_out --template call.jinja");
  EXPECT_EQ(t.status, 2) << t.out;
  EXPECT_NE(t.out.find("call.jinja line 2: the statement '{% call %}' is not supported"), std::string::npos) << t.out;
}

}  // namespace
