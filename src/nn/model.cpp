#include "nn/model.h"

namespace loom::nn {

void add_classification_loss(ModelGraph& m, const Scope& s, ValueId logits) {
  m.output = logits;
  m.loss_sum = s.op1(OpKind::cross_entropy, {logits, m.labels});
  m.correct = s.op1(OpKind::accuracy, {logits, m.labels});
  m.graph.mark_output(m.loss_sum);
  m.graph.mark_output(m.correct);
  m.examples = m.graph.value(m.labels).shape.numel();
}

void add_fused_classification_loss(ModelGraph& m, const Scope& s, ValueId x, ValueId kernel, ValueId bias,
                                   const LinearCrossEntropyAttrs& attrs) {
  m.output = x;
  std::vector<ValueId> in = {x, kernel, m.labels};
  if (bias != kNoValue) in.push_back(bias);
  const std::vector<ValueId> out = s.op(OpKind::linear_cross_entropy, in, attrs);
  m.loss_sum = out[0];
  m.correct = out[1];
  m.graph.mark_output(m.loss_sum);
  m.graph.mark_output(m.correct);
  m.examples = m.graph.value(m.labels).shape.numel();
}

}  // namespace loom::nn
