// Byte-string compression for records that hold large, repetitive text (a
// dispatcher journal's file listings). Frames on the wire have their own
// codecs (frame.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sluice {

// zstd at `level` (1: fast; 3: zstd's default).
std::string ZstdCompress(std::string_view data, int level = 3);
// The bytes ZstdCompress was given. DataLoss for bytes that are not one
// zstd frame, or that do not say their size; ResourceExhausted when they
// would decompress to more than `max_bytes`.
absl::StatusOr<std::string> ZstdDecompress(std::string_view compressed, uint64_t max_bytes);

}  // namespace sluice
