// The profiler's recorder (docs/profiling.md): fixed-size timing events written into vectors
// allocated before the profiled steps, so recording costs two clock reads and a store per node —
// no allocation, no strings. Names, scopes, shapes and costs are attached afterwards from the
// graph and the memory plan (runtime/profiler.h).
//
// Two kinds of events:
//   - OpEvent: one executed node — its schedule step and when it ran (Executor::run_steps);
//   - SpanEvent: a span the trainer marks around executor runs (train step, minibatch, optimizer),
//     or one gradient bucket's sum over ranks from its start to its completion (communication:
//     it runs alongside the backward's ops, on a track of its own).
// Times are Backend::now_us(). On an asynchronous backend every reading synchronizes first, so a
// node's interval is its execution, not its launch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace loom {

struct OpEvent {
  int32_t step = 0;  // index into the plan's schedule
  double t_begin_us = 0, t_end_us = 0;
};

enum class SpanKind : uint8_t { train_step, minibatch, optimizer, communication };
const char* span_kind_name(SpanKind);

struct SpanEvent {
  SpanKind kind = SpanKind::train_step;
  int64_t index = 0;                     // train step number (1-based, as logged), minibatch or bucket index (0-based)
  double t_begin_us = 0, t_end_us = -1;  // t_end_us < 0 while the span is open
};

class OpRecorder {
 public:
  // Preallocates room for `op_capacity` op events and `span_capacity` spans. Events past the
  // capacity are dropped (counted, never reallocated).
  OpRecorder(Backend& be, size_t op_capacity, size_t span_capacity);

  // The clock, synchronizing first on an asynchronous backend.
  double now_us() const {
    if (async_) be_.synchronize();
    return be_.now_us();
  }
  bool asynchronous() const { return async_; }

  // Hot path (Executor::run_steps): one store.
  void record_op(int32_t step, double t_begin_us, double t_end_us) {
    if (num_ops_ < ops_.size())
      ops_[num_ops_++] = OpEvent{.step = step, .t_begin_us = t_begin_us, .t_end_us = t_end_us};
    else
      ++dropped_;
  }
  // Opens a span now; returns its id for end_span (-1 when the span buffer is full).
  int32_t begin_span(SpanKind kind, int64_t index);
  void end_span(int32_t id);

  std::span<const OpEvent> ops() const { return {ops_.data(), num_ops_}; }
  std::span<const SpanEvent> spans() const { return {spans_.data(), num_spans_}; }
  size_t dropped() const { return dropped_; }
  // Forgets every event (the capacity stays).
  void clear() { num_ops_ = num_spans_ = dropped_ = 0; }
  Backend& backend() const { return be_; }

 private:
  Backend& be_;
  bool async_;
  std::vector<OpEvent> ops_;
  std::vector<SpanEvent> spans_;
  size_t num_ops_ = 0, num_spans_ = 0, dropped_ = 0;
};

// Marks a span from construction to destruction when `r` is set; does nothing otherwise.
class ScopedSpan {
 public:
  ScopedSpan(OpRecorder* r, SpanKind kind, int64_t index) : r_(r), id_(r ? r->begin_span(kind, index) : -1) {}
  ~ScopedSpan() {
    if (r_) r_->end_span(id_);
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  OpRecorder* r_;
  int32_t id_;
};

}  // namespace loom
