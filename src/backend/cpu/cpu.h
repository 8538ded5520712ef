// The CPU backend: the fast host kernels (OpenMP + oneDNN sgemm), checked op by op against the
// reference backend (tests/backend/test_ops.cpp).
//
// Numerics follow the reference backend's definitions (backend/reference/), with f32 instead of
// double accumulation: dense rounds its operands to the compute dtype and runs fp32 sgemm on the
// widened values, activations evaluate the shared kmath formulas in float, and every
// reduction uses a fixed partition and order, so results are bitwise independent of the
// thread count. Kernels live in one file per op family (dense.cpp, norm.cpp, activation.cpp,
// elementwise.cpp, loss.cpp, attention.cpp), each with its workspace rule cpu_workspace_<op>
// (workspace.h: the kernel's scratch comes from the plan, sized by the same layout function the
// kernel carves it with); kernels.cpp holds the tables generated from graph/ops.def; optimizer.cpp
// the fused optimizer passes; simd/ the hand-vectorised block products attention uses.
#pragma once
#include "backend/host.h"

namespace loom {

// Indexed by OpKind, generated from graph/ops.def (kernels.cpp).
extern const KernelFn kCpuKernels[];
extern const WorkspaceFn kCpuWorkspace[];

class CpuBackend final : public HostBackend {
 public:
  // Fixes glibc's mmap threshold for the process (once; dense.cpp says why).
  CpuBackend();
  const char* name() const override { return "cpu"; }
  // Every node the shape rules accept: each kernel handles every dtype combination its rule
  // lets through (16-bit floats via block conversion, int32 through core/dtype.h's convert).
  bool supports(const Graph&, const Node&) const override { return true; }
  // One parallel pass over all gradients; per-chunk double partial sums added in a fixed order.
  double grad_sq_norm(std::span<const OptimTensor> ts) override;
  // One parallel pass over param/grad/mu/nu of all tensors (optax sgd/adam/adamw, float arithmetic,
  // bias corrections 1 − b^count computed once in float).
  void optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) override;
  // Square products (1024³ and 2048³) on all threads the way the dense kernels run `compute`
  // (oneDNN's sgemm, or its bf16 matmul primitive for bfloat16 where the CPU has AVX512-BF16 or
  // AMX), the best of them (ceiling.cpp).
  double measure_matmul_gflops(DType compute) override;
  const char* matmul_ceiling_method() const override {
    return "best of 3 runs of 1024^3 and 2048^3 matmuls as the dense kernels run the compute dtype (oneDNN sgemm; its "
           "bf16 matmul on AVX512-BF16 or AMX), all threads";
  }
  std::string matmul_kernel(DType compute) const override;
};

}  // namespace loom
