// safetensors reading and writing (src/io/safetensors.h): round trips of every dtype,
// interop with files written by the Python safetensors library and by tools/jax_golden.py, the
// rejection of every kind of broken file, and crash-safe writes that keep the old file.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "loom_st_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<unsigned char> file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& p, const std::vector<unsigned char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A raw file: the header text as given (no padding) after its u64 length, then `data_bytes`
// bytes of data.
std::vector<unsigned char> raw_file(const std::string& header, size_t data_bytes, uint64_t header_len = UINT64_MAX) {
  const uint64_t n = header_len == UINT64_MAX ? header.size() : header_len;
  std::vector<unsigned char> b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(n >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<unsigned char>(i * 7 + 1));
  return b;
}

template <class T>
std::vector<unsigned char> as_bytes(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

StTensor make(const std::string& name, DType dt, Shape shape, std::vector<unsigned char> bytes) {
  StTensor t;
  t.name = name;
  t.dtype = dt;
  t.shape = shape;
  t.bytes = std::move(bytes);
  return t;
}

std::vector<StTensor> sample_tensors() {
  std::vector<StTensor> ts;
  ts.push_back(make("block/mlp/input_layer/kernel", DType::f32, {2, 3},
                    as_bytes(std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e-30f})));
  ts.push_back(make("bf16", DType::bf16, {4},
                    as_bytes(std::vector<uint16_t>{f32_to_bf16(1.0f), f32_to_bf16(-2.5f), 0x7f80, 0x0001})));
  ts.push_back(
      make("f16", DType::f16, {2, 1, 2}, as_bytes(std::vector<uint16_t>{f32_to_f16(0.5f), 0x7bff, 0x0001, 0xfc00})));
  ts.push_back(make("batch/inputs", DType::i32, {3}, as_bytes(std::vector<int32_t>{0, -1, INT32_MAX})));
  ts.push_back(make("scalar", DType::f32, {}, as_bytes(std::vector<float>{3.5f})));
  ts.push_back(make("empty", DType::f32, {0, 4}, {}));
  ts.push_back(make("empty_bf16", DType::bf16, {0}, {}));
  ts.push_back(make("scalar_i32", DType::i32, {}, as_bytes(std::vector<int32_t>{-7})));
  return ts;
}

void expect_same(const std::vector<StTensor>& got, const std::vector<StTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].dtype, want[i].dtype);
    EXPECT_EQ(got[i].shape, want[i].shape) << got[i].shape.str();
    EXPECT_EQ(got[i].bytes, want[i].bytes);
  }
}

// The u64 header length and the header text of a file.
std::pair<uint64_t, std::string> header_of(const std::vector<unsigned char>& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b.at(static_cast<size_t>(i));
  return {n, std::string(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n))};
}

TEST_F(SafetensorsTest, RoundTripEveryDTypeWithMetadata) {
  const auto ts = sample_tensors();
  const std::map<std::string, std::string> meta = {
      {"config", R"({"model": {"hidden_size": 64}})"}, {"loss_first", "4.99102736"}, {"unicode", "µs"}};
  const std::string p = path("a.safetensors");
  write_safetensors(p, ts, meta);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  std::map<std::string, std::string> got_meta = {{"stale", "x"}};
  const auto got = read_safetensors(p, &got_meta);
  expect_same(got, ts);  // in the order given, which is the order of the data
  EXPECT_EQ(got_meta, meta);

  // Layout: header padded with spaces to a multiple of 8, data right after it.
  const auto bytes = file_bytes(p);
  const auto [n, header] = header_of(bytes);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(header.front(), '{');
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);
  size_t data = 0;
  for (const auto& t : ts) data += t.bytes.size();
  EXPECT_EQ(bytes.size(), 8 + n + data);
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j.at("__metadata__").at("loss_first"), "4.99102736");
  EXPECT_EQ(j.at("scalar").at("shape"), nlohmann::json::array());
  EXPECT_EQ(j.at("bf16").at("dtype"), "BF16");
  EXPECT_EQ(j.at("f16").at("dtype"), "F16");
  EXPECT_EQ(j.at("batch/inputs").at("dtype"), "I32");
  EXPECT_EQ(j.at("block/mlp/input_layer/kernel").at("data_offsets"), nlohmann::json::array({0, 24}));
}

TEST_F(SafetensorsTest, NoMetadataAndNoTensors) {
  const std::string p = path("empty.safetensors");
  write_safetensors(p, {});
  std::map<std::string, std::string> meta = {{"stale", "x"}};
  EXPECT_TRUE(read_safetensors(p, &meta).empty());
  EXPECT_TRUE(meta.empty());
  const auto bytes = file_bytes(p);
  EXPECT_EQ(bytes.size(), 16u);  // "{}" padded to 8
  EXPECT_EQ(header_of(bytes).second, "{}      ");

  const auto ts = sample_tensors();
  write_safetensors(p, ts);  // replaces the existing file
  expect_same(read_safetensors(p, &meta), ts);
  EXPECT_TRUE(meta.empty());  // the checksums loom adds are not handed back as metadata
  EXPECT_NE(header_of(file_bytes(p)).second.find("\"crc32c/scalar\""), std::string::npos);
}

// Every tensor loom writes carries its CRC-32C; one flipped bit anywhere in a tensor's data is an
// error naming that tensor, and a file without checksums (another writer's) still reads.
TEST_F(SafetensorsTest, FlippedBitIsAnErrorNamingTheTensor) {
  const std::string p = path("crc.safetensors");
  const auto ts = sample_tensors();
  write_safetensors(p, ts);
  auto bytes = file_bytes(p);
  const auto [header_len, header] = header_of(bytes);
  const auto h = nlohmann::json::parse(header);
  for (const loom::StTensor& t : ts) {
    if (t.bytes.empty()) continue;
    const size_t at = 8 + header_len + h.at(t.name).at("data_offsets")[0].get<size_t>() + t.bytes.size() / 2;
    auto broken = bytes;
    broken[at] ^= 0x10;
    const std::string q = path("broken.safetensors");
    std::ofstream(q, std::ios::binary)
        .write(reinterpret_cast<const char*>(broken.data()), static_cast<std::streamsize>(broken.size()));
    for (const bool streamed : {false, true}) {  // scan_safetensors checks what read_safetensors does
      try {
        if (streamed)
          scan_safetensors(q);
        else
          read_safetensors(q);
        ADD_FAILURE() << "no error for a flipped bit in " << t.name << (streamed ? " (scan)" : "");
      } catch (const loom::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("'" + t.name + "' fails its checksum"), std::string::npos) << e.what();
      }
    }
  }
}

// scan_safetensors shows every byte once, in order, through its bounded buffer (a tensor larger
// than kStreamBytes in several pieces) and locates each tensor so that any range of it reads back
// as read_safetensors reads the whole.
TEST_F(SafetensorsTest, ScanLocatesWhatReadReads) {
  auto ts = sample_tensors();
  std::vector<float> big(kStreamBytes / sizeof(float) * 2 + 5);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  ts.push_back(make("big", DType::f32, Shape{static_cast<int64_t>(big.size())}, as_bytes(big)));
  const std::string p = path("scan.safetensors");
  write_safetensors(p, ts);
  const std::vector<StTensor> whole = read_safetensors(p);
  std::map<std::string, std::vector<unsigned char>> seen;
  const std::vector<StEntry> found = scan_safetensors(p, [&](const StEntry& e, const unsigned char* b, size_t n) {
    EXPECT_LE(n, kStreamBytes);
    seen[e.name].insert(seen[e.name].end(), b, b + n);
  });
  ASSERT_EQ(found.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const StEntry& e = found[i];
    EXPECT_EQ(e.name, whole[i].name);
    EXPECT_EQ(e.shape, whole[i].shape);
    EXPECT_EQ(e.bytes, whole[i].bytes.size());
    EXPECT_EQ(seen[e.name], whole[i].bytes) << e.name;
    if (e.bytes < 3) continue;
    std::vector<unsigned char> middle(e.bytes - 2);  // all but the first and the last byte
    read_safetensors_range(p, e, 1, middle.size(), middle.data());
    EXPECT_TRUE(std::equal(middle.begin(), middle.end(), whole[i].bytes.begin() + 1)) << e.name;
  }
}

TEST_F(SafetensorsTest, StreamedSourcesEqualInMemoryTensors) {
  const auto ts = sample_tensors();
  std::vector<loom::StSource> src;
  for (const loom::StTensor& t : ts)
    src.push_back({.name = t.name, .dtype = t.dtype, .shape = t.shape, .read = [&t](void* d, size_t o, size_t n) {
                     std::memcpy(d, t.bytes.data() + o, n);
                   }});
  const std::string a = path("a.safetensors"), b = path("b.safetensors");
  write_safetensors(a, ts, {{"k", "v"}});
  loom::stream_safetensors(b, src, {{"k", "v"}});
  EXPECT_EQ(file_bytes(a), file_bytes(b));
  // A source that fails leaves no file behind and nothing half-written.
  src[0].read = [](void*, size_t, size_t) { throw std::runtime_error("device gone"); };
  EXPECT_THROW(loom::stream_safetensors(path("c.safetensors"), src), std::runtime_error);
  EXPECT_FALSE(fs::exists(path("c.safetensors")));
  EXPECT_FALSE(fs::exists(path("c.safetensors") + ".tmp"));
}

TEST_F(SafetensorsTest, OnlyTheFourLoomDTypeNames) {
  EXPECT_STREQ(safetensors_dtype_name(DType::f32), "F32");
  EXPECT_STREQ(safetensors_dtype_name(DType::bf16), "BF16");
  EXPECT_STREQ(safetensors_dtype_name(DType::f16), "F16");
  EXPECT_STREQ(safetensors_dtype_name(DType::i32), "I32");
}

// Written by the Python safetensors library (0.8.0, safetensors.numpy.save) from
//   f32 = arange(6).reshape(2,3)*0.5-1, bf16 = [1, -2.5, 3.140625, 0], f16 = [[0.5,-1],[65504,2^-24]],
//   i32 = [1, -2, 2147483647], scalar = 3.5 (shape []), empty = zeros((0,4)), metadata {"format": "np"}.
const char kPythonFile[] =
    "\x80\x01\x00\x00\x00\x00\x00\x00\x7b\x22\x5f\x5f\x6d\x65\x74\x61\x64\x61\x74\x61\x5f\x5f\x22\x3a"
    "\x7b\x22\x66\x6f\x72\x6d\x61\x74\x22\x3a\x22\x6e\x70\x22\x7d\x2c\x22\x65\x6d\x70\x74\x79\x22\x3a"
    "\x7b\x22\x64\x74\x79\x70\x65\x22\x3a\x22\x46\x33\x32\x22\x2c\x22\x73\x68\x61\x70\x65\x22\x3a\x5b"
    "\x30\x2c\x34\x5d\x2c\x22\x64\x61\x74\x61\x5f\x6f\x66\x66\x73\x65\x74\x73\x22\x3a\x5b\x30\x2c\x30"
    "\x5d\x7d\x2c\x22\x66\x33\x32\x22\x3a\x7b\x22\x64\x74\x79\x70\x65\x22\x3a\x22\x46\x33\x32\x22\x2c"
    "\x22\x73\x68\x61\x70\x65\x22\x3a\x5b\x32\x2c\x33\x5d\x2c\x22\x64\x61\x74\x61\x5f\x6f\x66\x66\x73"
    "\x65\x74\x73\x22\x3a\x5b\x30\x2c\x32\x34\x5d\x7d\x2c\x22\x73\x63\x61\x6c\x61\x72\x22\x3a\x7b\x22"
    "\x64\x74\x79\x70\x65\x22\x3a\x22\x46\x33\x32\x22\x2c\x22\x73\x68\x61\x70\x65\x22\x3a\x5b\x5d\x2c"
    "\x22\x64\x61\x74\x61\x5f\x6f\x66\x66\x73\x65\x74\x73\x22\x3a\x5b\x32\x34\x2c\x32\x38\x5d\x7d\x2c"
    "\x22\x69\x33\x32\x22\x3a\x7b\x22\x64\x74\x79\x70\x65\x22\x3a\x22\x49\x33\x32\x22\x2c\x22\x73\x68"
    "\x61\x70\x65\x22\x3a\x5b\x33\x5d\x2c\x22\x64\x61\x74\x61\x5f\x6f\x66\x66\x73\x65\x74\x73\x22\x3a"
    "\x5b\x32\x38\x2c\x34\x30\x5d\x7d\x2c\x22\x62\x66\x31\x36\x22\x3a\x7b\x22\x64\x74\x79\x70\x65\x22"
    "\x3a\x22\x42\x46\x31\x36\x22\x2c\x22\x73\x68\x61\x70\x65\x22\x3a\x5b\x34\x5d\x2c\x22\x64\x61\x74"
    "\x61\x5f\x6f\x66\x66\x73\x65\x74\x73\x22\x3a\x5b\x34\x30\x2c\x34\x38\x5d\x7d\x2c\x22\x66\x31\x36"
    "\x22\x3a\x7b\x22\x64\x74\x79\x70\x65\x22\x3a\x22\x46\x31\x36\x22\x2c\x22\x73\x68\x61\x70\x65\x22"
    "\x3a\x5b\x32\x2c\x32\x5d\x2c\x22\x64\x61\x74\x61\x5f\x6f\x66\x66\x73\x65\x74\x73\x22\x3a\x5b\x34"
    "\x38\x2c\x35\x36\x5d\x7d\x7d\x20\x00\x00\x80\xbf\x00\x00\x00\xbf\x00\x00\x00\x00\x00\x00\x00\x3f"
    "\x00\x00\x80\x3f\x00\x00\xc0\x3f\x00\x00\x60\x40\x01\x00\x00\x00\xfe\xff\xff\xff\xff\xff\xff\x7f"
    "\x80\x3f\x20\xc0\x49\x40\x00\x00\x00\x38\x00\xbc\xff\x7b\x01\x00";

TEST_F(SafetensorsTest, ReadsAFileWrittenByThePythonLibrary) {
  const std::string p = path("py.safetensors");
  write_bytes(p, std::vector<unsigned char>(kPythonFile, kPythonFile + sizeof(kPythonFile) - 1));
  std::map<std::string, std::string> meta;
  const auto ts = read_safetensors(p, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "np"}}));
  // Data order: empty [0,0], f32, scalar, i32, bf16, f16.
  ASSERT_EQ(ts.size(), 6u);
  std::vector<std::string> names;
  for (const auto& t : ts) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"empty", "f32", "scalar", "i32", "bf16", "f16"}));
  EXPECT_EQ(ts[0].shape, (Shape{0, 4}));
  EXPECT_TRUE(ts[0].bytes.empty());
  ASSERT_EQ(ts[1].shape, (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(load_as_f32(ts[1].bytes.data(), DType::f32, i), i * 0.5f - 1.0f);
  EXPECT_EQ(ts[2].shape.rank, 0);
  EXPECT_EQ(load_as_f32(ts[2].bytes.data(), DType::f32, 0), 3.5f);
  EXPECT_EQ(ts[3].dtype, DType::i32);
  int32_t i32[3];
  std::memcpy(i32, ts[3].bytes.data(), 12);
  EXPECT_EQ(i32[0], 1);
  EXPECT_EQ(i32[1], -2);
  EXPECT_EQ(i32[2], 2147483647);
  EXPECT_EQ(ts[4].dtype, DType::bf16);
  const float bf[4] = {1.0f, -2.5f, 3.140625f, 0.0f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(load_as_f32(ts[4].bytes.data(), DType::bf16, i), bf[i]);
  EXPECT_EQ(ts[5].dtype, DType::f16);
  const float hf[4] = {0.5f, -1.0f, 65504.0f, 0x1p-24f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(load_as_f32(ts[5].bytes.data(), DType::f16, i), hf[i]);

  // And loom writes it back so that it reads the same.
  write_safetensors(path("again.safetensors"), ts, meta);
  std::map<std::string, std::string> meta2;
  expect_same(read_safetensors(path("again.safetensors"), &meta2), ts);
  EXPECT_EQ(meta2, meta);
}

TEST_F(SafetensorsTest, ReadsTheJaxGoldenInit) {
#ifdef LOOM_SOURCE_DIR
  const std::string p = std::string(LOOM_SOURCE_DIR) + "/tests/golden/transformer_init.safetensors";
#else
  const std::string p = "tests/golden/transformer_init.safetensors";
#endif
  if (!fs::exists(p)) GTEST_SKIP() << p << " not found (run tools/make_goldens.sh)";
  std::map<std::string, std::string> meta;
  const auto ts = read_safetensors(p, &meta);
  std::map<std::string, const StTensor*> by_name;
  for (const auto& t : ts) by_name[t.name] = &t;
  ASSERT_TRUE(by_name.count("block/attn/qkv/kernel"));
  EXPECT_EQ(by_name["block/attn/qkv/kernel"]->shape, (Shape{2, 64, 4, 48}));
  EXPECT_EQ(by_name["block/attn/qkv/kernel"]->dtype, DType::f32);
  ASSERT_TRUE(by_name.count("embed/embedding"));
  EXPECT_EQ(by_name["embed/embedding"]->shape, (Shape{97, 64}));
  ASSERT_TRUE(by_name.count("batch/inputs"));
  EXPECT_EQ(by_name["batch/inputs"]->dtype, DType::i32);
  EXPECT_EQ(by_name["batch/inputs"]->shape, (Shape{8, 32}));
  const auto cfg = nlohmann::json::parse(meta.at("config"));
  EXPECT_EQ(cfg.at("model").at("hidden_size"), 64);
}

// Every broken file is a UserError about the file, naming the problem, with a hint.
void expect_rejected(const std::string& p, const std::string& problem) {
  try {
    read_safetensors(p);
    ADD_FAILURE() << "read_safetensors accepted a broken file; expected: " << problem;
  } catch (const UserError& e) {
    EXPECT_EQ(e.subject(), p);
    EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST_F(SafetensorsTest, RejectsTruncatedFiles) {
  const std::string p = path("t.safetensors");
  write_safetensors(p, sample_tensors());
  const auto good = file_bytes(p);
  write_bytes(p, std::vector<unsigned char>(good.begin(), good.end() - 3));
  expect_rejected(p, "reach past the end of the");
  write_bytes(p, std::vector<unsigned char>(good.begin(), good.begin() + 40));
  expect_rejected(p, "is beyond the end of the 40-byte file");
  write_bytes(p, std::vector<unsigned char>(good.begin(), good.begin() + 5));
  expect_rejected(p, "file is 5 bytes, too short");
  write_bytes(p, {});
  expect_rejected(p, "file is 0 bytes, too short");
  expect_rejected(path("missing.safetensors"), "cannot open");
  expect_rejected(dir_.string(), "not a regular file");
}

TEST_F(SafetensorsTest, RejectsBadHeaderLengthAndText) {
  const std::string p = path("h.safetensors");
  write_bytes(p, raw_file("{}", 0, 100'000'001));
  expect_rejected(p, "header length 100000001 is above the format's limit of 100000000 bytes");
  write_bytes(p, raw_file("{}", 0, 0));
  expect_rejected(p, "does not begin with '{'");
  write_bytes(p, raw_file("[1, 2, 3]", 0));
  expect_rejected(p, "does not begin with '{'");
  write_bytes(p, raw_file("{not json}", 0));
  expect_rejected(p, "header is not valid JSON");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", 4));
  expect_rejected(p, "header is not valid JSON");  // unterminated
  write_bytes(p, raw_file(std::string("{}\0\0\0\0\0\0", 8), 0));
  expect_rejected(p, "header has a NUL byte at offset 2");  // padding must be spaces
  write_bytes(
      p,
      raw_file(
          R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
          R"("a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          8));
  expect_rejected(p, "header has the key 'a' twice");
  write_bytes(p, raw_file(R"({"__metadata__": {"k": 1}})", 0));
  expect_rejected(p, "metadata 'k' is number, expected a string");
  write_bytes(p, raw_file(R"({"__metadata__": ["k"]})", 0));
  expect_rejected(p, "\"__metadata__\" is array");
  write_bytes(p, raw_file(R"({"a": [1]})", 0));
  expect_rejected(p, "tensor 'a': header entry is array");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1]}})", 0));
  expect_rejected(p, "tensor 'a': header entry has no \"data_offsets\"");
  // Padding with spaces is fine (the writer of the spec does it).
  write_bytes(p, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"
                          "      ",
                          4));
  EXPECT_EQ(read_safetensors(p).size(), 1u);
}

TEST_F(SafetensorsTest, RejectsUnknownAndUnsupportedDTypes) {
  const std::string p = path("d.safetensors");
  write_bytes(p, raw_file(R"({"a": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}})", 1));
  expect_rejected(p, "tensor 'a': unknown dtype \"Q8\"");
  write_bytes(p, raw_file(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8));
  expect_rejected(p, "tensor 'a': dtype \"I64\" is not supported by loom (F32, BF16, F16, I32)");
  write_bytes(p, raw_file(R"({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "unknown dtype \"f32\"");  // names are case-sensitive
  write_bytes(p, raw_file(R"({"a": {"dtype": 32, "shape": [1], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "tensor 'a': dtype is number, expected a string");
}

TEST_F(SafetensorsTest, RejectsBadShapesAndOffsets) {
  const std::string p = path("o.safetensors");
  // Out of range: the header promises more data than the file has.
  write_bytes(p, raw_file(R"({"w": {"dtype": "F32", "shape": [250], "data_offsets": [0, 1000]}})", 16));
  expect_rejected(p, "tensor 'w': data_offsets [0, 1000] reach past the end of the 16-byte data buffer");
  // Size mismatch.
  write_bytes(
      p,
      raw_file(R"({"block_0/mlp/input_layer/kernel": {"dtype": "F32", "shape": [16, 16], "data_offsets": [0, 100]}})",
               100));
  expect_rejected(
      p,
      "tensor 'block_0/mlp/input_layer/kernel': data_offsets [0, 100] give 100 bytes, expected 1024 for F32 [16, 16]");
  write_bytes(p, raw_file(R"({"s": {"dtype": "BF16", "shape": [], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "tensor 's': data_offsets [0, 4] give 4 bytes, expected 2 for BF16 []");
  // Overlap.
  write_bytes(
      p,
      raw_file(
          R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
          R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
          12));
  expect_rejected(p, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]");
  write_bytes(
      p,
      raw_file(
          R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
          R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
          8));
  expect_rejected(p, "overlap tensor 'a' [0, 8]");
  // Holes: before the first tensor, between two, after the last.
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8));
  expect_rejected(p, "bytes [0, 4] of the data buffer belong to no tensor (a hole before tensor 'a')");
  write_bytes(
      p,
      raw_file(
          R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
          R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
          12));
  expect_rejected(p, "bytes [4, 8] of the data buffer belong to no tensor (a hole between tensor 'a' and tensor 'b')");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 6));
  expect_rejected(p, "the data buffer has 2 bytes after the last tensor");
  // Malformed offsets and shapes.
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8));
  expect_rejected(p, "tensor 'a': data_offsets [8, 4] end before they begin");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4));
  expect_rejected(p, "is not a pair of non-negative integers");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 4));
  expect_rejected(p, "is not a pair of non-negative integers");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "has an entry that is not a non-negative integer");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "has an entry that is not a non-negative integer");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})", 16));
  expect_rejected(p, "tensor 'a': shape is number, expected an array");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "tensor 'a': rank 7 is above loom's maximum of 6");
  write_bytes(p, raw_file(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4));
  expect_rejected(p, "is too large to exist");
}

TEST_F(SafetensorsTest, EmptyTensorsMayShareAnOffset) {
  const std::string p = path("e.safetensors");
  write_bytes(
      p,
      raw_file(
          R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
          R"("z": {"dtype": "F16", "shape": [0, 3], "data_offsets": [4, 4]}, )"
          R"("y": {"dtype": "I32", "shape": [0], "data_offsets": [4, 4]}, )"
          R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          8));
  const auto ts = read_safetensors(p);
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_EQ(ts[0].name, "a");
  EXPECT_EQ(ts[1].name, "y");  // same offsets: by name
  EXPECT_EQ(ts[2].name, "z");
  EXPECT_EQ(ts[3].name, "b");
}

TEST_F(SafetensorsTest, WriteRejectsBadArgumentsBeforeTouchingTheFile) {
  const std::string p = path("bad.safetensors");
  auto ts = sample_tensors();
  ts[0].bytes.pop_back();
  EXPECT_THROW(write_safetensors(p, ts), std::invalid_argument);
  ts = sample_tensors();
  ts[1].name = ts[0].name;
  EXPECT_THROW(write_safetensors(p, ts), std::invalid_argument);
  ts = sample_tensors();
  ts[2].name = "__metadata__";
  EXPECT_THROW(write_safetensors(p, ts), std::invalid_argument);
  ts = sample_tensors();
  ts[3].name.clear();
  EXPECT_THROW(write_safetensors(p, ts), std::invalid_argument);
  EXPECT_THROW(write_safetensors(p, sample_tensors(), {{"k", std::string("\xff\xfe")}}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

// The message of a write failure names the file and says why (errno text).
void expect_write_fails(const std::string& p, const std::vector<StTensor>& ts, const std::string& why) {
  try {
    write_safetensors(p, ts);
    ADD_FAILURE() << "write_safetensors succeeded; expected: " << why;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsTest, WriteIntoAMissingDirectoryFails) {
  const std::string p = path("no/such/dir/x.safetensors");
  expect_write_fails(p, sample_tensors(), "No such file or directory");
  EXPECT_FALSE(fs::exists(path("no")));
}

// Works as root too: nothing here depends on permissions.
TEST_F(SafetensorsTest, FailedWriteKeepsThePreviousFile) {
  const std::string p = path("ckpt.safetensors");
  const auto v1 = sample_tensors();
  write_safetensors(p, v1, {{"step", "1"}});
  const auto before = file_bytes(p);

  // The temporary file cannot be created: a directory is in its place.
  fs::create_directory(p + ".tmp");
  auto v2 = sample_tensors();
  v2.pop_back();
  expect_write_fails(p, v2, "Is a directory");
  EXPECT_TRUE(fs::is_directory(p + ".tmp"));  // not ours: left alone
  EXPECT_EQ(file_bytes(p), before);
  fs::remove(p + ".tmp");

  // The disk fills up in the middle of the data (RLIMIT_FSIZE binds root as well): write() fails
  // with EFBIG, the partial temporary file is removed and the old file is untouched.
  std::vector<StTensor> big = {make("big", DType::f32, {64, 1024}, std::vector<unsigned char>(64 * 1024 * 4, 0x42))};
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    write_safetensors(p, big);
    ADD_FAILURE() << "write beyond RLIMIT_FSIZE succeeded";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_EQ(::sigaction(SIGXFSZ, &old_action, nullptr), 0);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(file_bytes(p), before);
  std::map<std::string, std::string> meta;
  expect_same(read_safetensors(p, &meta), v1);
  EXPECT_EQ(meta.at("step"), "1");

  // And once the disk has room again the new file replaces the old one.
  write_safetensors(p, big);
  expect_same(read_safetensors(p), big);
}

}  // namespace
}  // namespace loom
