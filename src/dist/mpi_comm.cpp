// The Open MPI implementation of Comm. Sums never go through MPI's reductions (whose algorithm,
// and so whose order of additions, Open MPI picks by message size and rank count): a sum over
// ranks is a reduce-scatter made of MPI_Alltoallv — rank r receives chunk r of every rank's
// buffer — followed by a local sum in rank order, then an MPI_Allgatherv of the summed chunks.
// Only data movement is left to MPI.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "dist/comm.h"

namespace loom::dist {

namespace {

int to_int(int64_t n) {
  LOOM_ASSERT(n >= 0 && n <= INT_MAX, "a collective over more than 2^31 elements");
  return static_cast<int>(n);
}

// One round of a reduce-scatter of x [n]: elements [off, off + kRoundElems) of every rank's
// chunk go to that rank (MPI_Alltoallv), and this rank receives those of its own chunk from every
// rank, rank r's at recv[r·p, (r+1)·p).
struct Round {
  std::vector<int> scount, sdispl, rcount, rdispl;
  int64_t p = 0;  // elements of this rank's chunk in the round
  Round() = default;
  Round(int64_t n, int size, int rank, int64_t off)
      : scount(static_cast<size_t>(size)),
        sdispl(static_cast<size_t>(size)),
        rcount(static_cast<size_t>(size)),
        rdispl(static_cast<size_t>(size)) {
    const auto count = [&](const Range& c) { return std::clamp<int64_t>(c.size() - off, 0, kRoundElems); };
    p = count(chunk(n, size, rank));
    for (int j = 0; j < size; ++j) {
      const Range cj = chunk(n, size, j);
      const auto u = static_cast<size_t>(j);
      scount[u] = to_int(count(cj));
      sdispl[u] = to_int(std::min(cj.begin + off, n));
      rcount[u] = static_cast<int>(p);
      rdispl[u] = to_int(j * p);
    }
  }
  static int64_t count(int64_t n, int size) {  // rounds of a reduce-scatter of n elements
    const int64_t longest = chunk(n, size, 0).size();
    return (longest + kRoundElems - 1) / kRoundElems;
  }
  // out[0, p) = recv's p-element blocks summed in rank order.
  void sum(const float* recv, int size, float* out) const {
    if (p == 0) return;  // an empty chunk: recv and out may be null, which memcpy may not be given
    std::memcpy(out, recv, static_cast<size_t>(p) * sizeof(float));
    for (int r = 1; r < size; ++r) {
      const float* in = recv + r * p;
      for (int64_t e = 0; e < p; ++e) out[e] += in[e];
    }
  }
};

// Counts and displacements of every rank's chunk of n elements (MPI_Allgatherv).
struct Chunks {
  std::vector<int> count, displ;
  Chunks() = default;
  Chunks(int64_t n, int size) : count(static_cast<size_t>(size)), displ(static_cast<size_t>(size)) {
    for (int j = 0; j < size; ++j) {
      const Range cj = chunk(n, size, j);
      count[static_cast<size_t>(j)] = to_int(cj.size());
      displ[static_cast<size_t>(j)] = to_int(cj.begin);
    }
  }
};

// A sum over ranks of x [n] as a state machine on communicator `lane`: the rounds of a
// reduce-scatter in place (MPI_Ialltoallv; then the rank-order sum of the round into this rank's
// chunk of x: those elements were sent already), then, for an all-reduce, one in-place
// MPI_Iallgatherv of the chunks. No other operation uses `lane` while this one is in flight: MPI
// matches collectives in the order each rank starts them, and two sums in flight on one
// communicator would start their later steps in an order that depends on timing.
class PendingSum final : public Comm::Pending {
 public:
  PendingSum(int size, int rank, MPI_Comm lane, float* x, int64_t n, float* scratch, bool gather,
             int* in_flight = nullptr)
      : size_(size),
        rank_(rank),
        lane_(lane),
        x_(x),
        n_(n),
        scratch_(scratch),
        gather_(gather),
        rounds_(Round::count(n, size)),
        in_flight_(in_flight) {
    next();
  }
  ~PendingSum() override { release(); }

  bool test() override {
    while (req_ != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);  // sets req_ to MPI_REQUEST_NULL when done
      if (!flag) return false;
      if (k_ <= rounds_) round_.sum(scratch_, size_, x_ + chunk(n_, size_, rank_).begin + (k_ - 1) * kRoundElems);
      next();
    }
    release();
    return true;
  }

 private:
  // Starts the next step: round k_, the gather after the last round, or nothing (done).
  void next() {
    if (k_ < rounds_) {
      round_ = Round(n_, size_, rank_, k_ * kRoundElems);
      MPI_Ialltoallv(x_, round_.scount.data(), round_.sdispl.data(), MPI_FLOAT, scratch_, round_.rcount.data(),
                     round_.rdispl.data(), MPI_FLOAT, lane_, &req_);
      ++k_;
    } else if (gather_ && k_ == rounds_ && n_ > 0) {
      chunks_ = Chunks(n_, size_);
      MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x_, chunks_.count.data(), chunks_.displ.data(), MPI_FLOAT,
                      lane_, &req_);
      ++k_;
    }
  }
  void release() {  // no longer counted in flight
    if (in_flight_) --*in_flight_;
    in_flight_ = nullptr;
  }
  int size_, rank_;
  MPI_Comm lane_;
  float* x_;
  int64_t n_;
  float* scratch_;
  bool gather_;
  int64_t rounds_, k_ = 0;  // steps started: rounds 1..rounds_, then the gather
  MPI_Request req_ = MPI_REQUEST_NULL;
  Round round_;  // the step in flight (MPI reads its counts until the request completes)
  Chunks chunks_;
  int* in_flight_;
};

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    for (MPI_Comm& lane : lanes_) MPI_Comm_dup(MPI_COMM_WORLD, &lane);
    MPI_Comm host = MPI_COMM_NULL;  // the ranks that can share memory with this one
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &on_host_);
    MPI_Comm_free(&host);
  }
  ~MpiComm() override {
    for (MPI_Comm& lane : lanes_) MPI_Comm_free(&lane);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int ranks_on_this_host() const override { return on_host_; }

  void all_reduce_sum(float* x, int64_t n) override {
    to_int(n);
    scratch_.resize(static_cast<size_t>(reduce_scratch_elems(n, size_)));
    PendingSum p(size_, rank_, MPI_COMM_WORLD, x, n, scratch_.data(), /*gather=*/true);
    while (!p.test()) {
    }
  }
  std::unique_ptr<Pending> start_all_reduce_sum(float* x, int64_t n, float* scratch) override {
    return start(x, n, scratch, /*gather=*/true);
  }
  std::unique_ptr<Pending> start_reduce_scatter_sum(float* x, int64_t n, float* scratch) override {
    return start(x, n, scratch, /*gather=*/false);
  }

  void reduce_scatter_sum(const float* x, int64_t n, float* out) override {
    to_int(n);
    const int64_t rounds = Round::count(n, size_);
    for (int64_t k = 0; k < rounds; ++k) {
      const Round round(n, size_, rank_, k * kRoundElems);
      scratch_.resize(static_cast<size_t>(round.p * size_));
      MPI_Alltoallv(x, round.scount.data(), round.sdispl.data(), MPI_FLOAT, scratch_.data(), round.rcount.data(),
                    round.rdispl.data(), MPI_FLOAT, MPI_COMM_WORLD);
      round.sum(scratch_.data(), size_, out + k * kRoundElems);
    }
  }

  void all_gather(const float* mine, int64_t n, float* out) override {
    const Chunks c(n, size_);
    const bool in_place = mine == out + chunk(n, size_, rank_).begin;
    MPI_Allgatherv(in_place ? MPI_IN_PLACE : mine, c.count[static_cast<size_t>(rank_)], MPI_FLOAT, out, c.count.data(),
                   c.displ.data(), MPI_FLOAT, MPI_COMM_WORLD);
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
  // The k-th sum started takes lane k mod kMaxPending: the same on every rank, and free, since at
  // most kMaxPending are in flight.
  std::unique_ptr<Pending> start(float* x, int64_t n, float* scratch, bool gather) {
    to_int(n);
    LOOM_ASSERT(in_flight_ < kMaxPending, "more sums in flight than Comm::kMaxPending");
    ++in_flight_;
    const MPI_Comm lane = lanes_[static_cast<size_t>(started_++ % kMaxPending)];
    return std::make_unique<PendingSum>(size_, rank_, lane, x, n, scratch, gather, &in_flight_);
  }
  int rank_ = 0, size_ = 1, on_host_ = 1;
  std::vector<float> scratch_;
  std::array<MPI_Comm, kMaxPending> lanes_;
  int64_t started_ = 0;
  int in_flight_ = 0;
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
