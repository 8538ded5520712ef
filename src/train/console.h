// The terminal's status line: the progress bar `loom train` redraws in place at the bottom of a
// terminal. A line printed while the bar is drawn would land glued to it (`...ETA 1.0s step 30:
// val loss`), so everything that prints while a run may have a bar on screen calls
// clear_status_line() first: it erases the bar ("\r\x1b[K") when one is drawn and does nothing
// otherwise (no terminal, nothing drawn). The state is the process's: there is one terminal.
#pragma once
#include <cstdio>
#include <string_view>

namespace loom {

// Draws `text` as the status line on `out` (replacing the one drawn before), and flushes.
void draw_status_line(std::FILE* out, std::string_view text);
// Erases the status line if one is drawn; the next output starts at the beginning of a clean line.
void clear_status_line();

}  // namespace loom
