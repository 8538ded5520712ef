// model.init_from of a Hugging Face directory loads in bounded slices (io/hf.h's load_hf_params):
// the stored parameters equal those of the whole-tensor path (hf_to_loom, then upload_param) byte
// for byte, for float32 and bfloat16 files and every lora.base_dtype, whatever the slice; and the
// load's transient host memory stays within a few stream buffers, not a float32 copy of the model.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "graph/passes/plan.h"
#include "io/hf.h"
#include "io/param_io.h"
#include "nn/models.h"
#include "nn/models/hf_arch.h"
#include "nn/param_layout.h"
#include "support/files.h"
#include "train/config.h"
#include "train/model_source.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::hf_golden;
using testing::TempDir;

struct Program {
  std::unique_ptr<Backend> be;
  nn::ModelGraph m;
  std::unique_ptr<Executor> ex;
};

std::unique_ptr<Program> program(const Config& c) {
  auto p = std::make_unique<Program>();
  p->be = make_backend(c.device);
  p->m = nn::build_model(c.model, model_input(c, 2), /*train=*/false);
  const Status st = Executor::create(*p->be, p->m.graph, plan_program(*p->be, p->m.graph, default_schedule(p->m.graph)),
                                     &p->ex);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return st.is_ok() ? std::move(p) : nullptr;
}

Config config(const std::string& dir, const std::string& base_dtype) {
  std::vector<std::string> o = {"model.init_from=" + dir, "data.kind=random_tokens", "data.batch_size=2",
                                "data.seq_len=8", "data.vocab_size=2"};
  if (!base_dtype.empty()) o.insert(o.end(), {"lora.rank=2", "lora.targets=all-linear", "lora.base_dtype=" + base_dtype});
  return default_config(o);
}

// The stored bytes of every base parameter.
std::map<std::string, std::vector<unsigned char>> stored(const Executor& ex) {
  std::map<std::string, std::vector<unsigned char>> out;
  for (const nn::FileTensor& f : nn::param_file_layout(ex.graph(), false, nn::base_subset(ex.graph()))) {
    std::vector<unsigned char> b(static_cast<size_t>(ex.graph().value(f.params[0]).bytes()));
    ex.download(f.params[0], b.data());
    out[f.name] = std::move(b);
  }
  return out;
}

// A copy of the fixture `name` with its tensors in bfloat16.
void write_bf16_copy(const std::string& name, const std::string& dir) {
  fs::copy_file(hf_golden(name + "/config.json"), dir + "/config.json");
  std::vector<StTensor> ts = read_safetensors(hf_golden(name + "/model.safetensors"));
  for (StTensor& t : ts) {
    std::vector<unsigned char> b(static_cast<size_t>(t.shape.numel()) * 2);
    convert(t.bytes.data(), t.dtype, b.data(), DType::bf16, static_cast<size_t>(t.shape.numel()));
    t.dtype = DType::bf16;
    t.bytes = std::move(b);
  }
  write_safetensors(dir + "/model.safetensors", ts);
}

TEST(HfStream, SlicedLoadStoresTheWholeTensorPathsBytes) {
  TempDir d;
  for (const std::string fixture : {"gpt2", "llama_untied", "llama_tied", "qwen2_untied", "gemma3"}) {
    const std::string bf16_dir = d.path(fixture + "_bf16");
    fs::create_directory(bf16_dir);
    write_bf16_copy(fixture, bf16_dir);
    for (const std::string& dir : {hf_golden(fixture), bf16_dir})
      for (const std::string base : {"", "float32", "bfloat16", "int8", "nf4"}) {
        SCOPED_TRACE(dir + " lora.base_dtype=" + base);
        const Config c = config(dir, base);
        auto whole = program(c), sliced = program(c);
        ASSERT_TRUE(whole && sliced);
        std::string file;
        const std::vector<StTensor> params = hf_to_loom(c.model, read_hf_tensors(dir, &file), file);
        std::map<std::string, const StTensor*> by_name;
        for (const StTensor& t : params) by_name[t.name] = &t;
        import_params(*whole->ex, by_name, false, file, {}, nn::base_subset(whole->m.graph));
        // 40 values a slice: several reads per tensor and several column slabs per quantized kernel.
        load_hf_params(*sliced->ex, c.model, dir, nn::base_subset(sliced->m.graph), nullptr, /*slice=*/40);
        const auto want = stored(*whole->ex), got = stored(*sliced->ex);
        ASSERT_EQ(want.size(), got.size());
        for (const auto& [name, bytes] : want) EXPECT_TRUE(got.at(name) == bytes) << name;
      }
  }
}

// A sink that keeps a part of each parameter (a ZeRO-3 rank's slice: Trainer::param_sink) is
// given exactly those elements of the whole load and nothing else, whatever the layout (GPT-2's
// permuted c_attn columns, Llama's transposed and q/k/v-packed matrices) and the slice.
TEST(HfStream, ASinkKeepingPartOfEachParameterGetsExactlyThoseValues) {
  for (const std::string fixture : {"gpt2", "llama_untied", "qwen2_untied"}) {
    const std::string dir = hf_golden(fixture);
    const Config c = config(dir, "");
    auto whole = program(c);
    ASSERT_TRUE(whole);
    load_hf_params(*whole->ex, c.model, dir, nn::ParamSubset::all);
    const Graph& g = whole->m.graph;
    for (const int64_t part : {0, 1, 2}) {  // thirds, as three ranks hold them
      SCOPED_TRACE(fixture + " part " + std::to_string(part));
      const auto keep = [&](ValueId p) {
        const int64_t n = g.value(p).shape.numel();
        return std::pair<int64_t, int64_t>{n * part / 3, n * (part + 1) / 3};
      };
      std::map<ValueId, std::vector<float>> got;  // NaN where nothing was stored
      int64_t outside = 0;
      const ParamSink sink{.keep = keep, .store = [&](ValueId p, int64_t at, const float* v, size_t n) {
                             std::vector<float>& dst = got[p];
                             dst.resize(static_cast<size_t>(g.value(p).shape.numel()), std::nanf(""));
                             outside += at < keep(p).first || at + static_cast<int64_t>(n) > keep(p).second;
                             std::copy(v, v + n, dst.begin() + at);
                           }};
      load_hf_params(g, sink, c.model, dir, nn::ParamSubset::all, nullptr, /*slice=*/40);
      EXPECT_EQ(outside, 0) << "stores outside the kept elements";
      for (const Param& p : g.params()) {
        const std::vector<float> want = download_param(*whole->ex, p.value);
        std::vector<float>& have = got[p.value];
        have.resize(want.size(), std::nanf(""));
        const auto [k0, k1] = keep(p.value);
        int64_t wrong = 0;
        for (int64_t e = 0; e < static_cast<int64_t>(want.size()); ++e) {
          const float w = want[static_cast<size_t>(e)], h = have[static_cast<size_t>(e)];
          wrong += e >= k0 && e < k1 ? std::memcmp(&w, &h, sizeof w) != 0 : !std::isnan(h);
        }
        EXPECT_EQ(wrong, 0) << g.value(p.value).name;
      }
    }
  }
}

// A weight holding a NaN or an infinity is refused at the load, naming its file and tensor, before
// anything is stored: through an executor, and through a sink keeping a part that does not reach
// the value (a ZeRO-3 rank's slice), alike.
TEST(HfStream, ANonFiniteWeightIsRefusedByNameBeforeAnythingIsStored) {
  TempDir d;
  for (const bool bf16 : {false, true}) {
    const std::string dir = d.path(bf16 ? "bf16" : "f32");
    fs::create_directory(dir);
    if (bf16) write_bf16_copy("gpt2", dir);
    std::vector<StTensor> ts =
        read_safetensors(bf16 ? dir + "/model.safetensors" : hf_golden("gpt2/model.safetensors"));
    if (!bf16) fs::copy_file(hf_golden("gpt2/config.json"), dir + "/config.json");
    StTensor& bad = ts[ts.size() / 2];
    const float value = bf16 ? INFINITY : std::nanf("");
    const size_t last = static_cast<size_t>(bad.shape.numel()) - 1;
    convert(&value, DType::f32, bad.bytes.data() + last * dtype_size(bad.dtype), bad.dtype, 1);
    write_safetensors(dir + "/model.safetensors", ts);
    SCOPED_TRACE(dir);
    const std::string want = dir + "/model.safetensors: tensor '" + bad.name + "' holds a NaN or an infinity";
    const Config c = config(dir, "");
    auto p = program(c);
    ASSERT_TRUE(p);
    try {
      load_hf_params(*p->ex, c.model, dir, nn::ParamSubset::all);
      ADD_FAILURE() << "loaded";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
    int64_t stores = 0;
    const auto first_third = [&](ValueId v) {
      return std::pair<int64_t, int64_t>{0, p->m.graph.value(v).shape.numel() / 3};
    };
    const ParamSink sink{.keep = first_third, .store = [&](ValueId, int64_t, const float*, size_t) { ++stores; }};
    try {
      load_hf_params(p->m.graph, sink, c.model, dir, nn::ParamSubset::all);
      ADD_FAILURE() << "loaded";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
    EXPECT_EQ(stores, 0);
  }
}

int64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  return -1;
}

// A Llama-shaped checkpoint of `vocab` × `hidden` embeddings and head (bfloat16, random values),
// written from the architecture's own tensor map.
void write_llama(const std::string& dir, int64_t vocab, int64_t hidden) {
  std::ifstream in(hf_golden("llama_untied/config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["vocab_size"] = vocab;
  j["hidden_size"] = hidden;
  j["head_dim"] = 64;
  j["num_attention_heads"] = hidden / 64;
  j["num_key_value_heads"] = hidden / 128;
  j["intermediate_size"] = 2 * hidden;
  testing::write_file(dir + "/config.json", j.dump());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<StTensor> ts;
  for (const nn::HfParam& p : nn::hf_model_map(read_hf_config(dir).model).params) {
    std::vector<float> v(static_cast<size_t>(p.hf_shape.numel()));
    for (float& x : v) x = normal(rng);
    StTensor t{.name = p.hf_name, .dtype = DType::bf16, .shape = p.hf_shape, .bytes = {}};
    t.bytes.resize(v.size() * 2);
    convert(v.data(), DType::f32, t.bytes.data(), DType::bf16, v.size());
    ts.push_back(std::move(t));
  }
  write_safetensors(dir + "/model.safetensors", ts);
}

TEST(HfStream, LoadHoldsAFewStreamBuffersNotTheModel) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed blocks in its quarantine, so the resident set measures the "
                  "quarantine, not the load; the Release build runs this test";
#endif
  // 2 × 16384 × 512 float32 values of embedding and head alone: 64 MiB as float32.
  TempDir d;
  write_llama(d.path(), 16384, 512);
  const Config c = config(d.path(), "nf4");
  auto p = program(c);
  ASSERT_TRUE(p);
  const ModelSource src(d.path());
  src.load_params(*p->ex);  // once, so the parameters' pages are resident before the peak is reset
  malloc_trim(0);
  testing::write_file("/proc/self/clear_refs", "5");  // VmHWM := VmRSS
  const int64_t before = status_kib("VmRSS:");
  src.load_params(*p->ex);
  const int64_t peak = status_kib("VmHWM:");
  ASSERT_GT(before, 0);
  // Reads, float32 values, a run being gathered and a column slab, each of kInitSliceValues, plus
  // the largest kernel's nf4 bytes (512 × 1024 / 2) and slack for the allocator.
  const int64_t bound_kib = 4 * kInitSliceValues * 4 / 1024 + 512 + 4096;
  EXPECT_LT(peak - before, bound_kib) << "the load's host peak, KiB";
}

}  // namespace
}  // namespace loom
