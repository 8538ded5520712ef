// The configuration's choice keys (core/choice.h) and the model-kind table (nn/models.h): each
// name reads and prints with one spelling, checkpoints' older spellings still load, and every
// kind's row matches its name.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "nn/models.h"
#include "train/config.h"

namespace loom {
namespace {

// Every name of every choice key, set by an override, prints back as itself.
TEST(Config, ChoiceKeysPrintTheNameTheyRead) {
  const std::vector<std::pair<std::string, std::span<const ChoiceInfo>>> keys = {
      {"device", choices_of(Device{})},
      {"model.kind", choices_of(ModelKind{})},
      {"model.remat_policy", choices_of(RematPolicyKind{})},
      {"model.block_order", choices_of(BlockOrder{})},
      {"model.init", choices_of(InitScheme{})},
      {"optimizer.name", choices_of(OptimizerName{})},
      {"optimizer.schedule", choices_of(ScheduleKind{})},
      {"optimizer.loss_scale", choices_of(LossScaleMode{})},
      {"optimizer.weight_decay_mask", choices_of(WeightDecayMask{})},
      {"data.kind", choices_of(DataKind{})},
  };
  for (const auto& [key, names] : keys) {
    const std::string line = key.substr(key.find('.') + 1) + " = \"";
    for (const ChoiceInfo& n : names) {
      Config c;
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
  m.head_dim = 64;
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

}  // namespace
}  // namespace loom
