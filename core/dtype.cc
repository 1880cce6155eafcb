#include "sluice/core/dtype.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace sluice {

bool IsValidDType(uint8_t value) {
  return value >= static_cast<uint8_t>(DType::kBool) &&
         value <= static_cast<uint8_t>(DType::kString);
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64:
      return 8;
    case DType::kString:
      return 0;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kString: return "string";
  }
  return "invalid";
}

absl::StatusOr<DType> DTypeFromName(std::string_view name) {
  absl::string_view n(name.data(), name.size());
  for (DType d : kAllDTypes) {
    if (std::string_view(DTypeName(d)) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", n,
                   "'; expected one of bool, int8..int64, uint8..uint64, float16, "
                   "bfloat16, float32, float64, string"));
}

}  // namespace sluice
