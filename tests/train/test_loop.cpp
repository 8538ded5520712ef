// The training loop's log (train/loop.h): each log line gives the interval's numbers, the ETA
// counts the work the hooks announce, and on a terminal the progress bar never swallows a line.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "data/data.h"
#include "train/config.h"
#include "train/console.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace loom {
namespace {

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  return out;
}

struct LoopRun {
  std::string out;
  LoopResult res;
};

// A hook from two lambdas: after every step, and the seconds of work still to come.
struct LambdaHook : StepHook {
  std::function<void(int64_t)> after;
  std::function<double(int64_t, double)> pending;
  void after_step(int64_t step) override {
    if (after) after(step);
  }
  double pending_seconds(int64_t step, double step_s) override { return pending ? pending(step, step_s) : 0; }
};

LoopRun run_loop(bool bar, int64_t steps, int64_t log_every, const std::function<void(int64_t, std::FILE*)>& hook,
                 LoopOptions extra = {}) {
  const Config c = default_config({"model.hidden_size=16", "data.batch_size=8", "data.num_inputs=4"});
  auto be = make_backend(Device::cpu);
  Trainer t(c, *be);
  const DataSource data(c.data, data_context(c));
  std::FILE* f = std::tmpfile();
  LoopOptions o = std::move(extra);
  o.steps = steps;
  o.log_every = log_every;
  o.progress_bar = bar;
  o.out = f;
  LambdaHook h;
  if (hook) h.after = [&](int64_t s) { hook(s, f); };
  o.hooks.push_back(&h);
  LoopRun r;
  r.res = run_training(t, data, o);
  r.out = read_all(f);
  std::fclose(f);
  return r;
}

// Whatever prints between steps (a validation line, a profile summary) clears the bar first: the
// bar's erase-to-end "\x1b[K" is always followed by a redraw or clear ('\r') or the end.
TEST(Loop, ProgressBarNeverSwallowsALine) {
  const LoopRun r = run_loop(/*bar=*/true, 6, 2, [](int64_t step, std::FILE* f) {
    if (step % 3 == 0) {
      clear_status_line();
      std::fprintf(f, "step %lld: val loss 1.0\n", static_cast<long long>(step));
    }
  });
  // "\r\x1b[K" clears; any other "\x1b[K" ends a drawn bar, and must be followed by a redraw or a
  // clear.
  int bars = 0;
  for (size_t at = r.out.find("\x1b[K"); at != std::string::npos; at = r.out.find("\x1b[K", at + 1)) {
    if (at > 0 && r.out[at - 1] == '\r') continue;
    ++bars;
    EXPECT_TRUE(at + 3 == r.out.size() || r.out[at + 3] == '\r')
        << "a line glued to the bar: " << r.out.substr(at - 40, 80);
  }
  EXPECT_EQ(bars, 6) << "one bar per step: " << r.out;
  EXPECT_NE(r.out.find("\r\x1b[Kstep 3: val loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\r\x1b[Kstep 6: val loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.back(), '\n') << "the loop leaves no bar behind";
}

// A log line every log_every steps, with the mean over its interval: the ms/step printed is the
// interval's total step time over its steps, so with log_every = all steps it equals the loop's.
TEST(Loop, LogLinesGiveTheIntervalsMeanAndCountPendingWork) {
  LoopOptions o;
  o.model_flops_per_step = 1e6;
  o.ceiling_flops_per_s = 1e9;
  int64_t asked = 0;
  LambdaHook pending;
  pending.pending = [&](int64_t step, double step_s) {
    EXPECT_GT(step_s, 0);
    ++asked;
    return step < 4 ? 3600.0 : 0.0;  // an hour of evaluations still to come until step 4
  };
  o.hooks.push_back(&pending);
  const LoopRun r = run_loop(/*bar=*/false, 4, 4, nullptr, std::move(o));
  EXPECT_EQ(asked, 4);
  ASSERT_EQ(r.res.steps_run, 4);
  const size_t ms = r.out.find(" ms/step");
  ASSERT_NE(ms, std::string::npos) << r.out;
  const double printed = std::stod(r.out.substr(r.out.rfind("  ", ms - 1) + 2));
  EXPECT_NEAR(printed, 1e3 * r.res.step_seconds / 4, 0.051) << r.out;
  EXPECT_NE(r.out.find("MFU "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line for 4 steps: " << r.out;

  LambdaHook hour;
  hour.pending = [](int64_t step, double) { return step < 4 ? 3600.0 : 0.0; };
  LoopOptions p;
  p.hooks.push_back(&hour);
  const LoopRun early = run_loop(/*bar=*/false, 4, 1, nullptr, std::move(p));
  EXPECT_NE(early.out.find("ETA 1h00m"), std::string::npos) << "the hour of pending work is in the ETA: " << early.out;
  EXPECT_EQ(early.out.find("MFU"), std::string::npos) << "no ceiling, no MFU: " << early.out;
}

}  // namespace
}  // namespace loom
