// Where `loom train` logs its numbers: the JSONL metrics file (one object per logged step or
// evaluation, each with its "step") and, with train.tensorboard = true, a TensorBoard event file
// in the run directory (io/tfevents.h) with the same numbers as scalars: "val_loss" and
// "best_val_loss" as val/loss and val/best_loss, every other number x as train/x.
#pragma once
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/tfevents.h"

namespace loom {

class MetricsLog {
 public:
  // Appends to `jsonl_path` ("" = no JSONL) and writes a new event file in `tensorboard_dir`
  // ("" = none). Throws std::runtime_error naming a file it cannot open.
  MetricsLog(const std::string& jsonl_path, const std::string& tensorboard_dir);
  ~MetricsLog();
  // One record; flushed to both. Throws std::runtime_error when a write fails (disk full).
  void write(const nlohmann::json& record);
  const EventWriter* tensorboard() const { return tb_.get(); }

 private:
  std::string jsonl_path_;
  std::ofstream jsonl_;
  std::unique_ptr<EventWriter> tb_;
};

// The TensorBoard tag of a metrics key ("val_loss" -> "val/loss", "lr" -> "train/lr").
std::string tensorboard_tag(const std::string& key);

}  // namespace loom
