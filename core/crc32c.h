// CRC-32C (Castagnoli), as used by TFRecord files and the dispatcher journal.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::crc32c {

// Extends `crc` (the CRC of earlier bytes, 0 initially) with `n` bytes.
uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

namespace internal {
// The table-driven implementation Extend() falls back to without SSE4.2;
// exposed so tests cover it on machines that have SSE4.2.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
}  // namespace internal

// The masking TFRecord applies to stored CRCs.
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace sluice::crc32c
