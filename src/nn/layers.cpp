#include "nn/layers.h"

#include <cmath>

namespace loom::nn {

ParamInit lecun_normal(int64_t fan_in) {
  // jax.nn.initializers.variance_scaling(1, "fan_in", "truncated_normal"): the standard normal
  // truncated to [-2, 2] has stddev .87962566103423978, so the draw is divided by it.
  return ParamInit{ParamInit::truncated_normal,
                   static_cast<float>(std::sqrt(1.0 / static_cast<double>(fan_in)) / .87962566103423978)};
}

ParamInit as_kernel(ParamInit init) {
  init.role = ParamRole::kernel;
  return init;
}

ValueId dense(const Scope& s, ValueId x, int64_t features, DType dtype, bool use_bias) {
  const int64_t in = s.graph().value(x).shape.last();
  const ValueId w = s.param("kernel", Shape{in, features}, as_kernel(lecun_normal(in)));
  if (!use_bias) return s.op1(OpKind::dense, {x, w}, DenseAttrs{dtype});
  const ValueId b = s.param("bias", Shape{features}, ParamInit{ParamInit::zeros, 0});
  return s.op1(OpKind::dense, {x, w, b}, DenseAttrs{dtype});
}

ValueId layer_norm(const Scope& s, ValueId x, DType dtype, float eps, bool use_bias) {
  const int64_t c = s.graph().value(x).shape.last();
  const ValueId scale = s.param("scale", Shape{c}, ParamInit{ParamInit::ones, 0});
  // Without a bias the op gets a constant zero input: persistent inputs start zeroed and this one
  // is never written, so no parameter, gradient or optimizer state exists for it.
  const ValueId bias = use_bias ? s.param("bias", Shape{c}, ParamInit{ParamInit::zeros, 0})
                                : s.graph().add_input(s.path() + "/zero_bias", Shape{c}, DType::f32);
  return s.op(OpKind::layer_norm, {x, scale, bias}, LayerNormAttrs{eps, dtype}).at(0);
}

ValueId rms_norm(const Scope& s, ValueId x, DType dtype, float eps, bool unit_offset) {
  const int64_t c = s.graph().value(x).shape.last();
  const ValueId scale = s.param("scale", Shape{c}, ParamInit{unit_offset ? ParamInit::zeros : ParamInit::ones, 0});
  return s.op(OpKind::rms_norm, {x, scale}, LayerNormAttrs{eps, dtype, unit_offset}).at(0);
}

ValueId dropout(const Scope& s, ValueId x, float rate, bool train) {
  if (rate == 0.f || !train) return x;
  // The stream is this node's id: unique in the graph, shared by the VJP and any recompute.
  const auto stream = static_cast<uint32_t>(s.graph().nodes().size());
  return s.op1(OpKind::dropout, {x}, DropoutAttrs{rate, stream});
}

ValueId cast(const Scope& s, ValueId x, DType dtype) {
  if (s.graph().value(x).dtype == dtype) return x;
  return s.op1(OpKind::cast, {x}, DTypeAttrs{dtype});
}

}  // namespace loom::nn
