// A run directory that never loses work (docs/ARCHITECTURE.md, "Runs"):
//
// - Ownership. A directory is a loom run when it holds loom's marker file `loom-run.json` (run
//   id, creation time, what it was seeded from) — or, for runs made before the marker existed,
//   loom's config.toml (first line kConfigHeader). loom deletes or replaces only entries it wrote
//   there: the marker, the lock, a config.toml starting with kConfigHeader, metrics.jsonl beside
//   the marker or loom's config.toml, ckpt_<digits>/ and best/ directories (not symbolic links)
//   holding loom's state.json, staged .ckpt_*/.best.* directories, superseded/ and
//   loom-stopped.txt. Anything else (a user's config.toml, metrics.jsonl, ckpt_photos/, a file
//   named best, notes.txt) is never touched: a new run that would have to write over one is
//   refused (refuse_foreign_files), --overwrite or not.
// - A lock. `lock()` takes an exclusive flock on `.lock` and writes the holder's pid there; a second
//   process is refused with a message naming that pid. The kernel drops a flock when its process
//   dies, so a stale lock from a killed run is simply taken over.
// - Forks instead of overwrites. Resuming from an earlier checkpoint moves the later checkpoints
//   (and best/ when it is later, and the metrics lines after the resumed step) into
//   superseded/<time>-from-step-<N>/, unless the user asked to discard them.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace loom {

// The first line of the config.toml loom writes into a run directory: what tells loom's
// config.toml from a user's file of the same name.
inline constexpr const char* kConfigHeader = "# effective configuration of this run (loom train)";

class RunDir {
 public:
  explicit RunDir(std::filesystem::path dir);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const std::filesystem::path& path() const { return dir_; }
  // Whether the directory holds a loom run (marker, a legacy config.toml, metrics or checkpoints).
  bool holds_run() const;
  // Takes the exclusive lock, creating the directory (and parents) when missing. Throws UserError
  // naming the pid of a live holder. Idempotent.
  void lock();
  // Throws a UserError naming a file a new run would write over (config.toml, metrics.jsonl) that
  // loom cannot tell it wrote: a config.toml without kConfigHeader, a metrics.jsonl in a directory
  // with neither loom-run.json nor loom's config.toml, or anything under a checkpoint's name (best,
  // ckpt_<digits>) but loom's checkpoint directory (is_checkpoint_dir: a file, a symbolic link, a
  // directory without state.json). Call before anything is written. Resuming in place at
  // `resumed_step`, only the checkpoint names the run can still write are checked: best and
  // ckpt_<digits> of a later step (an earlier one is never saved again, pruned or removed).
  void refuse_foreign_files(int64_t resumed_step = -1) const;
  // Removes every entry loom owns (see the header comment) and nothing else. Needs the lock.
  void clear_owned();
  // Writes a fresh marker (new run id); `seeded_from` names the checkpoint a new run starts from.
  void write_marker(const std::string& seeded_from = {});
  // What fork_at moved aside or deleted, for the log.
  struct Forked {
    std::vector<std::string> names;  // "ckpt_000750", "best", "metrics.jsonl (3 lines after step 500)"
    std::filesystem::path aside;     // where they went; empty when deleted or when nothing moved
  };
  // Prepares a resume at `step`: later checkpoints (and a later best/) and metrics lines with a
  // larger step are moved to superseded/<time>-from-step-<step>/ or, with `discard`, deleted.
  // Needs the lock.
  Forked fork_at(int64_t step, bool discard);
  // Keeps only the metrics.jsonl lines of steps <= `step` (atomically; no line is logged twice).
  void truncate_metrics(int64_t step);
  // loom-stopped.txt: the closing line of a run stopped by a signal (what it saved, the command that
  // continues it), kept where no terminal can lose it; removed when the run goes on.
  static constexpr const char* kStopNote = "loom-stopped.txt";
  void write_stop_note(const std::string& line);
  void remove_stop_note();

 private:
  // Whether metrics.jsonl is loom's: the marker or loom's config.toml vouches for it.
  bool owns_metrics() const;
  std::filesystem::path dir_;
  int lock_fd_ = -1;
};

// Lines of a metrics.jsonl file whose "step" is <= `step` (all lines are kept when unparsable).
std::string metrics_up_to(const std::string& jsonl_text, int64_t step, std::string* rest = nullptr);

}  // namespace loom
