// Tests of DType, TensorShape, Tensor, Element and the 16-bit float types.
#include "sluice/core/tensor.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/core/half.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

bool IsAligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// ---------------------------------------------------------------------------
// DType

TEST(DTypeTest, NamesRoundTripForAllDTypes) {
  ASSERT_EQ(std::size(kAllDTypes), 14u);
  std::set<std::string> names;
  std::set<uint8_t> wire;
  for (DType d : kAllDTypes) {
    const std::string name = DTypeName(d);
    ASSERT_OK_AND_ASSIGN(DType back, DTypeFromName(name));
    EXPECT_EQ(back, d) << name;
    EXPECT_NE(name, "invalid");
    EXPECT_TRUE(IsValidDType(static_cast<uint8_t>(d))) << name;
    names.insert(name);
    wire.insert(static_cast<uint8_t>(d));
  }
  EXPECT_EQ(names.size(), 14u);  // all distinct
  EXPECT_EQ(wire.size(), 14u);
}

TEST(DTypeTest, NamesAndSizes) {
  struct Case {
    DType dtype;
    const char* name;
    size_t size;
    uint8_t wire;
  };
  const Case cases[] = {
      {DType::kBool, "bool", 1, 1},         {DType::kInt8, "int8", 1, 2},
      {DType::kInt16, "int16", 2, 3},       {DType::kInt32, "int32", 4, 4},
      {DType::kInt64, "int64", 8, 5},       {DType::kUInt8, "uint8", 1, 6},
      {DType::kUInt16, "uint16", 2, 7},     {DType::kUInt32, "uint32", 4, 8},
      {DType::kUInt64, "uint64", 8, 9},     {DType::kFloat16, "float16", 2, 10},
      {DType::kBFloat16, "bfloat16", 2, 11}, {DType::kFloat32, "float32", 4, 12},
      {DType::kFloat64, "float64", 8, 13},  {DType::kString, "string", 0, 14},
  };
  for (const Case& c : cases) {
    EXPECT_STREQ(DTypeName(c.dtype), c.name);
    EXPECT_EQ(DTypeSize(c.dtype), c.size) << c.name;
    EXPECT_EQ(static_cast<uint8_t>(c.dtype), c.wire) << c.name;
  }
}

TEST(DTypeTest, InvalidWireValues) {
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(15));
  EXPECT_FALSE(IsValidDType(255));
  for (int v = 1; v <= 14; ++v) EXPECT_TRUE(IsValidDType(static_cast<uint8_t>(v)));
  EXPECT_STREQ(DTypeName(static_cast<DType>(0)), "invalid");
  EXPECT_STREQ(DTypeName(static_cast<DType>(200)), "invalid");
}

TEST(DTypeTest, FromNameRejectsUnknownNames) {
  EXPECT_STATUS(DTypeFromName("float128"), absl::StatusCode::kInvalidArgument,
                "unknown dtype 'float128'");
  EXPECT_STATUS(DTypeFromName("float128"), absl::StatusCode::kInvalidArgument,
                "expected one of bool");
  EXPECT_STATUS(DTypeFromName(""), absl::StatusCode::kInvalidArgument, "unknown dtype ''");
  // Names are exact: case and whitespace matter.
  EXPECT_STATUS(DTypeFromName("Int32"), absl::StatusCode::kInvalidArgument,
                "unknown dtype 'Int32'");
  EXPECT_STATUS(DTypeFromName("int32 "), absl::StatusCode::kInvalidArgument, "unknown dtype");
  EXPECT_STATUS(DTypeFromName("invalid"), absl::StatusCode::kInvalidArgument, "unknown dtype");
  // A name that is a prefix of a valid one is not accepted.
  EXPECT_STATUS(DTypeFromName("float"), absl::StatusCode::kInvalidArgument, "unknown dtype");
}

TEST(DTypeTest, Predicates) {
  EXPECT_FALSE(IsInteger(DType::kBool));
  EXPECT_FALSE(IsNumeric(DType::kBool));
  EXPECT_FALSE(IsNumeric(DType::kString));
  for (DType d : {DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64}) {
    EXPECT_TRUE(IsInteger(d));
    EXPECT_TRUE(IsSignedInteger(d));
    EXPECT_FALSE(IsFloat(d));
    EXPECT_TRUE(IsNumeric(d));
  }
  for (DType d : {DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64}) {
    EXPECT_TRUE(IsInteger(d));
    EXPECT_FALSE(IsSignedInteger(d));
    EXPECT_TRUE(IsNumeric(d));
  }
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    EXPECT_TRUE(IsFloat(d));
    EXPECT_FALSE(IsInteger(d));
    EXPECT_TRUE(IsNumeric(d));
  }
}

TEST(DTypeTest, DTypeOfMapsCppTypes) {
  static_assert(DTypeOf<bool>() == DType::kBool);
  static_assert(DTypeOf<int8_t>() == DType::kInt8);
  static_assert(DTypeOf<int16_t>() == DType::kInt16);
  static_assert(DTypeOf<int32_t>() == DType::kInt32);
  static_assert(DTypeOf<int64_t>() == DType::kInt64);
  static_assert(DTypeOf<long long>() == DType::kInt64);
  static_assert(DTypeOf<uint8_t>() == DType::kUInt8);
  static_assert(DTypeOf<uint16_t>() == DType::kUInt16);
  static_assert(DTypeOf<uint32_t>() == DType::kUInt32);
  static_assert(DTypeOf<uint64_t>() == DType::kUInt64);
  static_assert(DTypeOf<unsigned long long>() == DType::kUInt64);
  static_assert(DTypeOf<Float16>() == DType::kFloat16);
  static_assert(DTypeOf<BFloat16>() == DType::kBFloat16);
  static_assert(DTypeOf<float>() == DType::kFloat32);
  static_assert(DTypeOf<double>() == DType::kFloat64);
  EXPECT_EQ(DTypeSize(DTypeOf<double>()), sizeof(double));
}

// ---------------------------------------------------------------------------
// TensorShape

TEST(TensorShapeTest, Basics) {
  TensorShape scalar;
  EXPECT_TRUE(scalar.is_scalar());
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.num_elements(), 1);
  EXPECT_EQ(scalar.ToString(), "[]");

  TensorShape s({2, 3, 4});
  EXPECT_FALSE(s.is_scalar());
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.dim(2), 4);
  EXPECT_EQ(s.num_elements(), 24);
  EXPECT_EQ(s.ToString(), "[2,3,4]");
  EXPECT_THAT(s.dims(), ElementsAre(2, 3, 4));

  EXPECT_EQ(TensorShape({0}).num_elements(), 0);
  EXPECT_EQ(TensorShape({5, 0, 7}).num_elements(), 0);
  EXPECT_EQ(TensorShape({0}).ToString(), "[0]");

  EXPECT_EQ(TensorShape({2, 3}), TensorShape(std::vector<int64_t>{2, 3}));
  EXPECT_NE(TensorShape({2, 3}), TensorShape({3, 2}));
  EXPECT_NE(TensorShape({6}), TensorShape({6, 1}));
  EXPECT_NE(TensorShape(), TensorShape({1}));
}

TEST(TensorShapeTest, MakeAcceptsValidShapes) {
  ASSERT_OK_AND_ASSIGN(TensorShape s, TensorShape::Make({2, 3}));
  EXPECT_EQ(s, TensorShape({2, 3}));
  ASSERT_OK_AND_ASSIGN(TensorShape scalar, TensorShape::Make({}));
  EXPECT_TRUE(scalar.is_scalar());
  EXPECT_OK(TensorShape::Make({0}));
  EXPECT_OK(TensorShape::Make({kInt64Max}));
  EXPECT_OK(TensorShape::Make({kInt64Max, 1}));
  EXPECT_OK(TensorShape::Make({int64_t{1} << 31, int64_t{1} << 31}));  // 2^62 fits
  // A zero dimension first makes the count 0 whatever follows.
  ASSERT_OK_AND_ASSIGN(TensorShape z, TensorShape::Make({0, kInt64Max, kInt64Max}));
  EXPECT_EQ(z.num_elements(), 0);
}

TEST(TensorShapeTest, MakeRejectsNegativeDimensions) {
  EXPECT_STATUS(TensorShape::Make({-1}), absl::StatusCode::kInvalidArgument,
                "negative dimension");
  EXPECT_STATUS(TensorShape::Make({2, -3}), absl::StatusCode::kInvalidArgument,
                "shape [2,-3] has a negative dimension");
  // Two negative dims have a positive product: still rejected.
  EXPECT_STATUS(TensorShape::Make({-2, -3}), absl::StatusCode::kInvalidArgument,
                "negative dimension");
  EXPECT_STATUS(TensorShape::Make({0, -1}), absl::StatusCode::kInvalidArgument,
                "negative dimension");
  EXPECT_STATUS(TensorShape::Make({std::numeric_limits<int64_t>::min()}),
                absl::StatusCode::kInvalidArgument, "negative dimension");
}

TEST(TensorShapeTest, MakeRejectsOverflow) {
  EXPECT_STATUS(TensorShape::Make({int64_t{1} << 32, int64_t{1} << 32}),
                absl::StatusCode::kInvalidArgument, "too many elements");
  EXPECT_STATUS(TensorShape::Make({kInt64Max, 2}), absl::StatusCode::kInvalidArgument,
                "too many elements");
  EXPECT_STATUS(TensorShape::Make({3, int64_t{1} << 62}), absl::StatusCode::kInvalidArgument,
                "too many elements");
  // Overflow part-way through is rejected even if the full product would wrap
  // to a small number.
  EXPECT_STATUS(TensorShape::Make({int64_t{1} << 32, int64_t{1} << 32, 2}),
                absl::StatusCode::kInvalidArgument, "too many elements");
  std::vector<int64_t> many(64, 2);  // 2^64
  EXPECT_STATUS(TensorShape::Make(many), absl::StatusCode::kInvalidArgument,
                "too many elements");
  many.pop_back();  // 2^63: still one past int64 max
  EXPECT_STATUS(TensorShape::Make(many), absl::StatusCode::kInvalidArgument,
                "too many elements");
  many.pop_back();  // 2^62 fits
  EXPECT_OK(TensorShape::Make(many));
}

// ---------------------------------------------------------------------------
// Tensor::Allocate

TEST(TensorAllocateTest, ZeroedAlignedForEveryNumericDType) {
  for (DType d : kAllDTypes) {
    if (d == DType::kString) continue;
    ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Allocate(d, TensorShape({3, 5})));
    EXPECT_TRUE(t.valid());
    EXPECT_EQ(t.dtype(), d);
    EXPECT_EQ(t.shape(), TensorShape({3, 5}));
    EXPECT_EQ(t.num_elements(), 15);
    EXPECT_EQ(t.byte_size(), 15 * DTypeSize(d)) << DTypeName(d);
    ASSERT_NE(t.data(), nullptr);
    EXPECT_TRUE(IsAligned64(t.data())) << DTypeName(d);
    EXPECT_NE(t.owner(), nullptr);
    for (size_t i = 0; i < t.byte_size(); ++i) ASSERT_EQ(t.data()[i], 0) << DTypeName(d);
  }
}

TEST(TensorAllocateTest, ScalarAndEmpty) {
  ASSERT_OK_AND_ASSIGN(Tensor s, Tensor::Allocate(DType::kFloat64, TensorShape()));
  EXPECT_EQ(s.byte_size(), 8u);
  EXPECT_EQ(s.num_elements(), 1);
  EXPECT_EQ(s.at<double>(0), 0.0);

  ASSERT_OK_AND_ASSIGN(Tensor e, Tensor::Allocate(DType::kInt32, TensorShape({0})));
  EXPECT_TRUE(e.valid());
  EXPECT_EQ(e.byte_size(), 0u);
  EXPECT_EQ(e.num_elements(), 0);
  EXPECT_TRUE(IsAligned64(e.data()));
  EXPECT_TRUE(e.values<int32_t>().empty());
}

TEST(TensorAllocateTest, MutableDataAndIndependentStorage) {
  ASSERT_OK_AND_ASSIGN(Tensor a, Tensor::Allocate(DType::kInt32, TensorShape({4})));
  ASSERT_OK_AND_ASSIGN(Tensor b, Tensor::Allocate(DType::kInt32, TensorShape({4})));
  EXPECT_NE(a.data(), b.data());
  int32_t v = 42;
  std::memcpy(a.mutable_data() + 8, &v, 4);
  EXPECT_EQ(a.at<int32_t>(2), 42);
  EXPECT_EQ(b.at<int32_t>(2), 0);
  // A copy of a Tensor is a view of the same bytes.
  Tensor c = a;
  EXPECT_EQ(c.data(), a.data());
  EXPECT_EQ(c.owner(), a.owner());
  EXPECT_EQ(c.at<int32_t>(2), 42);
}

TEST(TensorAllocateTest, RejectsStringDType) {
  EXPECT_STATUS(Tensor::Allocate(DType::kString, TensorShape({2})),
                absl::StatusCode::kInvalidArgument, "cannot allocate a string tensor");
}

TEST(TensorAllocateTest, RejectsBadShapes) {
  EXPECT_STATUS(Tensor::Allocate(DType::kInt32, TensorShape({2, -1})),
                absl::StatusCode::kInvalidArgument, "negative dimension");
  EXPECT_STATUS(Tensor::Allocate(DType::kInt32, TensorShape({-2, -2})),
                absl::StatusCode::kInvalidArgument, "negative dimension");
  EXPECT_STATUS(Tensor::Allocate(DType::kInt32, TensorShape({int64_t{1} << 40, int64_t{1} << 40})),
                absl::StatusCode::kInvalidArgument, "too many elements");
  // A valid shape whose byte count cannot be addressed.
  EXPECT_STATUS(Tensor::Allocate(DType::kFloat64, TensorShape({kInt64Max / 2})),
                absl::StatusCode::kResourceExhausted, "too large");
}

TEST(TensorTest, DefaultIsInvalid) {
  Tensor t;
  EXPECT_FALSE(t.valid());
  EXPECT_EQ(t.byte_size(), 0u);
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(t.owner(), nullptr);
}

// ---------------------------------------------------------------------------
// Tensor::View

TEST(TensorViewTest, SeesExternalMemoryWithoutCopyAndKeepsOwnerAlive) {
  bool deleted = false;
  auto* storage = new std::vector<float>{1, 2, 3, 4, 5, 6};
  float* raw = storage->data();
  std::shared_ptr<const void> owner(storage, [&deleted](std::vector<float>* p) {
    deleted = true;
    delete p;
  });
  std::optional<Tensor> survivor;
  {
    ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::View(DType::kFloat32, TensorShape({2, 3}), raw,
                                                6 * sizeof(float), owner));
    owner.reset();
    EXPECT_FALSE(deleted) << "the view must keep its owner alive";
    EXPECT_EQ(t.data(), reinterpret_cast<const uint8_t*>(raw)) << "View must not copy";
    EXPECT_EQ(t.byte_size(), 24u);
    EXPECT_THAT(t.values<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
    // Writes to the external memory are visible through the view.
    raw[4] = 50.0f;
    EXPECT_EQ(t.at<float>(4), 50.0f);

    Tensor copy = t;
    ASSERT_OK_AND_ASSIGN(Tensor reshaped, t.Reshape(TensorShape({6})));
    EXPECT_EQ(reshaped.data(), t.data());
    survivor = reshaped;
  }
  // Only `survivor` (a reshape of the view) is left.
  EXPECT_FALSE(deleted);
  EXPECT_EQ(survivor->at<float>(4), 50.0f);
  survivor.reset();
  EXPECT_TRUE(deleted) << "the owner must be released after the last view dies";
}

TEST(TensorViewTest, NullOwnerIsAllowed) {
  static const int64_t kData[3] = {7, 8, 9};
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::View(DType::kInt64, TensorShape({3}), kData, sizeof(kData),
                                    nullptr));
  EXPECT_EQ(t.data(), reinterpret_cast<const uint8_t*>(kData));
  EXPECT_EQ(t.owner(), nullptr);
  EXPECT_THAT(t.values<int64_t>(), ElementsAre(7, 8, 9));
}

TEST(TensorViewTest, SizeMismatchIsInvalidArgument) {
  std::vector<float> v(6);
  EXPECT_STATUS(Tensor::View(DType::kFloat32, TensorShape({2, 3}), v.data(), 20, nullptr),
                absl::StatusCode::kInvalidArgument, "needs 24 bytes; 20 given");
  EXPECT_STATUS(Tensor::View(DType::kFloat32, TensorShape({2, 3}), v.data(), 25, nullptr),
                absl::StatusCode::kInvalidArgument, "needs 24 bytes; 25 given");
  EXPECT_STATUS(Tensor::View(DType::kFloat64, TensorShape(), v.data(), 4, nullptr),
                absl::StatusCode::kInvalidArgument, "float64 tensor of shape []");
  EXPECT_STATUS(Tensor::View(DType::kInt16, TensorShape({0}), v.data(), 2, nullptr),
                absl::StatusCode::kInvalidArgument, "needs 0 bytes");
  // A huge element count whose byte count would overflow is a mismatch, not a crash.
  EXPECT_STATUS(Tensor::View(DType::kFloat64, TensorShape({kInt64Max}), v.data(), 24, nullptr),
                absl::StatusCode::kInvalidArgument, "given");
}

TEST(TensorViewTest, RejectsBadShapesAndNullData) {
  std::vector<int32_t> v(4);
  EXPECT_STATUS(Tensor::View(DType::kInt32, TensorShape({-2, -2}), v.data(), 16, nullptr),
                absl::StatusCode::kInvalidArgument, "negative dimension");
  EXPECT_STATUS(Tensor::View(DType::kInt32, TensorShape({4}), nullptr, 16, nullptr),
                absl::StatusCode::kInvalidArgument, "null data");
  // Null data with no bytes is a valid empty tensor.
  ASSERT_OK_AND_ASSIGN(Tensor e,
                       Tensor::View(DType::kInt32, TensorShape({0, 3}), nullptr, 0, nullptr));
  EXPECT_EQ(e.num_elements(), 0);
  EXPECT_EQ(e.byte_size(), 0u);
}

// ---------------------------------------------------------------------------
// String tensors

// Builds the string storage layout by hand: uint64 offsets, then bytes.
std::vector<uint8_t> StringStorage(const std::vector<uint64_t>& offsets, std::string_view bytes) {
  std::vector<uint8_t> out(offsets.size() * 8 + bytes.size());
  for (size_t i = 0; i < offsets.size(); ++i) std::memcpy(out.data() + i * 8, &offsets[i], 8);
  if (!bytes.empty()) std::memcpy(out.data() + offsets.size() * 8, bytes.data(), bytes.size());
  return out;
}

TEST(StringTensorTest, StringsBasics) {
  Tensor t = Tensor::Strings({"a", "", "hello"});
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.dtype(), DType::kString);
  EXPECT_EQ(t.shape(), TensorShape({3}));
  EXPECT_EQ(t.str(0), "a");
  EXPECT_EQ(t.str(1), "");
  EXPECT_EQ(t.str(2), "hello");
  EXPECT_EQ(t.byte_size(), 4 * 8 + 6u);
  EXPECT_TRUE(IsAligned64(t.data()));
  // The storage is exactly the documented layout.
  EXPECT_EQ(std::vector<uint8_t>(t.data(), t.data() + t.byte_size()),
            StringStorage({0, 1, 1, 6}, "ahello"));
}

TEST(StringTensorTest, ShapedStrings) {
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Strings({"w", "x", "yy", "zzz"}, TensorShape({2, 2})));
  EXPECT_EQ(t.shape(), TensorShape({2, 2}));
  EXPECT_EQ(t.str(3), "zzz");
  EXPECT_STATUS(Tensor::Strings({"a", "b", "c"}, TensorShape({2, 2})),
                absl::StatusCode::kInvalidArgument, "holds 4 strings but 3 were given");
  EXPECT_STATUS(Tensor::Strings({"a"}, TensorShape({-1, -1})), absl::StatusCode::kInvalidArgument,
                "negative dimension");
}

TEST(StringTensorTest, ScalarAndEmptyStrings) {
  Tensor s = Tensor::String("xyz");
  EXPECT_TRUE(s.shape().is_scalar());
  EXPECT_EQ(s.num_elements(), 1);
  EXPECT_EQ(s.str(0), "xyz");

  Tensor e = Tensor::String("");
  EXPECT_EQ(e.str(0), "");
  EXPECT_EQ(e.byte_size(), 16u);

  Tensor none = Tensor::Strings({});
  EXPECT_EQ(none.shape(), TensorShape({0}));
  EXPECT_EQ(none.num_elements(), 0);
  EXPECT_EQ(none.byte_size(), 8u);

  Tensor all_empty = Tensor::Strings({"", "", ""});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(all_empty.str(i), "");
  EXPECT_EQ(all_empty.byte_size(), 32u);
}

TEST(StringTensorTest, BinaryContentAndCopySemantics) {
  std::string bin("a\0b\xff", 4);
  std::vector<std::string> src = {bin, "tail"};
  Tensor t = Tensor::Strings(src);
  src[0][0] = 'Z';  // the tensor holds its own copy
  EXPECT_EQ(t.str(0), bin);
  EXPECT_EQ(t.str(0).size(), 4u);
  EXPECT_EQ(t.str(1), "tail");
}

TEST(StringTensorTest, MakeStringTensorFromViews) {
  std::string backing = "hello world";
  std::vector<std::string_view> parts = {std::string_view(backing).substr(0, 5),
                                         std::string_view(backing).substr(6)};
  ASSERT_OK_AND_ASSIGN(Tensor t, MakeStringTensor(parts, TensorShape({2, 1})));
  EXPECT_EQ(t.str(0), "hello");
  EXPECT_EQ(t.str(1), "world");
  EXPECT_STATUS(MakeStringTensor(parts, TensorShape({3})), absl::StatusCode::kInvalidArgument,
                "holds 3 strings but 2");
}

TEST(StringTensorTest, ViewOfValidLayout) {
  std::vector<uint8_t> buf = StringStorage({0, 1, 3, 3}, "abc");
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::View(DType::kString, TensorShape({3}), buf.data(), buf.size(),
                                    nullptr));
  EXPECT_EQ(t.data(), buf.data());
  EXPECT_EQ(t.str(0), "a");
  EXPECT_EQ(t.str(1), "bc");
  EXPECT_EQ(t.str(2), "");
  EXPECT_TRUE(t.Equals(Tensor::Strings({"a", "bc", ""})));
}

TEST(StringTensorTest, ViewRejectsNonZeroFirstOffset) {
  std::vector<uint8_t> buf = StringStorage({1, 2, 3}, "abc");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({2}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "string tensor offset 0 = 1");
}

TEST(StringTensorTest, ViewRejectsDecreasingOffsets) {
  std::vector<uint8_t> buf = StringStorage({0, 2, 1, 3}, "abc");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({3}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "string tensor offset 2 = 1 is out of order");
}

TEST(StringTensorTest, ViewRejectsOffsetBeyondBytes) {
  std::vector<uint8_t> buf = StringStorage({0, 5, 3}, "abc");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({2}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "beyond 3 bytes");
  buf = StringStorage({0, ~uint64_t{0}, 3}, "abc");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({2}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "string tensor offset 1");
}

TEST(StringTensorTest, ViewRejectsLastOffsetNotByteCount) {
  std::vector<uint8_t> buf = StringStorage({0, 1, 2}, "abc");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({2}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "last offset 2 != size of its bytes 3");
  // Empty tensor: the single offset must equal the (empty) byte region... and
  // extra trailing bytes are not allowed.
  buf = StringStorage({0}, "x");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({0}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "last offset 0 != size of its bytes 1");
}

TEST(StringTensorTest, ViewRejectsTooFewBytes) {
  std::vector<uint8_t> buf = StringStorage({0, 1}, "");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({3}), buf.data(), buf.size(), nullptr),
                absl::StatusCode::kInvalidArgument, "needs 32 bytes of offsets; only 16");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape(), buf.data(), 7, nullptr),
                absl::StatusCode::kInvalidArgument, "needs 16 bytes of offsets; only 7");
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({0}), nullptr, 0, nullptr),
                absl::StatusCode::kInvalidArgument, "bytes of offsets");
  // A huge element count must not overflow the size computation.
  EXPECT_STATUS(Tensor::View(DType::kString, TensorShape({kInt64Max}), buf.data(), buf.size(),
                             nullptr),
                absl::StatusCode::kInvalidArgument, "bytes of offsets");
}

// ---------------------------------------------------------------------------
// FromVector, Scalar

TEST(FromVectorTest, ShapedAndUnshaped) {
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::FromVector<int32_t>({1, 2, 3, 4, 5, 6}, TensorShape({2, 3})));
  EXPECT_EQ(t.dtype(), DType::kInt32);
  EXPECT_EQ(t.shape(), TensorShape({2, 3}));
  EXPECT_EQ(t.byte_size(), 24u);
  EXPECT_TRUE(IsAligned64(t.data()));
  EXPECT_THAT(t.values<int32_t>(), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(t.at<int32_t>(5), 6);

  Tensor u = Tensor::FromVector(std::vector<double>{0.5, -1.25});
  EXPECT_EQ(u.dtype(), DType::kFloat64);
  EXPECT_EQ(u.shape(), TensorShape({2}));
  EXPECT_EQ(u.at<double>(1), -1.25);

  Tensor empty = Tensor::FromVector(std::vector<uint16_t>{});
  EXPECT_EQ(empty.shape(), TensorShape({0}));
  EXPECT_EQ(empty.byte_size(), 0u);

  Tensor s = Tensor::Scalar<int64_t>(-7);
  EXPECT_TRUE(s.shape().is_scalar());
  EXPECT_EQ(s.dtype(), DType::kInt64);
  EXPECT_EQ(s.at<int64_t>(0), -7);
}

TEST(FromVectorTest, MismatchedShapeIsAnError) {
  EXPECT_STATUS(Tensor::FromVector<int32_t>({1, 2, 3, 4, 5, 6}, TensorShape({4})),
                absl::StatusCode::kInvalidArgument, "shape [4] holds 4 elements but 6 values");
  EXPECT_STATUS(Tensor::FromVector<float>({1.0f}, TensorShape({0})),
                absl::StatusCode::kInvalidArgument, "holds 0 elements but 1");
  EXPECT_STATUS(Tensor::FromVector<float>({}, TensorShape()),
                absl::StatusCode::kInvalidArgument, "holds 1 elements but 0");
}

TEST(FromVectorTest, RejectsInvalidShapes) {
  // [-2,-3] "holds" 6 elements by naive multiplication, but is not a shape.
  EXPECT_STATUS(Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, TensorShape({-2, -3})),
                absl::StatusCode::kInvalidArgument, "negative dimension");
  // 2^32 * 2^32 overflows int64 (it would wrap to 0 and "match" no values).
  EXPECT_STATUS(Tensor::FromVector<float>({}, TensorShape({int64_t{1} << 32, int64_t{1} << 32})),
                absl::StatusCode::kInvalidArgument, "too many elements");
  EXPECT_STATUS(Tensor::Strings({}, TensorShape({int64_t{1} << 32, int64_t{1} << 32})),
                absl::StatusCode::kInvalidArgument, "too many elements");
}

TEST(FromVectorTest, BoolStoresZeroOrOne) {
  Tensor t = Tensor::FromVector(std::vector<bool>{true, false, true});
  EXPECT_EQ(t.dtype(), DType::kBool);
  EXPECT_EQ(t.byte_size(), 3u);
  EXPECT_EQ(t.data()[0], 1);
  EXPECT_EQ(t.data()[1], 0);
  EXPECT_EQ(t.data()[2], 1);
  Tensor s = Tensor::Scalar(true);
  EXPECT_EQ(s.dtype(), DType::kBool);
  EXPECT_EQ(s.data()[0], 1);
}

TEST(FromVectorTest, HalfTypes) {
  Tensor h = Tensor::FromVector(std::vector<Float16>{Float16(1.0f), Float16(-2.0f)});
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.byte_size(), 4u);
  EXPECT_EQ(h.at<Float16>(0).bits, 0x3c00);
  EXPECT_EQ(h.at<Float16>(1).bits, 0xc000);
  Tensor b = Tensor::FromVector(std::vector<BFloat16>{BFloat16(1.0f)});
  EXPECT_EQ(b.dtype(), DType::kBFloat16);
  EXPECT_EQ(b.at<BFloat16>(0).bits, 0x3f80);
}

// ---------------------------------------------------------------------------
// Reshape

TEST(ReshapeTest, SameBytesNewShape) {
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::FromVector<int16_t>({1, 2, 3, 4, 5, 6}, TensorShape({2, 3})));
  for (TensorShape s : {TensorShape({3, 2}), TensorShape({6}), TensorShape({1, 6, 1}),
                        TensorShape({2, 1, 3})}) {
    ASSERT_OK_AND_ASSIGN(Tensor r, t.Reshape(s));
    EXPECT_EQ(r.shape(), s);
    EXPECT_EQ(r.dtype(), DType::kInt16);
    EXPECT_EQ(r.data(), t.data()) << "Reshape must not copy";
    EXPECT_EQ(r.byte_size(), t.byte_size());
    EXPECT_EQ(r.owner(), t.owner());
    EXPECT_THAT(r.values<int16_t>(), ElementsAre(1, 2, 3, 4, 5, 6));
  }
  EXPECT_EQ(t.shape(), TensorShape({2, 3}));  // the original is unchanged

  Tensor scalar = Tensor::Scalar<float>(3.0f);
  ASSERT_OK_AND_ASSIGN(Tensor r1, scalar.Reshape(TensorShape({1, 1})));
  EXPECT_EQ(r1.at<float>(0), 3.0f);
  ASSERT_OK_AND_ASSIGN(Tensor back, r1.Reshape(TensorShape()));
  EXPECT_TRUE(back.shape().is_scalar());

  ASSERT_OK_AND_ASSIGN(Tensor e, Tensor::Allocate(DType::kInt8, TensorShape({0})));
  ASSERT_OK_AND_ASSIGN(Tensor e2, e.Reshape(TensorShape({5, 0, 3})));
  EXPECT_EQ(e2.num_elements(), 0);
}

TEST(ReshapeTest, StringTensor) {
  Tensor t = Tensor::Strings({"a", "bb", "ccc", "dddd"});
  ASSERT_OK_AND_ASSIGN(Tensor r, t.Reshape(TensorShape({2, 2})));
  EXPECT_EQ(r.str(2), "ccc");
  EXPECT_EQ(r.data(), t.data());
}

TEST(ReshapeTest, Errors) {
  Tensor t = Tensor::FromVector(std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  EXPECT_STATUS(t.Reshape(TensorShape({4})), absl::StatusCode::kInvalidArgument,
                "cannot reshape [6] to [4]: element counts differ");
  EXPECT_STATUS(t.Reshape(TensorShape()), absl::StatusCode::kInvalidArgument,
                "element counts differ");
  EXPECT_STATUS(t.Reshape(TensorShape({-2, -3})), absl::StatusCode::kInvalidArgument,
                "negative dimension");
  EXPECT_STATUS(t.Reshape(TensorShape({int64_t{1} << 32, int64_t{1} << 32, 6})),
                absl::StatusCode::kInvalidArgument, "too many elements");
}

// ---------------------------------------------------------------------------
// Equals, ElementsEqual

TEST(EqualsTest, ComparesDTypeShapeAndBytes) {
  Tensor a = Tensor::FromVector(std::vector<int32_t>{1, 2, 3});
  Tensor b = Tensor::FromVector(std::vector<int32_t>{1, 2, 3});
  EXPECT_NE(a.data(), b.data());
  EXPECT_TRUE(a.Equals(b));
  EXPECT_TRUE(b.Equals(a));
  EXPECT_TRUE(a.Equals(a));

  EXPECT_FALSE(a.Equals(Tensor::FromVector(std::vector<int32_t>{1, 2, 4})));
  EXPECT_FALSE(a.Equals(Tensor::FromVector(std::vector<int32_t>{1, 2})));
  // Same bytes, different dtype.
  EXPECT_FALSE(a.Equals(Tensor::FromVector(std::vector<uint32_t>{1, 2, 3})));
  // Same bytes and dtype, different shape.
  ASSERT_OK_AND_ASSIGN(Tensor a13, a.Reshape(TensorShape({1, 3})));
  EXPECT_FALSE(a.Equals(a13));

  // Invalid tensors equal only each other.
  EXPECT_TRUE(Tensor().Equals(Tensor()));
  EXPECT_FALSE(Tensor().Equals(a));
  EXPECT_FALSE(a.Equals(Tensor()));

  // Empty tensors compare by dtype and shape.
  ASSERT_OK_AND_ASSIGN(Tensor e1, Tensor::Allocate(DType::kFloat32, TensorShape({0})));
  ASSERT_OK_AND_ASSIGN(Tensor e2, Tensor::Allocate(DType::kFloat32, TensorShape({0})));
  ASSERT_OK_AND_ASSIGN(Tensor e3, Tensor::Allocate(DType::kFloat32, TensorShape({0, 2})));
  EXPECT_TRUE(e1.Equals(e2));
  EXPECT_FALSE(e1.Equals(e3));
}

TEST(EqualsTest, StringTensors) {
  EXPECT_TRUE(Tensor::Strings({"a", "bc"}).Equals(Tensor::Strings({"a", "bc"})));
  // Same concatenated bytes, different split.
  EXPECT_FALSE(Tensor::Strings({"a", "bc"}).Equals(Tensor::Strings({"ab", "c"})));
  EXPECT_FALSE(Tensor::Strings({"a"}).Equals(Tensor::String("a")));  // [1] vs []
  EXPECT_FALSE(Tensor::String("a").Equals(Tensor::String("b")));
}

TEST(EqualsTest, ElementsEqual) {
  Element a = {Tensor::Scalar<int64_t>(1), Tensor::String("x")};
  Element b = {Tensor::Scalar<int64_t>(1), Tensor::String("x")};
  EXPECT_TRUE(ElementsEqual(a, b));
  EXPECT_TRUE(ElementsEqual({}, {}));
  Element shorter = {Tensor::Scalar<int64_t>(1)};
  EXPECT_FALSE(ElementsEqual(a, shorter));
  EXPECT_FALSE(ElementsEqual(shorter, a));
  Element different = {Tensor::Scalar<int64_t>(1), Tensor::String("y")};
  EXPECT_FALSE(ElementsEqual(a, different));
}

// ---------------------------------------------------------------------------
// DebugString

TEST(DebugStringTest, Formats) {
  EXPECT_EQ(Tensor::FromVector(std::vector<int64_t>{1, 2, 3}).DebugString(), "int64[3]{1, 2, 3}");
  EXPECT_EQ(Tensor::Scalar<int32_t>(7).DebugString(), "int32[]{7}");
  EXPECT_EQ(Tensor::FromVector(std::vector<float>{1.5f, -2.0f}).DebugString(),
            "float32[2]{1.5, -2}");
  EXPECT_EQ(Tensor::FromVector(std::vector<double>{0.25}).DebugString(), "float64[1]{0.25}");
  EXPECT_EQ(Tensor::FromVector(std::vector<bool>{true, false}).DebugString(),
            "bool[2]{true, false}");
  // 8-bit integers print as numbers, not characters.
  EXPECT_EQ(Tensor::FromVector(std::vector<int8_t>{-5, 65}).DebugString(), "int8[2]{-5, 65}");
  EXPECT_EQ(Tensor::FromVector(std::vector<uint8_t>{255, 65}).DebugString(), "uint8[2]{255, 65}");
  EXPECT_EQ(Tensor::FromVector(std::vector<uint64_t>{18446744073709551615ull}).DebugString(),
            "uint64[1]{18446744073709551615}");
  EXPECT_EQ(Tensor::FromVector(std::vector<Float16>{Float16(1.0f), Float16(0.5f)}).DebugString(),
            "float16[2]{1, 0.5}");
  EXPECT_EQ(Tensor::FromVector(std::vector<BFloat16>{BFloat16(-3.0f)}).DebugString(),
            "bfloat16[1]{-3}");
  EXPECT_EQ(Tensor::Strings({"a", ""}).DebugString(), "string[2]{\"a\", \"\"}");
  EXPECT_EQ(Tensor::String("hi").DebugString(), "string[]{\"hi\"}");
  ASSERT_OK_AND_ASSIGN(Tensor m, Tensor::FromVector<int32_t>({1, 2, 3, 4}, TensorShape({2, 2})));
  EXPECT_EQ(m.DebugString(), "int32[2,2]{1, 2, 3, 4}");
  ASSERT_OK_AND_ASSIGN(Tensor e, Tensor::Allocate(DType::kFloat32, TensorShape({0})));
  EXPECT_EQ(e.DebugString(), "float32[0]{}");
  EXPECT_EQ(Tensor().DebugString(), "<invalid tensor>");
}

TEST(DebugStringTest, Truncates) {
  EXPECT_EQ(Tensor::FromVector(std::vector<int64_t>{1, 2, 3}).DebugString(2),
            "int64[3]{1, 2, ...}");
  EXPECT_EQ(Tensor::FromVector(std::vector<int64_t>{1, 2, 3}).DebugString(3), "int64[3]{1, 2, 3}");
  std::vector<int64_t> v(20);
  for (int i = 0; i < 20; ++i) v[i] = i;
  std::string s = Tensor::FromVector(v).DebugString();  // default: 16
  EXPECT_THAT(s, HasSubstr("{0, 1, 2"));
  EXPECT_THAT(s, HasSubstr("14, 15, ...}"));
  EXPECT_THAT(s, ::testing::Not(HasSubstr("16")));
  EXPECT_EQ(Tensor::Strings({"a", "b", "c"}).DebugString(1), "string[3]{\"a\", ...}");
}

TEST(DebugStringTest, NonCanonicalBoolBytes) {
  // A bool tensor viewing untrusted bytes (e.g. from a decoded frame) may hold
  // values other than 0 and 1; formatting it must not be undefined behaviour.
  static const uint8_t kBytes[3] = {0, 1, 2};
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Tensor::View(DType::kBool, TensorShape({3}), kBytes, 3, nullptr));
  EXPECT_EQ(t.DebugString(), "bool[3]{false, true, true}");
}

TEST(DebugStringTest, ElementDebugString) {
  Element e = {Tensor::Scalar<int64_t>(1), Tensor::String("x")};
  EXPECT_EQ(ElementDebugString(e), "(int64[]{1}, string[]{\"x\"})");
  EXPECT_EQ(ElementDebugString({}), "()");
}

// ---------------------------------------------------------------------------
// Float16

float F16(uint16_t bits) { return Float16::ToFloat(bits); }
uint16_t ToF16(float f) { return Float16::FromFloat(f); }
uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// Reference float -> binary16 with round-to-nearest-even, computed in double
// arithmetic (independent of the bit tricks in half.h). Not for NaN.
uint16_t ReferenceHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  // 65520 is halfway between 65504 (odd mantissa) and 2^16: ties go to inf.
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) {
    // Subnormal: units of 2^-24. q == 1024 is the smallest normal, 0x0400.
    const double q = std::nearbyint(std::ldexp(a, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  int ex;
  std::frexp(a, &ex);  // a = m * 2^ex, m in [0.5, 1)
  const int e = ex - 1;  // a in [2^e, 2^(e+1))
  const double q = std::nearbyint(std::ldexp(a, 10 - e));  // in [1024, 2048]
  return static_cast<uint16_t>(sign | (((e + 15) << 10) + (static_cast<int>(q) - 1024)));
}

bool IsHalfNan(uint16_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0; }

TEST(Float16Test, ExactValues) {
  struct Case {
    float f;
    uint16_t bits;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-1.0f, 0xbc00},
      {-2.0f, 0xc000},
      {0.5f, 0x3800},
      {1.5f, 0x3e00},
      {3.140625f, 0x4248},
      {65504.0f, 0x7bff},                 // largest finite half
      {-65504.0f, 0xfbff},
      {std::ldexp(1.0f, -14), 0x0400},    // smallest normal
      {std::ldexp(1.0f, -24), 0x0001},    // smallest subnormal
      {-std::ldexp(1.0f, -24), 0x8001},
      {1023 * std::ldexp(1.0f, -24), 0x03ff},  // largest subnormal
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ToF16(c.f), c.bits) << c.f;
    EXPECT_EQ(Bits(F16(c.bits)), Bits(c.f)) << c.f;  // exact, sign of zero included
    EXPECT_EQ(Float16(c.f).bits, c.bits);
    Float16 h;
    h.bits = c.bits;
    EXPECT_EQ(Bits(static_cast<float>(h)), Bits(c.f));
  }
  EXPECT_EQ(Float16().bits, 0);
}

TEST(Float16Test, RoundToNearestEven) {
  const float ulp1 = std::ldexp(1.0f, -10);  // half ulp at 1.0
  // Exactly halfway between 1 (even) and 1+ulp (odd): down to 1.
  EXPECT_EQ(ToF16(1.0f + ulp1 / 2), 0x3c00);
  // Halfway between 1+ulp (odd) and 1+2ulp (even): up.
  EXPECT_EQ(ToF16(1.0f + 3 * ulp1 / 2), 0x3c02);
  // Just above / below halfway.
  EXPECT_EQ(ToF16(std::nextafter(1.0f + ulp1 / 2, 2.0f)), 0x3c01);
  EXPECT_EQ(ToF16(std::nextafter(1.0f + ulp1 / 2, 0.0f)), 0x3c00);
  EXPECT_EQ(ToF16(std::nextafter(1.0f + 3 * ulp1 / 2, 0.0f)), 0x3c01);
  // Negative values round symmetrically.
  EXPECT_EQ(ToF16(-(1.0f + ulp1 / 2)), 0xbc00);
  EXPECT_EQ(ToF16(-(1.0f + 3 * ulp1 / 2)), 0xbc02);
  // A mantissa carry into the exponent: 2 - ulp/2 rounds up to 2.
  EXPECT_EQ(ToF16(2.0f - ulp1 / 4), 0x4000);
  // Subnormal ties: 2^-25 is halfway between 0 and 2^-24: to 0 (even).
  EXPECT_EQ(ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(ToF16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  // 3 * 2^-25 is halfway between 1 and 2 units: to 2 (even).
  EXPECT_EQ(ToF16(3 * std::ldexp(1.0f, -25)), 0x0002);
  // Halfway between the largest subnormal and the smallest normal: to 0x0400.
  EXPECT_EQ(ToF16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);
  // Values too small for a subnormal flush to a signed zero.
  EXPECT_EQ(ToF16(1e-10f), 0x0000);
  EXPECT_EQ(ToF16(-1e-10f), 0x8000);
  EXPECT_EQ(ToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Near the top: 65519 rounds down to 65504.
  EXPECT_EQ(ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(ToF16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
}

TEST(Float16Test, OverflowToInfinity) {
  EXPECT_EQ(ToF16(65520.0f), 0x7c00);  // halfway to 2^16, ties to even = inf
  EXPECT_EQ(ToF16(-65520.0f), 0xfc00);
  EXPECT_EQ(ToF16(65536.0f), 0x7c00);
  EXPECT_EQ(ToF16(1e6f), 0x7c00);
  EXPECT_EQ(ToF16(-1e6f), 0xfc00);
  EXPECT_EQ(ToF16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(ToF16(std::numeric_limits<float>::lowest()), 0xfc00);
  EXPECT_TRUE(std::isinf(F16(0x7c00)));
  EXPECT_GT(F16(0x7c00), 0.0f);
  EXPECT_LT(F16(0xfc00), 0.0f);
}

TEST(Float16Test, NanStaysNan) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsHalfNan(ToF16(qnan)));
  EXPECT_TRUE(IsHalfNan(ToF16(-qnan)));
  EXPECT_EQ(ToF16(-qnan) & 0x8000, 0x8000);  // sign kept
  // Signalling NaN whose payload lives only in the low mantissa bits (which a
  // naive truncation would turn into infinity).
  EXPECT_TRUE(IsHalfNan(ToF16(FromBits(0x7f800001u))));
  EXPECT_TRUE(IsHalfNan(ToF16(FromBits(0xff800001u))));
  EXPECT_TRUE(IsHalfNan(ToF16(FromBits(0x7fffffffu))));
  EXPECT_TRUE(std::isnan(F16(0x7e00)));
  EXPECT_TRUE(std::isnan(F16(0x7c01)));
  EXPECT_TRUE(std::isnan(F16(0xfc01)));
  EXPECT_TRUE(std::isnan(static_cast<float>(Float16(qnan))));
}

TEST(Float16Test, ToFloatOfEveryBitPatternIsExact) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = F16(h);
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t mant = h & 0x3ff;
    const bool neg = (h & 0x8000) != 0;
    if (exp == 0x1f) {
      if (mant == 0) {
        ASSERT_TRUE(std::isinf(f)) << std::hex << b;
      } else {
        ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      }
      ASSERT_EQ(std::signbit(f), neg) << std::hex << b;
      continue;
    }
    double expect = exp == 0 ? std::ldexp(static_cast<double>(mant), -24)
                             : std::ldexp(static_cast<double>(1024 + mant),
                                          static_cast<int>(exp) - 25);
    if (neg) expect = -expect;
    ASSERT_EQ(static_cast<double>(f), expect) << std::hex << b;
    ASSERT_EQ(std::signbit(f), neg) << std::hex << b;
  }
}

TEST(Float16Test, EveryBitPatternRoundTrips) {
  int nans = 0;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = F16(h);
    if (IsHalfNan(h)) {
      ++nans;
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(IsHalfNan(ToF16(f))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(ToF16(f), h) << std::hex << b << " -> " << f;
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Float16Test, OrderedLikeTheirValues) {
  // Ascending positive bit patterns are ascending values (so the conversions
  // preserve order).
  for (uint16_t b = 0; b < 0x7c00; ++b) ASSERT_LT(F16(b), F16(b + 1)) << std::hex << b;
}

TEST(Float16Test, EveryMidpointRoundsToEven) {
  // For every pair of adjacent positive finite halves (and the last finite one
  // with the overflow point 2^16), the midpoint goes to the even pattern and
  // the floats just either side of it go to the nearer neighbour.
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const float lo = F16(static_cast<uint16_t>(b));
    const float hi = b + 1 == 0x7c00 ? 65536.0f : F16(static_cast<uint16_t>(b + 1));
    const float mid = (lo + hi) / 2;  // exact: needs 12 significant bits
    ASSERT_GT(mid, lo);
    ASSERT_LT(mid, hi);
    const uint16_t even = static_cast<uint16_t>(b % 2 == 0 ? b : b + 1);
    ASSERT_EQ(ToF16(mid), even) << std::hex << b;
    ASSERT_EQ(ToF16(-mid), even | 0x8000) << std::hex << b;
    ASSERT_EQ(ToF16(std::nextafter(mid, 0.0f)), b) << std::hex << b;
    ASSERT_EQ(ToF16(std::nextafter(mid, 1e30f)), b + 1) << std::hex << b;
  }
}

TEST(Float16Test, MatchesReferenceOnRandomFloats) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<int> exponent(127 - 30, 127 + 17);  // around the half range
  for (int i = 0; i < 200000; ++i) {
    uint32_t x;
    if (i % 2 == 0) {
      x = any(rng);
    } else {
      x = (any(rng) & 0x807fffffu) | (static_cast<uint32_t>(exponent(rng)) << 23);
    }
    const float f = FromBits(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(ToF16(f), ReferenceHalf(f)) << std::hex << x << " " << f;
  }
}

// ---------------------------------------------------------------------------
// BFloat16

float BF(uint16_t bits) { return BFloat16::ToFloat(bits); }
uint16_t ToBF(float f) { return BFloat16::FromFloat(f); }
bool IsBFloatNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Reference float -> bfloat16, round-to-nearest-even in double arithmetic.
uint16_t ReferenceBFloat16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isinf(f)) return sign | 0x7f80;
  const double a = std::fabs(static_cast<double>(f));
  if (a < std::ldexp(1.0, -126)) {  // subnormal: units of 2^-133
    const double q = std::nearbyint(std::ldexp(a, 133));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  int ex;
  std::frexp(a, &ex);
  const int e = ex - 1;
  const double q = std::nearbyint(std::ldexp(a, 7 - e));  // in [128, 256]
  // q == 256 at e == 127 yields 0x7f80: overflow to infinity.
  return static_cast<uint16_t>(sign | (((e + 127) << 7) + (static_cast<int>(q) - 128)));
}

TEST(BFloat16Test, ExactValues) {
  struct Case {
    float f;
    uint16_t bits;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3f80},
      {-2.0f, 0xc000},
      {0.5f, 0x3f00},
      {3.140625f, 0x4049},
      {FromBits(0x7f7f0000u), 0x7f7f},  // largest finite bfloat16
      {std::numeric_limits<float>::min(), 0x0080},
      {std::numeric_limits<float>::infinity(), 0x7f80},
      {-std::numeric_limits<float>::infinity(), 0xff80},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ToBF(c.f), c.bits) << c.f;
    EXPECT_EQ(Bits(BF(c.bits)), Bits(c.f)) << c.f;
    EXPECT_EQ(BFloat16(c.f).bits, c.bits);
    BFloat16 b;
    b.bits = c.bits;
    EXPECT_EQ(Bits(static_cast<float>(b)), Bits(c.f));
  }
}

TEST(BFloat16Test, RoundToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);  // bfloat16 ulp at 1.0
  EXPECT_EQ(ToBF(1.0f + ulp / 2), 0x3f80);       // tie, even below
  EXPECT_EQ(ToBF(1.0f + 3 * ulp / 2), 0x3f82);   // tie, even above
  EXPECT_EQ(ToBF(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3f81);
  EXPECT_EQ(ToBF(std::nextafter(1.0f + ulp / 2, 0.0f)), 0x3f80);
  EXPECT_EQ(ToBF(-(1.0f + 3 * ulp / 2)), 0xbf82);
  EXPECT_EQ(ToBF(2.0f - ulp / 4), 0x4000);       // carry into the exponent
  EXPECT_EQ(ToBF(FromBits(0x00008000u)), 0x0000);  // subnormal tie to even (0)
  EXPECT_EQ(ToBF(FromBits(0x00018000u)), 0x0002);  // subnormal tie to even (2)
  EXPECT_EQ(ToBF(FromBits(0x00008001u)), 0x0001);
}

TEST(BFloat16Test, OverflowToInfinity) {
  EXPECT_EQ(ToBF(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(ToBF(std::numeric_limits<float>::lowest()), 0xff80);
  EXPECT_EQ(ToBF(FromBits(0x7f7f8000u)), 0x7f80);  // tie above the largest (odd) finite
  EXPECT_EQ(ToBF(FromBits(0x7f7f7fffu)), 0x7f7f);
}

TEST(BFloat16Test, NanStaysNan) {
  EXPECT_TRUE(IsBFloatNan(ToBF(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload is only in the low 16 bits must not become infinity.
  EXPECT_TRUE(IsBFloatNan(ToBF(FromBits(0x7f800001u))));
  EXPECT_TRUE(IsBFloatNan(ToBF(FromBits(0xff800001u))));
  EXPECT_EQ(ToBF(FromBits(0xff800001u)) & 0x8000, 0x8000);
  EXPECT_TRUE(IsBFloatNan(ToBF(FromBits(0x7fffffffu))));  // must not wrap to 0x8000
  EXPECT_TRUE(std::isnan(BF(0x7fc0)));
  EXPECT_TRUE(std::isnan(BF(0x7f81)));
}

TEST(BFloat16Test, EveryBitPatternRoundTrips) {
  int nans = 0;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = BF(h);
    ASSERT_EQ(Bits(f), b << 16) << std::hex << b;
    if (IsBFloatNan(h)) {
      ++nans;
      ASSERT_TRUE(std::isnan(f));
      ASSERT_TRUE(IsBFloatNan(ToBF(f))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(ToBF(f), h) << std::hex << b;
  }
  EXPECT_EQ(nans, 2 * 127);
}

TEST(BFloat16Test, EveryMidpointRoundsToEven) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    // The float halfway between bfloat16 b and b + 1 (for b = 0x7f7f, the
    // halfway point to the overflow threshold 2^128).
    const float mid = FromBits((b << 16) | 0x8000u);
    const uint16_t even = static_cast<uint16_t>(b % 2 == 0 ? b : b + 1);
    ASSERT_EQ(ToBF(mid), even) << std::hex << b;
    ASSERT_EQ(ToBF(-mid), even | 0x8000) << std::hex << b;
    ASSERT_EQ(ToBF(FromBits((b << 16) | 0x7fffu)), b) << std::hex << b;
    ASSERT_EQ(ToBF(FromBits((b << 16) | 0x8001u)), b + 1) << std::hex << b;
  }
}

TEST(BFloat16Test, MatchesReferenceOnRandomFloats) {
  std::mt19937 rng(4321);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float f = FromBits(any(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(ToBF(f), ReferenceBFloat16(f)) << std::hex << Bits(f) << " " << f;
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Large blocks are recycled (outside sanitizer builds), and a recycled
// block asked for zeroed is zeroed again.
TEST(AllocateAlignedTest, LargeBlocksAreRecycledAndZeroedOnRequest) {
  const size_t n = 3 * kRecycledBlockBytes + 100;
  uint8_t* first;
  {
    std::shared_ptr<uint8_t> a = AllocateAligned(n, /*zeroed=*/false);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);
    std::memset(a.get(), 0xff, n);
    first = a.get();
  }
  std::shared_ptr<uint8_t> b = AllocateAligned(n);
  ASSERT_NE(b, nullptr);
  for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(b.get()[i], 0) << i;
  ASSERT_EQ(b.get()[n - 1], 0);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_EQ(b.get(), first);
#else
  (void)first;
#endif
  // Small blocks are plain allocations, zeroed by default.
  std::shared_ptr<uint8_t> small = AllocateAligned(100);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(small.get()[i], 0);
}

}  // namespace
}  // namespace sluice
