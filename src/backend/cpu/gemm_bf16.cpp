// The CPU backend's bfloat16 GEMM (cpuk::gemm_rm on bf16 operands, declared in cpu_util.h):
// oneDNN 3.x's matmul primitive, which on CPUs with AVX512-BF16 runs the dot-product instruction
// vdpbf16ps at about twice the f32 FMA rate, and on CPUs with AMX (Intel Xeon, Sapphire Rapids
// and later) the tile instruction tdpbf16ps at about twice that again.
//
// AMX: oneDNN 3.2 runs its AMX kernel (brg:avx512_core_amx) only when A, B and C are dense; a
// strided one (a tile of loom's GEMM grid inside a bigger operand, dense.cpp) goes to its
// vdpbf16ps kernel (gemm:jit) at half the rate. So on AMX a strided operand is first copied dense
// into the caller's scratchpad (and C out of it after): one pass over each, small next to the
// product when the other dimensions are large (plan_call). The copies change no value; the kernel then sums like the untiled product's. Where the
// effective ISA has no AMX (AMD hosts, or ONEDNN_MAX_CPU_ISA below it) nothing is copied.
//
// Primitives are created once per (shape, layout) and thread and cached,
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
  for (auto [mem, arg] :
       {std::pair{&m.a, DNNL_ARG_SRC}, {&m.b, DNNL_ARG_WEIGHTS}, {&m.c, DNNL_ARG_DST}, {&m.pad, DNNL_ARG_SCRATCHPAD}})
    check(dnnl_memory_create(mem, dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg), engine(),
                             DNNL_MEMORY_NONE),
          "argument memory");
  dnnl_primitive_desc_destroy(pd);
  return m;
}

// Whether oneDNN's effective ISA (which honours ONEDNN_MAX_CPU_ISA) includes `isa`.
bool isa_has(dnnl_cpu_isa_t isa) {
  const auto mask = static_cast<unsigned>(isa);
  return (static_cast<unsigned>(dnnl_get_effective_cpu_isa()) & mask) == mask;
}

bool amx() {
  static const bool ok = isa_has(dnnl_cpu_isa_avx512_core_amx);
  return ok;
}

int64_t align64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// One call as oneDNN runs it: the key of its primitive (leading dimensions made dense where the
// operands are copied) and the byte offsets of the copies in the caller's scratchpad, after
// oneDNN's own scratchpad. An offset of -1: that operand is used where it is.
struct Call {
  Key key;
  int64_t a_at = -1, b_at = -1, c_at = -1;
  int64_t bytes = 0;  // the whole scratchpad: oneDNN's and the copies
};

int64_t scratchpad_bytes(const Key& key);

Call plan_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, int threads) {
  Call c{.key = {ta, tb, M, N, K, lda, ldb, ldc, threads}};
  const int64_t dense_a = ta ? M : K, dense_b = tb ? K : N;
  bool copy_a = lda != dense_a, copy_b = ldb != dense_b, copy_c = ldc != N;
  // A copy pays when each copied element then takes part in many products: A's in N, B's in M,
  // C's in K. Otherwise (a few rows against a wide B, e.g. the tied head's input gradient at a
  // small batch) the operands stay where they are and oneDNN runs its vdpbf16ps kernel.
  constexpr int64_t kMinReuse = 512, kMinReuseC = 128;
  const bool pays = (!copy_a || N >= kMinReuse) && (!copy_b || M >= kMinReuse) && (!copy_c || K >= kMinReuseC);
  if (!amx() || !pays) copy_a = copy_b = copy_c = false;
  if (copy_a) c.key.lda = dense_a;
  if (copy_b) c.key.ldb = dense_b;
  if (copy_c) c.key.ldc = N;
  int64_t at = align64(scratchpad_bytes(c.key));
  const auto take = [&](bool copy, int64_t bytes) {
    if (!copy) return int64_t{-1};
    const int64_t mine = at;
    at += align64(bytes);
    return mine;
  };
  c.a_at = take(copy_a, M * K * 2);
  c.b_at = take(copy_b, K * N * 2);
  c.c_at = take(copy_c, M * N * 4);
  c.bytes = at;
  return c;
}

// `rows` rows of `width` elements of `elem` bytes from src (row stride lds) to dst (row stride ldd).
void copy_rows(std::byte* dst, int64_t ldd, const std::byte* src, int64_t lds, int64_t rows, int64_t width,
               int64_t elem) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ldd * elem, src + r * lds * elem, width * elem);
}

int64_t scratchpad_bytes(const Key& key) {
  // Plans ask for the same few shapes again and again (every layer's dense nodes).
  static std::mutex mu;
  static std::unordered_map<Key, int64_t, KeyHash> known;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(key);
  if (it == known.end()) {
    const dnnl_primitive_desc_t pd = describe(key);
    it = known.emplace(key, scratchpad_bytes(pd)).first;
    dnnl_primitive_desc_destroy(pd);
  }
  return it->second;
}

}  // namespace

bool bf16_gemm_available() {
  // A capped run (bench/run.sh's avx2 mode, the test that covers the f32 path) takes the widening
  // path like a machine without the instructions.
  static const bool ok = isa_has(dnnl_cpu_isa_avx512_core_bf16);
  return ok;
}

bool bf16_gemm_amx() { return amx(); }

const char* dnnl_isa_name() {
  // Highest first: each ISA's mask contains those below it.
  static constexpr std::pair<dnnl_cpu_isa_t, const char*> kNames[] = {
      {dnnl_cpu_isa_avx512_core_amx_fp16, "avx512_core_amx_fp16"},
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
      {dnnl_cpu_isa_avx512_core_fp16, "avx512_core_fp16"},
      {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
      {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx2_vnni_2, "avx2_vnni_2"},
      {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
      {dnnl_cpu_isa_avx2, "avx2"},
      {dnnl_cpu_isa_avx, "avx"},
      {dnnl_cpu_isa_sse41, "sse41"}};
  for (auto [isa, name] : kNames)
    if (isa_has(isa)) return name;
  return "default";
}

std::string dnnl_version_name() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string bf16_gemm_impl(int64_t n, int threads) {
  const dnnl_primitive_desc_t pd = describe({false, false, n, n, n, n, n, n, threads});
  const char* impl = nullptr;
  check(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl), "implementation query");
  std::string name = impl ? impl : "unknown";
  dnnl_primitive_desc_destroy(pd);
  return name;
}

int64_t bf16_gemm_scratchpad(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                             int threads) {
  return plan_call(ta, tb, M, N, K, lda, ldb, ldc, threads).bytes;
}

void gemm_rm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
             int64_t ldb, float* C, int64_t ldc, std::byte* pad) {
  thread_local std::unordered_map<Key, Matmul, KeyHash> cache;
  thread_local const dnnl_stream_t stream = [] {
    dnnl_stream_t s = nullptr;
    check(dnnl_stream_create(&s, engine(), dnnl_stream_default_flags), "stream creation");
    return s;
  }();
  const Call call = plan_call(ta, tb, M, N, K, lda, ldb, ldc, omp_get_max_threads());
  auto it = cache.find(call.key);
  if (it == cache.end()) it = cache.emplace(call.key, create(call.key)).first;
  const Matmul& m = it->second;
  LOOM_ASSERT(call.bytes == 0 || pad, "the bf16 matmul needs a scratchpad");
  const auto* a = reinterpret_cast<const std::byte*>(A);
  const auto* b = reinterpret_cast<const std::byte*>(B);
  auto* c = reinterpret_cast<std::byte*>(C);
  if (call.a_at >= 0) {
    copy_rows(pad + call.a_at, call.key.lda, a, lda, ta ? K : M, call.key.lda, 2);
    a = pad + call.a_at;
  }
  if (call.b_at >= 0) {
    copy_rows(pad + call.b_at, call.key.ldb, b, ldb, tb ? N : K, call.key.ldb, 2);
    b = pad + call.b_at;
  }
  if (call.c_at >= 0) c = pad + call.c_at;
  check(dnnl_memory_set_data_handle(m.a, const_cast<std::byte*>(a)), "A handle");
  check(dnnl_memory_set_data_handle(m.b, const_cast<std::byte*>(b)), "B handle");
  check(dnnl_memory_set_data_handle(m.c, c), "C handle");
  check(dnnl_memory_set_data_handle(m.pad, pad), "scratchpad handle");
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c}, {DNNL_ARG_SCRATCHPAD, m.pad}};
  check(dnnl_primitive_execute(m.prim, stream, 4, args), "execution");
  check(dnnl_stream_wait(stream), "stream wait");
  if (call.c_at >= 0) copy_rows(reinterpret_cast<std::byte*>(C), ldc, c, N, M, N, 4);
}

}  // namespace loom::cpuk
