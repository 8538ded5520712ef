// The memory viewer (docs/profiling.md): one self-contained HTML page (inline CSS, JS and SVG; no
// network) drawn from a training program's memory plan, like the memory viewer of the tutorial's
// profiler:
//   - live arena bytes over the schedule, coloured by phase (forward, backward, recompute), the
//     peak marked; hovering a step shows its op (name, scope, phase) and the
//     largest buffers live there;
//   - a sortable, filterable table of the buffers (scope, op, shape, dtype, size, live range; a
//     node's kernel workspace is a buffer of dtype "workspace" live at its step); clicking a row
//     shades its live range on the plot.
//   - with a FitFrontier (`loom memory --fit --html`, or model.remat = auto), model.remat = auto's
//     frontier above the plan: for each budget the planned total and the recomputed FLOPs' share of
//     the step (and the predicted step time when there is a ceiling), one mark per point titled with
//     its choice, the choice for the given budget marked, and a table of the same rows.
// Nothing runs: `loom memory CONFIG --html FILE` writes it from the plan alone, and `loom profile`
// writes it next to the trace. Without a frontier the page has no frontier section.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/passes/plan.h"
#include "train/config.h"
#include "train/fit.h"
#include "train/trainer.h"

namespace loom {

// What `loom memory --fit` prints (Fitter::frontier), for the page: step times are predicted at
// `ceiling_flops` FLOP/s (0: none); `chosen` is the choice for the budget the page's plan was fitted
// to, when there is one.
struct FitFrontier {
  std::vector<Fitter::FitPoint> points;
  double ceiling_flops = 0;
  std::optional<Fitter::FitPoint> chosen;
};

// `optimizer_bytes` (moments) is shown with the persistent memory when >= 0.
std::string memory_html(const TrainProgram& prog, const MemoryPlan& plan, const std::string& title,
                        int64_t optimizer_bytes = -1, const FitFrontier* frontier = nullptr);

// `loom memory CONFIG --html FILE`: builds and plans `c`'s training program and writes its page.
void write_memory_html(const Config& c, const std::string& path, const FitFrontier* frontier = nullptr);

}  // namespace loom
