// `loom sample --chat` (sample/chat.h) on the tiny Llama fixture with a template written for the
// test: a reply is what plain `loom sample` continues the rendered conversation with, cut before
// the first end-of-turn token; a conversation on stdin answers each message with the earlier
// turns in its prompt; the end-of-turn tokens come from the template and the configs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/end_of_turn.h"
#include "data/hf_tokenizer.h"
#include "sample/chat.h"
#include "support/run_loom.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::run_loom;

// ChatML-like, with the tokenizer's own special tokens: <|endoftext|> ends every turn.
const std::string kTemplate =
    "{% for m in messages %}<|begin_of_text|>{{ m.role }}\n{{ m.content }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|begin_of_text|>assistant\n{% endif %}";

std::string turn(const std::string& role, const std::string& content) {
  return "<|begin_of_text|>" + role + "\n" + content + "<|endoftext|>\n";
}
const std::string kAssistant = "<|begin_of_text|>assistant\n";

class Chat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_test_chat_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    model_ = dir_ / "model";
    fs::create_directories(dir_);
    fs::copy(std::string(LOOM_SOURCE_DIR) + "/tests/golden/hf/llama_tied", model_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_config(const nlohmann::json& config) const {
    std::ofstream(model_ / "tokenizer_config.json") << config.dump();
  }
  // What greedy `loom sample --prompt` continues `prompt` with (it echoes the prompt first).
  std::string continuation(const std::string& prompt, int tokens) const {
    std::ofstream(dir_ / "prompt.txt", std::ios::binary) << prompt;
    const auto r = run_loom("sample " + model_.string() + " --temperature 0 --tokens " + std::to_string(tokens) +
                            " --prompt-file " + (dir_ / "prompt.txt").string());
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.substr(0, prompt.size()), prompt);
    return r.out.substr(prompt.size());
  }
  fs::path dir_, model_;
};

// The greedy continuations of these prompts from this fixture start with newlines and then "}"
// or "X" (checked): with "}" as the eos_token and "X" as generation_config.json's eos_token_id, a
// reply is the text before the first of them.
TEST_F(Chat, ReplyStopsAtTheEndOfTurnAndKeepsTheConversation) {
  write_config({{"chat_template", kTemplate}, {"eos_token", "}"}});
  const std::vector<int32_t> x = HfTokenizer::load(model_.string())->encode("X");
  ASSERT_EQ(x.size(), 1u);
  std::ofstream(model_ / "generation_config.json") << nlohmann::json({{"eos_token_id", x[0]}}).dump();
  const auto reply = [&](const std::string& prompt) {
    const std::string text = continuation(prompt, 40);
    const size_t cut = text.find_first_of("}X");
    EXPECT_NE(cut, std::string::npos) << text;
    EXPECT_GT(cut, 0u) << text;
    return text.substr(0, cut);
  };
  const std::string want1 = reply(turn("user", "Hi there") + kAssistant);
  const auto r1 = run_loom("sample " + model_.string() + " --temperature 0 --tokens 40 --chat 'Hi there'");
  ASSERT_EQ(r1.status, 0) << r1.out;
  EXPECT_EQ(r1.out, want1 + "\n");
  // Two turns on stdin: the second reply continues the whole conversation, the first reply in it.
  std::ofstream(dir_ / "messages.txt") << "Hi there\n\nMore\n";
  const auto r2 = run_loom("sample " + model_.string() + " --temperature 0 --tokens 40 --chat - < " +
                           (dir_ / "messages.txt").string());
  ASSERT_EQ(r2.status, 0) << r2.out;
  const std::string want2 =
      reply(turn("user", "Hi there") + turn("assistant", want1) + turn("user", "More") + kAssistant);
  EXPECT_EQ(r2.out, want1 + "\n" + want2 + "\n");
  // Alone, or after an empty first reply, the second message gets another reply: the test sees
  // whether the first turn, and the reply in it, are kept.
  EXPECT_NE(reply(turn("user", "More") + kAssistant), want2);
  EXPECT_NE(reply(turn("user", "Hi there") + turn("assistant", "") + turn("user", "More") + kAssistant), want2);
}

// The end-of-turn tokens: what the template writes after an assistant's content, the config's
// eos_token and generation_config.json's eos_token_id, each once and only as single tokens.
TEST_F(Chat, EndOfTurnTokensComeFromTheTemplateAndTheConfigs) {
  const auto tok = HfTokenizer::load(model_.string());
  write_config({{"chat_template", kTemplate}, {"eos_token", "<|end_of_text|>"}});
  EXPECT_EQ(end_of_turn_ids(load_chat_template(model_.string(), ""), jinja::Json(nullptr), *tok),
            (std::vector<int32_t>{2, 1}));
  write_config({{"chat_template", "{% for m in messages %}{{ m.content }}\n{% endfor %}"},
                {"eos_token", "<|begin_of_text|>abc"}});
  // Nothing after the content but white space, an eos_token of several tokens: the ids alone.
  EXPECT_EQ(
      end_of_turn_ids(load_chat_template(model_.string(), ""), jinja::Json::parse(R"({"eos_token_id": [1, 7]})"), *tok),
      (std::vector<int32_t>{1, 7}));
}

// An end of turn the tokenizer writes as several tokens is a stop string: the reply ends before
// the first place its text holds it, and that text is not printed. The marker is taken from the
// fixture's greedy reply itself (the template writes it only after assistant turns, so the
// prompt does not depend on it).
TEST_F(Chat, AMultiTokenEndOfTurnStopsTheReply) {
  const std::string plain = "{% for m in messages %}<|begin_of_text|>{{ m.role }}\n{{ m.content }}";
  const auto tok = HfTokenizer::load(model_.string());
  const std::string text = continuation("<|begin_of_text|>user\nHi there" + kAssistant, 40);
  const std::vector<int32_t> ids = tok->encode(text);
  std::string marker;
  for (size_t k = 2; k + 3 < ids.size() && marker.empty(); ++k) {
    std::string m = tok->decode(std::vector<int32_t>(ids.begin() + static_cast<long>(k), ids.begin() + static_cast<long>(k) + 3));
    const size_t b = m.find_first_not_of(" \t\r\n"), e = m.find_last_not_of(" \t\r\n");
    if (b == std::string::npos) continue;
    m = m.substr(b, e + 1 - b);
    // Printable ASCII, no Jinja delimiter start: plain template text.
    const bool plain_text = std::all_of(m.begin(), m.end(), [](char c) { return c > ' ' && c < 127 && c != '{'; });
    if (plain_text && tok->encode(m).size() >= 2 && text.find(m) > 0) marker = m;
  }
  ASSERT_FALSE(marker.empty()) << text;
  write_config({{"chat_template", plain + "{% if m.role == 'assistant' %}" + marker + "{% endif %}{% endfor %}" +
                                      "{% if add_generation_prompt %}" + kAssistant + "{% endif %}"}});
  EXPECT_EQ(end_of_turn_text(load_chat_template(model_.string(), ""), *tok), marker);
  const auto r = run_loom("sample " + model_.string() + " --temperature 0 --tokens 40 --chat 'Hi there'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, text.substr(0, text.find(marker)) + "\n") << "marker: " << marker;
  // The tail held back while it may be the marker's start.
  const StopString stop("abc");
  EXPECT_EQ(stop.held("xxab"), 2u);
  EXPECT_EQ(stop.held("xxb"), 0u);
  EXPECT_EQ(stop.find("xabcd"), 1u);
  EXPECT_EQ(StopString("").find("abc"), std::string::npos);
}

TEST_F(Chat, BadInputsNameTheFix) {
  const auto none = run_loom("sample " + model_.string() + " --chat hello");
  EXPECT_EQ(none.status, 2) << none.out;
  EXPECT_NE(none.out.find("has no chat template"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("--template"), std::string::npos) << none.out;
  std::ofstream(dir_ / "t.jinja") << kTemplate;
  const auto given =
      run_loom("sample " + model_.string() + " --chat hello --tokens 3 --template " + (dir_ / "t.jinja").string());
  EXPECT_EQ(given.status, 0) << given.out;
  const auto both =
      run_loom("sample " + model_.string() + " --chat hello --num-samples 2 --template " + (dir_ / "t.jinja").string());
  EXPECT_EQ(both.status, 2) << both.out;
  EXPECT_NE(both.out.find("--num-samples"), std::string::npos) << both.out;
  const auto lonely = run_loom("sample " + model_.string() + " --system 'Be brief.' --tokens 3");
  EXPECT_EQ(lonely.status, 2) << lonely.out;
  EXPECT_NE(lonely.out.find("--system"), std::string::npos) << lonely.out;
}

}  // namespace
}  // namespace loom
