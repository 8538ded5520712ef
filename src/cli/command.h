// The `loom` subcommands as one table (commands.cpp), one file each (train.cpp, prepare.cpp, ...).
// A row names the subcommand, says what it does, and adds its arguments to the CLI11 subcommand;
// what `add` returns is the command's body, which main runs after parsing when that subcommand
// was given. The body returns the exit status; errors propagate as exceptions (main turns a
// UserError into "loom: error: ..." and status 2).
//
// Adding a command: cli/<name>.cpp with its `add_<name>_command`, declared here, and a row in
// commands.cpp (docs/ARCHITECTURE.md, "Adding a command").
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "train/config.h"

namespace loom::cli {

using CommandBody = std::function<int()>;

struct Command {
  const char* name;
  const char* help;
  CommandBody (*add)(CLI::App& sub);
};

// In the order `loom --help` lists them.
std::span<const Command> commands();

CommandBody add_params_command(CLI::App& sub);
CommandBody add_train_command(CLI::App& sub);
CommandBody add_prepare_command(CLI::App& sub);
CommandBody add_memory_command(CLI::App& sub);
CommandBody add_profile_command(CLI::App& sub);
CommandBody add_sample_command(CLI::App& sub);
CommandBody add_eval_command(CLI::App& sub);
CommandBody add_plot_command(CLI::App& sub);
CommandBody add_export_command(CLI::App& sub);
CommandBody add_help_command(CLI::App& sub);

// "params, train, ... or help": the commands' names, for messages.
std::string command_names();
// "unknown command 'trian' (did you mean train?)".
std::string unknown_command_message(const std::string& word);
// Prints every configuration key with its type, default and choices (`loom help config`,
// `loom --help-config`, `loom train --help-config`); returns 0.
int print_config_help();
// A CLI11 check for an integer flag: a whole number in [min, 2^63 - 1], else a message naming
// the range (CLI11 reports it as a parse error: status 2).
CLI::Validator integer_at_least(int64_t min);
// A CLI11 transform for a path argument: a leading ~ or ~/ is the home directory, as inside a
// config file (README, "Paths"); the shell leaves it alone in --out=~/runs/x or a quoted word,
// and loom would otherwise make a directory named ~ in the current one.
CLI::Validator home_path();

// The `config` and `overrides` positionals of the commands that read a configuration.
struct ConfigArgs {
  // Adds both positionals; `overrides_help` is the help of the second.
  void add(CLI::App& sub, bool required, const std::string& overrides_help);
  // A first positional that looks like an override (has '=') is an override, not a config path.
  std::string path() const;
  std::vector<std::string> overrides() const;
  // The configuration: the file (configs/shakespeare_char.toml when none) with the overrides,
  // then `more` (e.g. a swept value).
  Config load(const std::vector<std::string>& more = {}) const;

 private:
  std::string first_;
  std::vector<std::string> rest_;
};

}  // namespace loom::cli
