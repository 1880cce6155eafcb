#include "sluice/dataset/ops/file_reader.h"

#include "absl/strings/str_cat.h"

namespace sluice::internal {

namespace {

absl::Status CheckFilenames(absl::string_view op, const Analysis& in) {
  if (!in.spec.known) return absl::OkStatus();
  if (in.spec.components.size() != 1) {
    return Invalid(op, absl::StrCat("filenames must be one string component; got ",
                                    in.spec.ToString()));
  }
  const ComponentSpec& c = in.spec.components[0];
  if (c.dtype && *c.dtype != DType::kString) {
    return Invalid(op, absl::StrCat("filenames must be strings; got ", c.ToString()));
  }
  if (c.shape && c.shape->size() > 1) {
    return Invalid(op, absl::StrCat("filenames must be string scalars or vectors; got ",
                                    c.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AnalyzeReader(Analysis& a, absl::string_view op) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, op));
  SLUICE_RETURN_IF_ERROR(CheckFilenames(op, *in));
  a.spec.components = {ScalarSpec(DType::kString)};
  a.cardinality = kUnknownCardinality;
  return absl::OkStatus();
}

absl::Status FileReaderIterator::SaveReader(proto::IteratorState* state,
                                            const std::string& open_file,
                                            std::initializer_list<int64_t> values) const {
  SLUICE_RETURN_IF_ERROR(SaveValues(state, values));
  state->add_names(open_file);
  for (const std::string& f : pending_) state->add_names(f);
  return files_->SaveState(state->add_inputs());
}

absl::Status FileReaderIterator::RestoreReader(const proto::IteratorState& state,
                                               std::string* open_file,
                                               std::initializer_list<int64_t*> values) {
  SLUICE_RETURN_IF_ERROR(RestoreValues(state, values, 1));
  if (state.names_size() < 1) return CorruptCheckpoint(absl::StrCat(state.op(), " saved no file"));
  *open_file = state.names(0);
  pending_.assign(state.names().begin() + 1, state.names().end());
  return files_->RestoreState(state.inputs(0));
}

absl::StatusOr<std::optional<std::string>> FileReaderIterator::NextFile(absl::string_view op) {
  while (pending_.empty()) {
    SLUICE_ASSIGN_OR_RETURN(auto e, files_->Next());
    if (!e) return std::optional<std::string>();
    if (e->size() != 1 || (*e)[0].dtype() != DType::kString || (*e)[0].shape().rank() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": filenames must be string scalars or vectors; got ",
                       ElementDebugString(*e)));
    }
    const Tensor& t = (*e)[0];
    for (int64_t i = 0; i < t.num_elements(); ++i) pending_.emplace_back(t.str(i));
  }
  std::string f = std::move(pending_.front());
  pending_.pop_front();
  return std::optional<std::string>(std::move(f));
}

}  // namespace sluice::internal
