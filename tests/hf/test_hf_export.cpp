// `loom export hf` (src/train/hf_export.h): a run started from a fixture (GPT-2, Llama with a tied
// and with an untied head, Llama 3.1's rope scaling, Qwen2 tied and untied, Mistral, Qwen3, Gemma 3), trained a few
// steps, exported and imported again has bit-identical parameters; an export of the unchanged fixture is the fixture's
// model.safetensors tensor for tensor; config.json and tokenizer.json describe the model as transformers wrote it.
// (transformers loading the export and matching loom's greedy text was checked by hand with tools/check_hf_export.py:
// docs/ARCHITECTURE.md.)
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "data/hf_tokenizer.h"
#include "io/safetensors.h"
#include "support/files.h"
#include "train/checkpoint.h"
#include "train/hf_export.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::hf_golden;
using testing::read_file;
using testing::TempDir;
using testing::user_error;
using testing::write_file;

// A loom checkpoint of fixture `fixture` after `steps` AdamW steps on random tokens, saved with
// the fixture's tokenizer and in the stacked layout (model.scan_layers), in dir/ckpt.
// `model_dir` (a Hugging Face directory) replaces the fixture when given; the checkpoint's tokenizer
// is then `data_tokenizer` (a tokenizer.json or a directory) when given, else the model's.
std::unique_ptr<Trainer> trained_checkpoint(Backend& be, const std::string& dir, int steps,
                                            const std::string& fixture = "gpt2", std::string model_dir = "",
                                            std::string data_tokenizer = "") {
  if (model_dir.empty()) model_dir = hf_golden(fixture);
  if (data_tokenizer.empty()) data_tokenizer = model_dir;
  const Config c = default_config({"model.init_from=" + model_dir, "model.scan_layers=true", "device=cpu",
                                   "data.kind=random_tokens", "data.batch_size=2", "data.seq_len=16",
                                   "data.vocab_size=320", "optimizer.name=adamw", "optimizer.learning_rate=0.01"});
  auto t = std::make_unique<Trainer>(c, be);
  ModelSource(c.model.init_from).load_params(t->executor());
  const Batch b = make_batch(c.data, data_context(c));
  for (int i = 0; i < steps; ++i) t->step(b);
  const nlohmann::json tok = HfTokenizer::load(data_tokenizer)->to_json();
  const CheckpointState st{.config_toml = config_to_toml(c), .step = steps};
  EXPECT_TRUE(save_checkpoint(*t, st, (fs::path(dir) / "ckpt").string(), &tok).saved);
  return t;
}

class HfExportOf : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, HfExportOf,
                         ::testing::Values("gpt2", "llama_tied", "llama_untied", "llama3", "qwen2_tied", "qwen2_untied",
                                           "mistral", "qwen3", "gemma3"));

TEST_P(HfExportOf, RoundTripIsBitIdentical) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  const auto trained = trained_checkpoint(*be, d.path(), 3, GetParam());
  const HfExport r = export_hf(d.path("ckpt"), d.path("out"));
  const nlohmann::json want = nlohmann::json::parse(read_file(hf_golden(GetParam() + "/config.json")));
  EXPECT_EQ(r.architecture, want["architectures"][0]);
  // The chat models' fixtures bring their tokenizer_config.json and template along, and the export
  // a generation_config.json that lists the template's end of turn.
  std::vector<std::string> files = {"model.safetensors", "config.json", "tokenizer.json"};
  if (fs::exists(hf_golden(GetParam() + "/chat_template.jinja")))
    files.insert(files.end(), {"tokenizer_config.json", "chat_template.jinja", "generation_config.json"});
  EXPECT_EQ(r.files, files);
  EXPECT_TRUE(r.tokenizer_note.empty());

  // config.json says what transformers' own said, key for key (bos and eos too: the run started
  // from the fixture, whose Llama bos and eos differ).
  const nlohmann::json cfg = nlohmann::json::parse(read_file(d.path("out/config.json")));
  EXPECT_EQ(cfg["eos_token_id"], want["eos_token_id"]);
  int keys = 0;
  for (const auto& [key, value] : want.items()) {
    if (key == "transformers_version" || !cfg.contains(key)) continue;
    EXPECT_EQ(cfg[key], value) << key;
    // transformers' config classes check types: 12.0 is no int.
    EXPECT_EQ(cfg[key].is_number_integer(), value.is_number_integer()) << key;
    ++keys;
  }
  EXPECT_GE(keys, 15);
  EXPECT_EQ(nlohmann::json::parse(read_file(d.path("out/tokenizer.json"))),
            nlohmann::json::parse(read_file(hf_golden(GetParam() + "/tokenizer.json"))));

  // Import the export: every parameter is the trained one, bit for bit.
  Trainer back(default_config({"model.init_from=" + d.path("out"), "device=cpu", "data.kind=random_tokens",
                               "data.batch_size=2", "data.seq_len=16", "data.vocab_size=320"}),
               *be);
  ModelSource(d.path("out")).load_params(back.executor());
  int n = 0;
  for (const Param& p : trained->model().graph.params()) {
    const std::string& path = trained->model().graph.value(p.value).name;
    EXPECT_EQ(back.param(path), trained->param(path)) << path;
    ++n;
  }
  // GPT-2: wte, wpe, 12 per block, ln_f; Llama-style: the embedding, 7 per block (and Qwen2's q/k/v
  // bias, Qwen3's q/k norms, Gemma 3's q/k norms and two more norms), the final norm and an untied head.
  const bool untied = GetParam().ends_with("untied") || GetParam() == "llama3" || GetParam() == "mistral";
  const int per_block = GetParam().starts_with("qwen2") ? 8
                        : GetParam() == "qwen3"         ? 9
                        : GetParam() == "gemma3"        ? 11
                                                        : 7;
  const int layers = want.value("num_hidden_layers", want.value("n_layer", 0));
  EXPECT_EQ(n, GetParam() == "gpt2" ? 2 + layers * 12 + 2 : 1 + layers * per_block + 1 + untied);
}

TEST_P(HfExportOf, AnUnchangedImportExportsTheSameTensors) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  trained_checkpoint(*be, d.path(), 0, GetParam());
  export_hf(d.path("ckpt"), d.path("out"));
  std::map<std::string, StTensor> want;
  for (StTensor& t : read_safetensors(hf_golden(GetParam() + "/model.safetensors"))) want.emplace(t.name, std::move(t));
  const std::vector<StTensor> got = read_safetensors(d.path("out/model.safetensors"));
  EXPECT_EQ(got.size(), want.size());
  for (const StTensor& t : got) {
    ASSERT_TRUE(want.count(t.name)) << t.name;
    EXPECT_EQ(t.dtype, DType::f32) << t.name;
    EXPECT_EQ(t.shape, want.at(t.name).shape) << t.name;
    EXPECT_EQ(t.bytes, want.at(t.name).bytes) << t.name;
  }
}

// A chat template whose turns end with the fixture's <|endoftext|> (id 2; its eos_token
// <|end_of_text|> is id 1).
constexpr const char* kChatTemplate =
    "{% for m in messages %}<|begin_of_text|>{{ m['role'] }}\n{{ m['content'] | trim }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|begin_of_text|>assistant\n{% endif %}";

// A chat model's directory as transformers 5 saves one: the llama_tied fixture with the files kept
// beside the tokenizer (the chat template, special tokens, generation defaults), by name.
std::map<std::string, std::string> chat_model_dir(const std::string& dir) {
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::copy_file(hf_golden(std::string("llama_tied/") + f), fs::path(dir) / f);
  const std::map<std::string, std::string> companions = {
      // An integer no double holds: the files travel as text, not through a parser.
      {"tokenizer_config.json",
       "{\n  \"bos_token\": \"<|begin_of_text|>\",\n  \"eos_token\": \"<|end_of_text|>\",\n"
       "  \"model_max_length\": 1000000000000000019884624838656,\n"
       "  \"tokenizer_class\": \"TokenizersBackend\"\n}\n"},
      {"special_tokens_map.json", "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}"},
      {"chat_template.jinja", kChatTemplate},
      // The model's own list, holding the template's end of turn (2) and the eos (1) already.
      {"generation_config.json", "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3, 1], \"temperature\": 0.6}\n"}};
  for (const auto& [name, text] : companions) write_file((fs::path(dir) / name).string(), text);
  return companions;
}

TEST(HfExport, CarriesTheChatTemplateAndGenerationDefaults) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  const auto companions = chat_model_dir(d.path("chat_model"));
  // Data prepared with the model's directory: the files travel in the data's tokenizer, then in
  // the checkpoint's, into the export.
  trained_checkpoint(*be, d.path(), 1, "", d.path("chat_model"));
  for (const auto& [name, text] : companions) fs::remove(d.path("chat_model/" + name));  // only the run has them
  HfExport r = export_hf(d.path("ckpt"), d.path("out"));
  EXPECT_EQ(r.files,
            (std::vector<std::string>{"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                                      "special_tokens_map.json", "chat_template.jinja", "generation_config.json"}));
  for (const auto& [name, text] : companions) EXPECT_EQ(read_file(d.path("out/" + name)), text) << name;

  // Data prepared with the bare tokenizer.json copied elsewhere: the same tokens (fine-tuning is
  // allowed), and the export takes the files from model.init_from's directory.
  chat_model_dir(d.path("chat_model2"));
  fs::create_directories(d.path("bare"));
  fs::copy_file(d.path("chat_model2/tokenizer.json"), d.path("bare/tokenizer.json"));
  EXPECT_TRUE(
      same_tokens(HfTokenizer::load(d.path("bare"))->to_json(), HfTokenizer::load(d.path("chat_model2"))->to_json()));
  fs::remove_all(d.path("ckpt"));
  trained_checkpoint(*be, d.path(), 1, "", d.path("chat_model2"), d.path("bare"));
  r = export_hf(d.path("ckpt"), d.path("out2"));
  EXPECT_EQ(r.files.size(), 7u);
  for (const auto& [name, text] : companions) EXPECT_EQ(read_file(d.path("out2/" + name)), text) << name;
}

nlohmann::ordered_json read_json(const std::string& path) { return nlohmann::ordered_json::parse(read_file(path)); }

// A chat run as `loom prepare chat` and `loom train` make one: a Llama-style model from random
// weights (no model.init_from), saved with `tokenizer_dir`'s tokenizer and the files beside it.
void chat_run_checkpoint(Backend& be, const std::string& dir, const std::string& tokenizer_dir) {
  const Config c =
      default_config({"model.kind=transformer", "model.block_order=attn_first", "model.norm=rmsnorm",
                      "model.mlp=swiglu", "model.position=rope", "model.use_bias=false", "model.tie_embeddings=true",
                      "model.hidden_size=16", "model.head_dim=8", "model.num_layers=1", "model.intermediate_size=32",
                      "model.vocab_size=321", "model.num_outputs=321", "model.max_seq_len=8", "device=cpu",
                      "data.kind=random_tokens", "data.vocab_size=321", "data.seq_len=8"});
  Trainer t(c, be);
  const nlohmann::json tok = HfTokenizer::load(tokenizer_dir)->to_json();
  ASSERT_TRUE(save_checkpoint(t, CheckpointState{.config_toml = config_to_toml(c)}, dir, &tok).saved);
}

// transformers' generate() stops at generation_config.json's eos_token_id: an export whose
// tokenizer carries a chat template lists the template's end of turn there (2: what it writes after
// an assistant's content) and the tokenizer's eos (1), and config.json names them too, not the
// start token (0, the bos).
TEST(HfExport, AChatRunsEosIsTheTemplatesEndOfTurn) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  chat_model_dir(d.path("chat_model"));
  fs::remove(d.path("chat_model/generation_config.json"));
  chat_run_checkpoint(*be, d.path("ckpt"), d.path("chat_model"));
  const HfExport r = export_hf(d.path("ckpt"), d.path("out"));
  EXPECT_EQ(r.files.back(), "generation_config.json");
  EXPECT_EQ(r.end_of_turn_note, "");
  const nlohmann::ordered_json gen = read_json(d.path("out/generation_config.json"));
  EXPECT_EQ(gen, nlohmann::ordered_json::parse(R"({"eos_token_id": [2, 1], "bos_token_id": 0})")) << gen.dump();
  const nlohmann::ordered_json config = read_json(d.path("out/config.json"));
  EXPECT_EQ(config["eos_token_id"], gen["eos_token_id"]);
  EXPECT_EQ(config["bos_token_id"], 0);
  // Without a template nothing names an end of turn: the start token stays config.json's eos, and
  // no generation_config.json is made up.
  fs::remove(d.path("chat_model/chat_template.jinja"));
  fs::remove_all(d.path("ckpt"));
  chat_run_checkpoint(*be, d.path("ckpt"), d.path("chat_model"));
  export_hf(d.path("ckpt"), d.path("plain"));
  EXPECT_FALSE(fs::exists(d.path("plain/generation_config.json")));
  EXPECT_EQ(read_json(d.path("plain/config.json"))["eos_token_id"], 0);
}

// A model's own eos list (config.json's and generation_config.json's) is kept, in its order, with
// the template's end of turn and the tokenizer's eos added where it lacks them, and its other fields
// unchanged. (CarriesTheChatTemplateAndGenerationDefaults: a complete list stays byte for byte.)
TEST(HfExport, AModelsOwnEosListIsKeptAndCompleted) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  chat_model_dir(d.path("chat_model"));
  write_file(d.path("chat_model/generation_config.json"),
             R"({"temperature": 0.6, "eos_token_id": 3, "top_p": 0.9, "pad_token_id": 3})");
  nlohmann::ordered_json config = read_json(d.path("chat_model/config.json"));
  config["eos_token_id"] = {3, 1};
  write_file(d.path("chat_model/config.json"), config.dump(2));
  trained_checkpoint(*be, d.path(), 1, "", d.path("chat_model"));
  export_hf(d.path("ckpt"), d.path("out"));
  EXPECT_EQ(
      read_json(d.path("out/generation_config.json")),
      nlohmann::ordered_json::parse(
          R"({"temperature": 0.6, "eos_token_id": [3, 2, 1], "top_p": 0.9, "pad_token_id": 3, "bos_token_id": 0})"));
  EXPECT_EQ(read_json(d.path("out/config.json"))["eos_token_id"], nlohmann::ordered_json({3, 1}));
}

// A template loom's Jinja cannot read does not stop the export: the files travel as they were, and
// the export says why generation_config.json names no end of turn.
TEST(HfExport, AnUnreadableTemplateIsCarriedAndNamed) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  const auto companions = chat_model_dir(d.path("chat_model"));
  write_file(d.path("chat_model/chat_template.jinja"), "{% filter upper %}{{ messages }}{% endfilter %}");
  trained_checkpoint(*be, d.path(), 1, "", d.path("chat_model"));
  const HfExport r = export_hf(d.path("ckpt"), d.path("out"));
  EXPECT_NE(r.end_of_turn_note.find("chat_template.jinja"), std::string::npos) << r.end_of_turn_note;
  EXPECT_EQ(read_file(d.path("out/generation_config.json")), companions.at("generation_config.json"));
}

TEST(HfExport, AMalformedCompanionFileIsNamed) {
  TempDir d;
  chat_model_dir(d.path("m"));
  write_file(d.path("m/generation_config.json"), "{\"eos_token_id\": ");
  const std::string m = user_error([&] { HfTokenizer::load(d.path("m")); });
  EXPECT_NE(m.find("generation_config.json: is not valid JSON"), std::string::npos) << m;
}

TEST(HfExport, ABiasFreeModelIsGpt2WithZeroBiases) {
  // nanoGPT's bias=False (the default main job's blocks): exported with zero biases, it imports as
  // GPT-2 with the same parameters and the same loss.
  TempDir d;
  auto be = make_backend(Device::cpu);
  const std::vector<std::string> data = {
      "device=cpu",         "data.kind=random_tokens", "data.batch_size=2",        "data.seq_len=8",
      "data.vocab_size=12", "optimizer.name=sgd",      "optimizer.learning_rate=0"};
  std::vector<std::string> model = {
      "model.kind=transformer", "model.block_order=attn_first", "model.use_bias=false", "model.tie_embeddings=true",
      "model.init=gpt2",        "model.hidden_size=16",         "model.head_dim=8",     "model.num_layers=2",
      "model.vocab_size=12",    "model.num_outputs=12",         "model.max_seq_len=8",  "model.layer_norm_eps=1e-5"};
  model.insert(model.end(), data.begin(), data.end());
  const Config a = default_config(model);
  Trainer ta(a, *be);
  const Batch b = make_batch(a.data, data_context(a));
  const double loss_a = ta.step(b).metrics.loss.mean();
  ASSERT_TRUE(save_checkpoint(ta, CheckpointState{.config_toml = config_to_toml(a)}, d.path("ckpt")).saved);
  export_hf(d.path("ckpt"), d.path("out"));

  std::vector<std::string> from = {"model.init_from=" + d.path("out")};
  from.insert(from.end(), data.begin(), data.end());
  const Config c = default_config(from);
  EXPECT_TRUE(c.model.transformer.use_bias);
  Trainer tb(c, *be);
  ModelSource(d.path("out")).load_params(tb.executor());
  for (const Param& p : tb.model().graph.params()) {
    const std::string& path = tb.model().graph.value(p.value).name;
    const std::vector<float> v = tb.param(path);
    if (path.ends_with("/bias"))
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.f; })) << path;
    else
      EXPECT_EQ(v, ta.param(path)) << path;
  }
  EXPECT_NEAR(tb.step(b).metrics.loss.mean(), loss_a, 1e-6);
}

TEST(HfExport, Refusals) {
  TempDir d;
  auto be = make_backend(Device::cpu);
  trained_checkpoint(*be, d.path(), 0);
  fs::create_directories(d.path("full"));
  write_file(d.path("full/keep.txt"), "mine");
  std::string m = user_error([&] { export_hf(d.path("ckpt"), d.path("full")); });
  EXPECT_NE(m.find("full: exists and is not an empty directory"), std::string::npos) << m;
  EXPECT_EQ(read_file(d.path("full/keep.txt")), "mine");
  // A file is named as one, with the fix, for both kinds of directory export.
  write_file(d.path("model.out"), "mine");
  for (const auto& exp :
       std::vector<std::function<void()>>{[&] { export_hf(d.path("ckpt"), d.path("model.out")); },
                                          [&] { export_peft(d.path("ckpt"), d.path("model.out")); }}) {
    try {
      exp();
      ADD_FAILURE() << "an export onto a file was not refused";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("model.out: is a file; the export writes a directory"), std::string::npos)
          << e.what();
      EXPECT_NE(e.hint().find("give the name of a new directory"), std::string::npos) << e.hint();
    }
    EXPECT_EQ(read_file(d.path("model.out")), "mine");
  }
  m = user_error([&] { export_hf(hf_golden("gpt2"), d.path("x")); });
  EXPECT_NE(m.find("is a Hugging Face directory already"), std::string::npos) << m;
  // The tutorial's Transformer (MLP first) is no transformers architecture.
  const Config tut = default_config({"model.kind=transformer", "model.hidden_size=16", "model.head_dim=8",
                                     "model.vocab_size=12", "model.num_outputs=12", "model.max_seq_len=8",
                                     "data.kind=random_tokens", "data.vocab_size=12", "data.seq_len=8"});
  Trainer t(tut, *be);
  ASSERT_TRUE(save_checkpoint(t, CheckpointState{.config_toml = config_to_toml(tut)}, d.path("tut")).saved);
  m = user_error([&] { export_hf(d.path("tut"), d.path("y")); });
  EXPECT_NE(m.find("model.block_order: is not attn_first"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(d.path("y")));
  // GPT-2's blocks have LayerNorms and a GELU MLP; Llama's (RMSNorm) a SwiGLU MLP and rotary embeddings.
  for (const auto& [key, problem] :
       {std::pair<std::string, std::string>{"model.norm=rmsnorm", "model.mlp: is not swiglu"},
        {"model.mlp=swiglu", "model.mlp: is swiglu"},
        // Gemma's norm makes a Gemma 3, which needs its other blocks too; its gate is neither GPT-2's nor
        // Llama's.
        {"model.norm=gemma_rmsnorm", "model.post_norms: is false (Gemma 3 normalises each branch's output)"},
        {"model.mlp=geglu", "model.mlp: is geglu"}}) {
    const Config c = default_config({"model.kind=transformer", "model.hidden_size=16", "model.head_dim=8",
                                     "model.vocab_size=12", "model.num_outputs=12", "model.max_seq_len=8",
                                     "model.block_order=attn_first", "model.tie_embeddings=true", key,
                                     "data.kind=random_tokens", "data.vocab_size=12", "data.seq_len=8"});
    Trainer tr(c, *be);
    ASSERT_TRUE(save_checkpoint(tr, CheckpointState{.config_toml = config_to_toml(c)}, d.path("ck")).saved);
    m = user_error([&] { export_hf(d.path("ck"), d.path("z")); });
    EXPECT_NE(m.find(problem), std::string::npos) << m;
    EXPECT_FALSE(fs::exists(d.path("z")));
    fs::remove_all(d.path("ck"));
  }
}

}  // namespace
}  // namespace loom
