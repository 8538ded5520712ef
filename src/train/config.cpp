#include "train/config.h"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "nn/models.h"
#include "train/fit.h"
#include "train/model_source.h"

namespace loom {

namespace {

// One configuration key: where it lives in Config and how to read and print it.
struct KeySpec {
  const char* key;
  const char* type;      // the --help-config column: int, number, string, dtype, bool, choice
  std::string expected;  // what a value must be, for messages: "an integer"
  const char* help;
  std::span<const ChoiceInfo> choices = {};                  // a choice key's names (--help-config)
  std::function<void(Config&, const toml::node&)> set_toml;  // throws std::invalid_argument or UserError
  std::function<void(Config&, const std::string&)> set_text;
  std::function<std::string(const Config&)> get;
  // Whether the key means anything for this configuration (nullptr: always). The saved
  // config.toml leaves out the keys that do not (num_classes for a language model, momentum for
  // Adam), so it lists only what shaped the run.
  bool (*applies)(const Config&) = nullptr;
  // A file or directory (nullptr: not a path): resolved when read (resolve_path), relative to the
  // config file that sets it or, on the command line, to the current directory.
  std::function<std::string&(Config&)> path = nullptr;
  std::function<void(Config& dst, const Config& src)> copy;  // dst's value = src's
};

// copy for the key whose member `ref` returns.
template <class Get>
auto copier(Get ref) {
  return [ref](Config& dst, const Config& src) { ref(dst) = ref(const_cast<Config&>(src)); };
}

// A TOML basic string holding exactly `s`: quotes, backslashes and control characters escaped, so
// any accepted value (a path with a quote in it) reads back from config.toml and state.json.
std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}
KeySpec only_if(KeySpec k, bool (*applies)(const Config&)) {
  k.applies = applies;
  return k;
}
bool language_model(const Config& c) { return nn::model_kind(c.model.kind).language_model; }
bool classifier(const Config& c) { return !language_model(c); }
bool classification_data(const Config& c) { return c.data.kind == DataKind::random_classification; }
bool token_data(const Config& c) { return is_token_data(c.data.kind); }
bool random_tokens(const Config& c) { return c.data.kind == DataKind::random_tokens; }
bool token_files(const Config& c) { return c.data.kind == DataKind::tokens; }
bool adam_family(const Config& c) { return c.optimizer.name != OptimizerName::sgd; }
bool sgd(const Config& c) { return c.optimizer.name == OptimizerName::sgd; }
bool adamw(const Config& c) { return c.optimizer.name == OptimizerName::adamw; }
bool warmup_schedule(const Config& c) { return c.optimizer.schedule.kind != ScheduleKind::constant; }
bool cosine_schedule(const Config& c) { return c.optimizer.schedule.kind == ScheduleKind::warmup_cosine_decay; }
bool exponential_schedule(const Config& c) {
  return c.optimizer.schedule.kind == ScheduleKind::warmup_exponential_decay;
}
bool float16(const Config& c) { return c.model.dtype == DType::f16; }

// Shortest text that reads back as the same double (std::to_chars), so "0.9" stays "0.9".
std::string fmt_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos && s != "nan") s += ".0";
  return s;
}

int64_t parse_int(const std::string& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) throw std::invalid_argument("not an integer");
  return v;
}
double parse_number(const std::string& s) {
  size_t used = 0;
  double v;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a number");
  }
  if (used != s.size()) throw std::invalid_argument("not a number");
  if (!std::isfinite(v)) throw std::invalid_argument("infinities and NaN are not allowed");
  return v;
}
DType parse_dtype(const std::string& s) {
  auto d = dtype_from_name(s);
  if (!d) throw std::invalid_argument("not a dtype");
  if (!dtype_is_float(*d)) throw std::invalid_argument(s + " is not a floating-point dtype");
  return *d;
}
// "float32, bfloat16, float16": the names a dtype key accepts (besides their short aliases).
std::string float_dtype_names() {
  std::vector<std::string_view> names;
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtype_is_float(static_cast<DType>(i))) names.push_back(dtype_name(static_cast<DType>(i)));
  return join_names(names, ", ");
}

template <class Get>
KeySpec make_int(const char* key, const char* help, Get ref) {
  return {.key = key,
          .type = "int",
          .expected = "an integer",
          .help = help,
          .set_toml =
              [ref](Config& c, const toml::node& n) {
                auto v = n.value<int64_t>();
                if (!n.is_integer() || !v) throw std::invalid_argument("not an integer");
                ref(c) = static_cast<std::remove_reference_t<decltype(ref(c))>>(*v);
              },
          .set_text =
              [ref](Config& c, const std::string& s) {
                ref(c) = static_cast<std::remove_reference_t<decltype(ref(c))>>(parse_int(s));
              },
          .get = [ref](const Config& c) { return std::to_string(ref(const_cast<Config&>(c))); },
          .copy = copier(ref)};
}
template <class Get>
KeySpec make_number(const char* key, const char* help, Get ref) {
  return {.key = key,
          .type = "number",
          .expected = "a number",
          .help = help,
          .set_toml =
              [ref](Config& c, const toml::node& n) {
                if (!n.is_number()) throw std::invalid_argument("not a number");
                // TOML has inf and nan; no loom setting means them, and they would not survive a checkpoint.
                if (!std::isfinite(*n.value<double>())) throw std::invalid_argument("not a finite number");
                ref(c) = *n.value<double>();
              },
          .set_text = [ref](Config& c, const std::string& s) { ref(c) = parse_number(s); },
          .get = [ref](const Config& c) { return fmt_double(ref(const_cast<Config&>(c))); },
          .copy = copier(ref)};
}
template <class Get>
KeySpec make_bool(const char* key, const char* help, Get ref) {
  return {.key = key,
          .type = "bool",
          .expected = "true or false",
          .help = help,
          .set_toml =
              [ref](Config& c, const toml::node& n) {
                if (!n.is_boolean()) throw std::invalid_argument("not a boolean");
                ref(c) = *n.value<bool>();
              },
          .set_text =
              [ref](Config& c, const std::string& s) {
                if (s == "true" || s == "1")
                  ref(c) = true;
                else if (s == "false" || s == "0")
                  ref(c) = false;
                else
                  throw std::invalid_argument("not a boolean");
              },
          .get = [ref](const Config& c) { return std::string(ref(const_cast<Config&>(c)) ? "true" : "false"); },
          .copy = copier(ref)};
}

// A key written as a TOML string: `parse` turns the text into the member's value, `print` back.
template <class Get, class Parse, class Print>
KeySpec make_text(const char* key, const char* type, std::string expected, const char* help, Get ref, Parse parse,
                  Print print) {
  return {.key = key,
          .type = type,
          .expected = std::move(expected),
          .help = help,
          .set_toml =
              [ref, parse](Config& c, const toml::node& n) {
                if (!n.is_string()) throw std::invalid_argument("not a string");
                ref(c) = parse(*n.value<std::string>());
              },
          .set_text = [ref, parse](Config& c, const std::string& s) { ref(c) = parse(s); },
          .get = [ref, print](const Config& c) { return toml_quote(print(ref(const_cast<Config&>(c)))); },
          .copy = copier(ref)};
}
template <class Get>
KeySpec make_string(const char* key, const char* help, Get ref) {
  auto same = [](const std::string& s) { return s; };
  return make_text(key, "string", "a string", help, ref, same, same);
}
template <class Get>
KeySpec make_dtype(const char* key, const char* help, Get ref) {
  return make_text(key, "dtype", "a dtype name (" + float_dtype_names() + ")", help, ref, parse_dtype, dtype_name);
}
// One of the names of choice E (core/choice.h).
template <class Get>
KeySpec make_choice(const char* key, const char* help, Get ref) {
  using E = std::remove_reference_t<decltype(ref(std::declval<Config&>()))>;
  KeySpec k = make_text(
      key, "choice", "one of " + choice_names<E>(), help, ref,
      [](const std::string& s) { return parse_choice_or_throw<E>(s); }, [](E e) { return choice_name(e); });
  k.choices = choices_of(E{});
  return k;
}
// A subset of choice E's names: "none" or comma-separated (ChoiceSet).
template <class Get>
KeySpec make_choice_set(const char* key, const char* help, Get ref) {
  using E = typename std::remove_reference_t<decltype(ref(std::declval<Config&>()))>::member_type;
  KeySpec k = make_text(
      key, "choices", "none or a comma-separated subset of " + choice_names<E>(", "), help, ref,
      [](const std::string& s) { return parse_choice_set<E>(s); }, [](ChoiceSet<E> s) { return choice_set_name(s); });
  k.choices = choices_of(E{});
  return k;
}

template <class Get>
KeySpec make_path(const char* key, const char* help, Get ref) {
  KeySpec k = make_string(key, help, ref);
  k.path = [ref](Config& c) -> std::string& { return ref(c); };
  return k;
}

#define LOOM_REF(member) \
  [](Config & c) -> auto& { return c.member; }

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> keys = {
      make_int("seed", "seed of every random stream (init, data, dropout)", LOOM_REF(seed)),
      make_choice("device", "where to run", LOOM_REF(device)),
      make_int("threads", "CPU threads (0 = all cores)", LOOM_REF(threads)),
      make_choice("model.kind", "model family", LOOM_REF(model.kind)),
      make_dtype("model.dtype", "compute dtype of activations; params and optimizer state stay float32",
                 LOOM_REF(model.dtype)),
      make_int("model.hidden_size", "hidden width", LOOM_REF(model.hidden_size)),
      only_if(make_int("model.num_classes", "output classes of the classifier", LOOM_REF(model.num_classes)),
              classifier),
      make_number("model.dropout_rate", "dropout rate in [0, 1)", LOOM_REF(model.dropout_rate)),
      make_number("model.layer_norm_eps", "LayerNorm epsilon (Flax default 1e-6)", LOOM_REF(model.layer_norm_eps)),
      only_if(make_int("model.num_layers", "transformer blocks", LOOM_REF(model.num_layers)), language_model),
      only_if(make_int("model.head_dim", "attention head width; num_heads = hidden_size / head_dim",
                       LOOM_REF(model.head_dim)),
              language_model),
      only_if(make_int("model.mlp_expansion", "MLP hidden width = mlp_expansion × hidden_size (see intermediate_size)",
                       LOOM_REF(model.mlp_expansion)),
              language_model),
      only_if(make_int("model.vocab_size", "token embedding rows", LOOM_REF(model.vocab_size)), language_model),
      only_if(make_int("model.num_outputs", "output logits per position (the vocabulary for a language model)",
                       LOOM_REF(model.num_outputs)),
              language_model),
      only_if(make_int("model.max_seq_len", "rows of the learned position embedding", LOOM_REF(model.max_seq_len)),
              language_model),
      only_if(
          make_dtype("model.softmax_dtype", "dtype of the attention logits and softmax", LOOM_REF(model.softmax_dtype)),
          language_model),
      only_if(make_bool("model.causal_mask", "causal attention mask", LOOM_REF(model.causal_mask)), language_model),
      make_choice_set("model.remat", "remat regions: recomputed in the backward instead of kept",
                      LOOM_REF(model.remat)),
      make_choice("model.remat_policy", "what a remat region saves", LOOM_REF(model.remat_policy)),
      make_string("model.remat_save_names", "save_only_these_names: comma-separated scope patterns, e.g. */attn/qkv",
                  LOOM_REF(model.remat_save_names)),
      only_if(
          make_bool(
              "model.scan_layers",
              "parameter layout of files: stacked [num_layers, ...] (the tutorial's nn.scan); execution is the same",
              LOOM_REF(model.scan_layers)),
          language_model),
      only_if(
          make_choice("model.block_order", "order of the residual branches in a block", LOOM_REF(model.block_order)),
          language_model),
      only_if(make_choice("model.norm", "normalisation layers (epsilon: model.layer_norm_eps)", LOOM_REF(model.norm)),
              language_model),
      only_if(make_choice("model.mlp", "the MLP of each block", LOOM_REF(model.mlp)), language_model),
      only_if(make_int("model.intermediate_size",
                       "MLP hidden width; 0: mlp_expansion × hidden_size, and for swiglu Llama's "
                       "2/3 of that rounded up to a multiple of 256",
                       LOOM_REF(model.intermediate_size)),
              language_model),
      only_if(make_choice("model.position", "how token positions enter: learned table or rotary (RoPE)",
                          LOOM_REF(model.position)),
              language_model),
      only_if(
          make_number("model.rope_theta", "RoPE frequency base (model.position = rope)", LOOM_REF(model.rope_theta)),
          language_model),
      only_if(
          make_int("model.num_kv_heads", "key/value heads, dividing num_heads (grouped-query attention; 0 = num_heads)",
                   LOOM_REF(model.num_kv_heads)),
          language_model),
      only_if(make_bool("model.use_bias", "biases in the Dense layers (nanoGPT's bias)", LOOM_REF(model.use_bias)),
              language_model),
      only_if(make_bool("model.tie_embeddings",
                        "logits = x · embeddingᵀ (GPT-2 weight tying; needs num_outputs = vocab_size)",
                        LOOM_REF(model.tie_embeddings)),
              language_model),
      only_if(make_choice("model.init", "parameter init", LOOM_REF(model.init)), language_model),
      only_if(make_bool("model.embed_dropout", "dropout after the token + position embedding (GPT-2)",
                        LOOM_REF(model.embed_dropout)),
              language_model),
      make_path("model.init_from",
                "start from this model's parameters, taking its architecture: a Hugging Face directory "
                "(config.json, model.safetensors) or a loom run or checkpoint (\"\" = random init)",
                LOOM_REF(model.init_from)),
      make_choice("optimizer.name", "optimizer (Optax semantics)", LOOM_REF(optimizer.name)),
      make_number("optimizer.learning_rate", "learning rate (the peak value when a warmup schedule is set)",
                  LOOM_REF(optimizer.learning_rate)),
      only_if(make_number("optimizer.b1", "Adam beta1", LOOM_REF(optimizer.b1)), adam_family),
      only_if(make_number("optimizer.b2", "Adam beta2", LOOM_REF(optimizer.b2)), adam_family),
      only_if(make_number("optimizer.eps", "Adam epsilon", LOOM_REF(optimizer.eps)), adam_family),
      only_if(make_number("optimizer.eps_root", "Adam epsilon inside the square root", LOOM_REF(optimizer.eps_root)),
              adam_family),
      only_if(make_number("optimizer.momentum", "sgd momentum (0 = none)", LOOM_REF(optimizer.momentum)), sgd),
      only_if(make_bool("optimizer.nesterov", "sgd Nesterov momentum", LOOM_REF(optimizer.nesterov)), sgd),
      only_if(make_number("optimizer.weight_decay", "adamw decoupled weight decay", LOOM_REF(optimizer.weight_decay)),
              adamw),
      only_if(make_choice("optimizer.weight_decay_mask", "which params adamw decays",
                          LOOM_REF(optimizer.weight_decay_mask)),
              adamw),
      make_number("optimizer.clip_norm", "clip_by_global_norm before the optimizer (0 = off)",
                  LOOM_REF(optimizer.clip_norm)),
      make_choice("optimizer.shard", "more than one rank (mpirun): how the optimizer state is split over the ranks",
                  LOOM_REF(optimizer.shard)),
      make_choice("optimizer.schedule", "learning-rate schedule", LOOM_REF(optimizer.schedule.kind)),
      only_if(make_number("optimizer.init_value", "schedule: value at step 0 (warmup start)",
                          LOOM_REF(optimizer.schedule.init_value)),
              warmup_schedule),
      only_if(make_int("optimizer.warmup_steps", "schedule: linear warmup steps",
                       LOOM_REF(optimizer.schedule.warmup_steps)),
              warmup_schedule),
      only_if(make_int("optimizer.decay_steps", "warmup_cosine_decay: total steps including warmup",
                       LOOM_REF(optimizer.schedule.decay_steps)),
              cosine_schedule),
      only_if(make_number("optimizer.end_value", "schedule: final value (cosine) or bound (exponential; 0 = none)",
                          LOOM_REF(optimizer.schedule.end_value)),
              warmup_schedule),
      only_if(make_number("optimizer.exponent", "warmup_cosine_decay exponent", LOOM_REF(optimizer.schedule.exponent)),
              cosine_schedule),
      only_if(make_int("optimizer.transition_steps", "warmup_exponential_decay: steps per decay",
                       LOOM_REF(optimizer.schedule.transition_steps)),
              exponential_schedule),
      only_if(
          make_number("optimizer.decay_rate", "warmup_exponential_decay rate", LOOM_REF(optimizer.schedule.decay_rate)),
          exponential_schedule),
      only_if(make_int("optimizer.transition_begin", "warmup_exponential_decay: steps after warmup before decay starts",
                       LOOM_REF(optimizer.schedule.transition_begin)),
              exponential_schedule),
      only_if(make_bool("optimizer.staircase", "warmup_exponential_decay: decay in discrete steps",
                        LOOM_REF(optimizer.schedule.staircase)),
              exponential_schedule),
      only_if(make_choice("optimizer.loss_scale", "float16 loss scaling", LOOM_REF(optimizer.loss_scale)), float16),
      only_if(make_number("optimizer.loss_scale_init", "initial (or static) loss scale",
                          LOOM_REF(optimizer.loss_scale_init)),
              float16),
      only_if(make_number("optimizer.loss_scale_growth", "dynamic: factor after loss_scale_interval finite steps",
                          LOOM_REF(optimizer.loss_scale_growth)),
              float16),
      only_if(make_number("optimizer.loss_scale_backoff", "dynamic: factor after a non-finite step",
                          LOOM_REF(optimizer.loss_scale_backoff)),
              float16),
      only_if(make_int("optimizer.loss_scale_interval", "dynamic: finite steps before growing",
                       LOOM_REF(optimizer.loss_scale_interval)),
              float16),
      only_if(make_number("optimizer.loss_scale_min", "dynamic: the scale never backs off below this",
                          LOOM_REF(optimizer.loss_scale_min)),
              float16),
      make_int("optimizer.num_minibatches", "gradient accumulation: minibatches per step (divides data.batch_size)",
               LOOM_REF(optimizer.num_minibatches)),
      make_choice("data.kind", "data source", LOOM_REF(data.kind)),
      make_int("data.batch_size", "examples per optimizer step (all minibatches together)", LOOM_REF(data.batch_size)),
      only_if(make_int("data.num_inputs", "input features of random_classification data", LOOM_REF(data.num_inputs)),
              classification_data),
      only_if(make_int("data.seq_len", "tokens per sequence", LOOM_REF(data.seq_len)), token_data),
      only_if(
          make_int("data.vocab_size", "random_tokens: tokens drawn from [1, vocab_size)", LOOM_REF(data.vocab_size)),
          random_tokens),
      only_if(make_path("data.dir", "tokens: directory written by `loom prepare` (train.bin, val.bin, meta.json)",
                        LOOM_REF(data.dir)),
              token_files),
      make_int("train.steps", "optimizer steps to run", LOOM_REF(train.steps)),
      make_int("train.log_every", "log every N steps", LOOM_REF(train.log_every)),
      make_path("train.metrics_file",
                "JSONL file with one object per logged step (empty: RUN/metrics.jsonl for runs with --out)",
                LOOM_REF(train.metrics_file)),
      make_bool("train.tensorboard",
                "also write the logged numbers as a TensorBoard event file in the run directory "
                "(tensorboard --logdir runs/)",
                LOOM_REF(train.tensorboard)),
      make_int("train.eval_interval", "evaluate the validation loss every N steps (0 = never)",
               LOOM_REF(train.eval_interval)),
      make_int("train.eval_iters", "validation batches per evaluation", LOOM_REF(train.eval_iters)),
      make_int("train.checkpoint_interval", "save a checkpoint every N steps (0 = at evaluations and at the end)",
               LOOM_REF(train.checkpoint_interval)),
      make_int("train.keep_last", "checkpoints to keep (the best one is kept apart)", LOOM_REF(train.keep_last)),
      make_int("train.sample_tokens", "after training, print a sample of this many tokens (0 = none)",
               LOOM_REF(train.sample_tokens)),
      make_choice("train.on_nonfinite", "what a NaN or infinite loss or gradient norm does (float32/bfloat16)",
                  LOOM_REF(train.on_nonfinite)),
      make_int("train.max_skipped_steps",
               "stop after this many skipped steps in a row, in any dtype (float16 overflow included; 0 = never)",
               LOOM_REF(train.max_skipped_steps)),
      make_int("train.bucket_kib",
               "more than one rank (mpirun): gradients are summed over ranks in buckets of this many KiB, each as "
               "soon as the backward has written it (no effect on the result)",
               LOOM_REF(train.bucket_kib)),
      make_string("train.memory_budget",
                  "model.remat = auto: bytes the run may plan, e.g. 20GiB (empty: the memory available to each "
                  "rank on this machine)",
                  LOOM_REF(train.memory_budget)),
      make_number("train.collective_timeout",
                  "more than one rank: seconds a rank waits for the others in a collective before it asks which are "
                  "alive, names those that are not (stopped, dead, unreachable) and ends the job; a rank saving a "
                  "checkpoint answers that it is busy, so a long save never trips it",
                  LOOM_REF(train.collective_timeout)),
  };
  return keys;
}
#undef LOOM_REF

const Config& defaults() {
  static const Config d;
  return d;
}

const KeySpec* find_key(const std::string& key) {
  for (const KeySpec& k : schema())
    if (key == k.key) return &k;
  return nullptr;
}

// The fix for an unknown key: the key it most likely meant (the same name in its section, as
// `hidden_size` for `model.hidden_size`, or a spelling within two edits), then the known keys
// of its section.
std::string unknown_key_fix(const std::string& key) {
  const std::string name = key.substr(key.find('.') == std::string::npos ? 0 : key.rfind('.') + 1);
  std::vector<std::string_view> all;
  std::string meant;
  for (const KeySpec& k : schema()) {
    const std::string_view full = k.key;
    all.push_back(full);
    if (meant.empty() && full.substr(full.find('.') == std::string_view::npos ? 0 : full.rfind('.') + 1) == name)
      meant = k.key;
  }
  if (meant.empty()) meant = closest_name(key, all);
  const std::string section = key.find('.') == std::string::npos ? "" : key.substr(0, key.find('.') + 1);
  std::string near;
  for (const KeySpec& k : schema()) {
    const std::string n = k.key;
    const bool same_section = section.empty() ? n.find('.') == std::string::npos : n.rfind(section, 0) == 0;
    if (same_section) near += (near.empty() ? "" : ", ") + n;
  }
  std::string fix = meant.empty() ? "" : "did you mean " + meant + "? ";
  if (!near.empty())
    fix += "known keys " +
           (section.empty() ? std::string("at the top level") : "in [" + section.substr(0, section.size() - 1) + "]") +
           ": " + near + "; ";
  return fix + "`loom help config` lists every key";
}

// The parser's reason after "expected an integer" / "'abc' is not an integer", only when it says
// more than that: a reason starting with "not " restates the expectation.
std::string more_reason(const std::string& reason) {
  return reason.rfind("not ", 0) == 0 ? std::string() : " (" + reason + ")";
}

// Sets every key of `t` in `c` and adds it to `given`. `base`: the directory relative paths in
// this table are relative to ("" = leave them relative).
void walk(Config& c, const toml::table& t, const std::string& prefix, const std::string& file,
          const std::filesystem::path& base, std::set<std::string>& given) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      walk(c, *sub, key, file, base, given);
      continue;
    }
    given.insert(key);
    const KeySpec* spec = find_key(key);
    if (!spec) throw UserError(file + ": " + key, "unknown configuration key", unknown_key_fix(key));
    try {
      spec->set_toml(c, node);
      if (spec->path) spec->path(c) = resolve_path(spec->path(c), base);
    } catch (const std::invalid_argument& e) {
      throw UserError(file + ": " + key, "expected " + spec->expected + more_reason(e.what()),
                      "write e.g. " + key + " = " + spec->get(defaults()));
    } catch (const UserError& e) {  // an unknown choice: the message names the valid ones
      throw UserError(file + ": " + key, e.what(), e.hint());
    }
  }
}

// Applies the overrides and records their keys in `given`.
void apply_overrides(Config& c, const std::vector<std::string>& overrides, std::set<std::string>& given) {
  for (const std::string& o : overrides) {
    apply_override(c, o);
    given.insert(o.substr(0, o.find('=')));
  }
}

// model.init_from: the source's architecture keys replace c's, except those the file or the
// overrides gave (`given`), which must agree with the source's when the key is fixed.
void apply_init_from(Config& c, const std::set<std::string>& given) {
  if (c.model.init_from.empty()) return;
  std::error_code ec;
  if (!std::filesystem::is_directory(c.model.init_from, ec))
    throw UserError("model.init_from = " + c.model.init_from, "no such directory",
                    "give a Hugging Face model directory (config.json, model.safetensors) or a loom run or checkpoint "
                    "(in a config file a relative model.init_from is relative to that file; on the command line and "
                    "in --init-from, to the current directory)");
  const ModelSource src(c.model.init_from);
  const std::string& f = c.source.empty() ? std::string("config") : c.source;
  for (const ArchKey& k : src.keys()) {
    const KeySpec* spec = find_key(k.key);
    LOOM_ASSERT(spec != nullptr, "model source key '" + k.key + "' is not in the schema");
    if (!given.count(k.key)) {
      spec->copy(c, src.config());
      continue;
    }
    const std::string mine = spec->get(c), theirs = spec->get(src.config());
    if (k.fixed && mine != theirs)
      throw UserError(
          f + ": " + k.key,
          "is " + mine + ", but the model of model.init_from has " + k.origin + ", i.e. " + k.key + " = " + theirs,
          "remove " + k.key + " (model.init_from sets it) or start from another model");
  }
  // mlp_expansion sizes the MLP only while intermediate_size is 0; a source that gives the width
  // itself (a Llama's intermediate_size) would leave a different mlp_expansion silently unused.
  if (given.count("model.mlp_expansion") && !given.count("model.intermediate_size") && c.model.intermediate_size > 0 &&
      c.model.mlp_expansion != src.config().model.mlp_expansion)
    throw UserError(f + ": model.mlp_expansion",
                    "is " + std::to_string(c.model.mlp_expansion) +
                        ", which would go unused: the model of model.init_from sets the MLP's width itself, "
                        "model.intermediate_size = " +
                        std::to_string(c.model.intermediate_size),
                    "remove model.mlp_expansion (model.init_from sets the width) or start from another model");
}

}  // namespace

std::string resolve_path(const std::string& path, const std::filesystem::path& base) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  fs::path p = path;
  if (path == "~" || path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    if (!home || !*home) throw UserError(path, "starts with ~ but HOME is not set", "write the path in full");
    p = fs::path(home) / (path.size() > 2 ? path.substr(2) : std::string());
  }
  if (p.is_relative() && !base.empty()) p = base / p;
  return p.lexically_normal().string();
}

void apply_override(Config& c, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("override '" + assignment + "'", "expected section.key=value",
                    "for example optimizer.num_minibatches=4");
  const std::string key = assignment.substr(0, eq);
  const std::string val = assignment.substr(eq + 1);
  const KeySpec* spec = find_key(key);
  if (!spec) throw UserError("override " + key, "unknown configuration key", unknown_key_fix(key));
  try {
    spec->set_text(c, val);
    if (spec->path) spec->path(c) = resolve_path(spec->path(c), std::filesystem::current_path());
  } catch (const std::invalid_argument& e) {
    std::string example = spec->get(defaults());  // unquoted, as a shell word
    if (example.size() >= 2 && example.front() == '"') example = example.substr(1, example.size() - 2);
    throw UserError("override " + key, "'" + val + "' is not " + spec->expected + more_reason(e.what()),
                    "write e.g. " + key + "=" + example);
  } catch (const UserError& e) {
    throw UserError("override " + key, e.what(), e.hint());
  }
}

void validate_config(const Config& c) {
  const std::string& f = c.source.empty() ? std::string("config") : c.source;
  auto need = [&](bool ok, const std::string& key, const std::string& problem, const std::string& hint) {
    if (!ok) throw UserError(f + ": " + key, problem, hint);
  };
  need(c.seed <= static_cast<uint64_t>(INT64_MAX), "seed", "must be in [0, 2^63 - 1]",
       "a non-negative integer, e.g. 1337");
  // A slice's own checks throw UserError naming the key; the file is added here.
  auto in_file = [&](auto&& check) {
    try {
      check();
    } catch (const UserError& e) {
      throw UserError(f + ": " + e.subject(), std::string(e.what()).substr(e.subject().size() + 2), e.hint());
    }
  };
  const nn::ModelKindInfo& kind = nn::model_kind(c.model.kind);
  need(c.threads >= 0, "threads", "must be >= 0", "0 uses all cores");
  need(c.model.hidden_size >= 1, "model.hidden_size", "must be >= 1", "e.g. 256");
  need(c.model.dropout_rate >= 0 && c.model.dropout_rate < 1, "model.dropout_rate", "must be in [0, 1)", "e.g. 0.1");
  need(c.model.layer_norm_eps > 0, "model.layer_norm_eps", "must be positive", "Flax uses 1e-6");
  need(c.optimizer.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", "e.g. 0.1");
  need(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1, "optimizer.momentum", "must be in [0, 1)", "e.g. 0.9");
  need(c.optimizer.clip_norm >= 0, "optimizer.clip_norm", "must be >= 0", "0 disables clipping; GPT-2 uses 1.0");
  need(c.optimizer.loss_scale_init > 0, "optimizer.loss_scale_init", "must be positive",
       "GradScaler's default is 65536");
  need(c.optimizer.loss_scale_growth >= 1, "optimizer.loss_scale_growth", "must be >= 1", "GradScaler's default is 2");
  need(c.optimizer.loss_scale_backoff > 0 && c.optimizer.loss_scale_backoff < 1, "optimizer.loss_scale_backoff",
       "must be in (0, 1)", "GradScaler's default is 0.5");
  need(c.optimizer.loss_scale_interval >= 1, "optimizer.loss_scale_interval", "must be >= 1",
       "GradScaler's default is 2000");
  need(c.optimizer.loss_scale_min > 0 && c.optimizer.loss_scale_min <= c.optimizer.loss_scale_init,
       "optimizer.loss_scale_min", "must be positive and at most optimizer.loss_scale_init", "e.g. 1.0 (the default)");
  in_file([&] {
    ScheduleSpec s = c.optimizer.schedule;
    s.value = c.optimizer.learning_rate;
    validate_schedule(s, "optimizer.");
  });
  need(c.optimizer.learning_rate >= 0, "optimizer.learning_rate", "must be >= 0", "e.g. 1e-3");
  need(c.optimizer.b1 >= 0 && c.optimizer.b1 < 1, "optimizer.b1", "must be in [0, 1)", "Adam's default is 0.9");
  need(c.optimizer.b2 >= 0 && c.optimizer.b2 < 1, "optimizer.b2", "must be in [0, 1)", "Adam's default is 0.999");
  need(c.optimizer.eps >= 0, "optimizer.eps", "must be >= 0", "Adam's default is 1e-8");
  need(c.optimizer.num_minibatches >= 1, "optimizer.num_minibatches", "must be >= 1", "1 means no accumulation");
  need(c.data.kind != DataKind::tokens || !c.data.dir.empty(), "data.dir", "data.kind = tokens needs a data directory",
       "prepare one with `loom prepare char data/tinyshakespeare.txt data/shakespeare_char` and set data.dir");
  need(c.train.eval_interval >= 0, "train.eval_interval", "must be >= 0", "0 disables evaluation");
  need(c.train.eval_iters >= 1, "train.eval_iters", "must be >= 1", "e.g. 20");
  need(c.train.checkpoint_interval >= 0, "train.checkpoint_interval", "must be >= 0", "0 saves at evaluations");
  need(c.train.keep_last >= 1, "train.keep_last", "must be >= 1", "e.g. 3");
  need(c.train.sample_tokens >= 0, "train.sample_tokens", "must be >= 0", "e.g. 200");
  need(c.train.bucket_kib >= 1, "train.bucket_kib", "must be >= 1", "e.g. 4096 (4 MiB)");
  need(c.train.max_skipped_steps >= 0, "train.max_skipped_steps", "must be >= 0", "e.g. 25 (0 = never stop)");
  in_file([&] { kind.validate(c.model); });
  need(!c.model.remat.has(RematRegion::auto_) || c.model.remat == ChoiceSet<RematRegion>{RematRegion::auto_},
       "model.remat", "auto chooses the regions itself", "write model.remat=auto alone");
  if (!c.train.memory_budget.empty()) in_file([&] { parse_bytes(c.train.memory_budget, "train.memory_budget"); });
  need(c.model.remat_policy != RematPolicyKind::save_only_these_names || !c.model.remat_save_names.empty(),
       "model.remat_save_names", "save_only_these_names needs at least one pattern",
       "e.g. model.remat_save_names=*/attn/qkv");
  const std::string a_kind = "the " + std::string(kind.name);
  if (kind.language_model) {
    need(c.data.seq_len >= 1 && c.data.seq_len <= c.model.max_seq_len, "data.seq_len",
         "seq_len " + std::to_string(c.data.seq_len) +
             " is outside [1, model.max_seq_len = " + std::to_string(c.model.max_seq_len) + "]",
         "raise model.max_seq_len or shorten data.seq_len");
    need(is_token_data(c.data.kind), "data.kind", a_kind + " needs token data", "use random_tokens or tokens");
    need(c.data.kind != DataKind::random_tokens || (c.data.vocab_size >= 2 && c.data.vocab_size <= c.model.vocab_size),
         "data.vocab_size", "must be in [2, model.vocab_size]", "tokens must be valid embedding rows");
  } else {
    need(c.data.kind == DataKind::random_classification, "data.kind", a_kind + " needs random_classification data",
         "use random_classification");
  }
  need(c.data.batch_size >= 1, "data.batch_size", "must be >= 1", "e.g. 512");
  need(c.data.batch_size % c.optimizer.num_minibatches == 0, "data.batch_size",
       "batch size " + std::to_string(c.data.batch_size) +
           " is not divisible by optimizer.num_minibatches = " + std::to_string(c.optimizer.num_minibatches),
       "choose num_minibatches among the divisors of the batch size");
  need(c.data.num_inputs >= 1, "data.num_inputs", "must be >= 1", "e.g. 128");
  need(c.train.steps >= 0, "train.steps", "must be >= 0", "e.g. 5");
  need(c.train.log_every >= 1, "train.log_every", "must be >= 1", "e.g. 1");
}

Config default_config(const std::vector<std::string>& overrides) {
  Config c;
  std::set<std::string> given;
  apply_overrides(c, overrides, given);
  apply_init_from(c, given);
  validate_config(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  c.source = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path, "is a directory, not a config file", "give a .toml file, e.g. configs/shakespeare_char.toml");
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    const std::string desc(e.description());
    if (desc.find("File could not be opened") != std::string::npos ||
        desc.find("could not be opened") != std::string::npos)
      throw UserError(path, "cannot open the config file", "check the path; example configs are in configs/");
    throw UserError(path + ":" + std::to_string(where.line) + ":" + std::to_string(where.column),
                    "invalid TOML: " + desc, "fix the syntax at that line");
  }
  if (t.empty())
    throw UserError(
        path, "sets no key (the file is empty, or only comments)",
        "give a config file such as configs/shakespeare_char.toml; `loom train --help-config` lists every key");
  std::set<std::string> given;
  walk(c, t, "", path, std::filesystem::absolute(path).parent_path(), given);
  apply_overrides(c, overrides, given);
  apply_init_from(c, given);
  validate_config(c);
  return c;
}

Config config_from_toml_text(const std::string& text, const std::string& source,
                             const std::vector<std::string>& overrides) {
  Config c;
  c.source = source;
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw UserError(source + ":" + std::to_string(where.line) + ":" + std::to_string(where.column),
                    "invalid TOML: " + std::string(e.description()), "the stored configuration is corrupted");
  }
  std::set<std::string> given;  // a stored configuration's init_from is resolved already
  walk(c, t, "", source, {}, given);
  apply_overrides(c, overrides, given);
  validate_config(c);
  return c;
}

std::string config_to_toml(const Config& c) {
  std::string out, section;
  for (const KeySpec& k : schema()) {
    if (k.applies && !k.applies(c)) continue;
    const std::string key = k.key;
    const size_t dot = key.find('.');
    const std::string sec = dot == std::string::npos ? "" : key.substr(0, dot);
    if (sec != section) {
      out += "\n[" + sec + "]\n";
      section = sec;
    }
    out += (dot == std::string::npos ? key : key.substr(dot + 1)) + " = " + k.get(c) + "\n";
  }
  return out;
}

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> out;
  for (const KeySpec& k : schema()) {
    std::vector<std::string> names;
    for (const ChoiceInfo& ch : k.choices) names.emplace_back(ch.name);
    out.push_back({.key = k.key, .type = k.type, .choices = std::move(names)});
  }
  return out;
}

std::string config_help() {
  std::string out;
  const Config& d = defaults();
  for (const KeySpec& k : schema()) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-28s %-10s default %-22s %s\n", k.key, k.type, k.get(d).c_str(), k.help);
    out += line;
    for (const ChoiceInfo& ch : k.choices) {  // under the default: each name and what it means
      std::snprintf(line, sizeof line, "%50s%-22.*s %.*s\n", "", static_cast<int>(ch.name.size()), ch.name.data(),
                    static_cast<int>(ch.help.size()), ch.help.data());
      out += line;
    }
  }
  return out;
}

ModelInput model_input(const Config& c, int64_t minibatch) {
  return {.batch = minibatch, .num_inputs = c.data.num_inputs, .seq_len = c.data.seq_len};
}

DataContext data_context(const Config& c) {
  return {.seed = c.seed,
          .num_classes = c.model.num_classes,
          .model_vocab_size = c.model.vocab_size,
          .model_num_outputs = c.model.num_outputs,
          .num_minibatches = c.optimizer.num_minibatches};
}

}  // namespace loom
