#include "train/config.h"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/data.h"
#include "nn/config_keys.h"
#include "nn/models.h"
#include "train/model_source.h"

namespace loom {

namespace {

using KeySpecC = KeySpec<Config>;

// A room's row over its slice `Slice Config::*slice`, as a row over the whole configuration.
template <class Slice>
KeySpecC lift(const KeySpec<Slice>& k, Slice Config::*slice) {
  KeySpecC out{.key = k.key,
               .type = k.type,
               .expected = k.expected,
               .help = k.help,
               .choices = k.choices,
               .set_value = [f = k.set_value, slice](Config& c, const KeyValue& v) { f(c.*slice, v); },
               .set_text = [f = k.set_text, slice](Config& c, const std::string& s) { f(c.*slice, s); },
               .get = [f = k.get, slice](const Config& c) { return f(c.*slice); },
               .applies = nullptr,
               .needs = k.needs,
               .path = nullptr,
               .copy = [f = k.copy, slice](Config& dst, const Config& src) { f(dst.*slice, src.*slice); },
               .architecture = k.architecture};
  if (k.applies) out.applies = [f = k.applies, slice](const Config& c) { return f(c.*slice); };
  if (k.path) out.path = [f = k.path, slice](Config& c) -> std::string& { return f(c.*slice); };
  return out;
}

// Whether key `k` means anything for `c` (config.toml lists only those).
bool key_applies(const KeySpecC& k, const Config& c) {
  if (k.needs == KeyNeeds::float16_compute && c.model.dtype != DType::f16) return false;
  return !k.applies || k.applies(c);
}

// A TOML value as the rows read it.
KeyValue toml_value(const toml::node& n) {
  if (n.is_integer()) return *n.value<int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  if (n.is_string()) return *n.value<std::string>();
  return std::monostate{};
}

#define LOOM_REF(member) LOOM_KEY_REF(Config, member)

// Every key: the run's own (seed, device, threads), each room's table, then train.*.
const std::vector<KeySpecC>& schema() {
  static const std::vector<KeySpecC> rows = [] {
    using namespace keys;
    std::vector<KeySpecC> all = {
        integer<Config>("seed", "seed of every random stream (init, data, dropout)", LOOM_REF(seed)),
        choice<Config>("device", "where to run", LOOM_REF(device)),
        integer<Config>("threads", "CPU threads (0 = all cores)", LOOM_REF(threads)),
    };
    for (const auto& k : model_keys()) all.push_back(lift(k, &Config::model));
    for (const auto& k : lora_keys()) all.push_back(lift(k, &Config::model));
    for (const auto& k : optimizer_keys()) all.push_back(lift(k, &Config::optimizer));
    for (const auto& k : data_keys()) all.push_back(lift(k, &Config::data));
    for (const auto& k : train_keys()) all.push_back(lift(k, &Config::train));
    return all;
  }();
  return rows;
}
#undef LOOM_REF

const Config& defaults() {
  static const Config d;
  return d;
}

const KeySpecC* find_key(const std::string& key) {
  for (const KeySpecC& k : schema())
    if (key == k.key) return &k;
  return nullptr;
}

// The fix for an unknown key: the key it most likely meant (the same name in its section, as
// `hidden_size` for `model.hidden_size`, or a spelling within two edits), then the known keys
// of its section.
std::string unknown_key_fix(const std::string& key) {
  const std::string name = key.substr(key.find('.') == std::string::npos ? 0 : key.rfind('.') + 1);
  std::vector<std::string_view> all;
  std::string meant;
  for (const KeySpecC& k : schema()) {
    const std::string_view full = k.key;
    all.push_back(full);
    if (meant.empty() && full.substr(full.find('.') == std::string_view::npos ? 0 : full.rfind('.') + 1) == name)
      meant = k.key;
  }
  if (meant.empty()) meant = closest_name(key, all);
  const std::string section = key.find('.') == std::string::npos ? "" : key.substr(0, key.find('.') + 1);
  std::string near;
  for (const KeySpecC& k : schema()) {
    const std::string n = k.key;
    const bool same_section = section.empty() ? n.find('.') == std::string::npos : n.rfind(section, 0) == 0;
    if (same_section) near += (near.empty() ? "" : ", ") + n;
  }
  std::string fix = meant.empty() ? "" : "did you mean " + meant + "? ";
  if (!near.empty())
    fix += "known keys " +
           (section.empty() ? std::string("at the top level") : "in [" + section.substr(0, section.size() - 1) + "]") +
           ": " + near + "; ";
  return fix + "`loom help config` lists every key";
}

// The parser's reason after "expected an integer" / "'abc' is not an integer", only when it says
// more than that: a reason starting with "not " restates the expectation.
std::string more_reason(const std::string& reason) {
  return reason.rfind("not ", 0) == 0 ? std::string() : " (" + reason + ")";
}

// Sets every key of `t` in `c` and adds it to `given`. `base`: the directory relative paths in
// this table are relative to ("" = leave them relative).
void walk(Config& c, const toml::table& t, const std::string& prefix, const std::string& file,
          const std::filesystem::path& base, std::set<std::string>& given) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      walk(c, *sub, key, file, base, given);
      continue;
    }
    given.insert(key);
    const KeySpecC* spec = find_key(key);
    if (!spec) throw UserError(file + ": " + key, "unknown configuration key", unknown_key_fix(key));
    try {
      spec->set_value(c, toml_value(node));
      if (spec->path) spec->path(c) = resolve_path(spec->path(c), base);
    } catch (const std::invalid_argument& e) {
      throw UserError(file + ": " + key, "expected " + spec->expected + more_reason(e.what()),
                      "write e.g. " + key + " = " + spec->get(defaults()));
    } catch (const UserError& e) {  // an unknown choice: the message names the valid ones
      throw UserError(file + ": " + key, e.what(), e.hint());
    }
  }
}

// Applies the overrides and records their keys in `given`.
void apply_overrides(Config& c, const std::vector<std::string>& overrides, std::set<std::string>& given) {
  for (const std::string& o : overrides) {
    apply_override(c, o);
    given.insert(o.substr(0, o.find('=')));
  }
}

// model.init_from: the source's architecture keys replace c's, except those the file or the
// overrides gave (`given`), which must agree with the source's when the key is fixed.
void apply_init_from(Config& c, const std::set<std::string>& given) {
  if (c.model.init_from.empty()) return;
  std::error_code ec;
  if (!std::filesystem::is_directory(c.model.init_from, ec))
    throw UserError("model.init_from = " + c.model.init_from, "no such directory",
                    "give a Hugging Face model directory (config.json, model.safetensors) or a loom run or checkpoint "
                    "(in a config file a relative model.init_from is relative to that file; on the command line and "
                    "in --init-from, to the current directory)");
  const ModelSource src(c.model.init_from);
  const std::string& f = c.source.empty() ? std::string("config") : c.source;
  // A LoRA run's checkpoints hold its adapters only (its base is its own model.init_from, or its
  // seed): a program without those very adapters would find its tensors missing or misshapen.
  if (src.config().model.lora.enabled()) {
    const std::string merge = "`loom export hf " + c.model.init_from +
                              " DIR --merge` writes its model with the adapters merged: give model.init_from = DIR";
    if (!c.model.lora.enabled())
      throw UserError("model.init_from = " + c.model.init_from,
                      "is a LoRA run (lora.rank = " + std::to_string(src.config().model.lora.rank) +
                          "), whose checkpoints hold its adapters only, not a whole model",
                      merge + "; or set lora.* as that run does to continue its adapters");
    for (const char* key : {"lora.rank", "lora.targets"}) {
      const std::string mine = find_key(key)->get(c), theirs = find_key(key)->get(src.config());
      if (mine != theirs)
        throw UserError(
            f + ": " + std::string(key),
            "is " + mine + ", but model.init_from is a LoRA run whose adapters have " + key + " = " + theirs,
            "set " + std::string(key) + " = " + theirs + " to continue its adapters; or " + merge +
                " and train new adapters on it");
    }
  }
  for (const ArchKey& k : src.keys()) {
    const KeySpecC* spec = find_key(k.key);
    LOOM_ASSERT(spec != nullptr, "model source key '" + k.key + "' is not in the schema");
    if (!given.count(k.key)) {
      spec->copy(c, src.config());
      continue;
    }
    const std::string mine = spec->get(c), theirs = spec->get(src.config());
    if (k.fixed && mine != theirs)
      throw UserError(
          f + ": " + k.key,
          "is " + mine + ", but the model of model.init_from has " + k.origin + ", i.e. " + k.key + " = " + theirs,
          "remove " + k.key + " (model.init_from sets it) or start from another model");
  }
  // mlp_expansion sizes the MLP only while intermediate_size is 0; a source that gives the width
  // itself (a Llama's intermediate_size) would leave a different mlp_expansion silently unused.
  if (given.count("model.mlp_expansion") && !given.count("model.intermediate_size") &&
      c.model.transformer.intermediate_size > 0 &&
      c.model.transformer.mlp_expansion != src.config().model.transformer.mlp_expansion)
    throw UserError(f + ": model.mlp_expansion",
                    "is " + std::to_string(c.model.transformer.mlp_expansion) +
                        ", which would go unused: the model of model.init_from sets the MLP's width itself, "
                        "model.intermediate_size = " +
                        std::to_string(c.model.transformer.intermediate_size),
                    "remove model.mlp_expansion (model.init_from sets the width) or start from another model");
}

}  // namespace

std::string resolve_path(const std::string& path, const std::filesystem::path& base) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  fs::path p = path;
  if (path == "~" || path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    if (!home || !*home) throw UserError(path, "starts with ~ but HOME is not set", "write the path in full");
    p = fs::path(home) / (path.size() > 2 ? path.substr(2) : std::string());
  }
  if (p.is_relative() && !base.empty()) p = base / p;
  return p.lexically_normal().string();
}

void apply_override(Config& c, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("override '" + assignment + "'", "expected section.key=value",
                    "for example optimizer.num_minibatches=4");
  const std::string key = assignment.substr(0, eq);
  const std::string val = assignment.substr(eq + 1);
  const KeySpecC* spec = find_key(key);
  if (!spec) throw UserError("override " + key, "unknown configuration key", unknown_key_fix(key));
  try {
    spec->set_text(c, val);
    if (spec->path) spec->path(c) = resolve_path(spec->path(c), std::filesystem::current_path());
  } catch (const std::invalid_argument& e) {
    std::string example = spec->get(defaults());  // unquoted, as a shell word
    if (example.size() >= 2 && example.front() == '"') example = example.substr(1, example.size() - 2);
    throw UserError("override " + key, "'" + val + "' is not " + spec->expected + more_reason(e.what()),
                    "write e.g. " + key + "=" + example);
  } catch (const UserError& e) {
    throw UserError("override " + key, e.what(), e.hint());
  }
}

namespace {

// The checks that read more than one room's slice, which no room can make alone.
void check_across_rooms(const Config& c) {
  // What ZeRO-3 (optimizer.shard = params) does not shard yet (train/trainer.h): a frozen base
  // (lora.*) keeps whole parameters.
  const bool zero3 = c.optimizer.shard == OptimizerShard::params;
  check_key(!zero3 || !c.model.lora.enabled(), "optimizer.shard", "params (ZeRO-3) does not support LoRA yet",
            "use optimizer.shard = state+grads with lora.rank > 0");
  // The data must be what the model family reads (model.kind against data.*).
  const nn::ModelKindInfo& kind = nn::model_kind(c.model.kind);
  const std::string a_kind = "the " + std::string(kind.name);
  if (kind.language_model) {
    check_key(c.data.seq_len >= 1 && c.data.seq_len <= c.model.transformer.max_seq_len, "data.seq_len",
              "seq_len " + std::to_string(c.data.seq_len) +
                  " is outside [1, model.max_seq_len = " + std::to_string(c.model.transformer.max_seq_len) + "]",
              "raise model.max_seq_len or shorten data.seq_len");
    check_key(is_token_data(c.data.kind), "data.kind", a_kind + " needs token data", "use random_tokens or tokens");
    check_key(c.data.kind != DataKind::random_tokens ||
                  (c.data.vocab_size >= 2 && c.data.vocab_size <= c.model.transformer.vocab_size),
              "data.vocab_size", "must be in [2, model.vocab_size]", "tokens must be valid embedding rows");
  } else {
    check_key(c.data.kind == DataKind::random_classification, "data.kind", a_kind + " needs random_classification data",
              "use random_classification");
  }
  // Gradient accumulation splits the batch (optimizer.num_minibatches against data.batch_size).
  check_key(c.data.batch_size % c.optimizer.num_minibatches == 0, "data.batch_size",
            "batch size " + std::to_string(c.data.batch_size) +
                " is not divisible by optimizer.num_minibatches = " + std::to_string(c.optimizer.num_minibatches),
            "choose num_minibatches among the divisors of the batch size");
}

}  // namespace

void validate_config(const Config& c) {
  try {
    check_key(c.seed <= static_cast<uint64_t>(INT64_MAX), "seed", "must be in [0, 2^63 - 1]",
              "a non-negative integer, e.g. 1337");
    check_key(c.threads >= 0, "threads", "must be >= 0", "0 uses all cores");
    validate_model(c.model);
    validate_optimizer(c.optimizer);
    validate_data(c.data);
    validate_train(c.train);
    check_across_rooms(c);        // after the rooms' own: it divides by num_minibatches, reads max_seq_len
  } catch (const UserError& e) {  // the checks name the key; the file is added here
    const std::string& f = c.source.empty() ? std::string("config") : c.source;
    throw UserError(f + ": " + e.subject(), std::string(e.what()).substr(e.subject().size() + 2), e.hint());
  }
}

Config default_config(const std::vector<std::string>& overrides) {
  Config c;
  std::set<std::string> given;
  apply_overrides(c, overrides, given);
  apply_init_from(c, given);
  validate_config(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  c.source = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path, "is a directory, not a config file", "give a .toml file, e.g. configs/shakespeare_char.toml");
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    const std::string desc(e.description());
    if (desc.find("File could not be opened") != std::string::npos ||
        desc.find("could not be opened") != std::string::npos)
      throw UserError(path, "cannot open the config file", "check the path; example configs are in configs/");
    throw UserError(path + ":" + std::to_string(where.line) + ":" + std::to_string(where.column),
                    "invalid TOML: " + desc, "fix the syntax at that line");
  }
  if (t.empty())
    throw UserError(
        path, "sets no key (the file is empty, or only comments)",
        "give a config file such as configs/shakespeare_char.toml; `loom train --help-config` lists every key");
  std::set<std::string> given;
  walk(c, t, "", path, std::filesystem::absolute(path).parent_path(), given);
  apply_overrides(c, overrides, given);
  apply_init_from(c, given);
  validate_config(c);
  return c;
}

Config config_from_toml_text(const std::string& text, const std::string& source,
                             const std::vector<std::string>& overrides) {
  Config c;
  c.source = source;
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw UserError(source + ":" + std::to_string(where.line) + ":" + std::to_string(where.column),
                    "invalid TOML: " + std::string(e.description()), "the stored configuration is corrupted");
  }
  std::set<std::string> given;  // a stored configuration's init_from is resolved already
  walk(c, t, "", source, {}, given);
  apply_overrides(c, overrides, given);
  validate_config(c);
  return c;
}

std::string config_to_toml(const Config& c) {
  std::string out, section;
  for (const KeySpecC& k : schema()) {
    if (!key_applies(k, c)) continue;
    const std::string key = k.key;
    const size_t dot = key.find('.');
    const std::string sec = dot == std::string::npos ? "" : key.substr(0, dot);
    if (sec != section) {
      out += "\n[" + sec + "]\n";
      section = sec;
    }
    out += (dot == std::string::npos ? key : key.substr(dot + 1)) + " = " + k.get(c) + "\n";
  }
  return out;
}

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> out;
  for (const KeySpecC& k : schema()) {
    std::vector<std::string> names;
    for (const ChoiceInfo& ch : k.choices) names.emplace_back(ch.name);
    out.push_back({.key = k.key, .type = k.type, .choices = std::move(names)});
  }
  return out;
}

std::string config_help() {
  std::string out;
  const Config& d = defaults();
  for (const KeySpecC& k : schema()) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-28s %-10s default %-22s %s\n", k.key, k.type, k.get(d).c_str(), k.help);
    out += line;
    for (const ChoiceInfo& ch : k.choices) {  // under the default: each name and what it means
      std::snprintf(line, sizeof line, "%50s%-22.*s %.*s\n", "", static_cast<int>(ch.name.size()), ch.name.data(),
                    static_cast<int>(ch.help.size()), ch.help.data());
      out += line;
    }
  }
  return out;
}

ModelInput model_input(const Config& c, int64_t minibatch) {
  return {.batch = minibatch,
          .num_inputs = c.data.num_inputs,
          .seq_len = c.data.seq_len,
          .packed = rows_of_examples(c.data)};
}

DataContext data_context(const Config& c) {
  return {.seed = c.seed,
          .num_classes = c.model.mlp_classifier.num_classes,
          .model_vocab_size = c.model.transformer.vocab_size,
          .model_num_outputs = c.model.transformer.num_outputs,
          .model_init_from = c.model.init_from,
          .num_minibatches = c.optimizer.num_minibatches};
}

}  // namespace loom
