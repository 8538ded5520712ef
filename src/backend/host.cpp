#include "backend/host.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace loom {

void* HostBackend::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) return nullptr;
  const std::lock_guard lock(alloc_mutex_);
  allocated_[p] = bytes;
  live_bytes_ += static_cast<int64_t>(bytes);
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return p;
}
void HostBackend::deallocate(void* p) {
  if (!p) return;
  {
    const std::lock_guard lock(alloc_mutex_);
    const auto it = allocated_.find(p);
    LOOM_ASSERT(it != allocated_.end(), "deallocating memory this backend did not allocate");
    live_bytes_ -= static_cast<int64_t>(it->second);
    allocated_.erase(it);
  }
  std::free(p);
}
int64_t HostBackend::peak_allocated_bytes() const {
  const std::lock_guard lock(alloc_mutex_);
  return peak_bytes_;
}
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

KernelScratch HostBackend::scratch(const Graph& g, const Node& n, int threads) const {
  if (!workspace_ || !supports_op(n.op)) return {};
  std::vector<TensorArg> in, out;
  for (ValueId v : n.in) in.push_back(TensorArg{nullptr, g.value(v).shape, g.value(v).dtype});
  for (ValueId v : n.out) out.push_back(TensorArg{nullptr, g.value(v).shape, g.value(v).dtype});
  return workspace_[static_cast<size_t>(n.op)](KernelArgs{n, in, out, RunCtx{}, Workspace{nullptr, 0, threads}});
}

}  // namespace loom
