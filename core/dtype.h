// Element data types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace sluice {

// Wire values are part of the frame format and the dataset definition:
// never renumber.
enum class DType : uint8_t {
  kBool = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kUInt16 = 7,
  kUInt32 = 8,
  kUInt64 = 9,
  kFloat16 = 10,
  kBFloat16 = 11,
  kFloat32 = 12,
  kFloat64 = 13,
  kString = 14,
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,    DType::kInt8,     DType::kInt16,   DType::kInt32,   DType::kInt64,
    DType::kUInt8,   DType::kUInt16,   DType::kUInt32,  DType::kUInt64,  DType::kFloat16,
    DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kString};

// True for the wire values above.
bool IsValidDType(uint8_t value);
// Bytes per element; 0 for kString (variable length).
size_t DTypeSize(DType dtype);
// "int32", "float16", "string", ...
const char* DTypeName(DType dtype);
absl::StatusOr<DType> DTypeFromName(std::string_view name);

inline bool IsInteger(DType d) { return d >= DType::kInt8 && d <= DType::kUInt64; }
inline bool IsSignedInteger(DType d) { return d >= DType::kInt8 && d <= DType::kInt64; }
inline bool IsFloat(DType d) { return d >= DType::kFloat16 && d <= DType::kFloat64; }
inline bool IsNumeric(DType d) { return IsInteger(d) || IsFloat(d); }

}  // namespace sluice
