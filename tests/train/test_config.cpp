// The configuration's choice keys (core/choice.h) and the model-kind table (nn/models.h): each
// name reads and prints with one spelling, checkpoints' older spellings still load, and every
// kind's row matches its name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "data/data.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "support/files.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

// Every name of every choice key, set by an override, prints back as itself (in a configuration
// where the key applies: the printed TOML leaves out keys that do not).
TEST(Config, ChoiceKeysPrintTheNameTheyRead) {
  struct Key {
    std::string key;
    std::span<const ChoiceInfo> names;
    std::string context;  // an override making the key apply
  };
  const std::vector<Key> keys = {
      {"device", choices_of(Device{}), ""},
      {"model.kind", choices_of(ModelKind{}), ""},
      {"model.remat_policy", choices_of(RematPolicyKind{}), ""},
      {"model.block_order", choices_of(BlockOrder{}), "model.kind=transformer"},
      {"model.init", choices_of(InitScheme{}), "model.kind=transformer"},
      {"optimizer.name", choices_of(OptimizerName{}), ""},
      {"optimizer.schedule", choices_of(ScheduleKind{}), ""},
      {"optimizer.loss_scale", choices_of(LossScaleMode{}), "model.dtype=float16"},
      {"optimizer.weight_decay_mask", choices_of(WeightDecayMask{}), "optimizer.name=adamw"},
      {"data.kind", choices_of(DataKind{}), ""},
  };
  for (const auto& [key, names, context] : keys) {
    const std::string line = key.substr(key.find('.') + 1) + " = \"";
    for (const ChoiceInfo& n : names) {
      Config c;
      if (!context.empty()) apply_override(c, context);
      apply_override(c, key + "=" + std::string(n.name));
      EXPECT_NE(config_to_toml(c).find("\n" + line + std::string(n.name) + "\"\n"), std::string::npos) << key;
    }
    Config c;
    EXPECT_THROW(apply_override(c, key + "=no_such_name"), UserError) << key;
  }
}

// model.remat is a set: printed in one order, "none" when empty; checkpoints written before the
// choice enums spelled "no remat" as "" and kept the user's spacing.
TEST(Config, RematSetReadsOldSpellings) {
  const Config tf = default_config({"model.kind=transformer", "data.kind=random_tokens", "data.seq_len=16",
                                    "data.vocab_size=16", "model.remat=Attn,MLP"});
  const std::string text = config_to_toml(tf);
  const std::string printed = "remat = \"MLP,Attn\"";
  ASSERT_NE(text.find(printed), std::string::npos) << text;
  auto with = [&](const std::string& remat) {
    std::string t = text;
    t.replace(t.find(printed), printed.size(), "remat = \"" + remat + "\"");
    return config_from_toml_text(t, "state.json");
  };
  EXPECT_TRUE(with("").model.remat.empty());
  EXPECT_TRUE(with("none").model.remat.empty());
  EXPECT_EQ(config_to_toml(with("")), config_to_toml(with("none")));
  const Config spaced = with("MLP, Attn");
  EXPECT_EQ(spaced.model.remat, (ChoiceSet<RematRegion>{RematRegion::MLP, RematRegion::Attn}));
  EXPECT_EQ(config_to_toml(spaced), text);
}

// Every value the configuration accepts survives the trip a checkpoint makes (config_to_toml into
// state.json and back): edge values of every key — min, max, negative, non-finite, awkward strings
// — are either refused at once with a UserError or read back as exactly the same configuration.
TEST(Config, EveryAcceptedValueRoundTripsThroughACheckpoint) {
  const std::vector<std::string> ints = {"-9223372036854775808", "-1", "0", "1", "7", "9223372036854775807"};
  const std::vector<std::string> numbers = {"-1e308", "-1", "0", "1e-300", "0.5", "1", "1e308", "nan", "inf", "-inf"};
  const std::vector<std::string> strings = {"", "a b", "quote\"d", "back\\slash", "tab\tnew\nline", "µs ümlaut"};
  int accepted = 0, refused = 0;
  for (const ConfigKeyInfo& k : config_keys()) {
    std::vector<std::string> values = k.type == "int"      ? ints
                                      : k.type == "number" ? numbers
                                      : k.type == "bool"   ? std::vector<std::string>{"true", "false", "1", "yes"}
                                      : k.type == "string" ? strings
                                                           : k.choices;
    if (k.type == "dtype") values = {"float32", "bfloat16", "float16", "int32", "float64"};
    for (const std::string& v : values) {
      Config c;
      try {
        apply_override(c, k.key + "=" + v);
        validate_config(c);
      } catch (const UserError&) {
        ++refused;
        continue;
      }
      ++accepted;
      const std::string toml = config_to_toml(c);
      const nlohmann::json state = {{"config", toml}};  // what state.json stores
      Config back;
      ASSERT_NO_THROW(
          back = config_from_toml_text(nlohmann::json::parse(state.dump())["config"].get<std::string>(), "state.json"))
          << k.key << " = " << v << " was accepted but does not load back:\n"
          << toml;
      EXPECT_EQ(config_to_toml(back), toml) << k.key << " = " << v;
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 20);
}

// The saved configuration lists what shaped the run: no classifier keys for a language model, no
// Transformer keys for the classifier, no momentum for Adam; and it reads back as itself.
TEST(Config, SavedTomlListsOnlyTheKeysThatApply) {
  const Config lm = default_config({"model.kind=transformer", "data.kind=random_tokens", "data.seq_len=16",
                                    "data.vocab_size=16", "optimizer.name=adamw"});
  const std::string lm_text = config_to_toml(lm);
  for (const char* absent : {"num_classes", "num_inputs", "momentum", "loss_scale", "\ndir ", "decay_steps"})
    EXPECT_EQ(lm_text.find(absent), std::string::npos) << absent << " does not apply:\n" << lm_text;
  for (const char* present : {"num_layers", "vocab_size", "seq_len", "weight_decay", "b2"})
    EXPECT_NE(lm_text.find(present), std::string::npos) << present << " applies:\n" << lm_text;
  EXPECT_EQ(config_to_toml(config_from_toml_text(lm_text, "saved")), lm_text);

  const std::string mlp_text = config_to_toml(default_config({"optimizer.name=sgd", "optimizer.momentum=0.9"}));
  for (const char* absent : {"num_layers", "head_dim", "seq_len", "b1", "weight_decay"})
    EXPECT_EQ(mlp_text.find(absent), std::string::npos) << absent << " does not apply:\n" << mlp_text;
  for (const char* present : {"num_classes", "num_inputs", "momentum = 0.9"})
    EXPECT_NE(mlp_text.find(present), std::string::npos) << present << " applies:\n" << mlp_text;
}

// An unknown key's fix names the key it most likely meant; a bad value is said once.
TEST(Config, MessagesSuggestAndDoNotRepeat) {
  auto error = [](const std::string& assignment) {
    Config c;
    try {
      apply_override(c, assignment);
    } catch (const UserError& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    return std::string("accepted");
  };
  EXPECT_NE(error("hidden_size=64").find("did you mean model.hidden_size?"), std::string::npos)
      << error("hidden_size=64");
  EXPECT_NE(error("optimizer.learning_rat=0.1").find("did you mean optimizer.learning_rate?"), std::string::npos);
  EXPECT_NE(error("model.nmu_layers=2").find("did you mean model.num_layers?"), std::string::npos);
  const std::string bad_int = error("train.steps=abc");
  EXPECT_NE(bad_int.find("'abc' is not an integer"), std::string::npos) << bad_int;
  EXPECT_EQ(bad_int.find("(not an integer)"), std::string::npos) << bad_int;
  EXPECT_NE(error("optimizer.learning_rate=nan").find("NaN"), std::string::npos) << "says why nan is refused";
  EXPECT_NE(error("model.dtype=int32").find("model.dtype=float32"), std::string::npos) << "an unquoted example";
}

// optimizer.gather_ahead counts uses: a negative count is refused naming the key and what to set.
TEST(Config, ANegativeGatherDepthIsRefusedNamingTheKey) {
  Config c = default_config({"optimizer.shard=params"});
  apply_override(c, "optimizer.gather_ahead=-1");
  try {
    validate_config(c);
    ADD_FAILURE() << "optimizer.gather_ahead = -1 was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(e.subject().find("optimizer.gather_ahead"), std::string::npos) << e.subject();
    EXPECT_NE(std::string(e.what()).find("must be >= 0"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("0 waits for each gather"), std::string::npos) << e.hint();
  }
  c.optimizer.gather_ahead = 0;
  EXPECT_NO_THROW(validate_config(c));
  EXPECT_NE(config_to_toml(c).find("gather_ahead = 0"), std::string::npos) << "saved with shard = params";
}

TEST(ModelKinds, EveryRowMatchesItsNameAndDefaults) {
  for (const ChoiceInfo& n : choices_of(ModelKind{})) {
    const ModelKind k = *parse_choice<ModelKind>(n.name);
    const nn::ModelKindInfo& row = nn::model_kind(k);
    EXPECT_EQ(row.name, n.name);
    EXPECT_TRUE(row.build && row.validate) << n.name;
    EXPECT_TRUE(!row.build_decoder || row.language_model) << n.name << ": a decoder generates tokens";
    ModelConfig m;
    m.kind = k;
    EXPECT_NO_THROW(row.validate(m)) << n.name << ": the defaults are valid";
  }
}

TEST(ModelKinds, ValidationNamesTheKey) {
  ModelConfig m;
  m.kind = ModelKind::transformer;
  m.hidden_size = 100;
  m.transformer.head_dim = 64;
  try {
    nn::model_kind(m.kind).validate(m);
    ADD_FAILURE() << "hidden_size 100 with head_dim 64 was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(e.subject(), "model.hidden_size");
  }
  m.kind = ModelKind::mlp_classifier;
  m.hidden_size = 256;
  m.remat = {RematRegion::Attn};
  EXPECT_THROW(nn::model_kind(m.kind).validate(m), UserError);
  m.remat = {RematRegion::MLP};
  EXPECT_NO_THROW(nn::model_kind(m.kind).validate(m));
}

// Each family lists its own model.* keys (nn/models/<family>/keys.cpp): the schema keeps every
// family's order, and a saved configuration holds exactly the model keys its family lists (with
// model.kind, model.dtype and model.init_from, which every model has).
TEST(ModelKinds, EachFamilyOwnsItsKeys) {
  std::vector<std::string> schema;
  for (const ConfigKeyInfo& k : config_keys()) schema.push_back(k.key);
  for (const ChoiceInfo& n : choices_of(ModelKind{})) {
    const ModelKind kind = *parse_choice<ModelKind>(n.name);
    std::vector<std::string> own;
    for (const KeySpec<ModelConfig>& k : nn::model_kind(kind).keys()) own.emplace_back(k.key);
    ASSERT_FALSE(own.empty()) << n.name;
    size_t at = 0;  // own is a subsequence of the schema
    for (const std::string& k : own) {
      while (at < schema.size() && schema[at] != k) ++at;
      EXPECT_LT(at, schema.size()) << n.name << ": " << k << " is not in the schema in the family's order";
    }
    Config c;
    c.model.kind = kind;
    const std::string toml = config_to_toml(c);
    for (const std::string& k : schema) {
      if (!k.starts_with("model.") || k == "model.kind" || k == "model.dtype" || k == "model.init_from") continue;
      const bool listed = std::find(own.begin(), own.end(), k) != own.end();
      const std::string line = "\n" + k.substr(6) + " = ";
      EXPECT_EQ(toml.find(line) != std::string::npos, listed) << n.name << ": " << k;
    }
  }
}

// optimizer.weight_decay_mask = kernels decays the parameters their layers mark as dense kernels
// (ParamRole::kernel): in every model, exactly those whose path ends in "kernel".
TEST(ModelKinds, DenseKernelsAreMarkedForWeightDecay) {
  for (const ChoiceInfo& n : choices_of(ModelKind{})) {
    ModelConfig m;
    m.kind = *parse_choice<ModelKind>(n.name);
    m.transformer.vocab_size = m.transformer.num_outputs = 16;
    const nn::ModelGraph g = nn::build_model(m, {.batch = 1, .num_inputs = 4, .seq_len = 4}, /*train=*/true);
    int kernels = 0;
    for (const Param& p : g.graph.params()) {
      const std::string& path = g.graph.value(p.value).name;
      const bool kernel = path.ends_with("/kernel");
      kernels += kernel;
      EXPECT_EQ(weight_decay_applies(WeightDecayMask::kernels, p.init.role, g.graph.value(p.value).shape), kernel)
          << n.name << ": " << path;
    }
    EXPECT_GT(kernels, 0) << n.name;
  }
}

// A loom checkpoint given as model.init_from decides every model.* row marked `architecture`, a
// variant's option as much as the block's shape: its sliding window is taken when the new
// configuration leaves it out, and a different one is refused with both values.
TEST(InitFrom, ALoomCheckpointDecidesItsSlidingWindow) {
  testing::TempDir d;
  const Config a = default_config({"model.kind=transformer", "model.hidden_size=16", "model.head_dim=8",
                                   "model.num_layers=1", "model.vocab_size=12", "model.num_outputs=12",
                                   "model.max_seq_len=8", "model.sliding_window=4", "data.kind=random_tokens",
                                   "data.vocab_size=12", "data.seq_len=8", "data.batch_size=2"});
  auto be = make_backend(Device::cpu);
  Trainer t(a, *be);
  t.step(make_batch(a.data, data_context(a)));
  ASSERT_TRUE(save_checkpoint(t, {.config_toml = config_to_toml(a), .step = 1}, d.path("ckpt_000001")).saved);

  std::vector<std::string> from = {"model.init_from=" + d.path(), "data.kind=random_tokens", "data.vocab_size=12",
                                   "data.seq_len=8"};
  EXPECT_EQ(default_config(from).model.transformer.sliding_window, 4);
  from.push_back("model.sliding_window=8");
  const std::string m = testing::user_error([&] { default_config(from); });
  EXPECT_NE(m.find("model.sliding_window: is 8, but the model of model.init_from has "), std::string::npos) << m;
  EXPECT_NE(m.find("i.e. model.sliding_window = 4"), std::string::npos) << m;
}

}  // namespace
}  // namespace loom
