// safetensors files (huggingface/safetensors "Format"; docs/reference.md, "safetensors format"):
// loom's checkpoints and the JAX golden files in tests/golden/ both use it.
//
// Layout: an unsigned little-endian u64 N, then N bytes of UTF-8 JSON that begins with '{'
// (padded at the end with spaces), then the byte buffer. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the buffer), plus an
// optional "__metadata__" string->string object. Tensor data is little-endian, row-major, and
// the tensors cover the buffer exactly: no holes, no overlaps, nothing after the last one.
//
// loom reads and writes the dtypes it has: F32, BF16, F16, I32. Any other dtype in a file
// (I64, F64, ...) is reported as an error rather than converted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace loom {

// The bounded host buffer through which loom streams safetensors data (stream_safetensors,
// scan_safetensors, read_safetensors_range's callers): 4 MiB amortises a write, a read or a
// message per piece to a few percent of its transfer time while staying small beside any model.
inline constexpr size_t kStreamBytes = size_t{4} << 20;

struct StTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  // shape.numel() * dtype_size(dtype) bytes, little-endian, row-major.
  std::vector<unsigned char> bytes;
};

// A tensor written piecewise from wherever it lives (e.g. a backend buffer): `read(dst, offset, n)`
// copies bytes [offset, offset + n) of its row-major data into host memory at dst.
struct StSource {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::function<void(void* dst, size_t offset, size_t n)> read;
};

// The safetensors dtype string: "F32", "BF16", "F16", "I32".
const char* safetensors_dtype_name(DType dt);

// Reads and validates a whole file. Tensors come back in the order of their data in the file
// (for a file written by write_safetensors: the order they were given in). When `metadata` is
// non-null it is replaced by the file's "__metadata__" (empty if the file has none).
//
// Every problem with the file (missing or unreadable, header length, JSON, a bad entry, an
// unsupported dtype, offsets outside the buffer, a size that does not match dtype x shape,
// overlapping tensors, holes, a truncated buffer, a tensor whose "crc32c/<name>" metadata does not
// match its bytes) throws loom::UserError whose subject is
// `path`, whose message names the tensor and what is wrong, and whose hint says what to do.
// `progress`, when given, is called before every read of at most 64 MiB (a caller that must keep
// answering others while a large file loads, train/checkpoint.cpp).
std::vector<StTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
                                       const std::function<void()>& progress = {});

// A tensor of a file, located and verified (scan_safetensors) but not held in memory.
struct StEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t offset = 0, bytes = 0;  // where its data lies in the file, and its length
  uint32_t crc = 0;                // the CRC-32C of its bytes, as read
};

// Checks a file as read_safetensors does (every problem it reports, checksums included) without
// keeping its data: the tensors are read in order through one kStreamBytes buffer, each piece
// shown to `visit(entry, bytes, n)` when given (e.g. a finiteness check that throws). Returns the
// tensors in the order of their data in the file.
std::vector<StEntry> scan_safetensors(
    const std::string& path, const std::function<void(const StEntry&, const unsigned char*, size_t)>& visit = {},
    const std::function<void()>& progress = {});
// Bytes [offset, offset + n) of tensor `e` of the file `path` (as scan_safetensors found it) into
// dst. A file that no longer holds them is a UserError naming it.
void read_safetensors_range(const std::string& path, const StEntry& e, uint64_t offset, size_t n, void* dst);
// Elements [begin, end) of the float32 tensor `e` of `path`, read through `buf` (sized to
// kStreamBytes here) a piece at a time: `progress` (when given) before each read, then
// take(at, n, values) with the piece's first element and its length.
void read_safetensors_f32(const std::string& path, const StEntry& e, int64_t begin, int64_t end, std::vector<float>& buf,
                          const std::function<void(int64_t at, int64_t n, const float* values)>& take,
                          const std::function<void()>& progress = {});

// Writes `tensors` in the given order, with `metadata` as "__metadata__". Each tensor's CRC-32C
// is added to the metadata as "crc32c/<name>" (8 hex digits), and read_safetensors verifies it:
// a flipped bit is an error naming the tensor, not a silently different model.
// The header is padded with spaces to a multiple of 8 bytes. The data goes to `path + ".tmp"`,
// which is fsync'ed and then renamed over `path` (and the directory fsync'ed), so a crash or a
// full disk leaves either the old file or the new one, never a broken one. On failure the
// temporary file is removed, `path` is left as it was, and std::runtime_error names the path
// and the errno text.
//
// Bad arguments (an empty, duplicate or "__metadata__" name, bytes that do not match dtype x
// shape, a negative dimension) throw std::invalid_argument before anything is written.
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// write_safetensors from sources, streamed through one kStreamBytes host buffer: writing costs no copy of the
// tensors. An exception from a source's read removes the temporary file and propagates. `sync`
// flushes the file and then its directory to disk (::fsync when empty): a caller that must keep
// answering others while the disk works (train/checkpoint.cpp) waits its own way.
using SyncFn = std::function<int(int fd)>;
void stream_safetensors(const std::string& path, const std::vector<StSource>& tensors,
                        const std::map<std::string, std::string>& metadata = {}, const SyncFn& sync = {});

}  // namespace loom
