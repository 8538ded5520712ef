// Run under mpirun by tests/dist/test_dist.cpp: ZeRO-3's evaluation (optimizer.shard = params)
// reads each parameter gathered from the trainer's chunks, in the bytes its plan counts.
//
//   dist_evaluation_worker
//
// trains a small Transformer (2 minibatches per rank, dropout, remat = Block) for 3 steps with
// optimizer.shard = params and again with state+grads, which ZeRO-3 trains like bit for bit, an
// evaluator beside each trainer evaluating 2 training batches after every step, and checks that
// the evaluations agree bit for bit, that the ZeRO-3 evaluator's program holds no parameter of its
// own (each is gathered into the arena for its use), and that what the evaluator allocated beside
// its trainer is Evaluator::planned_bytes, what `loom memory --ranks N` and the fit check count.
// Prints a line per rank; a line with FAILED and exit status 1 on a failed check.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "check.h"
#include "data/data.h"
#include "dist/comm.h"
#include "train/config.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace {

using namespace loom;

using loom::testing::check;
using loom::testing::failures;

struct Evaluated {
  std::vector<double> sums;  // per step: the training loss, the evaluation's loss and correct count
  int64_t allocated = 0;     // by the evaluator, beside its trainer
  int64_t planned = 0;       // Evaluator::planned_bytes
  int64_t params_held = 0;   // parameters of the evaluation program with storage of their own
};

Evaluated train_and_evaluate(Config c, const std::string& shard, dist::Comm& comm, int steps) {
  apply_override(c, "optimizer.shard=" + shard);
  const std::unique_ptr<Backend> be = make_backend("cpu");
  Trainer t(c, *be, {}, &comm, /*evaluates=*/true);
  const DataSource data(c.data, data_context(c));
  Evaluated out;
  const int64_t before = be->peak_allocated_bytes();
  Evaluator ev(t, *be);
  out.allocated = be->peak_allocated_bytes() - before;
  out.planned = Evaluator::planned_bytes(c, comm.size(), t.plan().arena_bytes);
  const Graph& g = ev.executor().graph();
  for (const Param& p : g.params()) out.params_held += ev.executor().ptr(p.value) != nullptr;
  for (int s = 0; s < steps; ++s) {
    out.sums.push_back(t.step(data.train_batch(s)).metrics.loss.sum);
    const Metrics m = ev.training(data, 2);
    out.sums.push_back(m.loss.sum);
    out.sums.push_back(m.accuracy.sum);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Launch launch(&argc, &argv);
  dist::Comm& comm = dist::world();
  const Config c = loom::testing::zero3_worker_config(comm.size());
  set_num_threads(static_cast<int>(c.threads));
  constexpr int kSteps = 3;
  const Evaluated whole = train_and_evaluate(c, "state+grads", comm, kSteps);
  const Evaluated gathered = train_and_evaluate(c, "params", comm, kSteps);
  const int rank = comm.rank();
  check(gathered.sums == whole.sums, "ZeRO-3's training or evaluation differs from state+grads'", rank);
  check(whole.params_held > 0 && gathered.params_held == 0,
        fmt::format("the ZeRO-3 evaluator holds {} parameters of its own", gathered.params_held), rank);
  for (const Evaluated* e : {&whole, &gathered})
    check(e->allocated == e->planned,
          fmt::format("{}: the evaluator allocated {} bytes, its plan says {}", e == &whole ? "state+grads" : "params",
                      e->allocated, e->planned),
          rank);
  std::printf("rank %d: evaluation under ZeRO-3: %lld bytes beside the trainer, planned %lld\n", rank,
              static_cast<long long>(gathered.allocated), static_cast<long long>(gathered.planned));
  if (failures == 0) std::printf("rank %d: ZeRO-3 evaluates as state+grads, bit for bit, in its planned bytes\n", rank);
  return failures ? 1 : 0;
}
