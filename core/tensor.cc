#include "sluice/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "sluice/core/huge_pages.h"

namespace sluice {

absl::StatusOr<TensorShape> TensorShape::Make(std::vector<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(dims, ","), "] has a negative dimension"));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(dims, ","), "] has too many elements"));
    }
    n *= d;
  }
  return TensorShape(std::move(dims));
}

int64_t TensorShape::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::string TensorShape::ToString() const {
  return absl::StrCat("[", absl::StrJoin(dims_, ","), "]");
}

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRecycle = false;  // reuse would hide use-after-free from the sanitizer
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kRecycle = false;
#else
constexpr bool kRecycle = true;
#endif
#else
constexpr bool kRecycle = true;
#endif

// A block of memory and how it was made. Blocks of a huge page or more
// are mapped on their own, aligned and advised for huge pages
// (huge_pages.h), when recycling (not under a sanitizer, which tracks only
// the heap) and huge pages are on; the heap serves the others, and any the
// kernel would not map (out of mappings: vm.max_map_count).
struct Block {
  void* p = nullptr;
  size_t size = 0;
  bool mapped = false;
};
Block NewBlock(size_t size) {
  if (kRecycle && WantsHugePages(size)) {
    if (void* p = MapHugePageAligned(size)) return {p, size, true};
  }
  return {std::aligned_alloc(64, size), size, false};
}
void FreeBlock(const Block& b) {
  if (b.mapped) {
    UnmapHugePageAligned(b.p, b.size);
  } else {
    std::free(b.p);
  }
}

// Freed large blocks, most recently freed first (AllocateAligned).
class BlockCache {
 public:
  // Never destroyed: tensors freed during exit still return their blocks.
  static BlockCache& Get() {
    static BlockCache* cache = new BlockCache;
    return *cache;
  }
  // A freed block of `size`, or one with a null p.
  Block Take(size_t size) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->size != size) continue;
      Block b = *it;
      bytes_ -= size;
      blocks_.erase(it);
      return b;
    }
    return {};
  }
  void Put(const Block& b) ABSL_LOCKS_EXCLUDED(mu_) {
    std::list<Block> evicted;
    {
      absl::MutexLock l(&mu_);
      blocks_.push_front(b);
      bytes_ += b.size;
      while (bytes_ > kRecycledCacheBytes) {
        bytes_ -= blocks_.back().size;
        evicted.splice(evicted.begin(), blocks_, std::prev(blocks_.end()));
      }
    }
    for (const Block& e : evicted) FreeBlock(e);
  }

 private:
  absl::Mutex mu_;
  std::list<Block> blocks_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<uint8_t> AllocateAligned(size_t bytes, bool zeroed) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  // Recycled blocks come in 64 KiB steps, so near sizes share them.
  const bool recycle = kRecycle && rounded >= kRecycledBlockBytes;
  if (recycle) rounded = (rounded + 65535) / 65536 * 65536;
  Block b = recycle ? BlockCache::Get().Take(rounded) : Block{};
  bool fresh_mapping = false;  // reads as zeros already
  if (b.p == nullptr) {
    b = NewBlock(rounded);
    fresh_mapping = b.mapped;
  }
  if (b.p == nullptr) return nullptr;
  if (zeroed && !fresh_mapping) std::memset(b.p, 0, rounded);
  if (recycle) {
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(b.p),
                                    [b](uint8_t*) { BlockCache::Get().Put(b); });
  }
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(b.p), [b](uint8_t*) { FreeBlock(b); });
}

Tensor Tensor::AllocateUnchecked(DType dtype, TensorShape shape, size_t bytes) {
  std::shared_ptr<uint8_t> mem = AllocateAligned(bytes);
  if (mem == nullptr) std::abort();  // out of memory
  const uint8_t* data = mem.get();
  return Tensor(dtype, std::move(shape), data, bytes, std::move(mem));
}

absl::Status Tensor::ShapeMismatch(const TensorShape& shape, size_t count) {
  return absl::InvalidArgumentError(absl::StrCat("shape ", shape.ToString(), " holds ",
                                                 shape.num_elements(), " elements but ",
                                                 count, " values were given"));
}

absl::StatusOr<Tensor> Tensor::Allocate(DType dtype, TensorShape shape, bool zeroed) {
  if (dtype == DType::kString) {
    return absl::InvalidArgumentError(
        "Tensor::Allocate cannot allocate a string tensor; use MakeStringTensor");
  }
  auto checked = TensorShape::Make(shape.dims());
  if (!checked.ok()) return checked.status();
  int64_t n = shape.num_elements();
  size_t width = DTypeSize(dtype);
  if (static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / width / 2) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor of shape ", shape.ToString(), " is too large"));
  }
  size_t bytes = static_cast<size_t>(n) * width;
  std::shared_ptr<uint8_t> mem = AllocateAligned(bytes, zeroed);
  if (mem == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  const uint8_t* data = mem.get();
  return Tensor(dtype, std::move(shape), data, bytes, std::move(mem));
}

namespace {

absl::Status ValidateStringLayout(const TensorShape& shape, const uint8_t* data, size_t size) {
  uint64_t n = static_cast<uint64_t>(shape.num_elements());
  if (n + 1 > size / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("string tensor of shape ", shape.ToString(), " needs ", (n + 1) * 8,
                     " bytes of offsets; only ", size, " bytes given"));
  }
  uint64_t bytes_region = size - (n + 1) * 8;
  uint64_t prev = 0;
  for (uint64_t i = 0; i <= n; ++i) {
    uint64_t off;
    std::memcpy(&off, data + i * 8, 8);
    if ((i == 0 && off != 0) || off < prev || off > bytes_region) {
      return absl::InvalidArgumentError(
          absl::StrCat("string tensor offset ", i, " = ", off, " is out of order or beyond ",
                       bytes_region, " bytes"));
    }
    prev = off;
  }
  if (prev != bytes_region) {
    return absl::InvalidArgumentError(absl::StrCat("string tensor's last offset ", prev,
                                                   " != size of its bytes ", bytes_region));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> Tensor::View(DType dtype, TensorShape shape, const void* data,
                                    size_t size, std::shared_ptr<const void> owner) {
  auto checked = TensorShape::Make(shape.dims());
  if (!checked.ok()) return checked.status();
  if (data == nullptr && size != 0) {
    return absl::InvalidArgumentError("Tensor::View of null data with nonzero size");
  }
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (dtype == DType::kString) {
    absl::Status s = ValidateStringLayout(shape, bytes, size);
    if (!s.ok()) return s;
  } else {
    uint64_t n = static_cast<uint64_t>(shape.num_elements());
    size_t width = DTypeSize(dtype);
    if (n > std::numeric_limits<uint64_t>::max() / width || n * width != size) {
      return absl::InvalidArgumentError(
          absl::StrCat(DTypeName(dtype), " tensor of shape ", shape.ToString(), " needs ",
                       n * width, " bytes; ", size, " given"));
    }
  }
  return Tensor(dtype, std::move(shape), bytes, size, std::move(owner));
}

absl::StatusOr<Tensor> MakeStringTensor(const std::vector<std::string_view>& values,
                                        TensorShape shape) {
  auto checked = TensorShape::Make(shape.dims());  // before num_elements(), which may overflow
  if (!checked.ok()) return checked.status();
  if (shape.num_elements() != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", shape.ToString(), " holds ",
                                                   shape.num_elements(), " strings but ",
                                                   values.size(), " were given"));
  }
  size_t total = 0;
  for (auto v : values) total += v.size();
  size_t header = (values.size() + 1) * 8;
  size_t bytes = header + total;
  std::shared_ptr<uint8_t> mem = AllocateAligned(bytes);
  if (mem == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  uint8_t* p = mem.get();
  uint64_t off = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    std::memcpy(p + i * 8, &off, 8);
    if (!values[i].empty()) std::memcpy(p + header + off, values[i].data(), values[i].size());
    off += values[i].size();
  }
  std::memcpy(p + values.size() * 8, &off, 8);
  return Tensor::View(DType::kString, std::move(shape), p, bytes, std::move(mem));
}

absl::StatusOr<Tensor> Tensor::Strings(const std::vector<std::string>& values,
                                       TensorShape shape) {
  std::vector<std::string_view> views(values.begin(), values.end());
  return MakeStringTensor(views, std::move(shape));
}

Tensor Tensor::Strings(const std::vector<std::string>& values) {
  auto t = Strings(values, TensorShape({static_cast<int64_t>(values.size())}));
  if (!t.ok()) std::abort();  // cannot happen: the shape matches by construction
  return *std::move(t);
}

Tensor Tensor::String(std::string_view value) {
  auto t = MakeStringTensor({value}, TensorShape());
  if (!t.ok()) std::abort();  // only out of memory
  return *std::move(t);
}

std::string_view Tensor::str(int64_t i) const {
  uint64_t n = static_cast<uint64_t>(num_elements());
  uint64_t a, b;
  std::memcpy(&a, data_ + i * 8, 8);
  std::memcpy(&b, data_ + (i + 1) * 8, 8);
  const char* base = reinterpret_cast<const char*>(data_ + (n + 1) * 8);
  return std::string_view(base + a, b - a);
}

bool Tensor::Equals(const Tensor& other) const {
  if (valid_ != other.valid_) return false;
  if (!valid_) return true;
  return dtype_ == other.dtype_ && shape_ == other.shape_ && size_ == other.size_ &&
         (size_ == 0 || std::memcmp(data_, other.data_, size_) == 0);
}

namespace {

template <typename T>
std::string FormatValue(T v) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return absl::StrCat(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>) {
    return absl::StrCat(static_cast<int>(v));
  } else {
    return absl::StrCat(v);
  }
}

template <typename T>
void AppendValues(const Tensor& t, size_t max, std::string* out) {
  auto vals = t.values<T>();
  for (size_t i = 0; i < vals.size() && i < max; ++i) {
    if (i) absl::StrAppend(out, ", ");
    if constexpr (std::is_same_v<T, bool>) {
      // Read the byte, not a bool: viewed (untrusted) bytes may be neither 0 nor 1.
      uint8_t byte;
      std::memcpy(&byte, &vals[i], 1);
      absl::StrAppend(out, FormatValue(byte != 0));
    } else {
      T v;
      std::memcpy(&v, &vals[i], sizeof(T));
      absl::StrAppend(out, FormatValue(v));
    }
  }
  if (vals.size() > max) absl::StrAppend(out, ", ...");
}

}  // namespace

std::string Tensor::DebugString(size_t max_elements) const {
  if (!valid_) return "<invalid tensor>";
  std::string out = absl::StrCat(DTypeName(dtype_), shape_.ToString(), "{");
  switch (dtype_) {
    case DType::kBool: AppendValues<bool>(*this, max_elements, &out); break;
    case DType::kInt8: AppendValues<int8_t>(*this, max_elements, &out); break;
    case DType::kInt16: AppendValues<int16_t>(*this, max_elements, &out); break;
    case DType::kInt32: AppendValues<int32_t>(*this, max_elements, &out); break;
    case DType::kInt64: AppendValues<int64_t>(*this, max_elements, &out); break;
    case DType::kUInt8: AppendValues<uint8_t>(*this, max_elements, &out); break;
    case DType::kUInt16: AppendValues<uint16_t>(*this, max_elements, &out); break;
    case DType::kUInt32: AppendValues<uint32_t>(*this, max_elements, &out); break;
    case DType::kUInt64: AppendValues<uint64_t>(*this, max_elements, &out); break;
    case DType::kFloat16: AppendValues<Float16>(*this, max_elements, &out); break;
    case DType::kBFloat16: AppendValues<BFloat16>(*this, max_elements, &out); break;
    case DType::kFloat32: AppendValues<float>(*this, max_elements, &out); break;
    case DType::kFloat64: AppendValues<double>(*this, max_elements, &out); break;
    case DType::kString: {
      int64_t n = num_elements();
      for (int64_t i = 0; i < n && i < static_cast<int64_t>(max_elements); ++i) {
        if (i) absl::StrAppend(&out, ", ");
        std::string_view s = str(i);
        absl::StrAppend(&out, "\"", absl::string_view(s.data(), s.size()), "\"");
      }
      if (n > static_cast<int64_t>(max_elements)) absl::StrAppend(&out, ", ...");
      break;
    }
  }
  absl::StrAppend(&out, "}");
  return out;
}

absl::StatusOr<Tensor> Tensor::Reshape(TensorShape shape) const {
  auto checked = TensorShape::Make(shape.dims());
  if (!checked.ok()) return checked.status();
  if (shape.num_elements() != num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", shape_.ToString(), " to ",
                                                   shape.ToString(), ": element counts differ"));
  }
  return Tensor(dtype_, std::move(shape), data_, size_, owner_);
}

bool ElementsEqual(const Element& a, const Element& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].Equals(b[i])) return false;
  }
  return true;
}

std::string ElementDebugString(const Element& e) {
  std::string out = "(";
  for (size_t i = 0; i < e.size(); ++i) {
    if (i) absl::StrAppend(&out, ", ");
    absl::StrAppend(&out, e[i].DebugString());
  }
  absl::StrAppend(&out, ")");
  return out;
}

}  // namespace sluice
