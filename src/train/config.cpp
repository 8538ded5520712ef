#include "train/config.h"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <sstream>

#include "core/error.h"

namespace loom {

namespace {

enum class KeyType { integer, number, string, dtype, boolean };

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "an integer";
    case KeyType::number:
      return "a number";
    case KeyType::string:
      return "a string";
    case KeyType::dtype:
      return "a dtype name (float32, bfloat16, float16)";
    case KeyType::boolean:
      return "true or false";
  }
  return "?";
}

// One configuration key: where it lives in Config and how to read and print it.
struct KeySpec {
  const char* key;
  KeyType type;
  const char* help;
  std::function<void(Config&, const toml::node&)> set_toml;  // throws std::invalid_argument
  std::function<void(Config&, const std::string&)> set_text;
  std::function<std::string(const Config&)> get;
};

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
  if (used != s.size() || !std::isfinite(v)) throw std::invalid_argument("not a finite number");
  return v;
}
DType parse_dtype(const std::string& s) {
  auto d = dtype_from_name(s);
  if (!d || *d == DType::i32) throw std::invalid_argument("not a float dtype");
  return *d;
}

template <class Get>
KeySpec make_int(const char* key, const char* help, Get ref) {
  return {key,
          KeyType::integer,
          help,
          [ref](Config& c, const toml::node& n) {
            auto v = n.value<int64_t>();
            if (!n.is_integer() || !v) throw std::invalid_argument("not an integer");
            ref(c) = static_cast<std::remove_reference_t<decltype(ref(c))>>(*v);
          },
          [ref](Config& c, const std::string& s) {
            ref(c) = static_cast<std::remove_reference_t<decltype(ref(c))>>(parse_int(s));
          },
          [ref](const Config& c) { return std::to_string(ref(const_cast<Config&>(c))); }};
}
template <class Get>
KeySpec make_number(const char* key, const char* help, Get ref) {
  return {key,
          KeyType::number,
          help,
          [ref](Config& c, const toml::node& n) {
            if (!n.is_number()) throw std::invalid_argument("not a number");
            ref(c) = *n.value<double>();
          },
          [ref](Config& c, const std::string& s) { ref(c) = parse_number(s); },
          [ref](const Config& c) { return fmt_double(ref(const_cast<Config&>(c))); }};
}
template <class Get>
KeySpec make_string(const char* key, const char* help, Get ref) {
  return {key,
          KeyType::string,
          help,
          [ref](Config& c, const toml::node& n) {
            if (!n.is_string()) throw std::invalid_argument("not a string");
            ref(c) = *n.value<std::string>();
          },
          [ref](Config& c, const std::string& s) { ref(c) = s; },
          [ref](const Config& c) { return "\"" + ref(const_cast<Config&>(c)) + "\""; }};
}
template <class Get>
KeySpec make_dtype(const char* key, const char* help, Get ref) {
  return {key,
          KeyType::dtype,
          help,
          [ref](Config& c, const toml::node& n) {
            if (!n.is_string()) throw std::invalid_argument("not a string");
            ref(c) = parse_dtype(*n.value<std::string>());
          },
          [ref](Config& c, const std::string& s) { ref(c) = parse_dtype(s); },
          [ref](const Config& c) { return std::string("\"") + dtype_name(ref(const_cast<Config&>(c))) + "\""; }};
}

template <class Get>
KeySpec make_bool(const char* key, const char* help, Get ref) {
  return {key,
          KeyType::boolean,
          help,
          [ref](Config& c, const toml::node& n) {
            if (!n.is_boolean()) throw std::invalid_argument("not a boolean");
            ref(c) = *n.value<bool>();
          },
          [ref](Config& c, const std::string& s) {
            if (s == "true" || s == "1")
              ref(c) = true;
            else if (s == "false" || s == "0")
              ref(c) = false;
            else
              throw std::invalid_argument("not a boolean");
          },
          [ref](const Config& c) { return std::string(ref(const_cast<Config&>(c)) ? "true" : "false"); }};
}

#define LOOM_REF(member) \
  [](Config & c) -> auto& { return c.member; }

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> keys = {
      make_int("seed", "seed of every random stream (init, data, dropout)", LOOM_REF(seed)),
      make_string("device", "where to run: auto (the best available), cpu, or reference (slow oracle)",
                  LOOM_REF(device)),
      make_int("threads", "CPU threads (0 = all cores)", LOOM_REF(threads)),
      make_string("model.kind", "model family: mlp_classifier | transformer", LOOM_REF(model.kind)),
      make_dtype("model.dtype", "compute dtype of activations; params and optimizer state stay float32",
                 LOOM_REF(model.dtype)),
      make_int("model.hidden_size", "hidden width", LOOM_REF(model.hidden_size)),
      make_int("model.num_classes", "output classes of the classifier", LOOM_REF(model.num_classes)),
      make_number("model.dropout_rate", "dropout rate in [0, 1)", LOOM_REF(model.dropout_rate)),
      make_number("model.layer_norm_eps", "LayerNorm epsilon (Flax default 1e-6)", LOOM_REF(model.layer_norm_eps)),
      make_int("model.num_layers", "transformer blocks", LOOM_REF(model.num_layers)),
      make_int("model.head_dim", "attention head width; num_heads = hidden_size / head_dim", LOOM_REF(model.head_dim)),
      make_int("model.mlp_expansion", "MLP hidden width = mlp_expansion × hidden_size", LOOM_REF(model.mlp_expansion)),
      make_int("model.vocab_size", "token embedding rows", LOOM_REF(model.vocab_size)),
      make_int("model.num_outputs", "output logits per position (the vocabulary for a language model)",
               LOOM_REF(model.num_outputs)),
      make_int("model.max_seq_len", "rows of the learned position embedding", LOOM_REF(model.max_seq_len)),
      make_dtype("model.softmax_dtype", "dtype of the attention logits and softmax", LOOM_REF(model.softmax_dtype)),
      make_bool("model.causal_mask", "causal attention mask", LOOM_REF(model.causal_mask)),
      make_string("model.remat", "remat regions: none, or comma-separated MLP, Attn, Block", LOOM_REF(model.remat)),
      make_string("model.remat_policy",
                  "what a remat region saves: nothing_saveable, dots_saveable, dots_with_no_batch_dims_saveable, "
                  "everything_saveable, save_only_these_names",
                  LOOM_REF(model.remat_policy)),
      make_string("model.remat_save_names", "save_only_these_names: comma-separated scope patterns, e.g. */attn/qkv",
                  LOOM_REF(model.remat_save_names)),
      make_bool("model.scan_layers",
                "parameter layout of files: stacked [num_layers, ...] (the tutorial's nn.scan); execution is the same",
                LOOM_REF(model.scan_layers)),
      make_string("model.block_order", "mlp_first (the tutorial: x + mlp(x), then x + attn(x)) or attn_first (GPT-2)",
                  LOOM_REF(model.block_order)),
      make_bool("model.use_bias", "biases in the Dense layers (nanoGPT's bias)", LOOM_REF(model.use_bias)),
      make_bool("model.tie_embeddings", "logits = x · embeddingᵀ (GPT-2 weight tying; needs num_outputs = vocab_size)",
                LOOM_REF(model.tie_embeddings)),
      make_string("model.init",
                  "parameter init: flax (the tutorial's Flax defaults) or gpt2 (normal 0.02, residual projections / "
                  "sqrt(2·layers))",
                  LOOM_REF(model.init)),
      make_bool("model.embed_dropout", "dropout after the token + position embedding (GPT-2)",
                LOOM_REF(model.embed_dropout)),
      make_string("optimizer.name", "optimizer: sgd, adam or adamw (Optax semantics)", LOOM_REF(optimizer.name)),
      make_number("optimizer.learning_rate", "learning rate (the peak value when a warmup schedule is set)",
                  LOOM_REF(optimizer.learning_rate)),
      make_number("optimizer.b1", "Adam beta1", LOOM_REF(optimizer.b1)),
      make_number("optimizer.b2", "Adam beta2", LOOM_REF(optimizer.b2)),
      make_number("optimizer.eps", "Adam epsilon", LOOM_REF(optimizer.eps)),
      make_number("optimizer.eps_root", "Adam epsilon inside the square root", LOOM_REF(optimizer.eps_root)),
      make_number("optimizer.momentum", "sgd momentum (0 = none)", LOOM_REF(optimizer.momentum)),
      make_bool("optimizer.nesterov", "sgd Nesterov momentum", LOOM_REF(optimizer.nesterov)),
      make_number("optimizer.weight_decay", "adamw decoupled weight decay", LOOM_REF(optimizer.weight_decay)),
      make_string("optimizer.weight_decay_mask",
                  "which params adamw decays: all, kernels (no biases, norms, embeddings), ndim2 (every tensor with 2+ "
                  "dims, nanoGPT)",
                  LOOM_REF(optimizer.weight_decay_mask)),
      make_number("optimizer.clip_norm", "clip_by_global_norm before the optimizer (0 = off)",
                  LOOM_REF(optimizer.clip_norm)),
      make_string("optimizer.shard",
                  "more than one rank: none, or state (ZeRO-1: each rank holds and updates 1/N of the optimizer "
                  "moments, gradients are reduce-scattered and the parameters all-gathered)",
                  LOOM_REF(optimizer.shard)),
      make_string("optimizer.schedule",
                  "learning-rate schedule: constant, warmup_cosine_decay, warmup_exponential_decay",
                  LOOM_REF(optimizer.schedule.kind)),
      make_number("optimizer.init_value", "schedule: value at step 0 (warmup start)",
                  LOOM_REF(optimizer.schedule.init_value)),
      make_int("optimizer.warmup_steps", "schedule: linear warmup steps", LOOM_REF(optimizer.schedule.warmup_steps)),
      make_int("optimizer.decay_steps", "warmup_cosine_decay: total steps including warmup",
               LOOM_REF(optimizer.schedule.decay_steps)),
      make_number("optimizer.end_value", "schedule: final value (cosine) or bound (exponential; 0 = none)",
                  LOOM_REF(optimizer.schedule.end_value)),
      make_number("optimizer.exponent", "warmup_cosine_decay exponent", LOOM_REF(optimizer.schedule.exponent)),
      make_int("optimizer.transition_steps", "warmup_exponential_decay: steps per decay",
               LOOM_REF(optimizer.schedule.transition_steps)),
      make_number("optimizer.decay_rate", "warmup_exponential_decay rate", LOOM_REF(optimizer.schedule.decay_rate)),
      make_int("optimizer.transition_begin", "warmup_exponential_decay: steps after warmup before decay starts",
               LOOM_REF(optimizer.schedule.transition_begin)),
      make_bool("optimizer.staircase", "warmup_exponential_decay: decay in discrete steps",
                LOOM_REF(optimizer.schedule.staircase)),
      make_string("optimizer.loss_scale", "float16 loss scaling: dynamic (GradScaler), static, or none",
                  LOOM_REF(optimizer.loss_scale)),
      make_number("optimizer.loss_scale_init", "initial (or static) loss scale", LOOM_REF(optimizer.loss_scale_init)),
      make_number("optimizer.loss_scale_growth", "dynamic: factor after loss_scale_interval finite steps",
                  LOOM_REF(optimizer.loss_scale_growth)),
      make_number("optimizer.loss_scale_backoff", "dynamic: factor after a non-finite step",
                  LOOM_REF(optimizer.loss_scale_backoff)),
      make_int("optimizer.loss_scale_interval", "dynamic: finite steps before growing",
               LOOM_REF(optimizer.loss_scale_interval)),
      make_int("optimizer.num_minibatches", "gradient accumulation: minibatches per step (divides data.batch_size)",
               LOOM_REF(optimizer.num_minibatches)),
      make_string("data.kind",
                  "data source: random_classification or random_tokens (the tutorials' fixed random batches)",
                  LOOM_REF(data.kind)),
      make_int("data.batch_size", "examples per optimizer step (all minibatches together)", LOOM_REF(data.batch_size)),
      make_int("data.num_inputs", "input features of random_classification data", LOOM_REF(data.num_inputs)),
      make_int("data.seq_len", "tokens per sequence", LOOM_REF(data.seq_len)),
      make_int("data.vocab_size", "random_tokens: tokens drawn from [1, vocab_size)", LOOM_REF(data.vocab_size)),
      make_string("data.dir", "tokens: directory written by `loom prepare` (train.bin, val.bin, meta.json)",
                  LOOM_REF(data.dir)),
      make_int("train.steps", "optimizer steps to run", LOOM_REF(train.steps)),
      make_int("train.log_every", "log every N steps", LOOM_REF(train.log_every)),
      make_string("train.metrics_file",
                  "JSONL file with one object per logged step (empty: RUN/metrics.jsonl for runs with --out)",
                  LOOM_REF(train.metrics_file)),
      make_int("train.eval_interval", "evaluate the validation loss every N steps (0 = never)",
               LOOM_REF(train.eval_interval)),
      make_int("train.eval_iters", "validation batches per evaluation", LOOM_REF(train.eval_iters)),
      make_int("train.checkpoint_interval", "save a checkpoint every N steps (0 = at evaluations and at the end)",
               LOOM_REF(train.checkpoint_interval)),
      make_int("train.keep_last", "checkpoints to keep (the best one is kept apart)", LOOM_REF(train.keep_last)),
      make_int("train.sample_tokens", "after training, print a sample of this many tokens (0 = none)",
               LOOM_REF(train.sample_tokens)),
      make_int("train.bucket_kib",
               "more than one rank (mpirun): gradients are summed over ranks in buckets of this many KiB, each as "
               "soon as the backward has written it (no effect on the result)",
               LOOM_REF(train.bucket_kib)),
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

std::string known_keys_near(const std::string& key) {
  const std::string section = key.find('.') == std::string::npos ? "" : key.substr(0, key.find('.') + 1);
  std::string out;
  for (const KeySpec& k : schema()) {
    const std::string name = k.key;
    const bool same_section = section.empty() ? name.find('.') == std::string::npos : name.rfind(section, 0) == 0;
    if (same_section) out += (out.empty() ? "" : ", ") + name;
  }
  if (out.empty())
    for (const KeySpec& k : schema()) out += (out.empty() ? "" : ", ") + std::string(k.key);
  return out;
}

void walk(Config& c, const toml::table& t, const std::string& prefix, const std::string& file) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      walk(c, *sub, key, file);
      continue;
    }
    const KeySpec* spec = find_key(key);
    if (!spec)
      throw UserError(file + ": " + key, "unknown configuration key",
                      "known keys here: " + known_keys_near(key) + " (loom train --help-config lists all)");
    try {
      spec->set_toml(c, node);
    } catch (const std::invalid_argument& e) {
      throw UserError(file + ": " + key, std::string("expected ") + type_name(spec->type) + " (" + e.what() + ")",
                      "write e.g. " + key + " = " + spec->get(defaults()));
    }
  }
}

}  // namespace

void apply_override(Config& c, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("override '" + assignment + "'", "expected section.key=value",
                    "for example optimizer.num_minibatches=4");
  const std::string key = assignment.substr(0, eq);
  const std::string val = assignment.substr(eq + 1);
  const KeySpec* spec = find_key(key);
  if (!spec)
    throw UserError("override " + key, "unknown configuration key", "known keys here: " + known_keys_near(key));
  try {
    spec->set_text(c, val);
  } catch (const std::invalid_argument& e) {
    throw UserError("override " + key, "'" + val + "' is not " + type_name(spec->type) + " (" + e.what() + ")",
                    "write e.g. " + key + "=" + spec->get(defaults()));
  }
}

void validate_config(const Config& c) {
  const std::string& f = c.source.empty() ? std::string("config") : c.source;
  auto need = [&](bool ok, const std::string& key, const std::string& problem, const std::string& hint) {
    if (!ok) throw UserError(f + ": " + key, problem, hint);
  };
  need(c.device == "auto" || c.device == "cpu" || c.device == "reference", "device",
       "unknown device '" + c.device + "'", "use auto, cpu or reference");
  need(c.threads >= 0, "threads", "must be >= 0", "0 uses all cores");
  need(c.model.kind == "mlp_classifier" || c.model.kind == "transformer", "model.kind",
       "unknown model kind '" + c.model.kind + "'", "use mlp_classifier or transformer");
  need(c.model.hidden_size >= 1, "model.hidden_size", "must be >= 1", "e.g. 256");
  need(c.model.num_classes >= 1, "model.num_classes", "must be >= 1", "e.g. 100");
  need(c.model.dropout_rate >= 0 && c.model.dropout_rate < 1, "model.dropout_rate", "must be in [0, 1)", "e.g. 0.1");
  need(c.model.layer_norm_eps > 0, "model.layer_norm_eps", "must be positive", "Flax uses 1e-6");
  need(c.optimizer.name == "adam" || c.optimizer.name == "adamw" || c.optimizer.name == "sgd", "optimizer.name",
       "unknown optimizer '" + c.optimizer.name + "'", "use sgd, adam or adamw");
  need(c.optimizer.weight_decay_mask == "all" || c.optimizer.weight_decay_mask == "kernels" ||
           c.optimizer.weight_decay_mask == "ndim2",
       "optimizer.weight_decay_mask", "unknown mask '" + c.optimizer.weight_decay_mask + "'",
       "use all, kernels or ndim2");
  need(c.optimizer.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0", "e.g. 0.1");
  need(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1, "optimizer.momentum", "must be in [0, 1)", "e.g. 0.9");
  need(c.optimizer.clip_norm >= 0, "optimizer.clip_norm", "must be >= 0", "0 disables clipping; GPT-2 uses 1.0");
  need(c.optimizer.shard != "state+grads", "optimizer.shard",
       "state+grads (ZeRO-2) is not available: the gradients are persistent accumulation buffers the backward "
       "writes whole on every rank, so sharding them would save no memory",
       "use state (ZeRO-1) or none");
  need(c.optimizer.shard == "none" || c.optimizer.shard == "state", "optimizer.shard",
       "unknown mode '" + c.optimizer.shard + "'", "use none or state");
  need(c.optimizer.loss_scale == "dynamic" || c.optimizer.loss_scale == "static" || c.optimizer.loss_scale == "none",
       "optimizer.loss_scale", "unknown loss scaling '" + c.optimizer.loss_scale + "'", "use dynamic, static or none");
  need(c.optimizer.loss_scale_init > 0, "optimizer.loss_scale_init", "must be positive",
       "GradScaler's default is 65536");
  need(c.optimizer.loss_scale_growth >= 1, "optimizer.loss_scale_growth", "must be >= 1", "GradScaler's default is 2");
  need(c.optimizer.loss_scale_backoff > 0 && c.optimizer.loss_scale_backoff < 1, "optimizer.loss_scale_backoff",
       "must be in (0, 1)", "GradScaler's default is 0.5");
  need(c.optimizer.loss_scale_interval >= 1, "optimizer.loss_scale_interval", "must be >= 1",
       "GradScaler's default is 2000");
  {
    ScheduleSpec s = c.optimizer.schedule;
    s.value = c.optimizer.learning_rate;
    try {
      validate_schedule(s, "optimizer.");
    } catch (const UserError& e) {
      throw UserError(f + ": " + e.subject(), std::string(e.what()).substr(e.subject().size() + 2), e.hint());
    }
  }
  need(c.optimizer.learning_rate >= 0, "optimizer.learning_rate", "must be >= 0", "e.g. 1e-3");
  need(c.optimizer.b1 >= 0 && c.optimizer.b1 < 1, "optimizer.b1", "must be in [0, 1)", "Adam's default is 0.9");
  need(c.optimizer.b2 >= 0 && c.optimizer.b2 < 1, "optimizer.b2", "must be in [0, 1)", "Adam's default is 0.999");
  need(c.optimizer.eps >= 0, "optimizer.eps", "must be >= 0", "Adam's default is 1e-8");
  need(c.optimizer.num_minibatches >= 1, "optimizer.num_minibatches", "must be >= 1", "1 means no accumulation");
  need(c.data.kind == "random_classification" || c.data.kind == "random_tokens" || c.data.kind == "tokens", "data.kind",
       "unknown data kind '" + c.data.kind + "'", "use random_classification, random_tokens or tokens");
  need(c.data.kind != "tokens" || !c.data.dir.empty(), "data.dir", "data.kind = tokens needs a data directory",
       "prepare one with `loom prepare char data/tinyshakespeare.txt data/shakespeare_char` and set data.dir");
  need(c.train.eval_interval >= 0, "train.eval_interval", "must be >= 0", "0 disables evaluation");
  need(c.train.eval_iters >= 1, "train.eval_iters", "must be >= 1", "e.g. 20");
  need(c.train.checkpoint_interval >= 0, "train.checkpoint_interval", "must be >= 0", "0 saves at evaluations");
  need(c.train.keep_last >= 1, "train.keep_last", "must be >= 1", "e.g. 3");
  need(c.train.sample_tokens >= 0, "train.sample_tokens", "must be >= 0", "e.g. 200");
  need(c.train.bucket_kib >= 1, "train.bucket_kib", "must be >= 1", "e.g. 4096 (4 MiB)");
  if (c.model.kind == "transformer") {
    need(c.model.num_layers >= 1, "model.num_layers", "must be >= 1", "e.g. 12");
    need(c.model.head_dim >= 1, "model.head_dim", "must be >= 1", "e.g. 64");
    need(c.model.hidden_size % c.model.head_dim == 0, "model.hidden_size",
         "hidden_size " + std::to_string(c.model.hidden_size) + " is not a multiple of model.head_dim " +
             std::to_string(c.model.head_dim),
         "num_heads = hidden_size / head_dim must be whole: change either");
    need(c.model.mlp_expansion >= 1, "model.mlp_expansion", "must be >= 1", "the tutorial uses 4");
    need(c.model.vocab_size >= 2, "model.vocab_size", "must be >= 2", "e.g. 2048");
    need(c.model.num_outputs >= 1, "model.num_outputs", "must be >= 1", "usually the vocabulary size");
    need(c.model.max_seq_len >= 1, "model.max_seq_len", "must be >= 1", "e.g. 512");
    need(c.data.seq_len >= 1 && c.data.seq_len <= c.model.max_seq_len, "data.seq_len",
         "seq_len " + std::to_string(c.data.seq_len) +
             " is outside [1, model.max_seq_len = " + std::to_string(c.model.max_seq_len) + "]",
         "raise model.max_seq_len or shorten data.seq_len");
    const std::string& rp = c.model.remat_policy;
    need(rp == "nothing_saveable" || rp == "everything_saveable" || rp == "dots_saveable" ||
             rp == "dots_with_no_batch_dims_saveable" || rp == "save_only_these_names",
         "model.remat_policy", "unknown remat policy '" + rp + "'",
         "use nothing_saveable, dots_saveable, dots_with_no_batch_dims_saveable, everything_saveable or "
         "save_only_these_names (with model.remat_save_names)");
    need(rp != "save_only_these_names" || !c.model.remat_save_names.empty(), "model.remat_save_names",
         "save_only_these_names needs at least one pattern", "e.g. model.remat_save_names=*/attn/qkv");
    need(c.model.init == "flax" || c.model.init == "gpt2", "model.init", "unknown init '" + c.model.init + "'",
         "use flax or gpt2");
    need(!c.model.tie_embeddings || c.model.num_outputs == c.model.vocab_size, "model.tie_embeddings",
         "tied embeddings need model.num_outputs == model.vocab_size", "set num_outputs to the vocabulary size");
    need(c.model.block_order == "mlp_first" || c.model.block_order == "attn_first", "model.block_order",
         "unknown block order '" + c.model.block_order + "'", "use mlp_first or attn_first");
    need(c.data.kind == "random_tokens" || c.data.kind == "tokens", "data.kind", "a transformer needs token data",
         "use random_tokens or tokens");
    need(c.data.kind != "random_tokens" || (c.data.vocab_size >= 2 && c.data.vocab_size <= c.model.vocab_size),
         "data.vocab_size", "must be in [2, model.vocab_size]", "tokens must be valid embedding rows");
  } else {
    need(c.data.kind == "random_classification", "data.kind", "the mlp_classifier needs random_classification data",
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
  for (const std::string& o : overrides) apply_override(c, o);
  validate_config(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  c.source = path;
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
  walk(c, t, "", path);
  for (const std::string& o : overrides) apply_override(c, o);
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
  walk(c, t, "", source);
  for (const std::string& o : overrides) apply_override(c, o);
  validate_config(c);
  return c;
}

std::string config_to_toml(const Config& c) {
  std::string out, section;
  for (const KeySpec& k : schema()) {
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

std::string config_help() {
  std::string out;
  const Config& d = defaults();
  for (const KeySpec& k : schema()) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-28s %-10s default %-22s %s\n", k.key,
                  k.type == KeyType::integer   ? "int"
                  : k.type == KeyType::number  ? "number"
                  : k.type == KeyType::dtype   ? "dtype"
                  : k.type == KeyType::boolean ? "bool"
                                               : "string",
                  k.get(d).c_str(), k.help);
    out += line;
  }
  return out;
}

DataContext data_context(const Config& c) {
  return {.seed = c.seed,
          .num_classes = c.model.num_classes,
          .model_vocab_size = c.model.vocab_size,
          .num_minibatches = c.optimizer.num_minibatches};
}

}  // namespace loom
