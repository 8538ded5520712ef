// Memory plan properties on random graphs: no two buffers live at the same step share bytes,
// every read activation has storage, views alias their root and keep it alive, and the arena
// is never smaller than the live-bytes lower bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>

#include "graph/graph.h"
#include "graph/passes/autodiff.h"
#include "graph/passes/plan.h"

namespace loom {
namespace {

// A cross-entropy loss over y [rows, classes] against integer labels, and its backward (autodiff).
void add_loss_and_backward(Graph& g, ValueId y, int64_t rows) {
  const ValueId lab = g.add_input("labels", Shape{rows}, DType::i32);
  const ValueId loss = g.node(g.add_node(OpKind::cross_entropy, {y, lab}, NoAttrs{}, "", Phase::forward)).out[0];
  build_backward(g, loss, g.add_input("seed", Shape{}, DType::f32));
}

// A random DAG of elementwise ops, reshapes (views) and casts over a pool of live values, with
// random widths so sizes differ.
Graph random_graph(uint32_t seed, int nodes) {
  std::mt19937 rng(seed);
  Graph g;
  std::vector<ValueId> pool;
  const int64_t rows = 1 + rng() % 8;
  for (const char* name : {"x0", "x1", "x2"})
    pool.push_back(g.add_input(name, Shape{rows, 1 + int64_t(rng() % 64)}, DType::f32));
  for (int i = 0; i < nodes; ++i) {
    const ValueId a = pool[rng() % pool.size()];
    const Value av = g.value(a);
    ValueId out;
    switch (rng() % 5) {
      case 0:
        out = g.node(g.add_node(OpKind::silu, {a}, NoAttrs{}, "s", Phase::forward)).out[0];
        break;
      case 1: {
        // add with a same-shaped partner if one exists, else with itself
        ValueId b = a;
        for (int t = 0; t < 8; ++t) {
          const ValueId c = pool[rng() % pool.size()];
          if (g.value(c).shape == av.shape && g.value(c).dtype == av.dtype) b = c;
        }
        out = g.node(g.add_node(OpKind::add, {a, b}, NoAttrs{}, "s", Phase::forward)).out[0];
        break;
      }
      case 2:
        out = g.node(g.add_node(OpKind::reshape, {a}, ShapeAttrs{Shape{av.shape.numel()}}, "s", Phase::forward)).out[0];
        break;
      case 3: {
        const DType d = av.dtype == DType::f32 ? DType::bf16 : DType::f32;
        out = g.node(g.add_node(OpKind::cast, {a}, DTypeAttrs{d}, "s", Phase::forward)).out[0];
        break;
      }
      default: {
        // widen: dense-like growth via layer_norm needs params; use gelu for variety
        out = g.node(g.add_node(OpKind::gelu, {a}, NoAttrs{}, "s", Phase::forward)).out[0];
        break;
      }
    }
    pool.push_back(out);
    if (pool.size() > 12) pool.erase(pool.begin() + static_cast<long>(rng() % pool.size()));
    if (rng() % 17 == 0) g.mark_output(out);
  }
  return g;
}

TEST(MemoryPlan, RandomGraphsNeverOverlapLiveBuffers) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    const Graph g = random_graph(seed, 20 + static_cast<int>(seed % 80));
    const MemoryPlan p = plan_memory(g, default_schedule(g));
    ASSERT_EQ(verify_plan(g, p), "") << "seed " << seed;
    EXPECT_GE(p.arena_bytes, p.lower_bound_bytes);
    EXPECT_GT(p.lower_bound_bytes, 0);
    // Recompute the lower bound independently from the node list.
    int64_t best = 0;
    for (size_t s = 0; s < p.schedule.size(); ++s) {
      int64_t live = 0;
      for (const BufferInfo& b : p.buffers)
        if (b.first <= static_cast<int32_t>(s) && static_cast<int32_t>(s) <= b.last) live += b.bytes;
      best = std::max(best, live);
    }
    EXPECT_EQ(best, p.lower_bound_bytes);
  }
}

// The placement's definition, the slow way: buffers by size (larger first, then earlier first),
// each into the smallest gap that fits among the placed buffers whose live ranges overlap its own
// (taken by offset, of equal offsets the earlier placed first), else above them.
std::vector<int64_t> greedy_offsets(const std::vector<BufferInfo>& buffers) {
  std::vector<size_t> order(buffers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return buffers[a].bytes != buffers[b].bytes ? buffers[a].bytes > buffers[b].bytes
                                                : buffers[a].first < buffers[b].first;
  });
  std::vector<int64_t> offset(buffers.size(), -1);
  std::vector<size_t> placed;  // in placement order
  for (size_t i : order) {
    std::vector<size_t> overlap;
    for (size_t j : placed)
      if (buffers[j].first <= buffers[i].last && buffers[i].first <= buffers[j].last) overlap.push_back(j);
    std::stable_sort(overlap.begin(), overlap.end(), [&](size_t a, size_t b) { return offset[a] < offset[b]; });
    int64_t best = -1, best_gap = INT64_MAX, cursor = 0;
    for (size_t j : overlap) {
      const int64_t gap = offset[j] - cursor;
      if (gap >= buffers[i].bytes && gap < best_gap) {
        best = cursor;
        best_gap = gap;
      }
      cursor = std::max(cursor, offset[j] + buffers[j].bytes);
    }
    offset[i] = best >= 0 ? best : cursor;
    placed.push_back(i);
  }
  return offset;
}

// Long programs, where the planner compares a buffer only with the placed buffers in the stretches
// of steps it touches: every offset is the one the definition gives.
TEST(MemoryPlan, PlacementOfLongProgramsIsTheGreedyDefinition) {
  for (uint32_t seed = 0; seed < 12; ++seed) {
    const Graph g = random_graph(1000 + seed, 400 + static_cast<int>(seed * 150));
    const MemoryPlan p = plan_memory(g, default_schedule(g));
    ASSERT_EQ(verify_plan(g, p), "") << "seed " << seed;
    const std::vector<int64_t> expected = greedy_offsets(p.buffers);
    int64_t arena = 0;
    for (size_t i = 0; i < p.buffers.size(); ++i) {
      ASSERT_EQ(p.buffers[i].offset, expected[i]) << "seed " << seed << ", buffer " << i;
      arena = std::max(arena, expected[i] + p.buffers[i].bytes);
    }
    EXPECT_EQ(p.arena_bytes, arena);
  }
}

TEST(MemoryPlan, ViewsAliasTheirRootAndExtendItsLife) {
  Graph g;
  const ValueId x = g.add_input("x", Shape{4, 8}, DType::f32);
  const ValueId a = g.node(g.add_node(OpKind::silu, {x}, NoAttrs{}, "", Phase::forward)).out[0];
  const ValueId v = g.node(g.add_node(OpKind::reshape, {a}, ShapeAttrs{Shape{32}}, "", Phase::forward)).out[0];
  const ValueId b = g.node(g.add_node(OpKind::gelu, {x}, NoAttrs{}, "", Phase::forward)).out[0];
  const ValueId c = g.node(g.add_node(OpKind::silu, {v}, NoAttrs{}, "", Phase::forward)).out[0];
  g.mark_output(c);
  g.mark_output(b);
  const MemoryPlan p = plan_memory(g, default_schedule(g));
  EXPECT_EQ(verify_plan(g, p), "");
  EXPECT_EQ(p.value_root[v], a);
  EXPECT_EQ(p.value_offset[v], p.value_offset[a]);
  // a is read (through v) at step 3, so it must not share bytes with b (live at step 2..3).
  EXPECT_NE(p.value_offset[a], p.value_offset[b]);
  for (const BufferInfo& bi : p.buffers) {
    EXPECT_NE(bi.value, v) << "a view must not own storage";
    if (bi.value == a) {
      EXPECT_EQ(bi.last, 3);
    }
  }
}

TEST(MemoryPlan, DeadBuffersAreReused) {
  // A chain x -> silu -> silu -> ... : only two buffers are ever live at once.
  Graph g;
  ValueId cur = g.add_input("x", Shape{1024}, DType::f32);
  for (int i = 0; i < 10; ++i) cur = g.node(g.add_node(OpKind::silu, {cur}, NoAttrs{}, "", Phase::forward)).out[0];
  g.mark_output(cur);
  const MemoryPlan p = plan_memory(g, default_schedule(g));
  EXPECT_EQ(verify_plan(g, p), "");
  EXPECT_EQ(p.lower_bound_bytes, 2 * 1024 * 4);
  EXPECT_EQ(p.arena_bytes, 2 * 1024 * 4);
}

TEST(MemoryPlan, InplaceOpsReuseTheirDyingInput) {
  // x -> silu -> gelu -> cast(bf16) -> cast(f32)... : in place, the f32 chain needs one buffer.
  Graph g;
  const ValueId x = g.add_input("x", Shape{256}, DType::f32);
  ValueId a =
      g.node(g.add_node(OpKind::dense,
                        {g.add_input("x2", Shape{1, 256}, DType::f32), g.add_input("w", Shape{256, 256}, DType::f32)},
                        DenseAttrs{DType::f32}, "", Phase::forward))
          .out[0];
  a = g.node(g.add_node(OpKind::silu, {a}, NoAttrs{}, "", Phase::forward)).out[0];
  a = g.node(g.add_node(OpKind::gelu, {a}, NoAttrs{}, "", Phase::forward)).out[0];
  const ValueId shared = g.node(g.add_node(OpKind::silu, {a}, NoAttrs{}, "", Phase::forward)).out[0];
  const ValueId y = g.node(g.add_node(OpKind::add, {shared, shared}, NoAttrs{}, "", Phase::forward)).out[0];
  g.mark_output(y);
  (void)x;
  const MemoryPlan in = plan_memory(g, default_schedule(g), PlanOptions{true, true, {}});
  const MemoryPlan out = plan_memory(g, default_schedule(g), PlanOptions{false, true, {}});
  EXPECT_EQ(verify_plan(g, in), "");
  // In place, dense -> silu -> gelu -> silu is one buffer; add(s, s) reads s twice, so it may
  // not write over it. Without in-place reuse every step of the chain needs a second buffer.
  EXPECT_EQ(in.value_root[shared], g.node(0).out[0]);
  EXPECT_NE(in.value_root[y], in.value_root[shared]);
  EXPECT_EQ(in.arena_bytes, 2 * 1024);
  EXPECT_EQ(out.arena_bytes, 2 * 1024);
  for (size_t s = 1; s + 1 < in.live_bytes.size(); ++s) {
    EXPECT_EQ(in.live_bytes[s], 1024) << "step " << s;  // one buffer through the unary chain
    EXPECT_EQ(out.live_bytes[s], 2048) << "step " << s;
  }
}

TEST(MemoryPlan, PersistentValuesStayOutOfTheArena) {
  Graph g;
  const ValueId x = g.add_input("x", Shape{2, 3}, DType::f32);
  const ValueId w = g.add_param("w", Shape{3, 5}, {});
  const ValueId y = g.node(g.add_node(OpKind::dense, {x, w}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
  const ValueId lab = g.add_input("labels", Shape{2}, DType::i32);
  const ValueId loss = g.node(g.add_node(OpKind::cross_entropy, {y, lab}, NoAttrs{}, "", Phase::forward)).out[0];
  const ValueId seed = g.add_input("seed", Shape{}, DType::f32);
  build_backward(g, loss, seed);
  const MemoryPlan p = plan_memory(g, default_schedule(g));
  EXPECT_EQ(verify_plan(g, p), "");
  EXPECT_EQ(p.value_offset[x], -1);
  EXPECT_EQ(p.value_offset[w], -1);
  EXPECT_EQ(p.value_offset[g.grad_of(w)], -1);
  EXPECT_EQ(p.param_bytes, 15 * 4);
  EXPECT_EQ(p.grad_bytes, 15 * 4);
  EXPECT_GE(p.value_offset[y], 0);
}

TEST(MemoryPlan, GradientsWithAReleaseStepLiveInTheArenaUntilThen) {
  // Sharded gradients (optimizer.shard = state+grads): a gradient is working memory from its first
  // write to its release step (its bucket's sum over ranks), the others stay persistent.
  Graph g;
  const ValueId x = g.add_input("x", Shape{2, 3}, DType::f32);
  const ValueId w = g.add_param("w", Shape{3, 5}, {});
  const ValueId b = g.add_param("b", Shape{5}, {});
  const ValueId unused = g.add_param("unused", Shape{7}, {});
  ValueId y = g.node(g.add_node(OpKind::dense, {x, w}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
  y = g.node(g.add_node(OpKind::add, {y, b}, NoAttrs{}, "", Phase::forward)).out[0];
  add_loss_and_backward(g, y, 2);
  const std::vector<NodeId> schedule = default_schedule(g);
  const auto first_write = [&](ValueId grad) {
    for (size_t s = 0; s < schedule.size(); ++s)
      if (g.node(schedule[s]).in[0] == grad && (op_info(g.node(schedule[s]).op).flags & kOpWritesGrad))
        return static_cast<int32_t>(s);
    return -1;
  };
  const auto last = static_cast<int32_t>(schedule.size()) - 1;
  PlanOptions opts;
  opts.grad_release.assign(g.values().size(), -1);
  opts.grad_release[g.grad_of(w)] = last;  // past its write
  opts.grad_release[g.grad_of(unused)] = 1;
  const ValueId gb = g.grad_of(b);
  const MemoryPlan p = plan_memory(g, schedule, opts);
  EXPECT_EQ(verify_plan(g, p), "");
  EXPECT_EQ(p.value_offset[gb], -1);
  EXPECT_EQ(p.grad_bytes, 5 * 4);  // only b's gradient is persistent
  ASSERT_GE(first_write(g.grad_of(w)), 0);
  ASSERT_EQ(first_write(g.grad_of(unused)), -1);
  for (const auto& [grad, first, until] :
       {std::tuple{g.grad_of(w), first_write(g.grad_of(w)), last}, std::tuple{g.grad_of(unused), 0, 1}}) {
    EXPECT_GE(p.value_offset[grad], 0);
    const auto it =
        std::find_if(p.buffers.begin(), p.buffers.end(), [&](const BufferInfo& bi) { return bi.value == grad; });
    ASSERT_NE(it, p.buffers.end());
    EXPECT_EQ(it->first, first) << "from its first write (never written: from step 0)";
    EXPECT_EQ(it->last, until);
  }
}

TEST(MemoryPlan, GatheredParametersLiveInTheArenaOverEachIntervalOfTheirUses) {
  // Sharded parameters (optimizer.shard = params): a parameter is working memory, one buffer over
  // its forward uses and one over its backward uses, never persistent. (w2, the last layer, keeps
  // one buffer over both: MemoryPlan.TheHeadsKernelIsGatheredOnceWhereForwardMeetsBackward.)
  Graph g;
  const ValueId x = g.add_input("x", Shape{2, 3}, DType::f32);
  const ValueId w1 = g.add_param("w1", Shape{3, 5}, {});
  const ValueId w2 = g.add_param("w2", Shape{5, 4}, {});
  const ValueId unused = g.add_param("unused", Shape{7}, {});
  ValueId y = g.node(g.add_node(OpKind::dense, {x, w1}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
  y = g.node(g.add_node(OpKind::dense, {y, w2}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
  add_loss_and_backward(g, y, 2);
  const std::vector<NodeId> schedule = default_schedule(g);
  PlanOptions opts;
  opts.gather_params = true;
  const MemoryPlan p = plan_memory(g, schedule, opts);
  EXPECT_EQ(verify_plan(g, p), "");
  EXPECT_EQ(p.param_bytes, 0);
  for (const ValueId w : {w1, unused}) {
    EXPECT_TRUE(p.gathered[w]);
    EXPECT_EQ(p.value_offset[w], -1);
    // The steps that read w, forward and not; each set is one buffer's live range exactly.
    std::vector<int32_t> reads[2];
    for (size_t s = 0; s < schedule.size(); ++s)
      for (ValueId v : g.node(schedule[s]).in)
        if (v == w) reads[g.node(schedule[s]).phase == Phase::forward].push_back(static_cast<int32_t>(s));
    std::vector<BufferInfo> mine;
    for (const BufferInfo& b : p.buffers)
      if (b.value == w) mine.push_back(b);
    size_t k = 0;
    for (const bool forward : {true, false}) {
      const std::vector<int32_t>& r = reads[forward];
      if (r.empty()) continue;
      ASSERT_LT(k, mine.size());
      EXPECT_TRUE(mine[k].gathered);
      EXPECT_EQ(mine[k].first_use, r.front());
      EXPECT_LE(mine[k].first, mine[k].first_use) << "live from its first use or before (prefetch)";
      EXPECT_EQ(mine[k].last, r.back());
      ++k;
    }
    EXPECT_EQ(k, mine.size()) << "one buffer per interval of uses";
  }
  const auto buffers_of = [&](ValueId w) {
    return std::count_if(p.buffers.begin(), p.buffers.end(), [&](const BufferInfo& b) { return b.value == w; });
  };
  EXPECT_TRUE(p.gathered[w2]);
  EXPECT_EQ(buffers_of(w2), 1) << "read by the forward and by the input gradient's product, nothing between";
  EXPECT_EQ(buffers_of(unused), 0);
}

TEST(MemoryPlan, TheHeadsKernelIsGatheredOnceWhereForwardMeetsBackward) {
  // The last layer's kernel (a head, tied or not) is the forward's last gathered read and the
  // backward's first: no other parameter is read in between, so one buffer spans both and one
  // gather fills it. A middle layer's kernel is read by both phases with other layers' kernels in
  // between: two buffers. The head's bytes are live once at the boundary, not twice (the backward
  // copy prefetched while the forward copy is still live).
  Graph g;
  ValueId y = g.add_input("x", Shape{8, 16}, DType::f32);
  std::vector<ValueId> ws;
  for (const auto& [name, rows, cols] : {std::tuple{"w1", 16, 32}, std::tuple{"w2", 32, 32}, std::tuple{"head", 32, 256}}) {
    ws.push_back(g.add_param(name, Shape{rows, cols}, {}));
    y = g.node(g.add_node(OpKind::dense, {y, ws.back()}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
    if (ws.size() < 3) y = g.node(g.add_node(OpKind::silu, {y}, NoAttrs{}, "", Phase::forward)).out[0];
  }
  add_loss_and_backward(g, y, 8);
  const std::vector<NodeId> schedule = default_schedule(g);
  PlanOptions opts;
  opts.gather_params = true;
  opts.gather_ahead = 1;
  const MemoryPlan p = plan_memory(g, schedule, opts);
  ASSERT_EQ(verify_plan(g, p), "");
  const ValueId head = ws[2], w2 = ws[1];
  int32_t head_fwd = -1, head_bwd = -1;  // the head's first forward read and last backward read
  for (int32_t s = 0; s < static_cast<int32_t>(schedule.size()); ++s)
    for (ValueId v : g.node(schedule[static_cast<size_t>(s)]).in)
      if (v == head) {
        if (g.node(schedule[static_cast<size_t>(s)]).phase == Phase::forward && head_fwd < 0) head_fwd = s;
        if (g.node(schedule[static_cast<size_t>(s)]).phase != Phase::forward) head_bwd = s;
      }
  ASSERT_GE(head_fwd, 0);
  ASSERT_GT(head_bwd, head_fwd) << "the head is read by the backward (the input gradient's product)";
  std::vector<BufferInfo> mine;
  for (const BufferInfo& b : p.buffers)
    if (b.value == head) mine.push_back(b);
  ASSERT_EQ(mine.size(), 1u) << "one gathered buffer (one gather) for the head's forward and backward reads";
  EXPECT_EQ(mine[0].first_use, head_fwd);
  EXPECT_EQ(mine[0].last, head_bwd);
  EXPECT_EQ(std::count_if(p.buffers.begin(), p.buffers.end(), [&](const BufferInfo& b) { return b.value == w2; }), 2)
      << "w2's backward read comes after the head's: two intervals";
  // Gathered bytes live at any step: never the head twice.
  const int64_t head_bytes = g.value(head).bytes(), others = g.value(ws[0]).bytes() + g.value(w2).bytes() * 2;
  for (size_t s = 0; s < schedule.size(); ++s) {
    int64_t live = 0;
    for (const BufferInfo& b : p.buffers)
      if (b.gathered && b.first <= static_cast<int32_t>(s) && static_cast<int32_t>(s) <= b.last) live += b.bytes;
    EXPECT_LT(live, 2 * head_bytes) << "step " << s;
    EXPECT_LE(live, head_bytes + others) << "step " << s;
  }
}

TEST(MemoryPlan, APrefetchedGatherStartsAtThePreviousGathersFirstUse) {
  // Four dense layers of different widths and their backward: every parameter's forward and
  // backward buffers, in order of first use. With PlanOptions::gather_ahead = 1 each (but the
  // first) is live from the first use of the one before it, so that its gather overlaps the
  // kernels in between; its uses and its end do not move, and the plan counts the early bytes.
  Graph g;
  ValueId y = g.add_input("x", Shape{8, 16}, DType::f32);
  int64_t largest = 0;
  for (const auto& [name, rows, cols] : {std::tuple{"w1", 16, 64}, std::tuple{"w2", 64, 32}, std::tuple{"w3", 32, 128},
                                         std::tuple{"w4", 128, 8}}) {
    const ValueId w = g.add_param(name, Shape{rows, cols}, {});
    largest = std::max(largest, g.value(w).bytes());
    y = g.node(g.add_node(OpKind::dense, {y, w}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
    y = g.node(g.add_node(OpKind::silu, {y}, NoAttrs{}, "", Phase::forward)).out[0];
  }
  add_loss_and_backward(g, y, 8);
  const auto plan = [&](int32_t ahead) {
    PlanOptions opts;
    opts.gather_params = true;
    opts.gather_ahead = ahead;
    MemoryPlan p = plan_memory(g, default_schedule(g), opts);
    EXPECT_EQ(verify_plan(g, p), "") << "gather_ahead " << ahead;
    return p;
  };
  const auto gathered = [](const MemoryPlan& p) {
    std::vector<BufferInfo> out;
    for (const BufferInfo& b : p.buffers)
      if (b.gathered) out.push_back(b);
    std::stable_sort(out.begin(), out.end(), [](const BufferInfo& a, const BufferInfo& b) { return a.first_use < b.first_use; });
    return out;
  };
  const MemoryPlan at_use = plan(0), ahead = plan(1);
  const std::vector<BufferInfo> before = gathered(at_use), after = gathered(ahead);
  ASSERT_EQ(before.size(), 6u) << "4 parameters gathered for the forward, w2 and w3 again for the backward (x has "
                                  "no gradient; w4's forward buffer spans its backward read)";
  ASSERT_EQ(after.size(), before.size());
  int early = 0;
  for (size_t k = 0; k < after.size(); ++k) {
    EXPECT_EQ(before[k].first, before[k].first_use) << "gather_ahead = 0: live from its first use";
    EXPECT_EQ(after[k].value, before[k].value);
    EXPECT_EQ(after[k].first_use, before[k].first_use);
    EXPECT_EQ(after[k].last, before[k].last);
    EXPECT_EQ(after[k].first, k == 0 ? after[k].first_use : after[k - 1].first_use) << "gathered buffer " << k;
    early += after[k].first < after[k].first_use;
  }
  EXPECT_EQ(early, 5) << "every gather but the first is in flight while kernels run";
  // Their prefetch windows never overlap: at most one parameter's bytes more at any step.
  const int64_t grown = ahead.lower_bound_bytes - at_use.lower_bound_bytes;
  std::printf("gather_ahead 1: live-bytes peak +%lld, arena %lld -> %lld bytes; largest parameter %lld\n",
              static_cast<long long>(grown), static_cast<long long>(at_use.arena_bytes),
              static_cast<long long>(ahead.arena_bytes), static_cast<long long>(largest));
  EXPECT_GT(grown, 0) << "the early bytes are counted";
  EXPECT_LE(grown, largest);
  for (size_t s = 0; s < ahead.live_bytes.size(); ++s)
    EXPECT_LE(ahead.live_bytes[s] - at_use.live_bytes[s], largest) << "step " << s;
  EXPECT_LE(ahead.arena_bytes - at_use.arena_bytes, largest);
  // Further ahead: more in flight at once, the same uses.
  const std::vector<BufferInfo> two = gathered(plan(2));
  for (size_t k = 2; k < two.size(); ++k) EXPECT_EQ(two[k].first, two[k - 2].first_use) << "gathered buffer " << k;
}

TEST(MemoryPlan, WithAPrefetchTheFirstUsesGatherIsLiveFromStepZero) {
  // The first gathered use has no earlier use to prefetch from: with any prefetch its buffers live
  // from step 0, where the trainer may have started their gathers before the run (during the
  // previous step's update), even though step 0 reads no parameter; without prefetch, from their use.
  Graph g;
  ValueId y = g.add_input("x", Shape{8, 16}, DType::f32);
  y = g.node(g.add_node(OpKind::silu, {y}, NoAttrs{}, "", Phase::forward)).out[0];
  const ValueId w = g.add_param("w", Shape{16, 64}, {});
  const ValueId b = g.add_param("b", Shape{64}, {});
  y = g.node(g.add_node(OpKind::dense, {y, w, b}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
  add_loss_and_backward(g, y, 8);
  for (const int32_t ahead : {0, 1, 2}) {
    PlanOptions opts;
    opts.gather_params = true;
    opts.gather_ahead = ahead;
    const MemoryPlan p = plan_memory(g, default_schedule(g), opts);
    EXPECT_EQ(verify_plan(g, p), "") << "gather_ahead " << ahead;
    int first_uses = 0;
    for (const BufferInfo& bi : p.buffers)
      if (bi.gathered && bi.first_use == 1) {
        ++first_uses;
        EXPECT_EQ(bi.first, ahead == 0 ? 1 : 0) << "gather_ahead " << ahead << ": " << g.value(bi.value).name;
      }
    EXPECT_EQ(first_uses, 2) << "the dense at step 1 reads w and b";
    if (ahead > 0) EXPECT_GE(p.live_bytes[0], g.value(w).bytes() + g.value(b).bytes()) << "counted at step 0";
  }
}

TEST(MemoryPlan, EveryParameterANodeReadsIsPrefetchedTogether) {
  // Three dense layers with a kernel and a bias each: the node reads two gathered parameters,
  // first used at the same step. With gather_ahead = 1 both start at the previous use's first
  // step (not only the first of them: a bias gathered at its use would block the node); with 2,
  // at the one two uses before, and the first two uses at the first.
  Graph g;
  ValueId y = g.add_input("x", Shape{8, 16}, DType::f32);
  for (const auto& [name, rows, cols] : {std::tuple{"l1", 16, 64}, std::tuple{"l2", 64, 32}, std::tuple{"l3", 32, 8}}) {
    const ValueId w = g.add_param(std::string(name) + ".kernel", Shape{rows, cols}, {});
    const ValueId b = g.add_param(std::string(name) + ".bias", Shape{cols}, {});
    y = g.node(g.add_node(OpKind::dense, {y, w, b}, DenseAttrs{DType::f32}, "", Phase::forward)).out[0];
    y = g.node(g.add_node(OpKind::silu, {y}, NoAttrs{}, "", Phase::forward)).out[0];
  }
  add_loss_and_backward(g, y, 8);
  for (const int32_t ahead : {1, 2}) {
    PlanOptions opts;
    opts.gather_params = true;
    opts.gather_ahead = ahead;
    const MemoryPlan p = plan_memory(g, default_schedule(g), opts);
    EXPECT_EQ(verify_plan(g, p), "") << "gather_ahead " << ahead;
    std::vector<int32_t> uses;  // the first uses of the gathered buffers, ascending, once each
    for (const BufferInfo& b : p.buffers)
      if (b.gathered) uses.push_back(b.first_use);
    std::sort(uses.begin(), uses.end());
    uses.erase(std::unique(uses.begin(), uses.end()), uses.end());
    int shared = 0;  // buffers whose first use another buffer shares
    for (const BufferInfo& b : p.buffers) {
      if (!b.gathered) continue;
      const auto u = static_cast<size_t>(std::lower_bound(uses.begin(), uses.end(), b.first_use) - uses.begin());
      EXPECT_EQ(b.first, uses[u - std::min<size_t>(u, static_cast<size_t>(ahead))])
          << "gather_ahead " << ahead << ": " << g.value(b.value).name << " first used at step " << b.first_use;
      shared += std::count_if(p.buffers.begin(), p.buffers.end(), [&](const BufferInfo& o) {
                  return o.gathered && &o != &b && o.first_use == b.first_use;
                }) > 0;
    }
    EXPECT_EQ(shared, 6) << "each forward dense reads its kernel and its bias";
  }
}

}  // namespace
}  // namespace loom
