// Shared base of the host-memory backends (reference and cpu): aligned host allocations, memcpy
// transfers, a steady clock, and dispatch through kernel and workspace tables indexed by OpKind.
// A nullptr kernel entry marks an op the backend lacks (supports_op is false for it).
#pragma once
#include <mutex>
#include <unordered_map>

#include "backend/backend.h"

namespace loom {

// What a kernel needs besides its inputs and outputs: bytes of workspace (Backend::workspace_bytes)
// and bytes the libraries it calls allocate for themselves while it runs (Backend::library_bytes).
struct KernelScratch {
  int64_t workspace = 0;
  int64_t library = 0;
};
// A kernel's KernelScratch for the node, shapes and dtypes in `a` (whose tensors and workspace
// have no memory behind them: a.workspace.threads is the thread count to size for).
using WorkspaceFn = KernelScratch (*)(const KernelArgs& a);

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
  int64_t peak_allocated_bytes() const override;
  bool supports_op(OpKind op) const override { return kernels_[static_cast<size_t>(op)] != nullptr; }
  void run(const KernelArgs& a) override { kernels_[static_cast<size_t>(a.node.op)](a); }
  // Both from workspace_[op] on the node's value descriptions; 0 without a workspace table.
  int64_t workspace_bytes(const Graph& g, const Node& n, int threads) const override {
    return scratch(g, n, threads).workspace;
  }
  int64_t library_bytes(const Graph& g, const Node& n, int threads) const override {
    return scratch(g, n, threads).library;
  }

 protected:
  // Both tables are indexed by OpKind; `workspace` may be nullptr (kernels that use none), and so
  // may the workspace entry of an op whose kernel entry is nullptr.
  HostBackend(const KernelFn* kernels, const WorkspaceFn* workspace) : kernels_(kernels), workspace_(workspace) {}

 private:
  const KernelFn* kernels_;
  const WorkspaceFn* workspace_;
  KernelScratch scratch(const Graph& g, const Node& n, int threads) const;
  mutable std::mutex alloc_mutex_;               // allocations are rare (set-up), and may come from any thread
  std::unordered_map<void*, size_t> allocated_;  // live allocations and their requested sizes
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace loom
