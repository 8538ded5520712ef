// The backend interface: what the executor needs from a device (docs/ARCHITECTURE.md, "Backends").
//
// A backend owns memory on its device and runs one node at a time with pointers into that memory.
// It may be partial: supports_op says which ops of the op table it has kernels for (the reference
// and CPU backends have all of them: their kernel tables are generated from graph/ops.def, so a
// missing kernel is a link error), and supports says per node, from the dtypes, whether it runs
// it. The executor checks both for the whole schedule when a program is built and refuses a
// program with an op its backend lacks, naming the op: a node never runs on another backend, and
// never fails in the middle of a step. Kernels are pure functions of (attributes, inputs, outputs,
// run context): they may assume the shape rule in graph/ops/ accepted the node.
//
// Kernel workspace: scratch memory a kernel uses while it runs (converted operands, per-thread row
// buffers, GEMM tiles, oneDNN scratchpads). The backend says per node how many bytes
// (workspace_bytes); the memory plan places them in the arena, live at that node's step only, and
// the executor hands each kernel its span. A kernel allocates nothing else; what a library it
// calls allocates for itself the backend counts too (library_bytes), and the plan holds it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/shape.h"
#include "graph/graph.h"

namespace loom {

struct TensorArg {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Per-run coordinates that key the counter-based RNG (dropout masks), and which minibatch of the
// step is this process's first: its gradient writes flagged assign_in_first_minibatch assign,
// later ones add. Under data parallelism (train/trainer.h) rank r runs the step's minibatches
// r·M .. r·M + M - 1, keyed like the same minibatches of one process.
struct RunCtx {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint32_t minibatch = 0;
  uint32_t first_minibatch = 0;
};

// A node's workspace: the arena span the plan reserved for it (Backend::workspace_bytes bytes,
// 64-byte aligned), and the thread count those bytes were sized for: a kernel's parallel regions
// run with at most that many threads.
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
  int threads = 1;
};

struct KernelArgs {
  const Node& node;
  std::span<const TensorArg> in;
  std::span<const TensorArg> out;
  RunCtx run;
  Workspace workspace;
};

using KernelFn = void (*)(const KernelArgs&);

// One parameter tensor as the fused optimizer sees it (all fp32, `n` elements each).
struct OptimTensor {
  float* param = nullptr;
  float* grad = nullptr;
  float* mu = nullptr;  // first moment (nullptr for plain sgd)
  float* nu = nullptr;  // second moment
  int64_t n = 0;
  float weight_decay = 0.f;  // decoupled (AdamW) decay for this tensor; 0 where the mask excludes it
};

enum class OptimKind : uint8_t { sgd, adam };

// One fused optimizer update with Optax's semantics. For every element, g = grad · grad_scale
// (1/loss-scale and the clip factor folded into one multiplier), then:
//   adam / adamw (optax scale_by_adam + add_decayed_weights + scale_by_learning_rate):
//     mu = b1·mu + (1−b1)·g;  nu = b2·nu + (1−b2)·g²
//     u  = (mu / (1−b1^count)) / (sqrt(nu / (1−b2^count) + eps_root) + eps) + wd·param
//   sgd (optax trace + scale_by_learning_rate; mu is the trace, used when momentum > 0):
//     mu = g + momentum·mu;  u = nesterov ? g + momentum·mu : mu      (u = g without momentum)
//   param −= lr · u
struct OptimHyper {
  OptimKind kind = OptimKind::adam;
  float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, eps_root = 0.f;
  float momentum = 0.f;
  bool nesterov = false;
  int64_t count = 1;  // step number after increment (1 on the first update)
  float grad_scale = 1.f;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Device memory. allocate returns nullptr on failure (a resource failure, reported as Status
  // by the caller); memory is aligned to at least 64 bytes.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;

  // Whether this backend has a kernel for `op` at all (ggml's supports_op): an op it lacks is
  // refused by name before anything runs, and skipped by the op tests.
  virtual bool supports_op(OpKind op) const = 0;
  // Whether run() can execute node `n` of `g`, an op supports_op accepts (the dtype combination).
  virtual bool supports(const Graph& g, const Node& n) const = 0;
  // Bytes of workspace run() needs for node `n` of `g` when the kernel may use `threads` threads:
  // exact, from the node's shapes, dtypes and attributes (and this device: its ISA, its libraries'
  // scratchpad sizes). A function of those alone, so a plan made now holds for every run.
  virtual int64_t workspace_bytes(const Graph& g, const Node& n, int threads) const = 0;
  // Bytes the libraries run() calls for node `n` allocate for themselves while it runs, with
  // `threads` threads: the most they hold at once, as requested, from the same inputs as
  // workspace_bytes. For libraries that take no user memory (oneDNN's sgemm mallocs its packing
  // buffers in every call and frees them before returning). They live only inside run(), so the
  // plan holds the largest over its schedule as one host row (MemoryPlan::library_bytes).
  virtual int64_t library_bytes(const Graph& /*g*/, const Node& /*n*/, int /*threads*/) const { return 0; }
  // Executes one node. Inputs and outputs are device pointers with their shapes and dtypes.
  virtual void run(const KernelArgs& a) = 0;
  // Waits for queued work (a no-op on synchronous host backends).
  virtual void synchronize() = 0;
  // Monotonic clock in microseconds, for the profiler.
  virtual double now_us() const = 0;
  // Bytes that allocations can still get now (host: the kernel's MemAvailable), -1 when unknown.
  // Lets a run say "needs X, Y available" before it allocates anything. Shared by every rank of a
  // job on the same machine (Comm::ranks_on_this_host), as a host's memory is; a backend with a
  // device per rank would report that device's instead, and the check would need to know.
  virtual int64_t memory_available() const { return -1; }
  // The most bytes this backend's allocations held at once so far (as requested, before any
  // rounding), -1 when not tracked: what a run measures against its memory plan.
  virtual int64_t peak_allocated_bytes() const { return -1; }
  // Whether run() may return before the kernel finished (a GPU stream): the profiler then
  // synchronizes around every timed node. Host backends run synchronously.
  virtual bool asynchronous() const { return false; }
  // This device's dense matmul ceiling in GFLOP/s for a compute dtype, measured now (a large
  // square matmul the way the backend's dense kernels run that dtype, best of a few runs; takes
  // about a second). The profiler divides achieved FLOP/s by it. 0 = unknown.
  virtual double measure_matmul_gflops(DType /*compute*/) { return 0; }
  virtual const char* matmul_ceiling_method() const { return "Backend::measure_matmul_gflops"; }  // for reports
  // What measure_matmul_gflops runs for a compute dtype, with the instruction set it uses (e.g.
  // "oneDNN 3.2.0 matmul brg:avx512_core_amx"): printed beside the ceiling, and part of its cache key.
  virtual std::string matmul_kernel(DType /*compute*/) const { return {}; }

  // Σ over tensors of Σ grad² (global norm², for clipping and the fp16 finite check: a
  // non-finite gradient makes the result non-finite).
  virtual double grad_sq_norm(std::span<const OptimTensor> ts) = 0;
  // Fused optimizer: one pass over params, grads and moments, updating in place.
  virtual void optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) = 0;
};

}  // namespace loom
