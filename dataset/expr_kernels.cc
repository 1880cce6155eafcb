// Elementwise expression kernels: one loop per (op, dtype) and per cast pair.
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "dataset/dataset.pb.h"
#include "sluice/dataset/expr_kernels_internal.h"

namespace sluice::internal {
namespace {

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

// How a dtype's values are stored: bool as one byte holding 0 or not.
template <typename T>
struct StorageOf { using type = T; };
template <>
struct StorageOf<bool> { using type = uint8_t; };
template <typename T>
using StorageT = typename StorageOf<T>::type;

template <typename T>
inline ComputeT<T> Load(const StorageT<T>* p, int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    return p[i] != 0;
  } else if constexpr (kIsHalf<T>) {
    return static_cast<float>(p[i]);
  } else {
    return p[i];
  }
}

template <typename T>
inline StorageT<T> StoreValue(ComputeT<T> v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? 1 : 0;
  } else if constexpr (kIsHalf<T>) {
    return T(v);
  } else {
    return v;
  }
}

// The loops. Each operand shape gets its own loop so that a broadcast value
// stays in a register; the pointers are restrict so that no alias check is
// needed.
template <typename T, typename Out, typename F>
void LoopVV(const StorageT<T>* __restrict a, const StorageT<T>* __restrict b,
            StorageT<Out>* __restrict out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = StoreValue<Out>(f(Load<T>(a, i), Load<T>(b, i)));
}

template <typename T, typename Out, typename F>
void LoopSV(ComputeT<T> a, const StorageT<T>* __restrict b, StorageT<Out>* __restrict out,
            int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = StoreValue<Out>(f(a, Load<T>(b, i)));
}

template <typename T, typename Out, typename F>
void LoopVS(const StorageT<T>* __restrict a, ComputeT<T> b, StorageT<Out>* __restrict out,
            int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = StoreValue<Out>(f(Load<T>(a, i), b));
}

template <typename T, typename Out, typename F>
void Map1(KernelOperand a, uint8_t* out, int64_t n, F f) {
  const auto* pa = reinterpret_cast<const StorageT<T>*>(a.data);
  auto* po = reinterpret_cast<StorageT<Out>*>(out);
  for (int64_t i = 0; i < n; ++i) po[i] = StoreValue<Out>(f(Load<T>(pa, i)));
}

template <typename T, typename Out, typename F>
void Map2(KernelOperand a, KernelOperand b, uint8_t* out, int64_t n, F f) {
  const auto* pa = reinterpret_cast<const StorageT<T>*>(a.data);
  const auto* pb = reinterpret_cast<const StorageT<T>*>(b.data);
  auto* po = reinterpret_cast<StorageT<Out>*>(out);
  if (a.scalar && !b.scalar) {
    LoopSV<T, Out>(Load<T>(pa, 0), pb, po, n, f);
  } else if (b.scalar) {
    LoopVS<T, Out>(pa, Load<T>(pb, 0), po, n, f);
  } else {
    LoopVV<T, Out>(pa, pb, po, n, f);
  }
}

// Integer arithmetic wraps: it is done in an unsigned type at least as wide
// as int (so that the usual promotions cannot overflow a signed int).
template <typename C>
using WrapT = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;

template <typename C>
inline C WrapNeg(C v) {
  if constexpr (std::is_integral_v<C>) {
    return static_cast<C>(WrapT<C>{0} - static_cast<WrapT<C>>(v));
  } else {
    return -v;
  }
}

struct AddOp {
  template <typename C>
  static C Do(C x, C y) {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<WrapT<C>>(x) + static_cast<WrapT<C>>(y));
    } else {
      return x + y;
    }
  }
};
struct SubOp {
  template <typename C>
  static C Do(C x, C y) {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<WrapT<C>>(x) - static_cast<WrapT<C>>(y));
    } else {
      return x - y;
    }
  }
};
struct MulOp {
  template <typename C>
  static C Do(C x, C y) {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>(static_cast<WrapT<C>>(x) * static_cast<WrapT<C>>(y));
    } else {
      return x * y;
    }
  }
};
struct FloatDivOp {
  template <typename C>
  static C Do(C x, C y) { return x / y; }
};
struct FloatModOp {
  template <typename C>
  static C Do(C x, C y) { return std::fmod(x, y); }
};
// Integer / and % truncate toward zero; a divisor of -1 is special-cased so
// that MIN / -1 wraps to MIN instead of trapping. The divisor is non-zero.
struct IntDivOp {
  template <typename C>
  static C Do(C x, C y) {
    if constexpr (std::is_signed_v<C>) {
      if (y == C(-1)) return WrapNeg(x);
    }
    return static_cast<C>(x / y);
  }
};
struct IntModOp {
  template <typename C>
  static C Do(C x, C y) {
    if constexpr (std::is_signed_v<C>) {
      if (y == C(-1)) return C(0);
    }
    return static_cast<C>(x % y);
  }
};
// Min/Max of a NaN is the quiet NaN, whichever side it is on.
struct MinOp {
  template <typename C>
  static C Do(C x, C y) {
    C r = y < x ? y : x;
    if constexpr (std::is_floating_point_v<C>) {
      if (x != x || y != y) r = std::numeric_limits<C>::quiet_NaN();
    }
    return r;
  }
};
struct MaxOp {
  template <typename C>
  static C Do(C x, C y) {
    C r = y > x ? y : x;
    if constexpr (std::is_floating_point_v<C>) {
      if (x != x || y != y) r = std::numeric_limits<C>::quiet_NaN();
    }
    return r;
  }
};
struct EqOp {
  template <typename C>
  static bool Do(C x, C y) { return x == y; }
};
struct NeOp {
  template <typename C>
  static bool Do(C x, C y) { return x != y; }
};
struct LtOp {
  template <typename C>
  static bool Do(C x, C y) { return x < y; }
};
struct LeOp {
  template <typename C>
  static bool Do(C x, C y) { return x <= y; }
};
struct GtOp {
  template <typename C>
  static bool Do(C x, C y) { return x > y; }
};
struct GeOp {
  template <typename C>
  static bool Do(C x, C y) { return x >= y; }
};
struct AndOp {
  static bool Do(bool x, bool y) { return x && y; }
};
struct OrOp {
  static bool Do(bool x, bool y) { return x || y; }
};

template <typename T, typename Out, typename Op>
bool BinaryKernel(KernelOperand a, KernelOperand b, uint8_t* out, int64_t n) {
  using C = ComputeT<T>;
  Map2<T, Out>(a, b, out, n, [](C x, C y) { return Op::template Do<C>(x, y); });
  return true;
}

template <typename Op>
bool LogicKernel(KernelOperand a, KernelOperand b, uint8_t* out, int64_t n) {
  Map2<bool, bool>(a, b, out, n, [](bool x, bool y) { return Op::Do(x, y); });
  return true;
}

// Integer division: the divisors are checked first (a loop the compiler
// vectorizes), so the division loop itself has no error path.
template <typename T, typename Op>
bool IntDivKernel(KernelOperand a, KernelOperand b, uint8_t* out, int64_t n) {
  if (n == 0) return true;
  const auto* pb = reinterpret_cast<const T*>(b.data);
  if (b.scalar) {
    if (pb[0] == T(0)) return false;
  } else {
    bool zero = false;
    for (int64_t i = 0; i < n; ++i) zero |= pb[i] == T(0);
    if (zero) return false;
  }
  Map2<T, T>(a, b, out, n, [](T x, T y) { return Op::template Do<T>(x, y); });
  return true;
}

template <typename T>
bool NegKernel(KernelOperand a, KernelOperand, uint8_t* out, int64_t n) {
  Map1<T, T>(a, out, n, [](ComputeT<T> v) { return WrapNeg(v); });
  return true;
}

template <typename T>
bool AbsKernel(KernelOperand a, KernelOperand, uint8_t* out, int64_t n) {
  using C = ComputeT<T>;
  Map1<T, T>(a, out, n, [](C v) -> C {
    if constexpr (std::is_unsigned_v<C>) {
      return v;
    } else if constexpr (std::is_floating_point_v<C>) {
      return std::fabs(v);  // also clears the sign of -0.0 and NaN
    } else {
      return v < C(0) ? WrapNeg(v) : v;
    }
  });
  return true;
}

bool NotKernel(KernelOperand a, KernelOperand, uint8_t* out, int64_t n) {
  Map1<bool, bool>(a, out, n, [](bool v) { return !v; });
  return true;
}

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

// Saturating, NaN-safe conversion between compute types. The float bounds
// are compared in double: the integer limits round to powers of two there
// (or are exact), and no float or double lies strictly between a 64-bit
// limit and its rounded value, so the result is that of an exact comparison.
template <typename To, typename From>
To ConvertValue(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    constexpr double kLo = static_cast<double>(std::numeric_limits<To>::min());
    constexpr double kHi = static_cast<double>(std::numeric_limits<To>::max());
    double d = static_cast<double>(v);
    if (d != d) return 0;
    if (d <= kLo) return std::numeric_limits<To>::min();
    if (d >= kHi) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);  // integer -> integer wraps (C++20), -> float rounds
  }
}

template <typename From, typename To>
bool CastKernel(KernelOperand a, KernelOperand, uint8_t* out, int64_t n) {
  constexpr bool kToHalf = kIsHalf<To>;
  constexpr bool kWideFrom =
      std::is_same_v<From, double> || (std::is_integral_v<From> && sizeof(From) >= 4);
  if constexpr (kToHalf && kWideFrom) {
    // Exact in long double, then round-to-odd to float: the final float ->
    // 16-bit rounding is then correctly rounded (no double rounding through
    // float32).
    Map1<From, To>(a, out, n, [](ComputeT<From> v) {
      return RoundToOddFloat(static_cast<long double>(v));
    });
  } else {
    Map1<From, To>(a, out, n, [](ComputeT<From> v) { return ConvertValue<ComputeT<To>>(v); });
  }
  return true;
}

}  // namespace

ExprKernel UnaryKernelFor(int op, DType d) {
  if (d == DType::kString) return nullptr;
  return VisitNumeric(d, [&]<typename T>() -> ExprKernel {
    if constexpr (std::is_same_v<T, bool>) {
      return op == proto::LOGICAL_NOT ? &NotKernel : nullptr;
    } else {
      switch (op) {
        case proto::NEG: return &NegKernel<T>;
        case proto::ABS: return &AbsKernel<T>;
        default: return nullptr;
      }
    }
  });
}

ExprKernel BinaryKernelFor(int op, DType d) {
  if (d == DType::kString) return nullptr;
  return VisitNumeric(d, [&]<typename T>() -> ExprKernel {
    switch (op) {
      case proto::EQ: return &BinaryKernel<T, bool, EqOp>;
      case proto::NE: return &BinaryKernel<T, bool, NeOp>;
      case proto::LT: return &BinaryKernel<T, bool, LtOp>;
      case proto::LE: return &BinaryKernel<T, bool, LeOp>;
      case proto::GT: return &BinaryKernel<T, bool, GtOp>;
      case proto::GE: return &BinaryKernel<T, bool, GeOp>;
      default: break;
    }
    if constexpr (std::is_same_v<T, bool>) {
      switch (op) {
        case proto::LOGICAL_AND: return &LogicKernel<AndOp>;
        case proto::LOGICAL_OR: return &LogicKernel<OrOp>;
        default: return nullptr;
      }
    } else {
      switch (op) {
        case proto::ADD: return &BinaryKernel<T, T, AddOp>;
        case proto::SUB: return &BinaryKernel<T, T, SubOp>;
        case proto::MUL: return &BinaryKernel<T, T, MulOp>;
        case proto::MIN: return &BinaryKernel<T, T, MinOp>;
        case proto::MAX: return &BinaryKernel<T, T, MaxOp>;
        default: break;
      }
      if constexpr (std::is_integral_v<T>) {
        switch (op) {
          case proto::DIV: return &IntDivKernel<T, IntDivOp>;
          case proto::MOD: return &IntDivKernel<T, IntModOp>;
          default: return nullptr;
        }
      } else {
        switch (op) {
          case proto::DIV: return &BinaryKernel<T, T, FloatDivOp>;
          case proto::MOD: return &BinaryKernel<T, T, FloatModOp>;
          default: return nullptr;
        }
      }
    }
  });
}

ExprKernel CastKernelFor(DType from, DType to) {
  if (from == DType::kString || to == DType::kString) return nullptr;
  return VisitNumeric(from, [&]<typename From>() {
    return VisitNumeric(to, [&]<typename To>() -> ExprKernel { return &CastKernel<From, To>; });
  });
}

}  // namespace sluice::internal
