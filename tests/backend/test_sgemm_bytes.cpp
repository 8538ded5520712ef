// The memory plan's library row (Backend::library_bytes, MemoryPlan::library_bytes) against what
// oneDNN's sgemm really mallocs: its packing buffers come from posix_memalign (dnnl::impl::malloc)
// and go back by free before the call returns. This binary interposes both (the dynamic linker
// resolves libdnnl's calls to an executable's definitions first) and, while counting, adds up the
// bytes requested and not yet freed; the peak is what the row must cover. Outside a count the
// interposers only forward to glibc. Under AddressSanitizer, which owns malloc and free and
// intercepts them itself, the binary cannot interpose them too (glibc's free of ASan's blocks
// crashes): there the tests skip, and the Release suite runs them.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_util.h"
#include "backend/registry.h"
#include "graph/passes/plan.h"
#include "runtime/executor.h"
#include "support/op_harness.h"

extern "C" void* __libc_memalign(size_t alignment, size_t size);
extern "C" void __libc_free(void* p);

namespace {

// The blocks posix_memalign handed out while counting (a fixed table: the interposers must not
// allocate), their live sum and its peak.
struct Count {
  std::atomic<bool> on{false};
  std::mutex mu;
  struct Block {
    void* p;
    size_t bytes;
  };
  Block blocks[256] = {};
  int64_t live = 0, peak = 0;
  bool overflow = false;
};
Count& count() {
  static Count c;
  return c;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCounting = false;
#else
constexpr bool kCounting = true;

extern "C" int posix_memalign(void** out, size_t alignment, size_t size) {
  void* p = __libc_memalign(alignment, size);
  if (!p) return ENOMEM;
  *out = p;
  Count& c = count();
  if (c.on.load(std::memory_order_relaxed)) {
    const std::lock_guard lock(c.mu);
    bool placed = false;
    for (Count::Block& b : c.blocks)
      if (!b.p) {
        b = {p, size};
        placed = true;
        break;
      }
    c.overflow |= !placed;
    c.live += static_cast<int64_t>(size);
    c.peak = std::max(c.peak, c.live);
  }
  return 0;
}

extern "C" void free(void* p) {
  Count& c = count();
  if (p && c.on.load(std::memory_order_relaxed)) {
    const std::lock_guard lock(c.mu);
    for (Count::Block& b : c.blocks)
      if (b.p == p) {
        c.live -= static_cast<int64_t>(b.bytes);
        b = {};
        break;
      }
  }
  __libc_free(p);
}
#endif

namespace loom {
namespace {

using testing::OpCase;

// The most bytes posix_memalign held at once during f() (blocks still held when it returns count).
template <class F>
int64_t peak_during(F&& f) {
  Count& c = count();
  {
    const std::lock_guard lock(c.mu);
    c.live = c.peak = 0;
    c.overflow = false;
  }
  c.on = true;
  f();
  c.on = false;
  const std::lock_guard lock(c.mu);
  EXPECT_FALSE(c.overflow) << "more blocks live at once than the table holds";
  for (Count::Block& b : c.blocks) b = {};
  return c.peak;
}

bool avx512() { return std::string_view(cpuk::dnnl_isa_name()).starts_with("avx512"); }

// One sgemm call single-threaded, as our kernels make them: sgemm_call_bytes is what it mallocs,
// exactly where oneDNN runs its AVX-512 kernels, at least that elsewhere. The shapes reach each
// path: GEMV (a single row or column), the small-n TN kernel, the no-copy kernel, the copy-based
// one with K below, between and above its blocks, and leading dimensions that are multiples of
// 256 and 1024 (which steer the choice).
TEST(SgemmBytes, OneCallMallocsWhatTheModelSays) {
  if (!kCounting) GTEST_SKIP() << "AddressSanitizer owns malloc here: no interposed count";
  struct Call {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
  };
  std::vector<Call> calls;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{1, 300, 64},
                                                                       {300, 1, 64},
                                                                       {8, 500, 700},
                                                                       {64, 64, 64},
                                                                       {512, 768, 768},
                                                                       {1200, 900, 100},
                                                                       {700, 1300, 500},
                                                                       {1024, 2304, 768},
                                                                       {128, 9000, 768},
                                                                       {4096, 128, 1536},
                                                                       {400, 400, 30}}) {
        // Dense leading dimensions, and each padded to a width that is no multiple of 256.
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        calls.push_back({ta, tb, M, N, K, lda, ldb, N});
        calls.push_back({ta, tb, M, N, K, lda + 16, ldb + 16, N + 16});
      }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const Call& c : calls) {
    const std::vector<float> A((c.ta ? c.K : c.M) * c.lda, 1.f), B((c.tb ? c.N : c.K) * c.ldb, 1.f);
    std::vector<float> C(c.M * c.ldc);
    cpuk::sgemm_rm(c.ta, c.tb, c.M, c.N, c.K, 1.f, A.data(), c.lda, B.data(), c.ldb, 0.f, C.data(), c.ldc);  // JIT
    const int64_t got = peak_during([&] {
      cpuk::sgemm_rm(c.ta, c.tb, c.M, c.N, c.K, 1.f, A.data(), c.lda, B.data(), c.ldb, 0.f, C.data(), c.ldc);
    });
    const int64_t model = cpuk::sgemm_call_bytes(c.ta, c.tb, c.M, c.N, c.K, c.lda, c.ldb, c.ldc);
    const std::string what = std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " " + std::to_string(c.M) + "x" +
                             std::to_string(c.N) + "x" + std::to_string(c.K) + " ld " + std::to_string(c.lda) + "," +
                             std::to_string(c.ldb) + "," + std::to_string(c.ldc);
    if (avx512())
      EXPECT_EQ(model, got) << what;
    else
      EXPECT_GE(model, got) << what;
  }
  omp_set_num_threads(threads);
}

// The plan's row for a one-node program against the most sgemm's buffers held at once while the
// node ran with `threads` threads (a second run: the first JIT-compiles oneDNN's kernels, which it
// keeps). One thread makes one call at a time, so there the row is the largest call exactly; with
// more, the row (each thread's largest call at once) is a bound the threads may not reach together.
void expect_row_holds(OpCase& oc, int threads, const std::string& what) {
  const int before = num_threads();
  set_num_threads(threads);
  CpuBackend cpu;
  const int64_t planned = plan_program(cpu, oc.graph(), default_schedule(oc.graph())).library_bytes;
  oc.fill_random(7, 100);
  oc.run(cpu);
  const int64_t measured = peak_during([&] { oc.run(cpu); });
  set_num_threads(before);
  EXPECT_GT(measured, 0) << what << ": the kernel calls sgemm";
  EXPECT_LE(measured, planned) << what << " with " << threads << " threads";
  if (threads == 1 && avx512()) {
    EXPECT_LE(planned, measured + 8192) << what << ": the row is tight";
  }
  std::printf("%s, %d thread%s: planned %lld, measured %lld bytes\n", what.c_str(), threads, threads == 1 ? "" : "s",
              static_cast<long long>(planned), static_cast<long long>(measured));
}

TEST(SgemmBytes, ThePlanHoldsWhatTheKernelsMalloc) {
  if (!kCounting) GTEST_SKIP() << "AddressSanitizer owns malloc here: no interposed count";
  struct Named {
    std::string what;
    OpCase oc;
  };
  const DType f = DType::f32;
  std::vector<Named> cases;
  cases.push_back({"small dense", OpCase(OpKind::dense, {{Shape{64, 96}, f}, {Shape{96, 80}, f}}, DenseAttrs{})});
  cases.push_back(
      {"GPT-2 MLP dense with a bias (row blocks in place)",
       OpCase(OpKind::dense, {{Shape{512, 768}, f}, {Shape{768, 3072}, f}, {Shape{3072}, f}}, DenseAttrs{})});
  cases.push_back({"GPT-2 MLP dense_grad_input",
                   OpCase(OpKind::dense_grad_input, {{Shape{512, 3072}, f}, {Shape{768, 3072}, f}}, DenseGradAttrs{})});
  cases.push_back(
      {"GPT-2 MLP dense_grad_weight (TN tiles in tile buffers)",
       OpCase(OpKind::dense_grad_weight, {{Shape{768, 3072}, f}, {Shape{512, 768}, f}, {Shape{512, 3072}, f}},
              DenseGradWeightAttrs{})});
  // A tied head's tiles: whole rows of the [V, C] table, 16384 / 4 columns each.
  cases.push_back(
      {"tied head (GPT-2's logits tiles)",
       OpCase(OpKind::dense, {{Shape{128, 768}, f}, {Shape{16384, 768}, f}}, DenseAttrs{.transpose_w = true})});
  cases.push_back(
      {"fused head, tied, chunks of 4096",
       OpCase(OpKind::linear_cross_entropy, {{Shape{128, 768}, f}, {Shape{8192, 768}, f}, {Shape{128}, DType::i32}},
              LinearCrossEntropyAttrs{.transpose_w = true, .chunk = 4096})});
  // Heads of 36 (not whole vectors) and unmasked rows, outside the register-blocked products: the
  // blocks go to sgemm (copy-based without the mask).
  const AttentionAttrs causal{.causal = true}, full{};
  const Shape qkv{2, 512, 2, 3 * 36}, out{2, 512, 2, 36}, lse{2, 2, 512};
  cases.push_back({"causal attention T 512 D 36", OpCase(OpKind::attention, {{qkv, f}}, causal)});
  cases.push_back(
      {"causal attention_grad T 512 D 36", OpCase(OpKind::attention_grad, {{qkv, f}, {lse, f}, {out, f}}, causal)});
  cases.push_back({"attention T 1024 unmasked", OpCase(OpKind::attention, {{Shape{1, 1024, 2, 3 * 64}, f}}, full)});
  cases.push_back({"attention_grad T 1024 unmasked",
                   OpCase(OpKind::attention_grad,
                          {{Shape{1, 1024, 2, 3 * 64}, f}, {Shape{1, 2, 1024}, f}, {Shape{1, 1024, 2, 64}, f}}, full)});
  for (Named& c : cases)
    for (const int threads : {1, 2}) expect_row_holds(c.oc, threads, c.what);
}

}  // namespace
}  // namespace loom
