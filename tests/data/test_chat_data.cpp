// Chat data (src/data/chat_data.h): the three JSON Lines formats and their errors, the chat
// template and special tokens from tokenizer_config.json, assistant spans found by rendering
// prefixes, token masks, and the files `loom prepare chat` writes (all or nothing).
#include "data/chat_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "data/token_data.h"
#include "support/files.h"

namespace loom {
namespace {

using jinja::Json;
using testing::read_file;
using testing::TempDir;
using testing::user_error;
using testing::write_file;

// SmolLM2's ChatML layout, written for the test.
const char* kChatMl =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// A model directory: the gpt2 tokenizer fixture with ChatML's two special tokens added, and a
// tokenizer_config.json with `chat_template`.
void write_model(const std::string& dir, const std::string& chat_template = kChatMl) {
  Json tok = Json::parse(read_file(testing::hf_golden("tokenizers/gpt2.json")));
  int64_t next = static_cast<int64_t>(tok["model"]["vocab"].size());
  for (const char* t : {"<|im_start|>", "<|im_end|>"})
    tok["added_tokens"].push_back({{"id", next++}, {"content", t}, {"special", true}});
  write_file(dir + "/tokenizer.json", tok.dump());
  const Json config = {{"chat_template", chat_template},
                       {"bos_token", nullptr},
                       {"eos_token", {{"content", "<|im_end|>"}, {"special", true}}}};
  write_file(dir + "/tokenizer_config.json", config.dump());
}

std::string where_of(const std::string& msg) { return msg.substr(0, msg.find(": ")); }

TEST(ChatData, ParsesTheThreeFormats) {
  ChatExample c = parse_chat_line(
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], "id": 7})", "f:1");
  EXPECT_EQ(c.format, ChatFormat::conversational);
  EXPECT_EQ(c.messages.size(), 2u);
  EXPECT_TRUE(c.tools.is_null());
  ChatExample p = parse_chat_line(R"({"prompt": "2+2=", "completion": "4"})", "f:2");
  EXPECT_EQ(p.format, ChatFormat::prompt_completion);
  EXPECT_EQ(p.completion, "4");
  ChatExample t = parse_chat_line(R"({"text": "plain"})", "f:3");
  EXPECT_EQ(t.format, ChatFormat::text);
  EXPECT_EQ(t.text, "plain");
  // Key order is kept: templates that print dicts (tojson) print them as written.
  ChatExample tools =
      parse_chat_line(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"z": 1, "a": 2}]})", "f:4");
  EXPECT_EQ(tools.tools[0].begin().key(), "z");
}

TEST(ChatData, BadLinesNameTheFileLineAndField) {
  TempDir d;
  auto error_for = [&](const std::string& lines) {
    write_file(d.path("data.jsonl"), lines);
    return user_error([&] { read_chat_jsonl(d.path("data.jsonl")); });
  };
  const std::string ok = R"({"messages": [{"role": "user", "content": "Hi"}]})";
  std::string msg = error_for(ok + "\n\n" + R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot"}]})");
  EXPECT_EQ(where_of(msg), d.path("data.jsonl") + ":3") << msg;  // the blank line counts
  EXPECT_NE(msg.find("messages[1].role is \"bot\""), std::string::npos) << msg;
  msg = error_for(ok + "\n" + R"({"messages": [{"role": "user"}]})");
  EXPECT_NE(msg.find(":2: messages[0].content is missing"), std::string::npos) << msg;
  msg = error_for(R"({"prompt": "a"})");
  EXPECT_NE(msg.find(":1: \"completion\" is missing"), std::string::npos) << msg;
  msg = error_for(R"({"prompt": "a", "completion": ["x"]})");
  EXPECT_NE(msg.find("both be strings or both be lists"), std::string::npos) << msg;
  msg = error_for(ok + "\n{\"messages\": [");
  EXPECT_NE(msg.find(":2: is not valid JSON"), std::string::npos) << msg;
  msg = error_for(R"({"txt": "a"})");
  EXPECT_NE(msg.find("none of the keys"), std::string::npos) << msg;
  msg = error_for(R"({"text": 5})");
  EXPECT_NE(msg.find("\"text\" is not a string"), std::string::npos) << msg;
  msg = error_for(ok + "\n" + R"({"text": "a"})");
  EXPECT_NE(msg.find(":2: is text but line 1 is conversational"), std::string::npos) << msg;
  msg = error_for("\n\n");
  EXPECT_NE(msg.find("holds no examples"), std::string::npos) << msg;
}

TEST(ChatData, TemplateAndSpecialTokensComeFromTheConfig) {
  TempDir d;
  write_model(d.path());
  const ChatTemplate t = load_chat_template(d.path(), "");
  EXPECT_EQ(t.eos_token, "<|im_end|>");            // an AddedToken dict
  EXPECT_FALSE(t.specials.contains("bos_token"));  // null: not set
  const Json msgs = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(render_messages(t, msgs, nullptr, true),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // --template replaces it; a list of named templates gives the "default" one.
  write_file(d.path("other.jinja"), "{{ eos_token }}{{ tools is none }}{{ documents is none }}");
  EXPECT_EQ(render_messages(load_chat_template(d.path(), d.path("other.jinja")), msgs, nullptr, false),
            "<|im_end|>TrueTrue");
  write_file(d.path("tokenizer_config.json"),
             R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(render_messages(load_chat_template(d.path(), ""), msgs, nullptr, false), "D");
  write_file(d.path("tokenizer_config.json"), R"({"eos_token": "</s>"})");
  EXPECT_NE(user_error([&] { load_chat_template(d.path(), ""); }).find("has no \"chat_template\""), std::string::npos);
  // transformers 5 saves the template beside the config, as chat_template.jinja, and prefers it.
  write_file(d.path("tokenizer_config.json"), R"({"eos_token": "</s>", "chat_template": "old"})");
  write_file(d.path("chat_template.jinja"), "{{ eos_token }}{{ messages | length }}");
  const ChatTemplate j = load_chat_template(d.path(), "");
  EXPECT_EQ(render_messages(j, msgs, nullptr, false), "</s>1");
  EXPECT_EQ(j.source, d.path("chat_template.jinja"));
}

TEST(ChatData, AssistantSpansAreTheAssistantTurns) {
  TempDir d;
  write_model(d.path());
  const ChatTemplate t = load_chat_template(d.path(), "");
  const ChatExample ex = parse_chat_line(R"({"messages": [{"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"},
      {"role": "assistant", "content": "6"}]})",
                                         "f:1");
  const RenderedExample r = render_example(t, ex, "assistant", "f:1");
  ASSERT_EQ(r.targets.size(), 2u);
  // Each assistant turn from after its "<|im_start|>assistant\n" through its end of turn.
  EXPECT_EQ(r.text.substr(r.targets[0].first, r.targets[0].second - r.targets[0].first), "4<|im_end|>\n");
  EXPECT_EQ(r.text.substr(r.targets[1].first, r.targets[1].second - r.targets[1].first), "6<|im_end|>\n");
  const RenderedExample all = render_example(t, ex, "all", "f:1");
  ASSERT_EQ(all.targets.size(), 1u);
  EXPECT_EQ(all.targets[0], std::make_pair(size_t{0}, r.text.size()));
  EXPECT_NE(user_error([&] { render_example(t, ex, "completion", "f:1"); }).find("--loss-on"), std::string::npos);
}

TEST(ChatData, ATemplateThatRewritesEarlierTurnsIsRefusedForAssistantLoss) {
  // The last assistant turn keeps its reasoning, earlier ones lose it (as Qwen3's template
  // does): the rendering of a prefix is not the start of the whole, so the turns cannot be found.
  TempDir d;
  write_model(d.path(),
              "{% for m in messages %}{% set c = m.content %}{% if not loop.last %}"
              "{% set c = c.split('</think>')[-1] %}{% endif %}<{{ m.role }}>{{ c }}{% endfor %}"
              "{% if add_generation_prompt %}<assistant>{% endif %}");
  const ChatTemplate t = load_chat_template(d.path(), "");
  const ChatExample ex = parse_chat_line(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "<think>x</think>b"}, {"role": "user", "content": "c"}]})",
                                         "data.jsonl:4");
  const std::string msg = user_error([&] { render_example(t, ex, "assistant", "data.jsonl:4"); });
  EXPECT_EQ(where_of(msg), "data.jsonl:4") << msg;
  EXPECT_NE(msg.find("assistant turn 1"), std::string::npos) << msg;
  EXPECT_EQ(render_example(t, ex, "all", "data.jsonl:4").text, "<user>a<assistant>b<user>c");
}

// A Qwen3-like template written for the test: earlier assistant turns lose their reasoning, and
// {% generation %} blocks mark the assistant's text, as transformers' return_assistant_tokens_mask
// reads them.
const char* kReasoningTemplate =
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set c = m.content %}{% if loop.index0 < messages | length - 1 %}{% set c = c.split('</think>')[-1] %}"
    "{% endif %}<|im_start|>assistant\n{% generation %}{{ c }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(ChatData, GenerationBlocksAreTheAssistantMask) {
  TempDir d;
  write_model(d.path(), kReasoningTemplate);
  const ChatTemplate t = load_chat_template(d.path(), "");
  const ChatExample ex = parse_chat_line(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "<think>x</think>b"}, {"role": "user", "content": "c"},
      {"role": "assistant", "content": "<think>y</think>d"}]})",
                                         "f:1");
  const RenderedExample r = render_example(t, ex, "assistant", "f:1");
  EXPECT_EQ(r.text,
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
            "<|im_start|>assistant\n<think>y</think>d<|im_end|>\n");
  jinja::Spans spans;
  render_messages(t, ex.messages, nullptr, false, &spans);
  EXPECT_EQ(r.targets, spans);
  ASSERT_EQ(r.targets.size(), 2u);
  // The earlier turn as rendered (its reasoning dropped), the last one whole.
  EXPECT_EQ(r.text.substr(r.targets[0].first, r.targets[0].second - r.targets[0].first), "b<|im_end|>");
  EXPECT_EQ(r.text.substr(r.targets[1].first, r.targets[1].second - r.targets[1].first), "<think>y</think>d<|im_end|>");
  // --loss-on all ignores the blocks.
  EXPECT_EQ(render_example(t, ex, "all", "f:1").targets, (jinja::Spans{{0, r.text.size()}}));
}

TEST(ChatData, TemplateErrorsNameTheDataLine) {
  TempDir d;
  write_model(d.path(), "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}x");
  const ChatTemplate t = load_chat_template(d.path(), "");
  const ChatExample ex = parse_chat_line(R"({"messages": [{"role": "assistant", "content": "a"}]})", "d.jsonl:9");
  const std::string msg = user_error([&] { render_example(t, ex, "all", "d.jsonl:9"); });
  EXPECT_EQ(where_of(msg), "d.jsonl:9") << msg;
  EXPECT_NE(msg.find("user first"), std::string::npos) << msg;
}

TEST(ChatData, PromptCompletionAndTextGetTheEos) {
  TempDir d;
  write_model(d.path());
  const ChatTemplate t = load_chat_template(d.path(), "");
  const RenderedExample pc =
      render_example(t, parse_chat_line(R"({"prompt": "2+2=", "completion": "4"})", "f:1"), "completion", "f:1");
  EXPECT_EQ(pc.text, "2+2=4<|im_end|>");
  ASSERT_EQ(pc.targets.size(), 1u);
  EXPECT_EQ(pc.targets[0], std::make_pair(size_t{4}, pc.text.size()));
  // A completion that already ends with the EOS gets no second one.
  EXPECT_EQ(
      render_example(t, parse_chat_line(R"({"prompt": "a", "completion": "b<|im_end|>"})", "f:1"), "completion", "f:1")
          .text,
      "ab<|im_end|>");
  const RenderedExample tx = render_example(t, parse_chat_line(R"({"text": "hello"})", "f:1"), "all", "f:1");
  EXPECT_EQ(tx.text, "hello<|im_end|>");
  EXPECT_NE(user_error([&] {
              render_example(t, parse_chat_line(R"({"text": "x"})", "f:1"), "assistant", "f:1");
            }).find("text data does not have"),
            std::string::npos);
  // Conversational prompt-completion: template(prompt, generation prompt) then the completion.
  const RenderedExample cpc = render_example(t,
                                             parse_chat_line(R"({"prompt": [{"role": "user", "content": "Q"}],
                          "completion": [{"role": "assistant", "content": "A"}]})",
                                                             "f:1"),
                                             "completion", "f:1");
  ASSERT_EQ(cpc.targets.size(), 1u);
  EXPECT_EQ(cpc.text.substr(cpc.targets[0].first), "A<|im_end|>\n");
}

// TRL appends the tokenizer's eos_token; loom finds it where transformers keeps it, and where
// a model directory without tokenizer_config.json still names it.
TEST(ChatData, TheEosComesFromTheModelsFiles) {
  TempDir d;
  write_model(d.path());
  const auto tok = HfTokenizer::load(d.path());
  EXPECT_EQ(resolve_eos_token(d.path(), "", tok.get()), "<|im_end|>");          // tokenizer_config.json
  EXPECT_EQ(resolve_eos_token(d.path(), "<|im_start|>", tok.get()), "<|im_start|>");  // --eos-token first
  std::filesystem::remove(d.path("tokenizer_config.json"));
  write_file(d.path("config.json"), R"({"eos_token_id": [0, 7]})");
  EXPECT_EQ(resolve_eos_token(d.path(), "", tok.get()), "<|endoftext|>");  // an id, spelled by the tokenizer
  EXPECT_EQ(resolve_eos_token(d.path(), "", nullptr), "<|endoftext|>");    // which is loaded when not given
  write_file(d.path("special_tokens_map.json"), R"({"eos_token": {"content": "<|im_end|>"}})");
  EXPECT_EQ(resolve_eos_token(d.path(), "", tok.get()), "<|im_end|>");
  EXPECT_EQ(load_chat_template(d.path(), d.path("special_tokens_map.json")).specials["eos_token"], "<|im_end|>");
  std::filesystem::remove(d.path("special_tokens_map.json"));
  std::filesystem::remove(d.path("config.json"));
  write_file(d.path("generation_config.json"), R"({"eos_token_id": 320})");
  EXPECT_EQ(resolve_eos_token(d.path(), "", tok.get()), "<|im_start|>");
  std::filesystem::remove(d.path("generation_config.json"));
  try {
    resolve_eos_token(d.path(), "", tok.get());
    ADD_FAILURE() << "no eos anywhere is a UserError";
  } catch (const UserError& e) {
    const std::string none = std::string(e.what()) + " / " + e.hint();
    for (const char* named : {"tokenizer_config.json", "special_tokens_map.json", "config.json", "--eos-token"})
      EXPECT_NE(none.find(named), std::string::npos) << none;
  }
  // TRL refuses an eos_token outside the vocabulary.
  EXPECT_NE(user_error([&] { resolve_eos_token(d.path(), "</s>", tok.get()); }).find("not one"), std::string::npos);
}

// Text needs no template: a model directory with only tokenizer.json and config.json prepares it,
// and every example ends with the eos.
TEST(ChatData, TextNeedsNoTemplateAndEndsWithTheEos) {
  TempDir d;
  write_model(d.path());
  std::filesystem::remove(d.path("tokenizer_config.json"));
  write_file(d.path("config.json"), R"({"eos_token_id": 0})");
  write_file(d.path("data.jsonl"),
             "{\"text\": \"one two\"}\n{\"text\": \"three<|endoftext|>\"}\n{\"text\": \"four\"}\n{\"text\": \"five\"}\n");
  ChatOptions o{d.path(), d.path("data.jsonl"), d.path("out"), "", "", 0.25};
  const PreparedChat r = prepare_chat(o);
  EXPECT_EQ(r.eos_token, "<|endoftext|>");
  const auto tok = HfTokenizer::load(d.path());
  const ChatSplit train = open_chat_split(d.path("out"), "train");
  ASSERT_EQ(train.docs.size(), 4u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(train.tokens[train.docs[k + 1] - 1], 0) << k;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < train.tokens.size(); ++i) ids.push_back(train.tokens[i]);
  // "three<|endoftext|>" already ends with it: no second one.
  EXPECT_EQ(tok->decode(ids), "one two<|endoftext|>three<|endoftext|>four<|endoftext|>");
  EXPECT_TRUE(Json::parse(read_file(d.path("out/meta.json")))["chat"]["template"].is_null());
  // Conversations do need the template, and say where it was looked for.
  write_file(d.path("chat.jsonl"), R"({"messages": [{"role": "user", "content": "Hi"}]})"
                                   "\n");
  o.data_path = d.path("chat.jsonl");
  EXPECT_NE(user_error([&] { prepare_chat(o); }).find("tokenizer_config.json"), std::string::npos);
}

// Text and string prompt-completion examples are tokenized as TRL tokenizes them, with the
// tokenizer's special tokens: Gemma's post-processor puts <bos> first (no target); Qwen2's has none.
TEST(ChatData, TextAndStringPromptsStartWithThePostProcessorsBos) {
  TempDir d;
  write_file(d.path("text.jsonl"), "{\"text\": \"one two\"}\n{\"text\": \"three\"}\n");
  write_file(d.path("pc.jsonl"), "{\"prompt\": \"one\", \"completion\": \" two\"}\n"
                                 "{\"prompt\": \"three\", \"completion\": \" four\"}\n");
  for (const char* model : {"gemma3", "qwen2_tied"}) {
    const std::string dir = testing::hf_golden(model);
    const auto tok = HfTokenizer::load(dir);
    const std::vector<int32_t> lead = tok->leading_special_ids();
    if (std::string(model) == "gemma3") {
      ASSERT_EQ(lead.size(), 1u);
      EXPECT_EQ(tok->decode(lead), "<bos>");
    } else {
      EXPECT_TRUE(lead.empty());
    }
    for (const char* data : {"text", "pc"}) {
      const std::string out = d.path(std::string(model) + "_" + data);
      ChatOptions o{dir, d.path(std::string(data) + ".jsonl"), out, "", "", 0.5};
      prepare_chat(o);
      const ChatSplit train = open_chat_split(out, "train");
      ASSERT_GT(train.tokens.size(), static_cast<int64_t>(lead.size()));
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < train.tokens.size(); ++i) ids.push_back(train.tokens[i]);
      EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(lead.size())), lead) << model << data;
      EXPECT_EQ(ids[lead.size()], tok->encode("one two")[0]) << model << " " << data;
      for (size_t k = 0; k < lead.size() && !train.mask.empty(); ++k) EXPECT_EQ(train.mask[k], 0) << model << data;
    }
  }
}

TEST(ChatData, MaskMarksTheTokensOfTheSpans) {
  TempDir d;
  write_model(d.path());
  const auto tok = HfTokenizer::load(d.path());
  RenderedExample r;
  r.text = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nGeneral Kenobi<|im_end|>\n";
  const std::string answer = "General Kenobi<|im_end|>\n";
  const size_t at = r.text.find(answer);
  r.targets = {{at, r.text.size()}};
  const TokenizedExample te = tokenize_example(*tok, r);
  EXPECT_EQ(te.ids, tok->encode(r.text));  // the text is tokenized whole
  ASSERT_EQ(te.mask.size(), te.ids.size());
  std::vector<int32_t> targets, context;
  for (size_t k = 0; k < te.ids.size(); ++k) (te.mask[k] ? targets : context).push_back(te.ids[k]);
  EXPECT_EQ(tok->decode(targets), answer);
  EXPECT_EQ(tok->decode(context), r.text.substr(0, at));
}

TEST(ChatData, PrepareWritesTokensMasksAndBoundaries) {
  TempDir d;
  write_model(d.path());
  std::string lines;
  for (int k = 0; k < 10; ++k)
    lines += R"({"messages": [{"role": "user", "content": "What is )" + std::to_string(k) + R"( + 1?"}, )" +
             R"({"role": "assistant", "content": ")" + std::to_string(k + 1) + R"("}]})" + "\n";
  write_file(d.path("data.jsonl"), lines);
  ChatOptions o{d.path(), d.path("data.jsonl"), d.path("out"), "", "", 0.2};
  o.block_size = 100;
  const PreparedChat r = prepare_chat(o);
  EXPECT_EQ(r.examples[0], 8);
  EXPECT_EQ(r.examples[1], 2);
  EXPECT_EQ(r.loss_on, "assistant");

  const auto tok = HfTokenizer::load(d.path());
  const TokenMeta meta = read_token_meta(d.path("out"));  // what every reader of token data reads
  EXPECT_EQ(meta.train_tokens, r.tokens[0]);
  const Json chat = Json::parse(read_file(d.path("out/meta.json")))["chat"];
  EXPECT_EQ(chat["data_format"], "conversational");
  EXPECT_EQ(chat["train_target_tokens"], r.targets[0]);
  EXPECT_EQ(chat["val_examples"], 2);
  const TokenFile train = TokenFile::open_split(d.path("out"), "train");
  const std::string mask = read_file(d.path("out/train_mask.bin"));
  const std::string docs = read_file(d.path("out/train_docs.bin"));
  ASSERT_EQ(static_cast<int64_t>(mask.size()), train.size());
  ASSERT_EQ(docs.size(), 9u * 8u);
  auto doc = [&](size_t k) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = v << 8 | static_cast<unsigned char>(docs[k * 8 + static_cast<size_t>(b)]);
    return static_cast<int64_t>(v);
  };
  EXPECT_EQ(doc(0), 0);
  EXPECT_EQ(doc(8), train.size());
  // Each example is its conversation's tokens, and its targets spell the answer and end of turn.
  int64_t targets = 0;
  for (size_t k = 0; k < 8; ++k) {
    std::vector<int32_t> ids, target_ids;
    for (int64_t i = doc(k); i < doc(k + 1); ++i) {
      ids.push_back(train[i]);
      if (mask[static_cast<size_t>(i)] == 1) target_ids.push_back(train[i]);
      targets += mask[static_cast<size_t>(i)];
    }
    EXPECT_EQ(tok->decode(ids), "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is " +
                                    std::to_string(k) + " + 1?<|im_end|>\n<|im_start|>assistant\n" +
                                    std::to_string(k + 1) + "<|im_end|>\n");
    EXPECT_EQ(tok->decode(target_ids), std::to_string(k + 1) + "<|im_end|>\n");
  }
  EXPECT_EQ(targets, r.targets[0]);
  // The packing report at the block size: examples of n tokens take n − 1 positions; packed,
  // rows fill in order while the next example fits; unpacked, one row each.
  int64_t used = 0, rows = 0, fill = o.block_size;
  for (size_t k = 0; k < 8; ++k) {
    const int64_t n = doc(k + 1) - doc(k) - 1;
    ASSERT_LE(n, o.block_size);
    used += n;
    if (fill + n > o.block_size) {
      ++rows;
      fill = 0;
    }
    fill += n;
  }
  EXPECT_EQ(r.packed[0].rows(), rows);
  EXPECT_EQ(r.padded[0].rows(), 8);
  EXPECT_DOUBLE_EQ(r.packed[0].efficiency(), static_cast<double>(used) / static_cast<double>(rows * o.block_size));
  EXPECT_DOUBLE_EQ(r.padded[0].efficiency(), static_cast<double>(used) / static_cast<double>(8 * o.block_size));
  EXPECT_GT(rows, 1);
  EXPECT_LT(rows, 8);
}

TEST(ChatData, AFailedPrepareLeavesTheOutputAsItWas) {
  TempDir d;
  write_model(d.path());
  const std::string good = R"({"text": "one"})"
                           "\n"
                           R"({"text": "two"})"
                           "\n";
  write_file(d.path("data.jsonl"), good);
  ChatOptions o{d.path(), d.path("data.jsonl"), d.path("out"), "", "", 0.5};
  prepare_chat(o);
  const std::string before = read_file(d.path("out/train.bin"));
  // A bad line, found after the good ones: nothing is written, the old directory stays whole.
  write_file(d.path("data.jsonl"), good + R"({"text": "three", })" + "\n");
  EXPECT_NE(user_error([&] { prepare_chat(o); }).find("data.jsonl:3"), std::string::npos);
  EXPECT_EQ(read_file(d.path("out/train.bin")), before);
  // Preparing again replaces the data directory whole and leaves no scratch directories.
  write_file(d.path("data.jsonl"), R"({"text": "uno"})"
                                   "\n"
                                   R"({"text": "dos"})"
                                   "\n");
  prepare_chat(o);
  EXPECT_NE(read_file(d.path("out/train.bin")), before);
  for (const auto& e : std::filesystem::directory_iterator(d.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    EXPECT_EQ(e.path().filename().string().find(".old"), std::string::npos) << e.path();
  }
  // A directory holding other files is not replaced.
  std::filesystem::create_directory(d.path("mine"));
  write_file(d.path("mine/notes.txt"), "keep");
  o.out_dir = d.path("mine");
  EXPECT_NE(user_error([&] { prepare_chat(o); }).find("notes.txt"), std::string::npos);
  EXPECT_EQ(read_file(d.path("mine/notes.txt")), "keep");
  EXPECT_FALSE(std::filesystem::exists(d.path("mine/meta.json")));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(ChatData, OpenChatSplitChecksTheFilesAgainstEachOther) {
  TempDir d;
  write_model(d.path());
  write_file(d.path("data.jsonl"), R"({"prompt": "1+1=", "completion": "2"})"
                                   "\n"
                                   R"({"prompt": "2+2=", "completion": "4"})"
                                   "\n"
                                   R"({"prompt": "3+3=", "completion": "6"})"
                                   "\n");
  const PreparedChat r = prepare_chat({d.path(), d.path("data.jsonl"), d.path("out"), "", "", 0.4});
  const ChatSplit s = open_chat_split(d.path("out"), "train");
  EXPECT_EQ(s.tokens.size(), r.tokens[0]);
  EXPECT_EQ(s.targets, r.targets[0]);
  EXPECT_EQ(s.docs.size(), static_cast<size_t>(r.examples[0]) + 1);
  // The first example's targets are its completion and EOS: "2<|im_end|>".
  const auto tok = HfTokenizer::load(d.path());
  std::vector<int32_t> first;
  for (int64_t i = s.docs[0]; i < s.docs[1]; ++i)
    if (s.mask[static_cast<size_t>(i)]) first.push_back(s.tokens[i]);
  EXPECT_EQ(tok->decode(first), "2<|im_end|>");

  const std::string mask = read_file(d.path("out/train_mask.bin"));
  write_file(d.path("out/train_mask.bin"), mask.substr(1));
  EXPECT_NE(user_error([&] { open_chat_split(d.path("out"), "train"); }).find("train_mask.bin: has"),
            std::string::npos);
  write_file(d.path("out/train_mask.bin"), std::string(mask.size(), '\2'));
  EXPECT_NE(user_error([&] { open_chat_split(d.path("out"), "train"); }).find("byte 0 is not 0 or 1"),
            std::string::npos);
  write_file(d.path("out/train_mask.bin"), std::string(mask.size(), '\1'));
  EXPECT_NE(user_error([&] { open_chat_split(d.path("out"), "train"); }).find("but meta.json says"), std::string::npos);
  write_file(d.path("out/train_mask.bin"), mask);
  const std::string docs = read_file(d.path("out/train_docs.bin"));
  std::string short_docs = docs;  // the last offset one token short
  for (size_t b = docs.size() - 8; b < docs.size() && short_docs[b]-- == '\0';) ++b;
  write_file(d.path("out/train_docs.bin"), short_docs);
  EXPECT_NE(user_error([&] { open_chat_split(d.path("out"), "train"); }).find("not at the token count"),
            std::string::npos);
  // Token data from `loom prepare char` has no masks.
  write_file(d.path("text.txt"), "some text to split into two parts\n");
  prepare_dataset(TokenizerKind::char_, d.path("text.txt"), d.path("plain"));
  EXPECT_NE(user_error([&] { open_chat_split(d.path("plain"), "train"); }).find("has no \"chat\" entry"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
