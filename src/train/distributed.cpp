#include "train/distributed.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/crc32c.h"

namespace loom {

namespace {

// FNV-1a over 8-byte words (and the tail bytes): a fingerprint, not a defence against tampering.
struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const char* p, size_t n) {
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      h = (h ^ w) * 0x100000001b3ull;
    }
    for (; n > 0; ++p, --n) h = (h ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  }
};

uint64_t hash_text(const std::string& s) {
  Fnv f;
  f.add(s.data(), s.size());
  return f.h;
}

uint64_t hash_own_executable() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  if (!in) throw std::runtime_error("cannot read /proc/self/exe to compare the ranks' binaries");
  Fnv f;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    f.add(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return f.h;
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

}  // namespace

namespace {

void compare_fingerprints(const Config& c, dist::Comm& comm) {
  struct Fingerprint {
    uint64_t config, binary;
  };
  const std::string text = config_to_toml(c);
  const Fingerprint mine{.config = hash_text(text), .binary = hash_own_executable()};
  std::vector<Fingerprint> all(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&mine, sizeof mine, all.data());
  for (int r = 1; r < comm.size(); ++r)
    if (all[static_cast<size_t>(r)].binary != all[0].binary)
      throw dist::AgreedError(
          "loom binary",
          fmt::format("rank {} runs a different executable from rank 0 (hash {:016x}, rank 0: {:016x})", r,
                      all[static_cast<size_t>(r)].binary, all[0].binary),
          "build loom once and launch that same binary on every rank and host");
  for (int r = 1; r < comm.size(); ++r) {
    if (all[static_cast<size_t>(r)].config == all[0].config) continue;
    const std::string a = dist::broadcast_string(comm, text, 0), b = dist::broadcast_string(comm, text, r);
    const std::string key = first_config_difference(a, b);
    const auto va = config_values(a), vb = config_values(b);
    const auto value = [&](const std::map<std::string, std::string>& m) {
      auto it = m.find(key);
      return it == m.end() ? std::string("(absent)") : it->second;
    };
    throw dist::AgreedError(key,
                            fmt::format("rank {}'s configuration differs from rank 0's: {} on rank {}, {} on rank 0", r,
                                        value(vb), r, value(va)),
                            "launch every rank with the same config file and the same overrides");
  }
}

}  // namespace

void check_same_job(const Config& c, dist::Comm& comm) {
  if (comm.size() == 1) return;
  compare_fingerprints(c, comm);
  if (!(c.train.collective_timeout > 0))  // every rank has this configuration now
    throw dist::AgreedError("train.collective_timeout", "must be a positive number of seconds",
                            "e.g. 300: longer than any step, evaluation or save takes, a pause of one rank excepted");
  comm.set_timeout(c.train.collective_timeout);
}

uint32_t resume_digest(const Checkpoint& c) {
  if (c.path.empty()) return 0;
  const CheckpointState& s = c.state;
  const int64_t counts[] = {s.step,          s.opt_count,   s.scaler_tracker, s.scaler_skipped, s.scaler_consecutive,
                            int64_t(s.seed), s.val_position};
  const double reals[] = {s.loss_scale, s.best_val_loss};
  uint32_t crc = crc32c(counts, sizeof counts);
  crc = crc32c(reals, sizeof reals, crc);
  for (const auto* entries : {&c.params, &c.moments})
    for (const StEntry& e : *entries) {  // each crc verified against its bytes as they were read
      crc = crc32c(e.name.data(), e.name.size(), crc);
      crc = crc32c(&e.crc, sizeof e.crc, crc);
    }
  return crc;
}

void check_same_resume(const Checkpoint& c, dist::Comm& comm) {
  if (comm.size() == 1) return;
  struct Resumed {
    int64_t step;
    uint32_t digest, resumed;
  };
  const Resumed mine{
      .step = c.path.empty() ? -1 : c.state.step, .digest = resume_digest(c), .resumed = c.path.empty() ? 0u : 1u};
  std::vector<Resumed> all(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&mine, sizeof mine, all.data());
  const auto same = [&](int r) {
    const Resumed &a = all[0], &b = all[static_cast<size_t>(r)];
    return a.step == b.step && a.digest == b.digest && a.resumed == b.resumed;
  };
  bool agree = true;
  for (int r = 1; r < comm.size(); ++r) agree = agree && same(r);
  if (agree) return;
  // Every rank names itself (its host and what it loaded); each line reaches every rank, so the
  // message is the same everywhere.
  const std::string self = fmt::format("{} on {}", c.path.empty() ? std::string("a fresh start") : c.path, host_name());
  std::string ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const std::string who = dist::broadcast_string(comm, self, r);
    const Resumed& x = all[static_cast<size_t>(r)];
    if (r > 0 && same(r)) continue;
    ranks += fmt::format("\n  rank {}: {}", r, who);
    if (x.resumed) ranks += fmt::format(", step {} (digest {:08x})", x.step, x.digest);
  }
  throw dist::AgreedError(
      "--resume", "the ranks did not resume the same state (rank 0 and every rank that differs from it):" + ranks,
      "resume every rank from the same checkpoint: copy the run directory to every host again (or "
      "use a shared file system), or give every rank the same RUN/ckpt_<step>");
}

}  // namespace loom
