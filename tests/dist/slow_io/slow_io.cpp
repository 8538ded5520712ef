// LD_PRELOAD'ed into loom by tests/dist: a slow or hung disk, on one rank. Each call of `fsync`,
// `open` or `pread` on a file whose path contains $LOOM_SLOW_PATH sleeps $LOOM_SLOW_SECONDS
// first, in the process whose OMPI_COMM_WORLD_RANK is $LOOM_SLOW_RANK (any process when unset),
// when $LOOM_SLOW_CALL names that function; only the first $LOOM_SLOW_TIMES such calls when set.
// Nothing changes without these variables.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void maybe_sleep(const char* call, const char* path) {
  const char* want = std::getenv("LOOM_SLOW_CALL");
  const char* part = std::getenv("LOOM_SLOW_PATH");
  const char* secs = std::getenv("LOOM_SLOW_SECONDS");
  if (!want || !part || !secs || std::strcmp(want, call) != 0 || !path || !std::strstr(path, part)) return;
  const char* rank = std::getenv("LOOM_SLOW_RANK");
  const char* mine = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank && (!mine || std::strcmp(rank, mine) != 0)) return;
  static int calls = 0;
  const char* times = std::getenv("LOOM_SLOW_TIMES");
  if (times && calls++ >= std::atoi(times)) return;
  sleep(static_cast<unsigned>(std::atoi(secs)));
}

template <class F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

// maybe_sleep for the file open at `fd`.
void maybe_sleep_fd(const char* call, int fd) {
  char path[PATH_MAX] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  if (readlink(link.c_str(), path, sizeof path - 1) > 0) maybe_sleep(call, path);
}

}  // namespace

extern "C" int fsync(int fd) {
  maybe_sleep_fd("fsync", fd);
  static const auto next = real<int (*)(int)>("fsync");
  return next(fd);
}

extern "C" ssize_t pread(int fd, void* buf, size_t n, off_t offset) {
  maybe_sleep_fd("pread", fd);
  static const auto next = real<ssize_t (*)(int, void*, size_t, off_t)>("pread");
  return next(fd, buf, n, offset);
}

extern "C" ssize_t pread64(int fd, void* buf, size_t n, off_t offset) {
  maybe_sleep_fd("pread", fd);
  static const auto next = real<ssize_t (*)(int, void*, size_t, off_t)>("pread64");
  return next(fd, buf, n, offset);
}

extern "C" int open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = static_cast<mode_t>(va_arg(ap, int));
    va_end(ap);
  }
  maybe_sleep("open", path);
  static const auto next = real<int (*)(const char*, int, ...)>("open");
  return next(path, flags, mode);
}
