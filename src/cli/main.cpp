// The loom command: builds the CLI11 parser from the command table (cli/command.h), runs the
// subcommand given, and turns every outcome into an exit status (README, "Exit status"):
//   0   success (and --help, --version)
//   2   a mistake in what the user gave: a command-line error (CLI11's own included: an unknown
//       flag, a missing argument, a value that is not a number), no or an unknown subcommand, a
//       UserError (printed with its fix; a full disk, or a file past `ulimit -f`, is one) or an
//       invalid argument
//   1   a failure while running (other I/O, an internal error)
//   130 / 143  the run stopped on SIGINT / SIGTERM (run/run.cpp returns 128 + the signal)
// Under mpirun (src/dist/) an error only this rank knows of ends the whole job (dist::fail_job).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <csignal>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "cli/version.h"
#include "core/error.h"
#include "dist/comm.h"
#include "train/console.h"

namespace {

using namespace loom;

void print_error(const std::string& message, const std::string& fix) {
  std::fflush(stdout);
  clear_status_line();
  fmt::print(stderr, "loom: error: {}\n", message);
  if (!fix.empty()) fmt::print(stderr, "  fix: {}\n", fix);
}

// A CLI11 parse error: help and --version print and succeed; anything else is a usage mistake.
int parse_failure(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  std::string command;
  for (const CLI::App* sub : app.get_subcommands()) command = sub->get_name();
  if (command.empty()) {  // the error is about the command word itself, or the top-level flags
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg.empty() || arg[0] == '-') continue;
      print_error(cli::unknown_command_message(arg),
                  "the commands are " + cli::command_names() + "; `loom --help` says what each does");
      return 2;
    }
    print_error(e.what(), "`loom --help` lists the commands and options");
    return 2;
  }
  print_error(e.what(), "`loom " + command + " --help` lists its arguments");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // A file outgrowing `ulimit -f` would kill loom with SIGXFSZ before it could say which file or keep
  // the last checkpoint; ignored, the write fails with EFBIG and takes the same path as a full disk.
  signal(SIGXFSZ, SIG_IGN);
  // Under mpirun, MPI_Init starts Open MPI's own threads. They must never take SIGINT / SIGTERM / SIGHUP (loom
  // train leaves those to a watcher thread, run/stop.h; the other commands to the main thread's default action),
  // so they are made with all three blocked, which they inherit; the main thread's mask is restored after.
  sigset_t stop_signals, old_mask;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
  loom::dist::Launch launch(&argc, &argv);  // MPI, only when started by mpirun
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  CLI::App app{
      "loom: train Transformer language models (and small MLPs) on one device, with every memory and speed "
      "technique measurable.\nConfigs are TOML; any key can be overridden as section.key=value."};
  app.require_subcommand(0, 1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  app.set_version_flag("--version", fmt::format("loom {} (git {})", cli::kVersion, cli::kGitCommit),
                       "print the version and the git commit it was built from");
  bool help_config = false;
  app.add_flag("--help-config", help_config, "list every configuration key with its type, default and choices");
  std::vector<std::pair<CLI::App*, cli::CommandBody>> bodies;
  for (const cli::Command& c : cli::commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    bodies.emplace_back(sub, c.add(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_failure(app, e, argc, argv);
  }
  try {
    for (const auto& [sub, body] : bodies)
      if (sub->parsed()) return body();
    if (help_config) return cli::print_config_help();
    print_error("no command given", "`loom COMMAND ...` with COMMAND one of " + cli::command_names() +
                                        "; `loom --help` says what each does");
    return 2;
  } catch (const UserError& e) {
    if (dist::prints_error()) print_error(e.what(), e.hint());
    return dist::fail_job(2);
  } catch (const std::invalid_argument& e) {
    print_error(e.what(), "");
    return dist::fail_job(2);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    clear_status_line();
    fmt::print(stderr, "loom: failed: {}\n", e.what());
    return dist::fail_job(1);
  }
}
