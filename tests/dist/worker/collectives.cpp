// Run under mpirun by tests/dist/test_dist.cpp (and alone, as a single process): checks every
// collective of dist::Comm against a serial computation over all ranks' data, bit for bit. With
// the argument `mismatch` or `deadline_log`, a job the deadline ends: see those functions below.
// Each rank can compute every rank's data (a pure function of rank and index), so each checks
// its own results. Prints one line per failed check; exit status 1 if any failed.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "dist/comm.h"
#include "train/console.h"

namespace {

using loom::dist::Comm;

using loom::testing::check;
using loom::testing::failures;

// Rank r's buffer number `id` of n elements: signs and magnitudes spread over 2^-20 .. 2^20 so
// that a sum's value depends on the order of its additions.
std::vector<float> data(int r, int id, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // splitmix64 of (id, r, i): cheap, and these buffers reach millions of elements.
    uint64_t z = (static_cast<uint64_t>(id) << 48) ^ (static_cast<uint64_t>(r) << 40) ^ static_cast<uint64_t>(i);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    const auto u = static_cast<uint32_t>(z ^ (z >> 31));
    const float mag =
        std::ldexp(1.0f + static_cast<float>(u & 0xffff) / 65536.0f, static_cast<int>((u >> 16) % 41) - 20);
    x[static_cast<size_t>(i)] = (u >> 31) ? -mag : mag;
  }
  return x;
}

// The sum over ranks of xs in rank order, as a serial loop computes it.
std::vector<float> serial_sum(const std::vector<std::vector<float>>& xs) {
  std::vector<float> s = xs[0];
  for (size_t r = 1; r < xs.size(); ++r)
    for (size_t i = 0; i < s.size(); ++i) s[i] += xs[r][i];
  return s;
}

// Every rank's buffer number `id`.
std::vector<std::vector<float>> all_data(int size, int id, int64_t n) {
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < size; ++r) xs.push_back(data(r, id, n));
  return xs;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

}  // namespace

// `mismatch`: the ranks wait in different collectives (rank 0 in a broadcast from rank 1, the
// others in a sum over ranks), which can never complete; the deadline of 1 s must end the job.
int mismatch(Comm& comm) {
  comm.set_timeout(1);
  float x[4] = {};
  if (comm.rank() == 0) {
    comm.broadcast(x, sizeof x, 1);
  } else {
    std::vector<float> scratch(static_cast<size_t>(loom::dist::reduce_scratch_elems(4, comm.size())));
    auto sum = comm.start_all_reduce_sum(x, 4, scratch.data());
    while (!sum->test()) {
    }
  }
  std::printf("rank %d: the mismatched collectives completed\n", comm.rank());
  return 1;
}

// `late_root`: rank 1 waits past its deadline of 1 s for a broadcast from rank 0, which is
// outside any collective then; its question reaches rank 0 only after rank 0's broadcasts have
// completed (a root's can, before the others take them) and rank 0 waits in the barrier after
// them. Rank 1's broadcast has completed by then too: the ranks are not in different
// collectives, and the job must complete.
int late_root(Comm& comm) {
  comm.set_timeout(1);
  char text[16] = {};
  if (comm.rank() == 0) {
    usleep(1'300'000);
    std::snprintf(text, sizeof text, "late");
  }
  comm.broadcast(text, sizeof text, 0);
  comm.broadcast(text, sizeof text, 0);
  comm.barrier();
  std::printf("rank %d: the late broadcast completed with '%s'\n", comm.rank(), text);
  return std::string(text) == "late" ? 0 : 1;
}

// `deadline_log FILE`: rank 0 writes a line into FILE through a guarded, fully buffered stream
// (as `loom train` prints its log, train/console.h) and then waits in a barrier for rank 1,
// which sleeps outside any collective; the deadline of 1 s ends the job, the line must be in FILE.
int deadline_log(Comm& comm, const char* path) {
  comm.set_timeout(1);
  if (comm.rank() == 0) {
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    std::FILE* log = loom::open_guarded_output(fd);
    loom::dist::set_before_abort(&loom::abandon_blocked_output);
    std::fprintf(log, "the last line before the deadline\n");
    comm.barrier();
  } else {
    sleep(60);
  }
  return 1;
}

int main(int argc, char** argv) {
  loom::dist::Launch launch(&argc, &argv);
  Comm& comm = loom::dist::world();
  const int rank = comm.rank(), size = comm.size();
  if (argc > 1 && std::string(argv[1]) == "mismatch") return mismatch(comm);
  if (argc > 1 && std::string(argv[1]) == "late_root") return late_root(comm);
  if (argc > 2 && std::string(argv[1]) == "deadline_log") return deadline_log(comm, argv[2]);
  // One mpirun on one machine: every rank shares it (the memory check counts them together).
  check(comm.ranks_on_this_host() == size, "ranks_on_this_host under one mpirun on this machine", rank);
  // Lengths around the Open MPI implementation's round of 2^20 elements per rank, and ragged ones.
  const std::vector<int64_t> lengths = {0, 1, 2, 5, 1000, (int64_t{1} << 20) * size + 7};
  int id = 0;
  bool order_matters = false;  // a reversed order of additions changes some sum (N >= 3)
  for (int64_t n : lengths) {
    ++id;
    const std::vector<std::vector<float>> xs = all_data(size, id, n);
    const std::vector<float>& input = xs[static_cast<size_t>(rank)];
    const std::vector<float> expect = serial_sum(xs);
    std::vector<float> x = input;
    comm.all_reduce_sum(x.data(), n);
    check(same_bits(x.data(), expect.data(), n), "all_reduce_sum n=" + std::to_string(n), rank);
    std::vector<float> again = input;
    comm.all_reduce_sum(again.data(), n);
    check(same_bits(x.data(), again.data(), n), "all_reduce_sum repeat n=" + std::to_string(n), rank);

    const std::vector<float> reversed = serial_sum({xs.rbegin(), xs.rend()});
    order_matters = order_matters || !same_bits(reversed.data(), expect.data(), n);

    std::vector<float> mean = input;
    comm.all_reduce_mean(mean.data(), n);
    bool mean_ok = true;
    for (int64_t i = 0; i < n; ++i)
      mean_ok = mean_ok && mean[static_cast<size_t>(i)] == expect[static_cast<size_t>(i)] / static_cast<float>(size);
    check(mean_ok, "all_reduce_mean n=" + std::to_string(n), rank);

    const loom::dist::Range mine = loom::dist::chunk(n, size, rank);
    std::vector<float> part(static_cast<size_t>(mine.size()));
    comm.reduce_scatter_sum(input.data(), n, part.data());
    check(same_bits(part.data(), expect.data() + mine.begin, mine.size()), "reduce_scatter_sum n=" + std::to_string(n),
          rank);

    std::vector<float> gathered(static_cast<size_t>(n));
    comm.all_gather(input.data() + mine.begin, n, gathered.data());
    bool gather_ok = true;
    for (int r = 0; r < size; ++r) {
      const loom::dist::Range c = loom::dist::chunk(n, size, r);
      gather_ok =
          gather_ok && same_bits(gathered.data() + c.begin, xs[static_cast<size_t>(r)].data() + c.begin, c.size());
    }
    check(gather_ok, "all_gather n=" + std::to_string(n), rank);
  }
  check(size < 3 || order_matters, "the data make the order of additions matter", rank);

  // Many tensors through the bucket reducer: the same bits as one sum per tensor, whatever the
  // bucket, with every bucket at once or started one by one between polls (as the trainer does),
  // and over two rounds of the same reducer.
  const std::vector<int64_t> sizes = {3, 1, 700, 64, 5000, 2, 129, 1 << 16, 31};
  for (int64_t bucket : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 20}) {
    std::vector<std::vector<float>> ts(sizes.size());
    std::vector<loom::dist::FloatSpan> spans(sizes.size());
    for (int round = 0; round < 2; ++round) {
      for (size_t t = 0; t < sizes.size(); ++t) {
        ts[t] = data(rank, 100 + static_cast<int>(t) + 10 * round, sizes[t]);
        spans[t] = {ts[t].data(), sizes[t]};
      }
      loom::dist::BucketReducer reducer(comm, spans, bucket);
      if (round == 0) {
        reducer.all_reduce_sum();
      } else {
        for (size_t b = 0; b < reducer.num_buckets(); ++b) {
          reducer.start(b);
          reducer.progress();
        }
        reducer.finish();
      }
      for (size_t t = 0; t < sizes.size(); ++t)
        check(same_bits(ts[t].data(),
                        serial_sum(all_data(size, 100 + static_cast<int>(t) + 10 * round, sizes[t])).data(), sizes[t]),
              "BucketReducer bucket=" + std::to_string(bucket) + " round " + std::to_string(round) + " tensor " +
                  std::to_string(t),
              rank);
    }
  }

  // Scatter mode (sharded optimizer state): each rank's own chunk of every bucket holds the sum,
  // the rest its own values; all_gather then spreads every rank's chunks of a second list.
  for (int64_t bucket : {int64_t{7}, int64_t{6000}}) {
    std::vector<std::vector<float>> ts(sizes.size()), ps(sizes.size());
    std::vector<loom::dist::FloatSpan> spans(sizes.size()), params(sizes.size());
    for (size_t t = 0; t < sizes.size(); ++t) {
      ts[t] = data(rank, 300 + static_cast<int>(t), sizes[t]);
      ps[t] = std::vector<float>(static_cast<size_t>(sizes[t]), static_cast<float>(rank));
      spans[t] = {ts[t].data(), sizes[t]};
      params[t] = {ps[t].data(), sizes[t]};
    }
    loom::dist::BucketReducer reducer(comm, spans, bucket, /*scatter=*/true);
    reducer.all_reduce_sum();
    bool sums_ok = true, gather_ok = true;
    for (size_t b = 0; b < reducer.num_buckets(); ++b) {
      int64_t at = 0;
      for (size_t t = reducer.first(b); t < reducer.last(b); at += sizes[t++]) {
        const std::vector<float> sum = serial_sum(all_data(size, 300 + static_cast<int>(t), sizes[t]));
        const std::vector<float> own = data(rank, 300 + static_cast<int>(t), sizes[t]);
        for (int64_t i = 0; i < sizes[t]; ++i) {
          const bool mine = at + i >= reducer.own(b).begin && at + i < reducer.own(b).end;
          const float want = mine ? sum[static_cast<size_t>(i)] : own[static_cast<size_t>(i)];
          sums_ok = sums_ok && std::memcmp(&ts[t][static_cast<size_t>(i)], &want, sizeof want) == 0;
        }
      }
    }
    check(sums_ok, "BucketReducer scatter bucket=" + std::to_string(bucket), rank);
    reducer.all_gather(params);
    for (size_t b = 0; b < reducer.num_buckets(); ++b) {
      int64_t at = 0;
      for (size_t t = reducer.first(b); t < reducer.last(b); at += sizes[t++])
        for (int64_t i = 0; i < sizes[t]; ++i) {
          // Element i of the bucket comes from the rank whose chunk holds it.
          int owner = 0;
          while (at + i >= loom::dist::chunk(reducer.elems(b), size, owner).end) ++owner;
          gather_ok = gather_ok && ps[t][static_cast<size_t>(i)] == static_cast<float>(owner);
        }
    }
    check(gather_ok, "BucketReducer all_gather bucket=" + std::to_string(bucket), rank);
  }

  // Two sums in flight at once, advanced alternately.
  {
    const int64_t n = (int64_t{1} << 20) * size + 3;
    const auto xs = all_data(size, 200, n), ys = all_data(size, 201, n);
    std::vector<float> x = xs[static_cast<size_t>(rank)], y = ys[static_cast<size_t>(rank)];
    std::vector<float> sx(static_cast<size_t>(loom::dist::reduce_scratch_elems(n, size))), sy(sx.size());
    auto px = comm.start_all_reduce_sum(x.data(), n, sx.data());
    auto py = comm.start_all_reduce_sum(y.data(), n, sy.data());
    bool dx = false, dy = false;
    while (!(dx && dy)) {
      dx = dx || px->test();
      dy = dy || py->test();
    }
    check(same_bits(x.data(), serial_sum(xs).data(), n) && same_bits(y.data(), serial_sum(ys).data(), n),
          "two start_all_reduce_sum in flight", rank);
  }

  // Gathers in flight (start_all_gather): one of every length, all started before any is tested,
  // one of them in place, with a sum in flight beside them and a blocking collective in between.
  {
    const int64_t n = (int64_t{1} << 20) * size + 3;
    const auto sums = all_data(size, 400, n);
    std::vector<float> x = sums[static_cast<size_t>(rank)];
    std::vector<float> scratch(static_cast<size_t>(loom::dist::reduce_scratch_elems(n, size)));
    auto sum = comm.start_all_reduce_sum(x.data(), n, scratch.data());
    std::vector<std::vector<std::vector<float>>> xs;
    std::vector<std::vector<float>> outs;
    std::vector<std::unique_ptr<Comm::Pending>> gathers;
    for (size_t k = 0; k < lengths.size(); ++k) {
      const int64_t m = lengths[k];
      const loom::dist::Range mine = loom::dist::chunk(m, size, rank);
      xs.push_back(all_data(size, 500 + static_cast<int>(k), m));
      const bool in_place = k == 2;
      outs.push_back(in_place ? xs.back()[static_cast<size_t>(rank)] : std::vector<float>(static_cast<size_t>(m)));
      const float* from = (in_place ? outs.back().data() : xs.back()[static_cast<size_t>(rank)].data()) + mine.begin;
      gathers.push_back(comm.start_all_gather(from, m, outs.back().data()));
      if (k == 1) comm.barrier();
    }
    for (bool all_done = false; !all_done;) {
      all_done = sum->test();
      for (auto& g : gathers) all_done = g->test() && all_done;
    }
    check(same_bits(x.data(), serial_sum(sums).data(), n), "a sum beside gathers in flight", rank);
    for (size_t k = 0; k < lengths.size(); ++k) {
      bool ok = true;
      for (int r = 0; r < size; ++r) {
        const loom::dist::Range c = loom::dist::chunk(lengths[k], size, r);
        ok = ok && same_bits(outs[k].data() + c.begin, xs[k][static_cast<size_t>(r)].data() + c.begin, c.size());
      }
      check(ok, "start_all_gather in flight n=" + std::to_string(lengths[k]), rank);
    }
  }

  // Bytes: gather every rank's number, broadcast the last rank's text.
  const int64_t mine_value = 1000 + rank;
  std::vector<int64_t> all(static_cast<size_t>(size));
  comm.all_gather_bytes(&mine_value, sizeof mine_value, all.data());
  for (int r = 0; r < size; ++r) check(all[static_cast<size_t>(r)] == 1000 + r, "all_gather_bytes", rank);
  char text[16] = {};
  std::snprintf(text, sizeof text, "from rank %d", rank);
  comm.broadcast(text, sizeof text, size - 1);
  check(std::string(text) == "from rank " + std::to_string(size - 1), "broadcast", rank);
  comm.barrier();

  std::printf("rank %d of %d: %s\n", rank, size, failures ? "FAILED" : "all collectives exact");
  return failures ? 1 : 0;
}
