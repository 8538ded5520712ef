#include "graph/graph.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "graph/ops/rules.h"

namespace loom {

const char* value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::activation:
      return "activation";
    case ValueKind::param:
      return "param";
    case ValueKind::grad:
      return "grad";
    case ValueKind::input:
      return "input";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::recompute:
      return "recompute";
  }
  return "?";
}

ValueId Graph::new_value(Value v) {
  values_.push_back(std::move(v));
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId Graph::add_param(const std::string& path, Shape shape, ParamInit init, bool trainable) {
  if (names_.count(path)) throw std::invalid_argument("parameter '" + path + "' created twice");
  const ValueId pv = new_value(Value{.shape = shape, .dtype = DType::f32, .kind = ValueKind::param, .name = path});
  const ValueId gid =
      trainable ? new_value(Value{.shape = shape, .dtype = DType::f32, .kind = ValueKind::grad, .name = path + "@grad"})
                : kNoValue;
  param_index_[pv] = params_.size();
  params_.push_back(Param{.value = pv, .grad = gid, .init = init});
  names_[path] = pv;
  return pv;
}

ValueId Graph::add_input(const std::string& name, Shape shape, DType dtype) {
  if (names_.count(name)) throw std::invalid_argument("input '" + name + "' created twice");
  const ValueId v = new_value(Value{.shape = shape, .dtype = dtype, .kind = ValueKind::input, .name = name});
  names_[name] = v;
  return v;
}

const Param* Graph::param_of(ValueId v) const {
  auto it = param_index_.find(v);
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

ValueId Graph::grad_of(ValueId v) const {
  const Param* p = param_of(v);
  return p ? p->grad : kNoValue;
}

ValueId Graph::input_by_name(const std::string& name) const {
  auto it = names_.find(name);
  return it == names_.end() ? kNoValue : it->second;
}

NodeId Graph::add_node(OpKind op, std::vector<ValueId> in, Attrs attrs, const std::string& scope, Phase phase,
                       int32_t region) {
  const OpInfo& info = op_info(op);
  Node n;
  n.op = op;
  n.in = std::move(in);
  n.attrs = std::move(attrs);
  n.scope = scope;
  n.phase = phase;
  n.region = region;
  for (ValueId v : n.in)
    if (v < 0 || static_cast<size_t>(v) >= values_.size()) op_fail(*this, n, "input is not a value of this graph");
  if (static_cast<int>(n.in.size()) < info.min_inputs || static_cast<int>(n.in.size()) > info.max_inputs)
    op_fail(*this, n,
            "takes " + std::to_string(info.min_inputs) + ".." + std::to_string(info.max_inputs) + " inputs, got " +
                std::to_string(n.in.size()));
  if (n.attrs.index() != info.attr_index) op_fail(*this, n, "wrong attribute struct for this op");
  ValueDesc outs[4];
  LOOM_ASSERT(info.num_outputs <= 4);
  info.infer(*this, n, outs);
  const NodeId id = static_cast<NodeId>(nodes_.size());
  for (int i = 0; i < info.num_outputs; ++i)
    n.out.push_back(new_value(Value{.shape = outs[i].shape,
                                    .dtype = outs[i].dtype,
                                    .kind = ValueKind::activation,
                                    .producer = id,
                                    .out_index = i,
                                    .name = {}}));
  nodes_.push_back(std::move(n));
  return id;
}

void Graph::set_param_dtype(ValueId param, DType dtype) {
  LOOM_ASSERT(values_.at(param).kind == ValueKind::param, "'" + values_[param].name + "' is not a parameter");
  values_[param].dtype = dtype;
  std::vector<bool> retyped(values_.size());
  retyped[static_cast<size_t>(param)] = true;
  for (Node& n : nodes_) {  // graph order is topological: a view is retyped before its readers run again
    if (std::none_of(n.in.begin(), n.in.end(), [&](ValueId v) { return retyped[static_cast<size_t>(v)]; })) continue;
    const OpInfo& info = op_info(n.op);
    ValueDesc outs[4];
    info.infer(*this, n, outs);
    for (int i = 0; i < info.num_outputs; ++i) {
      Value& o = values_[n.out[static_cast<size_t>(i)]];
      if (o.dtype == outs[i].dtype) continue;
      LOOM_ASSERT(info.flags & kOpView,
                  std::string("narrowing a parameter changes the output of ") + info.name + " at '" + n.scope + "'");
      o.dtype = outs[i].dtype;
      retyped[static_cast<size_t>(n.out[static_cast<size_t>(i)])] = true;
    }
  }
}

std::string Graph::dump() const {
  std::ostringstream os;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    os << i << " " << phase_name(n.phase) << " " << op_name(n.op) << " @" << n.scope;
    if (n.region >= 0) os << " region=" << n.region;
    os << " (";
    for (size_t j = 0; j < n.in.size(); ++j) {
      const Value& v = values_[n.in[j]];
      os << (j ? ", " : "") << "%" << n.in[j] << ":" << v.shape.str() << dtype_name(v.dtype);
    }
    os << ") -> (";
    for (size_t j = 0; j < n.out.size(); ++j) {
      const Value& v = values_[n.out[j]];
      os << (j ? ", " : "") << "%" << n.out[j] << ":" << v.shape.str() << dtype_name(v.dtype);
    }
    os << ")\n";
  }
  return os.str();
}

ValueId Scope::param(const std::string& name, Shape shape, ParamInit init) const {
  return g_->add_param(path_.empty() ? name : path_ + "/" + name, shape, init, !frozen_);
}

std::vector<ValueId> Scope::op(OpKind op, std::vector<ValueId> in, Attrs attrs) const {
  const NodeId id = g_->add_node(op, std::move(in), std::move(attrs), path_, Phase::forward, region_);
  return g_->node(id).out;
}

}  // namespace loom
