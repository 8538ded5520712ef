#include "nn/models.h"

#include <array>

namespace loom::nn {

#define LOOM_MODEL_KIND_DECLARE(id, help) const ModelKindInfo& id##_family();
LOOM_MODEL_KINDS(LOOM_MODEL_KIND_DECLARE)
#undef LOOM_MODEL_KIND_DECLARE

namespace {

std::array<ModelKindInfo, choices_of(ModelKind{}).size()> make_table() {
  std::array<ModelKindInfo, choices_of(ModelKind{}).size()> rows{};
  size_t i = 0;
#define LOOM_MODEL_KIND_ROW(id, help)             \
  rows[i] = id##_family();                        \
  rows[i].name = choices_of(ModelKind{})[i].name; \
  ++i;
  LOOM_MODEL_KINDS(LOOM_MODEL_KIND_ROW)
#undef LOOM_MODEL_KIND_ROW
  return rows;
}

}  // namespace

const ModelKindInfo& model_kind(ModelKind k) {
  static const auto rows = make_table();
  return rows[static_cast<size_t>(k)];
}
ModelGraph build_model(const ModelConfig& c, const ModelInput& in, bool train) {
  return model_kind(c.kind).build(c, in, train);
}

}  // namespace loom::nn
