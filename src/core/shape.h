// Static tensor shapes. Every value in a loom graph has a fixed shape known when the node is
// built, which is what lets the memory plan be computed before anything runs.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace loom {

inline constexpr int kMaxRank = 6;

struct Shape {
  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    LOOM_ASSERT(d.size() <= kMaxRank, "rank above kMaxRank");
    for (int64_t x : d) dims[rank++] = x;
  }
  int64_t operator[](int i) const {
    if (i < 0) i += rank;
    LOOM_ASSERT(i >= 0 && i < rank, "shape index out of range");
    return dims[i];
  }
  int64_t& operator[](int i) {
    if (i < 0) i += rank;
    LOOM_ASSERT(i >= 0 && i < rank, "shape index out of range");
    return dims[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  int64_t last() const { return rank ? dims[rank - 1] : 1; }
  // Product of all dims but the last: the "rows" of a row-wise op.
  int64_t rows() const { return rank ? numel() / dims[rank - 1] : 1; }
  void push_back(int64_t d) {
    LOOM_ASSERT(rank < kMaxRank, "rank above kMaxRank");
    dims[rank++] = d;
  }
  Shape with_last(int64_t d) const {
    Shape s = *this;
    LOOM_ASSERT(s.rank > 0);
    s.dims[s.rank - 1] = d;
    return s;
  }
  Shape drop_last() const {
    Shape s = *this;
    LOOM_ASSERT(s.rank > 0);
    --s.rank;
    s.dims[s.rank] = 0;
    return s;
  }
  // True when `suffix` equals the trailing dims of this shape (broadcast over leading dims).
  bool ends_with(const Shape& suffix) const {
    if (suffix.rank > rank) return false;
    for (int i = 0; i < suffix.rank; ++i)
      if (dims[rank - suffix.rank + i] != suffix.dims[i]) return false;
    return true;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

}  // namespace loom
