// Collectives between the ranks of one job (docs/ARCHITECTURE.md, "More than one process").
//
// One small interface so that a backend can put another transport behind the same calls (NCCL
// beside a CUDA backend). Two implementations: a single process (rank 0 of 1: no MPI call at
// all, so a plain `loom train` needs no launcher) and Open MPI (mpi_comm.cpp) when the process
// was started by mpirun.
//
// Floating-point sums have a fixed order whatever the transport or MPI's choice of algorithm:
// element i of a sum over ranks is ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{N-1}[i], each add
// rounded to float32. So N ranks are bit-identical run to run, and the result equals a serial
// loop over the ranks' buffers in rank order. Sums never depend on how a buffer is cut into
// messages (buckets, chunks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::dist {

// Elements [begin, end) of rank r's chunk when n elements are split over `size` ranks: chunks
// in rank order, the first n % size of them one element longer.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
Range chunk(int64_t n, int size, int r);

// A sum over ranks receives every rank's part of its own chunk in rounds of at most this many
// elements per rank; the receive buffer (the scratch of a sum in flight) holds one round:
// reduce_scratch_elems(n, ranks) elements for a sum of n elements.
inline constexpr int64_t kRoundElems = int64_t{1} << 20;
int64_t reduce_scratch_elems(int64_t n, int ranks);

// A float32 buffer of n elements (e.g. one gradient).
struct FloatSpan {
  float* data = nullptr;
  int64_t n = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // How many ranks of the job (this one included) run on this rank's machine and share its memory.
  virtual int ranks_on_this_host() const = 0;

  // x [n] on every rank becomes the sum over ranks (rank order, above) on every rank.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  // A sum over ranks in flight (start_all_reduce_sum). It has no thread of its own: it advances
  // inside test(), which the caller calls often (between kernels) until it returns true; until
  // then its x and scratch belong to it.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual bool test() = 0;  // advances without blocking; true once x holds the sum
  };
  // Starts all_reduce_sum(x, n) — the same bits — and returns without waiting. Every rank starts
  // the same sums in the same order, with at most kMaxPending in flight at once (each takes one
  // of that many lanes, so that the steps of sums in flight together never meet in one lane in
  // different orders on different ranks). `scratch` holds reduce_scratch_elems(n, size()) elements.
  static constexpr int kMaxPending = 2;
  virtual std::unique_ptr<Pending> start_all_reduce_sum(float* x, int64_t n, float* scratch) = 0;
  // Starts the reduce-scatter half of it: once done, this rank's chunk(n, size(), rank()) of x
  // holds the sum over ranks of that chunk (the rest of x is left as it was). Same rules.
  virtual std::unique_ptr<Pending> start_reduce_scatter_sum(float* x, int64_t n, float* scratch) = 0;
  // The sum above divided by size(): the correctly rounded mean of the rank-order sum.
  void all_reduce_mean(float* x, int64_t n);
  // x [n] on every rank; out [chunk(n, size(), rank()).size()] = the sum over ranks of this
  // rank's chunk of x.
  virtual void reduce_scatter_sum(const float* x, int64_t n, float* out) = 0;
  // mine [chunk(n, size(), rank()).size()] from every rank; out [n] = the chunks in rank order.
  virtual void all_gather(const float* mine, int64_t n, float* out) = 0;
  // Starts all_gather(mine, n, out) — the same bits — and returns without waiting (a Pending, as
  // a sum in flight; until it completes, mine and out belong to it). Every rank starts the same
  // gathers in the same order; any number may be in flight, beside sums and blocking collectives,
  // which they never meet: the gathers in flight share a communicator of their own, where each is
  // one MPI step, matched in the order the ranks started them.
  virtual std::unique_ptr<Pending> start_all_gather(const float* mine, int64_t n, float* out) = 0;
  // mine [bytes] from every rank; out [size() × bytes] = them in rank order.
  virtual void all_gather_bytes(const void* mine, size_t bytes, void* out) = 0;
  // Rank r's counts[r] bytes at `mine` land at out + displs[r] on rank `root` (out is not used on
  // the other ranks; on `root`, mine may be out + displs[root]: in place). Every rank passes the
  // same counts and displs, one per rank.
  virtual void gather_bytes(const void* mine, void* out, std::span<const int64_t> counts,
                            std::span<const int64_t> displs, int root) = 0;
  // data [bytes] of rank `root` copied to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Deadlines. A rank that has waited `seconds` in a collective (any of the above, a sum in flight
  // included) asks every other rank whether it is alive and gives them min(seconds, 60 s) to answer;
  // a rank answers while it waits in a collective or calls keep_alive(). If one answered busy
  // (keep_alive: a save) the wait goes on; otherwise the ranks that did not answer (stopped, dead,
  // unreachable, hung outside loom's collectives) are named with their hosts on stderr and the job
  // ends with exit status 1 (abort). An answer says which collective the rank waits in (its kind
  // and its number in the order the rank started them): when every rank waits but not all in the
  // same one (twice, half a second apart), they can never complete, and the job ends naming each
  // rank's. Nothing of this exists in a single process.
  static constexpr double kDefaultTimeoutSeconds = 300;
  virtual void set_timeout(double seconds) { (void)seconds; }
  // Answers the other ranks' questions "alive?" with "busy": for work of one rank that the others
  // wait for (rank 0 writing a checkpoint), called often (every few MiB written).
  virtual void keep_alive() {}

  // Ends every rank of the job now with exit status `code` (MPI_Abort): what a rank does after
  // an error the others cannot know of, so that none waits forever in a collective.
  [[noreturn]] void abort(int code);

 protected:
  virtual void abort_all(int code) = 0;  // ends the other ranks, and this one if it can
};

// Sums a fixed list of buffers (a model's gradients) over ranks, each exactly as
// Comm::all_reduce_sum would, in buckets: runs of consecutive buffers of at most `bucket_elems`
// elements in all, packed into a staging buffer, or one larger buffer summed in place. Order the
// buffers by when they become final: a bucket can then start as soon as its last buffer is
// written, and be summed while the caller computes the rest (overlap), polling progress(). In a
// single process there is nothing to sum: no buckets.
//
// With `scatter` (sharded optimizer state) only this rank's chunk own(b) of each bucket (the
// buckets' buffers laid end to end) receives the sum; the rest keeps this rank's own values.
// all_gather() then gives every rank every rank's chunks of another list of the same shapes
// (the parameters after each rank updated its chunks). With a `shard` as well (sharded
// gradients) the sum of chunk own(b) is added into the shard at shard_offset(b) instead, and
// the buffers are not written: the shard holds this rank's chunks of every bucket end to end
// (shard_elems() elements) and accumulates over rounds until the caller zeroes it.
struct Bucket {
  size_t first = 0, last = 0;  // buffers [first, last)
  int64_t elems = 0;
  bool packed() const { return last - first > 1; }  // through a staging buffer, not in place
};
// The buckets of BucketReducer over buffers of these sizes (in this order).
std::vector<Bucket> plan_buckets(std::span<const int64_t> sizes, int64_t bucket_elems);

class BucketReducer {
 public:
  BucketReducer(Comm& comm, std::vector<FloatSpan> xs, int64_t bucket_elems, bool scatter = false,
                float* shard = nullptr);
  ~BucketReducer();
  size_t num_buckets() const { return buckets_.size(); }
  // The buffers of bucket b: xs[first, last).
  size_t first(size_t b) const { return buckets_[b].first; }
  size_t last(size_t b) const { return buckets_[b].last; }
  int64_t elems(size_t b) const { return buckets_[b].elems; }
  // This rank's chunk of bucket b (elements of its buffers laid end to end).
  Range own(size_t b) const { return chunk(buckets_[b].elems, comm_.size(), comm_.rank()); }
  // With a shard: where own(b) starts in it, and its length (Σ own(b).size()); without, 0.
  int64_t shard_offset(size_t b) const { return shard_offset_[b]; }
  int64_t shard_elems() const { return shard_offset_.empty() ? 0 : shard_offset_.back(); }
  // The shard's length for the largest share, for buckets of plan_buckets(...) over `ranks` ranks.
  static int64_t shard_elems(std::span<const Bucket> buckets, int ranks);
  // Starts bucket b. Buckets are started in order 0, 1, ... once per round (start(0) begins a
  // round); at most Comm::kMaxPending are in flight, so this may first wait for the oldest.
  void start(size_t b);
  // Advances the buckets in flight without waiting.
  void progress();
  // Waits until every bucket started in this round has completed.
  void finish();
  // start() every bucket, then finish(): no overlap.
  void all_reduce_sum();
  // ys: buffers of the xs' sizes. Every rank's own() chunks of them to every rank (blocking; no
  // bucket may be in flight).
  void all_gather(std::span<const FloatSpan> ys);
  // Bytes of its staging and receive buffers (all it allocates); buffer_bytes(plan_buckets(...),
  // ranks) predicts them.
  int64_t buffer_bytes() const;
  static int64_t buffer_bytes(std::span<const Bucket> buckets, int ranks);
  // Called with the bucket's index as each bucket completes (e.g. to close a profiler span).
  void set_on_complete(std::function<void(size_t)> f) { on_complete_ = std::move(f); }

 private:
  struct Slot {  // the buffers of one bucket in flight
    std::vector<float> staging, scratch;
    std::unique_ptr<Comm::Pending> pending;
    size_t bucket = 0;
  };
  void complete(Slot& s);
  // Copies elements [lo, hi) of bucket k between `bufs` (its buffers) and `staging`.
  void copy(const Bucket& k, std::span<const FloatSpan> bufs, float* staging, Range r, bool to_staging) const;
  Comm& comm_;
  bool scatter_;
  float* shard_;
  std::vector<FloatSpan> xs_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> shard_offset_;  // per bucket, and the shard's length at the end
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;  // slots are used round-robin, so the oldest in flight is the next one
  std::function<void(size_t)> on_complete_;
};

// What a rank runs on its way out of the whole job (Comm::abort, a deadline that passed), before
// it prints why: `f` (e.g. letting a log stream drop what a reader no longer takes, run/run.cpp),
// then a flush of every stdio stream, so that the log's last lines are not lost with the process.
// One per process; nullptr: none.
void set_before_abort(void (*f)());
void flush_before_abort();

// `text` of rank `root`, on every rank (its length first, then its bytes).
std::string broadcast_string(Comm& comm, const std::string& text, int root);

// The single-process communicator: rank 0 of 1, every collective a copy or nothing.
Comm& single_process();

// The process's communicator: Open MPI's world when a Launch started MPI, else single_process().
Comm& world();

// Starts MPI (MPI_Init_thread) when this process was launched by mpirun — Open MPI sets
// OMPI_COMM_WORLD_SIZE, PMIx launchers PMIX_RANK — and finalizes it on destruction. Without
// those variables nothing of MPI runs. One per process, in main().
class Launch {
 public:
  Launch(int* argc, char*** argv);
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
};

// An error every rank raises at the same point of the program with the same facts (a
// configuration mismatch found by comparing all ranks, or a check of a configuration all ranks
// agree on): each rank reports it and the job ends normally, without MPI_Abort.
class AgreedError : public UserError {
 public:
  using UserError::UserError;
  explicit AgreedError(const UserError& e) : UserError(e) {}
};

// What rank `root` alone checked (a run directory, a write to disk), made known to every rank:
// `failed` is its UserError (nullptr on the other ranks, or when it found nothing), which every
// rank then raises as an AgreedError with that message, so that none goes on to wait in a
// collective for `root`. In a single process `failed` itself is thrown. Every rank calls it.
void share_error(Comm& comm, const UserError* failed, int root = 0);

// For a top-level catch handler, before it prints the error: false for an AgreedError on ranks
// other than 0 (rank 0 prints the one message every rank raised), true otherwise.
bool prints_error();

// For a top-level catch handler, after the error is printed: returns `code` in a single process
// and for an AgreedError; otherwise names this rank on stderr and aborts the whole job (the other
// ranks cannot know of the error and would wait for this one forever).
int fail_job(int code);

}  // namespace loom::dist
