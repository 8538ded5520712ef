#include "nn/models.h"

#include "nn/mlp_classifier.h"
#include "nn/transformer.h"

namespace loom::nn {

namespace {

#define LOOM_MODEL_KIND_ROW(id, help, lm, decoder, prefill) \
  ModelKindInfo{.name = choice_spelling(#id),               \
                .language_model = lm,                       \
                .build = build_##id,                        \
                .validate = validate_##id,                  \
                .build_decoder = decoder,                   \
                .build_prefill = prefill},
constexpr ModelKindInfo kModelKinds[] = {LOOM_MODEL_KINDS(LOOM_MODEL_KIND_ROW)};
#undef LOOM_MODEL_KIND_ROW
static_assert(std::size(kModelKinds) == choices_of(ModelKind{}).size());

}  // namespace

const ModelKindInfo& model_kind(ModelKind k) { return kModelKinds[static_cast<size_t>(k)]; }

ModelGraph build_model(const ModelConfig& c, const ModelInput& in, bool train) {
  return model_kind(c.kind).build(c, in, train);
}

}  // namespace loom::nn
