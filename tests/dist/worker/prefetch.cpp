// Run under mpirun by tests/dist/test_dist.cpp: ZeRO-3's parameter gathers overlapped with
// compute (optimizer.gather_ahead) train the same bits as gathers that block.
//
//   dist_prefetch_worker STEPS
//
// trains a small Transformer with optimizer.shard = params (2 minibatches per rank, clipped,
// dropout, remat = Block so that the backward's recompute reads the parameters too) for STEPS
// steps once with each optimizer.gather_ahead of 0, 1 and 2, and checks that every step's loss and
// every parameter after the last step equal gather_ahead = 0's bit for bit (and gather_ahead = 1's
// on a second run), and that the gathers were in flight while kernels or the update ran exactly as
// the plan says: none with 0; with more, those of every gathered buffer but the first use's (each
// live before its first use), in every minibatch, and the first use's of every step after the
// first, started during the previous step's update. Prints a line per rank and gather_ahead; a line
// with FAILED and exit status 1 on a failed check.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "backend/registry.h"
#include "data/data.h"
#include "dist/comm.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

using namespace loom;

using loom::testing::check;
using loom::testing::failures;

struct Trained {
  std::vector<double> losses;              // per step
  std::vector<std::vector<float>> params;  // after the last step, whole (gathered)
};

Trained train(Config c, dist::Comm& comm, int steps, int32_t ahead) {
  const std::unique_ptr<Backend> be = make_backend("cpu");
  apply_override(c, fmt::format("optimizer.gather_ahead={}", ahead));
  Trainer t(c, *be, {}, &comm);
  const Batch batch = make_batch(c.data, data_context(c));
  Trained out;
  for (int s = 0; s < steps; ++s) out.losses.push_back(t.step(batch).metrics.loss.sum);
  const Graph& g = t.model().graph;
  for (const Param& p : g.params()) out.params.push_back(t.param(g.value(p.value).name));
  // What the plan says: every gathered buffer's gather starts once per minibatch, and those live
  // before their first use are in flight while the kernels in between run. With a prefetch the
  // first use's start during the update before (after the last step too, for a next step), in
  // flight while the rest of the update runs; the last of those may not have completed yet.
  int64_t buffers = 0, early = 0, at_first_use = 0;  // at_first_use: the buffers the first use reads
  int32_t first_use = INT32_MAX;
  for (const BufferInfo& b : t.plan().buffers)
    if (b.gathered) first_use = std::min(first_use, b.first_use);
  for (const BufferInfo& b : t.plan().buffers) {
    buffers += b.gathered;
    early += b.gathered && b.first < b.first_use;
    at_first_use += b.gathered && b.first_use == first_use;
  }
  const int64_t runs = steps * c.optimizer.num_minibatches;
  std::printf("rank %d: gather_ahead %d: %lld gathers, %lld of them overlapped kernels (plan: %lld buffers, %lld early)\n",
              comm.rank(), ahead, static_cast<long long>(t.gathers_started()),
              static_cast<long long>(t.gathers_overlapped()), static_cast<long long>(buffers),
              static_cast<long long>(early));
  check(first_use == 0, "the program's first step reads a parameter (the counts below assume it)", comm.rank());
  const int64_t next = ahead == 0 ? 0 : at_first_use;  // started for the step after the last
  check(buffers > 0 && t.gathers_started() == buffers * runs + next,
        fmt::format("gather_ahead {}: gathers started", ahead), comm.rank());
  const int64_t overlapped = early * runs + next * (steps - 1);
  check(t.gathers_overlapped() >= overlapped && t.gathers_overlapped() <= overlapped + next,
        fmt::format("gather_ahead {}: gathers overlapping kernels or the update", ahead), comm.rank());
  // Every parameter a node reads (a kernel and its bias, a norm's scale and offset) is prefetched,
  // not only the first: with any prefetch, all but the very first use's buffers are early.
  check(early == (ahead == 0 ? 0 : buffers - at_first_use),
        fmt::format("gather_ahead {}: buffers live before their first use", ahead), comm.rank());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Launch launch(&argc, &argv);
  dist::Comm& comm = dist::world();
  const int rank = comm.rank();
  const int steps = argc == 2 ? std::atoi(argv[1]) : 0;
  if (steps <= 0) {
    std::fprintf(stderr, "usage: %s STEPS\n", argv[0]);
    return 2;
  }
  Config c = loom::testing::zero3_worker_config(comm.size());
  apply_override(c, "optimizer.shard=params");
  set_num_threads(static_cast<int>(c.threads));
  const Trained blocking = train(c, comm, steps, 0);
  for (const int32_t ahead : {1, 2, 1}) {  // 1 twice: repeats agree too
    const Trained prefetched = train(c, comm, steps, ahead);
    check(prefetched.losses == blocking.losses, fmt::format("gather_ahead {}: the losses differ", ahead), rank);
    size_t differing = 0;
    for (size_t i = 0; i < blocking.params.size(); ++i) {
      const std::vector<float>& a = blocking.params[i];
      const std::vector<float>& b = prefetched.params[i];
      differing += a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0;
    }
    check(differing == 0, fmt::format("gather_ahead {}: {} parameters differ", ahead, differing), rank);
  }
  if (failures == 0) std::printf("rank %d: prefetched gathers train bit for bit as blocking ones\n", rank);
  return failures ? 1 : 0;
}
