#include "train/console.h"

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
