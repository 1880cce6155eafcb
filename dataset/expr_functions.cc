// The named functions of the expression language, one line each
// (expr_functions_internal.h).
#include "sluice/dataset/expr_functions_internal.h"

namespace sluice::internal {

extern const ExprFunction kReadFileFunction;              // image.cc
extern const ExprFunction kDecodeImageFunction;           // image.cc
extern const ExprFunction kRandomResizedCropFunction;     // image.cc
extern const ExprFunction kResizeFunction;                // image.cc
extern const ExprFunction kCenterCropFunction;            // image.cc
extern const ExprFunction kRandomHorizontalFlipFunction;  // image.cc
extern const ExprFunction kNormalizeFunction;             // image.cc
extern const ExprFunction kFolderLabelFunction;           // image.cc

const ExprFunction* FindExprFunction(absl::string_view name) {
  static const ExprFunction* const kFunctions[] = {
      &kReadFileFunction,     &kDecodeImageFunction,          &kRandomResizedCropFunction,
      &kResizeFunction,       &kCenterCropFunction,           &kRandomHorizontalFlipFunction,
      &kNormalizeFunction,    &kFolderLabelFunction,
  };
  for (const ExprFunction* f : kFunctions) {
    if (name == f->name) return f;
  }
  return nullptr;
}

}  // namespace sluice::internal
