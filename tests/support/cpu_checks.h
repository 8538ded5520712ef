// Test support for the CPU backend: bitwise comparison and thread-count independence.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu.h"
#include "support/op_harness.h"

namespace loom::testing {

// Sets the OpenMP thread count for a scope.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

inline void expect_bytes_equal(const HostTensor& a, const HostTensor& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.bytes.size(), b.bytes.size()) << what;
  const size_t sz = dtype_size(a.dtype);
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(a.bytes.data() + i * sz, b.bytes.data() + i * sz, sz) != 0) {
      ADD_FAILURE() << what << ": element " << i << " differs: " << a.get(i) << " vs " << b.get(i);
      return;
    }
}

// Runs `oc` on the CPU backend with 1, 2 and 3 OpenMP threads; the outputs must be bitwise equal.
inline void expect_thread_invariant(OpCase& oc, const std::string& what) {
  std::vector<std::vector<HostTensor>> runs;
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    CpuBackend cpu;
    runs.push_back(oc.run(cpu));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t k = 0; k < runs[0].size(); ++k)
      expect_bytes_equal(runs[r][k], runs[0][k],
                         what + " out" + std::to_string(k) + ": " + std::to_string(r + 1) + " threads vs 1");
  }
}

}  // namespace loom::testing
