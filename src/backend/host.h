// Shared base of the two host-memory backends (reference and cpu): aligned host allocations,
// memcpy transfers, a steady clock, and dispatch through a kernel table generated from the op
// table.
#pragma once
#include "backend/backend.h"

namespace loom {

class HostBackend : public Backend {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* p) override;
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void synchronize() override {}
  double now_us() const override;
  int64_t memory_available() const override;
  void run(const KernelArgs& a) override { kernels_[static_cast<size_t>(a.node.op)](a); }

 protected:
  explicit HostBackend(const KernelFn* kernels) : kernels_(kernels) {}

 private:
  const KernelFn* kernels_;
};

}  // namespace loom
