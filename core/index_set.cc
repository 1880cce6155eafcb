#include "sluice/core/index_set.h"

#include <algorithm>
#include <bit>

namespace sluice {

IndexSet::IndexSet(int64_t prefix, const std::string& beyond)
    : prefix_(Valid(prefix, beyond) ? prefix : 0), base_(prefix_ / 64 * 64) {
  if (!Valid(prefix, beyond)) return;
  for (size_t byte = 0; byte < beyond.size(); ++byte) {
    const auto b = static_cast<uint8_t>(beyond[byte]);
    for (int bit = 0; bit < 8; ++bit) {
      if (b & (1u << bit)) Insert(prefix + static_cast<int64_t>(byte * 8 + bit));
    }
  }
}

bool IndexSet::Bit(int64_t i) const {
  const uint64_t off = static_cast<uint64_t>(i - base_);
  const size_t word = first_ + off / 64;
  return word < bits_.size() && (bits_[word] >> (off % 64)) & 1u;
}

bool IndexSet::Contains(int64_t i) const {
  if (i < 0) return false;
  return i < prefix_ || Bit(i);
}

bool IndexSet::Insert(int64_t i) {
  if (i < 0 || i > kMaxIndex + int64_t{kMaxBitmapBytes} * 8 || Contains(i)) return false;
  const uint64_t off = static_cast<uint64_t>(i - base_);
  const size_t word = first_ + off / 64;
  if (word >= bits_.size()) bits_.resize(word + 1, 0);
  bits_[word] |= uint64_t{1} << (off % 64);
  ++count_beyond_;
  if (i == prefix_) Absorb();
  return true;
}

void IndexSet::Absorb() {
  // Bits below prefix_ stay set in the first live word; whole words below
  // it are dropped, and the dead front of bits_ is trimmed once it is
  // half the vector (amortized constant time per index).
  while (first_ < bits_.size()) {
    const int from = static_cast<int>(prefix_ - base_);  // < 64
    const uint64_t rest = bits_[first_] >> from;
    const int ones = std::countr_one(rest);  // at most 64 - from
    prefix_ += ones;
    count_beyond_ -= ones;
    if (prefix_ - base_ < 64) break;
    ++first_;
    base_ += 64;
  }
  if (first_ == bits_.size()) {
    bits_.clear();
    first_ = 0;
  } else if (first_ > 16 && first_ * 2 > bits_.size()) {
    bits_.erase(bits_.begin(), bits_.begin() + static_cast<std::ptrdiff_t>(first_));
    first_ = 0;
  }
}

void IndexSet::Merge(const IndexSet& other) {
  if (other.prefix_ > prefix_) {
    IndexSet merged = other;
    merged.Merge(*this);
    *this = std::move(merged);
    return;
  }
  for (size_t w = other.first_; w < other.bits_.size(); ++w) {
    uint64_t v = other.bits_[w];
    while (v != 0) {
      const int b = std::countr_zero(v);
      v &= v - 1;
      const int64_t i = other.base_ + static_cast<int64_t>((w - other.first_) * 64) + b;
      if (i >= other.prefix_) Insert(i);
    }
  }
}

std::string IndexSet::beyond() const {
  std::string out;
  const int64_t top = base_ + static_cast<int64_t>((bits_.size() - first_) * 64);
  for (int64_t i = prefix_; i < top; ++i) {
    if (!Bit(i)) continue;
    const uint64_t off = static_cast<uint64_t>(i - prefix_);
    if (out.size() <= off / 8) out.resize(off / 8 + 1, '\0');
    out[off / 8] = static_cast<char>(static_cast<uint8_t>(out[off / 8]) | (1u << (off % 8)));
  }
  return out;
}

int64_t IndexSet::size() const { return prefix_ + count_beyond_; }

}  // namespace sluice
