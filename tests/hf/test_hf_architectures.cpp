// The table of Hugging Face architectures (nn/models/hf_arch.h, one row per family folder): each
// row is found by its names, reads back the config.json it writes, maps every parameter of the
// model it reads, and the refusal of an unknown architecture lists every row.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "io/hf.h"
#include "nn/config_keys.h"
#include "nn/models.h"
#include "nn/models/hf_arch.h"
#include "support/files.h"
#include "train/config.h"

namespace loom {
namespace {

using testing::TempDir;

// The model a row reads from a config.json holding only its names (the config class's defaults).
ModelConfig read_defaults(const nn::HfArchitecture& a) {
  const nlohmann::json j = {{"architectures", {a.architecture}}, {"model_type", a.model_type}};
  ModelConfig m;
  std::vector<ArchKey> keys;
  a.read_config(nn::HfConfigJson(j, "config.json"), m, keys);
  return m;
}

std::string model_toml(const ModelConfig& m) {
  Config c;
  c.model = m;
  return config_to_toml(c);
}

TEST(HfArchitectures, EveryRowIsFoundByEitherName) {
  ASSERT_FALSE(nn::hf_architectures().empty());
  for (const nn::HfArchitecture* a : nn::hf_architectures()) {
    EXPECT_EQ(nn::find_hf_architecture(a->model_type, a->architecture), a);
    EXPECT_EQ(nn::find_hf_architecture(a->model_type, ""), a);
    EXPECT_EQ(nn::find_hf_architecture("", a->architecture), a);
    EXPECT_EQ(nn::find_hf_architecture("no_such_type", a->architecture), nullptr);
  }
  EXPECT_EQ(nn::find_hf_architecture("no_such_type", ""), nullptr);
}

// config.json -> model -> config.json -> model gives the same model, and the row claims it.
TEST(HfArchitectures, EveryRowReadsBackWhatItWrites) {
  for (const nn::HfArchitecture* a : nn::hf_architectures()) {
    const ModelConfig m = read_defaults(*a);
    ASSERT_EQ(&nn::hf_architecture_of(m), a) << a->architecture << " does not claim the model it reads";
    const nn::HfModelMap map = a->tensor_map(m);
    EXPECT_EQ(map.architecture, a->architecture);
    EXPECT_EQ(map.model_type, a->model_type);
    const nlohmann::json written = hf_config_json(m);
    EXPECT_EQ(written["architectures"][0], a->architecture);
    EXPECT_EQ(written["model_type"], a->model_type);
    TempDir dir;
    std::ofstream(dir.path("config.json")) << written.dump();
    const HfConfig back = read_hf_config(dir.path());
    EXPECT_EQ(back.architecture, a->architecture);
    EXPECT_EQ(model_toml(back.model), model_toml(m)) << a->architecture;
  }
}

// Every parameter of the model a row reads has a tensor in its map, and the map no other.
TEST(HfArchitectures, EveryParameterHasATensor) {
  for (const nn::HfArchitecture* a : nn::hf_architectures()) {
    ModelConfig m = read_defaults(*a);
    m.transformer.num_layers = 2;  // the defaults are billions of parameters: names only need two layers
    const nn::ModelGraph g = nn::build_model(m, {.batch = 1, .num_inputs = 0, .seq_len = 4}, /*train=*/false);
    std::set<std::string> params, mapped;
    for (const Param& p : g.graph.params()) params.insert(g.graph.value(p.value).name);
    for (const nn::HfParam& p : a->tensor_map(m).params)
      if (!p.path.empty()) mapped.insert(p.path);
    EXPECT_EQ(mapped, params) << a->architecture;
  }
}

TEST(HfArchitectures, TheRefusalListsEveryRow) {
  TempDir dir;
  std::ofstream(dir.path("config.json")) << R"({"model_type": "no_such_type"})";
  try {
    read_hf_config(dir.path());
    ADD_FAILURE() << "an unknown model_type was accepted";
  } catch (const UserError& e) {
    for (const nn::HfArchitecture* a : nn::hf_architectures())
      EXPECT_NE(e.hint().find(std::string(a->listed_as)), std::string::npos) << e.hint();
  }
}

// A key a Hugging Face config.json fixes is a row marked `architecture` (nn/config_keys.h), so a
// loom run started from that model hands the same keys on to a run started from its checkpoints.
TEST(HfArchitectures, EveryKeyAConfigFixesIsAnArchitectureRow) {
  std::set<std::string> architecture;
  for (const KeySpec<ModelConfig>& k : model_keys())
    if (k.architecture) architecture.insert(k.key);
  int fixtures = 0;
  for (const auto& e : std::filesystem::directory_iterator(testing::hf_golden(""))) {
    if (!is_hf_model_dir(e.path().string())) continue;
    ++fixtures;
    for (const ArchKey& k : read_hf_config(e.path().string()).keys)
      EXPECT_TRUE(!k.fixed || architecture.count(k.key)) << e.path().filename() << ": " << k.key;
  }
  EXPECT_GE(fixtures, 8);
}

}  // namespace
}  // namespace loom
