// The numbers behind MFU (model FLOPs utilisation) on `loom train`'s log lines:
//   - the model FLOPs of a training step: the op table's cost rules (graph/ops) over the forward and
//     backward nodes of every minibatch; recompute is not counted (PaLM's MFU definition: work the
//     model needs, not work the hardware did), the optimizer update neither (it is O(params));
//   - the device's matmul ceiling (Backend::measure_matmul_gflops, about a second of large matmuls
//     on every thread), measured once per machine and cached in
//     ${XDG_CACHE_HOME:-~/.cache}/loom/matmul_ceiling.json under a key naming the backend, the
//     compute dtype, the thread count, the CPU model, ONEDNN_MAX_CPU_ISA and the kernel that
//     measured it (Backend::matmul_kernel: a new library gets a new entry). `loom profile`
//     measures afresh every time. A busy machine measures low and inflates MFU, so each entry
//     says whether other processes competed for the cores meanwhile (LoadSampler); a run using a
//     busy entry says so once, an idle measurement replaces a busy one, and otherwise the
//     highest stays (a ceiling is an upper bound). Runs never re-measure: that would cost every
//     run on a busy machine its second.
#pragma once
#include <cstdio>
#include <string>

#include "backend/backend.h"
#include "train/trainer.h"

namespace loom {

struct FlopCounts {
  double model = 0;     // forward + backward nodes, all minibatches (what MFU counts)
  double hardware = 0;  // the same plus the recomputed forward nodes (what the machine executes)
};
// FLOPs of one training step of `t` (every minibatch).
FlopCounts step_flops(const Trainer& t);

// The cached ceiling in FLOP/s for (be, compute, current thread count, this CPU), measuring and
// caching it when absent (saying so on `log` when set). 0 when the backend cannot measure one
// (the reference backend). A cache that cannot be read or written is ignored.
double matmul_ceiling_flops(Backend& be, DType compute, std::FILE* log);
// The cache file (${XDG_CACHE_HOME:-~/.cache}/loom/matmul_ceiling.json; "" without HOME) and the
// key of (be, compute, the current thread count, this CPU) in it.
std::string ceiling_cache_file();
std::string ceiling_cache_key(const Backend& be, DType compute);
// Measures the ceiling now (GFLOP/s) and caches it by the rules above (`loom profile`); says on
// `log` when the machine was busy.
double measure_matmul_ceiling(Backend& be, DType compute, std::FILE* log);

}  // namespace loom
