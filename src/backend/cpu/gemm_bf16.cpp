// The CPU backend's bfloat16 GEMM (cpuk::gemm_rm on bf16 operands, declared in cpu_util.h):
// oneDNN's matmul primitive, which on CPUs with AVX512-BF16 runs the dot-product instruction
// vdpbf16ps at about twice the f32 FMA rate (bench/blas/bf16.cpp: 1.95-2.26x sgemm on one core at
// the benchmark's shapes). Primitives are created once per (shape, layout) and thread and cached,
// so two threads never share state; their scratchpad is the caller's (user scratchpad mode): the
// dense kernels hand each thread a span of their planned workspace, sized by
// bf16_gemm_scratchpad, so a call allocates nothing after the first.
//
// Threads: a primitive runs with the OpenMP thread count in effect when it was created, which is
// part of the cache key; dense.cpp calls it inside its own tile loop, where that is 1 (as for
// sgemm). The cache lives as long as its thread (training runs a fixed set of shapes).
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "backend/cpu/cpu_util.h"

namespace loom::cpuk {

namespace {

void check(dnnl_status_t st, const char* what) {
  LOOM_ASSERT(st == dnnl_success, std::string("oneDNN bf16 matmul: ") + what + " failed (status " +
                                      std::to_string(static_cast<int>(st)) + ")");
}

dnnl_engine_t engine() {
  static const dnnl_engine_t e = [] {
    dnnl_engine_t eng = nullptr;
    check(dnnl_engine_create(&eng, dnnl_cpu, 0), "engine creation");
    return eng;
  }();
  return e;
}

// A primitive fixes its thread count when it is created (oneDNN with OpenMP), so that is part of
// the key: dense.cpp's tile loops create theirs with 1, the profiler's ceiling with all threads.
struct Key {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  int threads;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = (k.ta ? 1u : 0u) | (k.tb ? 2u : 0u);
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, int64_t{k.threads}})
      h = h * 1000003u ^ static_cast<size_t>(v);
    return h;
  }
};

// One primitive with memory objects for its arguments (data handles set per call).
struct Matmul {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr, pad = nullptr;
  int64_t pad_bytes = 0;
};

// The primitive descriptor for k, created with k.threads OpenMP threads in effect (a primitive
// takes its thread count from the descriptor's creation). The caller destroys it.
dnnl_primitive_desc_t describe(const Key& k) {
  // Row-major [M, K] A, or its transpose stored [K, M]; likewise B; C [M, N] with ldc.
  dnnl_dims_t da = {k.M, k.K}, db = {k.K, k.N}, dc = {k.M, k.N};
  dnnl_dims_t sa = {k.lda, 1}, sb = {k.ldb, 1}, sc = {k.ldc, 1};
  if (k.ta) sa[0] = 1, sa[1] = k.lda;
  if (k.tb) sb[0] = 1, sb[1] = k.ldb;
  dnnl_memory_desc_t ma, mb, mc;
  check(dnnl_memory_desc_create_with_strides(&ma, 2, da, dnnl_bf16, sa), "A descriptor");
  check(dnnl_memory_desc_create_with_strides(&mb, 2, db, dnnl_bf16, sb), "B descriptor");
  check(dnnl_memory_desc_create_with_strides(&mc, 2, dc, dnnl_f32, sc), "C descriptor");
  dnnl_primitive_attr_t attr;
  check(dnnl_primitive_attr_create(&attr), "attribute creation");
  check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
  dnnl_primitive_desc_t pd;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(k.threads);
  const dnnl_status_t st = dnnl_matmul_primitive_desc_create(&pd, engine(), ma, mb, nullptr, mc, attr);
  omp_set_num_threads(saved);
  dnnl_primitive_attr_destroy(attr);
  for (dnnl_memory_desc_t m : {ma, mb, mc}) dnnl_memory_desc_destroy(m);
  check(st, "primitive descriptor");
  return pd;
}

int64_t scratchpad_bytes(const_dnnl_primitive_desc_t pd) {
  return static_cast<int64_t>(dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)));
}

Matmul create(const Key& k) {
  const dnnl_primitive_desc_t pd = describe(k);
  Matmul m;
  check(dnnl_primitive_create(&m.prim, pd), "primitive creation");
  m.pad_bytes = scratchpad_bytes(pd);
  for (auto [mem, arg] :
       {std::pair{&m.a, DNNL_ARG_SRC}, {&m.b, DNNL_ARG_WEIGHTS}, {&m.c, DNNL_ARG_DST}, {&m.pad, DNNL_ARG_SCRATCHPAD}})
    check(dnnl_memory_create(mem, dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg), engine(),
                             DNNL_MEMORY_NONE),
          "argument memory");
  dnnl_primitive_desc_destroy(pd);
  return m;
}

}  // namespace

bool bf16_gemm_available() {
  // The effective ISA honours ONEDNN_MAX_CPU_ISA, so a capped run (bench/run.sh's avx2 mode, the
  // test that covers the f32 path) takes the widening path like a machine without the instructions.
  static const bool ok = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned need = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & need) == need;
  }();
  return ok;
}

int64_t bf16_gemm_scratchpad(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                             int threads) {
  // Plans ask for the same few shapes again and again (every layer's dense nodes).
  static std::mutex mu;
  static std::unordered_map<Key, int64_t, KeyHash> known;
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, threads};
  const std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(key);
  if (it == known.end()) {
    const dnnl_primitive_desc_t pd = describe(key);
    it = known.emplace(key, scratchpad_bytes(pd)).first;
    dnnl_primitive_desc_destroy(pd);
  }
  return it->second;
}

void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
             int64_t ldb, float* C, int64_t ldc, std::byte* pad) {
  thread_local std::unordered_map<Key, Matmul, KeyHash> cache;
  thread_local const dnnl_stream_t stream = [] {
    dnnl_stream_t s = nullptr;
    check(dnnl_stream_create(&s, engine(), dnnl_stream_default_flags), "stream creation");
    return s;
  }();
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, omp_get_max_threads()};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, create(key)).first;
  const Matmul& m = it->second;
  LOOM_ASSERT(m.pad_bytes == 0 || pad, "the bf16 matmul needs a scratchpad");
  check(dnnl_memory_set_data_handle(m.a, const_cast<uint16_t*>(A)), "A handle");
  check(dnnl_memory_set_data_handle(m.b, const_cast<uint16_t*>(B)), "B handle");
  check(dnnl_memory_set_data_handle(m.c, C), "C handle");
  check(dnnl_memory_set_data_handle(m.pad, pad), "scratchpad handle");
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c}, {DNNL_ARG_SCRATCHPAD, m.pad}};
  check(dnnl_primitive_execute(m.prim, stream, 4, args), "execution");
  check(dnnl_stream_wait(stream), "stream wait");
}

}  // namespace loom::cpuk
