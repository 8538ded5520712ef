// Text generation with a key/value cache (`loom sample`).
//
// The model runs as a one-token program (nn::build_transformer_decoder): each layer keeps the
// keys and values of the tokens seen so far in persistent caches, so a token costs one pass of
// the network over one position plus attention over the cached rows — the prefix is never
// recomputed. The program is the same for every position; only the `positions` input changes.
//
// Prefill: the prompt goes through the network as one [1, T] pass of a second program
// (nn::build_transformer_prefill: every matmul over T rows, causal attention), which stores the T
// tokens' keys and values in cache rows 0..T-1 and yields the last token's logits; then every
// sampled token is fed back through the decoder. The prefill program is built for the
// exact length T, lazily, and bound to the decoder's parameter and cache buffers
// (Executor::External): its own memory is its planned arena plus the [T] token and position
// inputs, nothing is copied. Why exact lengths and not padded power-of-two buckets: a sample
// needs at most two lengths (the prompt's and the window refill's, max_len/2, below), so the
// Sampler keeps the two most recently used programs and rebuilds on a third length (a build is
// a graph and a plan, no weights), and no pass computes padding rows (bucketing wastes up to half
// of each pass). Prefill::token is the one-token path instead (the decoder run per prompt token:
// no second program, slower).
//
// Parameters (docs/ARCHITECTURE.md, "Sampling"): both programs go through narrow_params
// (graph/passes/narrow_params.h), so a bfloat16 model's dense kernels and biases and its embedding
// tables are held as bf16 copies rounded once when the weights are loaded, not as f32 masters the
// kernels round on every call; the logits are the same bit for bit. The norms' scales and biases,
// and every parameter of a float32 model, stay float32.
//
// Sliding window: the caches hold model.max_seq_len positions (pos_emb has no more rows), or
// fewer with --context. When the sequence would outgrow them, the last half of them are prefilled
// again at positions 0.. (re-prefill, one batched pass), so generation goes on indefinitely, each
// token seeing at least half the window of context. nanoGPT crops the context the same way (it
// keeps the last block_size tokens, recomputing them for every token); halving the window
// amortises the re-prefill to one extra token per generated token at worst. Cache rows past the
// tokens held keep stale values, never read: attention_decode writes row pos before it reads rows
// 0..pos, so starting over clears nothing.
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

// How the prompt and each window refill reach the caches (the header's prefill).
enum class Prefill : uint8_t {
  batched,  // one pass of the prefill program over all the tokens
  token,    // one decoder run per token (no prefill program)
};

struct SampleOptions {
  std::string checkpoint;   // a ckpt_<step> directory, or a run directory (its latest checkpoint)
  std::string prompt;       // UTF-8; empty: start from "\n" (char vocabulary) or <|endoftext|> (GPT-2)
  std::string prompt_file;  // read the prompt from this file instead (exactly its bytes)
  std::string chat;         // a user message to answer (sample/chat.h); "-": a conversation on stdin
  std::string system;       // --chat: the system message ("" = none)
  std::string template_path;  // --chat: a Jinja chat template replacing the checkpoint's
  std::FILE* in = stdin;      // --chat -: where the user's messages come from, one per line
  int64_t tokens = 256;     // tokens to generate per sample (>= 0)
  int64_t context = 0;      // positions the caches hold (the sliding window); 0: model.max_seq_len
  int64_t num_samples = 1;  // samples, each from the prompt, separated by a line of dashes
  Sampling sampling;
  uint64_t seed = 0;
  int64_t threads = -1;     // CPU threads; -1: the checkpoint config's `threads` (0 = all cores)
  bool stats = false;       // print prefill and decode tokens/s to stderr at the end
  std::FILE* out = stdout;  // where the text goes (the prompt, then each token as it is produced)
  Prefill prefill = Prefill::batched;
};

// Checks the flags: negative --tokens, --top-k or --temperature (or a non-finite temperature), a
// --top-p outside (0, 1], --num-samples below 1, both --prompt and --prompt-file, or --chat with
// either of them or more than one sample (or --system / --template without --chat) is a UserError
// naming the flag.
void validate_sample_options(const SampleOptions& o);

// `loom sample`: loads the checkpoint (train/checkpoint.h), rebuilds its config and the tokenizer
// saved beside it (tokenizer.json; a checkpoint without one is a UserError), builds the decoder
// on the cpu backend, loads the parameters, and for each sample echoes the prompt and streams
// `tokens` sampled tokens to o.out, flushing after each complete character, and ends the sample
// with a newline. With o.chat it answers chat messages instead (sample/chat.h). With o.stats, prints to stderr the
// prefill passes' tokens/s and the decoding's per generated token, the prefill programs' memory and the parameters'.
// Returns the exit status (0).
int run_sample(const SampleOptions& o);

// The decoding engine for the transformer of c.model: the decoder program (batch 1, max_len =
// `context`, 0: c.model.max_seq_len) planned once on `be`, its caches and the tokens they hold,
// and the prefill programs over the same buffers (built on first use, the two most recent kept).
// A context below max_seq_len bounds the caches' memory (a Llama checkpoint's
// max_position_embeddings may be 8192 or far more); the sliding window then works within it.
class Sampler {
 public:
  // UserError when c.model is not a causal transformer, or a context outside [2, max_seq_len]
  // (named as `loom sample`'s --context).
  Sampler(const Config& c, Backend& be, Prefill how = Prefill::batched, int64_t context = 0);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // The decoder's executor: its parameters are every program's, some narrowed to the compute dtype
  // (load them with io/param_io.h's import_params or upload_param, or copy_params_from).
  Executor& executor() { return *exec_; }
  const nn::ModelGraph& model() const { return model_; }
  int64_t max_len() const { return max_len_; }
  int64_t num_outputs() const { return num_outputs_; }
  // Scheduled nodes run per token (the same program at every position).
  size_t nodes_per_token() const { return exec_->plan().schedule.size(); }

  // Copies every parameter by path from another executor whose graph has the same parameters
  // as float32 masters (a Trainer's), rounding the narrowed ones, e.g. to sample after training.
  void copy_params_from(const Executor& src);

  // Forgets the context: the next token goes to position 0.
  void reset();
  // Runs one token at the next position (which must be < max_len()) and returns its logits
  // (num_outputs() floats, valid until the next call).
  std::span<const float> feed(int32_t token);
  // Starts over with `tokens` (1 to max_len() of them) at positions 0..: fills the caches and
  // returns the last token's logits (as feed's), in one pass of the prefill program for that
  // length or token by token (the constructor's Prefill).
  std::span<const float> prefill(std::span<const int32_t> tokens);
  // Tokens held in the caches, in position order.
  const std::vector<int32_t>& cached() const { return cached_; }

  // The logits for the token that follows `context` (non-empty). Feeds only what the caches do
  // not hold yet when `context` extends the previous one (otherwise prefills it); applies the
  // sliding window when the context no longer fits.
  std::span<const float> next_logits(std::span<const int32_t> context);
  // Times the caches were refilled because the context outgrew them.
  int64_t window_refills() const { return refills_; }
  // Decoder runs (tokens fed, the token-by-token prefill's included) so far.
  int64_t runs() const { return runs_; }

  // prefill() so far: calls, tokens, and seconds in the passes; apart, the prefill programs built
  // and the seconds that took (the graph, its plan and the executor: setup, as the decoder's).
  struct PrefillStats {
    int64_t passes = 0, tokens = 0, builds = 0;
    double seconds = 0, build_seconds = 0;
  };
  const PrefillStats& prefill_stats() const { return prefill_stats_; }
  // Memory of the prefill programs held: their arenas and their own inputs (the parameters and
  // caches are the decoder's).
  int64_t prefill_bytes() const;

 private:
  struct PrefillProgram {
    int64_t len = 0;
    nn::ModelGraph model;
    std::unique_ptr<Executor> exec;
    int64_t own_bytes = 0;  // arena and unshared inputs
  };
  // The program for `len` tokens, built if no kept one has that length; most recent first.
  PrefillProgram& prefill_program(int64_t len);

  ModelConfig spec_;
  Prefill how_;
  nn::ModelGraph model_;
  std::unique_ptr<Executor> exec_;
  int64_t max_len_ = 0, num_outputs_ = 0;
  ValueId positions_ = kNoValue;
  std::vector<ValueId> caches_;
  std::vector<std::unique_ptr<PrefillProgram>> prefills_;  // at most kPrefillPrograms, most recent first
  std::vector<int32_t> cached_;                            // tokens at positions 0..size-1
  size_t start_ = 0;                                       // index in the context of cached_[0]
  std::vector<float> logits_;
  int64_t refills_ = 0, runs_ = 0;
  PrefillStats prefill_stats_;
};

// One token from `logits` (nanoGPT's sampling, the header's mapping): temperature 0 → argmax;
// otherwise softmax(logits / temperature) over the top_k largest (0 = all), cut to the top_p
// nucleus, drawn with u = rng_uniform(key, index). Non-finite logits are a std::runtime_error.
int32_t sample_token(std::span<const float> logits, const Sampling& how, PhiloxKey key, uint64_t index);

// Generates `n` tokens after `context` (non-empty) with `s`, calling on_token(id) as each is
// drawn; token i uses index i of the key named_key(seed, "sample"). Only ids below
// `vocab_limit` (the tokenizer's vocabulary; 0 = all outputs) are drawn. A token in `stop` (the
// end of a chat turn) ends the generation early: it is returned last, without an on_token call.
// on_token returning false ends it too (a stop string seen in the text). Returns the tokens.
std::vector<int32_t> generate(Sampler& s, std::vector<int32_t> context, int64_t n, const Sampling& how, uint64_t seed,
                              int64_t vocab_limit, const std::function<bool(int32_t)>& on_token,
                              std::span<const int32_t> stop = {});

}  // namespace loom
