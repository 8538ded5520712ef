#include "nn/models/mlp_classifier/mlp_classifier.h"

#include "core/error.h"
#include "nn/layers.h"
#include "nn/models.h"

namespace loom::nn {

ModelGraph build_mlp_classifier(const ModelConfig& c, const ModelInput& in, bool train) {
  ModelGraph m;
  m.name = "MLPClassifier";
  Graph& g = m.graph;
  m.inputs = g.add_input("inputs", Shape{in.batch, in.num_inputs}, DType::f32);  // [B, num_inputs]
  m.labels = g.add_input("labels", Shape{in.batch}, DType::i32);                 // [B]
  const Scope root(g);
  // Its one layer: model.remat = auto's choice (remat_layers[0]) or model.remat.
  const ChoiceSet<RematRegion> remat = c.remat_layers.empty() ? c.remat : c.remat_layers.at(0).regions;
  const Scope hid = remat.has(RematRegion::MLP) ? root.remat_region(0) : root;
  ValueId x = dense(hid / "Dense_0", m.inputs, c.hidden_size, c.dtype);  // [B, hidden] dtype
  x = layer_norm(hid / "LayerNorm_0", x, c.dtype, c.layer_norm_eps);
  x = hid.op1(OpKind::silu, {x});
  x = dropout(hid, x, c.dropout_rate, train);
  x = dense(root / "Dense_1", x, c.mlp_classifier.num_classes, c.dtype);  // [B, classes] dtype
  x = cast(root, x, DType::f32);
  x = root.op1(OpKind::log_softmax, {x});  // [B, classes] f32 log-probabilities
  add_classification_loss(m, root, x);
  return m;
}

void validate_mlp_classifier(const ModelConfig& c) {
  if (c.mlp_classifier.num_classes < 1) throw UserError("model.num_classes", "must be >= 1", "e.g. 100");
  if (!c.remat.empty() && c.remat != ChoiceSet<RematRegion>{RematRegion::MLP} &&
      c.remat != ChoiceSet<RematRegion>{RematRegion::auto_})
    throw UserError("model.remat", "the mlp_classifier has one remat region, 'MLP' (its hidden block)",
                    "use model.remat=MLP, auto or none");
}

const ModelKindInfo& mlp_classifier_family() {
  static const ModelKindInfo row{.name = {},
                                 .language_model = false,
                                 .build = build_mlp_classifier,
                                 .validate = validate_mlp_classifier,
                                 .build_decoder = nullptr,
                                 .build_prefill = nullptr,
                                 .keys = mlp_classifier_keys};
  return row;
}

}  // namespace loom::nn
