// The machine's ceilings for bench/run.sh, measured in the same run as the training steps:
//
//   sgemm   large square float32 GEMMs with `--threads` threads (each library's own threading on
//           GCC's libgomp), sizes 2048 and 3072, the best of `--reps` calls after a warm-up call:
//           cblas_sgemm of OpenBLAS (the OpenMP build Debian's PyTorch links) and dnnl_sgemm of
//           oneDNN (what loom calls). Kernels are chosen at run time; the caller's environment
//           (OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA) decides the ISA, and the JSON says what each
//           library picked. The best figure over libraries and sizes is the "GEMM ceiling" that
//           achieved FLOP/s are compared with.
//   triad   STREAM's triad a[i] = b[i] + s*c[i] on doubles, OpenMP static schedule with
//           `--threads` threads, arrays of `--triad-mib` MiB each (far beyond the 32 MiB L3),
//           first-touched by the same threads; bytes counted as STREAM does (24 per element:
//           two reads and one write, no write-allocate). Best of `--reps` passes.
//
// Prints one JSON object on stdout. Built by bench/run.sh:
//   g++ -O3 -mavx2 -mfma -fopenmp -std=c++20 bench/ceiling.cpp -I<openblas-openmp include>
//       -L<openblas-openmp lib> -lopenblas -ldnnl
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
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
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
      reps = 3;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: ceiling [--threads N] [--reps N] [--triad-mib MIB] [--quick]\n");
      return 2;
    }
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--triad-mib"))
      triad_mib = std::atol(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: ceiling [--threads N] [--reps N] [--triad-mib MIB] [--quick]\n");
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
      "\"gemm_ceiling_gflops\": %.2f, \"triad_gbs\": %.2f, \"triad_array_mib\": %ld, \"reps\": %d}\n",
      threads, openblas_get_num_threads(), openblas_get_corename(), cfg.c_str(), coretype ? coretype : "",
      dnnl_isa_name(dnnl_get_effective_cpu_isa()), maxisa ? maxisa : "", ob2048, ob3072, dn2048, dn3072, best, bw,
      triad_mib, reps);
  return 0;
}
