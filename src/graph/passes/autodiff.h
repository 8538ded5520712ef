// Reverse-mode autodiff over the graph IR (docs/ARCHITECTURE.md, "Autodiff").
//
// build_backward walks the forward nodes in reverse from a scalar loss. Each op's VJP rule
// (beside the op in graph/ops/<family>.cpp) emits ordinary nodes with phase `backward`, in the
// forward node's scope and remat region. Cotangents reaching the same activation are summed
// with `add`; cotangents reaching a parameter go straight into its persistent fp32 gradient
// buffer with `grad_accumulate` (add-or-set in place), or are accumulated there by the VJP's own
// op (dense_grad_weight, embedding_grad), so accumulating over minibatches costs no memory
// beyond the gradients themselves.
#pragma once
#include <vector>

#include "graph/graph.h"

namespace loom {

// Context handed to a VJP rule for one forward node.
struct VjpCtx {
  Graph& g;
  NodeId fwd;                   // the forward node
  Node node;                    // a copy: emitting nodes may grow the graph's storage
  std::vector<ValueId> out_ct;  // cotangent per output, kNoValue where it is zero
  std::vector<bool> needs;      // per input: whether a cotangent is wanted
  std::vector<ValueId> in_ct;   // filled by the rule; kNoValue = zero / not needed
  // Per input, instead of in_ct: a cotangent u·op(V) of small rank (a LoRA adapter's input
  // gradient), u [..., r] the output cotangent and V the kernel with attrs as add_low_rank's (one
  // column block of the input's width, scale 1). Autodiff adds it into the input's other
  // cotangents with add_low_rank, one pass over them instead of an [..., K] product and an add,
  // and forms it with dense_grad_input only when nothing else reaches the input.
  struct LowRank {
    ValueId u = kNoValue, v = kNoValue;
    ColumnsAttrs attrs;
  };
  std::vector<LowRank> in_low_rank;

  const Value& in(int i) const { return g.value(node.in.at(i)); }
  // The persistent gradient buffer of input i when it is a parameter, else kNoValue. A rule may
  // accumulate into it directly with a kOpWritesGrad op (e.g. embedding's scatter-add, which
  // would otherwise need a dense [V, C] cotangent) and leave in_ct[i] as kNoValue.
  ValueId param_grad(int i) const { return g.grad_of(node.in.at(i)); }
  ValueId in_id(int i) const { return node.in.at(i); }
  ValueId out_id(int i) const { return node.out.at(i); }
  // Emits a backward node in the forward node's scope and region.
  std::vector<ValueId> emit(OpKind op, std::vector<ValueId> in, Attrs attrs = NoAttrs{});
  ValueId emit1(OpKind op, std::vector<ValueId> in, Attrs attrs = NoAttrs{}) {
    return emit(op, std::move(in), std::move(attrs)).at(0);
  }
};

// Appends the backward program for `loss` (a scalar f32 value). `seed` is the cotangent of the
// loss: a persistent scalar input the trainer sets each step (1/(tokens·minibatches) × loss
// scale), so changing the loss scale never changes the program.
// Returns the forward node count (nodes [0, n) are the forward program).
NodeId build_backward(Graph& g, ValueId loss, ValueId seed);

// Once the schedule is final (after remat): marks the first writer (a kOpWritesGrad op) of each
// gradient buffer in schedule order to assign in minibatch 0 when it writes every element (its
// attributes have assign_in_first_minibatch: grad_accumulate, dense_grad_weight), and returns the
// gradient buffers a step must still zero before its first minibatch: those whose first writer
// scatter-adds (embedding_grad), or that nothing writes.
// `one_minibatch`: a step runs one minibatch per process, so such a writer assigns on every run
// (DenseGradWeightAttrs::assigns_always).
std::vector<ValueId> mark_first_grad_writes(Graph& g, const std::vector<NodeId>& schedule, bool one_minibatch);

}  // namespace loom
