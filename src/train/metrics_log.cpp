#include "train/metrics_log.h"

#include <cerrno>
#include <utility>
#include <vector>

#include "core/write_error.h"

namespace loom {

std::string tensorboard_tag(const std::string& key) {
  if (key == "val_loss") return "val/loss";
  if (key == "best_val_loss") return "val/best_loss";
  return "train/" + key;
}

MetricsLog::MetricsLog(const std::string& jsonl_path, const std::string& tensorboard_dir) : jsonl_path_(jsonl_path) {
  if (!jsonl_path.empty()) {
    jsonl_.open(jsonl_path, std::ios::app);
    if (!jsonl_) fail_write(jsonl_path, "cannot open the metrics file for writing", errno);
  }
  if (!tensorboard_dir.empty()) tb_ = std::make_unique<EventWriter>(tensorboard_dir);
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::write(const nlohmann::json& record) {
  if (jsonl_.is_open()) {
    jsonl_ << record.dump() << "\n";
    jsonl_.flush();
    if (!jsonl_) fail_write(jsonl_path_, "cannot write the metrics file", errno);
  }
  if (!tb_) return;
  // Every event carries its own wall time: elapsed_s would only repeat it as a curve.
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [key, value] : record.items())
    if (key != "step" && key != "elapsed_s" && value.is_number()) scalars.emplace_back(tensorboard_tag(key), value.get<float>());
  tb_->write(record.at("step").get<int64_t>(), scalars);
}

}  // namespace loom
