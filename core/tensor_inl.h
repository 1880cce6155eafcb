// Template definitions for tensor.h. Include tensor.h, not this file.
#pragma once

#include <cstring>
#include <type_traits>

#include "sluice/core/half.h"

namespace sluice {

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, bool>) return DType::kBool;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::kInt8;
  else if constexpr (std::is_same_v<T, int16_t>) return DType::kInt16;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, long long>) return DType::kInt64;
  else if constexpr (std::is_same_v<T, uint8_t>) return DType::kUInt8;
  else if constexpr (std::is_same_v<T, uint16_t>) return DType::kUInt16;
  else if constexpr (std::is_same_v<T, uint32_t>) return DType::kUInt32;
  else if constexpr (std::is_same_v<T, uint64_t> || std::is_same_v<T, unsigned long long>) return DType::kUInt64;
  else if constexpr (std::is_same_v<T, Float16>) return DType::kFloat16;
  else if constexpr (std::is_same_v<T, BFloat16>) return DType::kBFloat16;
  else if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  else static_assert(sizeof(T) == 0, "type has no sluice dtype");
}

template <typename T>
absl::StatusOr<Tensor> Tensor::FromVector(const std::vector<T>& values, TensorShape shape) {
  auto checked = TensorShape::Make(shape.dims());  // before num_elements(), which may overflow
  if (!checked.ok()) return checked.status();
  if (shape.num_elements() != static_cast<int64_t>(values.size())) {
    return ShapeMismatch(shape, values.size());
  }
  return FromVectorUnchecked(values, std::move(shape));
}

template <typename T>
Tensor Tensor::FromVectorUnchecked(const std::vector<T>& values, TensorShape shape) {
  constexpr DType d = DTypeOf<T>();
  Tensor t = AllocateUnchecked(d, std::move(shape), values.size() * sizeof(T));
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < values.size(); ++i) t.mutable_data()[i] = values[i] ? 1 : 0;
  } else if (!values.empty()) {
    std::memcpy(t.mutable_data(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

}  // namespace sluice
