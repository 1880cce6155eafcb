// Tensor, TensorShape and Element.
//
// A Tensor is a typed, shaped view of bytes held alive by a shared owner.
// The owner may be memory the tensor allocated (Tensor::Allocate) or memory
// it does not own at all (Tensor::View): a slot of a registered receive
// buffer, a decoded frame, a memory-mapped file. Copying a Tensor copies the
// view, not the bytes. Tensors are immutable once shared; mutable_data() is
// for the producer that just allocated one.
//
// Storage layout per dtype:
//   numeric/bool: num_elements * DTypeSize(dtype) bytes, row-major.
//   string:       (num_elements + 1) little-endian uint64 offsets, then the
//                 concatenated bytes; string i is bytes[off[i], off[i+1]).
//                 off[0] == 0 and off[n] == byte count of the bytes region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sluice/core/dtype.h"

namespace sluice {

class TensorShape {
 public:
  TensorShape() = default;  // a scalar
  TensorShape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit TensorShape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  // Rejects negative dimensions and element counts that overflow int64.
  static absl::StatusOr<TensorShape> Make(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t num_elements() const;
  bool is_scalar() const { return dims_.empty(); }

  // [] for a scalar, [2,3] otherwise.
  std::string ToString() const;
  bool operator==(const TensorShape& o) const { return dims_ == o.dims_; }
  bool operator!=(const TensorShape& o) const { return !(*this == o); }

 private:
  std::vector<int64_t> dims_;
};

class Tensor {
 public:
  // An empty float32 scalar-less placeholder; valid() is false.
  Tensor() = default;

  // Allocates zeroed, 64-byte aligned storage for a numeric or bool tensor;
  // zeroed = false leaves it uninitialized, for a caller that overwrites it
  // entirely (a large output would otherwise be written twice).
  static absl::StatusOr<Tensor> Allocate(DType dtype, TensorShape shape, bool zeroed = true);
  // Views `size` bytes at `data` without copying. `owner` keeps them alive
  // (it may be null for memory that outlives every view). The layout is
  // validated (size matches shape, string offsets are consistent).
  static absl::StatusOr<Tensor> View(DType dtype, TensorShape shape, const void* data,
                                     size_t size, std::shared_ptr<const void> owner);

  // Convenience constructors for producers and tests (they copy `values`).
  // The shaped forms fail when the shape's element count differs from
  // values.size().
  template <typename T>
  static absl::StatusOr<Tensor> FromVector(const std::vector<T>& values, TensorShape shape);
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values) {
    return FromVectorUnchecked(values, TensorShape({static_cast<int64_t>(values.size())}));
  }
  template <typename T>
  static Tensor Scalar(T value) {
    return FromVectorUnchecked(std::vector<T>{value}, TensorShape());
  }
  static absl::StatusOr<Tensor> Strings(const std::vector<std::string>& values,
                                        TensorShape shape);
  static Tensor Strings(const std::vector<std::string>& values);
  static Tensor String(std::string_view value);

  bool valid() const { return valid_; }
  DType dtype() const { return dtype_; }
  const TensorShape& shape() const { return shape_; }
  int64_t num_elements() const { return shape_.num_elements(); }
  // Total bytes of storage (see the layout above).
  size_t byte_size() const { return size_; }
  const uint8_t* data() const { return data_; }
  // For the producer that allocated this tensor and has not shared it yet.
  uint8_t* mutable_data() const { return const_cast<uint8_t*>(data_); }
  const std::shared_ptr<const void>& owner() const { return owner_; }

  // Typed access for numeric/bool tensors (T must match the dtype's width).
  template <typename T>
  absl::Span<const T> values() const {
    return absl::Span<const T>(reinterpret_cast<const T*>(data_), size_ / sizeof(T));
  }
  template <typename T>
  T at(int64_t i) const { return values<T>()[i]; }

  // String tensors: element i. Precondition: dtype() == kString.
  std::string_view str(int64_t i) const;

  // Same dtype, shape and bytes.
  bool Equals(const Tensor& other) const;
  // "int64[3]{1, 2, 3}" (truncated for large tensors).
  std::string DebugString(size_t max_elements = 16) const;

  // A tensor with the same bytes and a new shape of equal element count.
  absl::StatusOr<Tensor> Reshape(TensorShape shape) const;

 private:
  Tensor(DType dtype, TensorShape shape, const uint8_t* data, size_t size,
         std::shared_ptr<const void> owner)
      : valid_(true), dtype_(dtype), shape_(std::move(shape)), data_(data), size_(size),
        owner_(std::move(owner)) {}
  static Tensor AllocateUnchecked(DType dtype, TensorShape shape, size_t bytes);
  template <typename T>
  static Tensor FromVectorUnchecked(const std::vector<T>& values, TensorShape shape);
  static absl::Status ShapeMismatch(const TensorShape& shape, size_t count);

  bool valid_ = false;
  DType dtype_ = DType::kFloat32;
  TensorShape shape_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

// A tuple of tensors: one dataset element.
using Element = std::vector<Tensor>;

bool ElementsEqual(const Element& a, const Element& b);
std::string ElementDebugString(const Element& e);

// Maps C++ types to dtypes (bool, [u]int8..64, Float16, BFloat16, float, double).
template <typename T>
constexpr DType DTypeOf();

// Allocates `bytes` bytes aligned to 64, zeroed unless `zeroed` is false
// (for a buffer the caller overwrites entirely); the owner frees them. Null
// when memory runs out. Blocks of kRecycledBlockBytes or more are recycled:
// a freed one is kept (up to kRecycledCacheBytes in all, the oldest freed
// first beyond that) for the next allocation of the same size, so a
// pipeline producing fresh large tensors does not fault in every page of
// each one. Blocks of kHugePageBytes or more are their own mappings, aligned
// and advised for huge pages (huge_pages.h), unless that is turned off.
// Sanitizer builds do not recycle and take every block from the heap.
inline constexpr size_t kRecycledBlockBytes = size_t{1} << 20;
inline constexpr size_t kRecycledCacheBytes = size_t{256} << 20;
std::shared_ptr<uint8_t> AllocateAligned(size_t bytes, bool zeroed = true);

// Builds a string tensor from pieces without intermediate std::strings.
absl::StatusOr<Tensor> MakeStringTensor(const std::vector<std::string_view>& values,
                                        TensorShape shape);

}  // namespace sluice

#include "sluice/core/tensor_inl.h"
