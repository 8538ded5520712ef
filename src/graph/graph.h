// The graph IR: values (static shape + dtype + storage kind) and nodes (op, attributes, scope
// path, phase, remat region). Kept functional (SSA): every node defines fresh outputs, except
// kOpWritesInput0 ops that accumulate into a persistent buffer. In-place reuse of activation
// memory is the memory planner's decision, never the graph's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/shape.h"
#include "graph/op.h"

namespace loom {

using ValueId = int32_t;
using NodeId = int32_t;
inline constexpr ValueId kNoValue = -1;

// Where a value's storage lives. Only `activation` values are placed in the planned arena;
// the rest are persistent buffers that outlive one program run.
enum class ValueKind : uint8_t {
  activation,  // produced by a node, planned in the arena
  param,       // a parameter: its fp32 master, or in an inference program a copy narrowed to the
               // compute dtype (graph/passes/narrow_params.h)
  grad,        // fp32 gradient accumulator of a param
  input,       // batch data and per-step scalars, written by the host before each run
};
const char* value_kind_name(ValueKind);

// What part of a training step a node belongs to. The optimizer update is no graph node: it runs
// on the backend after the last minibatch (Backend::optimizer_update).
enum class Phase : uint8_t { forward, backward, recompute };
inline constexpr size_t kNumPhases = static_cast<size_t>(Phase::recompute) + 1;
const char* phase_name(Phase);

struct ValueDesc {
  Shape shape;
  DType dtype = DType::f32;
};

// How a parameter is initialised (Flax's initialisers, drawn from loom's counter RNG keyed by
// the parameter's path, so the order parameters are created in does not matter).
// What a parameter is, for the rules that treat kinds of parameters differently (the optimizer's
// weight-decay mask `kernels`); the layer that creates the parameter says.
enum class ParamRole : uint8_t {
  other,   // biases, norm scales, embeddings
  kernel,  // the weight matrix of a dense layer
};

struct ParamInit {
  enum Kind : uint8_t { zeros, ones, normal, truncated_normal, uniform } kind = zeros;
  // normal / truncated_normal: the stddev (truncated at ±2 stddev of the base); uniform: b of U(-b, b)
  float stddev = 0.f;
  ParamRole role = ParamRole::other;
};

struct Value {
  Shape shape;
  DType dtype = DType::f32;
  ValueKind kind = ValueKind::activation;
  NodeId producer = -1;  // -1 for persistent values
  int out_index = 0;
  std::string name;        // params/grads/inputs: their path; activations: empty
  bool is_output = false;  // read by the host after the run: lives to the end of the program
  int64_t bytes() const {
    return dtype_is_quantized(dtype) ? quant_bytes(dtype, shape)
                                     : shape.numel() * static_cast<int64_t>(dtype_size(dtype));
  }
};

struct Node {
  OpKind op{};
  Attrs attrs;
  std::vector<ValueId> in;
  std::vector<ValueId> out;
  std::string scope;  // "block_3/attn/qkv"
  Phase phase = Phase::forward;
  int32_t region = -1;  // remat region (index into Graph::regions) or -1
};

struct Param {
  ValueId value = kNoValue;
  ValueId grad = kNoValue;  // kNoValue: frozen (no gradient, no optimizer state, no weight-gradient product)
  ParamInit init;
  bool trainable() const { return grad != kNoValue; }
};

class Graph {
 public:
  // Persistent values. A frozen parameter (trainable = false: a LoRA run's base weights) gets no
  // gradient value; autodiff asks no cotangent of it.
  ValueId add_param(const std::string& path, Shape shape, ParamInit init, bool trainable = true);
  ValueId add_input(const std::string& name, Shape shape, DType dtype);

  // Appends a node, runs its op's attribute/shape rule, and creates its outputs.
  // Throws std::invalid_argument (naming op, scope and shapes) when the rule rejects it.
  NodeId add_node(OpKind op, std::vector<ValueId> in, Attrs attrs, const std::string& scope, Phase phase,
                  int32_t region = -1);

  void mark_output(ValueId v) { values_.at(v).is_output = true; }

  // Stores parameter `param` in `dtype` (graph/passes/narrow_params.h). The shape rule of every
  // node that reads it, directly or through views, runs again: a view (kOpView) takes the new
  // dtype; a rule that rejects it throws std::invalid_argument as add_node does. Any other output
  // whose dtype would change is a bug (LOOM_ASSERT): the nodes must compute what they did before.
  void set_param_dtype(ValueId param, DType dtype);

  const Value& value(ValueId v) const { return values_.at(v); }
  const Node& node(NodeId n) const { return nodes_.at(n); }
  Node& node_mut(NodeId n) { return nodes_.at(n); }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Param>& params() const { return params_; }
  // Param record for a param value (or nullptr).
  const Param* param_of(ValueId v) const;
  ValueId grad_of(ValueId param_value) const;
  ValueId input_by_name(const std::string& name) const;

  // Remat regions: a scope path, the enclosing region (-1 at top level) and the model layer it
  // belongs to (-1: none; the remat pass may take a policy per layer) per region id.
  struct Region {
    std::string scope;
    int32_t parent = -1;
    int32_t layer = -1;
  };
  int32_t add_region(const std::string& scope, int32_t parent, int32_t layer = -1) {
    regions_.push_back(Region{.scope = scope, .parent = parent, .layer = layer});
    return static_cast<int32_t>(regions_.size() - 1);
  }
  const std::vector<Region>& regions() const { return regions_; }
  // The outermost region enclosing region r (nested remat: the outer region recomputes all).
  int32_t outermost_region(int32_t r) const {
    while (r >= 0 && regions_[r].parent >= 0) r = regions_[r].parent;
    return r;
  }

  // Text dump for debugging (test failure messages): one node per line — index, phase, op, @scope,
  // region=r when in a remat region, then inputs -> outputs as %id:[shape]dtype. Attributes are
  // not printed.
  std::string dump() const;

 private:
  ValueId new_value(Value v);
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<Param> params_;
  std::unordered_map<ValueId, size_t> param_index_;
  std::unordered_map<std::string, ValueId> names_;
  std::vector<Region> regions_;
};

// Scope: Flax-like path builder. `s / "mlp"` extends the path; parameters are created by path
// ("block_0/mlp/input_layer/kernel") and nodes record the scope path they were built in.
class Scope {
 public:
  Scope(Graph& g, std::string path = {}, int32_t region = -1) : g_(&g), path_(std::move(path)), region_(region) {}
  Scope operator/(const std::string& name) const {
    Scope s(*g_, path_.empty() ? name : path_ + "/" + name, region_);
    s.frozen_ = frozen_;
    return s;
  }
  // The same scope creating frozen (or, with false, trainable) parameters, it and its children.
  Scope frozen(bool f = true) const {
    Scope s = *this;
    s.frozen_ = f;
    return s;
  }
  // Opens a remat region named by this scope's path: nodes built through the returned scope
  // belong to it (nested inside the current region, if any); `layer`: the model layer it is part of.
  Scope remat_region(int32_t layer = -1) const {
    Scope s(*g_, path_, g_->add_region(path_, region_, layer));
    s.frozen_ = frozen_;
    return s;
  }

  ValueId param(const std::string& name, Shape shape, ParamInit init) const;
  // Builds a forward node in this scope; returns its outputs.
  std::vector<ValueId> op(OpKind op, std::vector<ValueId> in, Attrs attrs = NoAttrs{}) const;
  ValueId op1(OpKind k, std::vector<ValueId> in, Attrs attrs = NoAttrs{}) const {
    return op(k, std::move(in), std::move(attrs)).at(0);
  }

  Graph& graph() const { return *g_; }
  const std::string& path() const { return path_; }
  int32_t region() const { return region_; }

 private:
  Graph* g_;
  std::string path_;
  int32_t region_;
  bool frozen_ = false;
};

}  // namespace loom
