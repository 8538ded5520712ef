// Reference kernels for embedding and its scatter-add backward (graph/ops/embedding.cpp).
#include <string>
#include <vector>

#include "backend/reference/util.h"
#include "graph/graph.h"

namespace loom {

using refk::ld;
using refk::st;

namespace {

std::string bad_id_msg(int32_t id, int64_t V) {
  std::string s = "embedding id ";
  s += std::to_string(id);
  s += " out of range [0, V = ";
  s += std::to_string(V);
  s += ")";
  return s;
}

int32_t id_at(const TensorArg& ids, int64_t n, int64_t V) {
  const int32_t id = refk::ld_i32(ids, n);
  LOOM_ASSERT(id >= 0 && id < V, bad_id_msg(id, V));
  return id;
}

}  // namespace

// out[n, c] = round_dtype(table[ids[n], c]).
void ref_embedding(const KernelArgs& a) {
  const TensorArg& ids = a.in[0];
  const TensorArg& table = a.in[1];
  const TensorArg& out = a.out[0];
  const int64_t V = table.shape[0], C = table.shape[1], N = ids.shape.numel();
  LOOM_ASSERT(out.shape.numel() == N * C);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = id_at(ids, n, V);
    for (int64_t c = 0; c < C; ++c) st(out, n * C + c, ld(table, id * C + c));
  }
}

// grad[ids[n], c] += dy[n, c] for every token n: per element of grad, its current value plus
// the dy values of the tokens with that id, summed in double and stored once.
void ref_embedding_grad(const KernelArgs& a) {
  const TensorArg& grad = a.in[0];
  const TensorArg& ids = a.in[1];
  const TensorArg& dy = a.in[2];
  const int64_t V = grad.shape[0], C = grad.shape[1], N = ids.shape.numel();
  LOOM_ASSERT(grad.dtype == DType::f32 && dy.shape.numel() == N * C);
  std::vector<double> acc(static_cast<size_t>(V * C));
  for (int64_t i = 0; i < V * C; ++i) acc[static_cast<size_t>(i)] = ld(grad, i);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = id_at(ids, n, V);
    for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(id * C + c)] += ld(dy, n * C + c);
  }
  for (int64_t i = 0; i < V * C; ++i) st(grad, i, acc[static_cast<size_t>(i)]);
}

}  // namespace loom
