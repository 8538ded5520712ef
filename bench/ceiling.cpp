// The machine's ceilings for bench/run.sh, measured in the same run as the training steps:
//
//   sgemm   large square float32 GEMMs with `--threads` threads (each library's own threading on
//           GCC's libgomp), sizes 2048 and 3072, the best of `--reps` calls after a warm-up call:
//           cblas_sgemm of OpenBLAS (the OpenMP build Debian's PyTorch links) and dnnl_sgemm of
//           oneDNN (what loom calls). Kernels are chosen at run time; the caller's environment
//           (OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA) decides the ISA, and the JSON says what each
//           library picked. The best figure over libraries and sizes is the "GEMM ceiling" that
//           achieved FLOP/s are compared with.
//   bf16    oneDNN 3.x's bfloat16 matmul primitive (bf16 A and B, f32 C, all threads: what loom's
//           bf16 dense kernels call, and what PyTorch's CPU autocast reaches through oneDNN) at
//           2048^3; on AVX512-BF16 it runs vdpbf16ps at about twice the f32 FMA rate, on AMX the
//           tile instructions at about twice that again. The JSON names the kernel (bf16_gemm_impl).
//   shapes  with --shapes "M,N,K,ta,tb;...": every listed GEMM (row-major, A [M,K] or its transpose,
//           B [K,N] or its transpose) timed alone, best of --reps, in f32 (dnnl_sgemm) and bf16 (the
//           matmul primitive): the ceiling of a training step's own matrix products, which at small
//           M, N or K run well below the 2048^3 rate. Reported per shape (best seconds in each dtype);
//           the caller weights them by how often a step runs each.
//   triad   STREAM's triad a[i] = b[i] + s*c[i] on doubles, OpenMP static schedule with
//           `--threads` threads, arrays of `--triad-mib` MiB each (far beyond the 32 MiB L3),
//           first-touched by the same threads; bytes counted as STREAM does (24 per element:
//           two reads and one write, no write-allocate). Best of `--reps` passes.
//
// Prints one JSON object on stdout. Built by bench/run.sh:
//   g++ -O3 -mavx2 -mfma -fopenmp -std=c++20 bench/ceiling.cpp -I<openblas-openmp include>
//       -L<openblas-openmp lib> -lopenblas -I.deps/onednn/include -L.deps/onednn/lib -ldnnl
//   (loom's oneDNN 3.x, scripts/install-deps.sh)
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

const char* dnnl_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_fp16:
      return "avx512_core_fp16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_amx_fp16:
      return "avx512_core_amx_fp16";
    case dnnl_cpu_isa_all:
      return "all";
    default:
      return "other";
  }
}

enum class Lib { openblas, onednn };

double sgemm_gflops(Lib lib, int n, int reps) {
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<float> a(elems), b(elems), c(elems);
  for (size_t i = 0; i < elems; ++i) {
    a[i] = static_cast<float>(i % 251) * (1.f / 251.f) - 0.5f;
    b[i] = static_cast<float>(i % 241) * (1.f / 241.f) - 0.5f;
  }
  auto run = [&] {
    if (lib == Lib::openblas) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    } else if (dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n) != dnnl_success) {
      std::fprintf(stderr, "dnnl_sgemm failed\n");
      std::exit(1);
    }
  };
  run();  // warm-up: page faults, OpenBLAS buffers, thread start
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    run();
    best = std::min(best, now_s() - t0);
  }
  volatile float sink = c[elems / 2];
  (void)sink;
  return 2.0 * n * static_cast<double>(n) * n / best * 1e-9;
}

void dnnl_check(dnnl_status_t st, const char* what) {
  if (st != dnnl_success) {
    std::fprintf(stderr, "oneDNN %s failed (status %d)\n", what, static_cast<int>(st));
    std::exit(1);
  }
}

struct GemmShape {
  long M, N, K;
  bool ta, tb;
  double flops() const { return 2.0 * M * N * K; }
};

// Best time of one GEMM of shape g over reps calls after a warm-up call, in f32 (dnnl_sgemm) or
// bf16 (the matmul primitive, created with every thread in effect), operands row-major; -1 when
// this oneDNN has no bf16 matmul for the CPU (as capped by ONEDNN_MAX_CPU_ISA: below AVX-512).
double gemm_seconds(const GemmShape& g, bool bf16, int reps, std::string* impl = nullptr) {
  const size_t na = static_cast<size_t>(g.M) * g.K, nb = static_cast<size_t>(g.K) * g.N;
  const size_t nc = static_cast<size_t>(g.M) * g.N;
  std::vector<float> a(na), b(nb), c(nc);
  for (size_t i = 0; i < na; ++i) a[i] = static_cast<float>(i % 251) * (1.f / 251.f) - 0.5f;
  for (size_t i = 0; i < nb; ++i) b[i] = static_cast<float>(i % 241) * (1.f / 241.f) - 0.5f;
  const long lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
  std::function<void()> run;
  std::vector<uint16_t> a16, b16;
  // One engine for the process: a fresh one per call made the first call's time an outlier.
  static const dnnl_engine_t eng = [] {
    dnnl_engine_t e = nullptr;
    dnnl_check(dnnl_engine_create(&e, dnnl_cpu, 0), "engine");
    return e;
  }();
  dnnl_stream_t stream = nullptr;
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr;
  if (!bf16) {
    // dnnl_sgemm is row-major like cblas: C = op(A) op(B).
    run = [&] {
      dnnl_check(dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.M, g.N, g.K, 1.f, a.data(), lda, b.data(), ldb, 0.f,
                            c.data(), g.N),
                 "sgemm");
    };
  } else {
    const auto to_bf16 = [](const std::vector<float>& v) {
      std::vector<uint16_t> r(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        uint32_t u;
        std::memcpy(&u, &v[i], 4);
        r[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      }
      return r;
    };
    a16 = to_bf16(a);
    b16 = to_bf16(b);
    dnnl_check(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags), "stream");
    dnnl_dims_t da = {g.M, g.K}, db = {g.K, g.N}, dc = {g.M, g.N};
    dnnl_dims_t sa = {lda, 1}, sb = {ldb, 1}, sc = {g.N, 1};
    if (g.ta) sa[0] = 1, sa[1] = lda;
    if (g.tb) sb[0] = 1, sb[1] = ldb;
    dnnl_memory_desc_t mda, mdb, mdc;
    dnnl_check(dnnl_memory_desc_create_with_strides(&mda, 2, da, dnnl_bf16, sa), "A descriptor");
    dnnl_check(dnnl_memory_desc_create_with_strides(&mdb, 2, db, dnnl_bf16, sb), "B descriptor");
    dnnl_check(dnnl_memory_desc_create_with_strides(&mdc, 2, dc, dnnl_f32, sc), "C descriptor");
    dnnl_primitive_desc_t pd;
    const bool ok = dnnl_matmul_primitive_desc_create(&pd, eng, mda, mdb, nullptr, mdc, nullptr) == dnnl_success;
    if (ok) {
      const char* name = nullptr;
      dnnl_check(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name), "implementation");
      if (impl) *impl = name ? name : "";
      dnnl_check(dnnl_primitive_create(&prim, pd), "primitive");
      dnnl_check(dnnl_primitive_desc_destroy(pd), "descriptor release");
      dnnl_check(dnnl_memory_create(&ma, mda, eng, a16.data()), "A memory");
      dnnl_check(dnnl_memory_create(&mb, mdb, eng, b16.data()), "B memory");
      dnnl_check(dnnl_memory_create(&mc, mdc, eng, c.data()), "C memory");
    }
    for (dnnl_memory_desc_t m : {mda, mdb, mdc}) dnnl_memory_desc_destroy(m);
    if (!ok) {
      dnnl_stream_destroy(stream);
      return -1;
    }
    run = [&] {
      dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
      dnnl_check(dnnl_primitive_execute(prim, stream, 3, args), "matmul");
      dnnl_check(dnnl_stream_wait(stream), "stream wait");
    };
  }
  run();  // warm-up: page faults, the kernel's code generation, thread start
  run();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    run();
    best = std::min(best, now_s() - t0);
  }
  if (bf16) {
    for (dnnl_memory_t m : {ma, mb, mc}) dnnl_memory_destroy(m);
    dnnl_primitive_destroy(prim);
    dnnl_stream_destroy(stream);
  }
  return best;
}

// "M,N,K,ta,tb;M,N,K,ta,tb;..."
std::vector<GemmShape> parse_shapes(const char* text) {
  std::vector<GemmShape> v;
  for (const char* p = text; *p;) {
    GemmShape g{};
    int ta = 0, tb = 0, used = 0;
    if (std::sscanf(p, "%ld,%ld,%ld,%d,%d%n", &g.M, &g.N, &g.K, &ta, &tb, &used) != 5 || g.M <= 0 || g.N <= 0 ||
        g.K <= 0) {
      std::fprintf(stderr, "ceiling: --shapes wants M,N,K,ta,tb;... (positive sizes), got '%s'\n", p);
      std::exit(2);
    }
    g.ta = ta != 0;
    g.tb = tb != 0;
    v.push_back(g);
    p += used;
    if (*p == ';') ++p;
  }
  return v;
}

double triad_gbs(size_t n, int reps) {
  double* a = static_cast<double*>(std::aligned_alloc(64, n * sizeof(double)));
  double* b = static_cast<double*>(std::aligned_alloc(64, n * sizeof(double)));
  double* c = static_cast<double*>(std::aligned_alloc(64, n * sizeof(double)));
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < nn; ++i) {
    a[i] = 0.0;
    b[i] = 1.0;
    c[i] = 2.0;
  }
  const double s = 3.0;
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first pass is a warm-up
    const double t0 = now_s();
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < nn; ++i) a[i] = b[i] + s * c[i];
    const double t = now_s() - t0;
    if (r > 0) best = std::min(best, t);
  }
  volatile double sink = a[n / 3];
  (void)sink;
  std::free(a);
  std::free(b);
  std::free(c);
  return 3.0 * sizeof(double) * static_cast<double>(n) / best * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  long triad_mib = 256;
  bool quick = false;  // --quick: 2048 only, 3 reps, no triad (a spot check between timings)
  std::vector<GemmShape> shapes;
  const char* usage = "usage: ceiling [--threads N] [--reps N] [--triad-mib MIB] [--quick] [--shapes M,N,K,ta,tb;...]\n";
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
      reps = 3;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s", usage);
      return 2;
    }
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--triad-mib"))
      triad_mib = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--shapes"))
      shapes = parse_shapes(argv[i + 1]);
    else {
      std::fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  const double ob2048 = sgemm_gflops(Lib::openblas, 2048, reps);
  const double dn2048 = sgemm_gflops(Lib::onednn, 2048, reps);
  const double ob3072 = quick ? 0.0 : sgemm_gflops(Lib::openblas, 3072, reps);
  const double dn3072 = quick ? 0.0 : sgemm_gflops(Lib::onednn, 3072, reps);
  const double best = std::max({ob2048, ob3072, dn2048, dn3072});
  std::string bf16_impl;
  const double bf2048 = gemm_seconds({2048, 2048, 2048, false, false}, true, reps, &bf16_impl);
  std::string step_shapes = "[";
  for (const GemmShape& g : shapes) {
    char row[256];
    std::snprintf(row, sizeof row,
                  "%s{\"M\": %ld, \"N\": %ld, \"K\": %ld, \"ta\": %d, \"tb\": %d, \"float32_s\": %.9f, "
                  "\"bfloat16_s\": %.9f}",
                  step_shapes.size() > 1 ? ", " : "", g.M, g.N, g.K, g.ta ? 1 : 0, g.tb ? 1 : 0,
                  gemm_seconds(g, false, std::max(reps, 5)), gemm_seconds(g, true, std::max(reps, 5)));
    step_shapes += row;
  }
  step_shapes += "]";
  const size_t n = static_cast<size_t>(triad_mib) * 1024 * 1024 / sizeof(double);
  const double bw = quick ? 0.0 : triad_gbs(n, reps * 2);
  std::string cfg = openblas_get_config();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* maxisa = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::printf(
      "{\"threads\": %d, \"openblas_threads\": %d, \"openblas_corename\": \"%s\", \"openblas_config\": \"%s\", "
      "\"openblas_coretype_env\": \"%s\", \"onednn_isa\": \"%s\", \"onednn_max_cpu_isa_env\": \"%s\", "
      "\"sgemm_gflops\": {\"openblas\": {\"2048\": %.2f, \"3072\": %.2f}, \"onednn\": {\"2048\": %.2f, \"3072\": "
      "%.2f}}, "
      "\"gemm_ceiling_gflops\": %.2f, \"bf16_gemm_gflops\": {\"2048\": %.2f}, \"bf16_gemm_impl\": \"%s\", "  // 0: no
                                                                                                             // bf16
                                                                                                             // matmul
      "\"step_shapes\": %s, "
      "\"triad_gbs\": %.2f, \"triad_array_mib\": %ld, \"reps\": %d}\n",
      threads, openblas_get_num_threads(), openblas_get_corename(), cfg.c_str(), coretype ? coretype : "",
      dnnl_isa_name(dnnl_get_effective_cpu_isa()), maxisa ? maxisa : "", ob2048, ob3072, dn2048, dn3072, best,
      bf2048 > 0 ? 2.0 * 2048 * 2048 * 2048 / bf2048 * 1e-9 : 0.0, bf16_impl.c_str(), step_shapes.c_str(), bw,
      triad_mib, reps);
  return 0;
}
