// `loom profile [CONFIG] [overrides] [--steps N] [--warmup N] [--out DIR] ...` (report/profile.h).
#include <memory>

#include "cli/command.h"
#include "report/profile.h"

namespace loom::cli {

namespace {
struct ProfileArgs {
  ConfigArgs config;
  ProfileCommand profile;
};
}  // namespace

CommandBody add_profile_command(CLI::App& sub) {
  auto a = std::make_shared<ProfileArgs>();
  a->config.add(sub, /*required=*/false, "section.key=value overrides, e.g. model.dtype=bfloat16");
  sub.add_option("--steps", a->profile.steps, "profiled steps (default 3)")->check(integer_at_least(1));
  sub.add_option("--warmup", a->profile.warmup, "steps run first and not recorded (default 1)")
      ->check(integer_at_least(0));
  sub.add_option("--out", a->profile.out_dir, "output directory (default profile)")->transform(home_path());
  sub.add_flag("--no-ceiling", a->profile.no_ceiling, "skip measuring the matmul ceiling (about a second)");
  sub.add_option("--overhead", a->profile.overhead_pairs,
                 "instead of profiling, time N steps with recording off and N with it on, alternating")
      ->check(integer_at_least(1));
  return [a] { return profile_command(a->config.load(), a->profile); };
}

}  // namespace loom::cli
