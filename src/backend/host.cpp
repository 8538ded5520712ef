#include "backend/host.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

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

}  // namespace loom
