#include "io/tfevents.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/crc32c.h"
#include "core/write_error.h"

namespace loom {

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Protobuf wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<uint64_t>(field << 3 | wire)); }

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_head(double wall_time, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  put_key(e, 1, 1);
  put_le(e, bits, 8);
  if (step != 0) {  // proto3 leaves zero fields out
    put_key(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data.data(), data.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tf_record(std::string_view data) {
  std::string r, len;
  put_le(len, data.size(), 8);
  r += len;
  put_le(r, masked_crc32c(len), 4);
  r.append(data);
  put_le(r, masked_crc32c(data), 4);
  return r;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    put_key(v, 2, 5);
    put_le(v, bits, 4);
    put_bytes(summary, 1, v);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

EventWriter::EventWriter(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const double now = now_seconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host + "." +
          std::to_string(getpid());
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) fail_write(path_, "cannot create the TensorBoard event file", errno);
  append(tf_record(file_version_event(now)));
}

EventWriter::~EventWriter() {
  if (f_) std::fclose(f_);
}

void EventWriter::write(int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  append(tf_record(scalars_event(now_seconds(), step, scalars)));
}

void EventWriter::append(const std::string& record) {
  if (std::fwrite(record.data(), 1, record.size(), f_) != record.size() || std::fflush(f_) != 0)
    fail_write(path_, "cannot write the TensorBoard event file", errno);
}

}  // namespace loom
