// CPU kernels for embedding and its scatter-add backward (graph/ops/embedding.cpp).
//
// Ids are validated up front on the calling thread (a bad id aborts naming it and V, like the
// reference). The gather is parallel over tokens (no reduction). The scatter-add is parallel
// over column blocks: each block walks every token in order and adds its dy slice into the
// token's gradient row, so every gradient element receives its adds in token order, whatever
// the thread count, and no two threads ever write the same element.
#include <string>

#include "backend/cpu/cpu_util.h"
#include "graph/graph.h"

namespace loom {

using namespace cpuk;

namespace {

std::string bad_id_msg(int32_t id, int64_t V) {
  std::string s = "embedding id ";
  s += std::to_string(id);
  s += " out of range [0, V = ";
  s += std::to_string(V);
  s += ")";
  return s;
}

const int32_t* checked_ids(const TensorArg& ids, int64_t V) {
  LOOM_ASSERT(ids.dtype == DType::i32);
  const int32_t* p = ids.as<const int32_t>();
  const int64_t N = ids.shape.numel();
  for (int64_t n = 0; n < N; ++n) LOOM_ASSERT(p[n] >= 0 && p[n] < V, bad_id_msg(p[n], V));
  return p;
}

}  // namespace

// out[n, :] = round_dtype(table[ids[n], :]): a row copy when the table is in out's dtype already.
void cpu_embedding(const KernelArgs& a) {
  const TensorArg& table = a.in[1];
  const TensorArg& out = a.out[0];
  const int64_t V = table.shape[0], C = table.shape[1];
  const int64_t N = a.in[0].shape.numel();
  LOOM_ASSERT((table.dtype == DType::f32 || table.dtype == out.dtype) && out.shape.numel() == N * C);
  const int32_t* ids = checked_ids(a.in[0], V);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(out.dtype);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    if (table.dtype == out.dtype)
      std::memcpy(static_cast<std::byte*>(out.data) + n * row_bytes,
                  static_cast<const std::byte*>(table.data) + ids[n] * row_bytes, row_bytes);
    else
      store_f32(table.as<const float>() + ids[n] * C, out.data, out.dtype, n * C, C);
  }
}

// grad[ids[n], :] += dy[n, :] in f32, token order per element; parallel over column blocks.
void cpu_embedding_grad(const KernelArgs& a) {
  const TensorArg& grad = a.in[0];
  const TensorArg& dy = a.in[2];
  const int64_t V = grad.shape[0], C = grad.shape[1];
  const int64_t N = a.in[1].shape.numel();
  LOOM_ASSERT(grad.dtype == DType::f32 && dy.shape.numel() == N * C);
  const int32_t* ids = checked_ids(a.in[1], V);
  float* g = grad.as<float>();
  // 16 floats = one 64-byte line: blocks never share a cache line of a gradient row (rows are
  // C floats apart, so only when C % 16 == 0 are the lines aligned; sharing one at a block edge
  // is a performance matter only, each element still having one writer).
  constexpr int64_t kCols = 16;
  const int64_t nb = ceil_div(C, kCols);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin && nb > 1)
  for (int64_t cb = 0; cb < nb; ++cb) {
    const int64_t c0 = cb * kCols, w = C - c0 < kCols ? C - c0 : kCols;
    float buf[kCols];
    for (int64_t n = 0; n < N; ++n) {
      const float* d;
      if (dy.dtype == DType::f32) {
        d = dy.as<const float>() + n * C + c0;
      } else {
        load_f32(dy.data, dy.dtype, n * C + c0, buf, w);
        d = buf;
      }
      float* row = g + ids[n] * C + c0;
      for (int64_t c = 0; c < w; ++c) row[c] += d[c];
    }
  }
}

LOOM_CPU_NO_WORKSPACE(embedding)
LOOM_CPU_NO_WORKSPACE(embedding_grad)

}  // namespace loom
