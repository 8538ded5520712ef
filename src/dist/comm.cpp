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

void Comm::abort(int code) {
  std::fflush(nullptr);
  abort_all(code);
  std::_Exit(code);
}

void Comm::all_reduce_mean(float* x, int64_t n) {
  all_reduce_sum(x, n);
  const auto d = static_cast<float>(size());
  for (int64_t i = 0; i < n; ++i) x[i] /= d;
}

BucketReducer::BucketReducer(Comm& comm, std::vector<FloatSpan> xs, int64_t bucket_elems)
    : comm_(comm), xs_(std::move(xs)), slots_(Comm::kMaxPending) {
  LOOM_ASSERT(bucket_elems > 0);
  if (comm_.size() == 1) return;  // nothing to sum: no buckets
  for (size_t i = 0; i < xs_.size();) {
    Bucket b{.first = i, .last = i + 1, .elems = xs_[i].n};
    while (b.last < xs_.size() && b.elems + xs_[b.last].n <= bucket_elems) b.elems += xs_[b.last++].n;
    b.packed = b.last - b.first > 1;
    buckets_.push_back(b);
    i = b.last;
  }
  // Every slot can take any bucket.
  int64_t staging = 0, scratch = 0;
  for (const Bucket& b : buckets_) {
    if (b.packed) staging = std::max(staging, b.elems);
    scratch = std::max(scratch, comm_.reduce_scratch_elems(b.elems));
  }
  for (Slot& s : slots_) {
    s.staging.resize(static_cast<size_t>(staging));
    s.scratch.resize(static_cast<size_t>(scratch));
  }
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
  if (k.packed) {
    x = s.staging.data();
    for (size_t i = k.first, at = 0; i < k.last; at += static_cast<size_t>(xs_[i++].n))
      std::memcpy(x + at, xs_[i].data, static_cast<size_t>(xs_[i].n) * sizeof(float));
  }
  s.bucket = b;
  s.pending = comm_.start_all_reduce_sum(x, k.elems, s.scratch.data());
}

void BucketReducer::complete(Slot& s) {
  const Bucket& k = buckets_[s.bucket];
  if (k.packed)
    for (size_t i = k.first, at = 0; i < k.last; at += static_cast<size_t>(xs_[i++].n))
      std::memcpy(xs_[i].data, s.staging.data() + at, static_cast<size_t>(xs_[i].n) * sizeof(float));
  s.pending.reset();
  if (on_complete_) on_complete_(s.bucket);
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

namespace {

class SingleProcess final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  std::unique_ptr<Pending> start_all_reduce_sum(float*, int64_t, float*) override { return std::make_unique<Done>(); }
  int64_t reduce_scratch_elems(int64_t) const override { return 0; }
  void reduce_scatter_sum(const float* x, int64_t n, float* out) override { copy(x, n, out); }
  void all_gather(const float* mine, int64_t n, float* out) override { copy(mine, n, out); }
  void all_gather_bytes(const void* mine, size_t bytes, void* out) override {
    if (bytes) std::memmove(out, mine, bytes);
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

int fail_job(int code) {
  Comm& w = world();
  if (w.size() == 1) return code;
  try {
    if (std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
  } catch (const AgreedError&) {
    return code;
  } catch (...) {
  }
  std::fflush(stdout);
  std::fprintf(stderr, "loom: rank %d of %d failed (the error above): stopping every rank\n", w.rank(), w.size());
  std::fflush(stderr);
  w.abort(code);
}

}  // namespace loom::dist
