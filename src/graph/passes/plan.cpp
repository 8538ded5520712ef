#include "graph/passes/plan.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace loom {

namespace {
int64_t align_up(int64_t x) { return (x + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }
std::string describe(const BufferInfo& b) {
  return b.value == kNoValue ? "the workspace of step " + std::to_string(b.first) : "value %" + std::to_string(b.value);
}
}  // namespace

std::vector<NodeId> default_schedule(const Graph& g) {
  std::vector<NodeId> s(g.nodes().size());
  std::iota(s.begin(), s.end(), 0);
  return s;
}

MemoryPlan plan_memory(const Graph& g, std::vector<NodeId> schedule, PlanOptions opts,
                       const WorkspaceNeeds& workspace) {
  MemoryPlan p;
  p.schedule = std::move(schedule);
  const size_t nv = g.values().size();
  const int32_t nsteps = static_cast<int32_t>(p.schedule.size());
  p.value_offset.assign(nv, -1);
  p.value_root.resize(nv);
  std::iota(p.value_root.begin(), p.value_root.end(), 0);

  LOOM_ASSERT(opts.grad_release.empty() || opts.grad_release.size() == nv, "one release step per value");
  // Whether value v is placed in the arena: activations, and gradients with a release step.
  const auto planned = [&](ValueId v) {
    const ValueKind k = g.value(v).kind;
    return k == ValueKind::activation ||
           (k == ValueKind::grad && !opts.grad_release.empty() && opts.grad_release[static_cast<size_t>(v)] >= 0);
  };
  p.gathered.assign(nv, 0);
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v) {
    const Value& val = g.value(v);
    if (val.kind == ValueKind::param && opts.gather_params) p.gathered[static_cast<size_t>(v)] = 1;
    if (val.kind == ValueKind::param && !opts.gather_params) p.param_bytes += val.bytes();
    if (val.kind == ValueKind::grad && !planned(v)) p.grad_bytes += val.bytes();
    if (val.kind == ValueKind::input) p.input_bytes += val.bytes();
  }

  // Live ranges of storage roots (views share their source's storage).
  std::vector<int32_t> first(nv, -1), last(nv, -1);
  auto compute_ranges = [&] {
    std::fill(first.begin(), first.end(), -1);
    std::fill(last.begin(), last.end(), -1);
    for (int32_t s = 0; s < nsteps; ++s) {
      const Node& n = g.node(p.schedule[s]);
      for (ValueId o : n.out) {
        const ValueId r = p.value_root[o];
        if (first[r] < 0) first[r] = s;
        last[r] = std::max(last[r], s);
      }
      for (ValueId i : n.in) {
        const ValueId r = p.value_root[i];
        // A planned gradient is input 0 of its writers (kOpWritesGrad): the first of them starts it.
        if (g.value(r).kind == ValueKind::grad && first[r] < 0) first[r] = s;
        LOOM_ASSERT(g.value(r).kind != ValueKind::activation || first[r] >= 0,
                    "schedule reads a value before it is produced");
        last[r] = std::max(last[r], s);
      }
    }
    for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
      if (g.value(v).is_output && first[p.value_root[v]] >= 0) last[p.value_root[v]] = nsteps - 1;
    for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
      if (g.value(v).kind == ValueKind::grad && planned(v)) {
        if (first[v] < 0) first[v] = 0;  // never written: zero from the start
        last[v] = std::min(nsteps - 1, std::max({last[v], first[v], opts.grad_release[static_cast<size_t>(v)]}));
      }
  };
  for (int32_t s = 0; s < nsteps; ++s) {
    const Node& n = g.node(p.schedule[s]);
    if (op_info(n.op).flags & kOpView) p.value_root[n.out[0]] = p.value_root[n.in[0]];
  }
  compute_ranges();
  if (opts.inplace) {
    // An in-place output joins the dying input's storage; that storage then lives as long as
    // the output does. Walking in schedule order makes chains (a -> b -> c in place) work.
    for (int32_t s = 0; s < nsteps; ++s) {
      const Node& n = g.node(p.schedule[s]);
      if (!(op_info(n.op).flags & kOpInplace)) continue;
      const ValueId o = n.out[0];
      if (g.value(o).is_output) continue;
      for (ValueId i : n.in) {
        const ValueId r = p.value_root[i];
        if (g.value(r).kind != ValueKind::activation || last[r] != s || g.value(r).is_output) continue;
        if (g.value(r).bytes() != g.value(o).bytes()) continue;
        if (std::count(n.in.begin(), n.in.end(), i) > 1) continue;  // add(x, x): x is read twice
        // Every value rooted at o (o and its views, which come later) moves to r.
        for (ValueId v = o; v < static_cast<ValueId>(nv); ++v)
          if (p.value_root[v] == o) p.value_root[v] = r;
        last[r] = std::max(last[r], last[o]);
        break;
      }
    }
    compute_ranges();
  }

  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
    if (planned(v) && p.value_root[v] == v && first[v] >= 0)
      p.buffers.push_back(BufferInfo{v, -1, align_up(g.value(v).bytes()), first[v], last[v]});
  if (opts.gather_params) {
    // Intervals of each parameter's uses (through views too): forward, then backward with recompute,
    // one interval when no other gathered parameter is read between the last forward use and the
    // first backward one (the head's kernel): one gather, not two copies live at that boundary.
    const auto other_read_between = [&](ValueId r, int32_t from, int32_t to) {
      for (int32_t t = from + 1; t < to; ++t)
        for (ValueId i : g.node(p.schedule[t]).in)
          if (const ValueId o = p.value_root[i]; o != r && p.gathered[static_cast<size_t>(o)]) return true;
      return false;
    };
    std::vector<int32_t> open(nv, -1);      // per parameter: its current interval's buffer
    std::vector<char> open_forward(nv, 0);  // per parameter: whether that interval's last use is forward
    for (int32_t s = 0; s < nsteps; ++s) {
      const Node& n = g.node(p.schedule[s]);
      const bool forward = n.phase == Phase::forward;
      for (ValueId i : n.in) {
        const ValueId r = p.value_root[i];
        if (!p.gathered[static_cast<size_t>(r)]) continue;
        int32_t& b = open[static_cast<size_t>(r)];
        char& was_forward = open_forward[static_cast<size_t>(r)];
        const bool same = b >= 0 && ((was_forward != 0) == forward ||
                                     !other_read_between(r, p.buffers[static_cast<size_t>(b)].last, s));
        was_forward = forward;
        if (same) {
          p.buffers[static_cast<size_t>(b)].last = s;
          continue;
        }
        b = static_cast<int32_t>(p.buffers.size());
        p.buffers.push_back(BufferInfo{.value = r,
                                       .offset = -1,
                                       .bytes = align_up(g.value(r).bytes()),
                                       .first = s,
                                       .last = s,
                                       .gathered = true,
                                       .first_use = s});
      }
    }
    // Made in order of first use (the loop above): the buffers a step first reads (a kernel and
    // its bias) start together, where the use gather_ahead uses earlier is first read; with a
    // prefetch, the first use's at step 0 (their gathers start before the run).
    LOOM_ASSERT(opts.gather_ahead >= 0, "gather_ahead counts uses");
    std::vector<int32_t> uses;  // the distinct first uses, ascending
    for (const BufferInfo& b : p.buffers)
      if (b.gathered && (uses.empty() || uses.back() != b.first_use)) uses.push_back(b.first_use);
    const auto ahead = static_cast<size_t>(opts.gather_ahead);
    for (size_t u = 0, b = 0; b < p.buffers.size(); ++b)
      if (p.buffers[b].gathered) {
        while (uses[u] != p.buffers[b].first_use) ++u;
        p.buffers[b].first = u == 0 && ahead > 0 ? 0 : uses[u - std::min(u, ahead)];
      }
  }
  LOOM_ASSERT(workspace.bytes.empty() || workspace.bytes.size() == g.nodes().size(), "one workspace size per node");
  p.workspace_threads = workspace.threads;
  p.workspace_offset.assign(nsteps, -1);
  p.workspace_bytes.assign(nsteps, 0);
  if (!workspace.bytes.empty())
    for (int32_t s = 0; s < nsteps; ++s)
      if (const int64_t w = workspace.bytes[p.schedule[s]]; w > 0) {
        p.workspace_bytes[s] = w;
        p.buffers.push_back(BufferInfo{.value = kNoValue, .offset = -1, .bytes = align_up(w), .first = s, .last = s});
      }
  LOOM_ASSERT(workspace.library.empty() || workspace.library.size() == g.nodes().size(), "one library size per node");
  if (!workspace.library.empty())
    for (const NodeId n : p.schedule) p.library_bytes = std::max(p.library_bytes, workspace.library[n]);

  // Greedy by size: large buffers first, each into the smallest gap that fits among the
  // already-placed buffers whose live ranges overlap it.
  std::vector<size_t> order(p.buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (p.buffers[a].bytes != p.buffers[b].bytes) return p.buffers[a].bytes > p.buffers[b].bytes;
    return p.buffers[a].first < p.buffers[b].first;
  });
  if (!opts.reuse) {  // the unplanned baseline: buffers laid end to end, none shares a byte
    for (BufferInfo& b : p.buffers) {
      b.offset = p.arena_bytes;
      p.arena_bytes += b.bytes;
    }
    order.clear();
  }
  // The placed buffers sorted by offset (of equal offsets, the earlier placed first): all of them,
  // in blocks of at most kBlock (an insertion moves one block), and those of each stretch of
  // kStretch steps their live ranges touch. A buffer is compared with those of the stretch it lies
  // in, or of the stretches it touches (gathered and sorted) when they are few beside all, else
  // with all: placement grows with the buffers live at once rather than with all of them.
  constexpr int32_t kStretch = 16;
  constexpr size_t kBlock = 256;
  struct Placed {
    int64_t offset, end;
    int32_t first, last;
    size_t rank;  // place in the order
  };
  std::vector<std::vector<Placed>> all(1);
  size_t placed = 0;
  std::vector<Placed> overlap;
  std::vector<std::vector<Placed>> near(static_cast<size_t>(nsteps / kStretch + 1));
  std::vector<size_t> seen(order.size(), SIZE_MAX);
  auto by_offset = [](const Placed& a, const Placed& c) {
    return a.offset != c.offset ? a.offset < c.offset : a.rank < c.rank;
  };
  for (size_t k = 0; k < order.size(); ++k) {
    BufferInfo& b = p.buffers[order[k]];
    const int32_t first = b.first, last = b.last;
    const size_t t0 = static_cast<size_t>(first / kStretch), t1 = static_cast<size_t>(last / kStretch);
    size_t candidates = 0;
    for (size_t t = t0; t <= t1; ++t) candidates += near[t].size();
    const std::vector<Placed>* scan = nullptr;
    if (t0 == t1) {
      scan = &near[t0];
    } else if (candidates * 16 < placed) {
      overlap.clear();
      for (size_t t = t0; t <= t1; ++t)
        for (const Placed& o : near[t])
          if (seen[o.rank] != k) {
            seen[o.rank] = k;
            overlap.push_back(o);
          }
      std::sort(overlap.begin(), overlap.end(), by_offset);
      scan = &overlap;
    }
    int64_t best = -1, best_gap = INT64_MAX, cursor = 0;
    auto consider = [&](const std::vector<Placed>& list) {
      for (const Placed& o : list) {
        if (o.first > last || first > o.last) continue;
        const int64_t gap = o.offset - cursor;
        if (gap >= b.bytes && gap < best_gap) {
          best = cursor;
          best_gap = gap;
        }
        cursor = std::max(cursor, o.end);
      }
    };
    if (scan)
      consider(*scan);
    else
      for (const std::vector<Placed>& block : all) consider(block);
    b.offset = best >= 0 ? best : cursor;
    p.arena_bytes = std::max(p.arena_bytes, b.offset + b.bytes);
    const Placed self{b.offset, b.offset + b.bytes, first, last, k};
    auto block =
        std::upper_bound(all.begin() + 1, all.end(), self,
                         [&](const Placed& x, const std::vector<Placed>& bl) { return by_offset(x, bl.front()); }) -
        1;
    block->insert(std::upper_bound(block->begin(), block->end(), self, by_offset), self);
    if (block->size() > kBlock) {
      std::vector<Placed> upper(block->begin() + kBlock / 2, block->end());
      block->resize(kBlock / 2);
      all.insert(block + 1, std::move(upper));
    }
    ++placed;
    for (size_t t = t0; t <= t1; ++t)
      near[t].insert(std::upper_bound(near[t].begin(), near[t].end(), self, by_offset), self);
  }
  for (const BufferInfo& b : p.buffers) {
    if (b.value == kNoValue)
      p.workspace_offset[b.first] = b.offset;
    else if (!b.gathered)
      p.value_offset[b.value] = b.offset;
  }
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v)
    if (p.value_root[v] != v) {
      p.value_offset[v] = p.value_offset[p.value_root[v]];
      p.gathered[static_cast<size_t>(v)] = p.gathered[static_cast<size_t>(p.value_root[v])];
    }

  // Live bytes per step (difference array over live ranges).
  std::vector<int64_t> delta(nsteps + 1, 0);
  for (const BufferInfo& b : p.buffers) {
    delta[b.first] += b.bytes;
    delta[b.last + 1] -= b.bytes;
  }
  p.live_bytes.assign(nsteps, 0);
  int64_t run = 0;
  for (int32_t s = 0; s < nsteps; ++s) {
    run += delta[s];
    p.live_bytes[s] = run;
    if (run > p.lower_bound_bytes) {
      p.lower_bound_bytes = run;
      p.peak_step = s;
    }
  }
  return p;
}

std::string verify_plan(const Graph& g, const MemoryPlan& p) {
  for (size_t a = 0; a < p.buffers.size(); ++a) {
    const BufferInfo& x = p.buffers[a];
    if (x.offset < 0 || x.offset + x.bytes > p.arena_bytes) return "buffer outside the arena";
    if (x.offset % kArenaAlignment) return "misaligned buffer";
    for (size_t b = a + 1; b < p.buffers.size(); ++b) {
      const BufferInfo& y = p.buffers[b];
      const bool time = x.first <= y.last && y.first <= x.last;
      const bool space = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      if (time && space)
        return describe(x) + " and " + describe(y) + " are live at the same time and overlap in the arena";
    }
  }
  for (const BufferInfo& b : p.buffers)
    if (b.value == kNoValue &&
        (b.first != b.last || p.workspace_offset[b.first] != b.offset || b.bytes < p.workspace_bytes[b.first]))
      return "the workspace of step " + std::to_string(b.first) + " is not where the plan says";
  for (NodeId n : p.schedule)
    for (ValueId v : g.node(n).in)
      if (g.value(p.value_root[v]).kind == ValueKind::activation && p.value_offset[v] < 0)
        return "an activation read has no storage";
  for (const BufferInfo& b : p.buffers)
    if (b.gathered && !(b.first <= b.first_use && b.first_use <= b.last))
      return "a gathered buffer of " + describe(b) + " is first used outside its live range";
  for (int32_t s = 0; s < static_cast<int32_t>(p.schedule.size()); ++s)
    for (ValueId v : g.node(p.schedule[static_cast<size_t>(s)]).in) {
      if (!p.gathered[static_cast<size_t>(v)]) continue;
      const ValueId r = p.value_root[v];
      if (std::none_of(p.buffers.begin(), p.buffers.end(), [&](const BufferInfo& b) {
            return b.gathered && b.value == r && b.first_use <= s && s <= b.last;
          }))
        return "a gathered parameter read at step " + std::to_string(s) + " has no buffer in use there";
    }
  if (p.arena_bytes < p.lower_bound_bytes) return "arena smaller than the live-bytes lower bound";
  return {};
}

}  // namespace loom
