// TensorBoard event files (io/tfevents.h), decoded back with an independent reader written from
// the format's definition: record framing with masked CRC-32C, and the Event / Summary protos.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "io/tfevents.h"
#include "train/metrics_log.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// ---- a minimal reader -------------------------------------------------------------------------

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Splits a file into record payloads, checking both CRCs of each.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size());
    const uint64_t n = le(file, at, 8);
    EXPECT_EQ(le(file, at + 8, 4), mask(crc32c(file.data() + at, 8))) << "length CRC at " << at;
    const std::string data = file.substr(at + 12, n);
    EXPECT_EQ(le(file, at + 12 + n, 4), mask(crc32c(data.data(), data.size()))) << "data CRC at " << at;
    out.push_back(data);
    at += 12 + n + 4;
  }
  return out;
}

uint64_t varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

struct Field {
  int number = 0, wire = 0;
  uint64_t value = 0;  // varint, fixed64, fixed32
  std::string bytes;   // length-delimited
};

std::vector<Field> fields(const std::string& msg) {
  std::vector<Field> out;
  size_t at = 0;
  while (at < msg.size()) {
    const uint64_t key = varint(msg, at);
    Field f{.number = static_cast<int>(key >> 3), .wire = static_cast<int>(key & 7)};
    if (f.wire == 0) f.value = varint(msg, at);
    if (f.wire == 1) f.value = le(msg, at, 8), at += 8;
    if (f.wire == 5) f.value = le(msg, at, 4), at += 4;
    if (f.wire == 2) {
      const uint64_t n = varint(msg, at);
      f.bytes = msg.substr(at, n);
      at += n;
    }
    out.push_back(f);
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

Event decode(const std::string& data) {
  Event e;
  for (const Field& f : fields(data)) {
    if (f.number == 1 && f.wire == 1) std::memcpy(&e.wall_time, &f.value, 8);
    if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.value);
    if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    if (f.number == 5 && f.wire == 2)
      for (const Field& v : fields(f.bytes)) {  // Summary.value
        EXPECT_EQ(v.number, 1);
        std::string tag;
        float x = NAN;
        for (const Field& g : fields(v.bytes)) {
          if (g.number == 1 && g.wire == 2) tag = g.bytes;
          if (g.number == 2 && g.wire == 5) {
            const auto bits = static_cast<uint32_t>(g.value);
            std::memcpy(&x, &bits, 4);
          }
        }
        e.scalars.emplace_back(tag, x);
      }
  }
  return e;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// ---- tests ------------------------------------------------------------------------------------

// TensorFlow's record framing of a known payload (tensorflow/core/lib/io/record_writer.cc), and
// the masked CRC of "123456789" from CRC-32C's check value 0xE3069283.
TEST(TfEvents, RecordFramingMatchesTheDefinition) {
  EXPECT_EQ(masked_crc32c("123456789"), mask(0xE3069283u));
  const std::string r = tf_record("abc");
  ASSERT_EQ(r.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(le(r, 0, 8), 3u);
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(records(r), std::vector<std::string>{"abc"});
}

TEST(TfEvents, WriterOutputDecodesBack) {
  const fs::path dir = fs::temp_directory_path() / ("loom_test_tfevents_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string path;
  {
    EventWriter w(dir.string());
    path = w.path();
    w.write(1, {{"train/loss", 2.5f}, {"train/lr", 1e-3f}});
    w.write(300, {{"val/loss", 1.75f}});
  }
  EXPECT_NE(fs::path(path).filename().string().find("tfevents"), std::string::npos) << path;
  const std::vector<std::string> recs = records(read(path));
  ASSERT_EQ(recs.size(), 3u);
  const Event head = decode(recs[0]);
  EXPECT_EQ(head.file_version, "brain.Event:2");
  EXPECT_GT(head.wall_time, 1.6e9);
  const Event a = decode(recs[1]), b = decode(recs[2]);
  EXPECT_EQ(a.step, 1);
  EXPECT_EQ(a.scalars, (std::vector<std::pair<std::string, float>>{{"train/loss", 2.5f}, {"train/lr", 1e-3f}}));
  EXPECT_EQ(b.step, 300);
  EXPECT_EQ(b.scalars, (std::vector<std::pair<std::string, float>>{{"val/loss", 1.75f}}));
  EXPECT_GE(b.wall_time, a.wall_time);

  // MetricsLog: the JSONL record and the same numbers as tagged scalars.
  {
    MetricsLog log((dir / "m.jsonl").string(), dir.string());
    log.write({{"step", 7}, {"loss", 0.5}, {"tokens_per_s", 1000.0}});
    log.write({{"step", 10}, {"val_loss", 0.25}, {"best_val_loss", 0.25}});
    path = log.tensorboard()->path();
  }
  EXPECT_EQ(
      read(dir / "m.jsonl"),
      "{\"loss\":0.5,\"step\":7,\"tokens_per_s\":1000.0}\n{\"best_val_loss\":0.25,\"step\":10,\"val_loss\":0.25}\n");
  const std::vector<std::string> logged = records(read(path));
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_EQ(decode(logged[1]).scalars,
            (std::vector<std::pair<std::string, float>>{{"train/loss", 0.5f}, {"train/tokens_per_s", 1000.0f}}));
  EXPECT_EQ(decode(logged[2]).step, 10);
  EXPECT_EQ(decode(logged[2]).scalars,
            (std::vector<std::pair<std::string, float>>{{"val/best_loss", 0.25f}, {"val/loss", 0.25f}}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
