// Small helpers shared by the reference kernels (header-only, internal to backend/reference/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace loom::refk {

// Element i of t as a double (exact: every dtype widens exactly to f32 except i32 beyond 2^24,
// which load_as_f32 rounds; integer-exact paths read i32 directly).
inline double ld(const TensorArg& t, int64_t i) {
  return static_cast<double>(load_as_f32(t.data, t.dtype, static_cast<size_t>(i)));
}
// Stores v as element i of t: double -> float, then round to nearest even to t.dtype.
inline void st(const TensorArg& t, int64_t i, double v) {
  store_from_f32(t.data, t.dtype, static_cast<size_t>(i), static_cast<float>(v));
}
// round_c(v): the value v becomes after a store to dtype dt and a load back.
inline double rnd(DType dt, double v) { return static_cast<double>(round_to(dt, static_cast<float>(v))); }

inline int32_t ld_i32(const TensorArg& t, int64_t i) {
  LOOM_ASSERT(t.dtype == DType::i32);
  int32_t v;
  std::memcpy(&v, static_cast<const unsigned char*>(t.data) + i * 4, 4);
  return v;
}
inline void st_i32(const TensorArg& t, int64_t i, int32_t v) {
  LOOM_ASSERT(t.dtype == DType::i32);
  std::memcpy(static_cast<unsigned char*>(t.data) + i * 4, &v, 4);
}

// Row r's label of the loss ops (labels [rows] i32 over V classes), negative when the row is
// ignored (ops.def, cross_entropy); one >= V is a bug in the caller.
inline int32_t label_at(const TensorArg& labels, int64_t r, int64_t V) {
  const int32_t l = ld_i32(labels, r);
  LOOM_ASSERT(l < V, "label " + std::to_string(l) + " out of range [0, " + std::to_string(V) + ")");
  return l;
}

}  // namespace loom::refk
