#include "run/open_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/write_error.h"
#include "io/peft.h"
#include "train/distributed.h"
#include "train/model_source.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

void write_config(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.parent_path() / ".config.toml.tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << kConfigHeader << '\n' << text;
    f.flush();
    if (!f) {
      const int e = errno;
      std::error_code ec;
      fs::remove(tmp, ec);
      fail_write(path.string(), "cannot write it", e);
    }
  }
  fs::rename(tmp, path);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// train.collective_timeout of the run that resuming `o` gives, read before any tensor (the
// configuration file, or the state.json of the checkpoint that loading will try first, with the
// overrides); the default when neither reads: loading then reports why.
double resumed_timeout(const RunOptions& o) {
  try {
    if (!o.config_path.empty()) return load_config(o.config_path, o.overrides).train.collective_timeout;
    const fs::path given(o.resume);
    const std::string dir = fs::exists(given / "state.json") ? o.resume : latest_checkpoint(o.resume);
    if (dir.empty()) return dist::Comm::kDefaultTimeoutSeconds;
    return config_from_toml_text(read_checkpoint_state(dir).config_toml, dir + "/state.json", o.overrides)
        .train.collective_timeout;
  } catch (const std::exception&) {
    return dist::Comm::kDefaultTimeoutSeconds;
  }
}

// Rank 0's checks of the run directory before anything is built: its lock (a second process is
// refused, and a run still going is named as such, with its pid, before the generic refusal of a
// directory holding a run), then what the run would write over. A resume in place is checked now
// too, not at its first save, after steps were spent: nothing it will write may be a user's.
void check_run_dir(OpenedRun& r, bool overwrite) {
  std::error_code same_ec;
  if (!r.rd || !fs::equivalent(r.rd->path(), r.dir, same_ec)) {
    r.rd = std::make_unique<RunDir>(r.dir);
    if (fs::exists(r.dir)) r.rd->lock();
  }
  r.rd->refuse_foreign_files(r.in_place ? r.ckpt.state.step : -1);
  if (!r.in_place && r.rd->holds_run() && !overwrite)
    throw UserError(
        r.dir.string(), "already holds a run (config.toml, metrics.jsonl or checkpoints)",
        "continue it with --resume " + r.dir.string() + ", replace it with --overwrite, or choose another --out");
}

}  // namespace

OpenedRun open_run(const RunOptions& o, dist::Comm& comm, FILE* out) {
  const bool writer = comm.rank() == 0;
  OpenedRun r;
  r.dir = o.out_dir;
  Config& c = r.config;
  if (!o.resume.empty()) {
    // Continuing a run in place: take its lock before reading it, so a run still going is
    // reported as such (with its pid) rather than as whatever state its files are in.
    const fs::path given(o.resume);
    const fs::path guess = fs::exists(given / "state.json") ? given.parent_path() : given;
    std::error_code guess_ec;
    if (writer && (o.out_dir.empty() || fs::equivalent(o.out_dir, guess, guess_ec))) {
      r.rd = std::make_unique<RunDir>(guess);
      if (r.rd->holds_run()) r.rd->lock();
    }
    // The ranks' deadline holds while they load: a rank whose disk hangs is named after
    // train.collective_timeout by the ranks that wait for it (check_same_job sets it again once
    // the ranks agree on the configuration); one that reads slowly tells them it is busy.
    if (const double timeout = resumed_timeout(o); timeout > 0) comm.set_timeout(timeout);
    std::vector<std::string> skipped;
    r.ckpt = load_checkpoint(o.resume, &skipped, true, [&comm] { comm.keep_alive(); });
    for (const std::string& s : skipped) fmt::print(out, "skipping a damaged checkpoint: {}\n", s);
    c = o.config_path.empty()
            ? config_from_toml_text(r.ckpt.state.config_toml, r.ckpt.path + "/state.json", o.overrides)
            : load_config(o.config_path, o.overrides);
    const fs::path home = fs::path(r.ckpt.path).parent_path();
    std::error_code ec;
    r.in_place = r.dir.empty() || fs::equivalent(r.dir, home, ec);
    if (r.in_place) {
      r.dir = home;
      if (writer && !RunDir(r.dir).holds_run())
        throw UserError(r.ckpt.path, "is not inside a loom run directory, so there is no run to continue in place",
                        "give --out DIR to continue it as a new run in DIR");
    }
  } else {
    c = load_config(o.config_path.empty() ? kDefaultConfig : o.config_path, o.overrides);
    if (r.dir.empty() && c.data.kind == DataKind::tokens) r.dir = fs::path("runs") / fs::path(c.source).stem();
  }
  if (o.steps >= 0) c.train.steps = o.steps;
  if (o.log_every > 0) c.train.log_every = o.log_every;
  check_same_job(c, comm);
  check_same_resume(r.ckpt, comm);
  try {
    validate_config(c);
    minibatch_size(c, comm.size());
  } catch (const UserError& e) {
    throw dist::AgreedError(e);  // every rank checked the same configuration
  }

  // Rank 0 owns the directory; what it refuses there ends every rank with its message.
  std::optional<UserError> refused;
  try {
    if (writer && !r.dir.empty()) check_run_dir(r, o.overwrite);
  } catch (const UserError& e) {
    refused = e;
  }
  dist::share_error(comm, refused ? &*refused : nullptr);
  if (c.train.tensorboard && r.dir.empty())
    throw UserError(c.source + ": train.tensorboard", "needs a run directory for its event file",
                    "give --out DIR (tensorboard --logdir DIR's parent then shows it)");
  r.metrics_file = !writer                         ? ""
                   : !c.train.metrics_file.empty() ? c.train.metrics_file
                   : r.dir.empty()                 ? ""
                                                   : (r.dir / "metrics.jsonl").string();
  return r;
}

namespace {

// The state the run starts from (start_run).
void load_start(const OpenedRun& r, Trainer& t, DataSource& data, FILE* out) {
  const Config& c = r.config;
  if (r.resumed()) {
    restore_checkpoint(t, r.ckpt);
    data.set_val_position(r.ckpt.state.val_position);
  } else if (!c.model.init_from.empty()) {  // fine-tuning: the parameters only
    const ModelSource src(c.model.init_from);
    // Token ids mean what the model learned only under its own tokenizer: data prepared with
    // another would train every embedding row on the wrong token.
    const std::unique_ptr<Tokenizer> model_tok = src.tokenizer();
    if (model_tok && data.tokenizer_json() && !same_tokens(model_tok->to_json(), *data.tokenizer_json()))
      throw UserError(c.data.dir + "/meta.json",
                      "the data's " + data.tokenizer_json()->value("kind", std::string("?")) +
                          " tokenizer is not the one of model.init_from (" + src.description() + ", its " +
                          std::string(choice_name(model_tok->kind())) + " tokenizer)",
                      "prepare the data with the model's own tokenizer: loom prepare hf " + c.model.init_from +
                          "/tokenizer.json INPUT OUTDIR");
    src.load_params(t);
    fmt::print(out, "parameters from {}\n", src.description());
  }
  if (!r.resumed() && !c.model.lora.init_from.empty()) {  // someone else's adapter, on the base
    load_peft_adapter(t.executor(), c.model, c.model.lora.init_from);
    fmt::print(out, "adapters from the PEFT adapter in {}\n", c.model.lora.init_from);
  }
}

// The run directory's changes (start_run), once everything is valid.
void prepare_run_dir(OpenedRun& r, bool overwrite, int64_t step, const std::string& config_toml, FILE* out) {
  if (!r.rd) return;
  r.rd->lock();
  r.rd->remove_stop_note();  // the run goes on
  if (r.in_place) {
    remove_stale_checkpoint_files(r.dir.string());
    const RunDir::Forked forked = r.rd->fork_at(step, overwrite);
    if (!forked.names.empty())
      fmt::print(out, "resuming at step {}: what came after it {}: {}\n", step,
                 overwrite ? "is deleted (--overwrite)" : "is moved to " + forked.aside.string(),
                 fmt::join(forked.names, ", "));
    r.rd->truncate_metrics(step);
  } else {
    if (r.rd->holds_run()) r.rd->clear_owned();
    r.rd->write_marker(r.ckpt.path);
    // A run seeded from another one starts its metrics with the history up to the checkpoint.
    const fs::path src_metrics = fs::path(r.ckpt.path).parent_path() / "metrics.jsonl";
    if (r.resumed() && r.metrics_file == (r.dir / "metrics.jsonl").string() && fs::exists(src_metrics)) {
      std::ofstream f(r.metrics_file, std::ios::trunc);
      f << metrics_up_to(read_text(src_metrics), step);
      f.flush();
      if (!f) fail_write(r.metrics_file, "cannot write the metrics file", errno);
    }
  }
  write_config(r.dir / "config.toml", config_toml);
}

}  // namespace

void start_run(OpenedRun& r, Trainer& t, DataSource& data, bool overwrite, const std::string& config_toml, FILE* out) {
  load_start(r, t, data, out);
  prepare_run_dir(r, overwrite, t.steps_done(), config_toml, out);
  if (!r.resumed()) return;
  fmt::print(out, "resumed from {} at step {}\n", r.ckpt.path, t.steps_done());
  if (t.steps_done() >= r.config.train.steps)
    fmt::print(out, "{}\n", nothing_to_train(t.steps_done(), r.config.train.steps));
}

}  // namespace loom
