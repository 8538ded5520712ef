#include "io/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>

#include "core/dtype.h"
#include "core/error.h"
#include "core/write_error.h"

namespace loom {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;  // ggml's default: general.alignment is not written
constexpr int64_t kQ8Block = 32;
constexpr int64_t kQ8BlockBytes = 2 + kQ8Block;

enum ValueType : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

int64_t encoded_bytes(int64_t n, GgufType type) {
  switch (type) {
    case GgufType::f32:
      return 4 * n;
    case GgufType::f16:
    case GgufType::bf16:
      return 2 * n;
    case GgufType::q8_0:
      return n / kQ8Block * kQ8BlockBytes;
  }
  throw std::invalid_argument("gguf: unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
}

class Out {
 public:
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  template <class T>
  void pod(T v) {
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad() { buf_.resize((buf_.size() + kAlignment - 1) / kAlignment * kAlignment, 0); }
  std::vector<unsigned char>& buf() { return buf_; }

 private:
  std::vector<unsigned char> buf_;
};

void put_value(Out& o, const GgufValue& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        auto array = [&](uint32_t elem, uint64_t n) {
          o.pod<uint32_t>(kArray);
          o.pod<uint32_t>(elem);
          o.pod<uint64_t>(n);
        };
        if constexpr (std::is_same_v<T, uint32_t>) {
          o.pod<uint32_t>(kU32), o.pod(x);
        } else if constexpr (std::is_same_v<T, int32_t>) {
          o.pod<uint32_t>(kI32), o.pod(x);
        } else if constexpr (std::is_same_v<T, float>) {
          o.pod<uint32_t>(kF32), o.pod(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          o.pod<uint32_t>(kBool), o.pod<uint8_t>(x ? 1 : 0);
        } else if constexpr (std::is_same_v<T, std::string>) {
          o.pod<uint32_t>(kString), o.str(x);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          array(kString, x.size());
          for (const std::string& s : x) o.str(s);
        } else if constexpr (std::is_same_v<T, std::vector<float>>) {
          array(kF32, x.size());
          for (float f : x) o.pod(f);
        } else {
          array(kI32, x.size());
          for (int32_t i : x) o.pod(i);
        }
      },
      v);
}

class In {
 public:
  In(std::vector<unsigned char> b, const std::string& path) : b_(std::move(b)), path_(path) {}
  template <class T>
  T pod() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string str() {
    const auto n = pod<uint64_t>();
    const unsigned char* p = take(n);
    return {reinterpret_cast<const char*>(p), n};
  }
  const unsigned char* take(uint64_t n) {
    if (n > b_.size() - pos_) bad("ends inside its header or data");
    const unsigned char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t pos() const { return pos_; }
  void seek(size_t p) {
    if (p > b_.size()) bad("has a tensor offset past its end");
    pos_ = p;
  }
  [[noreturn]] void bad(const std::string& what) const {
    throw UserError(path_, what, "write it again with `loom export gguf`");
  }

 private:
  std::vector<unsigned char> b_;
  size_t pos_ = 0;
  const std::string& path_;
};

GgufValue get_value(In& in) {
  const auto type = in.pod<uint32_t>();
  switch (type) {
    case kU32:
      return in.pod<uint32_t>();
    case kI32:
      return in.pod<int32_t>();
    case kF32:
      return in.pod<float>();
    case kBool:
      return in.pod<uint8_t>() != 0;
    case kString:
      return in.str();
    case kArray: {
      const auto elem = in.pod<uint32_t>();
      const auto n = in.pod<uint64_t>();
      if (elem == kString) {
        std::vector<std::string> v;
        for (uint64_t i = 0; i < n; ++i) v.push_back(in.str());
        return v;
      }
      if (elem == kF32) {
        std::vector<float> v;
        for (uint64_t i = 0; i < n; ++i) v.push_back(in.pod<float>());
        return v;
      }
      if (elem == kI32) {
        std::vector<int32_t> v;
        for (uint64_t i = 0; i < n; ++i) v.push_back(in.pod<int32_t>());
        return v;
      }
      in.bad("has an array of value type " + std::to_string(elem) + ", which loom does not write");
    }
    default:
      in.bad("has a value of type " + std::to_string(type) + ", which loom does not write");
  }
}

}  // namespace

std::vector<unsigned char> gguf_encode(const float* x, int64_t n, GgufType type) {
  std::vector<unsigned char> out(static_cast<size_t>(encoded_bytes(n, type)));
  unsigned char* o = out.data();
  switch (type) {
    case GgufType::f32:
      std::memcpy(o, x, out.size());
      break;
    case GgufType::f16:
    case GgufType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = type == GgufType::f16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
        std::memcpy(o + 2 * i, &h, 2);
      }
      break;
    case GgufType::q8_0:
      if (n % kQ8Block != 0) throw std::invalid_argument("gguf: q8_0 needs a multiple of 32 values");
      for (int64_t b = 0; b < n / kQ8Block; ++b) {
        const float* v = x + b * kQ8Block;
        unsigned char* blk = o + b * kQ8BlockBytes;
        float amax = 0.f;
        for (int64_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(blk, &dh, 2);
        for (int64_t j = 0; j < kQ8Block; ++j)
          blk[2 + j] = static_cast<unsigned char>(static_cast<int8_t>(std::round(v[j] * id)));
      }
      break;
  }
  return out;
}

std::vector<float> gguf_decode(const unsigned char* bytes, int64_t n, GgufType type) {
  std::vector<float> out(static_cast<size_t>(n));
  switch (type) {
    case GgufType::f32:
      std::memcpy(out.data(), bytes, 4 * static_cast<size_t>(n));
      break;
    case GgufType::f16:
    case GgufType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[static_cast<size_t>(i)] = type == GgufType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      break;
    case GgufType::q8_0:
      for (int64_t i = 0; i < n; ++i) {
        const unsigned char* blk = bytes + i / kQ8Block * kQ8BlockBytes;
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        out[static_cast<size_t>(i)] = static_cast<float>(static_cast<int8_t>(blk[2 + i % kQ8Block])) * f16_to_f32(dh);
      }
      break;
  }
  return out;
}

void write_gguf(const std::string& path, const GgufFile& f) {
  std::set<std::string> names;
  for (const GgufTensor& t : f.tensors) {
    if (t.name.size() >= 64) throw std::invalid_argument("gguf: tensor name '" + t.name + "' is 64 bytes or longer");
    if (!names.insert(t.name).second) throw std::invalid_argument("gguf: duplicate tensor name '" + t.name + "'");
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.type == GgufType::q8_0 && (t.shape.empty() || t.shape.back() % kQ8Block != 0))
      throw std::invalid_argument("gguf: q8_0 tensor '" + t.name + "' has an innermost dimension no multiple of 32");
    if (static_cast<int64_t>(t.data.size()) != encoded_bytes(n, t.type))
      throw std::invalid_argument("gguf: tensor '" + t.name + "' has data of the wrong size");
  }
  Out o;
  o.pod(kMagic);
  o.pod(kVersion);
  o.pod<uint64_t>(f.tensors.size());
  o.pod<uint64_t>(f.metadata.size());
  for (const auto& [key, value] : f.metadata) {
    o.str(key);
    put_value(o, value);
  }
  uint64_t offset = 0;
  for (const GgufTensor& t : f.tensors) {
    o.str(t.name);
    o.pod<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) o.pod<uint64_t>(static_cast<uint64_t>(*d));
    o.pod<uint32_t>(static_cast<uint32_t>(t.type));
    o.pod<uint64_t>(offset);
    offset += (t.data.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  for (const GgufTensor& t : f.tensors) {
    o.pad();
    o.bytes(t.data.data(), t.data.size());
  }

  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail_write(path, what, err);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create '" + tmp + "'");
  const std::vector<unsigned char>& b = o.buf();
  for (size_t done = 0; done < b.size();) {
    const ssize_t w = ::write(fd, b.data() + done, b.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      fail("write failed");
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail("fsync failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming '" + tmp + "' over it failed");
}

GgufFile read_gguf(const std::string& path) {
  std::ifstream s(path, std::ios::binary);
  if (!s) throw UserError(path, "cannot be opened", "give a .gguf file");
  In in({std::istreambuf_iterator<char>(s), std::istreambuf_iterator<char>()}, path);
  if (in.pod<uint32_t>() != kMagic) in.bad("is not a GGUF file (no \"GGUF\" magic)");
  if (const auto v = in.pod<uint32_t>(); v != kVersion) in.bad("is GGUF version " + std::to_string(v) + ", not 3");
  const auto n_tensors = in.pod<uint64_t>();
  const auto n_kv = in.pod<uint64_t>();
  GgufFile f;
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = in.str();
    f.metadata.emplace_back(std::move(key), get_value(in));
  }
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = in.str();
    const auto dims = in.pod<uint32_t>();
    if (dims > 4) in.bad("tensor '" + t.name + "' has more than 4 dimensions");
    t.shape.resize(dims);
    for (uint32_t d = 0; d < dims; ++d) t.shape[dims - 1 - d] = static_cast<int64_t>(in.pod<uint64_t>());
    t.type = static_cast<GgufType>(in.pod<uint32_t>());
    offsets.push_back(in.pod<uint64_t>());
    f.tensors.push_back(std::move(t));
  }
  const size_t data_start = (in.pos() + kAlignment - 1) / kAlignment * kAlignment;
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    GgufTensor& t = f.tensors[i];
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    in.seek(data_start + offsets[i]);
    const auto size = static_cast<uint64_t>(encoded_bytes(n, t.type));
    const unsigned char* p = in.take(size);
    t.data.assign(p, p + size);
  }
  return f;
}

}  // namespace loom
