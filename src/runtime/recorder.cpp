#include "runtime/recorder.h"

namespace loom {

const char* span_kind_name(SpanKind k) {
  switch (k) {
    case SpanKind::train_step:
      return "train_step";
    case SpanKind::minibatch:
      return "minibatch";
    case SpanKind::optimizer:
      return "optimizer";
    case SpanKind::communication:
      return "communication";
  }
  return "?";
}

OpRecorder::OpRecorder(Backend& be, size_t op_capacity, size_t span_capacity)
    : be_(be), async_(be.asynchronous()), ops_(op_capacity), spans_(span_capacity) {}

int32_t OpRecorder::begin_span(SpanKind kind, int64_t index) {
  if (num_spans_ == spans_.size()) {
    ++dropped_;
    return -1;
  }
  spans_[num_spans_] = SpanEvent{.kind = kind, .index = index, .t_begin_us = now_us(), .t_end_us = -1};
  return static_cast<int32_t>(num_spans_++);
}

void OpRecorder::end_span(int32_t id) {
  if (id >= 0 && static_cast<size_t>(id) < num_spans_) spans_[static_cast<size_t>(id)].t_end_us = now_us();
}

}  // namespace loom
