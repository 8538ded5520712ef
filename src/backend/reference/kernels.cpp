// The reference backend's kernel table, generated from the op table: one ref_<op> per line of
// graph/ops.def, in the same order (so a missing kernel is a link error). The oracle every other
// backend is tested against is complete: no entry is nullptr (the mark of an op a backend lacks).
#include "backend/reference/reference.h"

namespace loom {

#define LOOM_OP(name, ...) void ref_##name(const KernelArgs&);
#include "graph/ops.def"
#undef LOOM_OP

const KernelFn kReferenceKernels[] = {
#define LOOM_OP(name, ...) &ref_##name,
#include "graph/ops.def"
#undef LOOM_OP
};
static_assert(sizeof(kReferenceKernels) / sizeof(kReferenceKernels[0]) == kNumOps,
              "the reference kernel table must have one entry per op");

}  // namespace loom
