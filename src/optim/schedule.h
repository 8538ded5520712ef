// Learning-rate schedules with Optax's exact semantics (docs/reference.md, "Optax").
// A schedule maps the optimizer's step count t (0 for the first update) to a learning rate.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/choice.h"

#define LOOM_SCHEDULES(X)                                                                 \
  X(constant, "optimizer.learning_rate at every step")                                    \
  X(warmup_cosine_decay, "linear warmup from init_value, then cosine decay to end_value") \
  X(warmup_exponential_decay, "linear warmup from init_value, then decay_rate per transition_steps")

namespace loom {

LOOM_CHOICE(ScheduleKind, "schedule", LOOM_SCHEDULES)

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::constant;
  double value = 1e-3;      // constant: the rate; warmup schedules: peak_value
  double init_value = 0.0;  // warmup start
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // warmup_cosine_decay: total steps, warmup included
  double end_value = 0.0;   // cosine: final value; exponential: bound when has_end_value
  bool has_end_value = false;
  double exponent = 1.0;         // cosine exponent
  int64_t transition_steps = 1;  // exponential
  double decay_rate = 1.0;       // exponential
  int64_t transition_begin = 0;  // exponential: counted from the end of warmup
  bool staircase = false;        // exponential
};

// Throws UserError (naming `key_prefix` keys) when the spec is invalid, e.g. decay_steps <=
// warmup_steps for warmup_cosine_decay, which Optax rejects too.
void validate_schedule(const ScheduleSpec& s, const std::string& key_prefix);
double schedule_value(const ScheduleSpec& s, int64_t t);

// The building blocks, exposed for tests against Optax.
double optax_linear(double init, double end, int64_t transition_steps, int64_t transition_begin, int64_t t);
double optax_cosine_decay(double init, int64_t decay_steps, double alpha, double exponent, int64_t t);
double optax_exponential_decay(double init, int64_t transition_steps, double rate, int64_t transition_begin,
                               bool staircase, std::optional<double> end_value, int64_t t);

}  // namespace loom
