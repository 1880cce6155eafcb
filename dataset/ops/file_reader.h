// What the ops that read files named by their input (ReadRecords,
// ReadFixedLengthRecords) share (internal).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/dataset/ops/op.h"

namespace sluice::internal {

// The analysis every reader shares: the input must be file names (one
// string scalar or vector component, when known: else InvalidArgument
// naming `op`); the output is string scalars, how many unknown.
absl::Status AnalyzeReader(Analysis& a, absl::string_view op);

// OpDef::inputs / mutable_inputs of a reader whose message holds its input
// in `filenames`, given the message's accessor.
template <auto kMessage>
std::vector<const proto::DatasetNode*> FilenamesField(const proto::DatasetNode& node) {
  return {&(node.*kMessage)().filenames()};
}
template <auto kMutableMessage>
std::vector<proto::DatasetNode*> MutableFilenamesField(proto::DatasetNode* node) {
  return {(node->*kMutableMessage)()->mutable_filenames()};
}

// Base for file readers: pulls file names from the input iterator (string
// scalars or vectors), one at a time.
class FileReaderIterator : public NodeIterator {
 public:
  FileReaderIterator(AnalysisPtr a, std::unique_ptr<Iterator> files)
      : NodeIterator(std::move(a)), files_(std::move(files)) {}

 protected:
  // The next file name, nullopt when the input is exhausted.
  absl::StatusOr<std::optional<std::string>> NextFile(absl::string_view op);
  // Checkpoints: the file the reader has open (empty: none) with its
  // counters `values`, the files named but not opened yet, and the input;
  // restored into `open_file` and the variables `values` point to.
  absl::Status SaveReader(proto::IteratorState* state, const std::string& open_file,
                          std::initializer_list<int64_t> values) const;
  absl::Status RestoreReader(const proto::IteratorState& state, std::string* open_file,
                             std::initializer_list<int64_t*> values);

 private:
  std::unique_ptr<Iterator> files_;
  std::deque<std::string> pending_;
};

}  // namespace sluice::internal
