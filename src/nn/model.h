// A model as the trainer sees it: one minibatch's forward graph with its loss and metrics, ready
// for autodiff. Built per (config, minibatch size, train/eval); planned once; run every minibatch.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace loom::nn {

struct ModelGraph {
  Graph graph;
  std::string name;             // "MLPClassifier"
  ValueId inputs = kNoValue;    // persistent input: features or token ids
  ValueId labels = kNoValue;    // persistent input: int32 labels
  ValueId positions = kNoValue;  // with ModelInput::packed: persistent input, int32 [B, T] positions
                                 // of the tokens in their examples (data/data.h: Batch::positions)
  ValueId output = kNoValue;    // the model's output (log-probs or logits), before the loss; a
                                // Transformer's logits are in its compute dtype (its hidden states
                                // with a fused head: add_fused_classification_loss)
  ValueId loss_sum = kNoValue;  // f32 scalar: Σ over the minibatch of the per-example loss
  ValueId correct = kNoValue;   // i32 scalar: examples whose argmax equals the label
  int64_t examples = 0;         // rows the loss is summed over (the metric's count)
  // Inputs whose contents never change (e.g. position ids), uploaded once by the trainer.
  std::vector<std::pair<ValueId, std::vector<unsigned char>>> constants;
};

// Adds the softmax cross-entropy loss and accuracy on `logits` ([..., V], any float dtype: the loss
// ops compute in f32) against `labels`,
// marks both as program outputs, and fills the loss fields of `m`.
void add_classification_loss(ModelGraph& m, const Scope& s, ValueId logits);
// The same loss and accuracy with the output layer fused in (linear_cross_entropy): logits =
// x · kernel (kernelᵀ with attrs.transpose_w) + bias (unless it is kNoValue) formed attrs.chunk
// vocabulary columns at a time, never whole. `output` is then x, the hidden states before the
// output layer.
void add_fused_classification_loss(ModelGraph& m, const Scope& s, ValueId x, ValueId kernel, ValueId bias,
                                   const LinearCrossEntropyAttrs& attrs);

}  // namespace loom::nn
