// The reference backend: the oracle every fast kernel is checked against.
//
// Written for clarity, not speed: naive loops, every accumulation in double, elements read with
// load_as_f32 and written with store_from_f32 (round to nearest even to the output dtype). It
// supports every node the shape rules accept, in every dtype combination. Kernels live in one
// file per op family (dense.cpp, norm.cpp, activation.cpp, elementwise.cpp, loss.cpp), mirroring
// graph/ops/; the table that dispatches to them is generated from graph/ops.def in kernels.cpp;
// the fused optimizer entry points are in optimizer.cpp. Its kernels keep their double buffers in
// std::vectors of their own (workspace 0): the oracle's memory use is not planned, only the fast
// backends' is exact.
#pragma once
#include "backend/host.h"

namespace loom {

// Indexed by OpKind, generated from graph/ops.def (kernels.cpp).
extern const KernelFn kReferenceKernels[];

class ReferenceBackend final : public HostBackend {
 public:
  ReferenceBackend() : HostBackend(kReferenceKernels, nullptr) {}
  const char* name() const override { return "reference"; }
  // Every node the shape rules accept: a node only exists once its rule accepted it.
  bool supports(const Graph&, const Node&) const override { return true; }
  double grad_sq_norm(std::span<const OptimTensor> ts) override;
  void optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) override;
  // A naive double-accumulating 192³ matmul in its kernels' style (dense.cpp).
  double measure_matmul_gflops(DType compute) override;
};

}  // namespace loom
