// Tests of expression functions (sluice::expr): every numeric dtype path of
// arithmetic, comparisons, min/max, neg/abs and casts, on scalars and on
// vectors with scalar broadcasting, with weak literals and strong constants;
// bool logic; integer wrap-around, truncating division and division by zero;
// float fmod and division by zero; saturating casts; type errors at
// definition time; tuple outputs and zero-copy pass-through; element spec
// inference; serialization and fingerprints. Then whole tensors through the
// vectorized, block-fused evaluator against a scalar reference: every op and
// cast on every dtype, broadcast both ways, at sizes around the block size.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "sluice/core/half.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/expr_kernels_internal.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice {
namespace {

using ::sluice_test::Collect;
using ::sluice_test::CollectScalars;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using expr::Expr;
using expr::x;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// ---------------------------------------------------------------------------
// Typed helpers
// ---------------------------------------------------------------------------

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;
template <typename T>
constexpr bool kIsFloat = kIsHalf<T> || std::is_floating_point_v<T>;
template <typename T>
constexpr bool kIsSigned = kIsFloat<T> || std::is_signed_v<T>;

// The type values of T are compared in: float for the 16-bit floats, T itself
// otherwise.
template <typename T>
using Cmp = std::conditional_t<kIsHalf<T>, float, T>;

template <typename T>
Cmp<T> ToCmp(T v) {
  return static_cast<Cmp<T>>(v);
}
template <typename T>
T FromCmp(Cmp<T> v) {
  if constexpr (kIsHalf<T>) {
    return T(v);
  } else {
    return v;
  }
}

// Rounds a value computed in C++ to T (wrapping for integers, as C++20
// conversions do) and returns it as Cmp<T>.
template <typename T, typename V>
Cmp<T> R(V v) {
  if constexpr (kIsHalf<T>) {
    return static_cast<float>(T(static_cast<float>(v)));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
std::vector<Cmp<T>> Cmps(std::initializer_list<double> vs) {
  std::vector<Cmp<T>> out;
  for (double v : vs) out.push_back(static_cast<Cmp<T>>(v));
  return out;
}

template <typename T>
Tensor TensorOf(const std::vector<Cmp<T>>& vs) {
  std::vector<T> t;
  for (Cmp<T> v : vs) t.push_back(FromCmp<T>(v));
  return Tensor::FromVector<T>(t);
}

template <typename T>
Tensor ScalarOf(Cmp<T> v) {
  return Tensor::Scalar<T>(FromCmp<T>(v));
}

template <typename T>
std::vector<Cmp<T>> ValuesOf(const Tensor& t) {
  std::vector<Cmp<T>> out;
  for (T v : t.values<T>()) out.push_back(ToCmp<T>(v));
  return out;
}

// Calls f.template operator()<U>() with the C++ type of a non-string dtype.
template <typename F>
void VisitType(DType d, F&& f) {
  switch (d) {
    case DType::kBool: f.template operator()<bool>(); return;
    case DType::kInt8: f.template operator()<int8_t>(); return;
    case DType::kInt16: f.template operator()<int16_t>(); return;
    case DType::kInt32: f.template operator()<int32_t>(); return;
    case DType::kInt64: f.template operator()<int64_t>(); return;
    case DType::kUInt8: f.template operator()<uint8_t>(); return;
    case DType::kUInt16: f.template operator()<uint16_t>(); return;
    case DType::kUInt32: f.template operator()<uint32_t>(); return;
    case DType::kUInt64: f.template operator()<uint64_t>(); return;
    case DType::kFloat16: f.template operator()<Float16>(); return;
    case DType::kBFloat16: f.template operator()<BFloat16>(); return;
    case DType::kFloat32: f.template operator()<float>(); return;
    case DType::kFloat64: f.template operator()<double>(); return;
    case DType::kString: break;
  }
  ADD_FAILURE() << "VisitType: unexpected dtype " << DTypeName(d);
}

// What `fn` produced on one element made of the input columns as vectors
// (`vec`, `vec_spec`), and on n elements made of the columns' scalars
// (`scalars[k][i]` is output k of element i).
struct Outputs {
  int64_t n = 0;
  std::vector<Tensor> vec;
  ElementSpec vec_spec;
  std::vector<std::vector<Tensor>> scalars;
  ElementSpec scalar_spec;
};

template <typename T>
absl::StatusOr<Outputs> RunColumns(const std::vector<std::vector<Cmp<T>>>& cols,
                                   const Function& fn) {
  Outputs o;
  o.n = static_cast<int64_t>(cols.at(0).size());
  Element in;
  for (const auto& c : cols) in.push_back(TensorOf<T>(c));
  Dataset vds = Dataset::FromTensors({in}).Map(fn);
  if (!vds.status().ok()) return vds.status();
  o.vec_spec = vds.element_spec();
  auto vout = Collect(vds);
  if (!vout.ok()) return vout.status();
  if (vout->size() != 1) return absl::InternalError("vector mode: expected one element");
  o.vec = (*vout)[0];

  std::vector<Element> elements;
  for (int64_t i = 0; i < o.n; ++i) {
    Element e;
    for (const auto& c : cols) e.push_back(ScalarOf<T>(c[i]));
    elements.push_back(std::move(e));
  }
  Dataset sds = Dataset::FromTensors(elements).Map(fn);
  if (!sds.status().ok()) return sds.status();
  o.scalar_spec = sds.element_spec();
  auto sout = Collect(sds);
  if (!sout.ok()) return sout.status();
  if (static_cast<int64_t>(sout->size()) != o.n) {
    return absl::InternalError("scalar mode: wrong element count");
  }
  o.scalars.assign(o.vec.size(), {});
  for (const Element& e : *sout) {
    if (e.size() != o.vec.size()) return absl::InternalError("scalar mode: wrong arity");
    for (size_t k = 0; k < e.size(); ++k) o.scalars[k].push_back(e[k]);
  }
  return o;
}

// Output k must be a U vector (and U scalars) holding `want`, and the
// inferred specs must say so.
template <typename U>
void ExpectColumn(const Outputs& o, size_t k, const std::vector<Cmp<U>>& want,
                  const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_LT(k, o.vec.size());
  ASSERT_EQ(static_cast<int64_t>(want.size()), o.n);
  const std::vector<int64_t> vshape = {o.n};
  // Vector mode.
  const Tensor& t = o.vec[k];
  ASSERT_TRUE(t.valid());
  EXPECT_EQ(DTypeName(t.dtype()), std::string(DTypeName(DTypeOf<U>())));
  EXPECT_EQ(t.shape().dims(), vshape);
  if (t.dtype() == DTypeOf<U>() && t.shape().dims() == vshape) {
    EXPECT_EQ(ValuesOf<U>(t), want) << "vector mode";
  }
  ASSERT_LT(k, o.vec_spec.components.size());
  EXPECT_EQ(o.vec_spec.components[k].ToString(),
            (ComponentSpec{DTypeOf<U>(), vshape}.ToString()));
  // Scalar mode.
  ASSERT_LT(k, o.scalars.size());
  std::vector<Cmp<U>> got;
  for (const Tensor& s : o.scalars[k]) {
    ASSERT_EQ(DTypeName(s.dtype()), std::string(DTypeName(DTypeOf<U>())));
    ASSERT_TRUE(s.shape().is_scalar()) << s.DebugString();
    got.push_back(ToCmp<U>(s.at<U>(0)));
  }
  EXPECT_EQ(got, want) << "scalar mode";
  ASSERT_LT(k, o.scalar_spec.components.size());
  EXPECT_EQ(o.scalar_spec.components[k].ToString(),
            (ComponentSpec{DTypeOf<U>(), std::vector<int64_t>{}}.ToString()));
}

template <typename T>
Dataset Scalars(const std::vector<T>& vs) {
  std::vector<Element> e;
  for (T v : vs) e.push_back({Tensor::Scalar<T>(v)});
  return Dataset::FromTensors(std::move(e));
}

template <typename T>
Dataset ScalarPairs(const std::vector<std::pair<T, T>>& vs) {
  std::vector<Element> e;
  for (const auto& [a, b] : vs) e.push_back({Tensor::Scalar<T>(a), Tensor::Scalar<T>(b)});
  return Dataset::FromTensors(std::move(e));
}

// The single element `fn` maps `in` to.
absl::StatusOr<Element> MapOne(const Element& in, const Function& fn) {
  Dataset ds = Dataset::FromTensors({in}).Map(fn);
  if (!ds.status().ok()) return ds.status();
  auto out = Collect(ds);
  if (!out.ok()) return out.status();
  if (out->size() != 1) return absl::InternalError("expected one element");
  return (*out)[0];
}

// Values of a numeric test-case: pairs (a[i], b[i]) with b[i] != 0, chosen
// so that the C++ reference computations below do not overflow (small
// integer types still wrap: 100 * 3 in int8).
template <typename T>
std::vector<std::pair<std::vector<Cmp<T>>, std::vector<Cmp<T>>>> BinaryCases() {
  std::vector<std::pair<std::vector<Cmp<T>>, std::vector<Cmp<T>>>> cases;
  cases.push_back({Cmps<T>({7, 3, 100, 0, 11, 1, 100}), Cmps<T>({2, 5, 3, 9, 11, 1, 7})});
  if constexpr (kIsSigned<T>) {
    cases.push_back({Cmps<T>({-7, 7, -7, -10, 0, -11, -100, -3}),
                     Cmps<T>({2, -2, -2, 3, -5, -11, 3, -3})});
  }
  if constexpr (std::is_unsigned_v<T>) {
    cases.push_back({Cmps<T>({200, 3, 0, 255, 17}), Cmps<T>({3, 200, 1, 255, 4})});
  }
  if constexpr (kIsFloat<T>) {
    cases.push_back({Cmps<T>({2.5, -0.5, 0.25, 1.5, -6.5}), Cmps<T>({0.5, 2, -0.25, 1.5, 4})});
  }
  return cases;
}

// ---------------------------------------------------------------------------
// Every numeric dtype
// ---------------------------------------------------------------------------

template <typename T>
class NumericExprTest : public ::testing::Test {};

using NumericTypes = ::testing::Types<int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t,
                                      uint32_t, uint64_t, Float16, BFloat16, float, double>;

class DTypeNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return DTypeName(DTypeOf<T>());
  }
};

TYPED_TEST_SUITE(NumericExprTest, NumericTypes, DTypeNames);

TYPED_TEST(NumericExprTest, Arithmetic) {
  using T = TypeParam;
  for (const auto& [a, b] : BinaryCases<T>()) {
    std::vector<Cmp<T>> add, sub, mul, div, mod, mn, mx;
    for (size_t i = 0; i < a.size(); ++i) {
      add.push_back(R<T>(a[i] + b[i]));
      sub.push_back(R<T>(a[i] - b[i]));
      mul.push_back(R<T>(a[i] * b[i]));
      div.push_back(R<T>(a[i] / b[i]));
      if constexpr (kIsFloat<T>) {
        mod.push_back(R<T>(std::fmod(a[i], b[i])));
      } else {
        mod.push_back(R<T>(a[i] % b[i]));
      }
      mn.push_back(b[i] < a[i] ? b[i] : a[i]);
      mx.push_back(b[i] > a[i] ? b[i] : a[i]);
    }
    ASSERT_OK_AND_ASSIGN(
        Outputs o,
        RunColumns<T>({a, b}, Function({x[0] + x[1], x[0] - x[1], x[0] * x[1], x[0] / x[1],
                                        x[0] % x[1], expr::Min(x[0], x[1]),
                                        expr::Max(x[0], x[1])})));
    ExpectColumn<T>(o, 0, add, "add");
    ExpectColumn<T>(o, 1, sub, "sub");
    ExpectColumn<T>(o, 2, mul, "mul");
    ExpectColumn<T>(o, 3, div, "div");
    ExpectColumn<T>(o, 4, mod, "mod");
    ExpectColumn<T>(o, 5, mn, "min");
    ExpectColumn<T>(o, 6, mx, "max");
  }
}

TYPED_TEST(NumericExprTest, NegAndAbs) {
  using T = TypeParam;
  for (const auto& c : BinaryCases<T>()) {
    const std::vector<Cmp<T>>& a = c.first;
    std::vector<Cmp<T>> neg, abs, neg_neg;
    for (Cmp<T> v : a) {
      neg.push_back(R<T>(-v));
      if constexpr (kIsSigned<T>) {
        abs.push_back(v < 0 ? R<T>(-v) : v);
      } else {
        abs.push_back(v);
      }
      neg_neg.push_back(v);
    }
    ASSERT_OK_AND_ASSIGN(Outputs o,
                         RunColumns<T>({a}, Function({-x, expr::Abs(x), -(-x)})));
    ExpectColumn<T>(o, 0, neg, "neg");
    ExpectColumn<T>(o, 1, abs, "abs");
    ExpectColumn<T>(o, 2, neg_neg, "neg neg");
  }
}

TYPED_TEST(NumericExprTest, Comparisons) {
  using T = TypeParam;
  for (const auto& [a, b] : BinaryCases<T>()) {
    std::vector<bool> eq, ne, lt, le, gt, ge;
    for (size_t i = 0; i < a.size(); ++i) {
      eq.push_back(a[i] == b[i]);
      ne.push_back(a[i] != b[i]);
      lt.push_back(a[i] < b[i]);
      le.push_back(a[i] <= b[i]);
      gt.push_back(a[i] > b[i]);
      ge.push_back(a[i] >= b[i]);
    }
    ASSERT_OK_AND_ASSIGN(Outputs o,
                         RunColumns<T>({a, b}, Function({x[0] == x[1], x[0] != x[1], x[0] < x[1],
                                                         x[0] <= x[1], x[0] > x[1],
                                                         x[0] >= x[1]})));
    ExpectColumn<bool>(o, 0, eq, "==");
    ExpectColumn<bool>(o, 1, ne, "!=");
    ExpectColumn<bool>(o, 2, lt, "<");
    ExpectColumn<bool>(o, 3, le, "<=");
    ExpectColumn<bool>(o, 4, gt, ">");
    ExpectColumn<bool>(o, 5, ge, ">=");
  }
}

TYPED_TEST(NumericExprTest, WeakIntegerLiterals) {
  using T = TypeParam;
  const std::vector<Cmp<T>> a = Cmps<T>({7, 3, 100, 1, 4, 12});
  std::vector<Cmp<T>> e[13];
  std::vector<bool> c[6];
  for (Cmp<T> v : a) {
    e[0].push_back(R<T>(v + 1));
    e[1].push_back(R<T>(1 + v));
    e[2].push_back(R<T>(v - 1));
    e[3].push_back(R<T>(9 - v));
    e[4].push_back(R<T>(2 * v));
    e[5].push_back(R<T>(v * 2));
    e[6].push_back(R<T>(v / 2));
    e[7].push_back(R<T>(100 / v));
    if constexpr (kIsFloat<T>) {
      e[8].push_back(R<T>(std::fmod(v, Cmp<T>(3))));
      e[9].push_back(R<T>(std::fmod(Cmp<T>(100), v)));
    } else {
      e[8].push_back(R<T>(v % 3));
      e[9].push_back(R<T>(100 % v));
    }
    e[10].push_back(v < 4 ? v : Cmp<T>(4));
    e[11].push_back(v > 4 ? v : Cmp<T>(4));
    e[12].push_back(R<T>(R<T>(v * 3) + 5));
    c[0].push_back(v == 3);
    c[1].push_back(v != 3);
    c[2].push_back(v < 5);
    c[3].push_back(5 < v);
    c[4].push_back(v >= 7);
    c[5].push_back(12 <= v);
  }
  ASSERT_OK_AND_ASSIGN(
      Outputs o,
      RunColumns<T>({a}, Function({x + 1, 1 + x, x - 1, 9 - x, 2 * x, x * 2, x / 2, 100 / x,
                                   x % 3, 100 % x, expr::Min(x, expr::Lift(4)),
                                   expr::Max(expr::Lift(4), x), x * 3 + 5, x == 3, x != 3, x < 5,
                                   5 < x, x >= 7, 12 <= x})));
  const char* names[] = {"x + 1", "1 + x",   "x - 1",   "9 - x",   "2 * x",
                         "x * 2", "x / 2",   "100 / x", "x % 3",   "100 % x",
                         "Min(x, 4)", "Max(4, x)", "x * 3 + 5"};
  for (size_t k = 0; k < 13; ++k) ExpectColumn<T>(o, k, e[k], names[k]);
  const char* cnames[] = {"x == 3", "x != 3", "x < 5", "5 < x", "x >= 7", "12 <= x"};
  for (size_t k = 0; k < 6; ++k) ExpectColumn<bool>(o, 13 + k, c[k], cnames[k]);
}

TYPED_TEST(NumericExprTest, WeakFractionalLiterals) {
  using T = TypeParam;
  if constexpr (kIsFloat<T>) {
    using C = Cmp<T>;
    const std::vector<C> a = Cmps<T>({7, -3, 2.5, 0.5, 100});
    std::vector<C> e[5];
    std::vector<bool> lt;
    for (C v : a) {
      e[0].push_back(R<T>(v * C(0.5)));
      e[1].push_back(R<T>(v + C(0.25)));
      e[2].push_back(R<T>(C(1.5) - v));
      e[3].push_back(R<T>(v / C(0.5)));
      e[4].push_back(R<T>(std::fmod(v, C(1.5))));
      lt.push_back(v < C(2.5));
    }
    ASSERT_OK_AND_ASSIGN(
        Outputs o, RunColumns<T>({a}, Function({x * 0.5, x + 0.25, 1.5 - x, x / 0.5, x % 1.5,
                                                x < 2.5})));
    ExpectColumn<T>(o, 0, e[0], "x * 0.5");
    ExpectColumn<T>(o, 1, e[1], "x + 0.25");
    ExpectColumn<T>(o, 2, e[2], "1.5 - x");
    ExpectColumn<T>(o, 3, e[3], "x / 0.5");
    ExpectColumn<T>(o, 4, e[4], "x % 1.5");
    ExpectColumn<bool>(o, 5, lt, "x < 2.5");
  } else {
    // A fractional literal needs a float operand.
    Dataset ds = Dataset::FromTensors({{TensorOf<T>(Cmps<T>({1, 2}))}}).Map(x * 0.5);
    EXPECT_STATUS(ds.status(), kInvalid, "fractional literal");
    EXPECT_STATUS(ds.status(), kInvalid, "mul");
    Dataset cmp = Dataset::FromTensors({{TensorOf<T>(Cmps<T>({1, 2}))}}).Map(x < 0.5);
    EXPECT_STATUS(cmp.status(), kInvalid, "fractional literal");
  }
}

TYPED_TEST(NumericExprTest, StrongConstants) {
  using T = TypeParam;
  const std::vector<Cmp<T>> a = Cmps<T>({7, 3, 100, 1, 4, 12});
  const std::vector<Cmp<T>> b = Cmps<T>({2, 3, 5, 9, 4, 1});
  const Cmp<T> k = 3;
  Expr ck = Expr::Constant(ScalarOf<T>(k));
  Expr cb = Expr::Constant(TensorOf<T>(b));
  std::vector<Cmp<T>> e[8];
  std::vector<bool> eq, gt;
  for (size_t i = 0; i < a.size(); ++i) {
    Cmp<T> v = a[i];
    e[0].push_back(R<T>(v + k));
    e[1].push_back(R<T>(k * v));
    e[2].push_back(R<T>(v - k));
    e[3].push_back(R<T>(k - v));
    e[4].push_back(R<T>(v / k));
    e[5].push_back(v < k ? v : k);
    e[6].push_back(R<T>(b[i] + v));
    e[7].push_back(R<T>(v * b[i]));
    eq.push_back(v == k);
    gt.push_back(v > b[i]);
  }
  // x is a vector: the scalar constant broadcasts; the vector constant
  // matches elementwise.
  Element in = {TensorOf<T>(a)};
  ASSERT_OK_AND_ASSIGN(Element out, MapOne(in, Function({x + ck, ck * x, x - ck, ck - x, x / ck,
                                                         expr::Min(x, ck), cb + x, x * cb,
                                                         x == ck, x > cb})));
  ASSERT_EQ(out.size(), 10u);
  for (size_t j = 0; j < 8; ++j) {
    SCOPED_TRACE(j);
    ASSERT_EQ(out[j].dtype(), DTypeOf<T>());
    EXPECT_EQ(out[j].shape().dims(), std::vector<int64_t>{6});
    EXPECT_EQ(ValuesOf<T>(out[j]), e[j]);
  }
  ASSERT_EQ(out[8].dtype(), DType::kBool);
  EXPECT_EQ(ValuesOf<bool>(out[8]), eq);
  ASSERT_EQ(out[9].dtype(), DType::kBool);
  EXPECT_EQ(ValuesOf<bool>(out[9]), gt);

  // x is a scalar: a vector constant broadcasts it to the constant's shape.
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_OK_AND_ASSIGN(Element s, MapOne({ScalarOf<T>(a[i])},
                                           Function({cb - x, x + ck, expr::Max(cb, x)})));
    ASSERT_EQ(s.size(), 3u);
    std::vector<Cmp<T>> want_sub, want_max;
    for (Cmp<T> bv : b) {
      want_sub.push_back(R<T>(bv - a[i]));
      want_max.push_back(a[i] > bv ? a[i] : bv);
    }
    ASSERT_EQ(s[0].dtype(), DTypeOf<T>());
    EXPECT_EQ(s[0].shape().dims(), std::vector<int64_t>{6});
    EXPECT_EQ(ValuesOf<T>(s[0]), want_sub);
    ASSERT_EQ(s[1].dtype(), DTypeOf<T>());
    EXPECT_TRUE(s[1].shape().is_scalar());
    EXPECT_EQ(ValuesOf<T>(s[1]), std::vector<Cmp<T>>{R<T>(a[i] + k)});
    ASSERT_EQ(s[2].dtype(), DTypeOf<T>());
    EXPECT_EQ(ValuesOf<T>(s[2]), want_max);
  }
}

TYPED_TEST(NumericExprTest, ScalarBroadcastsAgainstVector) {
  using T = TypeParam;
  const std::vector<Cmp<T>> a = Cmps<T>({7, 3, 100, 12, 1, 4});
  const Cmp<T> s = 4;
  std::vector<Cmp<T>> e[11];
  std::vector<bool> lt, gt, eq;
  for (Cmp<T> v : a) {
    e[0].push_back(R<T>(v + s));
    e[1].push_back(R<T>(s + v));
    e[2].push_back(R<T>(v - s));
    e[3].push_back(R<T>(s - v));
    e[4].push_back(R<T>(v * s));
    e[5].push_back(R<T>(v / s));
    e[6].push_back(R<T>(s / v));
    if constexpr (kIsFloat<T>) {
      e[7].push_back(R<T>(std::fmod(v, s)));
      e[8].push_back(R<T>(std::fmod(s, v)));
    } else {
      e[7].push_back(R<T>(v % s));
      e[8].push_back(R<T>(s % v));
    }
    e[9].push_back(s < v ? s : v);
    e[10].push_back(s > v ? s : v);
    lt.push_back(v < s);
    gt.push_back(s > v);
    eq.push_back(v == s);
  }
  Element in = {TensorOf<T>(a), ScalarOf<T>(s)};
  Dataset ds = Dataset::FromTensors({in}).Map(
      Function({x[0] + x[1], x[1] + x[0], x[0] - x[1], x[1] - x[0], x[0] * x[1], x[0] / x[1],
                x[1] / x[0], x[0] % x[1], x[1] % x[0], expr::Min(x[1], x[0]),
                expr::Max(x[0], x[1]), x[0] < x[1], x[1] > x[0], x[0] == x[1]}));
  ASSERT_OK(ds.status());
  ASSERT_EQ(ds.element_spec().components.size(), 14u);
  for (const auto& c : ds.element_spec().components) {
    EXPECT_EQ(c.shape, std::vector<int64_t>{6}) << c.ToString();
  }
  ASSERT_OK_AND_ASSIGN(std::vector<Element> all, Collect(ds));
  ASSERT_EQ(all.size(), 1u);
  const Element& out = all[0];
  ASSERT_EQ(out.size(), 14u);
  for (size_t j = 0; j < 11; ++j) {
    SCOPED_TRACE(j);
    ASSERT_EQ(out[j].dtype(), DTypeOf<T>());
    EXPECT_EQ(out[j].shape().dims(), std::vector<int64_t>{6});
    EXPECT_EQ(ValuesOf<T>(out[j]), e[j]);
  }
  EXPECT_EQ(ValuesOf<bool>(out[11]), lt);
  EXPECT_EQ(ValuesOf<bool>(out[12]), gt);
  EXPECT_EQ(ValuesOf<bool>(out[13]), eq);
}

// The expected value of casting v (of type T) to U.
template <typename U, typename T>
Cmp<U> CastRef(Cmp<T> v) {
  if constexpr (std::is_same_v<U, bool>) {
    return v != Cmp<T>(0);
  } else if constexpr (kIsFloat<U>) {
    return R<U>(static_cast<Cmp<U>>(v));
  } else if constexpr (kIsFloat<T>) {
    // Float to integer truncates; below the range saturates (only negative
    // values to unsigned types occur here).
    if (std::is_unsigned_v<U> && v < 0) return U(0);
    return static_cast<U>(std::trunc(v));
  } else {
    return static_cast<U>(v);  // integer to integer wraps
  }
}

TYPED_TEST(NumericExprTest, CastToEveryDType) {
  using T = TypeParam;
  std::vector<Cmp<T>> src = Cmps<T>({0, 1, 7, 100, 42, 127});
  if constexpr (kIsSigned<T>) {
    for (Cmp<T> v : Cmps<T>({-3, -100, -1})) src.push_back(v);
  }
  if constexpr (std::is_unsigned_v<T>) {
    for (Cmp<T> v : Cmps<T>({200, 255, 128})) src.push_back(v);
  }
  if constexpr (kIsFloat<T>) {
    for (Cmp<T> v : Cmps<T>({2.5, 0.5, -0.5, -2.5, 99.5})) src.push_back(v);
  }
  for (DType d : kAllDTypes) {
    if (d == DType::kString) continue;
    SCOPED_TRACE(DTypeName(d));
    ASSERT_OK_AND_ASSIGN(Outputs o, RunColumns<T>({src}, Function({x.Cast(d), expr::Cast(x, d)})));
    VisitType(d, [&]<typename U>() {
      std::vector<Cmp<U>> want;
      for (Cmp<T> v : src) want.push_back(CastRef<U, T>(v));
      ExpectColumn<U>(o, 0, want, "x.Cast");
      ExpectColumn<U>(o, 1, want, "expr::Cast");
    });
  }
}

TYPED_TEST(NumericExprTest, CastThenArithmeticInTheNewDType) {
  using T = TypeParam;
  // int8 arithmetic after a cast wraps in int8; float arithmetic after a
  // cast keeps fractions.
  const std::vector<Cmp<T>> src = Cmps<T>({100, 7, 1});
  ASSERT_OK_AND_ASSIGN(Outputs o, RunColumns<T>({src}, Function({x.Cast(DType::kInt8) * 2,
                                                                 x.Cast(DType::kFloat64) / 2,
                                                                 x.Cast(DType::kBool) && true})));
  ExpectColumn<int8_t>(o, 0, {static_cast<int8_t>(200), 14, 2}, "int8 * 2");
  ExpectColumn<double>(o, 1, {50, 3.5, 0.5}, "float64 / 2");
  ExpectColumn<bool>(o, 2, {true, true, true}, "bool && true");
}

TYPED_TEST(NumericExprTest, FilterWithComparison) {
  using T = TypeParam;
  std::vector<T> vs;
  for (Cmp<T> v : Cmps<T>({7, 3, 100, 0, 12, 5})) vs.push_back(FromCmp<T>(v));
  Dataset ds = Scalars<T>(vs).Filter(x >= 7);
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(),
            std::string("(") + DTypeName(DTypeOf<T>()) + "[])");
  ASSERT_OK_AND_ASSIGN(std::vector<T> got, CollectScalars<T>(ds));
  std::vector<Cmp<T>> got_c;
  for (T v : got) got_c.push_back(ToCmp<T>(v));
  EXPECT_EQ(got_c, Cmps<T>({7, 100, 12}));

  Dataset between = Scalars<T>(vs).Filter(x > Expr::Constant(ScalarOf<T>(3)) && x < 12);
  ASSERT_OK(between.status());
  ASSERT_OK_AND_ASSIGN(got, CollectScalars<T>(between));
  got_c.clear();
  for (T v : got) got_c.push_back(ToCmp<T>(v));
  EXPECT_EQ(got_c, Cmps<T>({7, 5}));
}

TYPED_TEST(NumericExprTest, ElementSpecInference) {
  using T = TypeParam;
  Dataset in = Dataset::FromTensors({{TensorOf<T>(Cmps<T>({1, 2, 3})), ScalarOf<T>(2)}});
  ASSERT_OK(in.status());
  Dataset ds = in.Map(Function({x[0] + 1, x[1] * 2, x[0] < x[1], x[0].Cast(DType::kFloat16),
                                expr::Abs(x[1]), x[1] + x[0]}));
  ASSERT_OK(ds.status());
  const std::string t = DTypeName(DTypeOf<T>());
  EXPECT_EQ(ds.element_spec().ToString(),
            "(" + t + "[3], " + t + "[], bool[3], float16[3], " + t + "[], " + t + "[3])");
  EXPECT_EQ(ds.Cardinality(), 1);
}

TYPED_TEST(NumericExprTest, MismatchedDTypeIsAnError) {
  using T = TypeParam;
  // Every other numeric dtype (and bool) mismatches T, with or without a
  // constant.
  for (DType d : kAllDTypes) {
    if (d == DTypeOf<T>() || d == DType::kString) continue;
    SCOPED_TRACE(DTypeName(d));
    VisitType(d, [&]<typename U>() {
      Dataset ds = Dataset::FromTensors({{ScalarOf<T>(1), ScalarOf<U>(Cmp<U>(1))}})
                       .Map(x[0] - x[1]);
      EXPECT_STATUS(ds.status(), kInvalid, "sub");
      if (d != DType::kBool) {
        EXPECT_STATUS(ds.status(), kInvalid, "dtype mismatch");
        EXPECT_STATUS(ds.status(), kInvalid, DTypeName(DTypeOf<T>()));
      }
      Dataset cmp = Dataset::FromTensors({{ScalarOf<T>(1)}})
                        .Map(x < Expr::Constant(ScalarOf<U>(Cmp<U>(1))));
      EXPECT_STATUS(cmp.status(), kInvalid, "less");
      EXPECT_STATUS(cmp.status(), kInvalid, "dtype mismatch");
    });
  }
}

// ---------------------------------------------------------------------------
// Integer semantics
// ---------------------------------------------------------------------------

template <typename T>
class IntegerExprTest : public ::testing::Test {};
using IntegerTypes =
    ::testing::Types<int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t>;
TYPED_TEST_SUITE(IntegerExprTest, IntegerTypes, DTypeNames);

TYPED_TEST(IntegerExprTest, WrapAroundAtTheLimits) {
  using T = TypeParam;
  using L = std::numeric_limits<T>;
  ASSERT_OK_AND_ASSIGN(Element out,
                       MapOne({TensorOf<T>({L::max(), L::min(), T(1)}),
                               TensorOf<T>({T(1), T(1), L::max()})},
                              Function({x[0] + x[1], x[0] - x[1], x[0] * x[1], x[0] * 2,
                                        -x[0]})));
  ASSERT_EQ(out.size(), 5u);
  // max + 1 == min, min + 1, 1 + max == min.
  EXPECT_EQ(ValuesOf<T>(out[0]),
            (std::vector<T>{L::min(), static_cast<T>(L::min() + 1), L::min()}));
  // max - 1, min - 1 == max, 1 - max.
  EXPECT_EQ(ValuesOf<T>(out[1]),
            (std::vector<T>{static_cast<T>(L::max() - 1), L::max(),
                            static_cast<T>(uint64_t{1} - static_cast<uint64_t>(L::max()))}));
  // max * 1, min * 1, 1 * max.
  EXPECT_EQ(ValuesOf<T>(out[2]), (std::vector<T>{L::max(), L::min(), L::max()}));
  // max * 2 wraps to -2 (signed) or max - 1 (unsigned); min * 2 wraps to 0.
  EXPECT_EQ(ValuesOf<T>(out[3]),
            (std::vector<T>{static_cast<T>(std::is_signed_v<T> ? T(-2) : T(L::max() - 1)), T(0),
                            T(2)}));
  // -max, -min == min (signed) / 0 (unsigned min), -1.
  EXPECT_EQ(ValuesOf<T>(out[4]),
            (std::vector<T>{static_cast<T>(uint64_t{0} - static_cast<uint64_t>(L::max())),
                            L::min(), static_cast<T>(uint64_t{0} - 1)}));
}

TYPED_TEST(IntegerExprTest, WeakLiteralsAtTheTypeLimits) {
  using T = TypeParam;
  // The extreme representable literals are accepted and adopt T.
  constexpr T lo = std::numeric_limits<T>::min();
  constexpr T hi = std::numeric_limits<T>::max();
  constexpr int64_t hi64 = static_cast<int64_t>(
      std::min<uint64_t>(static_cast<uint64_t>(hi), std::numeric_limits<int64_t>::max()));
  ASSERT_OK_AND_ASSIGN(Element out,
                       MapOne({Tensor::Scalar<T>(0)},
                              Function({x + static_cast<int64_t>(lo), x + hi64, x == hi64})));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].dtype(), DTypeOf<T>());
  EXPECT_EQ(out[0].at<T>(0), lo);
  EXPECT_EQ(out[1].dtype(), DTypeOf<T>());
  EXPECT_EQ(out[1].at<T>(0), static_cast<T>(hi64));
  EXPECT_EQ(out[2].dtype(), DType::kBool);
  EXPECT_FALSE(out[2].at<bool>(0));
}

TYPED_TEST(IntegerExprTest, DivisionByZeroIsAnErrorAtIterationTime) {
  using T = TypeParam;
  // Definition succeeds; the element with a zero divisor fails.
  Dataset div = Scalars<T>({T(12), T(0), T(3)}).Map(12 / x);
  ASSERT_OK(div.status());
  ASSERT_OK_AND_ASSIGN(auto it, div.MakeIterator());
  auto first = it->Next();
  ASSERT_OK(first);
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((**first)[0].at<T>(0), T(1));
  auto second = it->Next();
  EXPECT_STATUS(second, kInvalid, "division by zero");
  EXPECT_STATUS(second, kInvalid, "div");

  Dataset mod = Scalars<T>({T(5), T(0)}).Map(7 % x);
  ASSERT_OK(mod.status());
  EXPECT_STATUS(Collect(mod), kInvalid, "division by zero");
  EXPECT_STATUS(Collect(mod), kInvalid, "mod");

  // A weak zero literal and a zero inside a vector divisor.
  Dataset lit = Scalars<T>({T(5)}).Map(x / 0);
  ASSERT_OK(lit.status());
  EXPECT_STATUS(Collect(lit), kInvalid, "division by zero");
  Dataset vec = Dataset::FromTensors({{TensorOf<T>({T(4), T(0), T(2)})}}).Map(x % x);
  ASSERT_OK(vec.status());
  EXPECT_STATUS(Collect(vec), kInvalid, "division by zero");
  Dataset strong = Scalars<T>({T(5)}).Map(x / Expr::Constant(Tensor::Scalar<T>(0)));
  ASSERT_OK(strong.status());
  EXPECT_STATUS(Collect(strong), kInvalid, "division by zero");
  // In a Filter predicate too.
  Dataset filter = Scalars<T>({T(3), T(0)}).Filter(6 % x == 0);
  ASSERT_OK(filter.status());
  EXPECT_STATUS(Collect(filter), kInvalid, "division by zero");
}

TYPED_TEST(IntegerExprTest, LiteralThatDoesNotFitIsAnError) {
  using T = TypeParam;
  using L = std::numeric_limits<T>;
  Dataset ds = Scalars<T>({T(1)});
  if constexpr (std::is_unsigned_v<T>) {
    EXPECT_STATUS(ds.Map(x + (-1)).status(), kInvalid, "does not fit");
    EXPECT_STATUS(ds.Map(x + (-1)).status(), kInvalid, "add");
    EXPECT_STATUS(ds.Map(x == -1).status(), kInvalid, "does not fit");
  }
  if constexpr (sizeof(T) < 8) {
    int64_t over = static_cast<int64_t>(L::max()) + 1;
    int64_t under = static_cast<int64_t>(L::min()) - 1;
    EXPECT_STATUS(ds.Map(x + under).status(), kInvalid, "does not fit");
    EXPECT_STATUS(ds.Map(under * x).status(), kInvalid, "mul");
    EXPECT_STATUS(ds.Map(x * over).status(), kInvalid, "does not fit");
    EXPECT_STATUS(ds.Map(x * over).status(), kInvalid, DTypeName(DTypeOf<T>()));
    EXPECT_STATUS(ds.Map(over - x).status(), kInvalid, "sub");
    EXPECT_STATUS(ds.Map(x < over).status(), kInvalid, "does not fit");
    EXPECT_STATUS(ds.Map(expr::Min(x, expr::Lift(over))).status(), kInvalid, "min");
  }
}

template <typename T>
class SignedIntegerExprTest : public ::testing::Test {};
using SignedIntegerTypes = ::testing::Types<int8_t, int16_t, int32_t, int64_t>;
TYPED_TEST_SUITE(SignedIntegerExprTest, SignedIntegerTypes, DTypeNames);

TYPED_TEST(SignedIntegerExprTest, DivisionTruncatesTowardZero) {
  using T = TypeParam;
  ASSERT_OK_AND_ASSIGN(Element out,
                       MapOne({TensorOf<T>({-7, 7, -7, 7, -1, 6}), TensorOf<T>({2, -2, -2, 2, 3, -4})},
                              Function({x[0] / x[1], x[0] % x[1], x[0] / -2, x[0] % -2})));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(ValuesOf<T>(out[0]), (std::vector<T>{-3, -3, 3, 3, 0, -1}));
  EXPECT_EQ(ValuesOf<T>(out[1]), (std::vector<T>{-1, 1, -1, 1, -1, 2}));
  EXPECT_EQ(ValuesOf<T>(out[2]), (std::vector<T>{3, -3, 3, -3, 0, -3}));
  EXPECT_EQ(ValuesOf<T>(out[3]), (std::vector<T>{-1, 1, -1, 1, -1, 0}));
}

TYPED_TEST(SignedIntegerExprTest, MinDividedByMinusOneWraps) {
  using T = TypeParam;
  constexpr T kMin = std::numeric_limits<T>::min();
  // Tensor divisor, weak literal divisor and strong constant divisor.
  ASSERT_OK_AND_ASSIGN(
      Element out,
      MapOne({TensorOf<T>({kMin, kMin, 5}), TensorOf<T>({-1, 1, -1})},
             Function({x[0] / x[1], x[0] % x[1], x[0] / -1, x[0] % -1,
                       x[0] / Expr::Constant(Tensor::Scalar<T>(-1)),
                       x[0] % Expr::Constant(Tensor::Scalar<T>(-1)), x[0] / 2, x[0] % 3})));
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(ValuesOf<T>(out[0]), (std::vector<T>{kMin, kMin, -5}));
  EXPECT_EQ(ValuesOf<T>(out[1]), (std::vector<T>{0, 0, 0}));
  EXPECT_EQ(ValuesOf<T>(out[2]), (std::vector<T>{kMin, kMin, -5}));
  EXPECT_EQ(ValuesOf<T>(out[3]), (std::vector<T>{0, 0, 0}));
  EXPECT_EQ(ValuesOf<T>(out[4]), (std::vector<T>{kMin, kMin, -5}));
  EXPECT_EQ(ValuesOf<T>(out[5]), (std::vector<T>{0, 0, 0}));
  EXPECT_EQ(ValuesOf<T>(out[6]),
            (std::vector<T>{static_cast<T>(kMin / 2), static_cast<T>(kMin / 2), 2}));
  EXPECT_EQ(ValuesOf<T>(out[7]),
            (std::vector<T>{static_cast<T>(kMin % 3), static_cast<T>(kMin % 3), 2}));
  // Scalars too, and abs/neg of min.
  ASSERT_OK_AND_ASSIGN(std::vector<T> s,
                       CollectScalars<T>(Scalars<T>({kMin}).Map(x / -1)));
  EXPECT_EQ(s, std::vector<T>{kMin});
  ASSERT_OK_AND_ASSIGN(s, CollectScalars<T>(Scalars<T>({kMin}).Map(x % -1)));
  EXPECT_EQ(s, std::vector<T>{0});
  ASSERT_OK_AND_ASSIGN(s, CollectScalars<T>(Scalars<T>({kMin}).Map(expr::Abs(x))));
  EXPECT_EQ(s, std::vector<T>{kMin});
  ASSERT_OK_AND_ASSIGN(s, CollectScalars<T>(Scalars<T>({kMin}).Map(-x)));
  EXPECT_EQ(s, std::vector<T>{kMin});
}

TEST(IntegerSemanticsTest, SpecificWrapExamples) {
  {
    ASSERT_OK_AND_ASSIGN(std::vector<int8_t> v,
                         CollectScalars<int8_t>(Scalars<int8_t>({127, -128, 64, 16}).Map(
                             Function({x + 1}))));
    EXPECT_EQ(v, (std::vector<int8_t>{-128, -127, 65, 17}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int8_t>(Scalars<int8_t>({127, -128, 64, 16}).Map(x * 2)));
    EXPECT_EQ(v, (std::vector<int8_t>{-2, 0, -128, 32}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int8_t>(Scalars<int8_t>({-128}).Map(x - 1)));
    EXPECT_EQ(v, (std::vector<int8_t>{127}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int8_t>(Scalars<int8_t>({16}).Map(x * x)));
    EXPECT_EQ(v, (std::vector<int8_t>{0}));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> v,
                         CollectScalars<uint8_t>(Scalars<uint8_t>({0, 255, 1}).Map(x - 1)));
    EXPECT_EQ(v, (std::vector<uint8_t>{255, 254, 0}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint8_t>(Scalars<uint8_t>({255, 16}).Map(x + 1)));
    EXPECT_EQ(v, (std::vector<uint8_t>{0, 17}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint8_t>(Scalars<uint8_t>({16, 1}).Map(x * 16)));
    EXPECT_EQ(v, (std::vector<uint8_t>{0, 16}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint8_t>(Scalars<uint8_t>({1, 0}).Map(-x)));
    EXPECT_EQ(v, (std::vector<uint8_t>{255, 0}));
    // Literal 255 fits uint8.
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint8_t>(Scalars<uint8_t>({1}).Map(x + 255)));
    EXPECT_EQ(v, (std::vector<uint8_t>{0}));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> v,
                         CollectScalars<int32_t>(Scalars<int32_t>({INT32_MAX, 65536}).Map(
                             Function({x + x}))));
    EXPECT_EQ(v, (std::vector<int32_t>{-2, 131072}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int32_t>(Scalars<int32_t>({65536}).Map(x * x)));
    EXPECT_EQ(v, (std::vector<int32_t>{0}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int32_t>(Scalars<int32_t>({INT32_MIN}).Map(x - 1)));
    EXPECT_EQ(v, (std::vector<int32_t>{INT32_MAX}));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> v,
                         CollectScalars<uint64_t>(Scalars<uint64_t>({0, UINT64_MAX}).Map(x - 1)));
    EXPECT_EQ(v, (std::vector<uint64_t>{UINT64_MAX, UINT64_MAX - 1}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint64_t>(Scalars<uint64_t>({UINT64_MAX}).Map(x * 2)));
    EXPECT_EQ(v, (std::vector<uint64_t>{UINT64_MAX - 1}));
    // Unsigned division and modulo near the top of the range (not signed).
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint64_t>(Scalars<uint64_t>({UINT64_MAX}).Map(x / 2)));
    EXPECT_EQ(v, (std::vector<uint64_t>{UINT64_MAX / 2}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<uint64_t>(Scalars<uint64_t>({UINT64_MAX}).Map(x % 10)));
    EXPECT_EQ(v, (std::vector<uint64_t>{UINT64_MAX % 10}));
    ASSERT_OK_AND_ASSIGN(std::vector<bool> b,
                         CollectScalars<bool>(Scalars<uint64_t>({UINT64_MAX}).Map(x > 1)));
    EXPECT_EQ(b, (std::vector<bool>{true}));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::vector<int64_t> v,
                         CollectScalars<int64_t>(Scalars<int64_t>({INT64_MAX, INT64_MIN})
                                                     .Map(x + 1)));
    EXPECT_EQ(v, (std::vector<int64_t>{INT64_MIN, INT64_MIN + 1}));
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int64_t>(Scalars<int64_t>({INT64_MIN}).Map(x * -1)));
    EXPECT_EQ(v, (std::vector<int64_t>{INT64_MIN}));
    // Range yields int64.
    ASSERT_OK_AND_ASSIGN(v, CollectScalars<int64_t>(
                                Dataset::Range(INT64_MAX - 2, INT64_MAX).Map(x + 3)));
    EXPECT_EQ(v, (std::vector<int64_t>{INT64_MIN, INT64_MIN + 1}));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::vector<uint16_t> v,
                         CollectScalars<uint16_t>(Scalars<uint16_t>({0}).Map(x - 1)));
    EXPECT_EQ(v, (std::vector<uint16_t>{65535}));
    ASSERT_OK_AND_ASSIGN(std::vector<int16_t> w,
                         CollectScalars<int16_t>(Scalars<int16_t>({32767}).Map(x + 1)));
    EXPECT_EQ(w, (std::vector<int16_t>{-32768}));
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> u,
                         CollectScalars<uint32_t>(Scalars<uint32_t>({0, 3}).Map(x - 5)));
    EXPECT_EQ(u, (std::vector<uint32_t>{4294967291u, 4294967294u}));
  }
}

TEST(IntegerSemanticsTest, NegativeOperandsOfUnsignedAreWrapped) {
  // There are no negative unsigned values: 0 - x wraps and compares large.
  ASSERT_OK_AND_ASSIGN(std::vector<bool> b,
                       CollectScalars<bool>(Scalars<uint32_t>({0, 1}).Map(0 - x > 5)));
  EXPECT_EQ(b, (std::vector<bool>{false, true}));
}

// ---------------------------------------------------------------------------
// Float semantics
// ---------------------------------------------------------------------------

template <typename T>
class FloatExprTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<Float16, BFloat16, float, double>;
TYPED_TEST_SUITE(FloatExprTest, FloatTypes, DTypeNames);

TYPED_TEST(FloatExprTest, ModIsFmod) {
  using T = TypeParam;
  ASSERT_OK_AND_ASSIGN(Element out,
                       MapOne({TensorOf<T>(Cmps<T>({5.5, -5.5, 5.5, -5.5, 1, 7})),
                               TensorOf<T>(Cmps<T>({2, 2, -2, -2, 0.5, 2.5}))},
                              Function({x[0] % x[1], x[0] % 2})));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(ValuesOf<T>(out[0]), Cmps<T>({1.5, -1.5, 1.5, -1.5, 0, 2}));
  EXPECT_EQ(ValuesOf<T>(out[1]), Cmps<T>({1.5, -1.5, 1.5, -1.5, 1, 1}));
}

TYPED_TEST(FloatExprTest, DivisionByZeroIsInfOrNan) {
  using T = TypeParam;
  Dataset ds = Dataset::FromTensors(
                   {{TensorOf<T>(Cmps<T>({1, -1, 0, 2.5})), TensorOf<T>(Cmps<T>({0, 0, 0, 0}))}})
                   .Map(Function({x[0] / x[1], x[0] / 0, x[0] / 0.0, x[0] % x[1]}));
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(std::vector<Element> all, Collect(ds));
  ASSERT_EQ(all.size(), 1u);
  ASSERT_EQ(all[0].size(), 4u);
  for (size_t k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    ASSERT_EQ(all[0][k].dtype(), DTypeOf<T>());
    std::vector<Cmp<T>> v = ValuesOf<T>(all[0][k]);
    ASSERT_EQ(v.size(), 4u);
    EXPECT_TRUE(std::isinf(v[0]) && v[0] > 0) << v[0];
    EXPECT_TRUE(std::isinf(v[1]) && v[1] < 0) << v[1];
    EXPECT_TRUE(std::isnan(v[2])) << v[2];
    EXPECT_TRUE(std::isinf(v[3]) && v[3] > 0) << v[3];
  }
  for (Cmp<T> v : ValuesOf<T>(all[0][3])) EXPECT_TRUE(std::isnan(v)) << v;
}

TYPED_TEST(FloatExprTest, AbsClearsTheSign) {
  using T = TypeParam;
  ASSERT_OK_AND_ASSIGN(Element out,
                       MapOne({TensorOf<T>(Cmps<T>({-0.0, 0.0, -2.5}))},
                              Function({expr::Abs(x), -x})));
  ASSERT_EQ(out.size(), 2u);
  std::vector<Cmp<T>> abs = ValuesOf<T>(out[0]);
  EXPECT_EQ(abs, Cmps<T>({0, 0, 2.5}));
  for (Cmp<T> v : abs) EXPECT_FALSE(std::signbit(v)) << v;
  std::vector<Cmp<T>> neg = ValuesOf<T>(out[1]);
  EXPECT_FALSE(std::signbit(neg[0]));
  EXPECT_TRUE(std::signbit(neg[1]));
}

TYPED_TEST(FloatExprTest, NanComparesUnordered) {
  using T = TypeParam;
  Cmp<T> nan = std::numeric_limits<Cmp<T>>::quiet_NaN();
  ASSERT_OK_AND_ASSIGN(Element out,
                       MapOne({TensorOf<T>({nan, 1}), TensorOf<T>({nan, nan})},
                              Function({x[0] == x[1], x[0] != x[1], x[0] < x[1], x[0] >= x[1],
                                        x[0] == x[0]})));
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(ValuesOf<bool>(out[0]), (std::vector<bool>{false, false}));
  EXPECT_EQ(ValuesOf<bool>(out[1]), (std::vector<bool>{true, true}));
  EXPECT_EQ(ValuesOf<bool>(out[2]), (std::vector<bool>{false, false}));
  EXPECT_EQ(ValuesOf<bool>(out[3]), (std::vector<bool>{false, false}));
  EXPECT_EQ(ValuesOf<bool>(out[4]), (std::vector<bool>{false, true}));
}

TEST(FloatSemanticsTest, HalfTypesComputeInFloatAndRoundBack) {
  // float16 has 11 significant bits: 2048 + 1 rounds (to even) back to 2048,
  // 2048 + 3 to 2052; 40000 * 2 overflows to inf.
  ASSERT_OK_AND_ASSIGN(Element h, MapOne({Tensor::FromVector<Float16>(
                                              {Float16(2048.f), Float16(40000.f), Float16(1.f)})},
                                          Function({x + 1, x + 3, x * 2, x / 3})));
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(ValuesOf<Float16>(h[0]), (std::vector<float>{2048, 40000, 2}));
  EXPECT_EQ(ValuesOf<Float16>(h[1]), (std::vector<float>{2052, 40000, 4}));
  std::vector<float> twice = ValuesOf<Float16>(h[2]);
  EXPECT_EQ(twice[0], 4096);
  EXPECT_TRUE(std::isinf(twice[1]));
  EXPECT_EQ(ValuesOf<Float16>(h[3])[2], static_cast<float>(Float16(1.f / 3.f)));
  EXPECT_NE(ValuesOf<Float16>(h[3])[2], 1.f / 3.f);
  // bfloat16 has 8 significant bits: 256 + 1 -> 256, 256 + 3 -> 260.
  ASSERT_OK_AND_ASSIGN(Element b, MapOne({Tensor::FromVector<BFloat16>({BFloat16(256.f)})},
                                          Function({x + 1, x + 3, x * 1e30})));
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(ValuesOf<BFloat16>(b[0]), (std::vector<float>{256}));
  EXPECT_EQ(ValuesOf<BFloat16>(b[1]), (std::vector<float>{260}));
  EXPECT_EQ(ValuesOf<BFloat16>(b[2]), (std::vector<float>{static_cast<float>(
                                          BFloat16(256.f * static_cast<float>(BFloat16(1e30f))))}));
  EXPECT_FALSE(std::isinf(ValuesOf<BFloat16>(b[2])[0]));
  // A weak literal adopts float16 before the comparison: 2049 becomes 2048.
  ASSERT_OK_AND_ASSIGN(Element c, MapOne({Tensor::Scalar<Float16>(Float16(2048.f))},
                                          Function({x == 2049, x.Cast(DType::kFloat32) == 2049})));
  EXPECT_TRUE(c[0].at<bool>(0));
  EXPECT_FALSE(c[1].at<bool>(0));
}

// ---------------------------------------------------------------------------
// Casts
// ---------------------------------------------------------------------------

TEST(CastTest, FloatToIntegerSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_OK_AND_ASSIGN(
      Element out,
      MapOne({Tensor::FromVector<float>(
                 {1e30f, -1e30f, nan, inf, -inf, 2.9f, -2.9f, 2147483520.f, 2147483648.f})},
             Function({x.Cast(DType::kInt32), x.Cast(DType::kUInt8), x.Cast(DType::kInt64),
                       x.Cast(DType::kUInt64), x.Cast(DType::kInt8)})));
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(ValuesOf<int32_t>(out[0]), (std::vector<int32_t>{INT32_MAX, INT32_MIN, 0, INT32_MAX,
                                                              INT32_MIN, 2, -2, 2147483520,
                                                              INT32_MAX}));
  EXPECT_EQ(ValuesOf<uint8_t>(out[1]),
            (std::vector<uint8_t>{255, 0, 0, 255, 0, 2, 0, 255, 255}));
  EXPECT_EQ(ValuesOf<int64_t>(out[2]),
            (std::vector<int64_t>{INT64_MAX, INT64_MIN, 0, INT64_MAX, INT64_MIN, 2, -2,
                                  2147483520, 2147483648}));
  EXPECT_EQ(ValuesOf<uint64_t>(out[3]),
            (std::vector<uint64_t>{UINT64_MAX, 0, 0, UINT64_MAX, 0, 2, 0, 2147483520,
                                   2147483648}));
  EXPECT_EQ(ValuesOf<int8_t>(out[4]),
            (std::vector<int8_t>{127, -128, 0, 127, -128, 2, -2, 127, 127}));
}

TEST(CastTest, Float64ToIntegerSaturates) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ASSERT_OK_AND_ASSIGN(
      Element out,
      MapOne({Tensor::FromVector<double>({1e300, -1e300, nan, 9.3e18, -9.3e18, 300, -5, 255.9,
                                          4294967295.5, 9007199254740993.0})},
             Function({x.Cast(DType::kInt64), x.Cast(DType::kUInt8), x.Cast(DType::kUInt32),
                       x.Cast(DType::kInt16)})));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(ValuesOf<int64_t>(out[0]),
            (std::vector<int64_t>{INT64_MAX, INT64_MIN, 0, INT64_MAX, INT64_MIN, 300, -5, 255,
                                  4294967295, 9007199254740992}));
  EXPECT_EQ(ValuesOf<uint8_t>(out[1]),
            (std::vector<uint8_t>{255, 0, 0, 255, 0, 255, 0, 255, 255, 255}));
  EXPECT_EQ(ValuesOf<uint32_t>(out[2]),
            (std::vector<uint32_t>{UINT32_MAX, 0, 0, UINT32_MAX, 0, 300, 0, 255, UINT32_MAX,
                                   UINT32_MAX}));
  EXPECT_EQ(ValuesOf<int16_t>(out[3]),
            (std::vector<int16_t>{32767, -32768, 0, 32767, -32768, 300, -5, 255, 32767,
                                  32767}));
}

TEST(CastTest, HalfToIntegerSaturates) {
  ASSERT_OK_AND_ASSIGN(
      Element h,
      MapOne({Tensor::FromVector<Float16>(
                 {Float16(1000.f), Float16(-1000.f), Float16(std::nanf("")),
                  Float16(std::numeric_limits<float>::infinity()), Float16(-7.75f)})},
             Function({x.Cast(DType::kInt8), x.Cast(DType::kUInt8), x.Cast(DType::kInt16)})));
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(ValuesOf<int8_t>(h[0]), (std::vector<int8_t>{127, -128, 0, 127, -7}));
  EXPECT_EQ(ValuesOf<uint8_t>(h[1]), (std::vector<uint8_t>{255, 0, 0, 255, 0}));
  EXPECT_EQ(ValuesOf<int16_t>(h[2]), (std::vector<int16_t>{1000, -1000, 0, 32767, -7}));
  ASSERT_OK_AND_ASSIGN(
      Element b, MapOne({Tensor::FromVector<BFloat16>({BFloat16(1e30f), BFloat16(-1e30f),
                                                       BFloat16(std::nanf("")), BFloat16(-3.5f)})},
                        Function({x.Cast(DType::kInt32), x.Cast(DType::kUInt64)})));
  EXPECT_EQ(ValuesOf<int32_t>(b[0]), (std::vector<int32_t>{INT32_MAX, INT32_MIN, 0, -3}));
  EXPECT_EQ(ValuesOf<uint64_t>(b[1]), (std::vector<uint64_t>{UINT64_MAX, 0, 0, 0}));
}

TEST(CastTest, IntegerToIntegerWraps) {
  ASSERT_OK_AND_ASSIGN(
      Element out,
      MapOne({Tensor::FromVector<int32_t>({300, -1, 128, -129, 65537})},
             Function({x.Cast(DType::kInt8), x.Cast(DType::kUInt8), x.Cast(DType::kUInt32),
                       x.Cast(DType::kUInt64), x.Cast(DType::kInt16), x.Cast(DType::kInt64)})));
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(ValuesOf<int8_t>(out[0]), (std::vector<int8_t>{44, -1, -128, 127, 1}));
  EXPECT_EQ(ValuesOf<uint8_t>(out[1]), (std::vector<uint8_t>{44, 255, 128, 127, 1}));
  EXPECT_EQ(ValuesOf<uint32_t>(out[2]),
            (std::vector<uint32_t>{300, UINT32_MAX, 128, 4294967167u, 65537}));
  EXPECT_EQ(ValuesOf<uint64_t>(out[3]),
            (std::vector<uint64_t>{300, UINT64_MAX, 128, UINT64_MAX - 128, 65537}));
  EXPECT_EQ(ValuesOf<int16_t>(out[4]), (std::vector<int16_t>{300, -1, 128, -129, 1}));
  EXPECT_EQ(ValuesOf<int64_t>(out[5]), (std::vector<int64_t>{300, -1, 128, -129, 65537}));

  ASSERT_OK_AND_ASSIGN(
      Element u, MapOne({Tensor::FromVector<uint64_t>({UINT64_MAX, (uint64_t{1} << 40) + 5,
                                                       uint64_t{1} << 63})},
                        Function({x.Cast(DType::kInt64), x.Cast(DType::kInt32),
                                  x.Cast(DType::kUInt16)})));
  EXPECT_EQ(ValuesOf<int64_t>(u[0]), (std::vector<int64_t>{-1, (int64_t{1} << 40) + 5, INT64_MIN}));
  EXPECT_EQ(ValuesOf<int32_t>(u[1]), (std::vector<int32_t>{-1, 5, 0}));
  EXPECT_EQ(ValuesOf<uint16_t>(u[2]), (std::vector<uint16_t>{65535, 5, 0}));
  ASSERT_OK_AND_ASSIGN(Element s, MapOne({Tensor::FromVector<int16_t>({-32768, -1})},
                                         Function({x.Cast(DType::kUInt16)})));
  EXPECT_EQ(ValuesOf<uint16_t>(s[0]), (std::vector<uint16_t>{32768, 65535}));
}

TEST(CastTest, IntegerToFloatRounds) {
  ASSERT_OK_AND_ASSIGN(
      Element out,
      MapOne({Tensor::FromVector<int32_t>({16777217, -16777217, 3})},
             Function({x.Cast(DType::kFloat32), x.Cast(DType::kFloat64)})));
  EXPECT_EQ(ValuesOf<float>(out[0]), (std::vector<float>{16777216.f, -16777216.f, 3.f}));
  EXPECT_EQ(ValuesOf<double>(out[1]), (std::vector<double>{16777217.0, -16777217.0, 3.0}));
}

TEST(CastTest, CastOfLiteralsAndToTheSameDType) {
  // A cast literal is strong: it no longer adopts the other operand's dtype.
  Dataset ds = Scalars<int8_t>({1}).Map(x + expr::Lift(1).Cast(DType::kInt8));
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(std::vector<int8_t> v, CollectScalars<int8_t>(ds));
  EXPECT_EQ(v, (std::vector<int8_t>{2}));
  EXPECT_STATUS(Scalars<int8_t>({1}).Map(x + expr::Lift(1).Cast(DType::kInt16)).status(), kInvalid,
                "dtype mismatch");
  // A bare literal output materializes as int64 / float64.
  Dataset lit = Dataset::Range(2).Map(Function({expr::Lift(3), expr::Lift(0.5),
                                                expr::Lift(2.5).Cast(DType::kInt32)}));
  ASSERT_OK(lit.status());
  EXPECT_EQ(lit.element_spec().ToString(), "(int64[], float64[], int32[])");
  ASSERT_OK_AND_ASSIGN(std::vector<Element> all, Collect(lit));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1][0].at<int64_t>(0), 3);
  EXPECT_EQ(all[1][1].at<double>(0), 0.5);
  EXPECT_EQ(all[1][2].at<int32_t>(0), 2);
  // A cast to the input's own dtype leaves values unchanged.
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> same,
                       CollectScalars<int64_t>(Dataset::Range(3).Map(x.Cast(DType::kInt64))));
  EXPECT_EQ(same, (std::vector<int64_t>{0, 1, 2}));
}

// ---------------------------------------------------------------------------
// Bool
// ---------------------------------------------------------------------------

TEST(BoolExprTest, LogicalOps) {
  Element in = {Tensor::FromVector<bool>({true, true, false, false}),
                Tensor::FromVector<bool>({true, false, true, false})};
  Dataset ds = Dataset::FromTensors({in}).Map(
      Function({x[0] && x[1], x[0] || x[1], !x[0], x[0] == x[1], x[0] != x[1], x[0] && true,
                false || x[1], !(x[0] && x[1]), x[0] && Expr::Constant(Tensor::Scalar<bool>(false))}));
  ASSERT_OK(ds.status());
  ASSERT_EQ(ds.element_spec().components.size(), 9u);
  for (const auto& c : ds.element_spec().components) EXPECT_EQ(c.ToString(), "bool[4]");
  ASSERT_OK_AND_ASSIGN(std::vector<Element> all, Collect(ds));
  ASSERT_EQ(all.size(), 1u);
  const Element& o = all[0];
  ASSERT_EQ(o.size(), 9u);
  for (const Tensor& t : o) ASSERT_EQ(t.dtype(), DType::kBool);
  EXPECT_EQ(ValuesOf<bool>(o[0]), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(ValuesOf<bool>(o[1]), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(ValuesOf<bool>(o[2]), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(ValuesOf<bool>(o[3]), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(ValuesOf<bool>(o[4]), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(ValuesOf<bool>(o[5]), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(ValuesOf<bool>(o[6]), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(ValuesOf<bool>(o[7]), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(ValuesOf<bool>(o[8]), (std::vector<bool>{false, false, false, false}));
  // Stored bools are canonical 0/1 bytes.
  for (const Tensor& t : o) {
    for (int64_t i = 0; i < t.num_elements(); ++i) EXPECT_LE(t.data()[i], 1);
  }
}

TEST(BoolExprTest, LogicalOpsOnScalars) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<bool> v,
      CollectScalars<bool>(ScalarPairs<bool>({{true, true}, {true, false}, {false, true},
                                               {false, false}})
                               .Map(Function({(x[0] || x[1]) && !(x[0] && x[1])}))));
  EXPECT_EQ(v, (std::vector<bool>{false, true, true, false}));
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> f,
                       CollectScalars<int64_t>(Dataset::Range(10).Filter((x > 2) && (x < 6))));
  EXPECT_EQ(f, (std::vector<int64_t>{3, 4, 5}));
  ASSERT_OK_AND_ASSIGN(f, CollectScalars<int64_t>(Dataset::Range(10).Filter(x < 3 || x > 7)));
  EXPECT_EQ(f, (std::vector<int64_t>{0, 1, 2, 8, 9}));
  ASSERT_OK_AND_ASSIGN(f, CollectScalars<int64_t>(Dataset::Range(10).Filter(!(x % 3 == 0))));
  EXPECT_EQ(f, (std::vector<int64_t>{1, 2, 4, 5, 7, 8}));
  ASSERT_OK_AND_ASSIGN(f, CollectScalars<int64_t>(
                              Dataset::Range(6).Filter((x % 2 == 0) != (x < 3))));
  EXPECT_EQ(f, (std::vector<int64_t>{1, 4}));
}

TEST(BoolExprTest, CastFromBoolToEveryDType) {
  const std::vector<bool> src = {true, false, true};
  for (DType d : kAllDTypes) {
    if (d == DType::kString) continue;
    SCOPED_TRACE(DTypeName(d));
    ASSERT_OK_AND_ASSIGN(Element out, MapOne({Tensor::FromVector<bool>(src)},
                                             Function({x.Cast(d), x.Cast(d) == x.Cast(d)})));
    VisitType(d, [&]<typename U>() {
      ASSERT_EQ(out[0].dtype(), d);
      EXPECT_EQ(out[0].shape().dims(), std::vector<int64_t>{3});
      EXPECT_EQ(ValuesOf<U>(out[0]), (std::vector<Cmp<U>>{Cmp<U>(1), Cmp<U>(0), Cmp<U>(1)}));
    });
    EXPECT_EQ(ValuesOf<bool>(out[1]), (std::vector<bool>{true, true, true}));
  }
  // Back and forth through a numeric type.
  ASSERT_OK_AND_ASSIGN(Element rt, MapOne({Tensor::FromVector<bool>(src)},
                                          Function({(x.Cast(DType::kInt32) + 5)
                                                        .Cast(DType::kBool)})));
  EXPECT_EQ(ValuesOf<bool>(rt[0]), (std::vector<bool>{true, true, true}));
}

TEST(BoolExprTest, CastToBoolIsNonZero) {
  ASSERT_OK_AND_ASSIGN(
      Element out,
      MapOne({Tensor::FromVector<float>({0.f, -0.f, 0.25f, -3.f, 1e-30f})},
             Function({x.Cast(DType::kBool), x.Cast(DType::kInt32).Cast(DType::kBool)})));
  EXPECT_EQ(ValuesOf<bool>(out[0]), (std::vector<bool>{false, false, true, true, true}));
  EXPECT_EQ(ValuesOf<bool>(out[1]), (std::vector<bool>{false, false, false, true, false}));
  ASSERT_OK_AND_ASSIGN(std::vector<bool> v, CollectScalars<bool>(
                                                Scalars<uint64_t>({0, uint64_t{1} << 63, 256})
                                                    .Map(x.Cast(DType::kBool))));
  EXPECT_EQ(v, (std::vector<bool>{false, true, true}));
}

TEST(BoolExprTest, ArithmeticOnBoolIsAnErrorAtDefinition) {
  Dataset b = Dataset::FromTensors({{Tensor::Scalar<bool>(true), Tensor::Scalar<bool>(false)}});
  ASSERT_OK(b.status());
  struct Case {
    Function fn;
    const char* op;
  };
  std::vector<Case> cases = {
      {x[0] + x[1], "add"},          {x[0] - x[1], "sub"},
      {x[0] * x[1], "mul"},          {x[0] / x[1], "div"},
      {x[0] % x[1], "mod"},          {expr::Min(x[0], x[1]), "min"},
      {expr::Max(x[0], x[1]), "max"}, {-x[0], "neg"},
      {expr::Abs(x[1]), "abs"},      {x[0] + true, "add"},
      {x[0] + 1, "add"},             {x[0] == 1, "equal"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.op);
    Dataset ds = b.Map(c.fn);
    EXPECT_STATUS(ds.status(), kInvalid, c.op);
    EXPECT_STATUS(ds.status(), kInvalid, "Map");
    EXPECT_STATUS(ds.MakeIterator(), kInvalid, c.op);
  }
  // The messages say why.
  EXPECT_STATUS(b.Map(x[0] + x[1]).status(), kInvalid, "bool");
  EXPECT_STATUS(b.Map(x[0] + 1).status(), kInvalid, "numeric literal");
  // Arithmetic is fine once the bools are cast to a numeric dtype.
  ASSERT_OK(b.Map(x[0].Cast(DType::kInt8) + x[1].Cast(DType::kInt8)).status());
}

TEST(BoolExprTest, LogicalOpsOnNonBoolAreErrors) {
  Dataset i = Dataset::Range(3);
  EXPECT_STATUS(i.Map(x && x).status(), kInvalid, "logical_and");
  EXPECT_STATUS(i.Map(x && x).status(), kInvalid, "bool");
  EXPECT_STATUS(i.Map(x || (x > 1)).status(), kInvalid, "logical_or");
  EXPECT_STATUS(i.Map(!x).status(), kInvalid, "logical_not");
  EXPECT_STATUS(i.Map(!x).status(), kInvalid, "int64");
  EXPECT_STATUS(i.Map((x > 1) && 1).status(), kInvalid, "logical_and");
  EXPECT_STATUS(i.Map(Function(expr::Lift(1) && expr::Lift(0))).status(), kInvalid,
                "logical_and");
  EXPECT_STATUS(i.Map(!expr::Lift(1)).status(), kInvalid, "logical_not");
  Dataset f = Dataset::FromTensors({{Tensor::Scalar<float>(1.f)}});
  EXPECT_STATUS(f.Map(!x).status(), kInvalid, "logical_not");
  EXPECT_STATUS(f.Filter(x && (x > 0.5)).status(), kInvalid, "logical_and");
}

// ---------------------------------------------------------------------------
// Type errors at definition time
// ---------------------------------------------------------------------------

TEST(TypeErrorTest, MismatchedDTypes) {
  Dataset ds = Dataset::FromTensors(
      {{Tensor::Scalar<int32_t>(1), Tensor::Scalar<float>(2.f)}});
  ASSERT_OK(ds.status());
  Dataset bad = ds.Map(x[0] + x[1]);
  EXPECT_STATUS(bad.status(), kInvalid, "Map: op 'add'");
  EXPECT_STATUS(bad.status(), kInvalid, "dtype mismatch: int32 vs float32");
  // The error sticks: later steps and MakeIterator keep it.
  EXPECT_STATUS(bad.Map(x * 2).status(), kInvalid, "dtype mismatch");
  EXPECT_STATUS(bad.MakeIterator(), kInvalid, "dtype mismatch");
  EXPECT_STATUS(bad.Serialize(), kInvalid, "dtype mismatch");
  // Nested: the innermost offending op is named.
  EXPECT_STATUS(ds.Map((x[0] * 2) < x[1]).status(), kInvalid, "less");
  // A strong constant does not adopt.
  EXPECT_STATUS(Dataset::Range(3).Map(x + Expr::Constant(Tensor::Scalar<int32_t>(1))).status(),
                kInvalid, "int64 vs int32");
  // With a cast it works.
  Dataset ok = ds.Map(x[0].Cast(DType::kFloat32) + x[1]);
  ASSERT_OK(ok.status());
  ASSERT_OK_AND_ASSIGN(std::vector<float> v, CollectScalars<float>(ok));
  EXPECT_EQ(v, std::vector<float>{3.f});
}

TEST(TypeErrorTest, FractionalLiteralWithIntOperand) {
  Dataset ds = Dataset::Range(3);
  EXPECT_STATUS(ds.Map(x + 0.5).status(), kInvalid, "add");
  EXPECT_STATUS(ds.Map(x + 0.5).status(), kInvalid, "fractional literal");
  EXPECT_STATUS(ds.Map(0.5 * x).status(), kInvalid, "mul");
  EXPECT_STATUS(ds.Map(x == 1.0).status(), kInvalid, "fractional literal");
  // Fine with a float operand.
  ASSERT_OK_AND_ASSIGN(std::vector<double> v,
                       CollectScalars<double>(ds.Map(x.Cast(DType::kFloat64) + 0.5)));
  EXPECT_EQ(v, (std::vector<double>{0.5, 1.5, 2.5}));
}

TEST(TypeErrorTest, LiteralThatDoesNotFit) {
  Dataset u8 = Scalars<uint8_t>({1});
  EXPECT_STATUS(u8.Map(x + 300).status(), kInvalid, "literal 300 does not fit in uint8");
  EXPECT_STATUS(u8.Map(x + 300).status(), kInvalid, "add");
  EXPECT_STATUS(u8.Map(x + 256).status(), kInvalid, "does not fit");
  ASSERT_OK(u8.Map(x + 255).status());
  Dataset i8 = Scalars<int8_t>({1});
  EXPECT_STATUS(i8.Map(x + (-129)).status(), kInvalid, "literal -129 does not fit in int8");
  EXPECT_STATUS(i8.Map(x + 128).status(), kInvalid, "does not fit");
  ASSERT_OK(i8.Map(x + (-128)).status());
  ASSERT_OK(i8.Map(x + 127).status());
  for (Dataset u : {Scalars<uint8_t>({1}), Scalars<uint16_t>({1}), Scalars<uint32_t>({1}),
                    Scalars<uint64_t>({1})}) {
    EXPECT_STATUS(u.Map(x + (-1)).status(), kInvalid, "literal -1 does not fit");
    EXPECT_STATUS(u.Map(x - (-1)).status(), kInvalid, "sub");
  }
  EXPECT_STATUS(Scalars<uint32_t>({1}).Map(x + 4294967296LL).status(), kInvalid, "does not fit");
  ASSERT_OK(Scalars<uint32_t>({1}).Map(x + 4294967295LL).status());
  EXPECT_STATUS(Scalars<int32_t>({1}).Map(x * 2147483648LL).status(), kInvalid, "does not fit");
  ASSERT_OK(Scalars<int32_t>({1}).Map(x * -2147483648LL).status());
}

TEST(TypeErrorTest, ComposedLiteralThatDoesNotFit) {
  // Literals combined with each other stay weak; the combined value must fit
  // the dtype it adopts, and that is a definition-time error like a plain
  // literal's.
  Dataset u8 = Scalars<uint8_t>({1});
  EXPECT_STATUS(u8.Map(x + (expr::Lift(200) + 200)).status(), kInvalid,
                "literal 400 does not fit in uint8");
  EXPECT_STATUS(u8.Map(x * -expr::Lift(1)).status(), kInvalid, "literal -1 does not fit in uint8");
  EXPECT_STATUS(Scalars<int8_t>({1}).Map(x < expr::Lift(64) * 2).status(), kInvalid,
                "literal 128 does not fit in int8");
  EXPECT_STATUS(Scalars<int32_t>({1}).Map(x + (expr::Lift(1) + 0.5)).status(), kInvalid,
                "fractional literal 1.5");
  // Combinations that fit are fine and evaluate in the adopted dtype.
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> v,
                       CollectScalars<uint8_t>(u8.Map(x + (expr::Lift(100) + 100))));
  EXPECT_EQ(v, std::vector<uint8_t>{201});
  ASSERT_OK_AND_ASSIGN(std::vector<int8_t> w,
                       CollectScalars<int8_t>(Scalars<int8_t>({1}).Map(x * -expr::Lift(128))));
  EXPECT_EQ(w, std::vector<int8_t>{-128});
  // Division by zero among literals stays a run-time error.
  Dataset div = Dataset::Range(2).Map(x + expr::Lift(1) / 0);
  ASSERT_OK(div.status());
  EXPECT_STATUS(Collect(div), kInvalid, "division by zero");
}

TEST(TypeErrorTest, ComponentErrors) {
  Dataset pair = Dataset::FromTensors({{Tensor::Scalar<int64_t>(1), Tensor::Scalar<int64_t>(2)}});
  ASSERT_OK(pair.status());
  EXPECT_STATUS(pair.Map(x + 1).status(), kInvalid, "use x[i]");
  EXPECT_STATUS(pair.Map(x + 1).status(), kInvalid, "2 components");
  EXPECT_STATUS(pair.Map(Function({x[0], x})).status(), kInvalid, "use x[i]");
  EXPECT_STATUS(pair.Filter(x > 0).status(), kInvalid, "use x[i]");
  EXPECT_STATUS(pair.Map(x[5] + 1).status(), kInvalid, "x[5] is out of range");
  EXPECT_STATUS(pair.Map(x[2]).status(), kInvalid, "x[2] is out of range");
  EXPECT_STATUS(pair.Map(Function({x[0], x[1] * x[2]})).status(), kInvalid, "out of range");
  EXPECT_STATUS(pair.Map(Expr::Component(-2)).status(), kInvalid, "component");
  // x[0] on a single-component element is fine, and the same as x.
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> v,
                       CollectScalars<int64_t>(Dataset::Range(3).Map(x[0] * 2 + x)));
  EXPECT_EQ(v, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_STATUS(Dataset::Range(3).Map(x[1]).status(), kInvalid, "x[1] is out of range");
}

TEST(TypeErrorTest, StringsAreNotSupported) {
  Dataset s = Dataset::FromTensors({{Tensor::String("a")}, {Tensor::String("b")}});
  ASSERT_OK(s.status());
  EXPECT_STATUS(s.Map(x + 1).status(), kInvalid, "string");
  EXPECT_STATUS(s.Map(x == x).status(), kInvalid, "string");
  EXPECT_STATUS(s.Map(x * x).status(), kInvalid, "mul");
  EXPECT_STATUS(s.Map(-x).status(), kInvalid, "neg");
  EXPECT_STATUS(s.Map(expr::Abs(x)).status(), kInvalid, "string");
  EXPECT_STATUS(s.Map(!x).status(), kInvalid, "logical_not");
  EXPECT_STATUS(s.Map(x && x).status(), kInvalid, "string");
  EXPECT_STATUS(s.Map(expr::Max(x, x)).status(), kInvalid, "string");
  EXPECT_STATUS(s.Map(x.Cast(DType::kString)).status(), kInvalid, "cast");
  EXPECT_STATUS(s.Filter(x == x).status(), kInvalid, "string");
  Dataset zipped = Dataset::Zip({Dataset::Range(2), s});
  ASSERT_OK(zipped.status());
  EXPECT_STATUS(zipped.Map(x[0] + x[1]).status(), kInvalid, "string");
  EXPECT_STATUS(zipped.Map(x[1].Cast(DType::kInt64)).status(), kInvalid, "string");
  EXPECT_STATUS(Dataset::Range(2).Map(x == Expr::Constant(Tensor::String("a"))).status(),
                kInvalid, "string");
  EXPECT_STATUS(Dataset::Range(2).Map(-Expr::Constant(Tensor::String("a"))).status(), kInvalid,
                "string");
}

TEST(TypeErrorTest, ShapesThatDoNotBroadcast) {
  Dataset ds = Dataset::FromTensors({{Tensor::FromVector<int32_t>({1, 2}),
                                      Tensor::FromVector<int32_t>({1, 2, 3})}});
  ASSERT_OK(ds.status());
  EXPECT_STATUS(ds.Map(x[0] + x[1]).status(), kInvalid, "shapes [2] and [3] do not match");
  EXPECT_STATUS(ds.Map(x[0] + x[1]).status(), kInvalid, "add");
  EXPECT_STATUS(ds.Map(x[0] < x[1]).status(), kInvalid, "less");
  EXPECT_STATUS(
      ds.Map(x[0] * Expr::Constant(Tensor::FromVector<int32_t>({1, 2, 3, 4}))).status(), kInvalid,
      "do not match");
  // Rank differs: [2] vs [2,1] does not broadcast either.
  ASSERT_OK_AND_ASSIGN(Tensor m, Tensor::FromVector<int32_t>({1, 2}, TensorShape({2, 1})));
  EXPECT_STATUS(ds.Map(x[0] + Expr::Constant(m)).status(), kInvalid, "do not match");
  // Matching shapes and scalars are fine.
  ASSERT_OK(ds.Map(Function({x[0] + x[0], x[1] * 2, x[1] + Expr::Constant(Tensor::Scalar<int32_t>(
                                                                 1))}))
                .status());
}

TEST(TypeErrorTest, ShapesCheckedAtRunTimeWhenUnknown) {
  // Element shapes differ, so the spec has unknown dims; the mismatch in the
  // second element is an error when it is reached.
  Dataset ds = Dataset::FromTensors(
      {{Tensor::FromVector<int32_t>({1, 2}), Tensor::FromVector<int32_t>({10, 20})},
       {Tensor::FromVector<int32_t>({1, 2, 3}), Tensor::FromVector<int32_t>({10, 20})}});
  ASSERT_OK(ds.status());
  Dataset sum = ds.Map(x[0] + x[1]);
  ASSERT_OK(sum.status());
  EXPECT_EQ(sum.element_spec().ToString(), "(int32[2])");
  ASSERT_OK_AND_ASSIGN(auto it, sum.MakeIterator());
  auto first = it->Next();
  ASSERT_OK(first);
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(ValuesOf<int32_t>((**first)[0]), (std::vector<int32_t>{11, 22}));
  EXPECT_STATUS(it->Next(), kInvalid, "do not match");
}

TEST(TypeErrorTest, FilterPredicateMustBeABoolScalar) {
  Dataset r = Dataset::Range(5);
  EXPECT_STATUS(r.Filter(x + 1).status(), kInvalid, "Filter");
  EXPECT_STATUS(r.Filter(x + 1).status(), kInvalid, "bool scalar");
  EXPECT_STATUS(r.Filter(x.Cast(DType::kFloat32)).status(), kInvalid, "Filter");
  EXPECT_STATUS(r.Filter(Function({x > 1, x < 3})).status(), kInvalid, "Filter");
  Dataset v = Dataset::FromTensors({{Tensor::FromVector<int64_t>({1, 2})}});
  EXPECT_STATUS(v.Filter(x > 1).status(), kInvalid, "Filter");
  EXPECT_STATUS(v.Filter(x > 1).status(), kInvalid, "bool scalar");
  // Errors inside the predicate name the Filter op as well.
  EXPECT_STATUS(r.Filter(x + 0.5 > 1).status(), kInvalid, "Filter: op 'add'");
}

TEST(TypeErrorTest, CastToOrFromString) {
  EXPECT_STATUS(Dataset::Range(3).Map(x.Cast(DType::kString)).status(), kInvalid, "cast");
  EXPECT_STATUS(Dataset::Range(3).Map(x.Cast(DType::kString)).status(), kInvalid, "string");
  EXPECT_STATUS(
      Dataset::Range(3).Map(Expr::Constant(Tensor::String("7")).Cast(DType::kInt64)).status(),
      kInvalid, "string");
  EXPECT_STATUS(Dataset::Range(3).Map(x.Cast(static_cast<DType>(99))).status(), kInvalid,
                "cast");
}

TEST(TypeErrorTest, EmptyFunctionIsAnError) {
  EXPECT_STATUS(Dataset::Range(3).Map(Function(std::vector<Expr>{})).status(), kInvalid,
                "no outputs");
}

// ---------------------------------------------------------------------------
// Tuple outputs
// ---------------------------------------------------------------------------

TEST(TupleTest, MapOverZip) {
  Dataset ds = Dataset::Zip({Dataset::Range(3), Dataset::Range(10, 13)})
                   .Map({x[0] + x[1], x[0] * 2});
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(int64[], int64[])");
  EXPECT_EQ(ds.Cardinality(), 3);
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> sums, CollectScalars<int64_t>(ds, 0));
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> twice, CollectScalars<int64_t>(ds, 1));
  EXPECT_EQ(sums, (std::vector<int64_t>{10, 12, 14}));
  EXPECT_EQ(twice, (std::vector<int64_t>{0, 2, 4}));
}

TEST(TupleTest, MapOverFromTensorsPairsAndChainedTuples) {
  Dataset ds = ScalarPairs<int32_t>({{1, 2}, {3, 4}, {-5, 6}})
                   .Map({x[0] + x[1], x[0] * 2, x[1].Cast(DType::kFloat32) / 4})
                   .Map({x[2], x[0] - x[1]});
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(float32[], int32[])");
  ASSERT_OK_AND_ASSIGN(std::vector<float> a, CollectScalars<float>(ds, 0));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, CollectScalars<int32_t>(ds, 1));
  EXPECT_EQ(a, (std::vector<float>{0.5f, 1.f, 1.5f}));
  EXPECT_EQ(b, (std::vector<int32_t>{1, 1, 11}));
  // One output from a tuple input, and Filter on a tuple.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> c,
                       CollectScalars<int32_t>(ScalarPairs<int32_t>({{1, 2}, {3, 4}, {-5, 6}})
                                                   .Filter(x[0] > 0)
                                                   .Map(x[1] - x[0])));
  EXPECT_EQ(c, (std::vector<int32_t>{1, 1}));
}

TEST(TupleTest, PassThroughIsZeroCopy) {
  Element in = {Tensor::FromVector<int64_t>({1, 2, 3}), Tensor::FromVector<float>({4, 5, 6})};
  Dataset base = Dataset::FromTensors({in});
  ASSERT_OK_AND_ASSIGN(std::vector<Element> src, Collect(base));
  ASSERT_EQ(src.size(), 1u);
  Dataset ds = base.Map({x[0] + 1, x[1], x[0]});
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(std::vector<Element> out, Collect(ds));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].size(), 3u);
  EXPECT_EQ(ValuesOf<int64_t>(out[0][0]), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(out[0][1].Equals(src[0][1]));
  EXPECT_EQ(out[0][1].data(), src[0][1].data());
  EXPECT_EQ(out[0][2].data(), src[0][0].data());
  EXPECT_NE(out[0][0].data(), src[0][0].data());
  // The input is not modified by the computed output.
  EXPECT_EQ(ValuesOf<int64_t>(src[0][0]), (std::vector<int64_t>{1, 2, 3}));
  // Identity map of a single component, too.
  Dataset single = Dataset::FromTensors({{in[0]}});
  ASSERT_OK_AND_ASSIGN(std::vector<Element> id_src, Collect(single));
  ASSERT_OK_AND_ASSIGN(std::vector<Element> id, Collect(single.Map(x)));
  ASSERT_EQ(id.size(), 1u);
  EXPECT_EQ(id[0][0].data(), id_src[0][0].data());
}

TEST(TupleTest, StringComponentsPassThrough) {
  // A string component cannot be computed on, but it can be passed through
  // unchanged (zero copy) next to computed components.
  Dataset names = Dataset::FromTensors({{Tensor::String("a")}, {Tensor::String("bc")}});
  Dataset zipped = Dataset::Zip({Dataset::Range(2), names});
  ASSERT_OK(zipped.status());
  ASSERT_OK_AND_ASSIGN(std::vector<Element> src, Collect(zipped));
  Dataset ds = zipped.Map({x[0] + 1, x[1]});
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(int64[], string[])");
  ASSERT_OK_AND_ASSIGN(std::vector<Element> out, Collect(ds));
  ASSERT_EQ(out.size(), 2u);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i].size(), 2u);
    EXPECT_EQ(out[i][0].at<int64_t>(0), static_cast<int64_t>(i) + 1);
    ASSERT_EQ(out[i][1].dtype(), DType::kString);
    EXPECT_EQ(out[i][1].str(0), i == 0 ? "a" : "bc");
    EXPECT_EQ(out[i][1].data(), src[i][1].data());
  }
  // The identity on a string dataset, and Filter on the other component.
  ASSERT_OK_AND_ASSIGN(std::vector<Element> same, Collect(names.Map(x)));
  ASSERT_EQ(same.size(), 2u);
  EXPECT_EQ(same[1][0].str(0), "bc");
  ASSERT_OK_AND_ASSIGN(std::vector<Element> kept, Collect(zipped.Filter(x[0] > 0).Map(x[1])));
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0][0].str(0), "bc");
  // Filtering on a string is still an error.
  EXPECT_STATUS(names.Filter(x).status(), kInvalid, "Filter");
}

// ---------------------------------------------------------------------------
// Element spec inference
// ---------------------------------------------------------------------------

TEST(ElementSpecTest, InferredDTypesAndShapes) {
  Dataset i8 = Scalars<int8_t>({1, 2});
  EXPECT_EQ(i8.Map(x + 1).element_spec().ToString(), "(int8[])");
  EXPECT_EQ(i8.Map(2 * x - 3).element_spec().ToString(), "(int8[])");
  EXPECT_EQ(i8.Map(x < 1).element_spec().ToString(), "(bool[])");
  EXPECT_EQ(i8.Map(x.Cast(DType::kFloat16)).element_spec().ToString(), "(float16[])");
  EXPECT_EQ(i8.Map(x.Cast(DType::kFloat16) * 0.5).element_spec().ToString(), "(float16[])");
  EXPECT_EQ(i8.Map(!(x == 1)).element_spec().ToString(), "(bool[])");
  EXPECT_EQ(Dataset::Range(3).Map(x + 1).element_spec().ToString(), "(int64[])");
  EXPECT_EQ(Dataset::Range(3).Map(expr::Lift(1) + 2).element_spec().ToString(), "(int64[])");
  EXPECT_EQ(Dataset::Range(3).Map(expr::Lift(1) + 2.5).element_spec().ToString(), "(float64[])");

  ASSERT_OK_AND_ASSIGN(Tensor m, Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, TensorShape({2, 3})));
  Dataset mat = Dataset::FromTensors({{m, Tensor::Scalar<float>(2.f)}});
  Dataset ds = mat.Map(Function({x[0] * x[1], x[1] - 1, x[0] > x[1], x[0].Cast(DType::kInt32),
                                 x[1] + Expr::Constant(m)}));
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(),
            "(float32[2,3], float32[], bool[2,3], int32[2,3], float32[2,3])");
  ASSERT_OK_AND_ASSIGN(std::vector<Element> out, Collect(ds));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0][0].shape(), TensorShape({2, 3}));
  EXPECT_EQ(ValuesOf<float>(out[0][0]), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(ValuesOf<bool>(out[0][2]), (std::vector<bool>{false, false, true, true, true, true}));
  EXPECT_EQ(out[0][4].shape(), TensorShape({2, 3}));

  // Unknown dims are filled in from the other operand.
  Dataset ragged = Dataset::FromTensors({{Tensor::FromVector<int32_t>({1, 2, 3})},
                                         {Tensor::FromVector<int32_t>({4})}});
  ASSERT_OK(ragged.status());
  EXPECT_EQ(ragged.element_spec().ToString(), "(int32[?])");
  EXPECT_EQ(ragged.Map(x * 2).element_spec().ToString(), "(int32[?])");
  EXPECT_EQ(ragged.Map(x + Expr::Constant(Tensor::FromVector<int32_t>({1, 1, 1})))
                .element_spec()
                .ToString(),
            "(int32[3])");
}

// ---------------------------------------------------------------------------
// The seed example
// ---------------------------------------------------------------------------

TEST(SeedTest, MapMapAndFilter) {
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> v,
                       CollectScalars<int64_t>(Dataset::Range(5).Map(x * x).Map(x + 1)));
  EXPECT_EQ(v, (std::vector<int64_t>{1, 2, 5, 10, 17}));
  ASSERT_OK_AND_ASSIGN(v, CollectScalars<int64_t>(Dataset::Range(10).Filter(x % 2 == 0)));
  EXPECT_EQ(v, (std::vector<int64_t>{0, 2, 4, 6, 8}));
  ASSERT_OK_AND_ASSIGN(
      v, CollectScalars<int64_t>(Dataset::Range(10).Map(x * x).Map(x + 1).Filter(x % 2 == 0)));
  EXPECT_EQ(v, (std::vector<int64_t>{2, 10, 26, 50, 82}));
  // Negative Range values: truncating %.
  ASSERT_OK_AND_ASSIGN(v, CollectScalars<int64_t>(Dataset::Range(-5, 0).Map(x % 2)));
  EXPECT_EQ(v, (std::vector<int64_t>{-1, 0, -1, 0, -1}));
}

// ---------------------------------------------------------------------------
// Serialization and fingerprints
// ---------------------------------------------------------------------------

Dataset ExprPipeline(int64_t k, float f, bool flag) {
  Dataset halves = Dataset::FromTensors(
      {{Tensor::FromVector<Float16>({Float16(1.5f), Float16(-2.f)}), Tensor::Scalar<bool>(true)},
       {Tensor::FromVector<Float16>({Float16(0.25f), Float16(8.f)}), Tensor::Scalar<bool>(false)}});
  Dataset r = Dataset::Range(10)
                  .Map(x * Expr::Constant(Tensor::Scalar<int64_t>(k)) + 1)
                  .Filter(x % 3 != 0)
                  .Map({x, x.Cast(DType::kFloat32) * Expr::Constant(Tensor::Scalar<float>(f)),
                        x.Cast(DType::kUInt8) - 3, expr::Abs(-x) > 4});
  Dataset z = Dataset::Zip({r, halves})
                  .Map({x[0] + Expr::Constant(Tensor::FromVector<int64_t>({1, 2})), x[4] * 0.5,
                        x[5] && Expr::Constant(Tensor::Scalar<bool>(flag)), x[1], x[2], x[3]});
  return z;
}

TEST(SerializationTest, RoundTripYieldsTheSameElements) {
  Dataset ds = ExprPipeline(3, 0.5f, true);
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(std::vector<Element> want, Collect(ds));
  ASSERT_EQ(want.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::string bytes, ds.Serialize());
  ASSERT_OK_AND_ASSIGN(Dataset back, Dataset::Deserialize(bytes));
  ASSERT_OK(back.status());
  EXPECT_EQ(back.element_spec().ToString(), ds.element_spec().ToString());
  EXPECT_EQ(back.element_spec().ToString(),
            "(int64[2], float16[2], bool[], float32[], uint8[], bool[])");
  EXPECT_EQ(back.Fingerprint(), ds.Fingerprint());
  ASSERT_OK_AND_ASSIGN(std::vector<Element> got, Collect(back));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(ElementsEqual(got[i], want[i]))
        << ElementDebugString(got[i]) << " vs " << ElementDebugString(want[i]);
  }
  // Spot-check the values: Range -> 3x+1 = 1,4,7,10,13,... keep %3 != 0 -> all.
  EXPECT_EQ(ValuesOf<int64_t>(got[0][0]), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ValuesOf<int64_t>(got[1][0]), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(ValuesOf<Float16>(got[0][1]), (std::vector<float>{0.75f, -1.f}));
  EXPECT_EQ(ValuesOf<Float16>(got[1][1]), (std::vector<float>{0.125f, 4.f}));
  EXPECT_TRUE(got[0][2].at<bool>(0));
  EXPECT_FALSE(got[1][2].at<bool>(0));
  EXPECT_EQ(got[1][3].at<float>(0), 2.f);
  EXPECT_EQ(got[0][4].at<uint8_t>(0), 254);
  EXPECT_EQ(got[1][4].at<uint8_t>(0), 1);
  EXPECT_FALSE(got[0][5].at<bool>(0));
  EXPECT_FALSE(got[1][5].at<bool>(0));

  // A run-time error survives the round trip too.
  Dataset division = Dataset::Range(4).Map(12 / (x - 2));
  ASSERT_OK_AND_ASSIGN(std::string dbytes, division.Serialize());
  ASSERT_OK_AND_ASSIGN(Dataset dback, Dataset::Deserialize(dbytes));
  ASSERT_OK_AND_ASSIGN(auto it, dback.MakeIterator());
  auto e0 = it->Next();
  ASSERT_OK(e0);
  EXPECT_EQ((**e0)[0].at<int64_t>(0), -6);
  auto e1 = it->Next();
  ASSERT_OK(e1);
  EXPECT_EQ((**e1)[0].at<int64_t>(0), -12);
  EXPECT_STATUS(it->Next(), kInvalid, "division by zero");
}

TEST(SerializationTest, FingerprintsOfIdenticalPipelinesMatch) {
  EXPECT_EQ(ExprPipeline(3, 0.5f, true).Fingerprint(), ExprPipeline(3, 0.5f, true).Fingerprint());
  EXPECT_NE(ExprPipeline(3, 0.5f, true).Fingerprint(), 0u);
  EXPECT_EQ(Dataset::Range(5).Map(x * x).Map(x + 1).Fingerprint(),
            Dataset::Range(5).Map(x * x).Map(x + 1).Fingerprint());
}

TEST(SerializationTest, FingerprintsDifferWhenAConstantDiffers) {
  const uint64_t base = ExprPipeline(3, 0.5f, true).Fingerprint();
  EXPECT_NE(base, ExprPipeline(4, 0.5f, true).Fingerprint());
  EXPECT_NE(base, ExprPipeline(3, 0.25f, true).Fingerprint());
  EXPECT_NE(base, ExprPipeline(3, 0.5f, false).Fingerprint());
  EXPECT_NE(Dataset::Range(5).Map(x + 1).Fingerprint(), Dataset::Range(5).Map(x + 2).Fingerprint());
  EXPECT_NE(Dataset::Range(5).Map(x + 1).Fingerprint(), Dataset::Range(5).Map(x - 1).Fingerprint());
  EXPECT_NE(Dataset::Range(5).Map(x.Cast(DType::kFloat64) + 1.5).Fingerprint(),
            Dataset::Range(5).Map(x.Cast(DType::kFloat64) + 2.5).Fingerprint());
  EXPECT_NE(
      Dataset::Range(5).Map(x * Expr::Constant(Tensor::FromVector<int64_t>({1, 2}))).Fingerprint(),
      Dataset::Range(5).Map(x * Expr::Constant(Tensor::FromVector<int64_t>({1, 3}))).Fingerprint());
  EXPECT_NE(Dataset::Range(5).Map(x.Cast(DType::kInt32)).Fingerprint(),
            Dataset::Range(5).Map(x.Cast(DType::kInt16)).Fingerprint());
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

using expr::x;

// float64 1 + 2^-11 + 2^-40 is just above the float16 midpoint 1 + 2^-11:
// it must round up to 1 + 2^-10 (via float32 it would tie and go to 1.0).
TEST(CastRoundingTest, WideToHalfRoundsOnce) {
  double v = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  Dataset ds = Dataset::FromTensors({{Tensor::Scalar<double>(v)}}).Map(x.Cast(DType::kFloat16));
  auto out = sluice_test::Collect(ds);
  ASSERT_OK(out);
  EXPECT_EQ(static_cast<float>((*out)[0][0].at<Float16>(0)), 1.0f + std::ldexp(1.0f, -10));
  // int32 2^24 + 2^16 + 1 is just above the bfloat16 midpoint 2^24 + 2^16.
  int32_t w = (1 << 24) + (1 << 16) + 1;
  Dataset di = Dataset::FromTensors({{Tensor::Scalar<int32_t>(w)}}).Map(x.Cast(DType::kBFloat16));
  auto outi = sluice_test::Collect(di);
  ASSERT_OK(outi);
  EXPECT_EQ(static_cast<float>((*outi)[0][0].at<BFloat16>(0)),
            static_cast<float>((1 << 24) + (1 << 17)));
  // Exact values stay exact; NaN stays NaN.
  Dataset de = Dataset::FromTensors({{Tensor::FromVector<double>({0.5, -2.0, std::nan("")})}})
                   .Map(x.Cast(DType::kFloat16));
  auto oute = sluice_test::Collect(de);
  ASSERT_OK(oute);
  EXPECT_EQ(static_cast<float>((*oute)[0][0].at<Float16>(0)), 0.5f);
  EXPECT_EQ(static_cast<float>((*oute)[0][0].at<Float16>(1)), -2.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>((*oute)[0][0].at<Float16>(2))));
}

TEST(MinMaxNanTest, NanPropagatesWhicheverSideItIsOn) {
  Dataset ds = Dataset::FromTensors(
      {{Tensor::FromVector<float>({std::nanf(""), 1.0f}), Tensor::FromVector<float>({1.0f, std::nanf("")})}});
  auto out = sluice_test::Collect(
      ds.Map({expr::Min(x[0], x[1]), expr::Max(x[0], x[1]), expr::Min(x[1], x[0])}));
  ASSERT_OK(out);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(std::isnan((*out)[0][c].at<float>(i))) << c << "," << i;
  }
}

// ---------------------------------------------------------------------------
// Whole tensors through the vectorized, block-fused evaluator, against a
// scalar reference written out here
// ---------------------------------------------------------------------------

constexpr int64_t kBlock = internal::kExprBlockElements;

// Sizes around the evaluation block: empty, one value, a partial block, a
// block less one, exactly one, one more, and several blocks with a tail.
const std::vector<int64_t>& BlockSizes() {
  static const std::vector<int64_t> sizes = {0, 1, 7, kBlock - 1, kBlock, kBlock + 1,
                                             3 * kBlock + 5};
  return sizes;
}

// `n` pseudo-random values of T, one in eight an edge case: 0, 1, -1 and the
// limits for integers; ±0, ±1, ±inf and NaN for floats.
template <typename T>
std::vector<Cmp<T>> RandomValues(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Cmp<T>> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    if constexpr (std::is_same_v<T, bool>) {
      out.push_back((r & 1) != 0);
    } else if constexpr (kIsFloat<T>) {
      const double inf = std::numeric_limits<double>::infinity();
      const double edges[] = {0.0, -0.0, 1.0, -1.0, inf, -inf, std::nan("")};
      const double v = r % 8 == 0 ? edges[(r >> 8) % 7]
                                  : std::ldexp(static_cast<double>(r >> 11) / 9007199254740992.0 - 0.5,
                                               static_cast<int>((r >> 3) % 24) - 8);
      out.push_back(R<T>(v));
    } else {
      const T edges[] = {T(0), T(1), static_cast<T>(-1), std::numeric_limits<T>::min(),
                         std::numeric_limits<T>::max()};
      out.push_back(r % 8 == 0 ? edges[(r >> 8) % 5] : static_cast<T>(r >> 5));
    }
  }
  return out;
}

template <typename T>
uint64_t Bits(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

// `got` must hold `want` (a scalar when `scalar`, else a vector): bit for bit,
// except that a NaN matches any NaN unless `canonical_nan` (Min/Max return
// the quiet NaN). Reports the first mismatch only.
template <typename U>
void ExpectValues(const Tensor& got, const std::vector<Cmp<U>>& want, bool scalar,
                  bool canonical_nan, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(DTypeName(got.dtype()), std::string(DTypeName(DTypeOf<U>())));
  const int64_t n = static_cast<int64_t>(want.size());
  if (scalar) {
    ASSERT_TRUE(got.shape().is_scalar()) << got.DebugString();
  } else {
    ASSERT_EQ(got.shape().dims(), std::vector<int64_t>{n});
  }
  ASSERT_EQ(got.num_elements(), n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const U g = got.at<U>(i);
    const U w = FromCmp<U>(want[i]);
    bool same;
    if constexpr (kIsFloat<U>) {
      if (std::isnan(ToCmp<U>(w))) {
        same = std::isnan(ToCmp<U>(g)) &&
               (!canonical_nan ||
                Bits(g) == Bits(FromCmp<U>(std::numeric_limits<Cmp<U>>::quiet_NaN())));
      } else {
        same = Bits(g) == Bits(w);
      }
    } else {
      same = g == w;
    }
    if (!same && bad++ == 0) {
      ADD_FAILURE() << "first mismatch at " << i << " of " << n << ": got " << +ToCmp<U>(g)
                    << ", want " << +ToCmp<U>(w);
    }
  }
  EXPECT_EQ(bad, 0) << "mismatches";
}

enum class BinOp { kAdd, kSub, kMul, kDiv, kMod, kMin, kMax, kEq, kNe, kLt, kLe, kGt, kGe };
constexpr BinOp kBinOps[] = {BinOp::kAdd, BinOp::kSub, BinOp::kMul, BinOp::kDiv, BinOp::kMod,
                             BinOp::kMin, BinOp::kMax, BinOp::kEq,  BinOp::kNe,  BinOp::kLt,
                             BinOp::kLe,  BinOp::kGt,  BinOp::kGe};
constexpr const char* kBinOpNames[] = {"+", "-", "*", "/", "%", "Min", "Max",
                                       "==", "!=", "<", "<=", ">", ">="};

bool IsComparison(BinOp op) { return op >= BinOp::kEq; }

Expr ApplyBinOp(BinOp op, const Expr& a, const Expr& b) {
  switch (op) {
    case BinOp::kAdd: return a + b;
    case BinOp::kSub: return a - b;
    case BinOp::kMul: return a * b;
    case BinOp::kDiv: return a / b;
    case BinOp::kMod: return a % b;
    case BinOp::kMin: return expr::Min(a, b);
    case BinOp::kMax: return expr::Max(a, b);
    case BinOp::kEq: return a == b;
    case BinOp::kNe: return a != b;
    case BinOp::kLt: return a < b;
    case BinOp::kLe: return a <= b;
    case BinOp::kGt: return a > b;
    case BinOp::kGe: return a >= b;
  }
  return a;
}

// expr.h's arithmetic, one value at a time: integers wrap (computed in
// uint64), / and % truncate with MIN / -1 wrapping to MIN, float % is fmod,
// 16-bit floats compute in float and round back, Min/Max of a NaN is NaN.
template <typename T>
Cmp<T> RefArith(BinOp op, Cmp<T> x, Cmp<T> y) {
  using C = Cmp<T>;
  if (op == BinOp::kMin || op == BinOp::kMax) {
    if constexpr (kIsFloat<T>) {
      if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<C>::quiet_NaN();
    }
    return op == BinOp::kMin ? (y < x ? y : x) : (y > x ? y : x);
  }
  if constexpr (kIsFloat<T>) {
    switch (op) {
      case BinOp::kAdd: return R<T>(x + y);
      case BinOp::kSub: return R<T>(x - y);
      case BinOp::kMul: return R<T>(x * y);
      case BinOp::kDiv: return R<T>(x / y);
      case BinOp::kMod: return R<T>(std::fmod(x, y));
      default: break;
    }
  } else {
    const uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
    bool minus_one = false;
    if constexpr (std::is_signed_v<T>) minus_one = y == T(-1);
    switch (op) {
      case BinOp::kAdd: return static_cast<T>(ux + uy);
      case BinOp::kSub: return static_cast<T>(ux - uy);
      case BinOp::kMul: return static_cast<T>(ux * uy);
      case BinOp::kDiv: return minus_one ? static_cast<T>(0 - ux) : static_cast<T>(x / y);
      case BinOp::kMod: return minus_one ? T(0) : static_cast<T>(x % y);
      default: break;
    }
  }
  return C(0);
}

template <typename C>
bool RefCompare(BinOp op, C x, C y) {
  switch (op) {
    case BinOp::kEq: return x == y;
    case BinOp::kNe: return x != y;
    case BinOp::kLt: return x < y;
    case BinOp::kLe: return x <= y;
    case BinOp::kGt: return x > y;
    case BinOp::kGe: return x >= y;
    default: return false;
  }
}

// The H (Float16 or BFloat16) nearest to `v`, ties to even, as a float: the
// correctly rounded result of a cast from a wide type, found by comparing
// the neighbours of a nearby candidate exactly.
template <typename H>
float NearestHalf(long double v) {
  if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  const uint16_t max_bits = std::is_same_v<H, Float16> ? 0x7bff : 0x7f7f;
  H max_h, below_max;
  max_h.bits = max_bits;
  below_max.bits = max_bits - 1;
  const long double max = static_cast<float>(max_h);
  const long double ulp = max - static_cast<float>(below_max);
  if (std::fabs(v) >= max + ulp / 2) return std::copysign(std::numeric_limits<float>::infinity(), static_cast<float>(v));
  H best(static_cast<float>(v));
  if (std::isinf(static_cast<float>(best))) best.bits = static_cast<uint16_t>((best.bits & 0x8000) | max_bits);
  const H center = best;
  for (int step : {-1, 1}) {
    H h;
    h.bits = static_cast<uint16_t>(center.bits + step);
    const float f = static_cast<float>(h);
    if (std::isnan(f) || std::isinf(f)) continue;
    const long double d = std::fabs(static_cast<long double>(f) - v);
    const long double best_d = std::fabs(static_cast<long double>(static_cast<float>(best)) - v);
    if (d < best_d || (d == best_d && (h.bits & 1) == 0)) best = h;
  }
  return static_cast<float>(best);
}

// expr.h's casts, one value at a time: to bool is != 0; float to integer
// saturates (NaN to 0); wide types to the 16-bit floats round once; the rest
// wrap (integers) or round (floats) as C++ does.
template <typename To, typename From>
Cmp<To> RefCast(Cmp<From> v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != Cmp<From>(0);
  } else if constexpr (kIsHalf<To> && (std::is_same_v<From, double> ||
                                       (std::is_integral_v<From> && sizeof(From) >= 4))) {
    return NearestHalf<To>(static_cast<long double>(v));
  } else if constexpr (std::is_integral_v<To> && kIsFloat<From>) {
    if (std::isnan(v)) return To(0);
    const long double lv = v;
    if (lv <= static_cast<long double>(std::numeric_limits<To>::min())) {
      return std::numeric_limits<To>::min();
    }
    if (lv >= static_cast<long double>(std::numeric_limits<To>::max())) {
      return std::numeric_limits<To>::max();
    }
    return static_cast<To>(v);
  } else {
    return R<To>(v);
  }
}

constexpr DType kNumericDTypes[] = {
    DType::kBool,   DType::kInt8,   DType::kInt16,   DType::kInt32,    DType::kInt64,
    DType::kUInt8,  DType::kUInt16, DType::kUInt32,  DType::kUInt64,   DType::kFloat16,
    DType::kBFloat16, DType::kFloat32, DType::kFloat64};

template <typename T>
class VectorizedExprTest : public ::testing::Test {};
TYPED_TEST_SUITE(VectorizedExprTest, NumericTypes, DTypeNames);

TYPED_TEST(VectorizedExprTest, BinaryOpsMatchTheScalarReference) {
  using T = TypeParam;
  using C = Cmp<T>;
  std::vector<Expr> outputs;
  for (BinOp op : kBinOps) outputs.push_back(ApplyBinOp(op, x[0], x[1]));
  const Function fn(outputs);
  for (int64_t n : BlockSizes()) {
    std::vector<C> a = RandomValues<T>(n, 2 * n + 1), b = RandomValues<T>(n, 2 * n + 2);
    C sa = RandomValues<T>(1, n + 7)[0];
    // Integer division by zero is an error (its own test); -1 divides MIN.
    C sb = C(3);
    if constexpr (!kIsFloat<T>) {
      for (C& v : b) v = v == C(0) ? C(1) : v;
      if constexpr (std::is_signed_v<T>) {
        if (n % 2 == 1) sb = C(-1);
      }
    }
    // vector op vector, vector op scalar, scalar op vector, scalar op scalar.
    for (int mode = 0; mode < 4; ++mode) {
      const bool a_scalar = mode >= 2, b_scalar = mode == 1 || mode == 3;
      const int64_t m = mode == 3 ? 1 : n;
      Element in = {a_scalar ? ScalarOf<T>(sa) : TensorOf<T>(a),
                    b_scalar ? ScalarOf<T>(sb) : TensorOf<T>(b)};
      ASSERT_OK_AND_ASSIGN(Element out, MapOne(in, fn));
      ASSERT_EQ(out.size(), std::size(kBinOps));
      for (size_t k = 0; k < std::size(kBinOps); ++k) {
        const BinOp op = kBinOps[k];
        const std::string what = absl::StrCat("n=", n, " mode=", mode, " op ", kBinOpNames[k]);
        std::vector<C> arith;
        std::vector<bool> cmp;
        for (int64_t i = 0; i < m; ++i) {
          const C va = a_scalar ? sa : a[i], vb = b_scalar ? sb : b[i];
          if (IsComparison(op)) {
            cmp.push_back(RefCompare(op, va, vb));
          } else {
            arith.push_back(RefArith<T>(op, va, vb));
          }
        }
        if (IsComparison(op)) {
          ExpectValues<bool>(out[k], cmp, mode == 3, false, what);
        } else {
          ExpectValues<T>(out[k], arith, mode == 3, op == BinOp::kMin || op == BinOp::kMax, what);
        }
      }
    }
  }
}

TYPED_TEST(VectorizedExprTest, UnaryOpsAndCastsMatchTheScalarReference) {
  using T = TypeParam;
  using C = Cmp<T>;
  std::vector<Expr> outputs = {-x, expr::Abs(x)};
  for (DType d : kNumericDTypes) outputs.push_back(x.Cast(d));
  const Function fn(outputs);
  for (int64_t n : BlockSizes()) {
    const std::vector<C> a = RandomValues<T>(n, 3 * n + 5);
    ASSERT_OK_AND_ASSIGN(Element out, MapOne({TensorOf<T>(a)}, fn));
    ASSERT_EQ(out.size(), 2 + std::size(kNumericDTypes));
    std::vector<C> neg, abs;
    for (C v : a) {
      neg.push_back(RefArith<T>(BinOp::kSub, C(0), v));
      if constexpr (std::is_unsigned_v<T>) {
        abs.push_back(v);
      } else if constexpr (kIsFloat<T>) {
        abs.push_back(std::fabs(v));
      } else {
        abs.push_back(v < 0 ? RefArith<T>(BinOp::kSub, C(0), v) : v);
      }
    }
    if constexpr (kIsFloat<T>) {
      // -x of 0 is -0, not 0 - 0.
      for (size_t i = 0; i < a.size(); ++i) neg[i] = -a[i];
    }
    ExpectValues<T>(out[0], neg, false, false, absl::StrCat("n=", n, " neg"));
    ExpectValues<T>(out[1], abs, false, false, absl::StrCat("n=", n, " abs"));
    for (size_t k = 0; k < std::size(kNumericDTypes); ++k) {
      VisitType(kNumericDTypes[k], [&]<typename U>() {
        std::vector<Cmp<U>> want;
        for (C v : a) want.push_back(RefCast<U, T>(v));
        ExpectValues<U>(out[2 + k], want, false, false,
                        absl::StrCat("n=", n, " cast to ", DTypeName(kNumericDTypes[k])));
      });
    }
  }
}

TEST(VectorizedBoolExprTest, LogicComparisonsAndCastsMatchTheScalarReference) {
  const Function fn({x[0] && x[1], x[0] || x[1], !x[0], x[0] == x[1], x[0] != x[1], x[0] < x[1],
                     x[0] >= x[1], x[0].Cast(DType::kInt32), x[0].Cast(DType::kFloat16)});
  for (int64_t n : BlockSizes()) {
    const std::vector<bool> a = RandomValues<bool>(n, 5 * n + 1),
                            b = RandomValues<bool>(n, 5 * n + 2);
    for (int mode = 0; mode < 3; ++mode) {
      const bool a_scalar = mode == 2, b_scalar = mode == 1;
      const bool sa = n % 2 == 0, sb = n % 3 == 0;
      Element in = {a_scalar ? Tensor::Scalar<bool>(sa) : TensorOf<bool>(a),
                    b_scalar ? Tensor::Scalar<bool>(sb) : TensorOf<bool>(b)};
      ASSERT_OK_AND_ASSIGN(Element out, MapOne(in, fn));
      std::vector<bool> want[7];
      std::vector<int32_t> as_int;
      std::vector<float> as_half;
      for (int64_t i = 0; i < n; ++i) {
        const bool va = a_scalar ? sa : a[i], vb = b_scalar ? sb : b[i];
        want[0].push_back(va && vb);
        want[1].push_back(va || vb);
        want[2].push_back(!va);
        want[3].push_back(va == vb);
        want[4].push_back(va != vb);
        want[5].push_back(va < vb);
        want[6].push_back(va >= vb);
        as_int.push_back(va ? 1 : 0);
        as_half.push_back(va ? 1.0f : 0.0f);
      }
      const std::string what = absl::StrCat("n=", n, " mode=", mode);
      for (int k = 0; k < 7; ++k) {
        if (k == 2 && a_scalar) {
          ExpectValues<bool>(out[k], {!sa}, true, false, what + " !x[0]");
        } else {
          ExpectValues<bool>(out[k], want[k], false, false, absl::StrCat(what, " output ", k));
        }
      }
      if (a_scalar) {
        ExpectValues<int32_t>(out[7], {sa ? 1 : 0}, true, false, what + " cast int32");
      } else {
        ExpectValues<int32_t>(out[7], as_int, false, false, what + " cast int32");
        ExpectValues<Float16>(out[8], as_half, false, false, what + " cast float16");
      }
    }
  }
}

TEST(VectorizedBoolExprTest, AnyNonZeroByteIsTrue) {
  // A bool tensor viewed over bytes other than 0 and 1 (a decoded frame, a
  // file): every non-zero byte reads as true, and results are 0 or 1.
  const int64_t n = kBlock + 9;
  auto bytes = std::shared_ptr<uint8_t[]>(new uint8_t[n]);
  std::vector<bool> truth;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t vals[] = {0, 1, 2, 255, 128};
    bytes[i] = vals[i % 5];
    truth.push_back(bytes[i] != 0);
  }
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::View(DType::kBool, TensorShape({n}), bytes.get(), n, bytes));
  ASSERT_OK_AND_ASSIGN(Element out, MapOne({t}, Function({x && x, !x, x == true, x.Cast(DType::kInt32)})));
  std::vector<bool> negated;
  std::vector<int32_t> ints;
  for (bool v : truth) {
    negated.push_back(!v);
    ints.push_back(v ? 1 : 0);
  }
  ExpectValues<bool>(out[0], truth, false, false, "x && x");
  ExpectValues<bool>(out[1], negated, false, false, "!x");
  ExpectValues<bool>(out[2], truth, false, false, "x == true");
  ExpectValues<int32_t>(out[3], ints, false, false, "cast int32");
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_LE(out[0].data()[i], 1) << i;
    ASSERT_LE(out[1].data()[i], 1) << i;
  }
}

TEST(FusedChainTest, ChainsMatchAStepByStepReference) {
  for (int64_t n : BlockSizes()) {
    SCOPED_TRACE(absl::StrCat("n=", n));
    // float32: the benchmark's chain, and one that keeps two temporaries live.
    const std::vector<float> f = RandomValues<float>(n, 7 * n + 1);
    const std::vector<float> g = RandomValues<float>(n, 7 * n + 2);
    ASSERT_OK_AND_ASSIGN(Element fo, MapOne({TensorOf<float>(f), TensorOf<float>(g)},
                                            Function({x[0] * 2.0f + 1.0f, x[0] + 0.0f,
                                                      (x[0] + x[1]) * (x[0] - x[1]) / 4.0f})));
    std::vector<float> affine, plus0, two;
    for (int64_t i = 0; i < n; ++i) {
      const float m = f[i] * 2.0f;
      affine.push_back(m + 1.0f);
      plus0.push_back(f[i] + 0.0f);
      const float s = f[i] + g[i], d = f[i] - g[i], p = s * d;
      two.push_back(p / 4.0f);
    }
    ExpectValues<float>(fo[0], affine, false, false, "x * 2 + 1");
    ExpectValues<float>(fo[1], plus0, false, false, "x + 0");
    ExpectValues<float>(fo[2], two, false, false, "(a + b) * (a - b) / 4");

    // float16 rounds after every op of the chain.
    const std::vector<float> h = RandomValues<Float16>(n, 7 * n + 3);
    ASSERT_OK_AND_ASSIGN(Element ho, MapOne({TensorOf<Float16>(h)}, (x * 3 + 1) * x - 0.5));
    std::vector<float> hw;
    for (float v : h) hw.push_back(R<Float16>(R<Float16>(R<Float16>(R<Float16>(v * 3) + 1) * v) - 0.5f));
    ExpectValues<Float16>(ho[0], hw, false, false, "float16 (x * 3 + 1) * x - 0.5");

    // int32, wrapping: a deep chain (slots are reused) mixing in a second
    // operand, a scalar and a truncating division.
    const std::vector<int32_t> a = RandomValues<int32_t>(n, 7 * n + 4);
    const std::vector<int32_t> b = RandomValues<int32_t>(n, 7 * n + 5);
    Expr e = x[0];
    std::vector<int32_t> want = a;
    for (int k = 0; k < 40; ++k) {
      switch (k % 4) {
        case 0: e = e * 3; break;
        case 1: e = e + x[1]; break;
        case 2: e = (e - k) / 7; break;
        case 3: e = e * (x[1] + e); break;
      }
      for (int64_t i = 0; i < n; ++i) {
        int32_t& w = want[i];
        switch (k % 4) {
          case 0: w = RefArith<int32_t>(BinOp::kMul, w, 3); break;
          case 1: w = RefArith<int32_t>(BinOp::kAdd, w, b[i]); break;
          case 2: w = RefArith<int32_t>(BinOp::kDiv, RefArith<int32_t>(BinOp::kSub, w, k), 7); break;
          case 3: w = RefArith<int32_t>(BinOp::kMul, w, RefArith<int32_t>(BinOp::kAdd, b[i], w)); break;
        }
      }
    }
    ASSERT_OK_AND_ASSIGN(Element io, MapOne({TensorOf<int32_t>(a), TensorOf<int32_t>(b)}, e));
    ExpectValues<int32_t>(io[0], want, false, false, "deep int32 chain");
  }
}

TEST(FusedChainTest, MatrixShapesAndMisalignedViews) {
  // A [3, kBlock/2 + 1] tensor: blocks cross rows.
  const int64_t cols = kBlock / 2 + 1, n = 3 * cols;
  const std::vector<float> f = RandomValues<float>(n, 11);
  ASSERT_OK_AND_ASSIGN(Tensor m, Tensor::FromVector<float>(f, TensorShape({3, cols})));
  ASSERT_OK_AND_ASSIGN(Element out, MapOne({m}, x * 2.0f + 1.0f));
  EXPECT_EQ(out[0].shape().dims(), (std::vector<int64_t>{3, cols}));
  ASSERT_OK_AND_ASSIGN(Tensor flat, out[0].Reshape(TensorShape({n})));
  std::vector<float> want;
  for (float v : f) want.push_back(v * 2.0f + 1.0f);
  ExpectValues<float>(flat, want, false, false, "matrix");

  // A float64 view one byte off alignment is evaluated from an aligned copy.
  const std::vector<double> d = RandomValues<double>(kBlock + 3, 12);
  auto bytes = std::shared_ptr<uint8_t[]>(new uint8_t[d.size() * 8 + 1]);
  std::memcpy(bytes.get() + 1, d.data(), d.size() * 8);
  ASSERT_OK_AND_ASSIGN(Tensor odd, Tensor::View(DType::kFloat64, TensorShape({static_cast<int64_t>(d.size())}),
                                                bytes.get() + 1, d.size() * 8, bytes));
  ASSERT_OK_AND_ASSIGN(Element od, MapOne({odd}, x * 0.5 - x));
  std::vector<double> dw;
  for (double v : d) dw.push_back(v * 0.5 - v);
  ExpectValues<double>(od[0], dw, false, false, "misaligned float64");
}

TEST(VectorizedDivisionByZeroTest, AnyZeroDivisorIsAnErrorNamingItsOp) {
  const int64_t n = 2 * kBlock + 10;
  std::vector<int32_t> a(n, 7), b(n, 1);
  b[kBlock + 3] = 0;  // in the second block
  const Element in = {Tensor::FromVector<int32_t>(a), Tensor::FromVector<int32_t>(b)};
  EXPECT_STATUS(MapOne(in, x[0] / x[1]).status(), kInvalid, "op 'div': integer division by zero");
  EXPECT_STATUS(MapOne(in, x[0] % x[1]).status(), kInvalid, "op 'mod': integer division by zero");
  EXPECT_STATUS(MapOne(in, (x[0] + 1) / x[1] * 2).status(), kInvalid, "op 'div'");
  EXPECT_STATUS(MapOne(in, x[1] / x[1]).status(), kInvalid, "division by zero");
  // The other integer dtypes, with a scalar zero divisor.
  EXPECT_STATUS(MapOne({Tensor::FromVector<uint8_t>({1, 2, 3})}, x / 0).status(), kInvalid,
                "division by zero");
  // Nothing is divided in an empty tensor; a literal-only 1 / 0 is
  // evaluated (and fails) whatever the tensor's size.
  ASSERT_OK_AND_ASSIGN(Element empty, MapOne({Tensor::FromVector<int32_t>({})}, x / 0));
  EXPECT_EQ(empty[0].num_elements(), 0);
  EXPECT_STATUS(MapOne({Tensor::FromVector<int32_t>({})}, x + expr::Lift(1) / 0).status(),
                kInvalid, "division by zero");
  // Float division by zero is IEEE: no error.
  ASSERT_OK_AND_ASSIGN(Element f, MapOne({Tensor::FromVector<float>({1.0f, -1.0f, 0.0f})}, x / 0.0f));
  EXPECT_EQ(f[0].at<float>(0), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[0].at<float>(1), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f[0].at<float>(2)));
}

}  // namespace
}  // namespace sluice
