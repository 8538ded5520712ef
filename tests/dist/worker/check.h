// What the workers test_dist runs under mpirun share: a failed check prints a line with FAILED
// and the rank, and is counted (a worker exits 1 when any failed).
#pragma once
#include <cstdio>
#include <string>

#include "train/config.h"

namespace loom::testing {

// The small Transformer the ZeRO-3 workers train with `ranks` ranks: 2 minibatches of 2 sequences
// per rank, clipped, dropout, remat = Block (the backward's recompute reads the parameters too),
// 1 thread; optimizer.shard is the caller's.
inline Config zero3_worker_config(int ranks) {
  return default_config({"model.kind=transformer", "model.hidden_size=32", "model.num_layers=2", "model.head_dim=8",
                         "model.vocab_size=64", "model.num_outputs=64", "model.max_seq_len=16",
                         "model.dropout_rate=0.1", "model.remat=Block", "data.kind=random_tokens", "data.seq_len=16",
                         "data.vocab_size=64", "data.batch_size=" + std::to_string(4 * ranks), "optimizer.name=adamw",
                         "optimizer.clip_norm=0.5", "optimizer.num_minibatches=2", "threads=1"});
}

inline int failures = 0;

inline void check(bool ok, const std::string& what, int rank) {
  if (ok) return;
  std::printf("rank %d: FAILED %s\n", rank, what.c_str());
  ++failures;
}

}  // namespace loom::testing
