// The memory plan is what a training run holds on the device: with a counting allocator wrapped
// around the CPU backend, the most bytes the backend ever holds at once — over building the
// trainer and running a step of two minibatches — equal the plan's total from `loom memory`
// (params + grads + optimizer state + arena, which holds the activations and every kernel's
// workspace, + inputs), for float32 and bfloat16, with and without remat, at a small transformer
// whose GEMMs are split into tiles and at GPT-2 124M's shape (one layer, a small batch). Kernels
// take no memory of their own: they carve their planned workspace and abort past it. A run that
// evaluates adds the evaluation program, which `loom memory` counts too (the last test).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "data/data.h"
#include "dist/comm.h"
#include "io/param_io.h"
#include "report/memory_report.h"
#include "support/chat_dir.h"
#include "train/config.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace loom {
namespace {

// Forwards everything to `inner`, counting the bytes allocated and not yet released.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& inner) : inner_(inner) {}
  const char* name() const override { return inner_.name(); }
  void* allocate(size_t bytes) override {
    void* p = inner_.allocate(bytes);
    if (p) {
      sizes_[p] = bytes;
      held_ += static_cast<int64_t>(bytes);
      peak_ = std::max(peak_, held_);
    }
    return p;
  }
  void deallocate(void* p) override {
    held_ -= static_cast<int64_t>(sizes_.at(p));
    sizes_.erase(p);
    inner_.deallocate(p);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { inner_.copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_.copy_to_host(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override { inner_.fill_zero(dst, bytes); }
  bool supports_op(OpKind op) const override { return inner_.supports_op(op); }
  bool supports(const Graph& g, const Node& n) const override { return inner_.supports(g, n); }
  int64_t workspace_bytes(const Graph& g, const Node& n, int threads) const override {
    return inner_.workspace_bytes(g, n, threads);
  }
  int64_t library_bytes(const Graph& g, const Node& n, int threads) const override {
    return inner_.library_bytes(g, n, threads);
  }
  void run(const KernelArgs& a) override { inner_.run(a); }
  void synchronize() override { inner_.synchronize(); }
  double now_us() const override { return inner_.now_us(); }
  int64_t memory_available() const override { return available_; }
  double grad_sq_norm(std::span<const OptimTensor> ts) override { return inner_.grad_sq_norm(ts); }
  void optimizer_update(std::span<const OptimTensor> ts, const OptimHyper& h) override {
    inner_.optimizer_update(ts, h);
  }
  int64_t held() const { return held_; }
  int64_t peak() const { return peak_; }
  void set_memory_available(int64_t bytes) { available_ = bytes; }

 private:
  Backend& inner_;
  std::unordered_map<void*, size_t> sizes_;
  int64_t held_ = 0, peak_ = 0;
  int64_t available_ = -1;  // unknown, as Backend's default: no fit check
};

// Two layers of 256 with 4 heads of 64, 4 sequences of 128 tokens in 2 minibatches: GEMMs of
// 256 × 1024 × 256 and more, split into tiles, and attention on the register-blocked products.
std::vector<std::string> small_transformer(const std::string& dtype, const std::string& remat) {
  return {"model.kind=transformer",  "model.dtype=" + dtype,        "model.hidden_size=256",  "model.num_layers=2",
          "model.head_dim=64",       "model.vocab_size=2048",       "model.num_outputs=2048", "model.max_seq_len=128",
          "data.kind=random_tokens", "data.batch_size=4",           "data.seq_len=128",       "data.vocab_size=2048",
          "model.dropout_rate=0.1",  "optimizer.num_minibatches=2", "model.remat=" + remat};
}

// small_transformer on the repository's prepared Llama-tokenized text (token data with a
// validation split), evaluating every `eval_interval` steps (0: never).
Config on_prepared_tokens(const std::string& dtype, const std::string& remat, int eval_interval) {
  std::vector<std::string> o = small_transformer(dtype, remat);
  for (const std::string kv : {"data.kind=tokens", "model.vocab_size=321", "model.num_outputs=321"}) o.push_back(kv);
  o.push_back("train.eval_interval=" + std::to_string(eval_interval));
  o.push_back("data.dir=" + std::string(LOOM_SOURCE_DIR) + "/data/shakespeare_llama");
  return default_config(o);
}

// `batch`: the step's batch (the fixed one of the random kinds when nullptr).
void expect_holds_the_plan(const Config& c, const std::string& what, const Batch* batch = nullptr) {
  const MemoryReport plan = memory_report(c, 0);
  set_num_threads(static_cast<int>(c.threads));  // the count the plan is for, as `loom train` sets it
  auto cpu = make_backend("cpu");
  CountingBackend be(*cpu);
  {
    Trainer t(c, be);
    const Batch b = batch ? *batch : make_batch(c.data, data_context(c));
    t.step(b);  // both minibatches: the first assigns the gradients, the second adds into them
    // The backend's memory: all the plan counts but the checkpoint stream buffer (host memory, held
    // while saving or resuming, which tests/dist's checkpoint worker measures) and the library row
    // (sgemm's own packing buffers, which tests/backend/test_sgemm_bytes.cpp measures).
    EXPECT_EQ(be.held(), plan.total_bytes - plan.checkpoint_bytes - plan.library_bytes)
        << what << ": bytes held after a step";
  }
  EXPECT_EQ(be.peak(), plan.total_bytes - plan.checkpoint_bytes - plan.library_bytes)
      << what << ": the most bytes the backend held at once";
  EXPECT_GT(plan.max_workspace_bytes, 0) << what;
  EXPECT_EQ(be.held(), 0) << what << ": everything is released";
}

TEST(MemoryExact, SmallTransformerHoldsExactlyItsPlan) {
  for (const std::string dtype : {"float32", "bfloat16"})
    for (const std::string remat : {"none", "MLP,Attn"})
      expect_holds_the_plan(default_config(small_transformer(dtype, remat)), dtype + " remat " + remat);
  // The head and the loss fused (model.head_chunk): chunks of 300 of the 2048 columns (the last
  // one 248), tied and untied without biases, and untied with one (the bias's chunk in the
  // workspace, its [V] cotangent an activation).
  for (const std::string dtype : {"float32", "bfloat16"})
    for (const auto& [tied, bias] :
         {std::pair{"false", "false"}, std::pair{"true", "false"}, std::pair{"false", "true"}}) {
      std::vector<std::string> fused = small_transformer(dtype, "none");
      for (const std::string& kv : {std::string("model.use_bias=") + bias, std::string("model.head_chunk=300"),
                                    std::string("model.tie_embeddings=") + tied})
        fused.push_back(kv);
      expect_holds_the_plan(default_config(fused),
                            std::string("fused head, ") + dtype + ", tied " + tied + ", bias " + bias);
    }
  // SwiGLU: two [B, T, F] projections into silu_mul, and its backward's two outputs.
  std::vector<std::string> swiglu = small_transformer("bfloat16", "MLP");
  swiglu.push_back("model.mlp=swiglu");
  expect_holds_the_plan(default_config(swiglu), "swiglu bfloat16 remat MLP");
  // LoRA (nn/lora.h): the frozen base holds no gradients and no optimizer state, the adapters do.
  for (std::vector<std::string> lora : {swiglu, small_transformer("float32", "none")}) {
    lora.push_back("lora.rank=16");
    const Config c = default_config(lora);
    const MemoryReport full = memory_report(default_config(std::vector<std::string>(lora.begin(), lora.end() - 1)), 0);
    const MemoryReport r = memory_report(c, 0);
    EXPECT_EQ(r.params_bytes, full.params_bytes + (r.params_bytes - r.frozen_params_bytes));
    EXPECT_EQ(r.grads_bytes, r.params_bytes - r.frozen_params_bytes);
    EXPECT_EQ(r.optimizer_bytes, optimizer_moments(c.optimizer) * r.grads_bytes);
    expect_holds_the_plan(c, "lora " + lora[1]);
  }
  // LoRA with the head and the loss fused: the frozen kernel's backward (dx alone) and its workspace,
  // with and without the frozen head's bias.
  for (const auto& [tied, bias] :
       {std::pair{"false", "false"}, std::pair{"true", "false"}, std::pair{"false", "true"}}) {
    std::vector<std::string> fused = swiglu;
    for (const std::string& kv : {std::string("lora.rank=16"), std::string("model.use_bias=") + bias,
                                  std::string("model.head_chunk=300"), std::string("model.tie_embeddings=") + tied})
      fused.push_back(kv);
    expect_holds_the_plan(default_config(fused), std::string("lora, fused head, tied ") + tied + ", bias " + bias);
  }
  // A LoRA base in int8 and NF4 (lora.base_dtype): the quantized kernels' bytes and the dense
  // kernels' tile workspace (backend/cpu/dense_quant.cpp).
  for (const std::string base : {"int8", "nf4"}) {
    std::vector<std::string> q = swiglu;
    for (std::string kv : {std::string("lora.rank=16"), "lora.base_dtype=" + base}) q.push_back(kv);
    expect_holds_the_plan(default_config(q), "lora base " + base);
  }
  // Qwen3's attention: 8 heads of 64 on a width of 256 (q is 512 wide) in 2 key/value groups, and
  // qk_norm with its per-head statistics, its backward and the scales' gradients.
  for (const std::string remat : {"none", "Attn"}) {
    std::vector<std::string> qwen3 = small_transformer("bfloat16", remat);
    for (const char* o : {"model.norm=rmsnorm", "model.position=rope", "model.qk_norm=true", "model.num_heads=8",
                          "model.num_kv_heads=2"})
      qwen3.push_back(o);
    expect_holds_the_plan(default_config(qwen3), "qk_norm, 8 heads of 64 on 256, bfloat16 remat " + remat);
    // Gemma's blocks on it: (1 + scale) norms, the GeGLU MLP and the post-branch norms.
    for (const char* o : {"model.norm=gemma_rmsnorm", "model.mlp=geglu", "model.post_norms=true"}) qwen3.push_back(o);
    expect_holds_the_plan(default_config(qwen3), "Gemma's blocks, bfloat16 remat " + remat);
    // Gemma 3's: scaled embeddings, a query_pre_attn_scalar, local and global layers.
    for (const char* o : {"model.scale_embeddings=true", "model.query_pre_attn_scalar=100", "model.sliding_window=8",
                          "model.sliding_window_pattern=2", "model.rope_local_theta=1000"})
      qwen3.push_back(o);
    expect_holds_the_plan(default_config(qwen3), "Gemma 3's layers, bfloat16 remat " + remat);
  }
}

// Rows of packed chat examples (data.packing): the positions input [B, T], the per-token position
// embeddings [B, T, C] (learned) or rotations (rope) and attention's masks are planned exactly too.
TEST(MemoryExact, PackedRowsHoldExactlyTheirPlan) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom_test_memory_packed_" + std::to_string(getpid()));
  testing::ChatSplitData s;
  s.docs = {0};
  for (int64_t k = 0; s.tokens.size() < 3000; ++k) {
    const int64_t n = std::array<int64_t, 5>{30, 90, 61, 200, 17}[static_cast<size_t>(k % 5)];
    for (int64_t i = 0; i < n; ++i) {
      s.tokens.push_back(static_cast<uint16_t>(1 + (k * 131 + i * 17) % 2000));
      s.mask.push_back(i % 4 != 0);
    }
    s.docs.push_back(s.tokens.size());
  }
  testing::write_chat_dir(dir, s, s, 2048, nlohmann::json::object());
  for (bool rope : {false, true}) {
    std::vector<std::string> o = small_transformer("bfloat16", "MLP,Attn");
    for (const std::string& kv :
         {std::string("data.kind=tokens"), std::string("data.packing=true"), "data.dir=" + dir.string()})
      o.push_back(kv);
    if (rope)
      for (const char* kv : {"model.norm=rmsnorm", "model.position=rope", "model.num_kv_heads=2"}) o.push_back(kv);
    const Config c = default_config(o);
    const Batch b = DataSource(c.data, data_context(c)).train_batch(0);
    ASSERT_EQ(b.positions.size(), static_cast<size_t>(4 * 128));
    expect_holds_the_plan(c, rope ? "packed rows, rope" : "packed rows, learned positions", &b);
  }
  std::filesystem::remove_all(dir);
}

TEST(MemoryExact, Gpt2ShapeHoldsExactlyItsPlan) {
  for (const std::string dtype : {"float32", "bfloat16"}) {
    const Config c = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/gpt2_124m.toml",
                                 {"model.num_layers=1", "data.batch_size=2", "data.seq_len=64",
                                  "optimizer.num_minibatches=2", "model.dtype=" + dtype});
    expect_holds_the_plan(c, "gpt2_124m, 1 layer, " + dtype);
  }
}

// With one minibatch per step every weight gradient's first writer assigns on every run, so its
// float32 GEMM writes the gradient in place and plans no tile buffers to accumulate through (at a
// tied Llama 3.2 1B head they were 501 MiB the run never touched); with two it accumulates in the
// second and plans them. Either way the run holds exactly its plan.
TEST(MemoryExact, OneMinibatchPlansNoAccumulationBuffersForWeightGradients) {
  for (const std::string minibatches : {"1", "2"}) {
    std::vector<std::string> o = small_transformer("float32", "none");
    o.push_back("model.dropout_rate=0");
    o.push_back("optimizer.num_minibatches=" + minibatches);
    const Config c = default_config(o);
    const TrainProgram p = build_train_program(c);
    auto cpu = make_backend("cpu");
    int64_t tiled = 0, planned = 0;
    for (const Node& n : p.model.graph.nodes()) {
      if (n.op != OpKind::dense_grad_weight) continue;
      const int64_t bytes = cpu->workspace_bytes(p.model.graph, n, /*threads=*/2);
      planned += bytes;
      tiled += bytes > 0;
    }
    if (minibatches == "1")
      EXPECT_EQ(planned, 0) << "float32 weight gradients that always assign need no workspace";
    else
      EXPECT_GT(tiled, 0) << "a weight gradient that accumulates in minibatch 1 goes through tile buffers";
    expect_holds_the_plan(c, minibatches + " minibatches, float32");
  }
}

// The evaluation program shares the trainer's parameters, binds its graph's gradient values (one
// per parameter, unused without a backward) to no storage and runs in the trainer's arena, which
// is larger: it adds only its inputs, exactly what `loom memory` adds for it when the run
// evaluates (token data with a validation split; the repository's prepared Llama-tokenized text).
TEST(MemoryExact, AnEvaluatorAddsNoParametersOrGradients) {
  const Config c = on_prepared_tokens("float32", "none", 5);
  Config quiet = c;
  quiet.train.eval_interval = 0;
  const MemoryReport with = memory_report(c, 0), without = memory_report(quiet, 0);
  EXPECT_EQ(without.evaluation_bytes, 0);
  EXPECT_GT(with.evaluation_bytes, 0);
  EXPECT_EQ(with.total_bytes, without.total_bytes + with.evaluation_bytes);
  set_num_threads(static_cast<int>(c.threads));  // the count the plan is for, as `loom train` sets it
  auto cpu = make_backend("cpu");
  CountingBackend be(*cpu);
  Trainer t(c, be);
  const Graph& tg = t.model().graph;
  int64_t param_bytes = 0;
  std::unordered_map<std::string, void*> trainer_param;
  for (const Param& p : tg.params()) {
    const Value& v = tg.value(p.value);
    param_bytes += v.shape.numel() * static_cast<int64_t>(dtype_size(v.dtype));
    trainer_param[v.name] = t.executor().ptr(p.value);
  }
  const int64_t before = be.held();
  Evaluator ev(t, be);
  const Graph& g = ev.executor().graph();
  ASSERT_EQ(g.params().size(), tg.params().size());
  for (const Param& p : g.params()) {
    const std::string& name = g.value(p.value).name;
    EXPECT_EQ(ev.executor().ptr(p.grad), nullptr) << name << "'s gradient";
    EXPECT_EQ(ev.executor().ptr(p.value), trainer_param.at(name)) << name;
  }
  EXPECT_EQ(ev.executor().arena_bytes_allocated(), 0) << "the trainer's arena is larger";
  EXPECT_GT(ev.executor().plan().arena_bytes, 0);
  EXPECT_EQ(be.held() - before, with.evaluation_bytes);
  EXPECT_EQ(with.evaluation_bytes, ev.executor().plan().input_bytes);
  EXPECT_LT(be.held() - before, param_bytes) << "the evaluator's own bytes";
}

// The trainer refuses a run that does not fit before it allocates anything, and what it counts is
// `loom memory`'s total to the byte: the evaluation program's bytes included when it is told that
// the run evaluates (as `loom train` tells it), not when it is not (`loom profile`).
TEST(MemoryExact, TheFitCheckCountsWhatLoomMemoryCounts) {
  const Config c = on_prepared_tokens("bfloat16", "MLP,Attn", 5);
  Config quiet = c;
  quiet.train.eval_interval = 0;
  const int64_t with = memory_report(c, 0).total_bytes, without = memory_report(quiet, 0).total_bytes;
  ASSERT_GT(with, without);
  set_num_threads(static_cast<int>(c.threads));
  auto cpu = make_backend("cpu");
  for (const bool evaluates : {true, false}) {
    const std::string what = evaluates ? "evaluating" : "not evaluating";
    const int64_t total = evaluates ? with : without;
    CountingBackend be(*cpu);
    be.set_memory_available(total - 1);
    try {
      Trainer t(c, be, {}, nullptr, evaluates);
      ADD_FAILURE() << what << ": a byte short of the plan, the trainer started";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("GiB are available"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("evaluation") != std::string::npos, evaluates) << what << ": " << e.what();
    }
    EXPECT_EQ(be.peak(), 0) << what << ": refused before allocating";
    be.set_memory_available(total);
    EXPECT_NO_THROW(Trainer(c, be, {}, nullptr, evaluates)) << what << ": exactly the plan's bytes";
  }
}

// model.remat = auto fitted to a train.memory_budget above what the machine has: the refusal's fix
// is to lower the budget (or leave it empty), not to shrink the activations by hand.
TEST(MemoryExact, ABudgetAboveTheMachineIsTheFix) {
  Config c = on_prepared_tokens("bfloat16", "auto", 0);
  c.train.memory_budget = "1000GiB";
  set_num_threads(static_cast<int>(c.threads));
  auto cpu = make_backend("cpu");
  CountingBackend be(*cpu);
  be.set_memory_available(memory_report(on_prepared_tokens("bfloat16", "MLP,Attn", 0), 0).total_bytes);
  try {
    Trainer t(c, be);
    ADD_FAILURE() << "a plan above the memory available started";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("GiB are available"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("train.memory_budget = 1000GiB is more than this machine has"), std::string::npos)
        << e.hint();
  }
}

// train.memory_budget without model.remat = auto is a limit: a plan one byte above it is refused
// naming the key and model.remat = auto; at it, the run starts.
TEST(MemoryExact, ABudgetIsALimitWithoutRematAuto) {
  Config c = on_prepared_tokens("bfloat16", "MLP,Attn", 0);
  const int64_t total = memory_report(c, 0).total_bytes;
  set_num_threads(static_cast<int>(c.threads));
  auto be = make_backend("cpu");
  c.train.memory_budget = std::to_string(total - 1);
  try {
    Trainer t(c, *be);
    ADD_FAILURE() << "a plan above train.memory_budget started";
  } catch (const UserError& e) {
    EXPECT_EQ(e.subject(), "train.memory_budget");
    EXPECT_NE(std::string(e.what()).find("the run plans"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("model.remat=auto"), std::string::npos) << e.hint();
  }
  c.train.memory_budget = std::to_string(total);
  EXPECT_NO_THROW(Trainer(c, *be));
}

// One process standing for one of two ranks of a job on this machine: the single-process
// communicator's collectives, but two ranks sharing the machine's memory.
class OneOfTwoOnThisHost final : public dist::Comm {
 public:
  int rank() const override { return one_.rank(); }
  int size() const override { return one_.size(); }
  int ranks_on_this_host() const override { return 2; }
  void all_reduce_sum(float* x, int64_t n) override { one_.all_reduce_sum(x, n); }
  std::unique_ptr<Pending> start_all_reduce_sum(float* x, int64_t n, float* scratch) override {
    return one_.start_all_reduce_sum(x, n, scratch);
  }
  std::unique_ptr<Pending> start_reduce_scatter_sum(float* x, int64_t n, float* scratch) override {
    return one_.start_reduce_scatter_sum(x, n, scratch);
  }
  void reduce_scatter_sum(const float* x, int64_t n, float* out) override { one_.reduce_scatter_sum(x, n, out); }
  void all_gather(const float* mine, int64_t n, float* out) override { one_.all_gather(mine, n, out); }
  std::unique_ptr<Pending> start_all_gather(const float* mine, int64_t n, float* out) override {
    return one_.start_all_gather(mine, n, out);
  }
  void all_gather_bytes(const void* mine, size_t bytes, void* out) override { one_.all_gather_bytes(mine, bytes, out); }
  void gather_bytes(const void* mine, void* out, std::span<const int64_t> counts, std::span<const int64_t> displs,
                    int root) override {
    one_.gather_bytes(mine, out, counts, displs, root);
  }
  void broadcast(void* data, size_t bytes, int root) override { one_.broadcast(data, bytes, root); }
  void barrier() override { one_.barrier(); }

 protected:
  void abort_all(int) override {}

 private:
  dist::Comm& one_ = dist::single_process();
};

// The ranks of a job on one machine share its memory: the fit check holds them together to it,
// each with its plan (`loom memory`'s total).
TEST(MemoryExact, TheRanksOfAMachineAreCheckedTogether) {
  const Config c = default_config(small_transformer("float32", "none"));
  const int64_t total = memory_report(c, 0).total_bytes;
  set_num_threads(static_cast<int>(c.threads));
  auto cpu = make_backend("cpu");
  OneOfTwoOnThisHost comm;
  CountingBackend be(*cpu);
  be.set_memory_available(2 * total - 1);
  try {
    Trainer t(c, be, {}, &comm);
    ADD_FAILURE() << "two ranks a byte short of twice the plan: the trainer started";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("for its 2 ranks on this machine"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("fewer ranks on this machine"), std::string::npos) << e.hint();
  }
  EXPECT_EQ(be.peak(), 0) << "refused before allocating";
  be.set_memory_available(2 * total);
  EXPECT_NO_THROW(Trainer(c, be, {}, &comm)) << "exactly twice the plan's bytes";
}

// optimizer.gather_ahead is planned: `loom memory --ranks 2` with optimizer.shard = params holds
// more parameters gathered at once the further ahead their gathers start (each step's live bytes
// never fall), and the parameter shards, gradients and optimizer state do not change.
TEST(MemoryExact, GatheringFurtherAheadPlansMoreActivationBytes) {
  std::vector<MemoryReport> r;
  for (const int ahead : {0, 1, 2}) {
    std::vector<std::string> o = small_transformer("float32", "Block");
    o.push_back("optimizer.shard=params");
    o.push_back("optimizer.gather_ahead=" + std::to_string(ahead));
    r.push_back(memory_report(default_config(o), 0, {}, 2));
    std::printf("gather_ahead %d: live-bytes peak %lld, activations %lld, total %lld\n", ahead,
                static_cast<long long>(r.back().lower_bound_bytes), static_cast<long long>(r.back().activations_bytes),
                static_cast<long long>(r.back().total_bytes));
  }
  for (size_t k = 1; k < r.size(); ++k) {
    EXPECT_GT(r[k].lower_bound_bytes, r[k - 1].lower_bound_bytes) << "gather_ahead " << k;
    EXPECT_GE(r[k].total_bytes, r[k - 1].total_bytes) << "gather_ahead " << k;
    EXPECT_EQ(r[k].params_bytes, r[0].params_bytes);
    EXPECT_EQ(r[k].grads_bytes, r[0].grads_bytes);
    EXPECT_EQ(r[k].optimizer_bytes, r[0].optimizer_bytes);
  }
  EXPECT_GT(r[1].total_bytes, r[0].total_bytes) << "the prefetched parameter is counted";
}

// Evaluating between steps in the trainer's arena overwrites activations the trainer no longer
// needs: a run that evaluates after every step trains to the same bits as one that does not.
TEST(MemoryExact, EvaluatingInTheTrainersArenaChangesNoTrainingBit) {
  const Config c = on_prepared_tokens("bfloat16", "MLP,Attn", 0);
  auto be = make_backend("cpu");
  const DataSource data(c.data, data_context(c));
  Trainer evaluated(c, *be), plain(c, *be);
  Evaluator ev(evaluated, *be);
  ASSERT_EQ(ev.executor().arena_bytes_allocated(), 0) << "the evaluator must run in the trainer's arena";
  // The evaluations themselves: those of an evaluator with an arena of its own, given the same
  // parameters.
  Evaluator own(c, *be);
  ASSERT_GT(own.executor().arena_bytes_allocated(), 0);
  // Beside a trainer whose arena it does not fit in, an evaluator would hold its arena too.
  EXPECT_EQ(Evaluator::planned_bytes(c, 1, 0),
            own.executor().arena_bytes_allocated() + own.executor().plan().input_bytes);
  for (int64_t i = 0; i < 3; ++i) {
    const Batch b = data.train_batch(i);
    const double a = evaluated.step(b).metrics.loss.mean();
    const Metrics m = ev.training(data, 1);
    const std::vector<StTensor> params = export_params(evaluated.executor(), false);
    std::map<std::string, const StTensor*> by_name;
    for (const StTensor& t : params) by_name[t.name] = &t;
    import_params(own.executor(), by_name, false, "the trainer's parameters");
    const Metrics o = own.training(data, 1);
    EXPECT_EQ(m.loss.sum, o.loss.sum) << "step " << i;
    EXPECT_EQ(m.accuracy.sum, o.accuracy.sum) << "step " << i;
    const double p = plain.step(b).metrics.loss.mean();
    EXPECT_EQ(a, p) << "step " << i;
  }
  for (bool grads : {false, true}) {
    const std::vector<StTensor> pa = export_params(evaluated.executor(), false, grads),
                                pp = export_params(plain.executor(), false, grads);
    ASSERT_EQ(pa.size(), pp.size());
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].bytes, pp[i].bytes) << pa[i].name << (grads ? " grad" : "");
  }
}

}  // namespace
}  // namespace loom
