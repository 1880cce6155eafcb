// Elementwise kernels behind expression evaluation (expr.cc). Each kernel is
// one tight loop for one (op, dtype) pair, or one (from, to) pair for casts,
// instantiated from templates so that the compiler vectorizes it; nothing
// inside the loop dispatches on the op or the dtype. Internal to the dataset
// module.
//
// Semantics are those documented in expr.h: integer + - * wrap, integer / %
// truncate (and report a zero divisor), float % is fmod, Min/Max of a NaN is
// the canonical quiet NaN, float16/bfloat16 compute in float32 and round
// back after every op, and casts saturate (float -> integer, NaN -> 0) or,
// from wide types to the 16-bit floats, round once.
#pragma once

#include <cstdint>

#include "sluice/core/dtype.h"
#include "sluice/core/half.h"

namespace sluice::internal {

// Values per block of fused evaluation: a chain of steps runs over one
// block before the next, so intermediate results stay in L1/L2 cache. Block
// temporaries take 8 bytes per value whatever the dtype.
inline constexpr int64_t kExprBlockElements = 2048;

// One operand of a kernel: `n` values of the operand's dtype at `data`, or,
// when `scalar`, one value that broadcasts. `data` is aligned for the dtype.
struct KernelOperand {
  const uint8_t* data = nullptr;
  bool scalar = false;
};

// Computes `n` results into `out` (aligned for the result dtype, and not
// overlapping either operand). Unary kernels and casts ignore `b`, and read
// `n` values of `a` (a scalar `a` comes with n == 1). Returns false, having
// written nothing useful, when an integer divisor among the `n` is zero;
// with n == 0 it returns true.
using ExprKernel = bool (*)(KernelOperand a, KernelOperand b, uint8_t* out, int64_t n);

// The kernel of a unary op (proto::UnaryOp) on dtype `d`; the result has
// dtype `d`. Null when the op does not apply to `d`.
ExprKernel UnaryKernelFor(int op, DType d);
// The kernel of a binary op (proto::BinaryOp) on two operands of dtype `d`;
// the result has dtype `d` (arithmetic, Min, Max) or bool (comparisons,
// logic). Null when the op does not apply to `d`.
ExprKernel BinaryKernelFor(int op, DType d);
// The kernel converting `from` to `to`; null for strings.
ExprKernel CastKernelFor(DType from, DType to);

// The C++ type values of a dtype are computed in: float for the 16-bit
// floats, the storage type otherwise.
template <typename T>
struct ComputeOf { using type = T; };
template <>
struct ComputeOf<Float16> { using type = float; };
template <>
struct ComputeOf<BFloat16> { using type = float; };
template <typename T>
using ComputeT = typename ComputeOf<T>::type;

// Calls f.template operator()<T>() with the C++ type of `d` (bool, the
// integers, Float16, BFloat16, float, double). Strings are excluded by every
// caller; they fall through to double.
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
  return f.template operator()<double>();
}

}  // namespace sluice::internal
