#include "optim/config.h"

namespace loom {

namespace {

using namespace keys;

bool adam_family(const OptimizerConfig& c) { return c.name != OptimizerName::sgd; }
bool sgd(const OptimizerConfig& c) { return c.name == OptimizerName::sgd; }
bool adamw(const OptimizerConfig& c) { return c.name == OptimizerName::adamw; }
bool warmup_schedule(const OptimizerConfig& c) { return c.schedule.kind != ScheduleKind::constant; }
bool cosine_schedule(const OptimizerConfig& c) { return c.schedule.kind == ScheduleKind::warmup_cosine_decay; }
bool params_shard(const OptimizerConfig& c) { return c.shard == OptimizerShard::params; }
bool exponential_schedule(const OptimizerConfig& c) {
  return c.schedule.kind == ScheduleKind::warmup_exponential_decay;
}
// Loss scaling means something only when the compute dtype is float16.
constexpr KeyNeeds float16 = KeyNeeds::float16_compute;

}  // namespace

#define REF(member) LOOM_KEY_REF(OptimizerConfig, member)

const std::vector<KeySpec<OptimizerConfig>>& optimizer_keys() {
  static const std::vector<KeySpec<OptimizerConfig>> keys = {
      choice<OptimizerConfig>("optimizer.name", "optimizer (Optax semantics)", REF(name)),
      number<OptimizerConfig>("optimizer.learning_rate", "learning rate (the peak value when a warmup schedule is set)",
                              REF(learning_rate)),
      only_if(number<OptimizerConfig>("optimizer.b1", "Adam beta1", REF(b1)), adam_family),
      only_if(number<OptimizerConfig>("optimizer.b2", "Adam beta2", REF(b2)), adam_family),
      only_if(number<OptimizerConfig>("optimizer.eps", "Adam epsilon", REF(eps)), adam_family),
      only_if(number<OptimizerConfig>("optimizer.eps_root", "Adam epsilon inside the square root", REF(eps_root)),
              adam_family),
      only_if(number<OptimizerConfig>("optimizer.momentum", "sgd momentum (0 = none)", REF(momentum)), sgd),
      only_if(boolean<OptimizerConfig>("optimizer.nesterov", "sgd Nesterov momentum", REF(nesterov)), sgd),
      only_if(number<OptimizerConfig>("optimizer.weight_decay", "adamw decoupled weight decay", REF(weight_decay)),
              adamw),
      only_if(
          choice<OptimizerConfig>("optimizer.weight_decay_mask", "which params adamw decays", REF(weight_decay_mask)),
          adamw),
      number<OptimizerConfig>("optimizer.clip_norm", "clip_by_global_norm before the optimizer (0 = off)",
                              REF(clip_norm)),
      choice<OptimizerConfig>("optimizer.shard",
                              "more than one rank (mpirun): how the optimizer state is split over the ranks",
                              REF(shard)),
      only_if(integer<OptimizerConfig>("optimizer.gather_ahead",
                                       "shard = params: parameter uses whose all-gathers run ahead of the kernels (0 = "
                                       "each gather blocks; each more holds one more use's parameters)",
                                       REF(gather_ahead)),
              params_shard),
      choice<OptimizerConfig>("optimizer.schedule", "learning-rate schedule", REF(schedule.kind)),
      only_if(number<OptimizerConfig>("optimizer.init_value", "schedule: value at step 0 (warmup start)",
                                      REF(schedule.init_value)),
              warmup_schedule),
      only_if(integer<OptimizerConfig>("optimizer.warmup_steps", "schedule: linear warmup steps",
                                       REF(schedule.warmup_steps)),
              warmup_schedule),
      only_if(integer<OptimizerConfig>("optimizer.decay_steps", "warmup_cosine_decay: total steps including warmup",
                                       REF(schedule.decay_steps)),
              cosine_schedule),
      only_if(number<OptimizerConfig>("optimizer.end_value",
                                      "schedule: final value (cosine) or bound (exponential; 0 = none)",
                                      REF(schedule.end_value)),
              warmup_schedule),
      only_if(number<OptimizerConfig>("optimizer.exponent", "warmup_cosine_decay exponent", REF(schedule.exponent)),
              cosine_schedule),
      only_if(integer<OptimizerConfig>("optimizer.transition_steps", "warmup_exponential_decay: steps per decay",
                                       REF(schedule.transition_steps)),
              exponential_schedule),
      only_if(
          number<OptimizerConfig>("optimizer.decay_rate", "warmup_exponential_decay rate", REF(schedule.decay_rate)),
          exponential_schedule),
      only_if(integer<OptimizerConfig>("optimizer.transition_begin",
                                       "warmup_exponential_decay: steps after warmup before decay starts",
                                       REF(schedule.transition_begin)),
              exponential_schedule),
      only_if(boolean<OptimizerConfig>("optimizer.staircase", "warmup_exponential_decay: decay in discrete steps",
                                       REF(schedule.staircase)),
              exponential_schedule),
      only_if(choice<OptimizerConfig>("optimizer.loss_scale", "float16 loss scaling", REF(loss_scale)), float16),
      only_if(
          number<OptimizerConfig>("optimizer.loss_scale_init", "initial (or static) loss scale", REF(loss_scale_init)),
          float16),
      only_if(number<OptimizerConfig>("optimizer.loss_scale_growth",
                                      "dynamic: factor after loss_scale_interval finite steps", REF(loss_scale_growth)),
              float16),
      only_if(number<OptimizerConfig>("optimizer.loss_scale_backoff", "dynamic: factor after a non-finite step",
                                      REF(loss_scale_backoff)),
              float16),
      only_if(integer<OptimizerConfig>("optimizer.loss_scale_interval", "dynamic: finite steps before growing",
                                       REF(loss_scale_interval)),
              float16),
      only_if(number<OptimizerConfig>("optimizer.loss_scale_min", "dynamic: the scale never backs off below this",
                                      REF(loss_scale_min)),
              float16),
      integer<OptimizerConfig>("optimizer.num_minibatches",
                               "gradient accumulation: minibatches per step (divides data.batch_size)",
                               REF(num_minibatches)),
  };
  return keys;
}

#undef REF

void validate_optimizer(const OptimizerConfig& c) {
  check_key(c.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", "e.g. 0.1");
  check_key(c.momentum >= 0 && c.momentum < 1, "optimizer.momentum", "must be in [0, 1)", "e.g. 0.9");
  check_key(c.clip_norm >= 0, "optimizer.clip_norm", "must be >= 0", "0 disables clipping; GPT-2 uses 1.0");
  check_key(c.loss_scale_init > 0, "optimizer.loss_scale_init", "must be positive", "GradScaler's default is 65536");
  check_key(c.loss_scale_growth >= 1, "optimizer.loss_scale_growth", "must be >= 1", "GradScaler's default is 2");
  check_key(c.loss_scale_backoff > 0 && c.loss_scale_backoff < 1, "optimizer.loss_scale_backoff", "must be in (0, 1)",
            "GradScaler's default is 0.5");
  check_key(c.loss_scale_interval >= 1, "optimizer.loss_scale_interval", "must be >= 1",
            "GradScaler's default is 2000");
  check_key(c.loss_scale_min > 0 && c.loss_scale_min <= c.loss_scale_init, "optimizer.loss_scale_min",
            "must be positive and at most optimizer.loss_scale_init", "e.g. 1.0 (the default)");
  ScheduleSpec s = c.schedule;
  s.value = c.learning_rate;
  validate_schedule(s, "optimizer.");
  check_key(c.learning_rate >= 0, "optimizer.learning_rate", "must be >= 0", "e.g. 1e-3");
  check_key(c.b1 >= 0 && c.b1 < 1, "optimizer.b1", "must be in [0, 1)", "Adam's default is 0.9");
  check_key(c.b2 >= 0 && c.b2 < 1, "optimizer.b2", "must be in [0, 1)", "Adam's default is 0.999");
  check_key(c.eps >= 0, "optimizer.eps", "must be >= 0", "Adam's default is 1e-8");
  check_key(c.num_minibatches >= 1, "optimizer.num_minibatches", "must be >= 1", "1 means no accumulation");
  check_key(c.gather_ahead >= 0, "optimizer.gather_ahead", "must be >= 0",
            "1 (the default) gathers each use's parameters during the use before it; 0 waits for each gather");
}

}  // namespace loom
