// Type checking and evaluation of expression functions (see expr.h for the
// semantics). Internal to the dataset module.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/tensor.h"
#include "sluice/dataset/element_spec.h"

namespace sluice::internal {

// Tensor <-> proto. FromProto validates like a decoded frame.
proto::TensorProto TensorToProto(const Tensor& t);
absl::StatusOr<Tensor> TensorFromProto(const proto::TensorProto& p);

// A Function ready to run: constants decoded, UDF resolved. Thread-safe.
class CompiledFunction {
 public:
  // Validates against `input` (which may be partly unknown) and infers the
  // output spec. `op` names the dataset op for error messages ("Map").
  static absl::StatusOr<std::shared_ptr<const CompiledFunction>> Compile(
      const proto::Function& fn, const ElementSpec& input, absl::string_view op);
  ~CompiledFunction();

  const ElementSpec& output_spec() const { return output_spec_; }
  // `seed` seeds the random functions (expr_functions_internal.h) on this
  // element: the op derives it from the pipeline's seed and the element's
  // key (Iterator::ElementKey).
  absl::StatusOr<Element> Apply(const Element& input, uint64_t seed = 0) const;
  // Whether it calls a random function (so that its op needs a seed).
  bool random() const { return random_; }

  struct Node;    // an expression tree node, as parsed
  struct Output;  // its tree and the program it is lowered to (expr.cc)

 private:
  CompiledFunction();
  std::string op_;
  ElementSpec output_spec_;
  std::vector<Output> outputs_;
  const void* udf_ = nullptr;  // const UdfEntry*
  bool random_ = false;
};

}  // namespace sluice::internal
