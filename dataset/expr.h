// Functions as data: expression trees built by operator overloading.
//
//   using sluice::expr::x;
//   ds.Map(x * x).Map(x + 1).Filter(x % 2 == 0);
//   ds.Map({x[0] * 2, x[1].Cast(sluice::DType::kFloat32)});   // tuple output
//
// `x` is the element's only component; `x[i]` is component i of a tuple.
// Operands are elementwise; a scalar broadcasts against any shape, other
// shapes must match. Both operands must have the same dtype, except C++
// literals (`x + 1`, `x * 0.5`), which are "weak" and adopt the dtype of the
// other side (an integer literal must be representable in it; a fractional
// literal needs a float operand). Type errors surface as InvalidArgument when
// the Map/Filter is defined, naming the op.
//
// Semantics: integer + - * wrap around (two's complement); integer / and %
// truncate toward zero as in C++, and division by zero is an InvalidArgument
// error at run time; float % is fmod; Min/Max of a NaN is NaN. float16 and
// bfloat16 compute in float32 and round back; casts to them from wider
// types round once, correctly. Comparisons yield bool; && || ! take bool.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/core/tensor.h"

namespace sluice {
namespace proto {
class Expr;
class Function;
}  // namespace proto

namespace expr {

class Expr {
 public:
  // A strong constant: keeps the tensor's dtype and shape.
  static Expr Constant(const Tensor& value);
  // An element component: -1 for the whole (single-component) element.
  static Expr Component(int index);

  Expr Cast(DType dtype) const;
  const proto::Expr& node() const { return *node_; }
  explicit Expr(std::shared_ptr<const proto::Expr> node) : node_(std::move(node)) {}

 private:
  std::shared_ptr<const proto::Expr> node_;
};

// Weak constants from C++ literals.
Expr WeakConstant(int64_t v);
Expr WeakConstant(double v);
Expr BoolConstant(bool v);

template <typename T>
Expr Lift(T v) {
  if constexpr (std::is_same_v<T, bool>) return BoolConstant(v);
  else if constexpr (std::is_integral_v<T>) return WeakConstant(static_cast<int64_t>(v));
  else if constexpr (std::is_floating_point_v<T>) return WeakConstant(static_cast<double>(v));
  else static_assert(sizeof(T) == 0, "unsupported constant type");
}

// The placeholder type of `x`.
class Placeholder : public Expr {
 public:
  Placeholder() : Expr(Component(-1)) {}
  Expr operator[](int index) const { return Component(index); }
};

inline const Placeholder x;

Expr Unary(int op, const Expr& a);
Expr Binary(int op, const Expr& a, const Expr& b);
Expr Cast(const Expr& a, DType dtype);
Expr Abs(const Expr& a);
Expr Min(const Expr& a, const Expr& b);
Expr Max(const Expr& a, const Expr& b);

// Operator wiring. The op codes are proto::BinaryOp / proto::UnaryOp values.
#define SLUICE_EXPR_BINARY_OP_(sym, code)                                 \
  inline Expr operator sym(const Expr& a, const Expr& b) { return Binary(code, a, b); } \
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>           \
  Expr operator sym(const Expr& a, T b) { return Binary(code, a, Lift(b)); }            \
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>           \
  Expr operator sym(T a, const Expr& b) { return Binary(code, Lift(a), b); }

SLUICE_EXPR_BINARY_OP_(+, 1)
SLUICE_EXPR_BINARY_OP_(-, 2)
SLUICE_EXPR_BINARY_OP_(*, 3)
SLUICE_EXPR_BINARY_OP_(/, 4)
SLUICE_EXPR_BINARY_OP_(%, 5)
SLUICE_EXPR_BINARY_OP_(==, 10)
SLUICE_EXPR_BINARY_OP_(!=, 11)
SLUICE_EXPR_BINARY_OP_(<, 12)
SLUICE_EXPR_BINARY_OP_(<=, 13)
SLUICE_EXPR_BINARY_OP_(>, 14)
SLUICE_EXPR_BINARY_OP_(>=, 15)
SLUICE_EXPR_BINARY_OP_(&&, 20)
SLUICE_EXPR_BINARY_OP_(||, 21)
#undef SLUICE_EXPR_BINARY_OP_

inline Expr operator-(const Expr& a) { return Unary(1, a); }
inline Expr operator!(const Expr& a) { return Unary(2, a); }

}  // namespace expr

// A Map/Filter function: expression outputs, or a registered UDF by name.
class Function {
 public:
  Function(const expr::Expr& e);                  // NOLINT: implicit by design
  Function(std::initializer_list<expr::Expr> outputs);  // tuple output
  explicit Function(std::vector<expr::Expr> outputs);
  static Function Udf(std::string name);

  const proto::Function& proto() const { return *fn_; }

 private:
  Function() = default;
  std::shared_ptr<proto::Function> fn_;
};

inline Function Udf(std::string name) { return Function::Udf(std::move(name)); }

}  // namespace sluice
