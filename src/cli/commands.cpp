#include "cli/command.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>

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
      {.name = "eval",
       .help = "the validation (and training) loss and accuracy of a checkpoint, without training",
       .add = add_eval_command},
      {.name = "plot",
       .help = "draw a run's training curves (loss, val loss, lr, tokens/s) into a PNG with gnuplot",
       .add = add_plot_command},
      {.name = "export",
       .help = "write a run's model as a Hugging Face directory (config.json, model.safetensors, tokenizer.json)",
       .add = add_export_command},
      {.name = "help",
       .help = "help on a command, or on the configuration keys (`loom help config`)",
       .add = add_help_command},
  };
  return kCommands;
}

std::string command_names() {
  std::string out;
  const auto all = commands();
  for (size_t i = 0; i < all.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == all.size() ? " and " : ", ") + all[i].name;
  return out;
}

std::string unknown_command_message(const std::string& word) {
  std::vector<std::string_view> names;
  for (const Command& c : commands()) names.push_back(c.name);
  const std::string_view meant = closest_name(word, names);
  return "unknown command '" + word + "'" + (meant.empty() ? "" : " (did you mean " + std::string(meant) + "?)");
}

int print_config_help() {
  fmt::print(
      "configuration keys (in a TOML file as [section] key = value, on the command line as section.key=value):\n{}",
      config_help());
  return 0;
}

CLI::Validator integer_at_least(int64_t min) {
  const std::string range = fmt::format("an integer in [{}, {}]", min, std::numeric_limits<int64_t>::max());
  return CLI::Validator(
      [min, range](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc::result_out_of_range) return "'" + text + "' is too large: must be " + range;
        if (ec != std::errc() || end != text.data() + text.size()) return "'" + text + "' is not " + range;
        if (v < min) return "must be " + range + ", got " + text;
        return {};
      },
      fmt::format("INT>={}", min));
}

CLI::Validator home_path() {
  return CLI::Validator(
      [](std::string& text) {
        if (text == "~" || text.starts_with("~/")) text = resolve_path(text, {});
        return std::string();
      },
      "");
}

CommandBody add_help_command(CLI::App& sub) {
  auto topic = std::make_shared<std::string>();
  sub.add_option("topic", *topic, "a command, or config (every configuration key)");
  CLI::App* app = sub.get_parent();
  return [topic, app] {
    if (topic->empty()) {
      fmt::print("{}", app->help());
      return 0;
    }
    if (*topic == "config") return print_config_help();
    for (const Command& c : commands())
      if (*topic == c.name) {
        fmt::print("{}", app->get_subcommand(c.name)->help());
        return 0;
      }
    throw UserError("loom help " + *topic, "unknown topic",
                    "the topics are config and the commands " + command_names());
  };
}

void ConfigArgs::add(CLI::App& sub, bool required, const std::string& overrides_help) {
  CLI::Option* config = sub.add_option(
      "config", first_,
      required ? std::string("config file (TOML)") : std::string("config file (TOML); default ") + kDefaultConfig);
  config->transform(home_path());
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
