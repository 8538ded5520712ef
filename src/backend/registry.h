// Backend selection by name (the `device` key), and the list of every backend loom builds: the
// op and finite-difference tests run over backend_devices(), so a new backend is tested by adding
// its row to LOOM_DEVICES and its case to make_backend.
#pragma once
#include <memory>
#include <span>
#include <string_view>

#include "backend/backend.h"
#include "core/choice.h"

#define LOOM_DEVICES(X)                                           \
  X(auto_, "the best available (cpu until a GPU backend exists)") \
  X(cpu, "the fast CPU kernels (oneDNN GEMMs, OpenMP)")           \
  X(reference, "the slow double-precision oracle")

namespace loom {

LOOM_CHOICE(Device, "device", LOOM_DEVICES)

std::unique_ptr<Backend> make_backend(Device device);
// Every device that names a backend of its own (each but auto_), in LOOM_DEVICES order.
std::span<const Device> backend_devices();
// By name; throws UserError for an unknown one.
std::unique_ptr<Backend> make_backend(std::string_view device);
// Sets the thread count of the one OpenMP runtime shared by our kernels and BLAS (0 = all cores).
void set_num_threads(int n);
int num_threads();
// The thread count set_num_threads(n) would set (0 = all cores), without setting it.
int resolve_threads(int n);

}  // namespace loom
