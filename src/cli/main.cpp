// The loom command: builds the CLI11 parser from the command table (cli/command.h), runs the
// subcommand given, and turns errors into messages and exit statuses: 2 for bad input (a
// UserError, printed with its fix, or an invalid argument), 1 for a failure while running.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "cli/version.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace loom;
  CLI::App app{
      "loom: train Transformer language models (and small MLPs) on one device, with every memory and speed "
      "technique measurable.\nConfigs are TOML; any key can be overridden as section.key=value."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  app.set_version_flag("--version", fmt::format("loom {} (git {})", cli::kVersion, cli::kGitCommit),
                       "print the version and the git commit it was built from");
  std::vector<std::pair<CLI::App*, cli::CommandBody>> bodies;
  for (const cli::Command& c : cli::commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    bodies.emplace_back(sub, c.add(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const auto& [sub, body] : bodies)
      if (sub->parsed()) return body();
  } catch (const UserError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "loom: error: {}\n", e.what());
    if (!e.hint().empty()) fmt::print(stderr, "  fix: {}\n", e.hint());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fflush(stdout);
    fmt::print(stderr, "loom: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "loom: failed: {}\n", e.what());
    return 1;
  }
  return 0;
}
