#include "train/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/param_io.h"
#include "train/trainer.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

const char* kModelFile = "model.safetensors";

// ".<name><suffix>" beside `dir`: where a checkpoint is staged or moved aside.
fs::path sibling(const fs::path& dir, const char* suffix) {
  std::string name = ".";
  name += dir.filename().string();
  name += suffix;
  return dir.parent_path() / name;
}
const char* kStateFile = "state.json";

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot read the file", "the checkpoint is incomplete: choose another one");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.flush();
  if (!f) throw std::runtime_error("could not write '" + path + "' (disk full?)");
}

constexpr const char* kMomentPrefix[2] = {"opt/mu/", "opt/nu/"};

// The moments of every parameter, named like the parameters with an "opt/mu/" or "opt/nu/" prefix
// (gathered from every rank when the optimizer state is sharded).
std::vector<StTensor> export_moments(const Trainer& t) {
  std::vector<StTensor> out;
  const Graph& g = t.model().graph;
  for (int which : {0, 1}) {
    const std::vector<std::vector<float>> m = t.moments(which);
    for (size_t i = 0; i < m.size() && !m[i].empty(); ++i) {
      const Value& v = g.value(g.params()[i].value);
      StTensor s{kMomentPrefix[which] + v.name, DType::f32, v.shape,
                 std::vector<unsigned char>(static_cast<size_t>(v.bytes()))};
      std::memcpy(s.bytes.data(), m[i].data(), s.bytes.size());
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace

void save_checkpoint(const Trainer& t, const CheckpointState& s, const std::string& dir,
                     const nlohmann::json* tokenizer) {
  if (t.comm().rank() != 0 && !t.sharded()) return;
  std::vector<StTensor> moments = export_moments(t);  // every rank takes part when it is sharded
  if (t.comm().rank() != 0) return;
  const fs::path final_dir(dir);
  const fs::path tmp = sibling(final_dir, ".tmp");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  try {
    std::vector<StTensor> tensors = export_params(t.executor(), t.config().model.scan_layers);
    for (StTensor& m : moments) tensors.push_back(std::move(m));
    write_safetensors((tmp / kModelFile).string(), tensors, {{"format", "loom checkpoint"}});
    nlohmann::json j = {{"config", s.config_toml},
                        {"step", s.step},
                        {"opt_count", s.opt_count},
                        {"loss_scale", s.loss_scale},
                        {"scaler_tracker", s.scaler_tracker},
                        {"scaler_skipped", s.scaler_skipped},
                        {"seed", s.seed},
                        {"val_position", s.val_position},
                        {"best_val_loss", s.best_val_loss},
                        {"format", 1}};
    write_text((tmp / kStateFile).string(), j.dump(2));
    if (tokenizer) write_text((tmp / "tokenizer.json").string(), tokenizer->dump());
    // Replace atomically: an existing directory of the same name (best/) is moved aside first.
    const fs::path old = sibling(final_dir, ".old");
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);  // never leave a half-written checkpoint behind
    throw;
  }
}

std::string latest_checkpoint(const std::string& run_dir) {
  std::string best;
  int64_t best_step = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt_", 0) != 0 || !e.is_directory()) continue;
    try {
      const int64_t step = std::stoll(n.substr(5));
      if (step > best_step) {
        best_step = step;
        best = e.path().string();
      }
    } catch (const std::exception&) {
    }
  }
  return best;
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  std::vector<std::pair<int64_t, fs::path>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt_", 0) != 0 || !e.is_directory()) continue;
    try {
      all.emplace_back(std::stoll(n.substr(5)), e.path());
    } catch (const std::exception&) {
    }
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 1)) < all.size(); ++i)
    fs::remove_all(all[i].second, ec);
}

Checkpoint load_checkpoint(const std::string& path) {
  std::string dir = path;
  if (!fs::exists(fs::path(path) / kStateFile)) {
    dir = latest_checkpoint(path);
    if (dir.empty())
      throw UserError(path,
                      fs::exists(path) ? "holds no checkpoint (no state.json, no ckpt_<step>/)" : "does not exist",
                      "give a run directory written by `loom train --out` or one of its ckpt_<step> directories");
  }
  Checkpoint c;
  c.path = dir;
  const std::string state_path = (fs::path(dir) / kStateFile).string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(state_path));
    c.state.config_toml = j.at("config").get<std::string>();
    c.state.step = j.at("step").get<int64_t>();
    c.state.opt_count = j.at("opt_count").get<int64_t>();
    c.state.loss_scale = j.at("loss_scale").get<double>();
    c.state.scaler_tracker = j.at("scaler_tracker").get<int64_t>();
    c.state.scaler_skipped = j.at("scaler_skipped").get<int64_t>();
    c.state.seed = j.at("seed").get<uint64_t>();
    c.state.val_position = j.at("val_position").get<int64_t>();
    c.state.best_val_loss = j.at("best_val_loss").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError(state_path, std::string("is not a valid checkpoint state (") + e.what() + ")",
                    "the checkpoint is corrupted: resume from an earlier one");
  }
  c.tensors = read_safetensors((fs::path(dir) / kModelFile).string());
  return c;
}

std::map<std::string, std::string> config_values(const std::string& toml_text) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml_text);
  std::string line, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') {
      section = line.substr(1, line.size() - 2) + ".";
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

std::string first_config_difference(const std::string& a_toml, const std::string& b_toml, const std::string& prefix) {
  const auto a = config_values(a_toml), b = config_values(b_toml);
  auto under = [&](const std::string& k) { return k.compare(0, prefix.size(), prefix) == 0; };
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (under(k) && (it == b.end() || it->second != v)) return k;
  }
  for (const auto& [k, v] : b)
    if (under(k) && !a.count(k)) return k;
  return "";
}

void restore_checkpoint(Trainer& t, const Checkpoint& c) {
  const std::string diff = first_config_difference(c.state.config_toml, config_to_toml(t.config()), "model.");
  if (!diff.empty())
    throw UserError(c.path, "was written for a different model: " + diff + " differs",
                    "resume with the checkpoint's model configuration (or start a new run with --out)");
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& s : c.tensors) by_name[s.name] = &s;
  const std::string file = (fs::path(c.path) / kModelFile).string();
  import_params(t.executor(), by_name, t.config().model.scan_layers, file);
  const Graph& g = t.model().graph;
  for (int which : {0, 1}) {
    if (!t.optimizer().keeps_moment(which)) continue;
    for (size_t i = 0; i < g.params().size(); ++i) {
      const Value& v = g.value(g.params()[i].value);
      const std::string name = kMomentPrefix[which] + v.name;
      auto it = by_name.find(name);
      if (it == by_name.end() || it->second->shape != v.shape || it->second->dtype != DType::f32)
        throw UserError(file, "optimizer tensor '" + name + "' is missing or has the wrong shape",
                        "the checkpoint was written with another optimizer or model");
      // This rank's part (all of it unless the optimizer state is sharded): resharded on load.
      t.set_moment(which, i, reinterpret_cast<const float*>(it->second->bytes.data()));
    }
  }
  t.restore_progress(c.state.step, c.state.opt_count, c.state.loss_scale, c.state.scaler_tracker,
                     c.state.scaler_skipped);
}

}  // namespace loom
