#include "cli/command.h"

#include "run/run.h"

namespace loom::cli {

std::span<const Command> commands() {
  static constexpr Command kCommands[] = {
      {.name = "params",
       .help = "print the parameter table and count of a model (runs nothing)",
       .add = add_params_command},
      {.name = "train", .help = "train a model", .add = add_train_command},
      {.name = "prepare",
       .help = "tokenize a text file into train.bin, val.bin and meta.json (nanoGPT layout)",
       .add = add_prepare_command},
      {.name = "memory",
       .help = "plan a training run and print its device memory, without running anything",
       .add = add_memory_command},
      {.name = "profile",
       .help = "run a few training steps and write a trace, a summary and the memory viewer",
       .add = add_profile_command},
      {.name = "sample",
       .help = "generate text from a checkpoint, streaming it as it is produced (KV cache)",
       .add = add_sample_command},
      {.name = "export",
       .help = "write a run's model as a Hugging Face directory (config.json, model.safetensors, tokenizer.json)",
       .add = add_export_command},
  };
  return kCommands;
}

void ConfigArgs::add(CLI::App& sub, bool required, const std::string& overrides_help) {
  CLI::Option* config = sub.add_option(
      "config", first_,
      required ? std::string("config file (TOML)") : std::string("config file (TOML); default ") + kDefaultConfig);
  if (required) config->required();
  sub.add_option("overrides", rest_, overrides_help);
}

std::string ConfigArgs::path() const { return first_.find('=') == std::string::npos ? first_ : ""; }

std::vector<std::string> ConfigArgs::overrides() const {
  std::vector<std::string> o = rest_;
  if (first_.find('=') != std::string::npos) o.insert(o.begin(), first_);
  return o;
}

Config ConfigArgs::load(const std::vector<std::string>& more) const {
  std::vector<std::string> o = overrides();
  o.insert(o.end(), more.begin(), more.end());
  return load_config(path().empty() ? kDefaultConfig : path(), o);
}

}  // namespace loom::cli
