// Named functions of the expression language (proto::Expr::Call): whole-
// tensor operations such as image decoding and augmentation (image.cc) and
// file reading. Each is one ExprFunction; expr_functions.cc lists them, one
// line each. expr.cc type-checks a call with `infer` when the function is
// compiled and runs it with `run` before the elementwise steps that use
// its result. Internal to the dataset module.
//
// Adding a function: its ExprFunction in the file of its family, one line
// in expr_functions.cc, a public builder (image.h, ...) making the Call
// node, and tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/tensor.h"
#include "sluice/dataset/element_spec.h"

namespace sluice::internal {

// What a call's run gets besides its arguments.
struct CallContext {
  // Random functions: the seed of this call on this element (the pipeline
  // seed, the element's key and the call's place; expr.cc derives it).
  uint64_t seed = 0;
  // Argument 0 is the encoded image a Decode would have decoded (the call
  // takes the decode over: ExprFunction::takes_encoded_input).
  bool encoded_input = false;
  // The file the element's bytes came from (set by io.read_file), for
  // error messages; empty when unknown.
  std::string* origin = nullptr;
};

struct ExprFunction {
  const char* name = nullptr;  // as serialized and in errors: "image.decode"
  int num_args = 1;
  bool random = false;  // draws from CallContext::seed
  // May take the bytes of an `image.decode` argument instead of its image,
  // to decode only the part it needs.
  bool takes_encoded_input = false;
  // Validates the call's attributes and argument specs (a dtype or shape
  // may be unknown) and infers its result's. InvalidArgument naming the
  // function; the caller prefixes the dataset op.
  absl::StatusOr<ComponentSpec> (*infer)(const proto::Expr::Call& call,
                                         const std::vector<ComponentSpec>& args) = nullptr;
  absl::StatusOr<Tensor> (*run)(const proto::Expr::Call& call, const std::vector<Tensor>& args,
                                const CallContext& ctx) = nullptr;
};

// The function named `name`; null when there is none.
const ExprFunction* FindExprFunction(absl::string_view name);

// The name of the decode function that takes_encoded_input functions fuse.
inline constexpr absl::string_view kDecodeFunction = "image.decode";

}  // namespace sluice::internal
