#include "train/console.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>

namespace loom {

namespace {
std::FILE* g_drawn_on = nullptr;  // the stream holding a drawn status line, if any
}  // namespace

void draw_status_line(std::FILE* out, std::string_view text) {
  if (g_drawn_on && g_drawn_on != out) clear_status_line();
  std::fputc('\r', out);
  std::fwrite(text.data(), 1, text.size(), out);
  std::fputs("\x1b[K", out);
  std::fflush(out);
  g_drawn_on = out;
}

void clear_status_line() {
  if (!g_drawn_on) return;
  std::fputs("\r\x1b[K", g_drawn_on);
  std::fflush(g_drawn_on);
  g_drawn_on = nullptr;
}

}  // namespace loom

namespace loom {

namespace {
std::atomic<bool> g_abandoned{false};

ssize_t guarded_write(void* cookie, const char* buf, size_t size) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(cookie));
  size_t done = 0;
  while (done < size) {
    // Polled in slices so a write that waits notices abandon_blocked_output() soon after it.
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    const int ready = ::poll(&p, 1, g_abandoned ? 0 : 50);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && !g_abandoned) continue;
    if (ready <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) break;  // nobody reads: drop the rest
    // At most PIPE_BUF at a time: a pipe that polls writable takes that much without blocking.
    const ssize_t n = ::write(fd, buf + done, std::min<size_t>(size - done, PIPE_BUF));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;  // EAGAIN: a terminal with less room than that
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(size);  // what was dropped is not an error of the stream
}
}  // namespace

std::FILE* open_guarded_output(int fd, bool own_fd) {
  if (own_fd) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const cookie_io_functions_t io{.read = nullptr, .write = guarded_write, .seek = nullptr, .close = nullptr};
  std::FILE* f = fopencookie(reinterpret_cast<void*>(static_cast<intptr_t>(fd)), "w", io);
  if (f) std::setvbuf(f, nullptr, isatty(fd) ? _IOLBF : _IOFBF, BUFSIZ);
  return f;
}

void abandon_blocked_output() { g_abandoned = true; }

}  // namespace loom
