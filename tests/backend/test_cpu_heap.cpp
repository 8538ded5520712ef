// What the CPU backend leaves in the process's malloc heaps: oneDNN's sgemm mallocs a packing buffer
// in every call and frees it before returning (backend/cpu/cpu_util.h gemm_rm). With the CPU
// backend constructed, a freed buffer goes back to the system instead of staying resident in a
// heap (backend/cpu/dense.cpp), so a run's RSS does not grow past its memory plan step by step.
#include <gtest/gtest.h>

#include <malloc.h>
#include <omp.h>

#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"

namespace loom {
namespace {

TEST(CpuHeap, SgemmPackingBuffersAreNotKeptInTheHeap) {
  const CpuBackend cpu;
  // C[128, N] = A[128, 768]·B[N, 768]ᵀ, a logits product: oneDNN sees the column-major C^T and packs its N rows in
  // blocks of up to 9984, about 15 MB per call at N = 16384 (a GPT-2 logits tile's size).
  const int64_t M = 128, K = 768, N = 16384;
  const std::vector<float> A(M * K, 1.f), B(K * N, 1.f);
  std::vector<float> C(M * N);
  // Single-threaded, as inside the dense kernels' tile loops (dense.cpp run_tiles).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const size_t free_before = mallinfo2().fordblks;
  // glibc's default threshold rises to the size of a mapped block once it is freed: the call after
  // the first one that packs fewer rows (a product with fewer columns) then takes its buffer from a heap.
  for (const int64_t n : {N, N / 2, N / 4})
    cpuk::sgemm_rm(false, true, M, n, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
  omp_set_num_threads(threads);
  EXPECT_EQ(C[0], static_cast<float>(K));
  const size_t free_after = mallinfo2().fordblks;
  // Free bytes the heaps hold: a kept packing buffer would add several MB.
  EXPECT_LT(free_after, free_before + (2u << 20)) << "heaps hold " << (free_after - free_before) << " more free bytes";
}

}  // namespace
}  // namespace loom
