// What a data-parallel job (docs/ARCHITECTURE.md, "More than one process") checks before its
// first step: every rank runs the same binary with the same effective configuration.
#pragma once
#include "dist/comm.h"
#include "train/config.h"

namespace loom {

// Compares a hash of config_to_toml(c) and of this process's executable across the ranks of
// `comm`. A difference is a dist::AgreedError raised on every rank, naming the first rank that
// differs from rank 0 and, for the configuration, the first differing key with both values.
// Nothing to do (and no MPI call) in a single process.
void check_same_job(const Config& c, dist::Comm& comm);

}  // namespace loom
