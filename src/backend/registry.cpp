#include "backend/registry.h"

#include <omp.h>

#include "backend/cpu/cpu.h"
#include "backend/reference/reference.h"
#include "core/error.h"

namespace loom {

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "auto" || device == "cpu") return std::make_unique<CpuBackend>();
  if (device == "reference") return std::make_unique<ReferenceBackend>();
  throw UserError("device '" + device + "'", "unknown device", "use auto, cpu or reference");
}

int resolve_threads(int n) { return n > 0 ? n : omp_get_num_procs(); }

void set_num_threads(int n) {
  // oneDNN runs in the same libgomp pool and follows this count: one set of threads, not two.
  omp_set_num_threads(resolve_threads(n));
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace loom
