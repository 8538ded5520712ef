// Text generation with a key/value cache (`loom sample`, project issue 6 point 5).
//
// The model runs as a one-token program (nn::build_transformer_decoder): each layer keeps the
// keys and values of the tokens seen so far in persistent caches, so a token costs one pass of
// the network over one position plus attention over the cached rows — the prefix is never
// recomputed. The prompt is fed one token at a time (prefill), then every sampled token is fed
// back. The program is the same for every position; only the `positions` input changes.
//
// Sliding window: the caches hold model.max_seq_len positions (pos_emb has no more rows). When
// the sequence would outgrow them, the caches are cleared and the last max_seq_len/2 tokens are
// fed again at positions 0.. (re-prefill), so generation goes on indefinitely, each token seeing
// at least max_seq_len/2 tokens of context. nanoGPT crops the context the same way (it keeps the
// last block_size tokens, recomputing them for every token); halving the window amortises the
// re-prefill to one extra token per generated token at worst.
//
// Sampling (nanoGPT's sample.py, with its defaults temperature 0.8 and top-k 200, the same as the
// sample at the end of `loom train`): logits / temperature, keep the top_k (ties with the k-th
// largest are kept too), softmax, then keep the nucleus (top_p < 1: the most likely tokens whose
// probabilities first add up to top_p, at least one; Hugging Face's TopPLogitsWarper), and draw
// with loom's counter RNG: token i of a sample uses u = rng_uniform(named_key(seed, "sample"), i),
// so a (checkpoint, prompt, flags) triple always gives the same text; sample k of --num-samples
// uses seed + k. temperature 0 is greedy (argmax, first maximum wins).
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "nn/model.h"
#include "runtime/executor.h"
#include "train/config.h"

namespace loom {

// How a token is drawn from the logits (the header's rules).
struct Sampling {
  double temperature = 0.8;  // >= 0; 0 = greedy
  int64_t top_k = 200;       // >= 0; 0 = the whole vocabulary
  double top_p = 1.0;        // in (0, 1]; 1 = no nucleus cut
};

struct SampleOptions {
  std::string checkpoint;   // a ckpt_<step> directory, or a run directory (its latest checkpoint)
  std::string prompt;       // UTF-8; empty: start from "\n" (char vocabulary) or <|endoftext|> (GPT-2)
  std::string prompt_file;  // read the prompt from this file instead (exactly its bytes)
  int64_t tokens = 256;     // tokens to generate per sample (>= 0)
  int64_t num_samples = 1;  // samples, each from the prompt, separated by a line of dashes
  Sampling sampling;
  uint64_t seed = 0;
  int64_t threads = -1;     // CPU threads; -1: the checkpoint config's `threads` (0 = all cores)
  bool stats = false;       // print prefill / decode timings to stderr at the end
  std::FILE* out = stdout;  // where the text goes (the prompt, then each token as it is produced)
};

// Checks the flags: negative --tokens, --top-k or --temperature (or a non-finite temperature), a
// --top-p outside (0, 1], --num-samples below 1, or both --prompt and --prompt-file is a UserError
// naming the flag.
void validate_sample_options(const SampleOptions& o);

// `loom sample`: loads the checkpoint (train/checkpoint.h), rebuilds its config and the tokenizer
// saved beside it (tokenizer.json; a checkpoint without one is a UserError), builds the decoder
// on the cpu backend, loads the parameters, and for each sample echoes the prompt and streams
// `tokens` sampled tokens to o.out, flushing after each complete character, and ends the sample
// with a newline. Returns the exit status (0).
int run_sample(const SampleOptions& o);

// The decoding engine for the transformer of c.model: the decoder program (batch 1, max_len =
// c.model.max_seq_len) planned once on `be`, its caches and the tokens they hold.
class Sampler {
 public:
  // UserError when c.model is not a causal transformer.
  Sampler(const Config& c, Backend& be);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  Executor& executor() { return *exec_; }
  const nn::ModelGraph& model() const { return model_; }
  int64_t max_len() const { return max_len_; }
  int64_t num_outputs() const { return num_outputs_; }
  // Scheduled nodes run per token (the same program at every position).
  size_t nodes_per_token() const { return exec_->plan().schedule.size(); }

  // Copies every parameter by path from another executor whose graph has the same parameters
  // (a Trainer's), e.g. to sample at the end of training.
  void copy_params_from(const Executor& src);

  // Forgets the context: clears the caches; the next token goes to position 0.
  void reset();
  // Runs one token at the next position (which must be < max_len()) and returns its logits
  // (num_outputs() floats, valid until the next call).
  std::span<const float> feed(int32_t token);
  // Tokens held in the caches, in position order.
  const std::vector<int32_t>& cached() const { return cached_; }

  // The logits for the token that follows `context` (non-empty). Feeds only what the caches do
  // not hold yet when `context` extends the previous one (otherwise starts over); applies the
  // sliding window when the context no longer fits.
  std::span<const float> next_logits(std::span<const int32_t> context);
  // Times the caches were cleared and refilled because the context outgrew them.
  int64_t window_refills() const { return refills_; }
  // Program runs (tokens fed) so far.
  int64_t runs() const { return runs_; }

 private:
  nn::ModelGraph model_;
  std::unique_ptr<Executor> exec_;
  int64_t max_len_ = 0, num_outputs_ = 0;
  ValueId positions_ = kNoValue;
  std::vector<ValueId> caches_;
  std::vector<int32_t> cached_;  // tokens at positions 0..size-1
  size_t start_ = 0;             // index in the context of cached_[0]
  std::vector<float> logits_;
  int64_t refills_ = 0, runs_ = 0;
};

// One token from `logits` (nanoGPT's sampling, the header's mapping): temperature 0 → argmax;
// otherwise softmax(logits / temperature) over the top_k largest (0 = all), cut to the top_p
// nucleus, drawn with u = rng_uniform(key, index). Non-finite logits are a std::runtime_error.
int32_t sample_token(std::span<const float> logits, const Sampling& how, PhiloxKey key, uint64_t index);

// Generates `n` tokens after `context` (non-empty) with `s`, calling on_token(id) as each is
// drawn; token i uses index i of the key named_key(seed, "sample"). Only ids below
// `vocab_limit` (the tokenizer's vocabulary; 0 = all outputs) are drawn. Returns the tokens.
std::vector<int32_t> generate(Sampler& s, std::vector<int32_t> context, int64_t n, const Sampling& how, uint64_t seed,
                              int64_t vocab_limit, const std::function<void(int32_t)>& on_token);

// Byte-level BPE tokens can end inside a UTF-8 character: push() takes a token's bytes and
// returns what can be printed now (everything except a trailing incomplete but so far valid
// UTF-8 sequence, held until its remaining bytes arrive); flush() returns what is left.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush() { return std::exchange(pending_, {}); }

 private:
  std::string pending_;
};

}  // namespace loom
