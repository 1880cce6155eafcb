#include "sluice/core/index_set.h"

#include <algorithm>
#include <bit>

namespace sluice {

IndexSet::IndexSet(int64_t prefix, const std::string& beyond) : prefix_(std::max<int64_t>(0, prefix)) {
  for (size_t byte = 0; byte < beyond.size(); ++byte) {
    const auto b = static_cast<uint8_t>(beyond[byte]);
    for (int bit = 0; bit < 8; ++bit) {
      if (b & (1u << bit)) Insert(prefix_ + static_cast<int64_t>(byte * 8 + bit));
    }
  }
}

bool IndexSet::Contains(int64_t i) const {
  if (i < 0) return false;
  if (i < prefix_) return true;
  const uint64_t off = static_cast<uint64_t>(i - prefix_);
  const size_t word = off / 64;
  return word < bits_.size() && (bits_[word] >> (off % 64)) & 1u;
}

bool IndexSet::Insert(int64_t i) {
  if (i < 0 || Contains(i)) return false;
  const uint64_t off = static_cast<uint64_t>(i - prefix_);
  const size_t word = off / 64;
  if (word >= bits_.size()) bits_.resize(word + 1, 0);
  bits_[word] |= uint64_t{1} << (off % 64);
  ++count_beyond_;
  Absorb();
  return true;
}

void IndexSet::Absorb() {
  // Whole words first, then single bits.
  size_t full = 0;
  while (full < bits_.size() && bits_[full] == ~uint64_t{0}) ++full;
  if (full > 0) {
    bits_.erase(bits_.begin(), bits_.begin() + static_cast<std::ptrdiff_t>(full));
    prefix_ += static_cast<int64_t>(full * 64);
    count_beyond_ -= static_cast<int64_t>(full * 64);
  }
  if (bits_.empty()) return;
  const int ones = std::countr_one(bits_[0]);
  if (ones == 0) return;
  // Shift the whole bitmap right by `ones` bits.
  for (size_t w = 0; w < bits_.size(); ++w) {
    uint64_t v = bits_[w] >> ones;
    if (w + 1 < bits_.size()) v |= bits_[w + 1] << (64 - ones);
    bits_[w] = v;
  }
  while (!bits_.empty() && bits_.back() == 0) bits_.pop_back();
  prefix_ += ones;
  count_beyond_ -= ones;
}

void IndexSet::Merge(const IndexSet& other) {
  if (other.prefix_ > prefix_) {
    // Everything below other's prefix is in: re-base onto it.
    IndexSet merged;
    merged.prefix_ = other.prefix_;
    merged.bits_ = other.bits_;
    merged.count_beyond_ = other.count_beyond_;
    for (size_t w = 0; w < bits_.size(); ++w) {
      uint64_t v = bits_[w];
      while (v != 0) {
        const int b = std::countr_zero(v);
        v &= v - 1;
        merged.Insert(prefix_ + static_cast<int64_t>(w * 64 + static_cast<size_t>(b)));
      }
    }
    *this = std::move(merged);
    return;
  }
  for (size_t w = 0; w < other.bits_.size(); ++w) {
    uint64_t v = other.bits_[w];
    while (v != 0) {
      const int b = std::countr_zero(v);
      v &= v - 1;
      Insert(other.prefix_ + static_cast<int64_t>(w * 64 + static_cast<size_t>(b)));
    }
  }
}

std::string IndexSet::beyond() const {
  std::string out(bits_.size() * 8, '\0');
  for (size_t w = 0; w < bits_.size(); ++w) {
    for (int b = 0; b < 8; ++b) out[w * 8 + static_cast<size_t>(b)] = static_cast<char>(bits_[w] >> (8 * b));
  }
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

int64_t IndexSet::size() const { return prefix_ + count_beyond_; }

}  // namespace sluice
