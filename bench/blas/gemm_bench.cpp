// gemm_bench.cpp - row-major fp32 SGEMM throughput at transformer-training shapes,
// OpenBLAS vs BLIS vs oneDNN, all on GCC's libgomp.
//
// Two build modes:
//   default (runtime selection): the libraries are dlopen()ed (RTLD_LOCAL|RTLD_DEEPBIND,
//     so OpenBLAS' and BLIS' identically named cblas_*/sgemm_ symbols never mix) and the
//     timing of every shape is INTERLEAVED across libraries (round-robin slices of
//     min_time/6 each), so slow drifts of machine speed (shared VM host) hit all libraries
//     alike. This is the mode used for the comparison.
//   -DLOOM_BLAS_LINKED_OPENBLAS / _BLIS / _DNNL: the program is linked directly against one
//     library (the way the project would link it) and only that one is benchmarked.
//
// For every model shape it times the three GEMMs of a linear layer in training
// (weight W stored row-major as [K_in, N_out], activations X as [M, K_in]):
//   NN  forward  Y[M,N]  = X[M,K] * W[K,N]                    beta = 0
//   NT  dX       dX[M,K] = dY[M,N] * W[K,N]^T                 beta = 0
//   TN  dW       dW[K,N] += X[M,K]^T * dY[M,N]                beta = 1 (grad accumulation)
// plus a 2048^3 NN square (the machine's "GEMM ceiling"), timed first and last so drift
// over the run is visible.
//
// GFLOP/s = 2*M*N*K / median(time per call). Per shape and library: a correctness check
// against a double-precision reference on 32 sampled entries, warm-up (>= 2 calls and
// >= 0.05 s), then individually timed calls until >= --min-time s AND >= 5 calls.
//
// Usage: gemm_bench [--libs openblas,blis,onednn] [--min-time S] [--threads N]
//                   [--filter SUBSTR] [--only KEY,KEY...] [--config NAME] [--json PATH]
//                   [--max-noise FRAC] [--retries N] [--deadline S]
//   (a shape's KEY is model/layer/op, e.g. gpt2-124M/qkv/NT)
// The machine may be shared. A shape is measured only once CPU use by other processes / host
// steal has fallen to --max-noise (fraction of all CPUs over 0.6 s, default 0.05); if that was
// exceeded during the measurement it is queued again (at most --retries times, default 6;
// the quietest measurement is kept and its other_load reported). Shapes still waiting for a
// quiet machine after --deadline s (default 600) are left out and listed as not measured.
// --deadline -1: measure at once, never wait or re-measure (for deliberate-load experiments).
// Library paths for dlopen can be overridden with LOOM_OPENBLAS_SO, LOOM_BLIS_SO, LOOM_ONEDNN_SO.

#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(LOOM_BLAS_LINKED_OPENBLAS) || defined(LOOM_BLAS_LINKED_BLIS)
#include <cblas.h>  // OpenBLAS' or BLIS' cblas.h, chosen by -I
#elif defined(LOOM_BLAS_LINKED_DNNL)
#include <oneapi/dnnl/dnnl.h>
#endif

namespace {

// ---------------------------------------------------------------- backends
using cblas_sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                               int);
using dnnl_sgemm_t = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                             float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // standard CBLAS enum values

struct Backend {
  std::string name, info;
  cblas_sgemm_t cblas = nullptr;
  dnnl_sgemm_t dnnl = nullptr;

  // Row-major C[m,n] = op(A)[m,k] * op(B)[k,n] + beta * C.
  void gemm(bool ta, bool tb, long m, long n, long k, const float* A, long lda, const float* B, long ldb, float beta,
            float* C, long ldc) const {
    if (cblas) {
      cblas(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, (int)m, (int)n, (int)k, 1.0f, A, (int)lda, B,
            (int)ldb, beta, C, (int)ldc);
    } else {
      int st = dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc);
      if (st != 0) {
        std::fprintf(stderr, "dnnl_sgemm failed: status %d\n", st);
        std::exit(1);
      }
    }
  }
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "gemm_bench: %s\n", msg.c_str());
  std::exit(1);
}

void* sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) die(std::string("missing symbol ") + name);
  return p;
}

template <class F>
F fn(void* h, const char* name) {
  return reinterpret_cast<F>(sym(h, name));
}

[[maybe_unused]] const char* default_path(const std::string& lib) {
  if (lib == "openblas") return "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0";
  if (lib == "blis") return "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4";
  if (lib == "onednn") return "libdnnl.so.2";
  die("unknown library " + lib);
}

// handle: a dlopen() handle, or RTLD_DEFAULT when the library is linked in.
Backend make_backend(const std::string& lib, void* h, int threads) {
  Backend b;
  b.name = lib;
  char buf[640];
  if (lib == "openblas") {
    b.cblas = fn<cblas_sgemm_t>(h, "cblas_sgemm");
    fn<void (*)(int)>(h, "openblas_set_num_threads")(threads);
    std::snprintf(buf, sizeof buf, "core=%s threads=%d config=[%s]", fn<char* (*)()>(h, "openblas_get_corename")(),
                  fn<int (*)()>(h, "openblas_get_num_threads")(), fn<char* (*)()>(h, "openblas_get_config")());
  } else if (lib == "blis") {
    b.cblas = fn<cblas_sgemm_t>(h, "cblas_sgemm");
    fn<void (*)(int64_t)>(h, "bli_thread_set_num_threads")(threads);
    int arch = fn<int (*)()>(h, "bli_arch_query_id")();
    std::snprintf(buf, sizeof buf, "version=%s arch=%s threads=%ld", fn<char* (*)()>(h, "bli_info_get_version_str")(),
                  fn<char* (*)(int)>(h, "bli_arch_string")(arch),
                  (long)fn<int64_t (*)()>(h, "bli_thread_get_num_threads")());
  } else if (lib == "onednn") {
    b.dnnl = fn<dnnl_sgemm_t>(h, "dnnl_sgemm");
    // oneDNN's OMP runtime uses omp_get_max_threads(); it has no thread setter of its own.
    struct Ver {
      int major, minor, patch;
      const char* hash;
      unsigned cpu_runtime, gpu_runtime;
    };
    const Ver* v = fn<const Ver* (*)()>(h, "dnnl_version")();
    int isa = fn<int (*)()>(h, "dnnl_get_effective_cpu_isa")();
    const char* isa_s = isa == 0x7     ? "avx2"
                        : isa == 0x27  ? "avx512_core"
                        : isa == 0x67  ? "avx512_core_vnni"
                        : isa == 0xe7  ? "avx512_core_bf16"
                        : isa == 0x3e7 ? "avx512_core_amx"
                        : isa == 0x407 ? "avx2_vnni"
                                       : "other";
    std::snprintf(buf, sizeof buf, "version=%d.%d.%d cpu_runtime=%s max_isa=%s omp_max_threads=%d", v->major, v->minor,
                  v->patch, v->cpu_runtime == 2 ? "OMP" : "non-OMP", isa_s, omp_get_max_threads());
  } else {
    die("unknown library " + lib);
  }
  b.info = buf;
  return b;
}

std::vector<Backend> load_backends(const std::vector<std::string>& libs, int threads) {
  std::vector<Backend> out;
#if defined(LOOM_BLAS_LINKED_OPENBLAS) || defined(LOOM_BLAS_LINKED_BLIS) || defined(LOOM_BLAS_LINKED_DNNL)
#if defined(LOOM_BLAS_LINKED_OPENBLAS)
  const char* linked = "openblas";
  void* volatile keep = reinterpret_cast<void*>(&cblas_sgemm);  // keep the DT_NEEDED
#elif defined(LOOM_BLAS_LINKED_BLIS)
  const char* linked = "blis";
  void* volatile keep = reinterpret_cast<void*>(&cblas_sgemm);
#else
  const char* linked = "onednn";
  void* volatile keep = reinterpret_cast<void*>(&dnnl_sgemm);
#endif
  (void)keep;
  (void)libs;
  out.push_back(make_backend(linked, RTLD_DEFAULT, threads));
  out.back().info += " [linked]";
#else
  for (const std::string& lib : libs) {
    std::string env = "LOOM_" + lib + "_SO";  // optional override of the library path
    for (auto& c : env) c = (char)std::toupper((unsigned char)c);
    const char* path = std::getenv(env.c_str()) ? std::getenv(env.c_str()) : default_path(lib);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) die(std::string("dlopen ") + path + ": " + dlerror());
    out.push_back(make_backend(lib, h, threads));
    out.back().info += std::string(" [dlopen ") + path + "]";
  }
#endif
  return out;
}

// ---------------------------------------------------------------- shapes
struct Shape {
  std::string model, layer, op;  // op: NN / NT / TN
  long M, N, K;                  // GEMM dims of C[M,N] = op(A)[M,K] op(B)[K,N]
  int count;                     // times this GEMM runs per training step (n_layer or 1)
};

struct Model {
  const char* name;
  long BT, C, V;
  int n_layer;  // only used to weight the per-step summary
};

const Model kModels[] = {
    {"gpt2-124M", 256, 768, 50257, 12},
    {"nanogpt-char", 768, 128, 65, 4},  // nanoGPT shakespeare_char CPU config: 4 layers
    {"6L-384", 2048, 384, 65, 6},
    {"tutorial", 1024, 256, 2048, 4},  // n_layer assumed 4
};

std::vector<Shape> make_shapes() {
  std::vector<Shape> s;
  s.push_back({"square", "2048^3-first", "NN", 2048, 2048, 2048, 0});
  for (const Model& m : kModels) {
    struct L {
      const char* name;
      long kin, nout;
      int count;
    };
    const L layers[] = {
        {"qkv", m.C, 3 * m.C, m.n_layer},      {"attn_proj", m.C, m.C, m.n_layer}, {"mlp_fc", m.C, 4 * m.C, m.n_layer},
        {"mlp_proj", 4 * m.C, m.C, m.n_layer}, {"lm_head", m.C, m.V, 1},
    };
    for (const L& l : layers) {
      s.push_back({m.name, l.name, "NN", m.BT, l.nout, l.kin, l.count});  // Y = X W
      s.push_back({m.name, l.name, "NT", m.BT, l.kin, l.nout, l.count});  // dX = dY W^T
      s.push_back({m.name, l.name, "TN", l.kin, l.nout, m.BT, l.count});  // dW += X^T dY
    }
  }
  s.push_back({"square", "2048^3", "NN", 2048, 2048, 2048, 0});
  return s;
}

// ---------------------------------------------------------------- timing
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time used on the machine by anything other than this process (other processes, and
// host steal), as a fraction of wall time x online CPUs. Used to detect a busy machine.
struct CpuSnap {
  double busy_s, self_s, wall_s;
};
CpuSnap cpu_snap() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  long long v[8] = {0};
  f >> cpu;
  for (long long& x : v) f >> x;  // user nice system idle iowait irq softirq steal
  const double hz = (double)sysconf(_SC_CLK_TCK);
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return {(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz, ts.tv_sec + ts.tv_nsec * 1e-9, now_s()};
}
double others_frac(const CpuSnap& a, const CpuSnap& b) {
  const double ncpu = (double)sysconf(_SC_NPROCESSORS_ONLN);
  double other = (b.busy_s - a.busy_s) - (b.self_s - a.self_s);
  return std::max(0.0, other) / ((b.wall_s - a.wall_s) * ncpu);
}

// Wait (polling 0.6 s windows) until other load is <= max_noise or the clock passes
// `until`. Returns true if the machine is quiet.
bool wait_quiet(double max_noise, double until) {
  do {
    CpuSnap a = cpu_snap();
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    if (others_frac(a, cpu_snap()) <= max_noise) return true;
  } while (now_s() < until);
  return false;
}

struct LibResult {
  double median_s = 0, min_s = 0, gflops = 0, max_rel_err = 0;
  int reps = 0;
};

std::vector<LibResult> run_shape(const Shape& sh, const std::vector<Backend>& bs, double min_time, std::mt19937& rng) {
  const bool ta = sh.op == "TN", tb = sh.op == "NT";
  const long M = sh.M, N = sh.N, K = sh.K;
  // Stored (row-major) shapes: A is [M,K] or [K,M] if ta; B is [K,N] or [N,K] if tb.
  const long a_rows = ta ? K : M, a_cols = ta ? M : K;
  const long b_rows = tb ? N : K, b_cols = tb ? K : N;
  const long lda = a_cols, ldb = b_cols, ldc = N;
  std::vector<float> A(a_rows * a_cols), B(b_rows * b_cols), C(M * N);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);
  for (auto& x : A) x = U(rng);
  for (auto& x : B) x = U(rng);
  const float beta = sh.op == "TN" ? 1.0f : 0.0f;
  auto call = [&](const Backend& b) { b.gemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, C.data(), ldc); };
  const size_t nb = bs.size();
  std::vector<LibResult> res(nb);

  for (size_t i = 0; i < nb; ++i) {
    // Correctness: C = 0 first, so beta does not matter for this call.
    std::fill(C.begin(), C.end(), 0.0f);
    call(bs[i]);
    for (int s = 0; s < 32; ++s) {
      long r = rng() % M, c = rng() % N;
      double ref = 0, mag = 0;
      for (long p = 0; p < K; ++p) {
        double a = ta ? A[p * lda + r] : A[r * lda + p];
        double b = tb ? B[c * ldb + p] : B[p * ldb + c];
        ref += a * b;
        mag += std::fabs(a * b);
      }
      res[i].max_rel_err = std::max(res[i].max_rel_err, std::fabs(ref - C[r * ldc + c]) / (mag + 1e-30));
    }
    if (res[i].max_rel_err > 1e-4) {
      std::fprintf(stderr, "WRONG RESULT lib=%s %s/%s/%s M=%ld N=%ld K=%ld rel_err=%g\n", bs[i].name.c_str(),
                   sh.model.c_str(), sh.layer.c_str(), sh.op.c_str(), M, N, K, res[i].max_rel_err);
      std::exit(2);
    }
    // Warm-up.
    double t0 = now_s();
    for (int w = 0; w < 2 || now_s() - t0 < 0.05; ++w) call(bs[i]);
  }

  // Interleaved timing: rounds of equal wall-time slices per library, rotating order.
  const double slice = min_time / 6;
  std::vector<std::vector<double>> ts(nb);
  std::vector<double> total(nb, 0.0);
  auto done = [&] {
    for (size_t i = 0; i < nb; ++i)
      if (ts[i].size() < 5 || total[i] < min_time) return false;
    return true;
  };
  for (size_t round = 0; !done(); ++round) {
    for (size_t j = 0; j < nb; ++j) {
      size_t i = (round + j) % nb;
      double s0 = now_s();
      do {
        double a = now_s();
        call(bs[i]);
        double dt = now_s() - a;
        ts[i].push_back(dt);
        total[i] += dt;
      } while (now_s() - s0 < slice);
    }
  }
  for (size_t i = 0; i < nb; ++i) {
    std::vector<double> v = ts[i];
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    res[i].median_s = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    res[i].min_s = v[0];
    res[i].gflops = 2.0 * M * N * K / res[i].median_s * 1e-9;
    res[i].reps = (int)n;
  }
  return res;
}

const char* env_or(const char* k, const char* d) {
  const char* v = std::getenv(k);
  return v ? v : d;
}

}  // namespace

int main(int argc, char** argv) {
  double min_time = 0.3, max_noise = 0.05, deadline = 600;
  int threads = 2, retries = 6;
  std::string filter, only, json_path, config = "default", libs_arg = "openblas,blis,onednn";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--min-time")
      min_time = std::atof(next());
    else if (a == "--threads")
      threads = std::atoi(next());
    else if (a == "--filter")
      filter = next();
    else if (a == "--only")
      only = "," + std::string(next()) + ",";
    else if (a == "--json")
      json_path = next();
    else if (a == "--config")
      config = next();
    else if (a == "--libs")
      libs_arg = next();
    else if (a == "--max-noise")
      max_noise = std::atof(next());
    else if (a == "--retries")
      retries = std::atoi(next());
    else if (a == "--deadline")
      deadline = std::atof(next());
    else
      die("unknown argument " + a);
  }
  std::vector<std::string> libs;
  {
    std::stringstream ss(libs_arg);
    std::string t;
    while (std::getline(ss, t, ',')) libs.push_back(t);
  }
  omp_set_num_threads(threads);
  const std::vector<Backend> bs = load_backends(libs, threads);
  const char* envs[] = {"OMP_NUM_THREADS",  "OMP_WAIT_POLICY",      "OMP_PROC_BIND",     "OMP_PLACES",
                        "GOMP_SPINCOUNT",   "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                        "BLIS_NUM_THREADS", "BLIS_ARCH_TYPE",       "ONEDNN_MAX_CPU_ISA"};
  std::printf("# config=%s threads=%d min_time=%.2fs env:", config.c_str(), threads, min_time);
  for (const char* e : envs) std::printf(" %s=%s", e, env_or(e, "-"));
  std::printf("\n");
  for (const Backend& b : bs) std::printf("# %-8s %s\n", b.name.c_str(), b.info.c_str());
  std::printf("%-13s %-12s %-3s %6s %6s %6s", "model", "layer", "op", "M", "N", "K");
  for (const Backend& b : bs) std::printf(" %10s", (b.name + " GF/s").c_str());
  std::printf("   (other_load = CPU used by other processes/steal during the measurement)\n");
  std::fflush(stdout);

  struct Row {
    Shape sh;
    std::vector<LibResult> r;
    double noise;
    int tries;
  };
  std::vector<Row> rows;
  for (const Shape& sh : make_shapes()) {
    std::string key = sh.model + "/" + sh.layer + "/" + sh.op;
    if (!filter.empty() && key.find(filter) == std::string::npos) continue;
    if (!only.empty() && only.find("," + key + ",") == std::string::npos) continue;
    rows.push_back({sh, {}, 1e9, 0});
  }
  // Shapes are measured from a queue, each only once the machine is quiet (other load
  // <= max_noise over 0.6 s). A shape whose measurement still saw other load > max_noise
  // goes to the back of the queue (at most `retries` re-measurements; the quietest is kept).
  // When the machine is still busy at `deadline` s the remaining shapes are left
  // unmeasured (reported as such; run again later).
  std::mt19937 rng(12345);
  std::deque<size_t> queue;
  for (size_t i = 0; i < rows.size(); ++i) queue.push_back(i);
  const double t_end = now_s() + deadline;
  while (!queue.empty()) {
    const size_t i = queue.front();
    Row& row = rows[i];
    const Shape& sh = row.sh;
    if (deadline >= 0 && !wait_quiet(max_noise, t_end)) {
      std::printf("# deadline (%.0f s) reached on a busy machine; %zu shape(s) left\n", deadline, queue.size());
      break;
    }
    queue.pop_front();
    CpuSnap a = cpu_snap();
    std::vector<LibResult> r = run_shape(sh, bs, min_time, rng);
    double noise = others_frac(a, cpu_snap());
    ++row.tries;
    if (noise < row.noise) {
      row.r = r;
      row.noise = noise;
    }
    bool again = noise > max_noise && row.tries <= retries && deadline >= 0;
    if (again) queue.push_back(i);
    std::printf("%-13s %-12s %-3s %6ld %6ld %6ld", sh.model.c_str(), sh.layer.c_str(), sh.op.c_str(), sh.M, sh.N, sh.K);
    for (const LibResult& x : r) std::printf(" %10.1f", x.gflops);
    std::printf("   other_load=%4.1f%%%s\n", 100 * noise,
                noise <= max_noise ? ""
                : again            ? "  (busy machine: will re-measure)"
                                   : "  (BUSY MACHINE: result unreliable)");
    std::fflush(stdout);
  }
  {
    std::vector<Row> measured;
    for (const Row& row : rows)
      if (row.tries > 0)
        measured.push_back(row);
      else
        std::printf("# NOT MEASURED (machine busy): %s/%s/%s\n", row.sh.model.c_str(), row.sh.layer.c_str(),
                    row.sh.op.c_str());
    rows.swap(measured);
  }

  std::printf("# final (quietest measurement of each shape), GFLOP/s\n");
  for (const Row& row : rows) {
    std::printf("# %-13s %-12s %-3s %6ld %6ld %6ld", row.sh.model.c_str(), row.sh.layer.c_str(), row.sh.op.c_str(),
                row.sh.M, row.sh.N, row.sh.K);
    for (const LibResult& x : row.r) std::printf(" %10.1f", x.gflops);
    std::printf("   other_load=%4.1f%% tries=%d\n", 100 * row.noise, row.tries);
  }

  // Per-model training-step summary: all linear-layer GEMMs of one fwd+bwd step.
  std::vector<std::string> models;
  for (const Row& row : rows)
    if (row.sh.count > 0 && std::find(models.begin(), models.end(), row.sh.model) == models.end())
      models.push_back(row.sh.model);
  if (!models.empty()) std::printf("# per-step GEMM time, ms (block GEMMs x n_layer + lm_head, NN+NT+TN)\n");
  for (const std::string& m : models) {
    std::printf("# step %-13s", m.c_str());
    for (size_t i = 0; i < bs.size(); ++i) {
      double t = 0;
      for (const Row& row : rows)
        if (row.sh.model == m) t += row.sh.count * row.r[i].median_s;
      std::printf("  %s=%.2f", bs[i].name.c_str(), t * 1e3);
    }
    std::printf("\n");
  }

  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) die("cannot write " + json_path);
    char date[64];
    std::time_t tt = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
    std::fprintf(f,
                 "{\n \"config\": \"%s\",\n \"date\": \"%s\",\n \"threads\": %d,\n"
                 " \"min_time_s\": %.3f,\n \"env\": {",
                 config.c_str(), date, threads, min_time);
    bool first = true;
    for (const char* e : envs)
      if (const char* v = std::getenv(e)) {
        std::fprintf(f, "%s\"%s\": \"%s\"", first ? "" : ", ", e, v);
        first = false;
      }
    std::fprintf(f, "},\n \"libraries\": [");
    for (size_t i = 0; i < bs.size(); ++i)
      std::fprintf(f, "%s\n  {\"name\": \"%s\", \"info\": \"%s\"}", i ? "," : "", bs[i].name.c_str(),
                   bs[i].info.c_str());
    std::fprintf(f, "\n ],\n \"results\": [");
    for (size_t k = 0; k < rows.size(); ++k) {
      const Row& row = rows[k];
      std::fprintf(f,
                   "%s\n  {\"model\": \"%s\", \"layer\": \"%s\", \"op\": \"%s\", \"M\": %ld, "
                   "\"N\": %ld, \"K\": %ld, \"count_per_step\": %d, \"other_load\": %.4f, "
                   "\"tries\": %d, \"libs\": {",
                   k ? "," : "", row.sh.model.c_str(), row.sh.layer.c_str(), row.sh.op.c_str(), row.sh.M, row.sh.N,
                   row.sh.K, row.sh.count, row.noise, row.tries);
      for (size_t i = 0; i < bs.size(); ++i) {
        const LibResult& r = row.r[i];
        std::fprintf(f,
                     "%s\n    \"%s\": {\"gflops\": %.2f, \"median_ms\": %.5f, \"min_ms\": %.5f, "
                     "\"reps\": %d, \"max_rel_err\": %.3g}",
                     i ? "," : "", bs[i].name.c_str(), r.gflops, r.median_s * 1e3, r.min_s * 1e3, r.reps,
                     r.max_rel_err);
      }
      std::fprintf(f, "}}");
    }
    std::fprintf(f, "\n ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
