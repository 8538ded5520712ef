// Backend selection by name: "auto" (the best available: cpu until a GPU backend exists),
// "cpu", or "reference" (the slow double-precision oracle).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace loom {

// Throws UserError for an unknown name.
std::unique_ptr<Backend> make_backend(const std::string& device);
// Sets the thread count of the one OpenMP runtime shared by our kernels and BLAS (0 = all cores).
void set_num_threads(int n);
int num_threads();
// The thread count set_num_threads(n) would set (0 = all cores), without setting it.
int resolve_threads(int n);

}  // namespace loom
