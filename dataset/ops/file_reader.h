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
// scalars or vectors), one at a time, and keys what it reads from them.
//
// Keys: the element at index i of a file is keyed Mix(file key, i), the
// file key being the input element's key (Mix(key, j) for the j-th name of
// a vector) or, when the input keeps none, a hash of the file's name. So a
// random op after the reader draws the same for the same record whatever
// the number of workers.
class FileReaderIterator : public NodeIterator {
 public:
  FileReaderIterator(AnalysisPtr a, std::unique_ptr<Iterator> files)
      : NodeIterator(std::move(a)), files_(std::move(files)) {}
  std::optional<uint64_t> ElementKey() const override { return key_; }

 protected:
  // The next file name, nullopt when the input is exhausted; the file it
  // names is the open one from now on (its index starts at 0).
  absl::StatusOr<std::optional<std::string>> NextFile(absl::string_view op);
  // The next element of the open file: keyed by its index there.
  Result Emit(Element e) {
    key_ = Mix(file_key_, static_cast<uint64_t>(index_++));
    return Some(std::move(e));
  }
  // Elements of the open file returned or passed over so far.
  int64_t index() const { return index_; }
  // Checkpoints: the file the reader has open (empty: none) with its
  // counters `values`, its key and index, the files named but not opened
  // yet with their keys, and the input; restored into `open_file` and the
  // variables `values` point to.
  absl::Status SaveReader(proto::IteratorState* state, const std::string& open_file,
                          std::initializer_list<int64_t> values) const;
  absl::Status RestoreReader(const proto::IteratorState& state, std::string* open_file,
                             std::initializer_list<int64_t*> values);

 private:
  struct Named {
    std::string file;
    uint64_t key;
  };
  std::unique_ptr<Iterator> files_;
  std::deque<Named> pending_;
  uint64_t file_key_ = 0;
  int64_t index_ = 0;
  std::optional<uint64_t> key_;
};

}  // namespace sluice::internal
