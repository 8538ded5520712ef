// The CPU backend's kernel and workspace tables, generated from the op table: one cpu_<op> and
// one cpu_workspace_<op> per line of graph/ops.def, in the same order (so a missing kernel or
// workspace rule is a link error, and the backend is complete: no entry is nullptr, the mark of
// an op a partial backend lacks). Each family file defines both, the rule beside its kernel.
#include "backend/cpu/cpu.h"

namespace loom {

#define LOOM_OP(name, ...)            \
  void cpu_##name(const KernelArgs&); \
  KernelScratch cpu_workspace_##name(const KernelArgs&);
#include "graph/ops.def"
#undef LOOM_OP

const KernelFn kCpuKernels[] = {
#define LOOM_OP(name, ...) &cpu_##name,
#include "graph/ops.def"
#undef LOOM_OP
};
static_assert(sizeof(kCpuKernels) / sizeof(kCpuKernels[0]) == kNumOps,
              "the CPU kernel table must have one entry per op");

const WorkspaceFn kCpuWorkspace[] = {
#define LOOM_OP(name, ...) &cpu_workspace_##name,
#include "graph/ops.def"
#undef LOOM_OP
};
static_assert(sizeof(kCpuWorkspace) / sizeof(kCpuWorkspace[0]) == kNumOps,
              "the CPU workspace table must have one entry per op");

}  // namespace loom
