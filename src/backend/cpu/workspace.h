// How the CPU kernels use their workspace (KernelArgs::workspace, planned in the arena): a bump
// allocator over named spans. Each kernel that needs scratch has one layout function that takes
// its spans from a Bump in a fixed order and returns them in a struct with a field per span. The
// kernel runs it on its workspace; its cpu_workspace_<op> runs the same function on a counting
// Bump, which has no memory behind it and only adds up the sizes. The plan and the kernel thus
// cannot disagree about the bytes, and a kernel that took more than its workspace aborts here.
//
// Per-thread spans are sized for the team a kernel's parallel region will have (team(), at most
// the workspace's thread count); the region is opened with exactly that team (num_threads), so a
// thread's span is picked by omp_get_thread_num().
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/host.h"
#include "core/error.h"

namespace loom::cpuk {

// Every span starts on its own cache line (the arena's alignment: the workspace base is aligned).
inline constexpr int64_t kSpanAlign = 64;

// n elements of T for each of `team` threads. In a parallel region of that team, mine() is the
// calling thread's span (nullptr for an empty one).
template <class T>
struct PerThread {
  T* base = nullptr;
  int64_t stride = 0;  // elements from one thread's span to the next
  int team = 1;
  T* mine() const {
    if (!base) return nullptr;
    const int t = omp_get_thread_num();
    LOOM_ASSERT(t < team, "a parallel region has more threads than its workspace was sized for");
    return base + t * stride;
  }
};

class Bump {
 public:
  // Spans carved from a node's workspace.
  explicit Bump(const Workspace& w) : base_(static_cast<std::byte*>(w.data)), cap_(w.bytes), threads_(w.threads) {}
  // Counting only: take() returns nullptr and used() adds up what a workspace needs.
  static Bump counter(int threads) { return Bump(Workspace{nullptr, 0, threads}); }

  // n elements of T, aligned to kSpanAlign (nullptr when n is 0, or when counting).
  template <class T>
  T* take(int64_t n) {
    if (n == 0) return nullptr;
    const int64_t off = (used_ + kSpanAlign - 1) / kSpanAlign * kSpanAlign;
    used_ = off + n * static_cast<int64_t>(sizeof(T));
    if (!base_) return nullptr;
    LOOM_ASSERT(used_ <= cap_, "a kernel took " + std::to_string(used_) + " bytes of workspace, its plan reserved " +
                                   std::to_string(cap_));
    return reinterpret_cast<T*>(base_ + off);
  }
  // n elements of T per thread of a team of `team` (each span aligned).
  template <class T>
  PerThread<T> per_thread(int64_t n, int team) {
    const int64_t per_line = kSpanAlign / static_cast<int64_t>(sizeof(T));
    const int64_t stride = (n + per_line - 1) / per_line * per_line;
    return {take<T>(stride * team), stride, team};
  }
  // The team of a parallel region over `work_items` items that runs in parallel when `parallel`:
  // the workspace's thread count, no more threads than items, 1 when serial.
  int team(bool parallel, int64_t work_items) const {
    if (!parallel || work_items <= 1) return 1;
    return static_cast<int>(work_items < threads_ ? work_items : threads_);
  }
  int64_t used() const { return used_; }

  // A parallel loop of `team` threads each making library calls that malloc up to `per_call` bytes
  // for themselves (sgemm: sgemm_call_bytes), one call at a time per thread: the most its threads
  // hold at once. The plan keeps the largest over the kernel's loops (library_used) as a host row
  // beside the arena; a kernel's workspace never holds them.
  void library(int64_t per_call, int team) { library_ = std::max(library_, per_call * team); }
  int64_t library_used() const { return library_; }

 private:
  std::byte* base_;
  int64_t cap_;
  int threads_;
  int64_t used_ = 0;
  int64_t library_ = 0;
};

// The calling thread's span of s, as a workspace of its own for a Bump to carve (a layout within
// each thread's span: one function takes the same spans from it and, counting, sizes it).
inline Workspace mine(const PerThread<std::byte>& s) { return Workspace{s.mine(), s.stride, 1}; }

// cpu_workspace_<op> for a kernel whose layout function is `Layout(Bump&, const KernelArgs&)`.
template <auto Layout>
KernelScratch workspace_of(const KernelArgs& a) {
  Bump b = Bump::counter(a.workspace.threads);
  Layout(b, a);
  return {b.used(), b.library_used()};
}

}  // namespace loom::cpuk

// For the kernels that need no workspace: cpu_workspace_<op> returning none.
#define LOOM_CPU_NO_WORKSPACE(op) \
  KernelScratch cpu_workspace_##op(const KernelArgs&) { return {}; }
