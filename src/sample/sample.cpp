#include "sample/sample.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "backend/registry.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "graph/passes/narrow_params.h"
#include "graph/passes/plan.h"
#include "io/param_io.h"
#include "nn/models.h"
#include "sample/chat.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {

// ---- Sampler ---------------------------------------------------------------------------------

namespace {

// Why two: a sample's prefills have the prompt's length and the window refill's (the header).
constexpr size_t kPrefillPrograms = 2;

}  // namespace

Sampler::Sampler(const Config& c, Backend& be, Prefill how, int64_t context) : spec_(c.model), how_(how) {
  const nn::ModelKindInfo& kind = nn::model_kind(c.model.kind);
  if (!kind.build_decoder)
    throw UserError("model.kind",
                    "is '" + std::string(kind.name) + "': only a language model with a decoder can generate text",
                    "sample from a checkpoint of a transformer run");
  if (!c.model.transformer.causal_mask)
    throw UserError("model.causal_mask", "is false: generating token by token needs a causal model",
                    "sample from a model trained with model.causal_mask = true");
  if (context != 0 && (context < 2 || context > c.model.transformer.max_seq_len))
    throw UserError("--context",
                    "must be in [2, " + std::to_string(c.model.transformer.max_seq_len) +
                        "] (model.max_seq_len), got " + std::to_string(context),
                    "leave it out to use every position the model has");
  max_len_ = context > 0 ? context : c.model.transformer.max_seq_len;
  num_outputs_ = c.model.transformer.num_outputs;
  model_ = kind.build_decoder(c.model, 1, max_len_);
  narrow_params(model_.graph);
  const Graph& g = model_.graph;
  positions_ = g.input_by_name("positions");
  for (const Value& v : g.values())
    if (v.kind == ValueKind::input && v.name.ends_with("_cache")) caches_.push_back(g.input_by_name(v.name));
  Executor::External none;
  Executor::bind_no_gradients(g, none);
  if (Status s = Executor::create(be, g, plan_program(be, g, default_schedule(g)), &exec_, &none); !s)
    throw std::runtime_error(s.message());
  logits_.resize(static_cast<size_t>(num_outputs_));
}

Sampler::~Sampler() = default;

void Sampler::copy_params_from(const Executor& src) {
  const Graph& g = model_.graph;
  std::vector<float> master;
  for (const Param& p : g.params()) {
    const Value& v = g.value(p.value);
    const ValueId s = src.graph().input_by_name(v.name);
    if (s != kNoValue && src.graph().value(s).dtype != DType::f32) {  // a LoRA base as lora.base_dtype stores it
      LOOM_ASSERT(s != kNoValue && src.graph().value(s).dtype == v.dtype && src.graph().value(s).shape == v.shape,
                  "parameter '" + v.name + "' differs");
      std::vector<unsigned char> bytes(static_cast<size_t>(v.bytes()));
      src.download(s, bytes.data());
      exec_->upload(p.value, bytes.data());
      continue;
    }
    LOOM_ASSERT(s != kNoValue && src.graph().value(s).shape == v.shape && src.graph().value(s).dtype == DType::f32,
                "parameter '" + v.name + "' differs");
    master.resize(static_cast<size_t>(v.shape.numel()));
    src.download(s, master.data());
    upload_param(*exec_, p.value, master.data());
  }
}

void Sampler::reset() {
  cached_.clear();
  start_ = 0;
}

std::span<const float> Sampler::feed(int32_t token) {
  const auto pos = static_cast<int32_t>(cached_.size());
  LOOM_ASSERT(pos < max_len_, "the KV cache is full");
  exec_->upload(model_.inputs, &token);
  exec_->upload(positions_, &pos);
  exec_->run(RunCtx{});
  exec_->download(model_.output, logits_.data());
  cached_.push_back(token);
  ++runs_;
  return logits_;
}

Sampler::PrefillProgram& Sampler::prefill_program(int64_t len) {
  const auto kept = std::find_if(prefills_.begin(), prefills_.end(), [&](const auto& p) { return p->len == len; });
  if (kept != prefills_.end()) {
    std::rotate(prefills_.begin(), kept, kept + 1);
    return *prefills_.front();
  }
  if (prefills_.size() == kPrefillPrograms) prefills_.pop_back();  // its arena goes before the next is allocated
  const auto t0 = std::chrono::steady_clock::now();
  auto p = std::make_unique<PrefillProgram>();
  p->len = len;
  p->model = nn::model_kind(spec_.kind).build_prefill(spec_, 1, len, max_len_);
  narrow_params(p->model.graph);
  const Graph& g = p->model.graph;
  // The decoder's parameters (narrowed alike: the same layers read them) and caches, by name: the
  // prefill program allocates neither.
  Executor::External shared;
  for (const Param& q : model_.graph.params()) {
    const Value& v = model_.graph.value(q.value);
    const ValueId mine = g.input_by_name(v.name);
    LOOM_ASSERT(mine != kNoValue && g.value(mine).dtype == v.dtype, "prefill parameter '" + v.name + "' differs");
    shared[v.name] = exec_->ptr(q.value);
  }
  for (ValueId c : caches_) shared[model_.graph.value(c).name] = exec_->ptr(c);
  Executor::bind_no_gradients(g, shared);
  Backend& be = exec_->backend();
  if (Status s = Executor::create(be, g, plan_program(be, g, default_schedule(g)), &p->exec, &shared); !s)
    throw std::runtime_error(s.message());
  p->own_bytes = p->exec->arena_bytes_allocated();
  for (const Value& v : g.values()) {  // its own: the token, position and row inputs
    if (v.kind == ValueKind::activation || shared.contains(v.name)) continue;
    LOOM_ASSERT(v.kind == ValueKind::input, "prefill parameter '" + v.name + "' is not the decoder's");
    p->own_bytes += v.bytes();
  }
  for (const auto& [v, bytes] : p->model.constants) p->exec->upload(v, bytes.data());
  prefills_.insert(prefills_.begin(), std::move(p));
  ++prefill_stats_.builds;
  prefill_stats_.build_seconds += seconds_since(t0);
  return *prefills_.front();
}

int64_t Sampler::prefill_bytes() const {
  int64_t n = 0;
  for (const auto& p : prefills_) n += p->own_bytes;
  return n;
}

std::span<const float> Sampler::prefill(std::span<const int32_t> tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  LOOM_ASSERT(n >= 1 && n <= max_len_, "prefill takes 1 to max_len tokens, got " + std::to_string(n));
  reset();
  PrefillProgram* p = how_ == Prefill::batched ? &prefill_program(n) : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  if (p) {
    p->exec->upload(p->model.inputs, tokens.data());
    p->exec->run(RunCtx{});
    p->exec->download(p->model.output, logits_.data());
    cached_.assign(tokens.begin(), tokens.end());
  } else {
    for (int32_t t : tokens) feed(t);
  }
  prefill_stats_.seconds += seconds_since(t0);
  ++prefill_stats_.passes;
  prefill_stats_.tokens += n;
  return logits_;
}

std::span<const float> Sampler::next_logits(std::span<const int32_t> context) {
  LOOM_ASSERT(!context.empty(), "next_logits needs at least one token of context");
  const size_t n = context.size(), window = static_cast<size_t>(max_len_);
  // Do the caches hold a prefix of what remains of the context? Otherwise start over.
  bool extends = start_ + cached_.size() <= n && !cached_.empty();
  for (size_t i = 0; extends && i < cached_.size(); ++i) extends = context[start_ + i] == cached_[i];
  if (!extends || n - start_ > window) {  // start over, from the last max_len/2 tokens when all do not fit
    if (extends) ++refills_;              // the sliding window
    const size_t start = n > window ? n - std::max<size_t>(window / 2, 1) : 0;
    prefill(context.subspan(start));
    start_ = start;
    return logits_;
  }
  if (start_ + cached_.size() == n) return logits_;  // nothing new: the last token's logits
  std::span<const float> l;
  for (size_t i = start_ + cached_.size(); i < n; ++i) l = feed(context[i]);
  return l;
}

// ---- sampling --------------------------------------------------------------------------------

int32_t sample_token(std::span<const float> logits, const Sampling& how, PhiloxKey key, uint64_t index) {
  const double temperature = how.temperature;
  const int64_t top_k = how.top_k;
  const size_t V = logits.size();
  LOOM_ASSERT(V > 0);
  for (float x : logits)
    if (!std::isfinite(x)) throw std::runtime_error("the model produced a non-finite logit (a diverged checkpoint?)");
  if (temperature == 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<double> x(V);
  for (size_t i = 0; i < V; ++i) x[i] = static_cast<double>(logits[i]) / temperature;
  double threshold = -INFINITY;  // keep x >= threshold: the top k and anything tied with the k-th
  if (top_k > 0 && static_cast<size_t>(top_k) < V) {
    std::vector<double> sorted = x;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    threshold = sorted[static_cast<size_t>(top_k - 1)];
  }
  const double mx = *std::max_element(x.begin(), x.end());
  double total = 0;
  for (double& v : x) total += v = v >= threshold ? std::exp(v - mx) : 0.0;
  if (how.top_p < 1) {  // the nucleus: most likely first (ties by index), until top_p of the mass
    std::vector<size_t> order;
    for (size_t i = 0; i < V; ++i)
      if (x[i] > 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
    double kept = 0;
    size_t n = 0;
    while (n < order.size() && (n == 0 || kept < how.top_p * total)) kept += x[order[n++]];
    for (size_t i = n; i < order.size(); ++i) x[order[i]] = 0;
    total = kept;
  }
  const double u = static_cast<double>(rng_uniform(key, index)) * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < V; ++i) {
    if (x[i] == 0) continue;
    cum += x[i];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;  // u rounded up to the total
}

std::vector<int32_t> generate(Sampler& s, std::vector<int32_t> context, int64_t n, const Sampling& how, uint64_t seed,
                              int64_t vocab_limit, const std::function<bool(int32_t)>& on_token,
                              std::span<const int32_t> stop) {
  const PhiloxKey key = named_key(seed, "sample");
  const size_t V = vocab_limit > 0 ? static_cast<size_t>(std::min(vocab_limit, s.num_outputs()))
                                   : static_cast<size_t>(s.num_outputs());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::span<const float> logits = s.next_logits(context).first(V);
    const int32_t t = sample_token(logits, how, key, static_cast<uint64_t>(i));
    context.push_back(t);
    out.push_back(t);
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    if (on_token && !on_token(t)) break;
  }
  return out;
}

// ---- loom sample -----------------------------------------------------------------------------

void validate_sample_options(const SampleOptions& o) {
  if (o.tokens < 0) throw UserError("--tokens", "must be >= 0, got " + std::to_string(o.tokens), "e.g. --tokens 200");
  if (o.threads < -1)
    throw UserError("--threads", "must be >= 0, got " + std::to_string(o.threads), "0 uses all cores");
  const Sampling& h = o.sampling;
  if (h.top_k < 0)
    throw UserError("--top-k", "must be >= 0, got " + std::to_string(h.top_k),
                    "0 keeps the whole vocabulary; e.g. --top-k 200");
  if (!(h.temperature >= 0) || !std::isfinite(h.temperature))
    throw UserError("--temperature", "must be a finite number >= 0, got " + std::to_string(h.temperature),
                    "0 is greedy decoding; e.g. --temperature 0.8");
  if (!(h.top_p > 0 && h.top_p <= 1))
    throw UserError("--top-p", "must be in (0, 1], got " + std::to_string(h.top_p),
                    "1 keeps every token top-k leaves; e.g. --top-p 0.9");
  if (o.num_samples < 1)
    throw UserError("--num-samples", "must be >= 1, got " + std::to_string(o.num_samples), "e.g. --num-samples 3");
  if (!o.prompt.empty() && !o.prompt_file.empty())
    throw UserError("--prompt-file " + o.prompt_file, "given together with --prompt", "give one of the two");
  if (!o.chat.empty() && (!o.prompt.empty() || !o.prompt_file.empty()))
    throw UserError("--chat", "given together with --prompt or --prompt-file",
                    "--chat takes the message itself (or - to read messages from stdin)");
  if (!o.chat.empty() && o.num_samples != 1)
    throw UserError("--num-samples", "must be 1 with --chat", "leave --num-samples out");
  if (o.chat.empty() && (!o.system.empty() || !o.template_path.empty()))
    throw UserError(o.system.empty() ? "--template" : "--system", "only applies to --chat",
                    "add --chat MESSAGE, or leave it out");
}

namespace {

void write_out(std::FILE* f, std::string_view s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

}  // namespace

int run_sample(const SampleOptions& o) {
  validate_sample_options(o);
  const ModelSource src(o.checkpoint);  // a loom run or checkpoint, or a Hugging Face directory
  const Config& c = src.config();
  const std::unique_ptr<Tokenizer> tok = src.tokenizer();
  if (!tok)
    throw UserError(o.checkpoint, "has no tokenizer (tokenizer.json)",
                    "sample from a run trained on token data (data.kind = tokens, prepared by `loom prepare`), or "
                    "a Hugging Face directory with its tokenizer.json");
  if (nn::model_kind(c.model.kind).language_model && tok->vocab_size() > c.model.transformer.vocab_size)
    throw UserError(o.checkpoint,
                    "its tokenizer has " + std::to_string(tok->vocab_size()) + " tokens but model.vocab_size is " +
                        std::to_string(c.model.transformer.vocab_size),
                    "the tokenizer.json does not belong to this checkpoint");
  std::string text = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream f(o.prompt_file, std::ios::binary);
    if (!f) throw UserError("--prompt-file " + o.prompt_file, "cannot be opened", "check the path");
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<int32_t> prompt;
  try {
    prompt = tok->encode(text);
  } catch (const UserError& e) {  // text outside the vocabulary, or not UTF-8: say which argument
    throw UserError(o.prompt_file.empty() ? "--prompt" : "--prompt-file " + o.prompt_file, e.what(), e.hint());
  }
  if (prompt.empty()) {  // nanoGPT starts from "\n"; GPT-2 vocabularies from <|endoftext|>
    if (tok->start_id() >= 0)
      prompt = {tok->start_id()};
    else {
      try {
        prompt = tok->encode("\n");
      } catch (const UserError&) {
        throw UserError("--prompt", "is empty and the vocabulary has no newline to start from", "give a prompt");
      }
    }
  }

  const std::unique_ptr<Backend> be = make_backend(Device::cpu);
  set_num_threads(static_cast<int>(o.threads >= 0 ? o.threads : c.threads));
  Sampler s(c, *be, o.prefill, o.context);
  src.load_params(s.executor());
  for (const std::string& skipped : src.skipped())
    std::fprintf(stderr, "loom sample: skipping a damaged checkpoint: %s\n", skipped.c_str());
  if (!o.chat.empty()) return run_chat(o, src.dir(), *tok, s);

  double total_s = 0;  // prefill passes and decoding, every sample
  for (int64_t k = 0; k < o.num_samples; ++k) {
    if (k > 0) write_out(o.out, "---------------\n");  // nanoGPT's separator
    write_out(o.out, text);
    DecodeStream stream(*tok, prompt);
    std::string last;  // what was written last, for the final newline
    const auto t0 = std::chrono::steady_clock::now();
    generate(s, prompt, o.tokens, o.sampling, o.seed + static_cast<uint64_t>(k), tok->vocab_size(), [&](int32_t id) {
      const std::string ready = stream.push(id);
      if (!ready.empty()) last = ready;
      write_out(o.out, ready);
      return true;
    });
    total_s += seconds_since(t0);
    const std::string rest = stream.flush();
    if (!rest.empty()) last = rest;
    write_out(o.out, rest);
    if (last.empty() ? text.empty() || text.back() != '\n' : last.back() != '\n') write_out(o.out, "\n");
  }
  if (o.stats) {
    // Prefill: its passes (the prompt's per sample, and the window refills'); decode: the rest of
    // the time but for building the prefill programs, per generated token (decoder run, sampling,
    // printing).
    const Sampler::PrefillStats& p = s.prefill_stats();
    const double decode_s = total_s - p.seconds - p.build_seconds;
    const auto tokens = static_cast<double>(o.tokens * o.num_samples);
    std::fprintf(
        stderr,
        "loom sample: %s, %d threads, %s prefill: prefill %lld tokens in %lld passes (%lld window refills) "
        "in %.1f ms = %.1f tokens/s; decode %.0f tokens in %.1f ms = %.3f ms/token = %.1f tokens/s "
        "(decoder of %zu nodes); %lld prefill programs built in %.1f ms, %.1f MiB held; parameters %.1f MiB\n",
        o.checkpoint.c_str(), num_threads(), o.prefill == Prefill::batched ? "batched" : "token-by-token",
        static_cast<long long>(p.tokens), static_cast<long long>(p.passes), static_cast<long long>(s.window_refills()),
        p.seconds * 1e3, p.seconds > 0 ? static_cast<double>(p.tokens) / p.seconds : 0.0, tokens, decode_s * 1e3,
        tokens > 0 ? decode_s * 1e3 / tokens : 0.0, decode_s > 0 ? tokens / decode_s : 0.0, s.nodes_per_token(),
        static_cast<long long>(p.builds), p.build_seconds * 1e3, static_cast<double>(s.prefill_bytes()) / (1 << 20),
        static_cast<double>(s.executor().plan().param_bytes) / (1 << 20));
  }
  return 0;
}

}  // namespace loom
