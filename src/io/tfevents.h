// TensorBoard event files, scalars only, written without TensorFlow or protobuf
// (docs/reference.md, "TensorBoard event files"):
//   file    DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid> (TensorBoard reads every file
//           whose name contains "tfevents" under --logdir)
//   record  uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes, the data,
//           uint32 masked CRC-32C of the data; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8
//   data    a serialized tensorflow.Event: wall_time (field 1, double), step (2, int64), then
//           file_version (3, string: "brain.Event:2" in the first record) or summary (5): a
//           Summary with one Value per scalar, tag (1, string) and simple_value (2, float)
// The encoders are exposed for tests, which decode what the writer wrote.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

uint32_t masked_crc32c(std::string_view data);
// One record around `data`.
std::string tf_record(std::string_view data);
// A serialized Event with file_version "brain.Event:2".
std::string file_version_event(double wall_time);
// A serialized Event whose summary holds one simple_value per (tag, value).
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

class EventWriter {
 public:
  // Creates the event file in `dir` (which must exist) and writes the file_version record.
  // Throws std::runtime_error naming the file when it cannot be written.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // Appends one record of `scalars` at `step` (wall time now) and flushes it.
  void write(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& record);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace loom
