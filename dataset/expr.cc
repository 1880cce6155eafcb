// Expression builder, type checking and evaluation.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/expr_functions_internal.h"
#include "sluice/dataset/expr_internal.h"
#include "sluice/dataset/expr_kernels_internal.h"
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

namespace {

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
  Tensor value;  // valid for constants and folded constant subtrees (to range-check literals)
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
    std::string v = w.value.valid() ? absl::StrCat(" ", w.value.at<double>(0)) : "";
    return ExprError(op, expr_op,
                     absl::StrCat("fractional literal", v, " with a ", DTypeName(d),
                                  " operand; Cast the operand to a float dtype first"));
  }
  if (w.dtype == DType::kInt64 && IsInteger(d) && w.value.valid()) {
    int64_t v = w.value.at<int64_t>(0);
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
  r.value = Tensor();
  return r;
}

absl::Status CheckCast(absl::string_view op, const TypeInfo& a, DType to) {
  if (to == DType::kString || (a.dtype && *a.dtype == DType::kString)) {
    return ExprError(op, "cast", "casts to or from string are not supported");
  }
  return absl::OkStatus();
}

TypeInfo InfoOf(const Tensor& t, bool weak) {
  TypeInfo i;
  i.dtype = t.dtype();
  i.weak = weak;
  i.shape = t.shape().dims();
  i.value = t;
  return i;
}

}  // namespace

// ---------------------------------------------------------------------------
// Programs
// ---------------------------------------------------------------------------
//
// An output expression is lowered, when the function is compiled, into a
// Program: its nodes in post order, each with its dtype resolved and its
// kernel (expr_kernels_internal.h) chosen, the implicit casts of weak
// literals made explicit, identity casts dropped and constant subtrees
// folded. Running it dispatches per step, never per value: steps whose shape
// is a scalar run once; the others run block by block, kExprBlockElements
// values at a time through every step, with intermediate results in
// block-sized temporaries ("slots") that stay in cache. So `x * 2 + 1` reads
// x once and writes its result once, and the extra memory is
// num_slots * kExprBlockElements * 8 bytes whatever the tensor's size.

struct CompiledFunction::Node {
  proto::Expr::KindCase kind = proto::Expr::KIND_NOT_SET;
  int index = -1;
  Tensor constant;
  bool weak = false;
  int op = 0;
  DType cast_to = DType::kFloat32;
  std::unique_ptr<Node> a, b;
  // kCall: the function, its attributes (args cleared), its arguments and
  // its index among the function's calls (for its seed).
  const ExprFunction* function = nullptr;
  proto::Expr::Call call;
  std::vector<std::unique_ptr<Node>> args;
  int call_index = 0;
};

namespace {

using Node = CompiledFunction::Node;

struct CallStep;

struct Step {
  enum class Kind : uint8_t { kComponent, kConstant, kKernel, kCall };
  Kind kind = Kind::kConstant;
  DType dtype = DType::kFloat32;  // of the step's result
  int component = -1;             // kComponent: -1 for the only component
  Tensor constant;                // kConstant
  ExprKernel kernel = nullptr;    // kKernel
  absl::string_view name;         // kKernel: the expression op, for errors
  int a = -1, b = -1;             // kKernel: operand steps (b only for binary ops)
  int slot = -1;                  // kKernel: its block temporary (none for the result)
  std::shared_ptr<const CallStep> call;  // kCall; its result is a whole tensor
};

struct Program {
  // INVARIANT: operands precede their users, every step but the last has
  // exactly one user, and the last step is the result.
  std::vector<Step> steps;
  int num_slots = 0;
  // False when an input dtype was unknown at compile time: the expression is
  // then lowered again for each element (steps is empty).
  bool complete = false;
};

// A call of a named function: each argument is a program of its own, run
// first; the call's result then enters the elementwise steps as a
// component does.
struct CallStep {
  const ExprFunction* function = nullptr;
  const proto::Expr::Call* attrs = nullptr;  // the Node's, alive as long as the program
  std::vector<Program> args;
  bool encoded_input = false;  // args[0] is the bytes of an image.decode it took over
  uint64_t salt = 0;           // the call's place in its function: mixed into its seed
};

// What one element's evaluation shares across its outputs and calls.
struct RunContext {
  uint64_t seed = 0;   // the element's seed (random calls mix in their salt)
  std::string origin;  // the file the element's bytes came from, once read
};

absl::StatusOr<std::unique_ptr<Node>> BuildNode(const proto::Expr& e, absl::string_view op,
                                                int depth, int* calls) {
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
      SLUICE_ASSIGN_OR_RETURN(n->a, BuildNode(e.unary().operand(), op, depth + 1, calls));
      break;
    }
    case proto::Expr::kBinary: {
      n->op = e.binary().op();
      if (!IsArith(n->op) && !IsCompare(n->op) && !IsLogical(n->op)) {
        return ExprError(op, "binary", absl::StrCat("unknown binary op ", n->op));
      }
      SLUICE_ASSIGN_OR_RETURN(n->a, BuildNode(e.binary().lhs(), op, depth + 1, calls));
      SLUICE_ASSIGN_OR_RETURN(n->b, BuildNode(e.binary().rhs(), op, depth + 1, calls));
      break;
    }
    case proto::Expr::kCast: {
      if (e.cast().dtype() > 255 || !IsValidDType(static_cast<uint8_t>(e.cast().dtype()))) {
        return ExprError(op, "cast", absl::StrCat("invalid target dtype ", e.cast().dtype()));
      }
      n->cast_to = static_cast<DType>(e.cast().dtype());
      SLUICE_ASSIGN_OR_RETURN(n->a, BuildNode(e.cast().operand(), op, depth + 1, calls));
      break;
    }
    case proto::Expr::kCall: {
      n->function = FindExprFunction(e.call().function());
      if (n->function == nullptr) {
        return ExprError(op, "call", absl::StrCat("unknown function '", e.call().function(), "'"));
      }
      if (e.call().args_size() != n->function->num_args) {
        return ExprError(op, n->function->name,
                         absl::StrCat("takes ", n->function->num_args, " argument",
                                      n->function->num_args == 1 ? "" : "s", "; got ",
                                      e.call().args_size()));
      }
      n->call = e.call();
      n->call.clear_args();
      n->call_index = (*calls)++;
      for (const proto::Expr& arg : e.call().args()) {
        SLUICE_ASSIGN_OR_RETURN(auto a, BuildNode(arg, op, depth + 1, calls));
        n->args.push_back(std::move(a));
      }
      break;
    }
    case proto::Expr::KIND_NOT_SET:
      return ExprError(op, "expr", "empty expression node");
  }
  return n;
}

absl::StatusOr<Tensor> AllocateForOverwrite(DType dtype, const TensorShape& shape) {
  return Tensor::Allocate(dtype, shape, /*zeroed=*/false);
}

int ComponentIndex(const Step& s) { return s.component < 0 ? 0 : s.component; }

absl::StatusOr<Tensor> Run(const Program& p, const Element& in, absl::string_view op,
                           RunContext& rc);

// Runs call `c` on `in`: its arguments, then the function. Errors name the
// op, the function and, once read, the file.
absl::StatusOr<Tensor> RunCall(const CallStep& c, DType dtype, const Element& in,
                               absl::string_view op, RunContext& rc) {
  std::vector<Tensor> args;
  args.reserve(c.args.size());
  for (const Program& a : c.args) {
    SLUICE_ASSIGN_OR_RETURN(Tensor t, Run(a, in, op, rc));
    args.push_back(std::move(t));
  }
  CallContext ctx;
  ctx.seed = c.function->random ? Mix(rc.seed, c.salt) : 0;
  ctx.encoded_input = c.encoded_input;
  ctx.origin = &rc.origin;
  absl::StatusOr<Tensor> r = c.function->run(*c.attrs, args, ctx);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat(op, ": ", c.function->name, ": ",
                                     rc.origin.empty() ? "" : absl::StrCat(rc.origin, ": "),
                                     r.status().message()));
  }
  if (!r->valid() || r->dtype() != dtype) {
    return absl::InternalError(absl::StrCat(op, ": ", c.function->name,
                                            ": returned a tensor of another dtype than inferred"));
  }
  return r;
}

// Runs a complete program on `in`, whose components have the dtypes the
// program was lowered for (Matches). Checks the shapes, which may have been
// unknown when it was lowered.
absl::StatusOr<Tensor> Run(const Program& p, const Element& in, absl::string_view op,
                           RunContext& rc) {
  const int num_steps = static_cast<int>(p.steps.size());
  const Step& result = p.steps.back();
  if (result.kind == Step::Kind::kComponent) return in[ComponentIndex(result)];
  if (result.kind == Step::Kind::kConstant) return result.constant;
  if (result.kind == Step::Kind::kCall) return RunCall(*result.call, result.dtype, in, op, rc);

  // Shapes, and the data of inputs (components, call results, constants).
  absl::InlinedVector<const TensorShape*, 16> shape(num_steps);
  absl::InlinedVector<const uint8_t*, 16> data(num_steps, nullptr);
  absl::InlinedVector<Tensor, 16> held(num_steps);  // call results, misaligned inputs' copies
  for (int i = 0; i < num_steps; ++i) {
    const Step& s = p.steps[i];
    switch (s.kind) {
      case Step::Kind::kComponent:
      case Step::Kind::kCall: {
        if (s.kind == Step::Kind::kCall) {
          SLUICE_ASSIGN_OR_RETURN(held[i], RunCall(*s.call, s.dtype, in, op, rc));
        }
        const Tensor& t = s.kind == Step::Kind::kCall ? held[i] : in[ComponentIndex(s)];
        shape[i] = &t.shape();
        data[i] = t.data();
        if (reinterpret_cast<uintptr_t>(t.data()) % DTypeSize(s.dtype) != 0) {
          // A view at an odd offset: the kernels need aligned values.
          SLUICE_ASSIGN_OR_RETURN(Tensor copy, AllocateForOverwrite(s.dtype, t.shape()));
          if (t.byte_size() > 0) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
          held[i] = std::move(copy);  // `t` may have been held[i]: copied already
          shape[i] = &held[i].shape();
          data[i] = held[i].data();
        }
        break;
      }
      case Step::Kind::kConstant:
        shape[i] = &s.constant.shape();
        data[i] = s.constant.data();
        break;
      case Step::Kind::kKernel: {
        const TensorShape* sa = shape[s.a];
        const TensorShape* sb = s.b >= 0 ? shape[s.b] : sa;
        if (sb->is_scalar()) {
          shape[i] = sa;
        } else if (sa->is_scalar() || *sa == *sb) {
          shape[i] = sb;
        } else {
          return ExprError(op, s.name,
                           absl::StrCat("shapes ", ShapeString(sa->dims()), " and ",
                                        ShapeString(sb->dims()),
                                        " do not match (only scalars broadcast)"));
        }
        break;
      }
    }
  }

  SLUICE_ASSIGN_OR_RETURN(Tensor out, AllocateForOverwrite(result.dtype, *shape.back()));
  uint8_t* const out_data = out.mutable_data();
  const int64_t n = out.num_elements();
  const int64_t block = std::min(n, kExprBlockElements);
  // A slot holds `block` values of up to 8 bytes, rounded to a cache line.
  const int64_t slot_bytes = (block * 8 + 63) / 64 * 64;
  std::unique_ptr<uint64_t[]> slots;
  absl::InlinedVector<uint64_t, 16> scalar(num_steps);  // values of scalar kernel steps
  auto operand = [&](int o, int64_t begin) -> KernelOperand {
    if (shape[o]->is_scalar()) {
      return {data[o] != nullptr ? data[o] : reinterpret_cast<const uint8_t*>(&scalar[o]), true};
    }
    if (data[o] != nullptr) {
      return {data[o] + begin * DTypeSize(p.steps[o].dtype), false};
    }
    return {reinterpret_cast<const uint8_t*>(slots.get()) + p.steps[o].slot * slot_bytes, false};
  };
  auto run_step = [&](int i, int64_t begin, int64_t len, uint8_t* dst) -> absl::Status {
    const Step& s = p.steps[i];
    KernelOperand b = s.b >= 0 ? operand(s.b, begin) : KernelOperand{};
    if (!s.kernel(operand(s.a, begin), b, dst, len)) {
      return ExprError(op, s.name, "integer division by zero");
    }
    return absl::OkStatus();
  };

  // Scalar steps run once, first; the others are left for the blocks.
  absl::InlinedVector<int, 16> vector_steps;
  for (int i = 0; i < num_steps; ++i) {
    if (p.steps[i].kind != Step::Kind::kKernel) continue;
    if (!shape[i]->is_scalar()) {
      vector_steps.push_back(i);
      continue;
    }
    uint8_t* dst = i == num_steps - 1 ? out_data : reinterpret_cast<uint8_t*>(&scalar[i]);
    SLUICE_RETURN_IF_ERROR(run_step(i, 0, 1, dst));
  }
  if (vector_steps.empty() || n == 0) return out;

  if (p.num_slots > 0) slots = std::make_unique_for_overwrite<uint64_t[]>(p.num_slots * slot_bytes / 8);
  const size_t out_width = DTypeSize(result.dtype);
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t len = std::min(block, n - begin);
    for (int i : vector_steps) {
      uint8_t* dst = i == num_steps - 1
                         ? out_data + begin * out_width
                         : reinterpret_cast<uint8_t*>(slots.get()) + p.steps[i].slot * slot_bytes;
      SLUICE_RETURN_IF_ERROR(run_step(i, begin, len, dst));
    }
  }
  return out;
}

// Replaces kernel step `i`, when all its operands are constants, by its
// value, and returns that value (invalid when it cannot be folded). An
// evaluation error (division by zero) is left to run time.
Tensor Fold(Program& p, int i, absl::string_view op) {
  const Step& s = p.steps[i];
  Program sub;
  for (int o : {s.a, s.b}) {
    if (o < 0) continue;
    if (p.steps[o].kind != Step::Kind::kConstant) return Tensor();
    sub.steps.push_back(p.steps[o]);
  }
  Step k = s;
  k.a = 0;
  k.b = s.b >= 0 ? 1 : -1;
  sub.steps.push_back(std::move(k));
  RunContext rc;
  auto v = Run(sub, Element{}, op, rc);
  if (!v.ok()) return Tensor();
  Step c;
  c.kind = Step::Kind::kConstant;
  c.dtype = v->dtype();
  c.constant = *v;
  p.steps[i] = std::move(c);  // its operands are now unused; Finalize drops them
  return *std::move(v);
}

// Appends a kernel step and folds it when its operands are constants.
absl::StatusOr<int> AddKernel(Program& p, ExprKernel kernel, DType dtype,
                              absl::string_view name, int a, int b, absl::string_view op,
                              TypeInfo* info) {
  if (kernel == nullptr) {
    return absl::InternalError(absl::StrCat(op, ": op '", name, "': no kernel for ",
                                            DTypeName(p.steps[a].dtype)));
  }
  Step s;
  s.kind = Step::Kind::kKernel;
  s.dtype = dtype;
  s.kernel = kernel;
  s.name = name;
  s.a = a;
  s.b = b;
  p.steps.push_back(std::move(s));
  int i = static_cast<int>(p.steps.size()) - 1;
  Tensor folded = Fold(p, i, op);
  if (info != nullptr && folded.valid()) info->value = std::move(folded);
  return i;
}

// Step `i` converted to `to` (itself when it has that dtype already).
absl::StatusOr<int> Convert(Program& p, int i, DType to, absl::string_view op) {
  if (p.steps[i].dtype == to) return i;
  return AddKernel(p, CastKernelFor(p.steps[i].dtype, to), to, "cast", i, -1, op, nullptr);
}

absl::StatusOr<TypeInfo> ComponentInfo(int index, const ElementSpec& in, absl::string_view op) {
  TypeInfo t;
  if (!in.known) return t;
  if (index == -1) {
    if (in.components.size() != 1) {
      return ExprError(op, "x",
                       absl::StrCat("x names a single-component element but the input has ",
                                    in.components.size(), " components; use x[i]"));
    }
  } else if (index >= static_cast<int>(in.components.size())) {
    return ExprError(op, "x[i]",
                     absl::StrCat("x[", index, "] is out of range: the input has ",
                                  in.components.size(), " components"));
  }
  const ComponentSpec& c = in.components[index == -1 ? 0 : index];
  t.dtype = c.dtype;
  t.shape = c.shape;
  // A string component may pass through; the ops that take it reject it.
  return t;
}

// What lowering a node gave: its type, and its step (-1 when an input dtype
// is unknown, so that no kernel can be chosen yet).
struct Lowered {
  TypeInfo info;
  int step = -1;
};

absl::StatusOr<Program> LowerOutput(const Node& root, const ElementSpec& in,
                                    absl::string_view op, TypeInfo* info);

// Lowers call node `n`: each argument into a program of its own, the call
// into one step. A function that takes encoded input, called on
// image.decode(bytes), is given the bytes (checked as the decode would).
absl::StatusOr<Lowered> LowerCall(const Node& n, const ElementSpec& in, absl::string_view op,
                                  Program& p) {
  auto c = std::make_shared<CallStep>();
  c->function = n.function;
  c->attrs = &n.call;
  c->salt = static_cast<uint64_t>(n.call_index);
  std::vector<const Node*> args;
  for (const auto& a : n.args) args.push_back(a.get());
  const Node* decode = nullptr;
  if (n.function->takes_encoded_input && args[0]->kind == proto::Expr::kCall &&
      args[0]->function->name == kDecodeFunction) {
    decode = args[0];
    args[0] = decode->args[0].get();
    c->encoded_input = true;
  }
  bool complete = true;
  std::vector<ComponentSpec> specs;
  for (const Node* a : args) {
    TypeInfo t;
    SLUICE_ASSIGN_OR_RETURN(Program ap, LowerOutput(*a, in, op, &t));
    complete = complete && ap.complete;
    specs.push_back(ComponentSpec{t.dtype, t.shape});
    c->args.push_back(std::move(ap));
  }
  auto infer = [&](const Node& call, const std::vector<ComponentSpec>& s)
      -> absl::StatusOr<ComponentSpec> {
    absl::StatusOr<ComponentSpec> r = call.function->infer(call.call, s);
    if (!r.ok()) return ExprError(op, call.function->name, r.status().message());
    if (!r->dtype) {
      return absl::InternalError(absl::StrCat(op, ": ", call.function->name, ": no result dtype"));
    }
    return r;
  };
  if (decode != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(specs[0], infer(*decode, {specs[0]}));
  }
  SLUICE_ASSIGN_OR_RETURN(ComponentSpec r, infer(n, specs));
  TypeInfo t;
  t.dtype = r.dtype;
  t.shape = r.shape;
  if (!complete) return Lowered{std::move(t), -1};
  Step s;
  s.kind = Step::Kind::kCall;
  s.dtype = *r.dtype;
  s.name = n.function->name;
  s.call = std::move(c);
  p.steps.push_back(std::move(s));
  return Lowered{std::move(t), static_cast<int>(p.steps.size()) - 1};
}

// Type-checks `n` against `in` (the errors of a definition) and appends its
// steps to `p`.
absl::StatusOr<Lowered> Lower(const Node& n, const ElementSpec& in, absl::string_view op,
                              Program& p) {
  switch (n.kind) {
    case proto::Expr::kCall:
      return LowerCall(n, in, op, p);
    case proto::Expr::kComponent: {
      SLUICE_ASSIGN_OR_RETURN(TypeInfo t, ComponentInfo(n.index, in, op));
      if (!t.dtype) return Lowered{std::move(t), -1};
      Step s;
      s.kind = Step::Kind::kComponent;
      s.dtype = *t.dtype;
      s.component = n.index;
      p.steps.push_back(std::move(s));
      return Lowered{std::move(t), static_cast<int>(p.steps.size()) - 1};
    }
    case proto::Expr::kConstant: {
      Step s;
      s.kind = Step::Kind::kConstant;
      s.dtype = n.constant.dtype();
      s.constant = n.constant;
      p.steps.push_back(std::move(s));
      return Lowered{InfoOf(n.constant, n.weak), static_cast<int>(p.steps.size()) - 1};
    }
    case proto::Expr::kUnary: {
      SLUICE_ASSIGN_OR_RETURN(Lowered a, Lower(*n.a, in, op, p));
      SLUICE_ASSIGN_OR_RETURN(TypeInfo r, ResolveUnary(op, n.op, a.info));
      if (a.step < 0) return Lowered{std::move(r), -1};
      SLUICE_ASSIGN_OR_RETURN(int s, AddKernel(p, UnaryKernelFor(n.op, *r.dtype), *r.dtype,
                                               UnaryName(n.op), a.step, -1, op, &r));
      return Lowered{std::move(r), s};
    }
    case proto::Expr::kBinary: {
      SLUICE_ASSIGN_OR_RETURN(Lowered a, Lower(*n.a, in, op, p));
      SLUICE_ASSIGN_OR_RETURN(Lowered b, Lower(*n.b, in, op, p));
      SLUICE_ASSIGN_OR_RETURN(BinaryResolution r, ResolveBinary(op, n.op, a.info, b.info));
      if (a.step < 0 || b.step < 0) return Lowered{std::move(r.result), -1};
      // Weak literals adopt the other operand's dtype here.
      DType d = *r.operand_dtype;
      SLUICE_ASSIGN_OR_RETURN(int sa, Convert(p, a.step, d, op));
      SLUICE_ASSIGN_OR_RETURN(int sb, Convert(p, b.step, d, op));
      SLUICE_ASSIGN_OR_RETURN(int s, AddKernel(p, BinaryKernelFor(n.op, d), *r.result.dtype,
                                               BinaryName(n.op), sa, sb, op, &r.result));
      return Lowered{std::move(r.result), s};
    }
    case proto::Expr::kCast: {
      SLUICE_ASSIGN_OR_RETURN(Lowered a, Lower(*n.a, in, op, p));
      SLUICE_RETURN_IF_ERROR(CheckCast(op, a.info, n.cast_to));
      TypeInfo r;
      r.dtype = n.cast_to;
      r.shape = a.info.shape;
      if (a.step < 0) return Lowered{std::move(r), -1};
      SLUICE_ASSIGN_OR_RETURN(int s, Convert(p, a.step, n.cast_to, op));
      return Lowered{std::move(r), s};
    }
    default:
      return ExprError(op, "expr", "empty expression node");
  }
}

// Drops the steps folding left unused and gives each kernel step but the
// result a slot. A step's slot is taken before its operands' slots are
// freed, so no kernel writes a slot it reads.
void Finalize(Program& p) {
  const int num_steps = static_cast<int>(p.steps.size());
  std::vector<bool> live(num_steps, false);
  live[num_steps - 1] = true;
  for (int i = num_steps - 1; i >= 0; --i) {
    if (!live[i]) continue;
    if (p.steps[i].a >= 0) live[p.steps[i].a] = true;
    if (p.steps[i].b >= 0) live[p.steps[i].b] = true;
  }
  std::vector<int> index(num_steps, -1);
  std::vector<Step> kept;
  for (int i = 0; i < num_steps; ++i) {
    if (!live[i]) continue;
    Step s = std::move(p.steps[i]);
    if (s.a >= 0) s.a = index[s.a];
    if (s.b >= 0) s.b = index[s.b];
    index[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(s));
  }
  std::vector<int> free_slots;
  int num_slots = 0;
  for (size_t i = 0; i + 1 < kept.size(); ++i) {
    Step& s = kept[i];
    if (s.kind != Step::Kind::kKernel) continue;
    if (free_slots.empty()) {
      s.slot = num_slots++;
    } else {
      s.slot = free_slots.back();
      free_slots.pop_back();
    }
    for (int o : {s.a, s.b}) {
      if (o >= 0 && kept[o].slot >= 0) free_slots.push_back(kept[o].slot);
    }
  }
  p.steps = std::move(kept);
  p.num_slots = num_slots;
}

absl::StatusOr<Program> LowerOutput(const Node& root, const ElementSpec& in,
                                    absl::string_view op, TypeInfo* info) {
  Program p;
  SLUICE_ASSIGN_OR_RETURN(Lowered l, Lower(root, in, op, p));
  if (info != nullptr) *info = std::move(l.info);
  p.complete = l.step >= 0;
  if (p.complete) {
    Finalize(p);
  } else {
    p.steps.clear();
  }
  return p;
}

// Whether `in` has the components, with the dtypes, `p` was lowered for.
bool Matches(const Program& p, const Element& in) {
  for (const Step& s : p.steps) {
    if (s.kind == Step::Kind::kCall) {
      for (const Program& a : s.call->args) {
        if (!Matches(a, in)) return false;
      }
      continue;
    }
    if (s.kind != Step::Kind::kComponent) continue;
    if (s.component == -1 ? in.size() != 1 : s.component >= static_cast<int>(in.size())) {
      return false;
    }
    if (in[ComponentIndex(s)].dtype() != s.dtype) return false;
  }
  return true;
}

bool HasRandomCall(const Node& n) {
  if (n.function != nullptr && n.function->random) return true;
  for (const Node* c : {n.a.get(), n.b.get()}) {
    if (c != nullptr && HasRandomCall(*c)) return true;
  }
  for (const auto& c : n.args) {
    if (HasRandomCall(*c)) return true;
  }
  return false;
}

ElementSpec SpecOf(const Element& e) {
  ElementSpec spec;
  for (const Tensor& t : e) spec.components.push_back(ComponentSpec{t.dtype(), t.shape().dims()});
  return spec;
}

}  // namespace

struct CompiledFunction::Output {
  std::unique_ptr<Node> node;
  Program program;
};

// ---------------------------------------------------------------------------
// CompiledFunction
// ---------------------------------------------------------------------------

CompiledFunction::CompiledFunction() = default;
CompiledFunction::~CompiledFunction() = default;

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
  int calls = 0;
  for (const proto::Expr& e : fn.outputs()) {
    Output out;
    SLUICE_ASSIGN_OR_RETURN(out.node, BuildNode(e, op, 0, &calls));
    f->random_ = f->random_ || HasRandomCall(*out.node);
    TypeInfo t;
    SLUICE_ASSIGN_OR_RETURN(out.program, LowerOutput(*out.node, input, op, &t));
    // A bare literal output materializes as its int64/float64 constant.
    f->output_spec_.components.push_back(ComponentSpec{t.dtype, t.shape});
    f->outputs_.push_back(std::move(out));
  }
  return std::shared_ptr<const CompiledFunction>(std::move(f));
}

absl::StatusOr<Element> CompiledFunction::Apply(const Element& input, uint64_t seed) const {
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
  RunContext rc;
  rc.seed = seed;
  for (const Output& o : outputs_) {
    const Program* program = &o.program;
    Program relowered;
    if (!o.program.complete || !Matches(o.program, input)) {
      // The dtypes were unknown when compiled, or this element's differ from
      // the spec: lower for this element (its type errors surface here).
      SLUICE_ASSIGN_OR_RETURN(relowered, LowerOutput(*o.node, SpecOf(input), op_, nullptr));
      if (!relowered.complete) {
        return absl::InternalError(absl::StrCat(op_, ": expression has no dtype at run time"));
      }
      program = &relowered;
    }
    SLUICE_ASSIGN_OR_RETURN(Tensor t, Run(*program, input, op_, rc));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace internal
}  // namespace sluice
