// What a data-parallel job (docs/ARCHITECTURE.md, "More than one process") checks before its
// first step: every rank runs the same binary with the same effective configuration, and resumed
// the same state.
#pragma once
#include <cstdint>

#include "dist/comm.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace loom {

// Compares a hash of config_to_toml(c) and of this process's executable across the ranks of
// `comm`. A difference is a dist::AgreedError raised on every rank, naming the first rank that
// differs from rank 0 and, for the configuration, the first differing key with both values.
// Then sets the deadline of the ranks' collectives, train.collective_timeout (dist::Comm::set_timeout).
// Nothing to do (and no MPI call) in a single process.
void check_same_job(const Config& c, dist::Comm& comm);

// A digest of what resuming from `c` loads: its state (step, optimizer count, loss scaler, seed,
// validation data position, best loss) and every tensor it verified, by name and the CRC-32C of its
// bytes as they were read. Equal for copies of one checkpoint wherever they lie; 0 for no
// checkpoint (c.path "").
uint32_t resume_digest(const Checkpoint& c);

// Compares the step and resume_digest of `c` (what this rank loaded, or nothing: a fresh start)
// across the ranks of `comm`, before anything is written: ranks that resumed different states
// (a stale per-host copy of the run, a checkpoint one host skipped as damaged) are one
// dist::AgreedError on every rank naming each rank's host, checkpoint path and step. Copies of
// one checkpoint at different paths agree. Nothing to do (and no MPI call) in a single process.
void check_same_resume(const Checkpoint& c, dist::Comm& comm);

}  // namespace loom
