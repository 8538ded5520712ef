#include "nn/mlp_classifier.h"

#include "nn/layers.h"

namespace loom::nn {

ModelGraph build_mlp_classifier(const MlpClassifierSpec& spec, int64_t batch, bool train) {
  ModelGraph m;
  m.name = "MLPClassifier";
  Graph& g = m.graph;
  m.inputs = g.add_input("inputs", Shape{batch, spec.num_inputs}, DType::f32);  // [B, num_inputs]
  m.labels = g.add_input("labels", Shape{batch}, DType::i32);                   // [B]
  const Scope root(g);
  const Scope hid = spec.remat ? root.remat_region() : root;
  ValueId x = dense(hid / "Dense_0", m.inputs, spec.hidden_size, spec.dtype);  // [B, hidden] dtype
  x = layer_norm(hid / "LayerNorm_0", x, spec.dtype, spec.layer_norm_eps);
  x = hid.op1(OpKind::silu, {x});
  x = dropout(hid, x, spec.dropout_rate, train);
  x = dense(root / "Dense_1", x, spec.num_classes, spec.dtype);  // [B, classes] dtype
  x = cast(root, x, DType::f32);
  x = root.op1(OpKind::log_softmax, {x});  // [B, classes] f32 log-probabilities
  add_classification_loss(m, root, x);
  return m;
}

}  // namespace loom::nn
