// IndexSet: a set of non-negative indices kept as a prefix [0, prefix)
// plus a bitmap beyond it, which is how a split's delivered (or skipped)
// elements are saved in service checkpoints (proto::SplitProgress,
// proto::SplitProto): indices mostly arrive in order, so the prefix
// absorbs them and the bitmap stays short.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sluice {

class IndexSet {
 public:
  IndexSet() = default;
  // From the saved form (bit i of `beyond`, LSB first, is index prefix + i).
  IndexSet(int64_t prefix, const std::string& beyond);

  // Adds `i` (>= 0); true if it was not in the set.
  bool Insert(int64_t i);
  bool Contains(int64_t i) const;
  // Every index in `other` added.
  void Merge(const IndexSet& other);

  int64_t prefix() const { return prefix_; }
  // The bitmap beyond the prefix, as saved (no trailing zero bytes).
  std::string beyond() const;
  // How many indices it holds.
  int64_t size() const;
  bool empty() const { return prefix_ == 0 && count_beyond_ == 0; }

 private:
  void Absorb();  // moves set bits at the bitmap's start into the prefix

  int64_t prefix_ = 0;
  std::vector<uint64_t> bits_;  // bit i: index prefix_ + i
  int64_t count_beyond_ = 0;
};

}  // namespace sluice
