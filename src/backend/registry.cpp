#include "backend/registry.h"

#include <omp.h>

#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/reference/reference.h"
#include "core/error.h"

namespace loom {

std::unique_ptr<Backend> make_backend(Device device) {
  switch (device) {
    case Device::auto_:
    case Device::cpu:
      return std::make_unique<CpuBackend>();
    case Device::reference:
      return std::make_unique<ReferenceBackend>();
  }
  LOOM_ASSERT(false, "Device value " + std::to_string(static_cast<int>(device)));
  return nullptr;
}

std::span<const Device> backend_devices() {
  static const std::vector<Device> devices = [] {
    std::vector<Device> d;
    for (size_t i = 0; i < choices_of(Device{}).size(); ++i)
      if (static_cast<Device>(i) != Device::auto_) d.push_back(static_cast<Device>(i));
    return d;
  }();
  return devices;
}

std::unique_ptr<Backend> make_backend(std::string_view device) {
  return make_backend(parse_choice_or_throw<Device>(device, "device"));
}

int resolve_threads(int n) { return n > 0 ? n : omp_get_num_procs(); }

void set_num_threads(int n) {
  // oneDNN runs in the same libgomp pool and follows this count: one set of threads, not two.
  omp_set_num_threads(resolve_threads(n));
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace loom
