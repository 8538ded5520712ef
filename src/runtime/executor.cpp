#include "runtime/executor.h"

namespace loom {

Status check_coverage(const Backend& be, const Graph& g, const std::vector<NodeId>& schedule) {
  for (NodeId id : schedule) {
    const Node& n = g.node(id);
    if (!be.supports_op(n.op))
      return Status::error(std::string("backend '") + be.name() + "' does not support op " + op_name(n.op) + " (at '" +
                           n.scope + "'): run this program on a backend that has it");
    if (!be.supports(g, n)) {
      std::string dts;
      for (ValueId v : n.in) dts += std::string(dts.empty() ? "" : ", ") + dtype_name(g.value(v).dtype);
      return Status::error(std::string("backend '") + be.name() + "' has no kernel for " + op_name(n.op) + " at '" +
                           n.scope + "' with input dtypes (" + dts + ")");
    }
  }
  return Status::ok();
}

std::vector<int64_t> kernel_workspace(const Backend& be, const Graph& g, int threads) {
  std::vector<int64_t> w(g.nodes().size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = be.workspace_bytes(g, g.node(static_cast<NodeId>(i)), threads);
  return w;
}

MemoryPlan plan_program(const Backend& be, const Graph& g, std::vector<NodeId> schedule, PlanOptions opts,
                        int threads) {
  std::vector<int64_t> library(g.nodes().size());
  for (size_t i = 0; i < library.size(); ++i) library[i] = be.library_bytes(g, g.node(static_cast<NodeId>(i)), threads);
  return plan_memory(g, std::move(schedule), opts,
                     WorkspaceNeeds{kernel_workspace(be, g, threads), threads, std::move(library)});
}

namespace {
// Whether the plan reserves every scheduled kernel's workspace on `be` and counts what its libraries
// allocate.
Status check_workspace(const Backend& be, const Graph& g, const MemoryPlan& p) {
  for (size_t s = 0; s < p.schedule.size(); ++s) {
    const Node& n = g.node(p.schedule[s]);
    const int64_t need = be.workspace_bytes(g, n, p.workspace_threads);
    const int64_t have = s < p.workspace_bytes.size() && p.workspace_offset[s] >= 0 ? p.workspace_bytes[s] : 0;
    if (need > have)
      return Status::error(std::string(op_name(n.op)) + " at '" + n.scope + "' needs " + std::to_string(need) +
                           " bytes of workspace on " + be.name() + " and the plan reserves " + std::to_string(have) +
                           ": plan with plan_program(backend, ...)");
    if (const int64_t lib = be.library_bytes(g, n, p.workspace_threads); lib > p.library_bytes)
      return Status::error(std::string(op_name(n.op)) + " at '" + n.scope + "' has its libraries allocate " +
                           std::to_string(lib) + " bytes on " + be.name() + " and the plan counts " +
                           std::to_string(p.library_bytes) + ": plan with plan_program(backend, ...)");
  }
  return Status::ok();
}
}  // namespace

void Executor::bind_no_gradients(const Graph& g, External& ext) {
  for (const Node& n : g.nodes())
    for (const auto* vs : {&n.in, &n.out})
      for (ValueId v : *vs) LOOM_ASSERT(g.value(v).kind != ValueKind::grad, "a forward-only program uses a gradient");
  for (const Param& p : g.params())
    if (p.trainable()) ext[g.value(p.grad).name] = nullptr;
}

Status Executor::create(Backend& be, const Graph& g, MemoryPlan plan, std::unique_ptr<Executor>* out,
                        const External* external, const Executor* arena_of) {
  if (Status s = check_coverage(be, g, plan.schedule); !s) return s;
  if (Status s = check_workspace(be, g, plan); !s) return s;
  std::unique_ptr<Executor> e(new Executor(be, g, std::move(plan)));
  const MemoryPlan& p = e->plan_;
  e->arena_bytes_ = p.arena_bytes;
  if (arena_of && &arena_of->be_ == &be && arena_of->arena_bytes_ >= p.arena_bytes) {
    e->arena_ = arena_of->arena_;
    e->owns_arena_ = false;
  } else if (p.arena_bytes > 0) {
    e->arena_ = be.allocate(static_cast<size_t>(p.arena_bytes));
    if (!e->arena_)
      return Status::error("could not allocate the " + std::to_string(p.arena_bytes) + "-byte activation arena on " +
                           be.name());
  }
  const size_t nv = g.values().size();
  e->ptrs_.assign(nv, nullptr);
  // Storage roots first; then views and in-place outputs take their root's pointer (a root may
  // have a larger id than its alias: remat clones are created after the backward that reads them).
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v) {
    const Value& val = g.value(v);
    if (p.value_root[v] != v || p.gathered[static_cast<size_t>(v)]) continue;
    if (val.kind == ValueKind::activation || p.value_offset[v] >= 0) {  // in the arena (planned gradients too)
      if (p.value_offset[v] >= 0) e->ptrs_[v] = static_cast<char*>(e->arena_) + p.value_offset[v];
      continue;
    }
    if (external) {
      auto it = external->find(val.name);
      if (it != external->end()) {
        e->ptrs_[v] = it->second;
        continue;
      }
    }
    void* m = be.allocate(static_cast<size_t>(val.bytes()));
    if (!m) return Status::error("could not allocate " + std::to_string(val.bytes()) + " bytes for '" + val.name + "'");
    be.fill_zero(m, static_cast<size_t>(val.bytes()));
    e->persistent_.push_back(m);
    e->ptrs_[v] = m;
  }
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
    if (p.value_root[v] != v) e->ptrs_[v] = e->ptrs_[p.value_root[v]];
  // A gathered parameter's storage at step s: its buffer in use there (a prefetched buffer is live
  // before its first use, possibly beside the previous interval's buffer).
  std::vector<std::vector<const BufferInfo*>> gathered(nv);
  for (const BufferInfo& b : p.buffers)
    if (b.gathered) gathered[static_cast<size_t>(b.value)].push_back(&b);
  auto arg_at = [&](ValueId v, size_t s) {
    TensorArg a = e->arg(v);
    for (const BufferInfo* b : gathered[static_cast<size_t>(p.value_root[v])])
      if (b->first_use <= static_cast<int32_t>(s) && static_cast<int32_t>(s) <= b->last) a.data = e->buffer_ptr(*b);
    LOOM_ASSERT(a.data || !p.gathered[static_cast<size_t>(v)], "a gathered parameter used outside its buffers");
    return a;
  };
  for (size_t s = 0; s < p.schedule.size(); ++s) {
    const Node& n = g.node(p.schedule[s]);
    std::vector<TensorArg> in, o;
    for (ValueId v : n.in) in.push_back(arg_at(v, s));
    for (ValueId v : n.out) o.push_back(arg_at(v, s));
    e->ins_.push_back(std::move(in));
    e->outs_.push_back(std::move(o));
    const int64_t off = s < p.workspace_offset.size() ? p.workspace_offset[s] : -1;
    e->workspace_.push_back(
        off < 0 ? Workspace{nullptr, 0, p.workspace_threads}
                : Workspace{static_cast<char*>(e->arena_) + off, p.workspace_bytes[s], p.workspace_threads});
  }
  *out = std::move(e);
  return Status::ok();
}

Executor::~Executor() {
  for (void* m : persistent_) be_.deallocate(m);
  if (arena_ && owns_arena_) be_.deallocate(arena_);
}

TensorArg Executor::arg(ValueId v) const {
  const Value& val = g_.value(v);
  return TensorArg{ptrs_[v], val.shape, val.dtype};
}

void Executor::run(const RunCtx& rc) { run_steps(rc, 0, plan_.schedule.size()); }

void Executor::run_steps(const RunCtx& rc, size_t begin, size_t end) {
  if (recorder_) [[unlikely]] {
    run_steps_recorded(rc, begin, end);
    return;
  }
  for (size_t s = begin; s < end; ++s) {
    const Node& n = g_.node(plan_.schedule[s]);
    be_.run(KernelArgs{n, ins_[s], outs_[s], rc, workspace_[s]});
  }
}

// The same loop with a clock reading before and after each node (OpRecorder::now_us synchronizes
// an asynchronous backend, so the interval is the kernel's execution).
void Executor::run_steps_recorded(const RunCtx& rc, size_t begin, size_t end) {
  OpRecorder& r = *recorder_;
  double t0 = r.now_us();
  for (size_t s = begin; s < end; ++s) {
    const Node& n = g_.node(plan_.schedule[s]);
    be_.run(KernelArgs{n, ins_[s], outs_[s], rc, workspace_[s]});
    const double t1 = r.now_us();
    r.record_op(static_cast<int32_t>(s), t0, t1);
    t0 = r.now_us();
  }
}

void Executor::upload(ValueId v, const void* host) {
  be_.copy_to_device(ptrs_[v], host, static_cast<size_t>(g_.value(v).bytes()));
}
void Executor::download(ValueId v, void* host) const {
  be_.copy_to_host(host, ptrs_[v], static_cast<size_t>(g_.value(v).bytes()));
}
void Executor::zero(ValueId v) { be_.fill_zero(ptrs_[v], static_cast<size_t>(g_.value(v).bytes())); }

}  // namespace loom
