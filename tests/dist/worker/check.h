// What the workers test_dist runs under mpirun share: a failed check prints a line with FAILED
// and the rank, and is counted (a worker exits 1 when any failed).
#pragma once
#include <cstdio>
#include <string>

namespace loom::testing {

inline int failures = 0;

inline void check(bool ok, const std::string& what, int rank) {
  if (ok) return;
  std::printf("rank %d: FAILED %s\n", rank, what.c_str());
  ++failures;
}

}  // namespace loom::testing
