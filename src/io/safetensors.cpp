#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/write_error.h"

namespace loom {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; loom copies it as is");

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // safetensors MAX_HEADER_SIZE
const char* const kMetadataKey = "__metadata__";
const char* const kChecksumPrefix = "crc32c/";
const char* const kCorruptHint =
    "the file is truncated or corrupted (an interrupted copy or download?); fetch or write it again";

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

[[noreturn]] void bad_file(const std::string& path, const std::string& problem,
                           const std::string& hint = kCorruptHint) {
  throw UserError(path, problem, hint);
}

std::string in_quotes(const std::string& name) { return "'" + name + "'"; }

std::string offsets_str(uint64_t b, uint64_t e) {
  // Appended piecewise: GCC 12 gives a false -Wrestrict for "[" + std::to_string(b).
  std::string s = "[";
  s += std::to_string(b);
  s += ", ";
  s += std::to_string(e);
  s += ']';
  return s;
}

// Closes the descriptor on every path out of a function.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports close's own error (it can carry a delayed write error).
  int close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

// Reads up to n bytes at `offset`, calling `progress` (when given) before each read; returns how
// many were read (fewer only at end of file).
size_t pread_full(int fd, void* buf, size_t n, uint64_t offset, const std::string& path,
                  const std::function<void()>& progress) {
  auto* p = static_cast<unsigned char*>(buf);
  size_t done = 0;
  while (done < n) {
    if (progress) progress();
    const size_t chunk = std::min<size_t>(n - done, size_t{64} << 20);
    const ssize_t r = ::pread(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      bad_file(path, "cannot read: " + errno_text(e), "check that the file is readable");
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kLoomDTypes[] = {
    {"F32", DType::f32}, {"BF16", DType::bf16}, {"F16", DType::f16}, {"I32", DType::i32}};
// The dtypes the format defines that loom does not hold.
constexpr const char* kOtherSpecDTypes[] = {"BOOL",    "F4",      "F6_E2M3", "F6_E3M2",     "U8",          "I8",
                                            "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",
                                            "U16",     "U32",     "C64",     "F64",         "I64",         "U64"};

// One validated header entry.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

uint64_t json_uint(const json& v, bool* ok) {
  *ok = v.is_number_unsigned();
  return *ok ? v.get<uint64_t>() : 0;
}

Entry parse_entry(const std::string& path, const std::string& name, const json& v) {
  const std::string who = "tensor " + in_quotes(name);
  if (!v.is_object())
    bad_file(path, who + ": header entry is " + std::string(v.type_name()) +
                       ", expected an object with dtype, shape and data_offsets");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad_file(path, who + ": header entry has no \"" + key + "\"");

  Entry e;
  e.name = name;
  const json& dt = v.at("dtype");
  if (!dt.is_string()) bad_file(path, who + ": dtype is " + std::string(dt.type_name()) + ", expected a string");
  const auto& dts = dt.get_ref<const std::string&>();
  bool found = false;
  for (const auto& d : kLoomDTypes)
    if (dts == d.name) {
      e.dtype = d.dtype;
      found = true;
    }
  if (!found) {
    const bool in_spec = std::find_if(std::begin(kOtherSpecDTypes), std::end(kOtherSpecDTypes),
                                      [&](const char* s) { return dts == s; }) != std::end(kOtherSpecDTypes);
    if (in_spec)
      bad_file(path, who + ": dtype \"" + dts + "\" is not supported by loom (F32, BF16, F16, I32)",
               "convert the tensor to one of F32, BF16, F16, I32 before loading it");
    bad_file(path, who + ": unknown dtype \"" + dts + "\"");
  }

  const json& sh = v.at("shape");
  if (!sh.is_array()) bad_file(path, who + ": shape is " + std::string(sh.type_name()) + ", expected an array");
  if (sh.size() > static_cast<size_t>(kMaxRank))
    bad_file(path,
             who + ": rank " + std::to_string(sh.size()) + " is above loom's maximum of " + std::to_string(kMaxRank),
             "loom holds tensors of rank up to " + std::to_string(kMaxRank) + "; reshape it before saving");
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : sh) {
    bool ok;
    const uint64_t x = json_uint(d, &ok);
    if (!ok) bad_file(path, who + ": shape " + sh.dump() + " has an entry that is not a non-negative integer");
    if (x > static_cast<uint64_t>(INT64_MAX)) overflow = true;
    e.shape.push_back(static_cast<int64_t>(x));
    if (__builtin_mul_overflow(numel, x, &numel)) overflow = true;
  }
  uint64_t expected = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &expected) ||
      expected > static_cast<uint64_t>(INT64_MAX))
    bad_file(path, who + ": shape " + sh.dump() + " is too large to exist");

  const json& off = v.at("data_offsets");
  bool ok0 = false, ok1 = false;
  if (off.is_array() && off.size() == 2) {
    e.begin = json_uint(off[0], &ok0);
    e.end = json_uint(off[1], &ok1);
  }
  if (!ok0 || !ok1)
    bad_file(path, who + ": data_offsets " + off.dump() + " is not a pair of non-negative integers [begin, end]");
  if (e.end < e.begin) bad_file(path, who + ": data_offsets " + offsets_str(e.begin, e.end) + " end before they begin");
  if (e.end - e.begin != expected)
    bad_file(path, who + ": data_offsets " + offsets_str(e.begin, e.end) + " give " + std::to_string(e.end - e.begin) +
                       " bytes, expected " + std::to_string(expected) + " for " + dts + " " + e.shape.str());
  return e;
}

// Parses the header JSON, rejecting duplicate keys in any object (nlohmann keeps the last one
// silently; the format forbids them).
std::string crc_hex(uint32_t c) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", c);
  return buf;
}

// A tensor whose metadata holds "crc32c/<name>" (loom writes one per tensor) must match `crc`,
// the CRC-32C of the bytes read.
void verify_checksum(const std::string& path, const std::string& name, uint32_t crc, const json& header) {
  auto meta = header.find(kMetadataKey);
  if (meta == header.end()) return;
  auto it = meta->find(std::string(kChecksumPrefix) + name);
  if (it == meta->end() || !it->is_string()) return;
  const std::string got = crc_hex(crc);
  if (it->get<std::string>() != got)
    bad_file(path,
             "tensor " + in_quotes(name) + " fails its checksum (CRC-32C " + got + ", the file records " +
                 it->get<std::string>() + "): its bytes changed after it was written",
             "the file is corrupted: use another copy (for a checkpoint: an earlier ckpt_<step>)");
}

json parse_header(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> objects;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!objects.empty()) objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!objects.empty() && parsed.is_string() && !objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text, cb);
  } catch (const json::exception& ex) {
    bad_file(path, std::string("header is not valid JSON: ") + ex.what());
  }
  if (!duplicate.empty()) bad_file(path, "header has the key " + in_quotes(duplicate) + " twice");
  return h;
}

}  // namespace

const char* safetensors_dtype_name(DType dt) {
  for (const auto& d : kLoomDTypes)
    if (d.dtype == dt) return d.name;
  detail::bad_dtype(dt);
}

namespace {

// A file opened and its header validated: the entries tile the data buffer, in offset order.
struct OpenFile {
  Fd fd;
  json header;
  std::vector<Entry> entries;
  uint64_t data_start = 0;
};

void open_file(OpenFile& f, const std::string& path, std::map<std::string, std::string>* metadata,
               const std::function<void()>& progress) {
  Fd& fd = f.fd;
  if (fd.get() < 0) {
    const int e = errno;
    bad_file(path, "cannot open: " + errno_text(e), "check the path and that the file is readable");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int e = errno;
    bad_file(path, "cannot stat: " + errno_text(e), "check that the file is readable");
  }
  if (!S_ISREG(st.st_mode)) bad_file(path, "not a regular file", "give the path of a .safetensors file");
  const auto file_size = static_cast<uint64_t>(st.st_size);

  unsigned char len_bytes[8];
  if (file_size < 8 || pread_full(fd.get(), len_bytes, 8, 0, path, progress) != 8)
    bad_file(path, "file is " + std::to_string(file_size) +
                       " bytes, too short for the 8-byte header length of a safetensors file");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | len_bytes[i];
  if (header_size > kMaxHeaderSize)
    bad_file(path, "header length " + std::to_string(header_size) + " is above the format's limit of " +
                       std::to_string(kMaxHeaderSize) + " bytes (not a safetensors file?)");
  if (header_size > file_size - 8)
    bad_file(path, "header length " + std::to_string(header_size) + " is beyond the end of the " +
                       std::to_string(file_size) + "-byte file");

  std::string text(header_size, '\0');
  if (pread_full(fd.get(), text.data(), header_size, 8, path, progress) != header_size)
    bad_file(path, "file ended inside the header");
  if (text.empty() || text[0] != '{') bad_file(path, "header does not begin with '{' (not a safetensors file?)");
  // nlohmann's parser stops at a NUL byte as if the input ended there; JSON allows none.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    bad_file(path, "header has a NUL byte at offset " + std::to_string(nul) +
                       " (JSON allows none; the header may only be padded with spaces)");
  f.header = parse_header(path, text);
  const json& h = f.header;
  if (!h.is_object()) bad_file(path, "header is JSON " + std::string(h.type_name()) + ", expected an object");

  f.data_start = 8 + header_size;
  const uint64_t buffer_size = file_size - f.data_start;
  std::vector<Entry>& entries = f.entries;
  if (metadata) metadata->clear();
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == kMetadataKey) {
      const json& m = it.value();
      if (!m.is_object())
        bad_file(path, std::string("\"__metadata__\" is ") + m.type_name() + ", expected an object of strings");
      for (auto mi = m.begin(); mi != m.end(); ++mi) {
        if (!mi.value().is_string())
          bad_file(path, "metadata " + in_quotes(mi.key()) + " is " + std::string(mi.value().type_name()) +
                             ", expected a string");
        // Checksums are the format's own business (verified below), not the caller's metadata.
        if (metadata && mi.key().rfind(kChecksumPrefix, 0) != 0) (*metadata)[mi.key()] = mi.value().get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(path, it.key(), it.value());
    if (e.end > buffer_size)
      bad_file(path, "tensor " + in_quotes(e.name) + ": data_offsets " + offsets_str(e.begin, e.end) +
                         " reach past the end of the " + std::to_string(buffer_size) +
                         "-byte data buffer (the file is " + std::to_string(file_size) + " bytes)");
    entries.push_back(std::move(e));
  }

  // The tensors must tile the buffer: sorted by offset, each begins where the previous ended.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < pos)
      bad_file(path, "tensor " + in_quotes(e.name) + ": data_offsets " + offsets_str(e.begin, e.end) +
                         " overlap tensor " + in_quotes(prev->name) + " " + offsets_str(prev->begin, prev->end));
    if (e.begin > pos)
      bad_file(path, "bytes " + offsets_str(pos, e.begin) + " of the data buffer belong to no tensor (a hole " +
                         (prev ? "between tensor " + in_quotes(prev->name) + " and " : "before ") + "tensor " +
                         in_quotes(e.name) + ")");
    pos = e.end;
    prev = &e;
  }
  if (pos != buffer_size)
    bad_file(path, "the data buffer has " + std::to_string(buffer_size - pos) +
                       " bytes after the last tensor that belong to no tensor");
}

}  // namespace

std::vector<StTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata,
                                       const std::function<void()>& progress) {
  OpenFile f{Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), {}, {}, 0};
  open_file(f, path, metadata, progress);
  std::vector<StTensor> out;
  out.reserve(f.entries.size());
  for (Entry& e : f.entries) {
    StTensor t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.bytes.resize(e.end - e.begin);
    if (pread_full(f.fd.get(), t.bytes.data(), t.bytes.size(), f.data_start + e.begin, path, progress) !=
        t.bytes.size())
      bad_file(path, "file ended inside tensor " + in_quotes(t.name) + " (it shrank while being read?)");
    verify_checksum(path, t.name, crc32c(t.bytes.data(), t.bytes.size()), f.header);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<StEntry> scan_safetensors(const std::string& path,
                                      const std::function<void(const StEntry&, const unsigned char*, size_t)>& visit,
                                      const std::function<void()>& progress) {
  OpenFile f{Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), {}, {}, 0};
  open_file(f, path, nullptr, progress);
  std::vector<unsigned char> buf(kStreamBytes);
  std::vector<StEntry> out;
  out.reserve(f.entries.size());
  for (Entry& e : f.entries) {
    StEntry s{.name = std::move(e.name),
              .dtype = e.dtype,
              .shape = e.shape,
              .offset = f.data_start + e.begin,
              .bytes = e.end - e.begin,
              .crc = 0};
    for (uint64_t at = 0; at < s.bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), s.bytes - at));
      if (pread_full(f.fd.get(), buf.data(), n, s.offset + at, path, progress) != n)
        bad_file(path, "file ended inside tensor " + in_quotes(s.name) + " (it shrank while being read?)");
      s.crc = crc32c(buf.data(), n, s.crc);
      if (visit) visit(s, buf.data(), n);
      at += n;
    }
    verify_checksum(path, s.name, s.crc, f.header);
    out.push_back(std::move(s));
  }
  return out;
}

void read_safetensors_range(const std::string& path, const StEntry& e, uint64_t offset, size_t n, void* dst) {
  LOOM_ASSERT(offset + n <= e.bytes, "a range outside its tensor");
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    bad_file(path, "cannot open: " + errno_text(err), "check the path and that the file is readable");
  }
  if (pread_full(fd.get(), dst, n, e.offset + offset, path, {}) != n)
    bad_file(path, "file ended inside tensor " + in_quotes(e.name) + " (it changed since it was checked?)");
}

void read_safetensors_f32(const std::string& path, const StEntry& e, int64_t begin, int64_t end, std::vector<float>& buf,
                          const std::function<void(int64_t at, int64_t n, const float* values)>& take,
                          const std::function<void()>& progress) {
  LOOM_ASSERT(e.dtype == DType::f32, "a float32 tensor");
  buf.resize(kStreamBytes / sizeof(float));
  for (int64_t at = begin; at < end;) {
    const int64_t n = std::min<int64_t>(end - at, static_cast<int64_t>(buf.size()));
    if (progress) progress();
    read_safetensors_range(path, e, static_cast<uint64_t>(at) * sizeof(float), static_cast<size_t>(n) * sizeof(float),
                           buf.data());
    take(at, n, buf.data());
    at += n;
  }
}

namespace {

// Writes all n bytes; returns 0 or the errno of the failure.
int write_all(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const unsigned char*>(buf);
  while (n > 0) {
    const ssize_t r = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

void stream_safetensors(const std::string& path, const std::vector<StSource>& tensors,
                        const std::map<std::string, std::string>& metadata, const SyncFn& sync) {
  // Validate the arguments and build the header before touching the file system. Each tensor's
  // checksum goes into the metadata as 8 hex digits: written as zeros first and filled in once the
  // data is streamed, so the header keeps its length and is rewritten in place.
  std::set<std::string> names;
  for (const StSource& t : tensors) {
    const std::string who = "write_safetensors('" + path + "'): tensor '" + t.name + "'";
    if (t.name.empty()) throw std::invalid_argument("write_safetensors('" + path + "'): a tensor has an empty name");
    if (t.name == kMetadataKey) throw std::invalid_argument(who + ": the name is reserved");
    if (!names.insert(t.name).second) throw std::invalid_argument(who + ": the name is used twice");
    for (int i = 0; i < t.shape.rank; ++i)
      if (t.shape.dims[i] < 0) throw std::invalid_argument(who + ": shape " + t.shape.str() + " is negative");
    if (metadata.count(kChecksumPrefix + t.name)) throw std::invalid_argument(who + ": its checksum key is reserved");
  }
  std::vector<uint32_t> crcs(tensors.size(), 0);
  auto header = [&] {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    auto m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    for (size_t i = 0; i < tensors.size(); ++i) m[kChecksumPrefix + tensors[i].name] = crc_hex(crcs[i]);
    if (!m.empty()) h[kMetadataKey] = std::move(m);
    uint64_t offset = 0;
    for (const StSource& t : tensors) {
      const uint64_t size = static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
      auto shape = nlohmann::ordered_json::array();
      for (int i = 0; i < t.shape.rank; ++i) shape.push_back(t.shape.dims[i]);
      nlohmann::ordered_json entry = nlohmann::ordered_json::object();
      entry["dtype"] = safetensors_dtype_name(t.dtype);
      entry["shape"] = std::move(shape);
      entry["data_offsets"] = {offset, offset + size};
      h[t.name] = std::move(entry);
      offset += size;
    }
    std::string text;
    try {
      text = h.dump();
    } catch (const nlohmann::json::exception& ex) {
      throw std::invalid_argument("write_safetensors('" + path + "'): a name or metadata string is not UTF-8 (" +
                                  ex.what() + ")");
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  };
  std::string text = header();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    // Nothing of ours to clean up: the temporary file was not created (or is not ours to remove).
    fail_write(path, "cannot create '" + tmp + "'", errno);
  }
  auto fail = [&](const std::string& what, int e) {
    if (fd.get() >= 0) fd.close();
    ::unlink(tmp.c_str());
    fail_write(path, what, e);
  };
  int e = write_all(fd.get(), len_bytes, 8);
  if (!e) e = write_all(fd.get(), text.data(), text.size());
  // One bounded staging buffer: saving costs kStreamBytes of host memory, not a copy of the tensors.
  std::vector<unsigned char> chunk(kStreamBytes);
  for (size_t i = 0; !e && i < tensors.size(); ++i) {
    const StSource& t = tensors[i];
    const size_t size = static_cast<size_t>(t.shape.numel()) * dtype_size(t.dtype);
    for (size_t off = 0; !e && off < size; off += chunk.size()) {
      const size_t n = std::min(chunk.size(), size - off);
      try {
        t.read(chunk.data(), off, n);
      } catch (...) {
        fd.close();
        ::unlink(tmp.c_str());
        throw;
      }
      crcs[i] = crc32c(chunk.data(), n, crcs[i]);
      e = write_all(fd.get(), chunk.data(), n);
    }
  }
  if (e) fail("writing '" + tmp + "' failed", e);
  const std::string final_text = header();
  LOOM_ASSERT(final_text.size() == text.size(), "checksums changed the header's length");
  if (::pwrite(fd.get(), final_text.data(), final_text.size(), 8) != static_cast<ssize_t>(final_text.size()))
    fail("rewriting the header of '" + tmp + "' failed", errno ? errno : EIO);
  const auto flush = [&sync](int f) { return sync ? sync(f) : ::fsync(f); };
  if (flush(fd.get()) != 0) fail("fsync of '" + tmp + "' failed", errno);
  if (fd.close() != 0) fail("closing '" + tmp + "' failed", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming '" + tmp + "' over it failed", errno);
  // Make the rename itself durable. Best effort: the new file is complete and in place either way.
  Fd dir(::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) (void)flush(dir.get());
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<StSource> sources;
  sources.reserve(tensors.size());
  for (const StTensor& t : tensors) {
    const uint64_t expected = static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
    if (t.shape.numel() >= 0 && t.bytes.size() != expected)
      throw std::invalid_argument("write_safetensors('" + path + "'): tensor '" + t.name + "': has " +
                                  std::to_string(t.bytes.size()) + " bytes, expected " + std::to_string(expected) +
                                  " for " + safetensors_dtype_name(t.dtype) + " " + t.shape.str());
    sources.push_back(
        {.name = t.name, .dtype = t.dtype, .shape = t.shape, .read = [&t](void* dst, size_t off, size_t n) {
           std::memcpy(dst, t.bytes.data() + off, n);
         }});
  }
  stream_safetensors(path, sources, metadata);
}

}  // namespace loom
