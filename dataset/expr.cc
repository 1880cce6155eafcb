// Expression builder, type checking and evaluation.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/half.h"
#include "sluice/core/status.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/expr_internal.h"
#include "sluice/dataset/udf.h"

namespace sluice {

static_assert(proto::ADD == 1 && proto::SUB == 2 && proto::MUL == 3 && proto::DIV == 4 &&
              proto::MOD == 5 && proto::EQ == 10 && proto::NE == 11 && proto::LT == 12 &&
              proto::LE == 13 && proto::GT == 14 && proto::GE == 15 &&
              proto::LOGICAL_AND == 20 && proto::LOGICAL_OR == 21,
              "expr.h operator codes must match dataset.proto");
static_assert(proto::NEG == 1 && proto::LOGICAL_NOT == 2, "expr.h unary codes");

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------
namespace expr {
namespace {
Expr Wrap(proto::Expr e) { return Expr(std::make_shared<const proto::Expr>(std::move(e))); }
}  // namespace

Expr Expr::Constant(const Tensor& value) {
  proto::Expr e;
  *e.mutable_constant()->mutable_value() = internal::TensorToProto(value);
  return Wrap(std::move(e));
}

Expr Expr::Component(int index) {
  proto::Expr e;
  e.mutable_component()->set_index(index);
  return Wrap(std::move(e));
}

Expr Expr::Cast(DType dtype) const { return expr::Cast(*this, dtype); }

Expr WeakConstant(int64_t v) {
  proto::Expr e;
  *e.mutable_constant()->mutable_value() = internal::TensorToProto(Tensor::Scalar<int64_t>(v));
  e.mutable_constant()->set_weak(true);
  return Wrap(std::move(e));
}

Expr WeakConstant(double v) {
  proto::Expr e;
  *e.mutable_constant()->mutable_value() = internal::TensorToProto(Tensor::Scalar<double>(v));
  e.mutable_constant()->set_weak(true);
  return Wrap(std::move(e));
}

Expr BoolConstant(bool v) { return Expr::Constant(Tensor::Scalar<bool>(v)); }

Expr Unary(int op, const Expr& a) {
  proto::Expr e;
  e.mutable_unary()->set_op(static_cast<proto::UnaryOp>(op));
  *e.mutable_unary()->mutable_operand() = a.node();
  return Wrap(std::move(e));
}

Expr Binary(int op, const Expr& a, const Expr& b) {
  proto::Expr e;
  e.mutable_binary()->set_op(static_cast<proto::BinaryOp>(op));
  *e.mutable_binary()->mutable_lhs() = a.node();
  *e.mutable_binary()->mutable_rhs() = b.node();
  return Wrap(std::move(e));
}

Expr Cast(const Expr& a, DType dtype) {
  proto::Expr e;
  e.mutable_cast()->set_dtype(static_cast<uint32_t>(dtype));
  *e.mutable_cast()->mutable_operand() = a.node();
  return Wrap(std::move(e));
}

Expr Abs(const Expr& a) { return Unary(proto::ABS, a); }
Expr Min(const Expr& a, const Expr& b) { return Binary(proto::MIN, a, b); }
Expr Max(const Expr& a, const Expr& b) { return Binary(proto::MAX, a, b); }

}  // namespace expr

Function::Function(const expr::Expr& e) : fn_(std::make_shared<proto::Function>()) {
  *fn_->add_outputs() = e.node();
}

Function::Function(std::initializer_list<expr::Expr> outputs)
    : Function(std::vector<expr::Expr>(outputs)) {}

Function::Function(std::vector<expr::Expr> outputs) : fn_(std::make_shared<proto::Function>()) {
  for (const auto& e : outputs) *fn_->add_outputs() = e.node();
}

Function Function::Udf(std::string name) {
  Function f;
  f.fn_ = std::make_shared<proto::Function>();
  f.fn_->set_udf(std::move(name));
  return f;
}

// ---------------------------------------------------------------------------
// Tensors in protos
// ---------------------------------------------------------------------------
namespace internal {

proto::TensorProto TensorToProto(const Tensor& t) {
  proto::TensorProto p;
  p.set_dtype(static_cast<uint32_t>(t.dtype()));
  for (int64_t d : t.shape().dims()) p.add_dims(d);
  p.set_content(reinterpret_cast<const char*>(t.data()), t.byte_size());
  return p;
}

absl::StatusOr<Tensor> TensorFromProto(const proto::TensorProto& p) {
  if (p.dtype() > 255 || !IsValidDType(static_cast<uint8_t>(p.dtype()))) {
    return absl::InvalidArgumentError(absl::StrCat("tensor has invalid dtype ", p.dtype()));
  }
  SLUICE_ASSIGN_OR_RETURN(TensorShape shape, TensorShape::Make({p.dims().begin(), p.dims().end()}));
  const std::string& bytes = p.content();
  // Copy into aligned storage so typed access is aligned.
  std::shared_ptr<uint8_t> mem = AllocateAligned(bytes.size());
  if (!bytes.empty()) std::memcpy(mem.get(), bytes.data(), bytes.size());
  const uint8_t* data = mem.get();
  return Tensor::View(static_cast<DType>(p.dtype()), std::move(shape), data, bytes.size(),
                      std::move(mem));
}

// ---------------------------------------------------------------------------
// Dtype dispatch
// ---------------------------------------------------------------------------
namespace {

template <typename T>
struct ComputeOf { using type = T; };
template <>
struct ComputeOf<Float16> { using type = float; };
template <>
struct ComputeOf<BFloat16> { using type = float; };
template <typename T>
using ComputeT = typename ComputeOf<T>::type;

template <typename T>
ComputeT<T> Load(const uint8_t* base, int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    return base[i] != 0;
  } else {
    T v;
    std::memcpy(&v, base + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
      return static_cast<float>(v);
    } else {
      return v;
    }
  }
}

template <typename T>
void Store(uint8_t* base, int64_t i, ComputeT<T> v) {
  if constexpr (std::is_same_v<T, bool>) {
    base[i] = v ? 1 : 0;
  } else if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    T t(v);
    std::memcpy(base + i * sizeof(T), &t, sizeof(T));
  } else {
    std::memcpy(base + i * sizeof(T), &v, sizeof(T));
  }
}

// Calls f.template operator()<T>() with the storage type of `d`.
template <typename F>
auto VisitNumeric(DType d, F&& f) {
  switch (d) {
    case DType::kBool: return f.template operator()<bool>();
    case DType::kInt8: return f.template operator()<int8_t>();
    case DType::kInt16: return f.template operator()<int16_t>();
    case DType::kInt32: return f.template operator()<int32_t>();
    case DType::kInt64: return f.template operator()<int64_t>();
    case DType::kUInt8: return f.template operator()<uint8_t>();
    case DType::kUInt16: return f.template operator()<uint16_t>();
    case DType::kUInt32: return f.template operator()<uint32_t>();
    case DType::kUInt64: return f.template operator()<uint64_t>();
    case DType::kFloat16: return f.template operator()<Float16>();
    case DType::kBFloat16: return f.template operator()<BFloat16>();
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    case DType::kString: break;
  }
  return f.template operator()<double>();  // unreachable: callers exclude strings
}

// Saturating, NaN-safe conversion between compute types.
template <typename To, typename From>
To ConvertValue(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    if (std::isnan(v)) return 0;
    constexpr long double lo = static_cast<long double>(std::numeric_limits<To>::min());
    constexpr long double hi = static_cast<long double>(std::numeric_limits<To>::max());
    long double lv = static_cast<long double>(v);
    if (lv <= lo) return std::numeric_limits<To>::min();
    if (lv >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);  // integer -> integer wraps (C++20), -> float rounds
  }
}

absl::string_view BinaryName(int op) {
  switch (op) {
    case proto::ADD: return "add";
    case proto::SUB: return "sub";
    case proto::MUL: return "mul";
    case proto::DIV: return "div";
    case proto::MOD: return "mod";
    case proto::EQ: return "equal";
    case proto::NE: return "not_equal";
    case proto::LT: return "less";
    case proto::LE: return "less_equal";
    case proto::GT: return "greater";
    case proto::GE: return "greater_equal";
    case proto::LOGICAL_AND: return "logical_and";
    case proto::LOGICAL_OR: return "logical_or";
    case proto::MIN: return "min";
    case proto::MAX: return "max";
    default: return "unknown";
  }
}

absl::string_view UnaryName(int op) {
  switch (op) {
    case proto::NEG: return "neg";
    case proto::LOGICAL_NOT: return "logical_not";
    case proto::ABS: return "abs";
    default: return "unknown";
  }
}

bool IsArith(int op) {
  return (op >= proto::ADD && op <= proto::MOD) || op == proto::MIN || op == proto::MAX;
}
bool IsCompare(int op) { return op >= proto::EQ && op <= proto::GE; }
bool IsLogical(int op) { return op == proto::LOGICAL_AND || op == proto::LOGICAL_OR; }

std::string ShapeString(const std::optional<std::vector<int64_t>>& s) {
  if (!s) return "[?]";
  std::string out = "[";
  for (size_t i = 0; i < s->size(); ++i) {
    if (i) out += ",";
    out += (*s)[i] < 0 ? "?" : std::to_string((*s)[i]);
  }
  return out + "]";
}

// What is known about an expression's value.
struct TypeInfo {
  std::optional<DType> dtype;
  bool weak = false;
  std::optional<std::vector<int64_t>> shape;
  const Tensor* value = nullptr;  // set for constants (to range-check literals)
};

absl::Status ExprError(absl::string_view op, absl::string_view expr_op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": op '", expr_op, "': ", msg));
}

// Whether weak literal `w` can take dtype `d`.
absl::Status CheckAdopt(absl::string_view op, absl::string_view expr_op, const TypeInfo& w,
                        DType d) {
  if (d == DType::kString || d == DType::kBool) {
    return ExprError(op, expr_op,
                     absl::StrCat("a numeric literal cannot combine with a ", DTypeName(d),
                                  " operand"));
  }
  if (w.dtype == DType::kFloat64 && !IsFloat(d)) {
    std::string v = w.value ? absl::StrCat(" ", w.value->at<double>(0)) : "";
    return ExprError(op, expr_op,
                     absl::StrCat("fractional literal", v, " with a ", DTypeName(d),
                                  " operand; Cast the operand to a float dtype first"));
  }
  if (w.dtype == DType::kInt64 && IsInteger(d) && w.value != nullptr) {
    int64_t v = w.value->at<int64_t>(0);
    bool fits = VisitNumeric(d, [&]<typename T>() {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        if constexpr (std::is_signed_v<T>) {
          return v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max();
        } else {
          return v >= 0 && static_cast<uint64_t>(v) <= std::numeric_limits<T>::max();
        }
      } else {
        return true;
      }
    });
    if (!fits) {
      return ExprError(op, expr_op,
                       absl::StrCat("literal ", v, " does not fit in ", DTypeName(d)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::vector<int64_t>>> BroadcastShape(
    absl::string_view op, absl::string_view expr_op, const TypeInfo& a, const TypeInfo& b) {
  if (!a.shape || !b.shape) {
    if (a.shape && a.shape->empty()) return b.shape;
    if (b.shape && b.shape->empty()) return a.shape;
    return std::optional<std::vector<int64_t>>();
  }
  if (a.shape->empty()) return b.shape;
  if (b.shape->empty()) return a.shape;
  if (a.shape->size() != b.shape->size()) {
    return ExprError(op, expr_op,
                     absl::StrCat("shapes ", ShapeString(a.shape), " and ", ShapeString(b.shape),
                                  " do not match (only scalars broadcast)"));
  }
  std::vector<int64_t> out(a.shape->size());
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x = (*a.shape)[i], y = (*b.shape)[i];
    if (x >= 0 && y >= 0 && x != y) {
      return ExprError(op, expr_op,
                       absl::StrCat("shapes ", ShapeString(a.shape), " and ",
                                    ShapeString(b.shape), " do not match (only scalars broadcast)"));
    }
    out[i] = x >= 0 ? x : y;
  }
  return std::optional<std::vector<int64_t>>(std::move(out));
}

struct BinaryResolution {
  std::optional<DType> operand_dtype;  // dtype both operands are computed in
  TypeInfo result;
};

absl::StatusOr<BinaryResolution> ResolveBinary(absl::string_view op, int code, const TypeInfo& a,
                                               const TypeInfo& b) {
  absl::string_view name = BinaryName(code);
  BinaryResolution r;
  if (a.dtype && b.dtype) {
    if (a.weak && b.weak) {
      r.operand_dtype =
          (*a.dtype == DType::kFloat64 || *b.dtype == DType::kFloat64) ? DType::kFloat64
                                                                        : DType::kInt64;
    } else if (a.weak) {
      SLUICE_RETURN_IF_ERROR(CheckAdopt(op, name, a, *b.dtype));
      r.operand_dtype = b.dtype;
    } else if (b.weak) {
      SLUICE_RETURN_IF_ERROR(CheckAdopt(op, name, b, *a.dtype));
      r.operand_dtype = a.dtype;
    } else if (*a.dtype != *b.dtype) {
      return ExprError(op, name,
                       absl::StrCat("dtype mismatch: ", DTypeName(*a.dtype), " vs ",
                                    DTypeName(*b.dtype), "; Cast one operand"));
    } else {
      r.operand_dtype = a.dtype;
    }
  } else if (a.dtype && !a.weak) {
    r.operand_dtype = a.dtype;
  } else if (b.dtype && !b.weak) {
    r.operand_dtype = b.dtype;
  }
  if (r.operand_dtype) {
    DType d = *r.operand_dtype;
    if (d == DType::kString) {
      return ExprError(op, name, "string operands are not supported in expressions");
    }
    if (IsArith(code) && d == DType::kBool) {
      return ExprError(op, name, "needs numeric operands; got bool (Cast it first)");
    }
    if (IsLogical(code) && d != DType::kBool) {
      return ExprError(op, name,
                       absl::StrCat("needs bool operands; got ", DTypeName(d),
                                    " (compare it, e.g. x != 0)"));
    }
  } else if (IsLogical(code) && ((a.dtype && a.weak) || (b.dtype && b.weak))) {
    return ExprError(op, name, "needs bool operands; got a numeric literal");
  }
  SLUICE_ASSIGN_OR_RETURN(r.result.shape, BroadcastShape(op, name, a, b));
  if (IsArith(code)) {
    r.result.dtype = r.operand_dtype;
    r.result.weak = a.weak && b.weak;
  } else {
    r.result.dtype = DType::kBool;
  }
  return r;
}

absl::StatusOr<TypeInfo> ResolveUnary(absl::string_view op, int code, const TypeInfo& a) {
  absl::string_view name = UnaryName(code);
  if (a.dtype) {
    if (*a.dtype == DType::kString) {
      return ExprError(op, name, "string operands are not supported in expressions");
    }
    if (code == proto::LOGICAL_NOT && *a.dtype != DType::kBool) {
      return ExprError(op, name, absl::StrCat("needs a bool operand; got ", DTypeName(*a.dtype)));
    }
    if (code != proto::LOGICAL_NOT && *a.dtype == DType::kBool) {
      return ExprError(op, name, "needs a numeric operand; got bool");
    }
  }
  TypeInfo r = a;
  r.value = nullptr;
  return r;
}

absl::Status CheckCast(absl::string_view op, const TypeInfo& a, DType to) {
  if (to == DType::kString || (a.dtype && *a.dtype == DType::kString)) {
    return ExprError(op, "cast", "casts to or from string are not supported");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------

// The float nearest `v` toward zero, with its last mantissa bit set when
// inexact ("round to odd"); NaN and infinities pass through.
float RoundToOddFloat(long double v) {
  if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
  float f = static_cast<float>(v);
  if (std::isinf(f) || static_cast<long double>(f) == v) return f;
  // Step to the float on the zero side of v, then force the odd bit.
  if (std::fabs(static_cast<long double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  uint32_t bits = std::bit_cast<uint32_t>(f);
  bits |= 1u;
  return std::bit_cast<float>(bits);
}

absl::StatusOr<Tensor> CastTensor(const Tensor& in, DType to) {
  if (in.dtype() == to) return in;
  SLUICE_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(to, in.shape()));
  int64_t n = in.num_elements();
  const uint8_t* src = in.data();
  uint8_t* dst = out.mutable_data();
  VisitNumeric(in.dtype(), [&]<typename From>() {
    VisitNumeric(to, [&]<typename To>() {
      constexpr bool kToHalf = std::is_same_v<To, Float16> || std::is_same_v<To, BFloat16>;
      constexpr bool kWideFrom =
          std::is_same_v<From, double> || (std::is_integral_v<From> && sizeof(From) >= 4);
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (kToHalf && kWideFrom) {
          // Exact in long double, then round-to-odd to float: the final
          // float -> 16-bit rounding is then correctly rounded (no double
          // rounding through float32).
          Store<To>(dst, i, RoundToOddFloat(static_cast<long double>(Load<From>(src, i))));
        } else {
          Store<To>(dst, i, ConvertValue<ComputeT<To>>(Load<From>(src, i)));
        }
      }
      return 0;
    });
    return 0;
  });
  return out;
}

template <typename C>
C WrapNeg(C v) {
  if constexpr (std::is_integral_v<C>) {
    return static_cast<C>(uint64_t{0} - static_cast<uint64_t>(v));
  } else {
    return -v;
  }
}

absl::StatusOr<Tensor> UnaryKernel(absl::string_view op, int code, const Tensor& a) {
  SLUICE_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(a.dtype(), a.shape()));
  int64_t n = a.num_elements();
  const uint8_t* src = a.data();
  uint8_t* dst = out.mutable_data();
  VisitNumeric(a.dtype(), [&]<typename T>() {
    using C = ComputeT<T>;
    for (int64_t i = 0; i < n; ++i) {
      C v = Load<T>(src, i);
      C r;
      if constexpr (std::is_same_v<C, bool>) {
        r = !v;
      } else if (code == proto::NEG) {
        r = WrapNeg(v);
      } else {  // ABS
        if constexpr (std::is_unsigned_v<C>) {
          r = v;
        } else if constexpr (std::is_floating_point_v<C>) {
          r = std::fabs(v);  // also clears the sign of -0.0 and NaN
        } else {
          r = v < C(0) ? WrapNeg(v) : v;
        }
      }
      Store<T>(dst, i, r);
    }
    return 0;
  });
  return out;
}

template <typename C>
C WrapArith(int code, C x, C y) {
  if constexpr (std::is_integral_v<C>) {
    uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
    switch (code) {
      case proto::ADD: return static_cast<C>(ux + uy);
      case proto::SUB: return static_cast<C>(ux - uy);
      case proto::MUL: return static_cast<C>(ux * uy);
      default: break;
    }
  } else {
    switch (code) {
      case proto::ADD: return x + y;
      case proto::SUB: return x - y;
      case proto::MUL: return x * y;
      case proto::DIV: return x / y;
      case proto::MOD: return std::fmod(x, y);
      default: break;
    }
  }
  return C(0);
}

// Both operands already have dtype `d`; shapes were checked.
absl::StatusOr<Tensor> BinaryKernel(absl::string_view op, int code, const Tensor& a,
                                    const Tensor& b) {
  DType d = a.dtype();
  bool a_scalar = a.shape().is_scalar(), b_scalar = b.shape().is_scalar();
  const TensorShape& shape = a_scalar ? b.shape() : a.shape();
  DType out_dtype = IsArith(code) ? d : DType::kBool;
  SLUICE_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(out_dtype, shape));
  int64_t n = shape.num_elements();
  const uint8_t* pa = a.data();
  const uint8_t* pb = b.data();
  uint8_t* po = out.mutable_data();
  int64_t sa = a_scalar ? 0 : 1, sb = b_scalar ? 0 : 1;
  absl::Status status;
  VisitNumeric(d, [&]<typename T>() {
    using C = ComputeT<T>;
    auto loop = [&](auto f) {
      for (int64_t i = 0; i < n; ++i) f(i, Load<T>(pa, i * sa), Load<T>(pb, i * sb));
    };
    if (IsCompare(code)) {
      loop([&](int64_t i, C x, C y) {
        bool r = false;
        switch (code) {
          case proto::EQ: r = x == y; break;
          case proto::NE: r = x != y; break;
          case proto::LT: r = x < y; break;
          case proto::LE: r = x <= y; break;
          case proto::GT: r = x > y; break;
          case proto::GE: r = x >= y; break;
        }
        po[i] = r ? 1 : 0;
      });
    } else if constexpr (std::is_same_v<C, bool>) {
      loop([&](int64_t i, bool x, bool y) {
        po[i] = (code == proto::LOGICAL_AND ? (x && y) : (x || y)) ? 1 : 0;
      });
    } else if (code == proto::MIN || code == proto::MAX) {
      loop([&](int64_t i, C x, C y) {
        C r = code == proto::MIN ? (y < x ? y : x) : (y > x ? y : x);
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(x) || std::isnan(y)) r = std::numeric_limits<C>::quiet_NaN();
        }
        Store<T>(po, i, r);
      });
    } else if (code == proto::DIV || code == proto::MOD) {
      if constexpr (std::is_integral_v<C>) {
        loop([&](int64_t i, C x, C y) {
          if (y == C(0)) {
            if (status.ok()) status = ExprError(op, BinaryName(code), "integer division by zero");
            return;
          }
          C r;
          if constexpr (std::is_signed_v<C>) {
            if (y == C(-1)) {
              r = code == proto::DIV ? WrapNeg(x) : C(0);
            } else {
              r = code == proto::DIV ? static_cast<C>(x / y) : static_cast<C>(x % y);
            }
          } else {
            r = code == proto::DIV ? static_cast<C>(x / y) : static_cast<C>(x % y);
          }
          Store<T>(po, i, r);
        });
      } else {
        loop([&](int64_t i, C x, C y) { Store<T>(po, i, WrapArith<C>(code, x, y)); });
      }
    } else {
      loop([&](int64_t i, C x, C y) { Store<T>(po, i, WrapArith<C>(code, x, y)); });
    }
    return 0;
  });
  if (!status.ok()) return status;
  return out;
}

TypeInfo InfoOf(const Tensor& t, bool weak) {
  TypeInfo i;
  i.dtype = t.dtype();
  i.weak = weak;
  i.shape = t.shape().dims();
  i.value = &t;
  return i;
}

}  // namespace

// ---------------------------------------------------------------------------
// CompiledFunction
// ---------------------------------------------------------------------------

struct CompiledFunction::Node {
  proto::Expr::KindCase kind = proto::Expr::KIND_NOT_SET;
  int index = -1;
  Tensor constant;
  bool weak = false;
  int op = 0;
  DType cast_to = DType::kFloat32;
  std::unique_ptr<Node> a, b;
  // The value of a weak (literals-only) unary/binary subtree, computed when
  // the function is compiled so the literal's range can be checked.
  Tensor folded;
};

CompiledFunction::~CompiledFunction() = default;

namespace {

using Node = CompiledFunction::Node;

absl::StatusOr<std::unique_ptr<Node>> BuildNode(const proto::Expr& e, absl::string_view op,
                                                int depth) {
  if (depth > 256) return ExprError(op, "expr", "expression nests deeper than 256 levels");
  auto n = std::make_unique<Node>();
  n->kind = e.kind_case();
  switch (e.kind_case()) {
    case proto::Expr::kComponent:
      n->index = e.component().index();
      if (n->index < -1) {
        return ExprError(op, "component", absl::StrCat("bad component index ", n->index));
      }
      break;
    case proto::Expr::kConstant: {
      SLUICE_ASSIGN_OR_RETURN(n->constant, TensorFromProto(e.constant().value()));
      n->weak = e.constant().weak();
      if (n->weak && (!n->constant.shape().is_scalar() ||
                      (n->constant.dtype() != DType::kInt64 &&
                       n->constant.dtype() != DType::kFloat64))) {
        return ExprError(op, "constant", "weak constants must be int64 or float64 scalars");
      }
      break;
    }
    case proto::Expr::kUnary: {
      n->op = e.unary().op();
      if (n->op != proto::NEG && n->op != proto::LOGICAL_NOT && n->op != proto::ABS) {
        return ExprError(op, "unary", absl::StrCat("unknown unary op ", n->op));
      }
      SLUICE_ASSIGN_OR_RETURN(n->a, BuildNode(e.unary().operand(), op, depth + 1));
      break;
    }
    case proto::Expr::kBinary: {
      n->op = e.binary().op();
      if (!IsArith(n->op) && !IsCompare(n->op) && !IsLogical(n->op)) {
        return ExprError(op, "binary", absl::StrCat("unknown binary op ", n->op));
      }
      SLUICE_ASSIGN_OR_RETURN(n->a, BuildNode(e.binary().lhs(), op, depth + 1));
      SLUICE_ASSIGN_OR_RETURN(n->b, BuildNode(e.binary().rhs(), op, depth + 1));
      break;
    }
    case proto::Expr::kCast: {
      if (e.cast().dtype() > 255 || !IsValidDType(static_cast<uint8_t>(e.cast().dtype()))) {
        return ExprError(op, "cast", absl::StrCat("invalid target dtype ", e.cast().dtype()));
      }
      n->cast_to = static_cast<DType>(e.cast().dtype());
      SLUICE_ASSIGN_OR_RETURN(n->a, BuildNode(e.cast().operand(), op, depth + 1));
      break;
    }
    case proto::Expr::KIND_NOT_SET:
      return ExprError(op, "expr", "empty expression node");
  }
  return n;
}

struct Value {
  Tensor t;
  bool weak = false;
};

absl::StatusOr<Value> Eval(const Node& n, const Element& in, absl::string_view op);

// A weak result is built from literals only: evaluate it now, so that
// CheckAdopt can range-check its value at definition time like a plain
// literal's. An evaluation error (division by zero) is left to run time.
void FoldWeak(Node& n, absl::string_view op, TypeInfo& t) {
  if (!t.weak || t.value != nullptr) return;
  auto v = Eval(n, Element{}, op);
  if (!v.ok()) return;
  n.folded = std::move(v->t);
  t.value = &n.folded;
}

absl::StatusOr<TypeInfo> Infer(Node& n, const ElementSpec& in, absl::string_view op) {
  switch (n.kind) {
    case proto::Expr::kComponent: {
      TypeInfo t;
      if (!in.known) return t;
      if (n.index == -1) {
        if (in.components.size() != 1) {
          return ExprError(op, "x",
                           absl::StrCat("x names a single-component element but the input has ",
                                        in.components.size(), " components; use x[i]"));
        }
      } else if (n.index >= static_cast<int>(in.components.size())) {
        return ExprError(op, "x[i]",
                         absl::StrCat("x[", n.index, "] is out of range: the input has ",
                                      in.components.size(), " components"));
      }
      const ComponentSpec& c = in.components[n.index == -1 ? 0 : n.index];
      t.dtype = c.dtype;
      t.shape = c.shape;
      // A string component may pass through; the ops that take it reject it.
      return t;
    }
    case proto::Expr::kConstant:
      return InfoOf(n.constant, n.weak);
    case proto::Expr::kUnary: {
      SLUICE_ASSIGN_OR_RETURN(TypeInfo a, Infer(*n.a, in, op));
      SLUICE_ASSIGN_OR_RETURN(TypeInfo r, ResolveUnary(op, n.op, a));
      FoldWeak(n, op, r);
      return r;
    }
    case proto::Expr::kBinary: {
      SLUICE_ASSIGN_OR_RETURN(TypeInfo a, Infer(*n.a, in, op));
      SLUICE_ASSIGN_OR_RETURN(TypeInfo b, Infer(*n.b, in, op));
      SLUICE_ASSIGN_OR_RETURN(BinaryResolution r, ResolveBinary(op, n.op, a, b));
      FoldWeak(n, op, r.result);
      return r.result;
    }
    case proto::Expr::kCast: {
      SLUICE_ASSIGN_OR_RETURN(TypeInfo a, Infer(*n.a, in, op));
      SLUICE_RETURN_IF_ERROR(CheckCast(op, a, n.cast_to));
      TypeInfo r;
      r.dtype = n.cast_to;
      r.shape = a.shape;
      return r;
    }
    default:
      return ExprError(op, "expr", "empty expression node");
  }
}

absl::StatusOr<Value> Eval(const Node& n, const Element& in, absl::string_view op) {
  switch (n.kind) {
    case proto::Expr::kComponent: {
      if (n.index == -1 && in.size() != 1) {
        return ExprError(op, "x",
                         absl::StrCat("x names a single-component element but the input has ",
                                      in.size(), " components; use x[i]"));
      }
      if (n.index >= static_cast<int>(in.size())) {
        return ExprError(op, "x[i]", absl::StrCat("x[", n.index, "] is out of range: the input has ",
                                                  in.size(), " components"));
      }
      const Tensor& t = in[n.index == -1 ? 0 : n.index];
      return Value{t, false};
    }
    case proto::Expr::kConstant:
      return Value{n.constant, n.weak};
    case proto::Expr::kUnary: {
      SLUICE_ASSIGN_OR_RETURN(Value a, Eval(*n.a, in, op));
      SLUICE_RETURN_IF_ERROR(ResolveUnary(op, n.op, InfoOf(a.t, a.weak)).status());
      SLUICE_ASSIGN_OR_RETURN(Tensor r, UnaryKernel(op, n.op, a.t));
      return Value{std::move(r), a.weak};
    }
    case proto::Expr::kBinary: {
      SLUICE_ASSIGN_OR_RETURN(Value a, Eval(*n.a, in, op));
      SLUICE_ASSIGN_OR_RETURN(Value b, Eval(*n.b, in, op));
      SLUICE_ASSIGN_OR_RETURN(BinaryResolution r,
                              ResolveBinary(op, n.op, InfoOf(a.t, a.weak), InfoOf(b.t, b.weak)));
      DType d = *r.operand_dtype;
      SLUICE_ASSIGN_OR_RETURN(Tensor ta, CastTensor(a.t, d));
      SLUICE_ASSIGN_OR_RETURN(Tensor tb, CastTensor(b.t, d));
      SLUICE_ASSIGN_OR_RETURN(Tensor out, BinaryKernel(op, n.op, ta, tb));
      return Value{std::move(out), r.result.weak};
    }
    case proto::Expr::kCast: {
      SLUICE_ASSIGN_OR_RETURN(Value a, Eval(*n.a, in, op));
      SLUICE_RETURN_IF_ERROR(CheckCast(op, InfoOf(a.t, a.weak), n.cast_to));
      SLUICE_ASSIGN_OR_RETURN(Tensor out, CastTensor(a.t, n.cast_to));
      return Value{std::move(out), false};
    }
    default:
      return ExprError(op, "expr", "empty expression node");
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledFunction>> CompiledFunction::Compile(
    const proto::Function& fn, const ElementSpec& input, absl::string_view op) {
  std::shared_ptr<CompiledFunction> f(new CompiledFunction());
  f->op_ = std::string(op);
  if (!fn.udf().empty()) {
    if (fn.outputs_size() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": a function is either expressions or a UDF, not both"));
    }
    auto entry = FindUdf(fn.udf());
    if (!entry.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", entry.status().message()));
    }
    const UdfEntry* e = *entry;
    int arity = e->signature.num_inputs;
    if (arity >= 0 && input.known && static_cast<int>(input.components.size()) != arity) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": UDF '", fn.udf(), "' takes ", arity, " input component",
                       arity == 1 ? "" : "s", " but the input has ", input.components.size()));
    }
    f->udf_ = e;
    if (e->signature.output_dtypes) {
      f->output_spec_.known = true;
      for (DType d : *e->signature.output_dtypes) {
        f->output_spec_.components.push_back(ComponentSpec{d, std::nullopt});
      }
    } else {
      f->output_spec_ = ElementSpec::Unknown();
    }
    return std::shared_ptr<const CompiledFunction>(std::move(f));
  }
  if (fn.outputs_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": function has no outputs"));
  }
  for (const proto::Expr& e : fn.outputs()) {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Node> n, BuildNode(e, op, 0));
    SLUICE_ASSIGN_OR_RETURN(TypeInfo t, Infer(*n, input, op));
    if (t.weak && t.dtype) {
      // A bare literal output materializes as int64/float64.
      t.weak = false;
    }
    f->output_spec_.components.push_back(ComponentSpec{t.dtype, t.shape});
    f->outputs_.push_back(std::move(n));
  }
  return std::shared_ptr<const CompiledFunction>(std::move(f));
}

absl::StatusOr<Element> CompiledFunction::Apply(const Element& input) const {
  if (udf_ != nullptr) {
    const auto* e = static_cast<const UdfEntry*>(udf_);
    int arity = e->signature.num_inputs;
    if (arity >= 0 && static_cast<int>(input.size()) != arity) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": UDF '", e->name, "' takes ", arity,
                                                     " input components; got ", input.size()));
    }
    auto out = e->fn(input);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat(op_, ": UDF '", e->name, "': ", out.status().message()));
    }
    if (e->signature.output_dtypes) {
      const auto& want = *e->signature.output_dtypes;
      bool ok = want.size() == out->size();
      for (size_t i = 0; ok && i < want.size(); ++i) ok = (*out)[i].valid() && (*out)[i].dtype() == want[i];
      if (!ok) {
        return absl::InternalError(absl::StrCat(op_, ": UDF '", e->name,
                                                "' returned an element that does not match its "
                                                "declared output dtypes: ",
                                                ElementDebugString(*out)));
      }
    }
    for (const Tensor& t : *out) {
      if (!t.valid()) {
        return absl::InternalError(
            absl::StrCat(op_, ": UDF '", e->name, "' returned an invalid tensor"));
      }
    }
    return out;
  }
  Element out;
  out.reserve(outputs_.size());
  for (const auto& n : outputs_) {
    SLUICE_ASSIGN_OR_RETURN(Value v, Eval(*n, input, op_));
    out.push_back(std::move(v.t));
  }
  return out;
}

}  // namespace internal
}  // namespace sluice
