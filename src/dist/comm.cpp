#include "dist/comm.h"

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

BucketReducer::BucketReducer(Comm& comm, int64_t bucket_elems) : comm_(comm), bucket_(bucket_elems) {
  LOOM_ASSERT(bucket_elems > 0);
}

void BucketReducer::all_reduce_sum(std::span<const FloatSpan> xs) {
  if (comm_.size() == 1) return;
  size_t first = 0;  // the packed run is xs[first, i)
  int64_t packed = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].n >= bucket_) {
      comm_.all_reduce_sum(xs[i].data, xs[i].n);
      flush(xs.subspan(first, i - first));
      first = i + 1;
      packed = 0;
      continue;
    }
    if (packed + xs[i].n > bucket_) {
      flush(xs.subspan(first, i - first));
      first = i;
      packed = 0;
    }
    packed += xs[i].n;
  }
  flush(xs.subspan(first));
}

// Reduces the small buffers in `packed` (which all fit in one bucket) through the staging buffer.
void BucketReducer::flush(std::span<const FloatSpan> packed) {
  if (packed.empty()) return;
  if (packed.size() == 1) return comm_.all_reduce_sum(packed[0].data, packed[0].n);
  staging_.resize(static_cast<size_t>(bucket_));
  int64_t at = 0;
  for (const FloatSpan& x : packed) {
    std::memcpy(staging_.data() + at, x.data, static_cast<size_t>(x.n) * sizeof(float));
    at += x.n;
  }
  comm_.all_reduce_sum(staging_.data(), at);
  at = 0;
  for (const FloatSpan& x : packed) {
    std::memcpy(x.data, staging_.data() + at, static_cast<size_t>(x.n) * sizeof(float));
    at += x.n;
  }
}

namespace {

class SingleProcess final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
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
