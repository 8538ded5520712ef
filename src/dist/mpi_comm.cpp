// The Open MPI implementation of Comm. Sums never go through MPI's reductions (whose algorithm,
// and so whose order of additions, Open MPI picks by message size and rank count): a sum over
// ranks is a reduce-scatter made of MPI_Alltoallv — rank r receives chunk r of every rank's
// buffer — followed by a local sum in rank order, then an MPI_Allgatherv of the summed chunks.
// Only data movement is left to MPI. Every collective is non-blocking (MPI_I*) and polled with
// MPI_Test against a deadline (Watchdog), so no rank waits forever for one that is gone.
#define OMPI_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
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

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// What a rank waits in: the kind of collective and its number in the order this rank started
// them (every rank starts the same collectives in the same order, so ranks that wait for each
// other for long wait in the same one).
enum Kind : int64_t { kNoCollective, kSum, kGather, kExchange, kBroadcast, kBarrier };
const char* const kKindNames[] = {
    "no collective", "a sum over ranks", "a gather of every rank's part", "an exchange between ranks",
    "a broadcast",   "a barrier"};
struct Op {
  int64_t kind = kNoCollective, seq = -1;
  std::string name() const {
    return kind == kNoCollective ? kKindNames[0] : fmt::format("{} (collective #{})", kKindNames[kind], seq);
  }
};

// Whether `req` has completed, without taking its completion (MPI_Test would free it, and the
// caller's own poll must still see it). MPI_REQUEST_NULL: done.
bool completed(MPI_Request req) {
  int flag = 0;
  MPI_Request_get_status(req, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

// The deadline of every wait in a collective (Comm::set_timeout) and the questions that find the
// rank waited for, on a communicator of their own: a rank past its deadline sends kAsk, with the
// question's number, to every other; each answers kAnswer with that number and what it is doing
// (kWaiting in a collective, and which one, or kBusy in keep_alive) the next time it polls.
//
// A rank's answer is what it does now, not what it last polled: one whose own collective has
// completed while it was asking or answering (so it has not yet seen the completion) answers
// kBusy, on its way to the next. Otherwise a root whose broadcasts complete as soon as they are
// sent could run ahead into a later collective while a rank that asked it something is still
// in its own ask(), and each would name a different collective, as a deadlock does.
class Watchdog {
 public:
  Watchdog(int rank, int size) : rank_(rank), size_(size) {
    MPI_Comm_dup(MPI_COMM_WORLD, &health_);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::array<char, kHostBytes> mine{};
    std::memcpy(mine.data(), name, static_cast<size_t>(std::clamp(len, 0, kHostBytes - 1)));
    std::vector<char> all(static_cast<size_t>(size) * kHostBytes);
    MPI_Allgather(mine.data(), kHostBytes, MPI_CHAR, all.data(), kHostBytes, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < size; ++r) hosts_.emplace_back(all.data() + static_cast<size_t>(r) * kHostBytes);
  }
  ~Watchdog() {
    for (Sent& s : sent_) MPI_Request_free(&s.req);  // messages to a rank that is gone: never taken
    MPI_Comm_free(&health_);
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_timeout(double s) { timeout_ = s; }
  // One poll of a wait in `op`, whose request now in flight is `req`, that began at `since`:
  // answers questions; past the deadline, asks every rank and either goes on waiting (all alive,
  // or `req` completed meanwhile: `since` restarts) or ends the job: some rank did not answer, or
  // every rank waits and they wait in different collectives (which can never complete: a bug of
  // loom's, but a job that ends naming it beats one that waits forever).
  void check(Clock::time_point& since, const Op& op, MPI_Request req) {
    const Clock::time_point now = Clock::now();
    if (now - last_serve_ > std::chrono::milliseconds(1)) serve(kWaiting, op, req);
    if (seconds(now - since) < timeout_) return;
    const std::vector<Answer> answers = ask(op, req);
    if (completed(req)) {  // not waiting any more: the answers describe a wait that is over
      since = Clock::now();
      return;
    }
    std::string silent;
    for (int r = 0; r < size_; ++r)
      if (answers[static_cast<size_t>(r)].state == 0)
        silent += std::string(silent.empty() ? "" : ", ") + "rank " + std::to_string(r) + " (host " +
                  hosts_[static_cast<size_t>(r)] + ")";
    if (!silent.empty())
      end_job(
          fmt::format("rank {} (host {}) waited {:.0f} s in {} for {}, which did not answer within {:.0f} s more "
                      "(stopped, dead, unreachable, or hung outside loom's collectives): ending the job "
                      "(train.collective_timeout = {:g} s); the checkpoints already saved are intact",
                      rank_, host(rank_), seconds(now - since), op.name(), silent, grace(), timeout_));
    // A rank that answered between two collectives of its own has moved on by the second asking.
    if (in_different_collectives(answers) && pause_and_ask(op, req) == answers && !completed(req)) {
      std::string where;
      for (int r = 0; r < size_; ++r)
        where += fmt::format("\n  rank {} (host {}) waits in {}", r, host(r),
                             Op{answers[static_cast<size_t>(r)].kind, answers[static_cast<size_t>(r)].seq}.name());
      end_job(
          fmt::format("the ranks wait in different collectives, which can never complete (a bug in loom: please "
                      "report it with this message):{}\nending the job after {:.0f} s "
                      "(train.collective_timeout = {:g} s); the checkpoints already saved are intact",
                      where, seconds(now - since), timeout_));
    }
    since = Clock::now();
  }
  void keep_alive() {
    if (Clock::now() - last_serve_ > std::chrono::milliseconds(1)) serve(kBusy, Op{}, MPI_REQUEST_NULL);
  }

 private:
  static constexpr int kHostBytes = 64;
  static constexpr int kAsk = 1, kAnswer = 2;    // tags
  static constexpr int kWaiting = 1, kBusy = 2;  // answers (0: none)
  struct Answer {
    int64_t state = 0, kind = kNoCollective, seq = -1;
    bool operator==(const Answer&) const = default;
  };
  static constexpr int kAnswerWords = 4;  // the question's number, then an Answer
  struct Sent {  // a question or an answer in flight: its buffer lives until MPI is done with it
    MPI_Request req = MPI_REQUEST_NULL;
    int64_t words[kAnswerWords] = {};
  };
  double grace() const { return std::min(timeout_, 60.0); }
  const std::string& host(int r) const { return hosts_[static_cast<size_t>(r)]; }

  // Prints `why` and ends every rank of the job with exit status 1.
  [[noreturn]] void end_job(const std::string& why) {
    flush_before_abort();
    std::fprintf(stderr, "\nloom: %s\n", why.c_str());
    std::fflush(stderr);
    alarm(30);  // should MPI_Abort itself wait for the lost rank, SIGALRM still ends this one
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
  // Every rank waits (none is busy: a save of one rank moves on by itself), not all in one collective.
  bool in_different_collectives(const std::vector<Answer>& answers) const {
    const Answer& mine = answers[static_cast<size_t>(rank_)];
    for (const Answer& a : answers)
      if (a.state != kWaiting) return false;
    for (const Answer& a : answers)
      if (a.kind != mine.kind || a.seq != mine.seq) return true;
    return false;
  }
  // Sends words [kAnswerWords] to rank `to` with `tag`, without waiting for it to be taken.
  void post(const std::array<int64_t, kAnswerWords>& words, int to, int tag) {
    while (!sent_.empty()) {  // the oldest are taken first
      int done = 0;
      MPI_Test(&sent_.front().req, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sent_.pop_front();
    }
    Sent& s = sent_.emplace_back();
    std::copy(words.begin(), words.end(), s.words);
    MPI_Isend(s.words, kAnswerWords, MPI_INT64_T, to, tag, health_, &s.req);
  }
  // Answers every question received so far: `state`, in `op` whose request in flight is `req`
  // (kBusy once it has completed: see the class comment).
  void serve(int state, const Op& op, MPI_Request req) {
    last_serve_ = Clock::now();
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kAsk, health_, &flag, &st);
      if (!flag) return;
      std::array<int64_t, kAnswerWords> question{};
      MPI_Recv(question.data(), kAnswerWords, MPI_INT64_T, st.MPI_SOURCE, kAsk, health_, MPI_STATUS_IGNORE);
      const int64_t now = state == kWaiting && completed(req) ? kBusy : state;
      post({question[0], now, op.kind, op.seq}, st.MPI_SOURCE, kAnswer);
    }
  }
  // serve() for a moment (a rank between two collectives reaches the next), then ask().
  std::vector<Answer> pause_and_ask(const Op& op, MPI_Request req) {
    const Clock::time_point end = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < end) {
      serve(kWaiting, op, req);
      usleep(1000);
    }
    return ask(op, req);
  }
  // Every rank's answer to a new question (this one's: waiting in `op`), state 0 where none came
  // within grace(). Answers to an earlier question (one that came after its grace) are dropped.
  std::vector<Answer> ask(const Op& op, MPI_Request req) {
    const int64_t question = ++questions_;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) post({question, 0, 0, 0}, r, kAsk);  // a stopped rank never takes it
    std::vector<Answer> answers(static_cast<size_t>(size_));
    answers[static_cast<size_t>(rank_)] = {.state = kWaiting, .kind = op.kind, .seq = op.seq};
    int missing = size_ - 1;
    const Clock::time_point end =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace()));
    while (missing > 0 && Clock::now() < end) {
      serve(kWaiting, op, req);  // the others ask this rank too
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kAnswer, health_, &flag, &st);
      if (!flag) {
        usleep(1000);
        continue;
      }
      std::array<int64_t, kAnswerWords> words{};
      MPI_Recv(words.data(), kAnswerWords, MPI_INT64_T, st.MPI_SOURCE, kAnswer, health_, MPI_STATUS_IGNORE);
      if (words[0] != question) continue;
      Answer& slot = answers[static_cast<size_t>(st.MPI_SOURCE)];
      missing -= slot.state == 0;
      slot = {.state = words[1], .kind = words[2], .seq = words[3]};
    }
    return answers;
  }
  int rank_, size_;
  MPI_Comm health_ = MPI_COMM_NULL;
  std::vector<std::string> hosts_;
  double timeout_ = Comm::kDefaultTimeoutSeconds;
  Clock::time_point last_serve_{};
  int64_t questions_ = 0;  // asked so far
  std::deque<Sent> sent_;
};

// Polls `req` to completion under the watchdog's deadline.
void wait(Watchdog& w, MPI_Request& req, const Op& op) {
  Clock::time_point since = Clock::now();
  for (;;) {
    int flag = 0;
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (flag) return;
    w.check(since, op, req);
  }
}

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

// An all-gather of every rank's chunk of n elements into out [n]: one MPI_Iallgatherv on `comm`,
// polled under the deadline as a sum in flight is.
class PendingGather final : public Comm::Pending {
 public:
  PendingGather(Watchdog& watch, Op op, int size, int rank, MPI_Comm comm, const float* mine, int64_t n, float* out)
      : watch_(watch), op_(op), chunks_(n, size) {
    const bool in_place = mine == out + chunk(n, size, rank).begin;
    MPI_Iallgatherv(in_place ? MPI_IN_PLACE : mine, chunks_.count[static_cast<size_t>(rank)], MPI_FLOAT, out,
                    chunks_.count.data(), chunks_.displ.data(), MPI_FLOAT, comm, &req_);
  }
  bool test() override {
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);  // done at once for MPI_REQUEST_NULL (completed before)
    if (!flag) watch_.check(since_, op_, req_);
    return flag != 0;
  }

 private:
  Watchdog& watch_;
  Op op_;
  Clock::time_point since_ = Clock::now();
  Chunks chunks_;  // MPI reads the counts until the request completes
  MPI_Request req_ = MPI_REQUEST_NULL;
};

// A sum over ranks of x [n] as a state machine on communicator `lane`: the rounds of a
// reduce-scatter in place (MPI_Ialltoallv; then the rank-order sum of the round into this rank's
// chunk of x: those elements were sent already), then, for an all-reduce, one in-place
// MPI_Iallgatherv of the chunks. No other operation uses `lane` while this one is in flight: MPI
// matches collectives in the order each rank starts them, and two sums in flight on one
// communicator would start their later steps in an order that depends on timing.
class PendingSum final : public Comm::Pending {
 public:
  PendingSum(Watchdog& watch, Op op, int size, int rank, MPI_Comm lane, float* x, int64_t n, float* scratch,
             bool gather, int* in_flight = nullptr)
      : watch_(watch),
        op_(op),
        size_(size),
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
      if (!flag) {
        watch_.check(since_, op_, req_);
        return false;
      }
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
  Watchdog& watch_;
  Op op_;
  Clock::time_point since_ = Clock::now();
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
    watch_ = std::make_unique<Watchdog>(rank_, size_);
    for (MPI_Comm& lane : lanes_) MPI_Comm_dup(MPI_COMM_WORLD, &lane);
    MPI_Comm_dup(MPI_COMM_WORLD, &gathers_);
    MPI_Comm host = MPI_COMM_NULL;  // the ranks that can share memory with this one
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &on_host_);
    MPI_Comm_free(&host);
  }
  ~MpiComm() override {
    for (MPI_Comm& lane : lanes_) MPI_Comm_free(&lane);
    MPI_Comm_free(&gathers_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int ranks_on_this_host() const override { return on_host_; }

  void all_reduce_sum(float* x, int64_t n) override {
    to_int(n);
    scratch_.resize(static_cast<size_t>(reduce_scratch_elems(n, size_)));
    PendingSum p(*watch_, next(kSum), size_, rank_, MPI_COMM_WORLD, x, n, scratch_.data(), /*gather=*/true);
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
    const Op op = next(kSum);
    for (int64_t k = 0; k < rounds; ++k) {
      const Round round(n, size_, rank_, k * kRoundElems);
      scratch_.resize(static_cast<size_t>(round.p * size_));
      MPI_Request req = MPI_REQUEST_NULL;
      MPI_Ialltoallv(x, round.scount.data(), round.sdispl.data(), MPI_FLOAT, scratch_.data(), round.rcount.data(),
                     round.rdispl.data(), MPI_FLOAT, MPI_COMM_WORLD, &req);
      wait(*watch_, req, op);
      round.sum(scratch_.data(), size_, out + k * kRoundElems);
    }
  }

  void all_gather(const float* mine, int64_t n, float* out) override {
    PendingGather p(*watch_, next(kGather), size_, rank_, MPI_COMM_WORLD, mine, n, out);
    while (!p.test()) {
    }
  }
  std::unique_ptr<Pending> start_all_gather(const float* mine, int64_t n, float* out) override {
    return std::make_unique<PendingGather>(*watch_, next(kGather), size_, rank_, gathers_, mine, n, out);
  }

  void all_gather_bytes(const void* mine, size_t bytes, void* out) override {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Iallgather(mine, to_int(static_cast<int64_t>(bytes)), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE,
                   MPI_COMM_WORLD, &req);
    wait(*watch_, req, next(kExchange));
  }

  void gather_bytes(const void* mine, void* out, std::span<const int64_t> counts, std::span<const int64_t> displs,
                    int root) override {
    std::vector<int> count, displ;
    for (int r = 0; r < size_; ++r) {
      count.push_back(to_int(counts[static_cast<size_t>(r)]));
      displ.push_back(to_int(displs[static_cast<size_t>(r)]));
    }
    const bool in_place =
        rank_ == root && mine == static_cast<const unsigned char*>(out) + displs[static_cast<size_t>(rank_)];
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Igatherv(in_place ? MPI_IN_PLACE : mine, count[static_cast<size_t>(rank_)], MPI_BYTE, out, count.data(),
                 displ.data(), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    wait(*watch_, req, next(kGather));
  }

  void broadcast(void* data, size_t bytes, int root) override {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Ibcast(data, to_int(static_cast<int64_t>(bytes)), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    wait(*watch_, req, next(kBroadcast));
  }

  void barrier() override {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    wait(*watch_, req, next(kBarrier));
  }

  void set_timeout(double seconds) override { watch_->set_timeout(seconds); }
  void keep_alive() override { watch_->keep_alive(); }

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
    return std::make_unique<PendingSum>(*watch_, next(kSum), size_, rank_, lane, x, n, scratch, gather, &in_flight_);
  }
  // The next collective this rank starts, of kind `kind`.
  Op next(Kind kind) { return Op{.kind = kind, .seq = seq_++}; }
  int rank_ = 0, size_ = 1, on_host_ = 1;
  int64_t seq_ = 0;  // collectives started
  std::unique_ptr<Watchdog> watch_;
  std::vector<float> scratch_;
  std::array<MPI_Comm, kMaxPending> lanes_;
  MPI_Comm gathers_ = MPI_COMM_NULL;  // the gathers in flight (start_all_gather)
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
