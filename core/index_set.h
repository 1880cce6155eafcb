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
  // Indices and saved bitmaps beyond these are not a split's (Valid).
  static constexpr int64_t kMaxIndex = int64_t{1} << 40;
  static constexpr size_t kMaxBitmapBytes = size_t{16} << 20;
  // Whether a saved form is within those bounds.
  static bool Valid(int64_t prefix, const std::string& beyond) {
    return prefix >= 0 && prefix <= kMaxIndex && beyond.size() <= kMaxBitmapBytes;
  }
  IndexSet() = default;
  // From the saved form (bit i of `beyond`, LSB first, is index prefix + i);
  // empty unless Valid.
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
  void Absorb();  // grows the prefix over the set bits at its end
  bool Bit(int64_t i) const;  // i >= base_

  int64_t prefix_ = 0;
  // bits_[first_ + k], bit b: index base_ + 64 * k + b (base_ a multiple
  // of 64, at most prefix_; bits below prefix_ are not read).
  int64_t base_ = 0;
  size_t first_ = 0;
  std::vector<uint64_t> bits_;
  int64_t count_beyond_ = 0;  // set bits at or above prefix_
};

}  // namespace sluice
