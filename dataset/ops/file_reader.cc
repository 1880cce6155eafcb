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
  state->add_values(static_cast<int64_t>(file_key_));
  state->add_values(index_);
  state->add_names(open_file);
  for (const Named& n : pending_) {
    state->add_names(n.file);
    state->add_values(static_cast<int64_t>(n.key));
  }
  return files_->SaveState(state->add_inputs());
}

absl::Status FileReaderIterator::RestoreReader(const proto::IteratorState& state,
                                               std::string* open_file,
                                               std::initializer_list<int64_t*> values) {
  if (state.names_size() < 1) return CorruptCheckpoint(absl::StrCat(state.op(), " saved no file"));
  const int n = static_cast<int>(values.size());
  const int pending = state.names_size() - 1;
  SLUICE_RETURN_IF_ERROR(CheckState(state, n + 2 + pending, 1));
  int i = 0;
  for (int64_t* v : values) *v = state.values(i++);
  file_key_ = static_cast<uint64_t>(state.values(n));
  index_ = state.values(n + 1);
  if (index_ < 0) return CorruptCheckpoint(absl::StrCat(state.op(), " saved a negative index"));
  *open_file = state.names(0);
  pending_.clear();
  for (int j = 0; j < pending; ++j) {
    pending_.push_back({state.names(j + 1), static_cast<uint64_t>(state.values(n + 2 + j))});
  }
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
    const std::optional<uint64_t> key = files_->ElementKey();
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      std::string f(t.str(i));
      uint64_t k = 0;
      if (!key) {
        k = Fnv1a64(f.data(), f.size());
      } else {
        k = t.shape().rank() == 0 ? *key : Mix(*key, static_cast<uint64_t>(i));
      }
      pending_.push_back({std::move(f), k});
    }
  }
  Named n = std::move(pending_.front());
  pending_.pop_front();
  file_key_ = n.key;
  index_ = 0;
  return std::optional<std::string>(std::move(n.file));
}

}  // namespace sluice::internal
