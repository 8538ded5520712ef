#include "run/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/write_error.h"
#include "train/checkpoint.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

const char* kMarker = "loom-run.json";
const char* kLock = ".lock";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Writes `text` to a temporary sibling, fsyncs it and renames it over `p`: all or nothing.
void replace_file(const fs::path& p, const std::string& text) {
  // Appended piecewise: GCC 12 gives a false -Wrestrict for "." + std::string.
  std::string name = ".";
  name += p.filename().string();
  name += ".tmp";
  const fs::path tmp = p.parent_path() / name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_write(tmp.string(), "cannot create it", errno);
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int e = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), p.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail_write(p.string(), "cannot write it", e ? e : EIO);
  }
}

bool is_loom_config(const fs::path& p) {
  std::ifstream f(p);
  std::string first;
  std::getline(f, first);
  return first == kConfigHeader;
}

std::string utc_now(const char* fmt) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

}  // namespace

std::string metrics_up_to(const std::string& text, int64_t step, std::string* rest) {
  std::istringstream in(text);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    int64_t s = -1;
    try {
      s = nlohmann::json::parse(line).value("step", int64_t{-1});
    } catch (const nlohmann::json::exception&) {
    }
    if (s > step) {
      if (rest) *rest += line + "\n";
    } else {
      kept += line + "\n";
    }
  }
  return kept;
}

RunDir::RunDir(fs::path dir) : dir_(std::move(dir)) {}

RunDir::~RunDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

bool RunDir::holds_run() const {
  if (!fs::exists(dir_)) return false;
  if (fs::exists(dir_ / kMarker) || fs::exists(dir_ / "metrics.jsonl")) return true;
  if (fs::exists(dir_ / "config.toml") && is_loom_config(dir_ / "config.toml")) return true;
  if (is_checkpoint_dir((dir_ / "best").string())) return true;
  return !list_checkpoints(dir_.string()).empty();
}

void RunDir::lock() {
  if (lock_fd_ >= 0) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw UserError(dir_.string(), "cannot create the run directory: " + ec.message(),
                    "choose an --out directory you can write to");
  const fs::path lp = dir_ / kLock;
  const int fd = ::open(lp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw UserError(dir_.string(), std::string("cannot create its lock file: ") + std::strerror(errno),
                    "choose an --out directory you can write to");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder = read_file(lp);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd);
    throw UserError(dir_.string(),
                    "is in use by another loom process" + (holder.empty() ? std::string() : " (pid " + holder + ")"),
                    "wait for that run to finish or stop it (kill " + (holder.empty() ? "<pid>" : holder) +
                        " saves a checkpoint first), or give this run another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The lock holds without the pid; only the message of a second process would lack it.
  }
  lock_fd_ = fd;
}

bool RunDir::owns_metrics() const { return fs::exists(dir_ / kMarker) || is_loom_config(dir_ / "config.toml"); }

void RunDir::refuse_foreign_files(int64_t resumed_step) const {
  const char* fix =
      "move it out of the directory (loom never deletes a file it did not write), or choose another --out";
  if (fs::exists(dir_ / "config.toml") && !is_loom_config(dir_ / "config.toml"))
    throw UserError((dir_ / "config.toml").string(),
                    "is not a config.toml loom wrote (its first line is not loom's header), and a run writes its own "
                    "there",
                    fix);
  if (fs::exists(dir_ / "metrics.jsonl") && !owns_metrics())
    throw UserError((dir_ / "metrics.jsonl").string(),
                    "is not known to be loom's (the directory has no loom-run.json and no config.toml of loom's), and "
                    "a run writes its own there",
                    fix);
  // In name order, so that the entry named is the same on every file system.
  std::vector<fs::path> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    int64_t step = 0;
    const std::string n = e.path().filename().string();
    if ((n == "best" || (is_checkpoint_name(n, &step) && step > resumed_step)) && !is_checkpoint_dir(e.path().string()))
      names.push_back(e.path());
  }
  if (names.empty()) return;
  std::sort(names.begin(), names.end());
  const fs::path& p = names.front();
  const fs::file_type type = fs::symlink_status(p, ec).type();
  throw UserError(p.string(),
                  std::string("is ") +
                      (type == fs::file_type::symlink     ? "a symbolic link"
                       : type == fs::file_type::directory ? "a directory without loom's state.json"
                                                          : "a file") +
                      ", not a checkpoint loom wrote, and a run writes its checkpoints under that name",
                  fix);
}

void RunDir::clear_owned() {
  LOOM_ASSERT(lock_fd_ >= 0, "clear_owned without the lock");
  std::error_code ec;
  if (owns_metrics()) fs::remove(dir_ / "metrics.jsonl", ec);  // before the files that vouch for it go
  if (is_loom_config(dir_ / "config.toml")) fs::remove(dir_ / "config.toml", ec);
  fs::remove_all(dir_ / "superseded", ec);
  // First: a replacement cut between its two renames is rolled back to its name, removed below
  // with the rest (after, it would bring the old run's checkpoint back into the new run).
  remove_stale_checkpoint_files(dir_.string());
  if (is_checkpoint_dir((dir_ / "best").string())) remove_checkpoint_dir((dir_ / "best").string());
  for (const auto& [step, path] : list_checkpoints(dir_.string())) remove_checkpoint_dir(path);
  remove_stop_note();
  fs::remove(dir_ / kMarker, ec);
}

void RunDir::write_stop_note(const std::string& line) { replace_file(dir_ / kStopNote, line); }

void RunDir::remove_stop_note() {
  std::error_code ec;
  fs::remove(dir_ / kStopNote, ec);
}

void RunDir::write_marker(const std::string& seeded_from) {
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  nlohmann::json j = {{"run_id", id}, {"created", utc_now("%Y-%m-%dT%H:%M:%SZ")}, {"format", 1}};
  if (!seeded_from.empty()) j["seeded_from"] = seeded_from;
  replace_file(dir_ / kMarker, j.dump(2) + "\n");
}

RunDir::Forked RunDir::fork_at(int64_t step, bool discard) {
  LOOM_ASSERT(lock_fd_ >= 0, "fork_at without the lock");
  std::vector<fs::path> later;
  for (const auto& [s, path] : list_checkpoints(dir_.string()))
    if (s > step) later.emplace_back(path);
  if (is_checkpoint_dir((dir_ / "best").string()) && checkpoint_step((dir_ / "best").string()) > step)
    later.push_back(dir_ / "best");
  std::string rest;
  const fs::path metrics = dir_ / "metrics.jsonl";
  const std::string kept = fs::exists(metrics) ? metrics_up_to(read_file(metrics), step, &rest) : std::string();
  Forked f;
  if (later.empty() && rest.empty()) return f;
  std::error_code ec;
  fs::path& aside = f.aside;
  if (!discard) {
    // Unique even when the same step is forked twice within a second (a resume killed and retried).
    const std::string base = utc_now("%Y%m%d-%H%M%S") + "-from-step-" + std::to_string(step);
    aside = dir_ / "superseded" / base;
    for (int i = 2; fs::exists(aside); ++i) aside = dir_ / "superseded" / (base + "-" + std::to_string(i));
    fs::create_directories(aside);
    if (!rest.empty()) replace_file(aside / "metrics.jsonl", rest);
  }
  for (const fs::path& p : later) {
    f.names.push_back(p.filename().string());
    if (discard) {
      remove_checkpoint_dir(p.string());
    } else {
      fs::rename(p, aside / p.filename());
    }
  }
  if (!rest.empty()) {
    replace_file(metrics, kept);
    const auto lines = std::count(rest.begin(), rest.end(), '\n');
    f.names.push_back(fmt::format("metrics.jsonl's {} line{} after step {}", lines, lines == 1 ? "" : "s", step));
  }
  return f;
}

void RunDir::truncate_metrics(int64_t step) {
  const fs::path metrics = dir_ / "metrics.jsonl";
  if (!fs::exists(metrics)) return;
  const std::string text = read_file(metrics);
  const std::string kept = metrics_up_to(text, step);
  if (kept != text) replace_file(metrics, kept);
}

}  // namespace loom
