// Packing without cross-talk (nn::ModelInput::packed, data.packing): a packed row's logits are
// those of each of its examples run alone, as its own sequence from position 0, on both
// backends, with learned positions (GPT-2's table) and rotary ones (a Llama-style row). The
// independent side is the ordinary unpacked model on each example; the reference backend must
// agree bit for bit (its masked keys add exact zeros to double sums, and every other op is per
// row), the CPU backend to f32 summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/reference/reference.h"
#include "core/rng.h"
#include "graph/passes/plan.h"
#include "nn/init.h"
#include "nn/models/transformer/transformer.h"
#include "runtime/executor.h"
#include "train/config.h"

namespace loom {
namespace {

constexpr int64_t kVocab = 20, kT = 16;

// A tiny GPT-2 style model (learned positions) or a Llama-style one (RMSNorm, rotary positions
// with a small theta for large angles, grouped-query attention).
Config tiny(bool rope) {
  std::vector<std::string> ov = {
      "model.kind=transformer",    "model.hidden_size=32", "model.num_layers=2",   "model.head_dim=8",
      "model.vocab_size=20",       "model.num_outputs=20", "model.max_seq_len=16", "model.block_order=attn_first",
      "model.tie_embeddings=true", "model.use_bias=false", "model.init=gpt2",      "data.kind=random_tokens",
      "data.seq_len=16",           "data.vocab_size=20"};
  if (rope)
    for (const char* o : {"model.norm=rmsnorm", "model.position=rope", "model.rope_theta=100", "model.num_kv_heads=2"})
      ov.push_back(o);
  return default_config(ov);
}

// The forward logits [T, V] (as f32) of one row of `tokens`, with per-token `positions` when the
// model is packed; parameters from init_param with a fixed seed, the same in every program.
std::vector<float> logits(Backend& be, const ModelConfig& mc, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>* positions) {
  const auto T = static_cast<int64_t>(tokens.size());
  nn::ModelGraph m = nn::build_transformer(mc, {.batch = 1, .seq_len = T, .packed = positions != nullptr}, false);
  m.graph.mark_output(m.output);
  std::unique_ptr<Executor> ex;
  const Status st = Executor::create(be, m.graph, plan_program(be, m.graph, default_schedule(m.graph)), &ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  for (const auto& [v, bytes] : m.constants) ex->upload(v, bytes.data());
  for (const Param& p : m.graph.params()) {
    std::vector<float> w;
    init_param(m.graph, p, 11, w);
    ex->upload(p.value, w.data());
  }
  const std::vector<int32_t> labels(tokens.size(), 0);
  ex->upload(m.inputs, tokens.data());
  ex->upload(m.labels, labels.data());
  if (positions) ex->upload(m.positions, positions->data());
  ex->run(RunCtx{});
  const DType dt = m.graph.value(m.output).dtype;
  const auto n = static_cast<size_t>(T * kVocab);
  std::vector<unsigned char> raw(n * dtype_size(dt));
  ex->download(m.output, raw.data());
  std::vector<float> out(n);
  convert(raw.data(), dt, out.data(), DType::f32, n);
  return out;
}

// Three examples of 5, 7 and 3 tokens and one padding token in a row of 16, on both backends.
void expect_packed_row_is_each_example_alone(bool rope) {
  const std::vector<int64_t> lengths = {5, 7, 3};
  std::vector<int32_t> tokens(kT), positions(kT, 0);
  HostRng rng(rng_key(5, 0, 0, 0));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(kVocab));
  int64_t at = 0;
  for (int64_t n : lengths)
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(at++)] = static_cast<int32_t>(i);
  ReferenceBackend ref;
  CpuBackend cpu;
  const Config c = tiny(rope);
  for (Backend* be : {static_cast<Backend*>(&ref), static_cast<Backend*>(&cpu)}) {
    const std::vector<float> packed = logits(*be, c.model, tokens, &positions);
    int64_t first = 0;
    for (int64_t n : lengths) {
      const std::vector<int32_t> alone_tokens(tokens.begin() + first, tokens.begin() + first + n);
      const std::vector<float> alone = logits(*be, c.model, alone_tokens, nullptr);
      for (int64_t k = 0; k < n * kVocab; ++k) {
        const float got = packed[static_cast<size_t>(first * kVocab + k)], want = alone[static_cast<size_t>(k)];
        if (be == &ref)
          ASSERT_EQ(got, want) << be->name() << ", example at " << first << ", element " << k;
        else
          ASSERT_NEAR(got, want, 1e-5f * (1 + std::fabs(want))) << be->name() << ", example at " << first;
      }
      first += n;
    }
  }
}

TEST(PackedRows, LogitsEqualEachExampleAloneWithLearnedPositions) { expect_packed_row_is_each_example_alone(false); }

TEST(PackedRows, LogitsEqualEachExampleAloneWithRotaryPositions) { expect_packed_row_is_each_example_alone(true); }

}  // namespace
}  // namespace loom
