// A LoRA run with its frozen base stored in less memory (lora.base_dtype, nn/lora.h; the formats
// in core/quant.h):
//   - every dense kernel of the blocks is stored in the chosen format (a quantized one as its
//     [K, N] product), the embeddings, the head and the norms stay float32, and the plan's
//     parameter bytes are exactly those formats' bytes;
//   - int8 and NF4 bases train: the loss falls and stays within 0.01 (int8) or 0.1 (NF4: about 10%
//     error per weight on this tiny random model) of the bfloat16 base's at every
//     step, and the stored base is bit-identical after training.
// MemoryExact.SmallTransformerHoldsExactlyItsPlan checks that such a trainer holds its plan's bytes.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/registry.h"
#include "core/quant_columns.h"
#include "io/param_io.h"
#include "nn/init.h"
#include "report/memory_report.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

std::vector<std::string> tiny_llama(const std::string& base) {
  return {"model.kind=transformer",     "model.dtype=bfloat16",         "model.hidden_size=64", "model.num_layers=2",
          "model.head_dim=16",          "model.vocab_size=61",          "model.num_outputs=61", "model.max_seq_len=16",
          "model.mlp=swiglu",           "model.norm=rmsnorm",           "model.position=rope",  "model.num_kv_heads=2",
          "model.use_bias=false",       "data.kind=random_tokens",      "data.batch_size=4",    "data.seq_len=16",
          "data.vocab_size=61",         "optimizer.learning_rate=0.01", "lora.rank=4",          "lora.alpha=8",
          "lora.targets=q_proj,v_proj", "lora.base_dtype=" + base};
}

bool is_block_kernel(const std::string& path) {
  return path.starts_with("block_") && path.ends_with("/kernel") && path.find("/lora_") == std::string::npos;
}

// The bytes of a [K, N] kernel in each format, written out from core/quant.h's layout.
int64_t expected_bytes(const std::string& base, int64_t numel, int64_t N) {
  if (base == "float32") return 4 * numel;
  if (base == "bfloat16") return 2 * numel;
  if (base == "int8") return numel + 4 * N;
  return (numel + 7) / 8 * 4 + 4 * ((numel + 63) / 64);  // nf4: nibbles padded to 4 bytes, absmax per 64
}

TEST(QLora, BlockKernelsAreStoredInTheBaseDtypeAndThePlanCountsTheirBytes) {
  int64_t frozen[4] = {};
  const std::string bases[4] = {"float32", "bfloat16", "int8", "nf4"};
  for (int b = 0; b < 4; ++b) {
    const Config c = default_config(tiny_llama(bases[b]));
    auto be = make_backend("cpu");
    Trainer t(c, *be);
    const Graph& g = t.model().graph;
    int64_t want = 0, kernels = 0;
    for (const Param& p : g.params()) {
      const Value& v = g.value(p.value);
      if (p.trainable()) continue;
      if (!is_block_kernel(v.name)) {
        EXPECT_EQ(v.dtype, DType::f32) << bases[b] << ": " << v.name << " stays float32";
        want += 4 * v.shape.numel();
        continue;
      }
      ++kernels;
      const DType stored[4] = {DType::f32, DType::bf16, DType::i8, DType::nf4};
      EXPECT_EQ(v.dtype, stored[b]) << bases[b] << ": " << v.name;
      want += expected_bytes(bases[b], v.shape.numel(), v.shape.last());
    }
    EXPECT_EQ(kernels, 2 * 5) << "qkv, out, gate, up, down per block";
    const MemoryReport r = memory_report(c, 0);
    EXPECT_EQ(r.frozen_params_bytes, want) << bases[b];
    frozen[b] = r.frozen_params_bytes;
  }
  EXPECT_LT(frozen[3], frozen[2]);
  EXPECT_LT(frozen[2], frozen[1]);
  EXPECT_LT(frozen[1], frozen[0]);
}

struct QRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> base;
};
QRun train(const std::string& base, int steps) {
  const Config c = default_config(tiny_llama(base));
  auto be = make_backend("cpu");
  Trainer t(c, *be);
  const Batch b = make_batch(c.data, data_context(c));
  QRun r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(t.step(b).metrics.loss.mean());
  const Graph& g = t.model().graph;
  for (const Param& p : g.params())
    if (!p.trainable()) r.base[g.value(p.value).name] = t.param(g.value(p.value).name);
  return r;
}

TEST(QLora, QuantizedBasesLearnCloseToTheBfloat16Base) {
  const QRun bf16 = train("bfloat16", 12);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 0.1);
  for (const std::string base : {"int8", "nf4"}) {
    const QRun before = train(base, 0), r = train(base, 12);
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.1) << base << " learns";
    for (size_t s = 0; s < r.losses.size(); ++s)
      EXPECT_NEAR(r.losses[s], bf16.losses[s], base == "int8" ? 0.01 : 0.1) << base << " step " << s;
    bool changed = false;  // the quantized kernels hold other values than the bfloat16 ones
    for (const auto& [path, values] : r.base) {
      EXPECT_EQ(values, before.base.at(path)) << base << ": " << path << " is frozen";
      if (is_block_kernel(path)) changed |= values != bf16.base.at(path);
    }
    EXPECT_TRUE(changed) << base;
  }
}

// init_param_in draws a parameter in bounded slices (a quantized kernel in slabs of columns) so
// that an 8B base never has a whole float32 tensor on the host; its stored bytes must be those of
// the whole tensor drawn and stored at once. Widths 48 and 40 make NF4's slabs start at multiples
// of 4 and 8 columns (a block of 64 spans several columns); slices of 1, 5 and 333 values cut
// Box-Muller pairs, blocks and rows anywhere; a vocabulary of 200 makes the embedding and the head
// (9600 values) drawn whole by several threads (nn/init.cpp's chunks of 4096).
TEST(QLora, BaseDrawnInSlicesIsBitIdenticalToDrawnWhole) {
  for (const std::string base : {"float32", "bfloat16", "int8", "nf4"}) {
    std::vector<std::string> keys = tiny_llama(base);
    for (std::string& k : keys) {
      if (k == "model.hidden_size=64") k = "model.hidden_size=48";
      if (k == "model.num_kv_heads=2") k = "model.num_kv_heads=1";
      if (k.ends_with("vocab_size=61") || k == "model.num_outputs=61") k.replace(k.size() - 2, 2, "200");
    }
    keys.push_back("model.intermediate_size=40");
    const Config c = default_config(keys);
    auto be = make_backend("cpu");
    Trainer t(c, *be);
    Executor& ex = t.executor();
    const Graph& g = ex.graph();
    const auto stored = [&](ValueId v) {
      std::vector<unsigned char> bytes(static_cast<size_t>(g.value(v).bytes()));
      ex.download(v, bytes.data());
      return bytes;
    };
    bool straddling = false;  // an NF4 block spans columns of some kernel
    for (const Param& p : g.params()) {
      const Value& v = g.value(p.value);
      if (v.dtype == DType::nf4) straddling |= quant_column_step(v.dtype, v.shape[0]) > 1;
      std::vector<float> whole;
      init_param(g, p, c.seed, whole);
      upload_param(ex, p.value, whole.data());
      const std::vector<unsigned char> want = stored(p.value);
      for (int64_t slice : {1, 5, 333}) {
        init_param_in(ex, p, c.seed, slice);
        ASSERT_EQ(stored(p.value), want) << base << ": " << v.name << " in slices of " << slice;
      }
    }
    EXPECT_EQ(straddling, base == "nf4");
  }
}

}  // namespace
}  // namespace loom
