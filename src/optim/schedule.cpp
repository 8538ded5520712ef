#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom {

double optax_linear(double init, double end, int64_t transition_steps, int64_t transition_begin, int64_t t) {
  // polynomial_schedule with power 1.
  if (transition_steps <= 0) return init;
  transition_begin = std::max<int64_t>(transition_begin, 0);
  const double c = static_cast<double>(std::clamp<int64_t>(t - transition_begin, 0, transition_steps));
  return (init - end) * (1.0 - c / static_cast<double>(transition_steps)) + end;
}

double optax_cosine_decay(double init, int64_t decay_steps, double alpha, double exponent, int64_t t) {
  LOOM_ASSERT(decay_steps > 0, "cosine decay_steps must be positive (validated earlier)");
  const double c = static_cast<double>(std::min(t, decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * c / static_cast<double>(decay_steps)));
  return init * ((1.0 - alpha) * std::pow(cosine, exponent) + alpha);
}

double optax_exponential_decay(double init, int64_t transition_steps, double rate, int64_t transition_begin,
                               bool staircase, std::optional<double> end_value, int64_t t) {
  if (transition_steps <= 0 || rate == 0.0) return init;
  transition_begin = std::max<int64_t>(transition_begin, 0);
  const double d = static_cast<double>(t - transition_begin);
  double p = d / static_cast<double>(transition_steps);
  if (staircase) p = std::floor(p);
  double v = d <= 0 ? init : init * std::pow(rate, p);
  if (end_value) v = rate < 1.0 ? std::max(v, *end_value) : std::min(v, *end_value);
  return v;
}

void validate_schedule(const ScheduleSpec& s, const std::string& k) {
  if (s.kind == ScheduleKind::constant) return;
  if (s.warmup_steps < 0) throw UserError(k + "warmup_steps", "must be >= 0", "e.g. 100");
  if (s.kind == ScheduleKind::warmup_cosine_decay && s.decay_steps <= s.warmup_steps)
    throw UserError(k + "decay_steps",
                    "must be greater than warmup_steps (" + std::to_string(s.warmup_steps) +
                        "): as in Optax, decay_steps counts the warmup",
                    "set decay_steps to the total number of steps, e.g. train.steps");
  if (s.kind == ScheduleKind::warmup_exponential_decay && s.transition_steps <= 0)
    throw UserError(k + "transition_steps", "must be positive", "e.g. 1");
}

double schedule_value(const ScheduleSpec& s, int64_t t) {
  if (s.kind == ScheduleKind::constant) return s.value;
  // join_schedules: the warmup runs for t < W; the decay sees t − W.
  if (t < s.warmup_steps) return optax_linear(s.init_value, s.value, s.warmup_steps, 0, t);
  const int64_t u = t - s.warmup_steps;
  if (s.kind == ScheduleKind::warmup_cosine_decay) {
    const double alpha = s.value == 0.0 ? 0.0 : s.end_value / s.value;
    return optax_cosine_decay(s.value, s.decay_steps - s.warmup_steps, alpha, s.exponent, u);
  }
  return optax_exponential_decay(s.value, s.transition_steps, s.decay_rate, s.transition_begin, s.staircase,
                                 s.has_end_value ? std::optional<double>(s.end_value) : std::nullopt, u);
}

}  // namespace loom
