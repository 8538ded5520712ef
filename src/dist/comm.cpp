#include "dist/comm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

namespace loom::dist {

Range chunk(int64_t n, int size, int r) {
  const int64_t base = n / size, extra = n % size;
  const int64_t begin = r * base + (r < extra ? r : extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

namespace {
void (*g_before_abort)() = nullptr;
}  // namespace

void set_before_abort(void (*f)()) { g_before_abort = f; }

void flush_before_abort() {
  if (g_before_abort) g_before_abort();
  std::fflush(nullptr);
}

void Comm::abort(int code) {
  flush_before_abort();
  abort_all(code);
  std::_Exit(code);
}

void Comm::all_reduce_mean(float* x, int64_t n) {
  all_reduce_sum(x, n);
  const auto d = static_cast<float>(size());
  for (int64_t i = 0; i < n; ++i) x[i] /= d;
}

int64_t reduce_scratch_elems(int64_t n, int ranks) { return std::min(chunk(n, ranks, 0).size(), kRoundElems) * ranks; }

std::vector<Bucket> plan_buckets(std::span<const int64_t> sizes, int64_t bucket_elems) {
  LOOM_ASSERT(bucket_elems > 0);
  std::vector<Bucket> out;
  for (size_t i = 0; i < sizes.size();) {
    Bucket b{.first = i, .last = i + 1, .elems = sizes[i]};
    while (b.last < sizes.size() && b.elems + sizes[b.last] <= bucket_elems) b.elems += sizes[b.last++];
    out.push_back(b);
    i = b.last;
  }
  return out;
}

namespace {
// Elements of one slot's staging and receive buffers, large enough for any of the buckets.
std::pair<int64_t, int64_t> slot_elems(std::span<const Bucket> buckets, int ranks) {
  int64_t staging = 0, scratch = 0;
  for (const Bucket& b : buckets) {
    if (b.packed()) staging = std::max(staging, b.elems);
    scratch = std::max(scratch, reduce_scratch_elems(b.elems, ranks));
  }
  return {staging, scratch};
}
}  // namespace

int64_t BucketReducer::buffer_bytes(std::span<const Bucket> buckets, int ranks) {
  const auto [staging, scratch] = slot_elems(buckets, ranks);
  return Comm::kMaxPending * (staging + scratch) * static_cast<int64_t>(sizeof(float));
}

int64_t BucketReducer::buffer_bytes() const {
  int64_t b = 0;
  for (const Slot& s : slots_) b += static_cast<int64_t>((s.staging.size() + s.scratch.size()) * sizeof(float));
  return b;
}

int64_t BucketReducer::shard_elems(std::span<const Bucket> buckets, int ranks) {
  int64_t n = 0;
  for (const Bucket& b : buckets) n += chunk(b.elems, ranks, 0).size();  // rank 0's chunks are the largest
  return n;
}

BucketReducer::BucketReducer(Comm& comm, std::vector<FloatSpan> xs, int64_t bucket_elems, bool scatter, float* shard)
    : comm_(comm), scatter_(scatter), shard_(shard), xs_(std::move(xs)), slots_(Comm::kMaxPending) {
  LOOM_ASSERT(!shard_ || scatter_, "a gradient shard takes the scattered sums");
  if (comm_.size() == 1) return;  // nothing to sum: no buckets
  std::vector<int64_t> sizes;
  for (const FloatSpan& x : xs_) sizes.push_back(x.n);
  buckets_ = plan_buckets(sizes, bucket_elems);
  const auto [staging, scratch] = slot_elems(buckets_, comm_.size());
  for (Slot& s : slots_) {  // every slot can take any bucket
    s.staging.resize(static_cast<size_t>(staging));
    s.scratch.resize(static_cast<size_t>(scratch));
  }
  if (!shard_) return;
  shard_offset_.push_back(0);
  for (size_t b = 0; b < buckets_.size(); ++b) shard_offset_.push_back(shard_offset_.back() + own(b).size());
}

BucketReducer::~BucketReducer() = default;

void BucketReducer::start(size_t b) {
  if (b == 0) next_slot_ = 0;
  Slot& s = slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  if (s.pending) {
    while (!s.pending->test()) {
    }
    complete(s);
  }
  const Bucket& k = buckets_[b];
  float* x = xs_[k.first].data;
  if (k.packed()) {
    x = s.staging.data();
    copy(k, xs_, x, {0, k.elems}, /*to_staging=*/true);
  }
  s.bucket = b;
  s.pending = scatter_ ? comm_.start_reduce_scatter_sum(x, k.elems, s.scratch.data())
                       : comm_.start_all_reduce_sum(x, k.elems, s.scratch.data());
}

void BucketReducer::complete(Slot& s) {
  const Bucket& k = buckets_[s.bucket];
  if (shard_) {
    const Range mine = own(s.bucket);
    const float* sum = (k.packed() ? s.staging.data() : xs_[k.first].data) + mine.begin;
    float* into = shard_ + shard_offset(s.bucket);
    for (int64_t i = 0; i < mine.size(); ++i) into[i] += sum[i];
  } else if (k.packed()) {
    copy(k, xs_, s.staging.data(), scatter_ ? own(s.bucket) : Range{0, k.elems}, /*to_staging=*/false);
  }
  s.pending.reset();
  if (on_complete_) on_complete_(s.bucket);
}

void BucketReducer::copy(const Bucket& k, std::span<const FloatSpan> bufs, float* staging, Range r,
                         bool to_staging) const {
  int64_t at = 0;  // where bufs[i] starts in the bucket
  for (size_t i = k.first; i < k.last; at += bufs[i++].n) {
    const int64_t lo = std::max(r.begin, at), hi = std::min(r.end, at + bufs[i].n);
    if (lo >= hi) continue;
    float* buf = bufs[i].data + (lo - at);
    const auto bytes = static_cast<size_t>(hi - lo) * sizeof(float);
    if (to_staging)
      std::memcpy(staging + lo, buf, bytes);
    else
      std::memcpy(buf, staging + lo, bytes);
  }
}

void BucketReducer::all_gather(std::span<const FloatSpan> ys) {
  LOOM_ASSERT(ys.size() == xs_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& k = buckets_[b];
    const Range mine = own(b);
    if (!k.packed()) {
      comm_.all_gather(ys[k.first].data + mine.begin, k.elems, ys[k.first].data);
      continue;
    }
    float* staging = slots_[0].staging.data();
    copy(k, ys, staging, mine, /*to_staging=*/true);
    comm_.all_gather(staging + mine.begin, k.elems, staging);
    copy(k, ys, staging, {0, k.elems}, /*to_staging=*/false);
  }
}

void BucketReducer::progress() {
  for (Slot& s : slots_)
    if (s.pending && s.pending->test()) complete(s);
}

void BucketReducer::finish() {
  for (Slot& s : slots_) {
    if (!s.pending) continue;
    while (!s.pending->test()) {
    }
    complete(s);
  }
}

void BucketReducer::all_reduce_sum() {
  for (size_t b = 0; b < buckets_.size(); ++b) start(b);
  finish();
}

std::string broadcast_string(Comm& comm, const std::string& text, int root) {
  uint64_t n = text.size();
  comm.broadcast(&n, sizeof n, root);
  std::string out = comm.rank() == root ? text : std::string(n, '\0');
  comm.broadcast(out.data(), n, root);
  return out;
}

void share_error(Comm& comm, const UserError* failed, int root) {
  if (comm.size() == 1) {
    if (failed) throw *failed;
    return;
  }
  const std::string what = broadcast_string(comm, failed ? failed->what() : "", root);
  if (what.empty()) return;
  throw AgreedError("", what, broadcast_string(comm, failed ? failed->hint() : "", root));
}

namespace {

class SingleProcess final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int ranks_on_this_host() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  std::unique_ptr<Pending> start_all_reduce_sum(float*, int64_t, float*) override { return std::make_unique<Done>(); }
  std::unique_ptr<Pending> start_reduce_scatter_sum(float*, int64_t, float*) override {
    return std::make_unique<Done>();
  }
  void reduce_scatter_sum(const float* x, int64_t n, float* out) override { copy(x, n, out); }
  void all_gather(const float* mine, int64_t n, float* out) override { copy(mine, n, out); }
  std::unique_ptr<Pending> start_all_gather(const float* mine, int64_t n, float* out) override {
    copy(mine, n, out);
    return std::make_unique<Done>();
  }
  void all_gather_bytes(const void* mine, size_t bytes, void* out) override {
    if (bytes) std::memmove(out, mine, bytes);
  }
  void gather_bytes(const void* mine, void* out, std::span<const int64_t> counts, std::span<const int64_t> displs,
                    int) override {
    auto* dst = static_cast<unsigned char*>(out) + displs[0];
    if (counts[0] > 0 && dst != mine) std::memmove(dst, mine, static_cast<size_t>(counts[0]));
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}

 protected:
  void abort_all(int) override {}

 private:
  struct Done final : Pending {
    bool test() override { return true; }
  };
  static void copy(const float* from, int64_t n, float* to) {
    if (n) std::memmove(to, from, static_cast<size_t>(n) * sizeof(float));
  }
};

}  // namespace

Comm& single_process() {
  static SingleProcess s;
  return s;
}

namespace {
// Whether the exception being handled is an AgreedError.
bool handling_agreed_error() {
  try {
    if (std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
  } catch (const AgreedError&) {
    return true;
  } catch (...) {
  }
  return false;
}
}  // namespace

bool prints_error() { return !handling_agreed_error() || world().rank() == 0; }

int fail_job(int code) {
  Comm& w = world();
  if (w.size() == 1 || handling_agreed_error()) return code;
  flush_before_abort();
  std::fprintf(stderr, "loom: rank %d of %d failed (the error above): stopping every rank\n", w.rank(), w.size());
  std::fflush(stderr);
  w.abort(code);
}

}  // namespace loom::dist
