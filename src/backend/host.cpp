#include "backend/host.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace loom {

void* HostBackend::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded ? rounded : 64);
}
void HostBackend::deallocate(void* p) { std::free(p); }
void HostBackend::copy_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void HostBackend::copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void HostBackend::fill_zero(void* dst, size_t bytes) { std::memset(dst, 0, bytes); }
double HostBackend::now_us() const {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

int64_t HostBackend::memory_available() const {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

int64_t HostBackend::workspace_bytes(const Graph& g, const Node& n, int threads) const {
  if (!workspace_) return 0;
  std::vector<TensorArg> in, out;
  for (ValueId v : n.in) in.push_back(TensorArg{nullptr, g.value(v).shape, g.value(v).dtype});
  for (ValueId v : n.out) out.push_back(TensorArg{nullptr, g.value(v).shape, g.value(v).dtype});
  return workspace_[static_cast<size_t>(n.op)](KernelArgs{n, in, out, RunCtx{}, Workspace{nullptr, 0, threads}});
}

}  // namespace loom
