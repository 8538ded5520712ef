// The memory viewer (docs/profiling.md): one self-contained HTML page (inline CSS, JS and SVG; no
// network) drawn from a training program's memory plan, like the memory viewer of the tutorial's
// profiler:
//   - live arena bytes over the schedule, coloured by phase (forward, backward, recompute), the
//     peak marked; hovering a step shows its op (name, scope, phase) and the
//     largest buffers live there;
//   - a sortable, filterable table of the buffers (scope, op, shape, dtype, size, live range; a
//     node's kernel workspace is a buffer of dtype "workspace" live at its step); clicking a row
//     shades its live range on the plot.
// Nothing runs: `loom memory CONFIG --html FILE` writes it from the plan alone, and `loom profile`
// writes it next to the trace.
#pragma once
#include <cstdint>
#include <string>

#include "graph/passes/plan.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {

// `optimizer_bytes` (moments) is shown with the persistent memory when >= 0.
std::string memory_html(const TrainProgram& prog, const MemoryPlan& plan, const std::string& title,
                        int64_t optimizer_bytes = -1);

// `loom memory CONFIG --html FILE`: builds and plans `c`'s training program and writes its page.
void write_memory_html(const Config& c, const std::string& path);

}  // namespace loom
