#include "train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/write_error.h"
#include "io/param_io.h"
#include "nn/models.h"
#include "nn/param_layout.h"
#include "optim/optimizer.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

const char* kModelFile = "model.safetensors";
const char* kOptimizerFile = "optimizer.safetensors";
const char* kStateFile = "state.json";
constexpr int kFormat = 2;  // 1: moments inside model.safetensors

// ".<name><suffix>" beside `dir`: where a checkpoint is staged, swapped out or deleted.
fs::path sibling(const fs::path& dir, const char* suffix) {
  std::string name = ".";
  name += dir.filename().string();
  name += suffix;
  return dir.parent_path() / name;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot read the file", "the checkpoint is incomplete: choose another one");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// fsync(fd) on a thread of its own while this one answers the other ranks, which wait for this
// save, that this rank is alive (Comm::keep_alive): a flush to a slow or remote disk can take
// longer than their deadline, and is work, not a hang. Signals stay with the watcher of run/stop.h:
// the thread inherits this one's mask.
int sync_answering(int fd, dist::Comm& comm) {
  if (comm.size() == 1) return ::fsync(fd);
  std::atomic<bool> done{false};
  int rc = 0, err = 0;
  std::thread flusher([&] {
    rc = ::fsync(fd);
    err = errno;
    done = true;
  });
  while (!done) {
    comm.keep_alive();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  flusher.join();
  errno = err;
  return rc;
}

// Writes, flushes to disk and closes; a failure throws, naming the file (core/write_error.h).
void write_text(const std::string& path, const std::string& text, dist::Comm& comm) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_write(path, "cannot create it", errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      ::close(fd);
      fail_write(path, "cannot write it", e);
    }
    done += static_cast<size_t>(n);
  }
  const bool ok = sync_answering(fd, comm) == 0;
  const int e = errno;
  if (::close(fd) != 0 || !ok) fail_write(path, "cannot write it", ok ? errno : e);
}

void fsync_dir(const fs::path& dir, dist::Comm& comm) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)sync_answering(fd, comm);
    ::close(fd);
  }
}

// Thrown by a source that met a NaN or an infinity: the save is abandoned.
struct NonFinite {
  std::string tensor;
};

// Wraps each f32 source so that it checks what it reads: finiteness costs no extra pass. Between
// reads (every few MiB written) it answers the other ranks, which wait for this save, that this
// rank is alive (Comm::keep_alive): a long save does not trip their deadline.
void check_finite(std::vector<StSource>& sources, dist::Comm& comm) {
  for (StSource& s : sources) {
    s.read = [inner = std::move(s.read), name = s.name, &comm](void* dst, size_t off, size_t n) {
      comm.keep_alive();
      inner(dst, off, n);
      const auto* f = static_cast<const float*>(dst);
      bool finite = true;
      for (size_t i = 0; i < n / 4; ++i) finite &= std::isfinite(f[i]);
      if (!finite) throw NonFinite{name};
    };
  }
}

constexpr const char* kMomentPrefix[2] = {"opt/mu/", "opt/nu/"};

std::map<std::string, const StEntry*> by_name(const std::vector<StEntry>& entries) {
  std::map<std::string, const StEntry*> out;
  for (const StEntry& e : entries) out[e.name] = &e;
  return out;
}

// What rank 0 asks the others for while it writes sharded moments: elements [begin, begin + n)
// of moment `which` of parameter `param` (kParamValues: of its values, when the parameters are
// sharded too); which = -1: the save is over.
constexpr int kParamValues = 2;
struct Piece {
  int64_t which = -1, param = 0, begin = 0, n = 0;
};

// The sharded moments' way to the file: rank 0 writes each moment tensor through its
// kStreamBytes write buffer, and for each piece it broadcasts the Piece it needs and every rank
// sends its slice of it straight into that buffer (a gather at the slices' offsets). So no rank
// holds more of the state than its own shard and one piece: the others stage their part in
// kStreamBytes of their own. The other ranks serve pieces until rank 0 says the save is over,
// waiting in the numbered, deadline-polled collectives (rank 0 answers that it is busy while it
// writes and flushes).
class MomentStream {
 public:
  // Every rank of t.comm(), together: each learns every rank's moment_range of every parameter.
  explicit MomentStream(const Trainer& t) : t_(t), comm_(t.comm()), params_(t.model().graph.params().size()) {
    std::vector<dist::Range> mine(params_);
    for (size_t i = 0; i < params_; ++i) mine[i] = t.moment_range(i);
    ranges_.resize(params_ * static_cast<size_t>(comm_.size()));
    comm_.all_gather_bytes(mine.data(), params_ * sizeof(dist::Range), ranges_.data());
    if (comm_.rank() != 0) staging_.resize(kStreamBytes / sizeof(float));
  }
  // Rank 0: dst [n] = elements [begin, begin + n) of moment `which` of parameter `param`, n at
  // most kStreamBytes / 4.
  void fetch(int which, size_t param, int64_t begin, int64_t n, float* dst) {
    Piece p{.which = which, .param = static_cast<int64_t>(param), .begin = begin, .n = n};
    comm_.broadcast(&p, sizeof p, 0);
    exchange(p, dst);
  }
  // Rank 0, whether its save succeeded or not: the other ranks stop serving.
  void finish() {
    Piece done;
    comm_.broadcast(&done, sizeof done, 0);
  }
  // The other ranks: their parts of every piece rank 0 asks for, until it finishes.
  void serve() {
    for (;;) {
      Piece p;
      comm_.broadcast(&p, sizeof p, 0);
      if (p.which < 0) return;
      exchange(p, nullptr);
    }
  }

 private:
  // Every rank's part of piece p (its slice of the piece's elements, possibly none) to rank 0's dst.
  void exchange(const Piece& p, float* dst) {
    const size_t ranks = static_cast<size_t>(comm_.size());
    std::vector<int64_t> counts(ranks), displs(ranks);
    int64_t covered = 0;
    for (size_t r = 0; r < ranks; ++r) {
      const dist::Range& own = ranges_[r * params_ + static_cast<size_t>(p.param)];
      const int64_t lo = std::max(p.begin, own.begin), hi = std::min(p.begin + p.n, own.end);
      counts[r] = std::max<int64_t>(hi - lo, 0) * static_cast<int64_t>(sizeof(float));
      displs[r] = hi > lo ? (lo - p.begin) * static_cast<int64_t>(sizeof(float)) : 0;
      covered += counts[r];
    }
    LOOM_ASSERT(covered == p.n * static_cast<int64_t>(sizeof(float)), "the ranks' moment slices do not tile a piece");
    const auto me = static_cast<size_t>(comm_.rank());
    float* part = me == 0 ? dst + displs[0] / static_cast<int64_t>(sizeof(float)) : staging_.data();
    const int64_t begin = p.begin + displs[me] / static_cast<int64_t>(sizeof(float));
    const int64_t n = counts[me] / static_cast<int64_t>(sizeof(float));
    if (n > 0 && p.which == kParamValues)
      t_.read_param_shard(static_cast<size_t>(p.param), begin, n, part);
    else if (n > 0)
      t_.read_moment(static_cast<int>(p.which), static_cast<size_t>(p.param), begin, n, part);
    comm_.gather_bytes(part, dst, counts, displs, 0);
  }
  const Trainer& t_;
  dist::Comm& comm_;
  size_t params_;
  std::vector<dist::Range> ranges_;  // [rank × params_ + param]: every rank's moment_range
  std::vector<float> staging_;       // [kStreamBytes / 4] on ranks other than 0: its part of a piece
};

// The moments of every parameter, named like the parameters with an "opt/mu/" or "opt/nu/" prefix,
// read as they are written: from this rank's own buffers, or, when the optimizer state is
// sharded, piece by piece from every rank through `stream`.
std::vector<StSource> moment_sources(const Trainer& t, MomentStream* stream) {
  std::vector<StSource> out;
  const Graph& g = t.model().graph;
  for (int which : {0, 1}) {
    if (!t.optimizer().keeps_moment(which)) continue;
    for (size_t i = 0; i < g.params().size(); ++i) {
      if (!g.params()[i].trainable()) continue;  // a frozen parameter has no optimizer state
      const Value& v = g.value(g.params()[i].value);
      StSource s{.name = kMomentPrefix[which] + v.name, .dtype = DType::f32, .shape = v.shape, .read = {}};
      s.read = [&t, stream, which, i](void* dst, size_t off, size_t n) {
        const auto begin = static_cast<int64_t>(off / sizeof(float)), elems = static_cast<int64_t>(n / sizeof(float));
        if (stream)
          stream->fetch(which, i, begin, elems, static_cast<float*>(dst));
        else
          t.read_moment(which, i, begin, elems, static_cast<float*>(dst));
      };
      out.push_back(std::move(s));
    }
  }
  return out;
}

// The parameters as param_sources names and lays them out (stacked per layer for
// model.scan_layers); sharded (optimizer.shard = params), read piece by piece from every rank
// through `stream`, a stacked tensor's piece cut at its layers' boundaries.
std::vector<StSource> saved_param_sources(const Trainer& t, MomentStream* stream, nn::ParamSubset subset) {
  const bool scan_layers = t.config().model.transformer.scan_layers;
  std::vector<StSource> out = param_sources(t.executor(), scan_layers, {}, subset);
  if (!t.params_sharded()) return out;
  const Graph& g = t.model().graph;
  std::map<ValueId, size_t> index;  // Graph::params() order
  for (size_t i = 0; i < g.params().size(); ++i) index[g.params()[i].value] = i;
  const std::vector<nn::FileTensor> layout = nn::param_file_layout(g, scan_layers, subset);
  LOOM_ASSERT(layout.size() == out.size(), "param_sources follows the file layout");
  for (size_t k = 0; k < out.size(); ++k) {
    std::vector<std::pair<size_t, int64_t>> parts;  // (parameter, elements), in the tensor's order
    for (ValueId p : layout[k].params) parts.emplace_back(index.at(p), g.value(p).shape.numel());
    out[k].read = [stream, parts](void* dst, size_t off, size_t n) {
      auto* d = static_cast<float*>(dst);
      auto at = static_cast<int64_t>(off / sizeof(float)), left = static_cast<int64_t>(n / sizeof(float));
      for (const auto& [i, elems] : parts) {
        if (at >= elems) {
          at -= elems;
          continue;
        }
        const int64_t m = std::min(left, elems - at);
        stream->fetch(kParamValues, i, at, m, d);
        d += m;
        left -= m;
        at = 0;
        if (left == 0) return;
      }
    };
  }
  return out;
}

[[noreturn]] void rename_failed(const char* what, const fs::path& from, const fs::path& to, int err) {
  fail_write(from.string(), std::string("cannot ") + what + " it to '" + to.string() + "'", err);
}

// NFS, CephFS, 9p and FUSE refuse renameat2's flags with EINVAL (kernels without renameat2: ENOSYS).
bool flags_refused(int err) { return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP; }

// install() with plain rename(2), which every file system makes atomic. A rename never replaces a
// non-empty directory (ENOTEMPTY or EEXIST), and a finished checkpoint is never empty: so no
// finished checkpoint is ever overwritten. Replacing one (best/) takes two renames, the old one to
// .<name>.old, then `staged` to its name: at every instant one of the two names holds a whole
// checkpoint, and a kill between them leaves .<name>.old alone, which
// remove_stale_checkpoint_files() renames back.
void install_plain(const fs::path& staged, const fs::path& final_dir, dist::Comm& comm) {
  if (::rename(staged.c_str(), final_dir.c_str()) == 0) return fsync_dir(final_dir.parent_path(), comm);
  if (errno != ENOTEMPTY && errno != EEXIST) rename_failed("rename", staged, final_dir, errno);
  const fs::path old = sibling(final_dir, ".old");
  std::error_code ec;
  fs::remove_all(old, ec);
  if (::rename(final_dir.c_str(), old.c_str()) != 0) rename_failed("rename", final_dir, old, errno);
  fsync_dir(final_dir.parent_path(), comm);
  if (::rename(staged.c_str(), final_dir.c_str()) != 0) {
    const int e = errno;
    (void)::rename(old.c_str(), final_dir.c_str());
    rename_failed("rename", staged, final_dir, e);
  }
  fsync_dir(final_dir.parent_path(), comm);
  fs::remove_all(old, ec);
}

// Puts `staged` at `final_dir`: a rename that refuses to replace anything when nothing is there,
// else an atomic exchange (the old directory ends at `staged`'s name and is removed), so
// `final_dir` always exists whole; install_plain() where the file system refuses those flags, and
// everywhere when LOOM_PLAIN_RENAME is set (any value: tests take that path on any file system).
// Only a checkpoint loom wrote is ever replaced: a file, a symbolic link or a directory of somebody
// else's under the name fails the save, naming it, and stays as it was.
void install(const fs::path& staged, const fs::path& final_dir, dist::Comm& comm) {
  std::error_code ec;
  if (fs::symlink_status(final_dir, ec).type() != fs::file_type::not_found && !is_checkpoint_dir(final_dir.string()))
    throw UserError(final_dir.string(), "is not a checkpoint loom wrote, and this save would replace it",
                    "move it out of the run directory (loom never deletes what it did not write)");
  static const bool plain = std::getenv("LOOM_PLAIN_RENAME") != nullptr;
  if (plain) return install_plain(staged, final_dir, comm);
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) == 0)
    return fsync_dir(final_dir.parent_path(), comm);
  if (errno != EEXIST) {
    if (flags_refused(errno)) return install_plain(staged, final_dir, comm);
    rename_failed("rename", staged, final_dir, errno);
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
    if (flags_refused(errno)) return install_plain(staged, final_dir, comm);
    rename_failed("exchange", staged, final_dir, errno);
  }
  fsync_dir(final_dir.parent_path(), comm);
  fs::remove_all(staged, ec);
}

CheckpointState parse_state(const std::string& state_path) {
  CheckpointState s;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_text(state_path));
    s.config_toml = j.at("config").get<std::string>();
    s.step = j.at("step").get<int64_t>();
    s.opt_count = j.at("opt_count").get<int64_t>();
    s.loss_scale = j.at("loss_scale").get<double>();
    s.scaler_tracker = j.at("scaler_tracker").get<int64_t>();
    s.scaler_skipped = j.at("scaler_skipped").get<int64_t>();
    s.scaler_consecutive = j.value("scaler_consecutive", int64_t{0});
    s.seed = j.at("seed").get<uint64_t>();
    s.val_position = j.at("val_position").get<int64_t>();
    s.best_val_loss = j.at("best_val_loss").get<double>();
    s.base_hash = j.value("base_crc32c", std::string());
    s.format = j.value("format", int64_t{1});
  } catch (const nlohmann::json::exception& e) {
    throw UserError(state_path, std::string("is not a valid checkpoint state (") + e.what() + ")",
                    "the checkpoint is corrupted: resume from an earlier one");
  }
  if (s.step < 0 || s.opt_count < 0 || !std::isfinite(s.loss_scale) || !(s.loss_scale > 0) || s.val_position < 0)
    throw UserError(state_path, "holds an impossible value (negative step or count, or a non-positive loss scale)",
                    "the checkpoint is corrupted: resume from an earlier one");
  return s;
}

// `s` with what must not reach a terminal raw escaped as \xNN: control characters (C0, DEL, C1)
// and bytes that are not UTF-8. A damaged file's bytes can be quoted in a message (a tensor name,
// the JSON a parser stopped at).
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    for (size_t k = 1; k < len; ++k)
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) >> 6) != 2) len = 0;
    const bool control =
        b < 0x20 || b == 0x7f || (b == 0xc2 && len == 2 && static_cast<unsigned char>(s[i + 1]) < 0xa0);
    if (len == 0 || control) {
      out += fmt::format("\\x{:02x}", b);
      ++i;
      continue;
    }
    out.append(s, i, len);
    i += len;
  }
  return out;
}

// What a checksum cannot see: a tensor the checkpoint's own configuration makes that is missing or
// whose header gives another shape (rewritten, or written by something else). A checkpoint that
// holds what its state.json describes is whole; whether that suits the run that loads it is the
// loader's check (restore_checkpoint), a mismatch there an error rather than damage.
void check_complete(const Checkpoint& c, const Config& stored, int64_t moments) {
  const nn::ModelGraph m = nn::build_model(stored.model, model_input(stored, 1), /*train=*/true);
  const Graph& g = m.graph;
  const auto check = [](const std::map<std::string, const StEntry*>& found, const std::string& name, const Shape& shape,
                        const std::string& file) {
    const auto it = found.find(name);
    if (it == found.end())
      throw UserError(file, "tensor '" + name + "' is missing",
                      "the checkpoint is damaged: resume from an earlier one");
    if (it->second->shape != shape || it->second->dtype != DType::f32)
      throw UserError(file,
                      "tensor '" + name + "' is " + std::string(dtype_name(it->second->dtype)) + " " +
                          it->second->shape.str() + ", but its state.json's model makes it float32 " + shape.str(),
                      "the checkpoint is damaged: resume from an earlier one");
  };
  const std::string model = (fs::path(c.path) / kModelFile).string();
  const std::map<std::string, const StEntry*> params = by_name(c.params);
  const nn::ParamSubset subset =
      nn::base_subset(g) == nn::ParamSubset::all ? nn::ParamSubset::all : nn::ParamSubset::trainable;
  for (const nn::FileTensor& f : nn::param_file_layout(g, stored.model.transformer.scan_layers, subset))
    check(params, f.name, f.shape, model);
  const std::map<std::string, const StEntry*> located = by_name(c.moments);
  for (int which = 0; which < moments; ++which)
    for (const Param& p : g.params())
      if (p.trainable())
        check(located, kMomentPrefix[which] + g.value(p.value).name, g.value(p.value).shape, c.moments_file);
}

Checkpoint load_verified(const std::string& dir, bool with_optimizer, const std::function<void()>& progress) {
  Checkpoint c;
  c.path = dir;
  c.state = parse_state((fs::path(dir) / kStateFile).string());
  // Every tensor is checked as it streams past, not kept: a rank reads what it holds on restore.
  const auto finite = [&dir](const StEntry& e, const unsigned char* bytes, size_t n) {
    if (e.dtype != DType::f32) return;
    const auto* f = reinterpret_cast<const float*>(bytes);
    for (size_t i = 0; i < n / 4; ++i)
      if (!std::isfinite(f[i]))
        throw UserError(dir, "tensor '" + e.name + "' holds a NaN or an infinity",
                        "the checkpoint is corrupted or from a diverged run: resume from an earlier one");
  };
  const std::string model = (fs::path(dir) / kModelFile).string();
  std::vector<StEntry> format1_moments;
  for (StEntry& e : scan_safetensors(model, finite, progress))
    (e.name.starts_with("opt/") ? format1_moments : c.params).push_back(std::move(e));
  const fs::path opt = fs::path(dir) / kOptimizerFile;
  const Config stored = config_from_toml_text(c.state.config_toml, (fs::path(dir) / kStateFile).string());
  const int64_t moments = optimizer_moments(stored.optimizer);
  if (with_optimizer && c.state.format >= 2 && moments > 0) {
    if (!fs::exists(opt))
      throw UserError(opt.string(), "is missing (state.json says format " + std::to_string(c.state.format) + ")",
                      "the checkpoint is incomplete: resume from an earlier one");
  }
  if (with_optimizer && fs::exists(opt)) {
    c.moments = scan_safetensors(opt.string(), finite, progress);
    c.moments_file = opt.string();
  } else if (with_optimizer) {
    c.moments = std::move(format1_moments);
    c.moments_file = model;
  }
  check_complete(c, stored, with_optimizer ? moments : 0);
  return c;
}

// load_verified with its message made printable.
Checkpoint load_one(const std::string& dir, bool with_optimizer, const std::function<void()>& progress) {
  try {
    return load_verified(dir, with_optimizer, progress);
  } catch (const UserError& e) {
    const std::string what = e.what();
    throw UserError(printable(e.subject()), printable(what.substr(e.subject().empty() ? 0 : e.subject().size() + 2)),
                    e.hint());
  }
}

SaveResult write_checkpoint(const Trainer& t, const CheckpointState& s, const std::string& dir,
                            const nlohmann::json* tokenizer, MomentStream* stream) {
  const fs::path final_dir(dir);
  const fs::path tmp = sibling(final_dir, ".tmp");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) && ec) fail_write(tmp.string(), "cannot create the directory", ec.value());
  try {
    // A LoRA run saves its adapters; the base is model.init_from's, named and hashed in state.json.
    const std::string base = base_hash(t.executor());
    std::vector<StSource> params =
        saved_param_sources(t, stream, base.empty() ? nn::ParamSubset::all : nn::ParamSubset::trainable);
    std::vector<StSource> moments = moment_sources(t, stream);
    check_finite(params, t.comm());
    check_finite(moments, t.comm());
    dist::Comm& comm = t.comm();
    const SyncFn sync = [&comm](int fd) { return sync_answering(fd, comm); };
    stream_safetensors((tmp / kModelFile).string(), params, {{"format", "pt"}, {"loom", "checkpoint parameters"}},
                       sync);
    if (!moments.empty())
      stream_safetensors((tmp / kOptimizerFile).string(), moments, {{"loom", "optimizer state"}}, sync);
    nlohmann::json j = {{"config", s.config_toml},
                        {"step", s.step},
                        {"opt_count", s.opt_count},
                        {"loss_scale", s.loss_scale},
                        {"scaler_tracker", s.scaler_tracker},
                        {"scaler_skipped", s.scaler_skipped},
                        {"scaler_consecutive", s.scaler_consecutive},
                        {"seed", s.seed},
                        {"val_position", s.val_position},
                        {"best_val_loss", s.best_val_loss},
                        {"format", kFormat}};
    if (!base.empty()) {
      j["base_crc32c"] = base;
      j["base_init_from"] = t.config().model.init_from;
    }
    if (tokenizer) write_text((tmp / "tokenizer.json").string(), tokenizer->dump(), comm);
    // The files a Hugging Face tokenizer carries (HfTokenizer::companions: the chat template, the
    // generation settings), as a model directory holds them, for `loom sample --chat`.
    if (tokenizer && tokenizer->contains("companions"))
      for (const auto& [name, text] : (*tokenizer)["companions"].items())
        if (text.is_string()) write_text((tmp / name).string(), text.get<std::string>(), comm);
    // state.json last: a directory without it is never taken for a checkpoint.
    write_text((tmp / kStateFile).string(), j.dump(2), comm);
    fsync_dir(tmp, comm);
    install(tmp, final_dir, comm);
  } catch (const NonFinite& nf) {
    fs::remove_all(tmp, ec);
    return {.saved = false, .nonfinite = nf.tensor};
  } catch (...) {
    fs::remove_all(tmp, ec);  // never leave a half-written checkpoint behind
    throw;
  }
  return {.saved = true, .nonfinite = {}};
}

}  // namespace

SaveResult save_checkpoint(const Trainer& t, const CheckpointState& s, const std::string& dir,
                           const nlohmann::json* tokenizer) {
  std::optional<MomentStream> stream;
  if (t.sharded()) stream.emplace(t);  // every rank takes part
  SaveResult r{.saved = true, .nonfinite = {}};
  std::optional<UserError> failed;  // a write rank 0 could not make (a full disk)
  if (t.comm().rank() == 0) {
    try {
      r = write_checkpoint(t, s, dir, tokenizer, stream ? &*stream : nullptr);
    } catch (const UserError& e) {
      failed = e;
    } catch (...) {
      if (stream) stream->finish();
      throw;
    }
    if (stream) stream->finish();
  } else if (stream) {
    stream->serve();
  }
  dist::Comm& comm = t.comm();
  // Every rank learns what rank 0 found ("" when it saved), and a write it could not make (a full
  // disk) ends every rank with its message.
  if (comm.size() > 1) {
    r.nonfinite = dist::broadcast_string(comm, r.nonfinite, 0);
    r.saved = r.nonfinite.empty();
  }
  dist::share_error(comm, failed ? &*failed : nullptr);
  return r;
}

bool is_checkpoint_name(const std::string& n, int64_t* step) {
  if (n.size() <= 5 || n.rfind("ckpt_", 0) != 0) return false;
  if (!std::all_of(n.begin() + 5, n.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return false;
  if (n.size() > 5 + 18) return false;
  *step = std::stoll(n.substr(5));
  return true;
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() == fs::file_type::directory &&
         fs::is_regular_file(fs::path(path) / kStateFile, ec);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    int64_t step = 0;
    // Somebody else's entry under a checkpoint's name (a file, a symbolic link, a directory
    // without loom's state.json) is never listed, so never pruned or removed.
    if (!is_checkpoint_name(e.path().filename().string(), &step) || !is_checkpoint_dir(e.path().string())) continue;
    all.emplace_back(step, e.path().string());
  }
  std::sort(all.begin(), all.end());
  return all;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = list_checkpoints(run_dir);
  return all.empty() ? std::string() : all.back().second;
}

void remove_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  const fs::path doomed = sibling(fs::path(path), ".del");
  fs::remove_all(doomed, ec);
  fs::rename(path, doomed, ec);
  if (!ec) fs::remove_all(doomed, ec);
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  const auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 1)) < all.size(); ++i)
    remove_checkpoint_dir(all[i].second);
}

void remove_stale_checkpoint_files(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool staged = n.rfind(".ckpt_", 0) == 0 || n.rfind(".best.", 0) == 0;
    const bool suffix = n.ends_with(".tmp") || n.ends_with(".del") || n.ends_with(".old");
    if (!staged || !suffix) continue;
    // install_plain() was cut between its two renames: the old checkpoint goes back to its name.
    const fs::path name = e.path().parent_path() / n.substr(1, n.size() - 5);
    if (n.ends_with(".old") && !fs::exists(fs::symlink_status(name, ec)) && fs::exists(e.path() / kStateFile) &&
        ::rename(e.path().c_str(), name.c_str()) == 0)
      continue;
    fs::remove_all(e.path(), ec);
  }
}

CheckpointState read_checkpoint_state(const std::string& dir) {
  return parse_state((fs::path(dir) / kStateFile).string());
}

std::string nothing_to_train(int64_t step, int64_t steps) {
  return fmt::format(
      "nothing to train: the checkpoint is at step {} and train.steps (--steps) is {}{}; nothing was "
      "changed. Give a larger --steps (or train.steps=N) to train on",
      step, steps, steps < step ? ", below it" : "");
}

int64_t checkpoint_step(const std::string& dir) {
  try {
    return parse_state((fs::path(dir) / kStateFile).string()).step;
  } catch (const std::exception&) {
    return -1;
  }
}

Checkpoint load_checkpoint(const std::string& path, std::vector<std::string>* skipped, bool with_optimizer,
                           const std::function<void()>& progress) {
  if (fs::exists(fs::path(path) / kStateFile)) return load_one(path, with_optimizer, progress);
  const auto all = list_checkpoints(path);
  if (all.empty()) {
    // A run's directory (its config.toml) that stopped before its first save.
    if (fs::exists(fs::path(path) / "config.toml"))
      throw UserError(path, "holds a run that stopped before its first checkpoint, so there is nothing to load",
                      "start the run again with `loom train CONFIG --out " + path + " --overwrite`");
    throw UserError(path, fs::exists(path) ? "holds no checkpoint (no state.json, no ckpt_<step>/)" : "does not exist",
                    "give a run directory written by `loom train --out` or one of its ckpt_<step> directories");
  }
  std::string reasons;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return load_one(it->second, with_optimizer, progress);
    } catch (const UserError& e) {
      const std::string note = fs::path(it->second).filename().string() + ": " + e.what();
      if (skipped) skipped->push_back(note);
      reasons += "\n  " + note;
    }
  }
  throw UserError(path, "no checkpoint in it verifies:" + reasons,
                  "every checkpoint is damaged; start a new run (or restore the directory from a backup)");
}

std::map<std::string, std::string> config_values(const std::string& toml_text) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml_text);
  std::string line, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') {
      section = line.substr(1, line.size() - 2) + ".";
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

std::string first_config_difference(const std::string& a_toml, const std::string& b_toml, const std::string& prefix) {
  const auto a = config_values(a_toml), b = config_values(b_toml);
  auto under = [&](const std::string& k) { return k.compare(0, prefix.size(), prefix) == 0; };
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (under(k) && (it == b.end() || it->second != v)) return k;
  }
  for (const auto& [k, v] : b)
    if (under(k) && !a.count(k)) return k;
  return "";
}

std::string base_hash(const Executor& ex) {
  const Graph& g = ex.graph();
  uint32_t crc = 0;
  bool frozen = false;
  // An inference program (no backward) may hold narrowed copies: not the bytes a run trained on.
  if (std::none_of(g.nodes().begin(), g.nodes().end(), [](const Node& n) { return n.phase == Phase::backward; }))
    return "";
  // Through one kStreamBytes buffer, the plan's checkpoint line: never a copy of a whole tensor.
  std::vector<unsigned char> host(kStreamBytes);
  for (const Param& p : g.params()) {
    if (p.trainable()) continue;
    frozen = true;
    const auto* src = static_cast<const unsigned char*>(ex.ptr(p.value));
    const auto bytes = static_cast<size_t>(g.value(p.value).bytes());
    for (size_t at = 0; at < bytes; at += host.size()) {
      const size_t n = std::min(host.size(), bytes - at);
      ex.backend().copy_to_host(host.data(), src + at, n);
      crc = crc32c(host.data(), n, crc);
    }
  }
  return frozen ? fmt::format("{:08x}", crc) : "";
}

void load_checkpoint_params(Executor& ex, const Checkpoint& c, const std::function<void()>& progress) {
  const std::string file = (fs::path(c.path) / kModelFile).string();
  const Config stored = config_from_toml_text(c.state.config_toml, (fs::path(c.path) / kStateFile).string());
  if (c.state.base_hash.empty()) {
    import_params(ex.graph(), executor_sink(ex), by_name(c.params), stored.model.transformer.scan_layers, file, {},
                  nn::base_subset(ex.graph()), progress);
    return;
  }
  const Graph& g = ex.graph();
  if (stored.model.init_from.empty()) {  // the base was drawn from the seed
    for (const Param& p : g.params())
      if (!p.trainable()) init_param_in(ex, p, stored.seed);
  } else {
    ModelSource(stored.model.init_from).load_params(ex, progress);
  }
  const std::string now = base_hash(ex);
  if (!now.empty() && now != c.state.base_hash)
    throw UserError(stored.model.init_from.empty() ? c.path : "model.init_from = " + stored.model.init_from,
                    "is not the base model the LoRA checkpoint " + c.path +
                        " was trained on (its parameters' CRC-32C is " + now + ", the checkpoint recorded " +
                        c.state.base_hash + ")",
                    "restore that base model, or start a new run from this one");
  import_params(g, executor_sink(ex), by_name(c.params), stored.model.transformer.scan_layers, file, {},
                nn::ParamSubset::trainable, progress);
}

std::vector<StTensor> read_checkpoint_params(const Checkpoint& c) {
  const std::string file = (fs::path(c.path) / kModelFile).string();
  std::vector<StTensor> out;
  for (const StEntry& e : c.params) {
    StTensor t{.name = e.name, .dtype = e.dtype, .shape = e.shape, .bytes = std::vector<unsigned char>(e.bytes)};
    read_safetensors_range(file, e, 0, t.bytes.size(), t.bytes.data());
    out.push_back(std::move(t));
  }
  return out;
}

void restore_params(Trainer& t, const Checkpoint& c, const std::function<void()>& progress) {
  if (!t.params_sharded()) return load_checkpoint_params(t.executor(), c, progress);
  // This rank's slice of each parameter, read by offset out of the tensor that holds it: its own
  // (by path), or its layer's part of a stacked one (model.scan_layers). LoRA, whose base comes
  // from elsewhere, is refused with sharded parameters (config.cpp).
  const Config stored = config_from_toml_text(c.state.config_toml, (fs::path(c.path) / kStateFile).string());
  import_params(t.model().graph, t.param_sink(), by_name(c.params), stored.model.transformer.scan_layers,
                (fs::path(c.path) / kModelFile).string(), {}, nn::ParamSubset::all, progress);
}

void restore_checkpoint(Trainer& t, const Checkpoint& c) {
  // The stored text is read and printed again, so that spellings meaning the same value compare
  // equal (checkpoints before the choice enums wrote no remat as "", now "none").
  const std::string stored =
      config_to_toml(config_from_toml_text(c.state.config_toml, (fs::path(c.path) / kStateFile).string()));
  std::string diff = first_config_difference(stored, config_to_toml(t.config()), "model.");
  if (diff.empty()) diff = first_config_difference(stored, config_to_toml(t.config()), "lora.");
  if (!diff.empty())
    throw UserError(c.path, "was written for a different model: " + diff + " differs",
                    "resume with the checkpoint's model configuration (or start a new run with --out)");
  const auto progress = [&t] { t.comm().keep_alive(); };  // the other ranks wait for this one's disk
  restore_params(t, c, progress);
  const std::map<std::string, const StEntry*> located = by_name(c.moments);
  std::vector<float> buf;
  const Graph& g = t.model().graph;
  for (int which : {0, 1}) {
    if (!t.optimizer().keeps_moment(which)) continue;
    for (size_t i = 0; i < g.params().size(); ++i) {
      if (!g.params()[i].trainable()) continue;
      const Value& v = g.value(g.params()[i].value);
      const std::string name = kMomentPrefix[which] + v.name;
      const auto l = located.find(name);
      if (l == located.end() || l->second->shape != v.shape || l->second->dtype != DType::f32)
        throw UserError(c.moments_file.empty() ? c.path : c.moments_file,
                        "optimizer tensor '" + name + "' is missing or has the wrong shape",
                        "the checkpoint was written with another optimizer or model");
      // This rank's part (all of it unless the optimizer state is sharded): resharded on load.
      const dist::Range own = t.moment_range(i);
      read_safetensors_f32(
          c.moments_file, *l->second, own.begin, own.end, buf,
          [&](int64_t at, int64_t n, const float* values) { t.write_moment(which, i, at, n, values); }, progress);
    }
  }
  t.restore_progress(c.state.step, c.state.opt_count, c.state.loss_scale, c.state.scaler_tracker,
                     c.state.scaler_skipped, c.state.scaler_consecutive);
}

}  // namespace loom
