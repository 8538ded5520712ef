#include "report/profile.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "backend/registry.h"
#include "core/error.h"
#include "dist/comm.h"
#include "nn/models.h"
#include "report/ceiling.h"
#include "report/memory_html.h"
#include "train/console.h"

namespace loom {

namespace {

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open '" + p.string() + "' for writing");
  f << text;
  if (!f.flush()) throw std::runtime_error("could not write '" + p.string() + "'");
}

std::string run_title(const Config& c) {
  std::string t = fmt::format("{} {}", choice_name(c.model.kind), dtype_name(c.model.dtype));
  if (nn::model_kind(c.model.kind).language_model)
    t += fmt::format(", hidden {}, {} layers, head_dim {}, vocab {}, seq {}", c.model.hidden_size,
                     c.model.transformer.num_layers, c.model.transformer.head_dim, c.model.transformer.vocab_size,
                     c.data.seq_len);
  else
    t += fmt::format(", hidden {}", c.model.hidden_size);
  t += fmt::format(", batch {} in {} minibatch{}, remat {}", c.data.batch_size, c.optimizer.num_minibatches,
                   c.optimizer.num_minibatches == 1 ? "" : "es", choice_set_name(c.model.remat));
  if (!c.source.empty()) t += fmt::format(" ({})", c.source);
  return t;
}

// /proc/stat's aggregate line: busy and total jiffies over every CPU; /proc/self/stat: this
// process's user + system jiffies. False when /proc is not there.
bool read_cpu_times(double& busy, double& total, double& own) {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double v[8] = {};
  if (!(stat >> cpu) || cpu != "cpu") return false;
  for (double& x : v) stat >> x;
  if (!stat) return false;
  total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  busy = total - v[3] - v[4];  // less idle and iowait
  std::ifstream self("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(self)), {});
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  own = 0;
  int field_no = 3;  // the text after ") " starts at field 3; utime and stime are fields 14 and 15
  for (; field_no <= 15 && rest >> field; ++field_no)
    if (field_no >= 14) own += std::stod(field);
  return field_no == 16;
}

}  // namespace

void LoadSampler::start() { ok_ = read_cpu_times(busy_, total_, own_); }

MachineLoad LoadSampler::stop() const {
  MachineLoad l;
  double busy = 0, total = 0, own = 0;
  l.cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  l.threads = num_threads();
  if (!ok_ || !read_cpu_times(busy, total, own) || l.cpus < 1 || !(std::ifstream("/proc/loadavg") >> l.loadavg))
    return l;
  l.measured = true;
  const double window = (total - total_) / l.cpus;  // clock ticks (of 10 ms) of wall time
  if (window >= 5) {
    l.other_cpus = std::max(0.0, (busy - busy_) - (own - own_)) / window;
  } else {
    l.from_loadavg = true;
    l.other_cpus = std::max(0.0, l.loadavg - l.threads);
  }
  return l;
}

std::string format_machine_load(const MachineLoad& l) {
  if (!l.measured) return "machine load during the profile: unknown (/proc not readable)\n";
  std::string o = fmt::format(
      "machine load during the profile: {:.1f} of {} CPUs busy with other processes{} (loom ran {} threads; load "
      "average {:.2f})\n",
      l.other_cpus, l.cpus, l.from_loadavg ? " by the load average (too short to sample)" : "", l.threads, l.loadavg);
  if (l.contended())
    o += "WARNING: other processes competed for loom's cores: the step times, GFLOP/s and fractions of the ceiling "
         "above measure that contention and are not trustworthy; profile again on an idle machine (or with fewer "
         "threads). Two loom runs sharing cores should split them (`threads=`) or both run with "
         "OMP_WAIT_POLICY=PASSIVE: OpenMP's idle threads otherwise spin on the other run's cores\n";
  return o;
}

int64_t optimizer_state_bytes(const Trainer& t) {
  int64_t b = 0;
  for (const OptimTensor& x : t.optimizer().tensors()) b += (x.mu ? x.n * 4 : 0) + (x.nu ? x.n * 4 : 0);
  return b;
}

std::unique_ptr<OpRecorder> make_step_recorder(const Trainer& t, int64_t steps) {
  const auto nmb = static_cast<size_t>(t.config().optimizer.num_minibatches);
  const auto n = static_cast<size_t>(steps);
  return std::make_unique<OpRecorder>(t.executor().backend(), t.plan().schedule.size() * nmb * n,
                                      n * (nmb + 2 + t.bucket_sums_per_step()));
}

ProfileOutput write_profile(const Trainer& t, const OpRecorder& rec, const std::string& top_dir, bool measure_ceiling,
                            FILE* log, const MachineLoad& load, double origin_us) {
  namespace fs = std::filesystem;
  dist::Comm& comm = t.comm();
  const std::string out_dir =
      comm.size() == 1 ? top_dir : (fs::path(top_dir) / fmt::format("rank{}", comm.rank())).string();
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw std::runtime_error("cannot create the profile directory '" + out_dir + "': " + ec.message());
  Backend& be = t.executor().backend();
  const MemoryPlan& plan = t.plan();
  const Graph& g = t.model().graph;
  const int64_t opt_bytes = optimizer_state_bytes(t);
  const std::string title = run_title(t.config());
  const DType compute = t.config().model.dtype;  // the ceiling is measured for the dtype the GEMMs run

  double ceiling = 0;
  if (measure_ceiling) {
    if (log) {
      fmt::print(log, "measuring the {} matmul ceiling of {}...\n", dtype_name(compute), be.name());
      std::fflush(log);
    }
    ceiling = measure_matmul_ceiling(be, compute, log);
  }
  ProfileOutput out;
  out.load = load;
  out.summary = summarize_profile(g, plan, rec, ceiling);
  out.summary.ceiling_dtype = dtype_name(compute);
  out.summary.ceiling_kernel = be.matmul_kernel(compute);
  const fs::path dir(out_dir);
  out.trace_path = (dir / "trace.json").string();
  out.summary_path = (dir / "summary.json").string();
  out.html_path = (dir / "memory.html").string();

  TraceInfo info;
  info.process_name = comm.size() == 1 ? fmt::format("loom ({})", be.name())
                                       : fmt::format("loom rank {} of {} ({})", comm.rank(), comm.size(), be.name());
  info.pid = comm.rank() + 1;
  info.origin_us = origin_us;
  info.title = title;
  info.persistent_bytes =
      plan.param_bytes + t.param_shard_bytes() + plan.grad_bytes + t.grad_shard_bytes() + plan.input_bytes + opt_bytes;
  const std::string trace = chrome_trace(g, plan, rec, info);
  write_file(out.trace_path, trace);
  if (comm.size() > 1) {
    // Every rank's events in one file (process r + 1 is rank r), for one Perfetto timeline.
    nlohmann::json merged;
    for (int r = 0; r < comm.size(); ++r) {
      const std::string text = dist::broadcast_string(comm, trace, r);
      if (comm.rank() != 0) continue;
      nlohmann::json j = nlohmann::json::parse(text);
      if (r == 0)
        merged = std::move(j);
      else
        for (auto& e : j["traceEvents"]) merged["traceEvents"].push_back(std::move(e));
    }
    if (comm.rank() == 0) write_file(fs::path(top_dir) / "trace.json", merged.dump() + "\n");
  }

  nlohmann::json j = profile_summary_json(out.summary);
  j["config"] = title;
  j["backend"] = be.name();
  j["matmul_ceiling_dtype"] = dtype_name(compute);
  j["matmul_ceiling_method"] = be.matmul_ceiling_method();
  j["matmul_ceiling_kernel"] = out.summary.ceiling_kernel;
  j["machine_load"] = {
      {"measured", load.measured},        {"other_cpus", load.other_cpus}, {"cpus", load.cpus},
      {"threads", load.threads},          {"loadavg_1min", load.loadavg},  {"contended", load.contended()},
      {"from_loadavg", load.from_loadavg}};
  j["memory"] = {{"arena_bytes", plan.arena_bytes},
                 {"live_bytes_peak", plan.lower_bound_bytes},
                 {"param_bytes", plan.param_bytes + t.param_shard_bytes()},
                 {"grad_bytes", plan.grad_bytes + t.grad_shard_bytes()},
                 {"optimizer_bytes", opt_bytes},
                 {"input_bytes", plan.input_bytes},
                 {"library_bytes", plan.library_bytes},
                 {"communication_bytes", t.comm_buffer_bytes()},
                 {"peak_allocated_bytes", be.peak_allocated_bytes()}};
  write_file(out.summary_path, j.dump(2) + "\n");
  write_file(out.html_path, memory_html(t.program(), plan, title, opt_bytes));

  if (log) {
    clear_status_line();
    fmt::print(log, "\n{}\n{}{}", title, format_profile_summary(out.summary), format_machine_load(load));
    fmt::print(log, "\nwrote {} (open in ui.perfetto.dev or chrome://tracing)\n      {}\n      {}\n", out.trace_path,
               out.summary_path, out.html_path);
    if (comm.size() > 1)
      fmt::print(log, "and the same for each rank in {}/rank<r>/; {} holds every rank's trace\n", top_dir,
                 (fs::path(top_dir) / "trace.json").string());
    std::fflush(log);
  }
  return out;
}

ProfileOutput run_profile(const Config& c, Backend& be, const DataSource& data, const ProfileOptions& o) {
  if (o.steps < 1) throw UserError("--steps", "must be at least 1", "profile e.g. --steps 3");
  if (o.warmup < 0) throw UserError("--warmup", "must be >= 0", "e.g. --warmup 1");
  if (o.out_dir.empty()) throw UserError("--out", "needs a directory", "e.g. --out profile/");
  Trainer t(c, be, {}, &dist::world());
  FILE* const log = t.comm().rank() == 0 ? o.log : nullptr;  // one log for the job
  if (log) {
    const MemoryPlan& p = t.plan();
    fmt::print(log, "loom profile: {}\nprogram: {} nodes, arena {:.2f} MiB; {} warm-up step{}, then {} profiled\n",
               run_title(t.config()), p.schedule.size(), p.arena_bytes / 1048576.0, o.warmup, o.warmup == 1 ? "" : "s",
               o.steps);
    std::fflush(log);
  }
  for (int64_t i = 0; i < o.warmup; ++i) {
    const StepReport r = t.step(data.train_batch(t.steps_done()));
    if (log) fmt::print(log, "warm-up step {}: {:.2f} ms\n", i + 1, r.seconds * 1e3);
  }
  std::unique_ptr<OpRecorder> rec = make_step_recorder(t, o.steps);
  LoadSampler sampler;
  t.comm().barrier();  // the ranks' traces start together
  const double origin = rec->now_us();
  sampler.start();
  t.set_recorder(rec.get());
  for (int64_t i = 0; i < o.steps; ++i) {
    const Batch batch = data.train_batch(t.steps_done());
    const StepReport r = t.step(batch);
    if (log) {
      fmt::print(log, "profiled step {}/{}: {:.2f} ms  loss {:.6f}\n", i + 1, o.steps, r.seconds * 1e3,
                 r.metrics.loss.mean());
      std::fflush(log);
    }
  }
  t.set_recorder(nullptr);
  const MachineLoad load = sampler.stop();
  return write_profile(t, *rec, o.out_dir, o.measure_ceiling, log, load, origin);
}

StepWindow parse_step_window(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return UserError("--profile-steps " + text, why,
                     "write FIRST:LAST, 1-based and inclusive, e.g. 3:5 (or one step, e.g. 4)");
  };
  auto number = [&](const std::string& s) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
      throw bad("'" + s + "' is not a step number");
    const int64_t v = std::stoll(s);
    if (v < 1) throw bad("steps are numbered from 1");
    return v;
  };
  const size_t colon = text.find(':');
  StepWindow w;
  w.first = number(text.substr(0, colon));
  w.last = colon == std::string::npos ? w.first : number(text.substr(colon + 1));
  if (w.last < w.first) throw bad("the last step comes before the first");
  return w;
}

TrainProfiler::TrainProfiler(Trainer& t, std::string out_dir, StepWindow w, FILE* log)
    : t_(t), dir_(std::move(out_dir)), w_(w), log_(log), rec_(make_step_recorder(t, w.last - w.first + 1)) {}

TrainProfiler::~TrainProfiler() {
  if (t_.executor().recorder() == rec_.get()) t_.set_recorder(nullptr);
}

void TrainProfiler::before_step(int64_t step) {
  if (step == w_.first && !written_) {
    rec_->clear();
    t_.comm().barrier();  // the ranks' traces start together
    origin_us_ = rec_->now_us();
    load_.start();
    t_.set_recorder(rec_.get());
  }
}

void TrainProfiler::after_step(int64_t step) {
  if (step == w_.last) finish();
}

void TrainProfiler::finish() {
  if (written_) return;
  const bool recording = t_.executor().recorder() == rec_.get();
  if (!recording) {
    if (log_) fmt::print(log_, "profile: the run ended before step {}: nothing profiled\n", w_.first);
    written_ = true;
    return;
  }
  t_.set_recorder(nullptr);
  const MachineLoad load = load_.stop();
  if (log_) {
    clear_status_line();
    fmt::print(log_, "\nprofile of steps {}..{}:\n", w_.first, w_.last);
  }
  write_profile(t_, *rec_, dir_, /*measure_ceiling=*/true, log_, load, origin_us_);
  written_ = true;
}

std::unique_ptr<TrainProfiler> make_train_profiler(Trainer& t, const std::string& dir, const std::string& window,
                                                   FILE* log) {
  if (dir.empty()) {
    if (!window.empty()) throw UserError("--profile-steps " + window, "needs --profile DIR", "add --profile prof/");
    return nullptr;
  }
  return std::make_unique<TrainProfiler>(t, dir, window.empty() ? StepWindow{} : parse_step_window(window), log);
}

OverheadResult measure_overhead(const Config& c, Backend& be, const DataSource& data, int64_t pairs, int64_t warmup) {
  Trainer t(c, be);
  for (int64_t i = 0; i < warmup; ++i) t.step(data.train_batch(t.steps_done()));
  std::unique_ptr<OpRecorder> rec = make_step_recorder(t, 1);
  std::vector<double> off, on;
  for (int64_t i = 0; i < pairs; ++i) {
    for (const bool record : {i % 2 == 0, i % 2 != 0}) {  // alternate which goes first
      const Batch batch = data.train_batch(t.steps_done());
      rec->clear();
      t.set_recorder(record ? rec.get() : nullptr);
      const StepReport r = t.step(batch);
      (record ? on : off).push_back(r.seconds * 1e3);
    }
  }
  t.set_recorder(nullptr);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.empty() ? 0.0 : v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  };
  return OverheadResult{median(off), median(on)};
}

int profile_command(Config c, const ProfileCommand& cmd) {
  validate_config(c);
  set_num_threads(static_cast<int>(c.threads));
  auto be = make_backend(c.device);
  const DataSource data(c.data, data_context(c));
  ProfileOptions o;
  o.steps = cmd.steps;
  o.warmup = cmd.warmup;
  o.out_dir = cmd.out_dir;
  o.measure_ceiling = !cmd.no_ceiling;
  if (dist::world().rank() == 0) fmt::print("device {} ({} threads)\n", be->name(), num_threads());
  if (cmd.overhead_pairs > 0) {
    fmt::print("recorder overhead: {}, {} warm-up steps, then {} steps each with recording off and on, alternating\n",
               run_title(c), cmd.warmup, cmd.overhead_pairs);
    std::fflush(stdout);
    const OverheadResult r = measure_overhead(c, *be, data, cmd.overhead_pairs, cmd.warmup);
    fmt::print("median step: recording off {:.3f} ms, on {:.3f} ms ({:+.2f}%)\n", r.off_ms, r.on_ms,
               100.0 * r.overhead());
    return 0;
  }
  run_profile(c, *be, data, o);
  return 0;
}

}  // namespace loom
