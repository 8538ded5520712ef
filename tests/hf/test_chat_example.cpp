// The README's chat worked examples as a user runs them, shortened. A chat model learns to add
// (examples/chat_arithmetic, configs/chat_arithmetic.toml): the data from its seed, `loom prepare
// chat` with the example's template, the held-out multiple-choice accuracy of the Llama fixture
// before and after fine-tuning on the assistant's turns, and a chat with the result. A chat model
// of each family: the Qwen2, Qwen3, Mistral and Gemma 3 fixtures fine-tuned on the same
// conversations with their own templates, chatted with and exported.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "data/hf_tokenizer.h"
#include "support/files.h"
#include "support/run_loom.h"

namespace loom {
namespace {

using testing::hf_golden;
using testing::read_file;
using testing::run_loom;
using testing::TempDir;

const std::string kExample = LOOM_SOURCE_DIR "/examples/chat_arithmetic";

// examples/chat_arithmetic/make_data.sh OUTDIR ARGS, rendering with the build's loom.
testing::RunResult make_data(const std::string& out, const std::string& args) {
  return run_loom(out + " " + args, {}, "LOOM=" LOOM_BINARY " bash " + kExample + "/make_data.sh");
}

// acc of `loom eval SOURCE --choices FILE --json` (-1 when it fails).
double choice_accuracy(const std::string& source, const std::string& file) {
  const auto r = run_loom("eval " + source + " --choices " + file + " --json");
  EXPECT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_object() && j.contains("acc") ? j["acc"].get<double>() : -1.0;
}

// The sums a text asks, in the generator's four phrasings ("What is 2 + 3?", "2 + 3 = ?", "Add 2
// and 3.", "How much is 2 plus 3?"): (first, second) pairs in order.
std::vector<std::pair<int, int>> asked(const std::string& text) {
  static const std::regex question(R"((\d)(?: \+ | plus | and )(\d))");
  std::vector<std::pair<int, int>> out;
  for (std::sregex_iterator m(text.begin(), text.end(), question), end; m != end; ++m)
    out.emplace_back(std::stoi((*m)[1]), std::stoi((*m)[2]));
  return out;
}
bool held_out(const std::pair<int, int>& p) { return (p.first - p.second + 10) % 10 == 3; }

TEST(HfCliExample, ChatArithmeticDataIsSeededAndHoldsItsQuestionsOut) {
  TempDir d;
  const std::string args = "--conversations 300 --questions 40";
  ASSERT_EQ(make_data(d.path("a"), args + " --seed 7").status, 0);
  ASSERT_EQ(make_data(d.path("b"), args + " --seed 7").status, 0);
  ASSERT_EQ(make_data(d.path("c"), args + " --seed 8").status, 0);
  for (const char* f : {"/chats.jsonl", "/choices.jsonl"}) {
    EXPECT_TRUE(read_file(d.path("a") + f) == read_file(d.path("b") + f)) << f << ": another file from the same seed";
    EXPECT_FALSE(read_file(d.path("a") + f) == read_file(d.path("c") + f)) << f << ": the same file from another seed";
  }
  // No training conversation asks a held-out sum; every question asks one last, and its label is
  // the choice that answers it.
  std::istringstream chats(read_file(d.path("a/chats.jsonl")));
  int lines = 0, questions = 0;
  for (std::string line; std::getline(chats, line); ++lines)
    for (const auto& p : asked(line)) {
      EXPECT_FALSE(held_out(p)) << line;
      ++questions;
    }
  EXPECT_EQ(lines, 300);
  EXPECT_GE(questions, lines);
  std::istringstream choices(read_file(d.path("a/choices.jsonl")));
  lines = 0;
  for (std::string line; std::getline(choices, line); ++lines) {
    const auto q = nlohmann::json::parse(line);
    const auto sums = asked(q["context"].get<std::string>());
    ASSERT_FALSE(sums.empty()) << line;
    EXPECT_TRUE(held_out(sums.back())) << line;
    for (size_t i = 0; i + 1 < sums.size(); ++i) EXPECT_FALSE(held_out(sums[i])) << line;
    ASSERT_EQ(q["choices"].size(), 4u) << line;
    const std::string right = std::to_string(sums.back().first + sums.back().second) + "<|end_of_text|>";
    EXPECT_EQ(q["choices"][q["label"].get<size_t>()].get<std::string>().rfind(right, 0), 0u) << line;
  }
  EXPECT_EQ(lines, 40);
  // A bad argument stops before anything is written.
  const auto bad = make_data(d.path("e"), "--seed x");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--seed must be a whole number"), std::string::npos) << bad.out;
  EXPECT_FALSE(std::filesystem::exists(d.path("e")));
}

// The whole example shortened (half the conversations, 60 questions, 400 steps), packed rows: the accuracy on held-out
// sums (four choices, chance 0.25) rises well above chance and above the untrained model's (one step at learning rate
// 0), and the run answers a chat.
TEST(HfCliExample, ChatArithmeticLearnsToAdd) {
  TempDir d;
  const std::string model = hf_golden("llama_tied"), choices = d.path("src/choices.jsonl");
  auto r = make_data(d.path("src"), "--conversations 1000 --questions 60");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_loom("prepare chat " + model + " " + d.path("src/chats.jsonl") + " " + d.path("tokens") + " --template " +
               kExample + "/chatml.jinja --block-size 256");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("conversational data, loss on assistant"), std::string::npos) << r.out;
  const std::string train = "train " LOOM_SOURCE_DIR "/configs/chat_arithmetic.toml data.dir=" + d.path("tokens");
  r = run_loom(train + " train.steps=1 optimizer.learning_rate=0 train.eval_interval=0 --out " + d.path("untrained"));
  ASSERT_EQ(r.status, 0) << r.out;
  const double before = choice_accuracy(d.path("untrained"), choices);
  r = run_loom(train + " train.steps=400 optimizer.decay_steps=400 train.eval_interval=200 --out " + d.path("run"));
  ASSERT_EQ(r.status, 0) << r.out;
  const double after = choice_accuracy(d.path("run"), choices);
  EXPECT_GT(after, 0.5) << "before " << before;
  EXPECT_GT(after, before + 0.25) << "before " << before;
  // The answer is a number and the turn ends: the template came with the checkpoints and its
  // end-of-turn token stops the reply.
  r = run_loom("sample " + d.path("run") + " --chat 'What is 7 + 4?' --temperature 0 --tokens 8");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("[0-9]{1,2}\n"))) << r.out;
}

// The README's worked example for each family ("Chat models of each family"), shortened: the
// fixture standing in for a downloaded chat model, with its family's chat template, prepares the
// example's conversations, learns from them with configs/llama_finetune.toml, answers a chat with a
// number and the end of its turn, and exports a model that chats as the run does, with the
// template, and a generation_config.json whose eos_token_id holds the template's end of turn.
struct ChatFamily {
  std::string fixture, architecture, end_of_turn;  // "qwen3", "Qwen3ForCausalLM", "<|im_end|>"
  std::string seq_len;                             // the row length: 128, or the fixture's positions
  std::string loss_on;  // Mistral's template moves the system prompt into the last question: "all"
};
void PrintTo(const ChatFamily& f, std::ostream* os) { *os << f.fixture; }
class HfChatFamilyExample : public ::testing::TestWithParam<ChatFamily> {};
INSTANTIATE_TEST_SUITE_P(
    Families, HfChatFamilyExample,
    ::testing::Values(ChatFamily{"qwen2_tied", "Qwen2ForCausalLM", "<|im_end|>", "128", "assistant"},
                      ChatFamily{"qwen3", "Qwen3ForCausalLM", "<|im_end|>", "64", "assistant"},
                      ChatFamily{"mistral", "MistralForCausalLM", "<|end_of_text|>", "128", "all"},
                      ChatFamily{"gemma3", "Gemma3ForCausalLM", "<end_of_turn>", "128", "assistant"}),
    [](const auto& info) { return info.param.fixture; });

TEST_P(HfChatFamilyExample, FineTuneChatAndExport) {
  const ChatFamily& f = GetParam();
  TempDir d;
  const std::string model = hf_golden(f.fixture);
  auto r = make_data(d.path("src"), "--conversations 400 --questions 1");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run_loom("prepare chat " + model + " " + d.path("src/chats.jsonl") + " " + d.path("tokens") + " --block-size " +
               f.seq_len + (f.loss_on == "all" ? " --loss-on all" : ""));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("conversational data, loss on " + f.loss_on), std::string::npos) << r.out;
  r = run_loom("train " LOOM_SOURCE_DIR "/configs/llama_finetune.toml threads=1 model.init_from=" + model +
               " data.dir=" + d.path("tokens") + " data.seq_len=" + f.seq_len +
               " data.packing=true train.sample_tokens=0 train.steps=60 train.eval_interval=30"
               " optimizer.decay_steps=60 optimizer.learning_rate=3e-3 --out " +
               d.path("run"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from the Hugging Face " + f.architecture + " in " + model), std::string::npos)
      << r.out;
  const auto val = [&](const std::string& step) {
    const size_t p = r.out.find("step " + step + ": val loss ");
    return p == std::string::npos ? -1.0 : std::stod(r.out.substr(p + step.size() + 16));
  };
  EXPECT_GT(val("30"), val("60")) << r.out;
  EXPECT_GT(val("60"), 0) << r.out;
  // The reply is a number (after Mistral's space), and the turn ends at the template's end of turn,
  // well within the 12 tokens allowed.
  const std::string chat = " --chat 'What is 7 + 4?' --temperature 0 --tokens 12";
  const auto reply = run_loom("sample " + d.path("run") + chat);
  EXPECT_EQ(reply.status, 0) << reply.out;
  EXPECT_TRUE(std::regex_match(reply.out, std::regex(" ?[0-9]{1,3}\n"))) << reply.out;
  r = run_loom("export hf " + d.path("run") + " " + d.path("hf"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("as " + f.architecture + " to " + d.path("hf")), std::string::npos) << r.out;
  // The export chats and continues a prompt as the run does.
  const auto exported = run_loom("sample " + d.path("hf") + chat);
  EXPECT_EQ(exported.status, 0) << exported.out;
  EXPECT_EQ(exported.out, reply.out);
  const std::string text = " --prompt 'What is 7 + 4?' --temperature 0 --tokens 30";
  EXPECT_EQ(run_loom("sample " + d.path("hf") + text).out, run_loom("sample " + d.path("run") + text).out);
  // transformers' generate() stops where `loom sample --chat` does.
  const auto tok = HfTokenizer::load(d.path("hf"));
  const int32_t end = tok->find(f.end_of_turn);
  ASSERT_GE(end, 0) << f.end_of_turn;
  const auto generation = nlohmann::json::parse(read_file(d.path("hf/generation_config.json")));
  // One id, or a list of them.
  const nlohmann::json& ids = generation["eos_token_id"];
  const auto eos = ids.is_array() ? ids.get<std::vector<int32_t>>() : std::vector<int32_t>{ids.get<int32_t>()};
  EXPECT_NE(std::find(eos.begin(), eos.end(), end), eos.end()) << generation.dump();
  for (const char* file : {"chat_template.jinja", "tokenizer_config.json"})
    EXPECT_EQ(read_file(d.path("hf/") + file), read_file(model + "/" + file)) << file;
}

}  // namespace
}  // namespace loom
