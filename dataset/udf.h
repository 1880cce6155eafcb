// Named C++ user-defined functions for Map/Filter, and plugins that hold them.
//
// In a plugin library (or the main program):
//
//   absl::StatusOr<sluice::Element> Normalize(const sluice::Element& in) {...}
//   SLUICE_REGISTER_UDF(normalize, Normalize, {.num_inputs = 1,
//                       .output_dtypes = {{sluice::DType::kFloat32}}});
//
// and in the pipeline: ds.Map(sluice::Udf("normalize")). Workers load
// plugins with LoadPlugin(path) (`--plugin libmine.so`).
//
// The registry is process-wide and thread-safe. A UDF must be safe to call
// from several threads at once and must not keep references to its input
// beyond the call unless it copies the Tensor handles (which share memory).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/core/tensor.h"

namespace sluice {

struct UdfSignature {
  // Number of input components the function takes; -1 accepts any.
  int num_inputs = -1;
  // Output component dtypes when known; lets later expressions type-check
  // at definition time. Unknown outputs are checked when elements flow.
  std::optional<std::vector<DType>> output_dtypes;
};

using UdfFn = std::function<absl::StatusOr<Element>(const Element&)>;

struct UdfEntry {
  std::string name;
  UdfSignature signature;
  UdfFn fn;
};

// Registers `fn` under `name`. AlreadyExists if the name is taken.
absl::Status RegisterUdf(std::string name, UdfSignature signature, UdfFn fn);
// The entry, or NotFound naming the function and how to provide it.
absl::StatusOr<const UdfEntry*> FindUdf(const std::string& name);
std::vector<std::string> RegisteredUdfNames();

// dlopen()s a plugin; its SLUICE_REGISTER_UDF lines run while it loads.
// Fails with a clear message when the file is missing, is not a loadable
// library, or registers a name that already exists. Loading the same path
// twice is a no-op.
absl::Status LoadPlugin(const std::string& path);

// Used by SLUICE_REGISTER_UDF; records failures for LoadPlugin to report.
class UdfRegistrar {
 public:
  UdfRegistrar(const char* name, UdfSignature signature, UdfFn fn);
};

// The signature is a braced UdfSignature initializer; omitted fields keep
// their defaults (the pragmas keep -Wextra quiet about that).
#define SLUICE_REGISTER_UDF(name, fn, ...)                                      \
  _Pragma("GCC diagnostic push")                                                \
  _Pragma("GCC diagnostic ignored \"-Wmissing-field-initializers\"")           \
  static const ::sluice::UdfRegistrar sluice_udf_registrar_##name(              \
      #name, ::sluice::UdfSignature __VA_ARGS__, fn);                           \
  _Pragma("GCC diagnostic pop")

}  // namespace sluice
