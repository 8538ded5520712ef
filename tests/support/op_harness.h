// Test support: run one op on a backend through the real pipeline (graph -> plan -> executor).
//
//   OpCase c(OpKind::dense, {{Shape{4, 8}, DType::bf16}, {Shape{8, 3}, DType::f32}}, DenseAttrs{DType::bf16});
//   c.fill_random(seed);                      // inputs: fresh random values (floats ~ N(0,1))
//   auto out = c.run(backend, RunCtx{...});   // outputs as host byte buffers
//
// Inputs are persistent `input` values (input 0 of a kOpWritesGrad op is a gradient buffer), so the
// harness can upload them; outputs are marked as program outputs. Output buffers are surrounded
// by sentinel bytes inside a padded arena, and run() checks that no sentinel changed, catching
// out-of-bounds writes.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "graph/graph.h"
#include "graph/passes/plan.h"
#include "runtime/executor.h"

namespace loom::testing {

struct HostTensor {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<unsigned char> bytes;
  HostTensor() = default;
  HostTensor(Shape s, DType d) : shape(s), dtype(d), bytes(static_cast<size_t>(s.numel()) * dtype_size(d)) {}
  int64_t numel() const { return shape.numel(); }
  float get(int64_t i) const { return load_as_f32(bytes.data(), dtype, static_cast<size_t>(i)); }
  void set(int64_t i, float v) { store_from_f32(bytes.data(), dtype, static_cast<size_t>(i), v); }
  int32_t get_i32(int64_t i) const {
    int32_t v;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    return v;
  }
  void set_i32(int64_t i, int32_t v) { std::memcpy(bytes.data() + i * 4, &v, 4); }
};

class OpCase {
 public:
  OpCase(OpKind op, std::vector<ValueDesc> inputs, Attrs attrs = NoAttrs{}) : op_(op), attrs_(attrs) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      ValueId v;
      if (i == 0 && (op_info(op).flags & kOpWritesGrad)) {
        const ValueId p = g_.add_param("acc", inputs[i].shape, {});
        v = g_.grad_of(p);
      } else {
        v = g_.add_input("in" + std::to_string(i), inputs[i].shape, inputs[i].dtype);
      }
      in_ids_.push_back(v);
      inputs_.emplace_back(inputs[i].shape, inputs[i].dtype);
    }
    node_ = g_.add_node(op, in_ids_, attrs_, "test", Phase::forward);
    for (ValueId o : g_.node(node_).out) g_.mark_output(o);
  }

  HostTensor& input(size_t i) { return inputs_.at(i); }
  const Graph& graph() const { return g_; }
  const Node& node() const { return g_.node(node_); }

  // Float inputs ~ N(0, 1) (rounded to their dtype); int32 inputs uniform in [0, int_range).
  void fill_random(uint64_t seed, int32_t int_range = 1) {
    const PhiloxKey key = rng_key(seed, 0, 0, 0);
    uint64_t k = 0;
    for (HostTensor& t : inputs_)
      for (int64_t i = 0; i < t.numel(); ++i, ++k) {
        if (t.dtype == DType::i32)
          t.set_i32(i, static_cast<int32_t>(rng_uniform(key, k) * static_cast<float>(int_range)));
        else
          t.set(i, rng_normal(key, k));
      }
  }

  // Runs the op on `be`; returns the outputs (for kOpWritesInput0 ops: the updated input 0, then its outputs).
  std::vector<HostTensor> run(Backend& be, const RunCtx& rc = {}) {
    MemoryPlan plan = plan_program(be, g_, default_schedule(g_));
    // Pad the arena with a sentinel region after every output buffer and after the kernel's
    // workspace: shift each buffer by a guard band by re-planning offsets with room on both sides
    // (a write past the workspace's end lands in a guard band too).
    constexpr int64_t kGuard = 256;
    int64_t cursor = kGuard;
    for (BufferInfo& b : plan.buffers) {
      b.offset = cursor;
      cursor += b.bytes + kGuard;
    }
    for (const BufferInfo& b : plan.buffers) {
      if (b.value == kNoValue)
        plan.workspace_offset[b.first] = b.offset;
      else
        plan.value_offset[b.value] = b.offset;
    }
    plan.arena_bytes = cursor;
    std::unique_ptr<Executor> ex;
    const Status st = Executor::create(be, g_, plan, &ex);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st.is_ok()) return {};
    // Fill the whole arena with the sentinel, then upload inputs. The arena's base is found from
    // an output that owns arena storage (a view of a persistent input has none).
    std::vector<unsigned char> pattern(static_cast<size_t>(plan.arena_bytes), kSentinel);
    void* arena_base = nullptr;
    for (ValueId o : g_.node(node_).out)
      if (plan.value_root[o] == o && plan.value_offset[o] >= 0) {
        arena_base = static_cast<char*>(ex->ptr(o)) - plan.value_offset[o];
        break;
      }
    if (arena_base) be.copy_to_device(arena_base, pattern.data(), pattern.size());
    for (size_t i = 0; i < in_ids_.size(); ++i) ex->upload(in_ids_[i], inputs_[i].bytes.data());
    ex->run(rc);
    be.synchronize();
    std::vector<HostTensor> outs;
    if (op_info(op_).flags & kOpWritesInput0) {  // the updated input 0 first, then any outputs
      HostTensor t(inputs_[0].shape, inputs_[0].dtype);
      ex->download(in_ids_[0], t.bytes.data());
      outs.push_back(std::move(t));
      if (g_.node(node_).out.empty()) return outs;
    }
    std::vector<unsigned char> arena(arena_base ? static_cast<size_t>(plan.arena_bytes) : 0);
    if (arena_base) be.copy_to_host(arena.data(), arena_base, arena.size());
    // The byte ranges the kernel may write: its workspace (anywhere in it) and its outputs.
    std::vector<std::pair<int64_t, int64_t>> owned;  // [begin, end) in the arena
    for (const BufferInfo& b : plan.buffers)
      if (b.value == kNoValue) owned.emplace_back(b.offset, b.offset + plan.workspace_bytes[b.first]);
    for (ValueId o : g_.node(node_).out) {
      const Value& v = g_.value(o);
      HostTensor t(v.shape, v.dtype);
      if (plan.value_root[o] == o) {
        std::memcpy(t.bytes.data(), arena.data() + plan.value_offset[o], t.bytes.size());
        owned.emplace_back(plan.value_offset[o], plan.value_offset[o] + static_cast<int64_t>(t.bytes.size()));
      } else {
        ex->download(o, t.bytes.data());  // a view of an input
      }
      outs.push_back(std::move(t));
    }
    // Every byte outside them still holds the sentinel: compared a gap at a time (memcmp against
    // the pattern), byte by byte only to name the first one that does not.
    const int64_t size = static_cast<int64_t>(arena.size());
    std::sort(owned.begin(), owned.end());
    owned.emplace_back(size, size);
    int64_t gap = 0;
    for (auto [begin, end] : owned) {
      begin = std::min(begin, size);
      if (begin > gap && std::memcmp(arena.data() + gap, pattern.data() + gap, static_cast<size_t>(begin - gap)) != 0) {
        while (arena[static_cast<size_t>(gap)] == kSentinel) ++gap;
        ADD_FAILURE() << "out-of-bounds write by " << op_name(op_) << " on " << be.name() << " at arena byte " << gap;
        break;
      }
      gap = std::max(gap, end);
    }
    return outs;
  }

 private:
  static constexpr unsigned char kSentinel = 0xA5;
  OpKind op_;
  Attrs attrs_;
  Graph g_;
  std::vector<ValueId> in_ids_;
  std::vector<HostTensor> inputs_;
  NodeId node_ = -1;
};

// Normalised mean squared error, sum((a-b)^2) / sum(b^2) (ggml's test-backend-ops metric);
// NaN/inf mismatches count as failures.
inline double nmse(const HostTensor& a, const HostTensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double x = a.dtype == DType::i32 ? a.get_i32(i) : a.get(i);
    const double y = ref.dtype == DType::i32 ? ref.get_i32(i) : ref.get(i);
    if (std::isnan(x) != std::isnan(y) || (std::isinf(y) && x != y)) return INFINITY;
    if (std::isnan(y) || std::isinf(y)) continue;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? num : num / den;
}

}  // namespace loom::testing
