// Run under mpirun by tests/dist/test_dist.cpp (and alone, as a single process): a checkpoint's
// save and resume hold no copy of the parameters or the optimizer state, measured by counting this
// process's heap.
//
//   dist_checkpoint_worker save SHARD DIR         moments set to pattern(), then saved to DIR
//   dist_checkpoint_worker resave SHARD FROM DIR  FROM resumed (the moments checked against
//                                                 pattern()), then saved to DIR
//   dist_checkpoint_worker hf DIR                 a GPT-2 of the same size with pattern() as its
//                                                 parameters, written as a Hugging Face directory
//   dist_checkpoint_worker init SHARD FROM        FROM's parameters (a checkpoint, or a Hugging
//                                                 Face directory: its GPT-2) loaded as
//                                                 model.init_from, checked against pattern()
//
// with optimizer.shard = SHARD, on a model whose parameters and Adam moments (23 MiB each) are far
// larger than the checkpoint stream buffer; a save writes pattern() as the parameters too. Each
// rank prints its heap high-water above the start of the save, resume or load and the plan for it
// (`loom memory`'s checkpoint line); a line with FAILED and exit status 1 when the high-water is
// not the plan (up to a slack for names and headers) or a moment's or parameter's value is wrong.
#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "check.h"
#include "dist/comm.h"
#include "io/hf.h"
#include "io/param_io.h"
#include "report/memory_report.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/model_source.h"
#include "train/trainer.h"

namespace {

// The heap this process holds through operator new (std::vector, std::string, the safetensors
// reader's tensors), and its high-water since the last reset.
std::atomic<int64_t> g_live{0}, g_peak{0};

void* counted_alloc(size_t n) {
  // The size sits in front of the block, so that delete can subtract it.
  auto* p = static_cast<unsigned char*>(std::malloc(n + 16));
  if (!p) throw std::bad_alloc();
  std::memcpy(p, &n, sizeof n);
  const int64_t now = g_live += static_cast<int64_t>(n);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p + 16;
}

void counted_free(void* q) {
  if (!q) return;
  auto* p = static_cast<unsigned char*>(q) - 16;
  size_t n = 0;
  std::memcpy(&n, p, sizeof n);
  g_live -= static_cast<int64_t>(n);
  std::free(p);
}

}  // namespace

void* operator new(size_t n) { return counted_alloc(n); }
void* operator new[](size_t n) { return counted_alloc(n); }
// The nothrow forms too (std::stable_sort's temporary buffer): a sanitizer's own nothrow new would
// hand the counted delete below a block without the size in front.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, size_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t) noexcept { counted_free(p); }

namespace {

using namespace loom;

using loom::testing::check;
using loom::testing::failures;

// Element e of moment `which` of parameter `param`: a pure function of the three (splitmix64),
// positive and finite, different almost everywhere, whatever rank holds it.
float pattern(int which, size_t param, int64_t e) {
  uint64_t z = (static_cast<uint64_t>(which) << 56) ^ (static_cast<uint64_t>(param) << 40) ^ static_cast<uint64_t>(e);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return 1e-3f * (1.0f + static_cast<float>((z ^ (z >> 31)) & 0xffffff) / 16777216.0f);
}

// Two layers of 256 and 8192 embedding rows and outputs: 5.8 M parameters, 23 MiB per moment
// (GPT-2's layout, `gpt2`: tied, 3.7 M); `init_from` as model.init_from when given, whose model
// keys a Hugging Face directory's config.json sets.
Config worker_config(const std::string& shard, const std::string& init_from = {}, bool gpt2 = false) {
  std::vector<std::string> o = {
      "data.kind=random_tokens", "data.batch_size=6",           "data.seq_len=32", "data.vocab_size=8192",
      "optimizer.name=adamw",    "optimizer.num_minibatches=1", "threads=1",       "optimizer.shard=" + shard};
  if (!is_hf_model_dir(init_from))
    o.insert(o.end(), {"model.kind=transformer", "model.hidden_size=256", "model.num_layers=2", "model.head_dim=64",
                       "model.vocab_size=8192", "model.num_outputs=8192", "model.max_seq_len=32"});
  if (gpt2) o.insert(o.end(), {"model.block_order=attn_first", "model.tie_embeddings=true"});
  if (!init_from.empty()) o.push_back("model.init_from=" + init_from);
  return default_config(o);
}

// Parameter values: pattern() of a moment index no optimizer has.
constexpr int kParams = 2;

// Runs f and returns the heap high-water above what was held when it began.
template <class F>
int64_t heap_above_start(F&& f) {
  const int64_t start = g_live.load();
  g_peak = start;
  f();
  return g_peak.load() - start;
}

// What a save or a resume may hold beyond the run's buffers: the plan's checkpoint stream buffer,
// and 1 MiB for what grows with the number of tensors, not their size (names, headers, the ranks'
// slice tables).
constexpr int64_t kSlack = int64_t{1} << 20;

}  // namespace

namespace {

int work(int argc, char** argv) {
  dist::Comm& comm = dist::world();
  const int rank = comm.rank();
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!((mode == "save" && argc == 4) || (mode == "resave" && argc == 5) || (mode == "init" && argc == 4) ||
        (mode == "hf" && argc == 3))) {
    std::fprintf(stderr, "usage: %s save SHARD DIR | resave SHARD FROM DIR | init SHARD FROM | hf DIR\n", argv[0]);
    return 2;
  }
  const Config c =
      mode == "hf" ? worker_config("none", {}, /*gpt2=*/true) : worker_config(argv[2], mode == "init" ? argv[3] : "");
  const std::unique_ptr<Backend> be = make_backend("cpu");
  Trainer t(c, *be, {}, &comm);
  const Graph& g = t.model().graph;
  int64_t param_bytes = 0;
  for (const Param& p : g.params()) param_bytes += g.value(p.value).bytes();
  // `loom memory --ranks N`'s checkpoint line, which the fit check counts too.
  const int64_t plan = memory_report(c, 0, {}, comm.size()).checkpoint_bytes;

  CheckpointState state{.config_toml = config_to_toml(c), .step = 1};
  if (mode == "init") {
    const ModelSource src(c.model.init_from);
    const int64_t held = heap_above_start([&] { src.load_params(t); });
    std::printf("rank %d: load heap high-water %lld bytes, plan %lld (stream buffer; the parameters are %lld)\n", rank,
                static_cast<long long>(held), static_cast<long long>(plan), static_cast<long long>(param_bytes));
    check(held <= plan + kSlack, "the load held more than the stream buffer", rank);
    check(held >= plan, "the load held less than the stream buffer: the plan overstates it", rank);
    int64_t wrong = 0;
    for (size_t i = 0; i < g.params().size(); ++i) {
      const std::vector<float> v = t.param(g.value(g.params()[i].value).name);  // gathered from every rank
      for (size_t e = 0; e < v.size(); ++e) wrong += v[e] != pattern(kParams, i, static_cast<int64_t>(e));
    }
    check(wrong == 0, fmt::format("{} loaded parameter elements differ from the source's", wrong), rank);
    if (failures == 0) std::printf("rank %d: parameters loaded within the plan\n", rank);
    return failures ? 1 : 0;
  }
  if (mode == "save" || mode == "hf")
    for (size_t i = 0; i < g.params().size(); ++i) {
      const Value& v = g.value(g.params()[i].value);
      std::vector<float> values(static_cast<size_t>(v.shape.numel()));
      for (size_t e = 0; e < values.size(); ++e) values[e] = pattern(kParams, i, static_cast<int64_t>(e));
      t.set_param(v.name, values);
    }
  if (mode == "hf") {
    const std::vector<StTensor> params = export_params(t.executor(), /*scan_layers=*/false);
    std::map<std::string, const StTensor*> by_path;
    for (const StTensor& p : params) by_path[p.name] = &p;
    std::filesystem::create_directories(argv[2]);
    write_safetensors(std::string(argv[2]) + "/model.safetensors", loom_to_hf(c.model, by_path));
    std::ofstream(std::string(argv[2]) + "/config.json") << hf_config_json(c.model).dump(2);
    return 0;
  }
  if (mode == "save") {
    for (int which : {0, 1})
      for (size_t i = 0; i < g.params().size(); ++i) {
        const dist::Range own = t.moment_range(i);
        std::vector<float> v;
        for (int64_t e = own.begin; e < own.end; ++e) v.push_back(pattern(which, i, e));
        t.write_moment(which, i, own.begin, own.size(), v.data());
      }
  } else {
    const int64_t held = heap_above_start([&] {
      const Checkpoint ck = load_checkpoint(argv[3], nullptr, true, [&comm] { comm.keep_alive(); });
      restore_checkpoint(t, ck);
      state = ck.state;
    });
    std::printf("rank %d: resume heap high-water %lld bytes, plan %lld (stream buffer; the parameters are %lld)\n",
                rank, static_cast<long long>(held), static_cast<long long>(plan), static_cast<long long>(param_bytes));
    check(held <= plan + kSlack, "the resume held more than the stream buffer", rank);
    check(held >= plan, "the resume held less than the stream buffer: the plan overstates it", rank);
    int64_t wrong = 0, held_elems = 0;
    for (int which : {0, 1})
      for (size_t i = 0; i < g.params().size(); ++i) {
        const dist::Range own = t.moment_range(i);
        std::vector<float> v(static_cast<size_t>(own.size()));
        if (own.size() > 0) t.read_moment(which, i, own.begin, own.size(), v.data());
        for (int64_t e = own.begin; e < own.end; ++e)
          wrong += v[static_cast<size_t>(e - own.begin)] != pattern(which, i, e);
        held_elems += own.size();
      }
    check(wrong == 0, fmt::format("{} resumed moment elements differ from what was saved", wrong), rank);
    check(held_elems > 0, "this rank holds no moments", rank);
  }
  const int64_t held = heap_above_start([&] {
    const SaveResult r = save_checkpoint(t, state, argv[argc - 1]);
    check(r.saved, "the save did not save: " + r.nonfinite, rank);
  });
  std::printf("rank %d: save heap high-water %lld bytes, plan %lld (stream buffer)\n", rank,
              static_cast<long long>(held), static_cast<long long>(plan));
  check(held <= plan + kSlack, "the save held more than the stream buffer", rank);
  check(held >= plan, "the save held less than the stream buffer: the plan overstates it", rank);
  if (failures == 0) std::printf("rank %d: checkpoint streamed within the plan\n", rank);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Launch launch(&argc, &argv);
  try {
    return work(argc, argv);
  } catch (const std::exception& e) {  // a save that met a full disk says so, and ends every rank
    std::fprintf(stderr, "rank %d: FAILED: %s\n", dist::world().rank(), e.what());
    return dist::fail_job(1);
  }
}
