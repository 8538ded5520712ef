// The start of `loom train`: the configuration, the checkpoint a resume continues, and the run
// directory with its lock. Everything that can be refused without building anything is refused
// here (a second process on the directory, with its pid; a directory holding another run), and
// nothing on disk changes until start_run, after the whole run was built and validated.
//
// Resuming in place (--resume R without another --out) continues the run in R's directory: its
// lock is taken before its files are read, so a run still going is reported as such.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "data/data.h"
#include "dist/comm.h"
#include "run/run.h"
#include "run/run_dir.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {

struct OpenedRun {
  Config config;               // validated, the same on every rank
  Checkpoint ckpt;             // resuming: the checkpoint loaded; ckpt.path "" otherwise
  std::filesystem::path dir;   // the run directory, "" = none (the tutorials' fixed batches)
  bool in_place = false;       // continuing the run in its own directory
  std::unique_ptr<RunDir> rd;  // rank 0 with a run directory: its lock, held
  std::string metrics_file;    // rank 0's JSONL ("" = none)
  bool resumed() const { return !ckpt.path.empty(); }
};

// Reads the configuration (a file, or a resumed checkpoint's own) with the options' overrides,
// loads the checkpoint to resume and takes the run directory's lock. Every rank calls it; rank 0
// alone owns the directory, and refuses there, on every rank, what the run would write over
// (resuming in place too: before any step). Throws UserError (dist::AgreedError for a
// configuration all ranks share and for the directory's refusals) naming what to change.
OpenedRun open_run(const RunOptions& o, dist::Comm& comm, FILE* out);

// Everything is built and valid: puts the state the run starts from into `t` and changes the run
// directory, under its lock. The state: the resumed checkpoint (and the validation position), or
// model.init_from's parameters for fine-tuning (refused when the data's tokenizer is not the
// model's), and lora.init_from's adapters; nothing else for a new run. The directory: resuming in
// place forks off what came after the checkpoint (or deletes it with `overwrite`); a new run
// clears what loom owns there (`overwrite`), writes its marker and, seeded from another run, that
// run's metrics up to the checkpoint. Then config.toml. Nothing on disk on ranks other than 0.
void start_run(OpenedRun& r, Trainer& t, DataSource& data, bool overwrite, const std::string& config_toml, FILE* out);

}  // namespace loom
