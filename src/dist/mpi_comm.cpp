// The Open MPI implementation of Comm. Sums never go through MPI's reductions (whose algorithm,
// and so whose order of additions, Open MPI picks by message size and rank count): a sum over
// ranks is a reduce-scatter made of MPI_Alltoallv — rank r receives chunk r of every rank's
// buffer — followed by a local sum in rank order, then an MPI_Allgatherv of the summed chunks.
// Only data movement is left to MPI.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "dist/comm.h"

namespace loom::dist {

namespace {

// Elements per rank and round of a reduce-scatter: the receive buffer holds size() of them.
constexpr int64_t kRoundElems = int64_t{1} << 20;

int to_int(int64_t n) {
  LOOM_ASSERT(n >= 0 && n <= INT_MAX, "a collective over more than 2^31 elements");
  return static_cast<int>(n);
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* x, int64_t n) override {
    // Each bucket: reduce-scatter into this rank's chunk of the bucket in place, then gather.
    const int64_t bucket = kRoundElems * size_;
    for (int64_t b = 0; b < n; b += bucket) {
      const int64_t m = std::min(bucket, n - b);
      reduce_scatter_sum(x + b, m, x + b + chunk(m, size_, rank_).begin);
      all_gather(x + b + chunk(m, size_, rank_).begin, m, x + b);
    }
  }

  // Rounds of at most kRoundElems per chunk; `out` may be this rank's chunk of x itself (the
  // round that writes out[o, o + p) has already sent x's elements there).
  void reduce_scatter_sum(const float* x, int64_t n, float* out) override {
    to_int(n);
    const Range mine = chunk(n, size_, rank_);
    const int64_t longest = chunk(n, size_, 0).size();
    const auto s = static_cast<size_t>(size_);
    std::vector<int> scount(s), sdispl(s), rcount(s), rdispl(s);
    recv_.resize(static_cast<size_t>(std::min(longest, kRoundElems) * size_));
    for (int64_t off = 0; off < longest; off += kRoundElems) {
      const auto count = [&](const Range& c) { return to_int(std::clamp<int64_t>(c.size() - off, 0, kRoundElems)); };
      const int64_t p = count(mine);
      for (int j = 0; j < size_; ++j) {
        const Range cj = chunk(n, size_, j);
        scount[static_cast<size_t>(j)] = count(cj);
        sdispl[static_cast<size_t>(j)] = to_int(std::min(cj.begin + off, n));
        rcount[static_cast<size_t>(j)] = static_cast<int>(p);
        rdispl[static_cast<size_t>(j)] = static_cast<int>(j * p);
      }
      MPI_Alltoallv(x, scount.data(), sdispl.data(), MPI_FLOAT, recv_.data(), rcount.data(), rdispl.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
      float* o = out + off;
      std::memcpy(o, recv_.data(), static_cast<size_t>(p) * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        const float* in = recv_.data() + r * p;
        for (int64_t e = 0; e < p; ++e) o[e] += in[e];
      }
    }
  }

  void all_gather(const float* mine, int64_t n, float* out) override {
    const auto s = static_cast<size_t>(size_);
    std::vector<int> count(s), displ(s);
    for (int j = 0; j < size_; ++j) {
      const Range cj = chunk(n, size_, j);
      count[static_cast<size_t>(j)] = to_int(cj.size());
      displ[static_cast<size_t>(j)] = to_int(cj.begin);
    }
    const Range me = chunk(n, size_, rank_);
    const bool in_place = mine == out + me.begin;
    MPI_Allgatherv(in_place ? MPI_IN_PLACE : mine, count[static_cast<size_t>(rank_)], MPI_FLOAT, out, count.data(),
                   displ.data(), MPI_FLOAT, MPI_COMM_WORLD);
  }

  void all_gather_bytes(const void* mine, size_t bytes, void* out) override {
    MPI_Allgather(mine, to_int(static_cast<int64_t>(bytes)), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE,
                  MPI_COMM_WORLD);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    MPI_Bcast(data, to_int(static_cast<int64_t>(bytes)), MPI_BYTE, root, MPI_COMM_WORLD);
  }

  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

 protected:
  void abort_all(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  int rank_ = 0, size_ = 1;
  std::vector<float> recv_;
};

std::unique_ptr<MpiComm> g_world;

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK"); }

}  // namespace

Comm& world() { return g_world ? static_cast<Comm&>(*g_world) : single_process(); }

Launch::Launch(int* argc, char*** argv) {
  if (!launched_by_mpirun() || g_world) return;
  // Serialized: a rank may call MPI from more than one thread, never from two at once.
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  g_world = std::make_unique<MpiComm>();
}

Launch::~Launch() {
  if (!g_world) return;
  g_world.reset();
  MPI_Finalize();
}

}  // namespace loom::dist
