// The CPU backend's kernel table, generated from the op table: one cpu_<op> per line of
// graph/ops.def, in the same order (so a missing kernel is a link error).
#include "backend/cpu/cpu.h"

namespace loom {

#define LOOM_OP(name, ...) void cpu_##name(const KernelArgs&);
#include "graph/ops.def"
#undef LOOM_OP

const KernelFn kCpuKernels[] = {
#define LOOM_OP(name, ...) &cpu_##name,
#include "graph/ops.def"
#undef LOOM_OP
};
static_assert(sizeof(kCpuKernels) / sizeof(kCpuKernels[0]) == kNumOps,
              "the CPU kernel table must have one entry per op");

}  // namespace loom
