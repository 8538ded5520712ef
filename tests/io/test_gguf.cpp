// GGUF files (src/io/gguf.h): the layout ggml's reader requires (header, typed metadata, tensor
// infos innermost dimension first, 32-byte aligned data at the offsets the infos state), the
// encodings (f16, bf16, q8_0) against values worked out by hand from the published schemes, and
// refusals before anything is written. (llama.cpp's own gguf package reading loom's exports, and
// its q8_0 quantizer agreeing byte for byte, is tools/check_gguf.py's check.)
#include "io/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "support/files.h"

namespace loom {
namespace {

using testing::TempDir;

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

template <class T>
T at(const std::vector<unsigned char>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

TEST(Gguf, HeaderMetadataAndTensorInfosAreWhereTheReaderLooks) {
  TempDir d;
  const std::vector<float> x = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  GgufFile f;
  f.metadata = {{"general.architecture", std::string("llama")}, {"llama.block_count", uint32_t{2}}};
  f.tensors.push_back({"a", {2, 3}, GgufType::f32, gguf_encode(x.data(), 6, GgufType::f32)});
  f.tensors.push_back({"b", {3}, GgufType::f16, gguf_encode(x.data(), 3, GgufType::f16)});
  write_gguf(d.path("m.gguf"), f);
  const std::vector<unsigned char> b = file_bytes(d.path("m.gguf"));
  ASSERT_GE(b.size(), 24u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "GGUF");
  EXPECT_EQ(at<uint32_t>(b, 4), 3u);   // version
  EXPECT_EQ(at<uint64_t>(b, 8), 2u);   // tensors
  EXPECT_EQ(at<uint64_t>(b, 16), 2u);  // key/value pairs
  size_t p = 24;
  EXPECT_EQ(at<uint64_t>(b, p), 20u);  // "general.architecture"
  p += 8 + 20;
  EXPECT_EQ(at<uint32_t>(b, p), 8u);  // string
  EXPECT_EQ(at<uint64_t>(b, p + 4), 5u);
  EXPECT_EQ(std::string(b.begin() + static_cast<long>(p) + 12, b.begin() + static_cast<long>(p) + 17), "llama");
  p += 4 + 8 + 5;
  p += 8 + 17;                        // "llama.block_count"
  EXPECT_EQ(at<uint32_t>(b, p), 4u);  // uint32
  EXPECT_EQ(at<uint32_t>(b, p + 4), 2u);
  p += 8;
  // Tensor "a": 2 dims listed innermost first (3, 2), f32, offset 0.
  EXPECT_EQ(at<uint64_t>(b, p), 1u);
  p += 9;
  EXPECT_EQ(at<uint32_t>(b, p), 2u);
  EXPECT_EQ(at<uint64_t>(b, p + 4), 3u);
  EXPECT_EQ(at<uint64_t>(b, p + 12), 2u);
  EXPECT_EQ(at<uint32_t>(b, p + 20), 0u);
  EXPECT_EQ(at<uint64_t>(b, p + 24), 0u);
  p += 32;
  // Tensor "b": after a's 24 bytes padded to 32.
  p += 9;
  EXPECT_EQ(at<uint32_t>(b, p + 12), 1u);  // f16
  EXPECT_EQ(at<uint64_t>(b, p + 16), 32u);
  p += 24;
  const size_t data = (p + 31) / 32 * 32;
  EXPECT_EQ(at<float>(b, data + 4 * 5), 6.f);
  EXPECT_EQ(at<uint16_t>(b, data + 32), 0x3c00);  // f16 1.0
  EXPECT_EQ(b.size(), data + 32 + 6);

  const GgufFile back = read_gguf(d.path("m.gguf"));
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back.tensors[1].data, f.tensors[1].data);
  EXPECT_EQ(std::get<uint32_t>(back.metadata[1].second), 2u);
}

TEST(Gguf, Q8_0IsGgmlsReferenceQuantizer) {
  // Block 1: amax 127, so d = 1 and the values are rounded half away from zero. Block 2: amax 1,
  // d = 1/127 stored as f16, the values scaled by 1/d taken in float32 before that rounding.
  std::vector<float> x(64, 0.f);
  const float first[] = {127.f, -63.5f, 0.5f, -0.5f, 0.49f, 2.5f, -126.5f};
  std::copy(std::begin(first), std::end(first), x.begin());
  x[32] = 1.f;
  x[33] = -0.5f;
  const std::vector<unsigned char> q = gguf_encode(x.data(), 64, GgufType::q8_0);
  ASSERT_EQ(q.size(), 68u);
  EXPECT_EQ(at<uint16_t>(q, 0), 0x3c00);  // 1.0
  const int8_t want[] = {127, -64, 1, -1, 0, 3, -127};
  for (int j = 0; j < 7; ++j) EXPECT_EQ(static_cast<int8_t>(q[2 + j]), want[j]) << j;
  EXPECT_EQ(at<uint16_t>(q, 34), f32_to_f16(1.f / 127.f));
  EXPECT_EQ(static_cast<int8_t>(q[36]), 127);
  EXPECT_EQ(static_cast<int8_t>(q[37]), -64);  // -63.5 (in float32) away from zero
  // The scale is used as the f16 it is stored as.
  const std::vector<float> back = gguf_decode(q.data(), 64, GgufType::q8_0);
  EXPECT_EQ(back[1], -64.f);
  EXPECT_EQ(back[32], 127.f * f16_to_f32(f32_to_f16(1.f / 127.f)));
  // An all-zero block has scale 0 and zeros, not NaNs.
  const std::vector<float> z(32, 0.f);
  for (unsigned char c : gguf_encode(z.data(), 32, GgufType::q8_0)) EXPECT_EQ(c, 0);
  EXPECT_THROW(gguf_encode(z.data(), 31, GgufType::q8_0), std::invalid_argument);
}

TEST(Gguf, Bf16AndF16RoundToNearestEven) {
  const float x[] = {1.f + 1.f / 256, 1.f + 3.f / 256, -0.f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<unsigned char> b = gguf_encode(x, 4, GgufType::bf16);
  EXPECT_EQ(at<uint16_t>(b, 0), 0x3f80);  // tie to even: down
  EXPECT_EQ(at<uint16_t>(b, 2), 0x3f82);  // tie to even: up
  EXPECT_EQ(at<uint16_t>(b, 4), 0x8000);
  EXPECT_EQ(at<uint16_t>(b, 6) & 0x7fc0, 0x7fc0);  // a quiet NaN
  const float h[] = {1.f + 1.f / 2048, 65520.f};
  const std::vector<unsigned char> e = gguf_encode(h, 2, GgufType::f16);
  EXPECT_EQ(at<uint16_t>(e, 0), 0x3c00);
  EXPECT_EQ(at<uint16_t>(e, 2), 0x7c00);  // rounds to inf
}

TEST(Gguf, RefusesWhatTheReaderWouldAndKeepsTheOldFile) {
  TempDir d;
  { std::ofstream(d.path("m.gguf")) << "old"; }
  const float x[32] = {};
  auto one = [&](std::string name, std::vector<int64_t> shape, GgufType t, int64_t n) {
    GgufFile f;
    f.tensors.push_back({std::move(name), std::move(shape), t, gguf_encode(x, n, t)});
    return f;
  };
  EXPECT_THROW(write_gguf(d.path("m.gguf"), one(std::string(64, 'x'), {2}, GgufType::f32, 2)), std::invalid_argument);
  GgufFile dup = one("a", {2}, GgufType::f32, 2);
  dup.tensors.push_back(dup.tensors[0]);
  EXPECT_THROW(write_gguf(d.path("m.gguf"), dup), std::invalid_argument);
  EXPECT_THROW(write_gguf(d.path("m.gguf"), one("q", {32, 1}, GgufType::q8_0, 32)), std::invalid_argument);
  GgufFile wrong = one("a", {3}, GgufType::f32, 2);
  EXPECT_THROW(write_gguf(d.path("m.gguf"), wrong), std::invalid_argument);
  EXPECT_EQ(testing::read_file(d.path("m.gguf")), "old");
  EXPECT_FALSE(std::filesystem::exists(d.path("m.gguf.tmp")));
}

}  // namespace
}  // namespace loom
