// GGUF v3 files, the format llama.cpp and Ollama run (ggml's docs/gguf.md; the facts loom relies on
// are in docs/ARCHITECTURE.md, "GGUF"). This is the file format alone: what the keys and tensors of
// a model are is train/gguf_export.h's.
//
// Layout (little-endian): "GGUF", version 3, tensor count u64, key/value count u64; the key/value
// pairs (key as a GGUF string: u64 length + bytes; u32 value type; value); the tensor infos (name,
// u32 dims, u64 dims innermost first, u32 ggml type, u64 offset into the data section); zero
// padding to 32 bytes; the tensors, each starting at a multiple of 32 from the data section's
// start, in info order with nothing between them but padding (ggml's reader requires it).
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace loom {

// The ggml tensor types loom writes.
enum class GgufType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };

// The metadata value types loom writes (GGUF value types uint32 = 4, int32 = 5, float32 = 6,
// bool = 7, string = 8, array = 9 of one of those).
using GgufValue = std::variant<uint32_t, int32_t, float, bool, std::string, std::vector<std::string>,
                               std::vector<float>, std::vector<int32_t>>;

// The bytes of `n` float32 values in `type`: f16 and bf16 rounded to nearest even (a NaN stays a
// quiet NaN); q8_0 in blocks of 32 values, each an f16 scale d = amax/127 and 32 int8 values
// round(x/d) (ggml's quantize_row_q8_0_ref: 1/d taken in float32 before d is rounded to f16,
// halves rounded away from zero). q8_0 needs n to be a multiple of 32.
std::vector<unsigned char> gguf_encode(const float* x, int64_t n, GgufType type);
// The inverse of gguf_encode (q8_0 gives the dequantized values).
std::vector<float> gguf_decode(const unsigned char* bytes, int64_t n, GgufType type);

struct GgufTensor {
  std::string name;            // < 64 bytes: "blk.0.attn_q.weight"
  std::vector<int64_t> shape;  // row-major (PyTorch's order); the file lists it innermost first
  GgufType type = GgufType::f32;
  std::vector<unsigned char> data;  // gguf_encode's bytes
};

struct GgufFile {
  std::vector<std::pair<std::string, GgufValue>> metadata;  // in the order written
  std::vector<GgufTensor> tensors;
};

// Writes `f` to `path` through `path + ".tmp"`, fsync'ed and renamed over it: a failure leaves
// `path` as it was (std::runtime_error naming the path). A name of 64 bytes or more, a duplicate
// name, a q8_0 tensor whose innermost dimension is no multiple of 32 or data of the wrong size is
// std::invalid_argument, before anything is written.
void write_gguf(const std::string& path, const GgufFile& f);
// Reads a file write_gguf wrote (the tests' check of the layout; tools/check_gguf.py reads exports
// with llama.cpp's own gguf package). A malformed file is a UserError naming `path`.
GgufFile read_gguf(const std::string& path);

}  // namespace loom
