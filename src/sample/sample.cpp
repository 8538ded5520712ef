#include "sample/sample.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "graph/passes/plan.h"
#include "nn/models.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace loom {

// ---- Sampler ---------------------------------------------------------------------------------

Sampler::Sampler(const Config& c, Backend& be) {
  const nn::ModelKindInfo& kind = nn::model_kind(c.model.kind);
  if (!kind.build_decoder)
    throw UserError("model.kind",
                    "is '" + std::string(kind.name) + "': only a language model with a decoder can generate text",
                    "sample from a checkpoint of a transformer run");
  if (!c.model.causal_mask)
    throw UserError("model.causal_mask", "is false: generating token by token needs a causal model",
                    "sample from a model trained with model.causal_mask = true");
  max_len_ = c.model.max_seq_len;
  num_outputs_ = c.model.num_outputs;
  model_ = kind.build_decoder(c.model, 1, max_len_);
  const Graph& g = model_.graph;
  positions_ = g.input_by_name("positions");
  for (const Value& v : g.values())
    if (v.kind == ValueKind::input && v.name.size() > 6 && v.name.compare(v.name.size() - 6, 6, "_cache") == 0)
      caches_.push_back(g.input_by_name(v.name));
  MemoryPlan plan = plan_memory(g, default_schedule(g));
  if (Status s = Executor::create(be, g, std::move(plan), &exec_); !s) throw std::runtime_error(s.message());
  logits_.resize(static_cast<size_t>(num_outputs_));
}

Sampler::~Sampler() = default;

void Sampler::copy_params_from(const Executor& src) {
  const Graph& g = model_.graph;
  std::vector<unsigned char> buf;
  for (const Param& p : g.params()) {
    const Value& v = g.value(p.value);
    const ValueId s = src.graph().input_by_name(v.name);
    LOOM_ASSERT(s != kNoValue && src.graph().value(s).shape == v.shape, "parameter '" + v.name + "' differs");
    buf.resize(static_cast<size_t>(v.bytes()));
    src.download(s, buf.data());
    exec_->upload(p.value, buf.data());
  }
}

void Sampler::reset() {
  for (ValueId c : caches_) exec_->zero(c);
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

std::span<const float> Sampler::next_logits(std::span<const int32_t> context) {
  LOOM_ASSERT(!context.empty(), "next_logits needs at least one token of context");
  const size_t n = context.size();
  // Do the caches hold a prefix of what remains of the context? Otherwise start over.
  bool extends = start_ + cached_.size() <= n && !cached_.empty();
  for (size_t i = 0; extends && i < cached_.size(); ++i) extends = context[start_ + i] == cached_[i];
  if (!extends) {
    reset();
    if (n > static_cast<size_t>(max_len_)) start_ = n - static_cast<size_t>(std::max<int64_t>(max_len_ / 2, 1));
  } else if (n - start_ > static_cast<size_t>(max_len_)) {  // sliding window
    reset();
    start_ = n - static_cast<size_t>(std::max<int64_t>(max_len_ / 2, 1));
    ++refills_;
  }
  if (start_ + cached_.size() == n) return logits_;  // nothing new: the last token's logits
  std::span<const float> l;
  for (size_t i = start_ + cached_.size(); i < n; ++i) l = feed(context[i]);
  return l;
}

// ---- sampling --------------------------------------------------------------------------------

int32_t sample_token(std::span<const float> logits, double temperature, int64_t top_k, PhiloxKey key, uint64_t index) {
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

std::vector<int32_t> generate(Sampler& s, std::vector<int32_t> context, int64_t n, double temperature, int64_t top_k,
                              uint64_t seed, int64_t vocab_limit, const std::function<void(int32_t)>& on_token) {
  const PhiloxKey key = named_key(seed, "sample");
  const size_t V = vocab_limit > 0 ? static_cast<size_t>(std::min(vocab_limit, s.num_outputs()))
                                   : static_cast<size_t>(s.num_outputs());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::span<const float> logits = s.next_logits(context).first(V);
    const int32_t t = sample_token(logits, temperature, top_k, key, static_cast<uint64_t>(i));
    context.push_back(t);
    out.push_back(t);
    if (on_token) on_token(t);
  }
  return out;
}

// ---- UTF-8 streaming -------------------------------------------------------------------------

std::string Utf8Stream::push(std::string_view bytes) {
  pending_ += bytes;
  // The last lead byte among the final (up to) 4 bytes: is its sequence complete?
  size_t keep = pending_.size();
  for (size_t back = 1; back <= 4 && back <= pending_.size(); ++back) {
    const auto b = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    if (len > back) keep = pending_.size() - back;  // incomplete: hold it back
    break;
  }
  std::string ready = pending_.substr(0, keep);
  pending_.erase(0, keep);
  return ready;
}

// ---- loom sample -----------------------------------------------------------------------------

void validate_sample_options(const SampleOptions& o) {
  if (o.tokens < 0) throw UserError("--tokens", "must be >= 0, got " + std::to_string(o.tokens), "e.g. --tokens 200");
  if (o.threads < -1)
    throw UserError("--threads", "must be >= 0, got " + std::to_string(o.threads), "0 uses all cores");
  if (o.top_k < 0)
    throw UserError("--top-k", "must be >= 0, got " + std::to_string(o.top_k),
                    "0 keeps the whole vocabulary; e.g. --top-k 200");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw UserError("--temperature", "must be a finite number >= 0, got " + std::to_string(o.temperature),
                    "0 is greedy decoding; e.g. --temperature 0.8");
}

namespace {

void write_out(std::FILE* f, std::string_view s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  if (nn::model_kind(c.model.kind).language_model && tok->vocab_size() > c.model.vocab_size)
    throw UserError(o.checkpoint,
                    "its tokenizer has " + std::to_string(tok->vocab_size()) + " tokens but model.vocab_size is " +
                        std::to_string(c.model.vocab_size),
                    "the tokenizer.json does not belong to this checkpoint");
  std::vector<int32_t> prompt = tok->encode(o.prompt);  // UserError for text outside the vocabulary
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
  Sampler s(c, *be);
  src.load_params(s.executor());

  write_out(o.out, o.prompt);
  Utf8Stream stream;
  const auto t0 = std::chrono::steady_clock::now();
  s.next_logits(prompt);  // prefill (generate() would do it too: timed apart for --stats)
  const double prefill_s = seconds_since(t0);
  const int64_t prefilled = s.runs();
  const auto t1 = std::chrono::steady_clock::now();
  generate(s, prompt, o.tokens, o.temperature, o.top_k, o.seed, tok->vocab_size(), [&](int32_t id) {
    const int32_t one[1] = {id};
    write_out(o.out, stream.push(tok->decode(one)));
  });
  const double decode_s = seconds_since(t1);
  write_out(o.out, stream.flush());
  if (o.out == stdout && isatty(STDOUT_FILENO)) write_out(o.out, "\n");
  if (o.stats) {
    const int64_t runs = s.runs() - prefilled;
    std::fprintf(stderr,
                 "loom sample: %s, %d threads: prefill %lld tokens in %.1f ms; %lld tokens in %.1f ms = %.3f ms/token "
                 "(%lld program runs of %zu nodes, %.3f ms each; %lld window refills)\n",
                 o.checkpoint.c_str(), num_threads(), static_cast<long long>(prefilled), prefill_s * 1e3,
                 static_cast<long long>(o.tokens), decode_s * 1e3,
                 o.tokens ? decode_s * 1e3 / static_cast<double>(o.tokens) : 0.0, static_cast<long long>(runs),
                 s.nodes_per_token(), runs ? decode_s * 1e3 / static_cast<double>(runs) : 0.0,
                 static_cast<long long>(s.window_refills()));
  }
  return 0;
}

}  // namespace loom
