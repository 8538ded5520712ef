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

// Terminal output never blocks a save. A terminal that stopped reading (a paused or dropped SSH
// session, mpirun no longer forwarding its ranks' output) makes a plain write wait forever, and a
// run stopped by a signal would never reach its checkpoint. A guarded stream writes to `fd` and
// waits for the reader as a plain one does while the run goes on (nothing is lost in a normal
// run), until abandon_blocked_output(): from then on, bytes that cannot be written at once are
// dropped. Line-buffered on a terminal, fully buffered otherwise (flush to see a line). Close
// with fclose (which does not close `fd`). Linux/glibc (fopencookie, poll).
// A terminal can poll writable with less room than a write needs, and block inside it: with
// `own_fd` (no other process writes through fd's open file, as for a rank's stdout under mpirun)
// fd is made non-blocking, so such a write waits in poll like any other. A terminal shared with a
// shell must stay blocking (the shell would inherit the flag).
std::FILE* open_guarded_output(int fd, bool own_fd = false);
// Called once a stop signal arrived; async-signal-safe (one atomic store).
void abandon_blocked_output();

}  // namespace loom
