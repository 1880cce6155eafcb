// The list of dataset ops (op.h): one line per op.
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {

// X(oneof case, Name): the op whose file dataset/ops/<name>.cc defines
// `extern const OpDef k<Name>Op`.
#define SLUICE_DATASET_OPS(X)                          \
  X(kRange, Range)                                     \
  X(kFromTensors, FromTensors)                         \
  X(kListFiles, ListFiles)                             \
  X(kPlaceholder, Placeholder)                         \
  X(kReadRecords, ReadRecords)                         \
  X(kReadFixedLengthRecords, ReadFixedLengthRecords)   \
  X(kWebDataset, WebDataset)                           \
  X(kMap, Map)                                         \
  X(kFilter, Filter)                                   \
  X(kBatch, Batch)                                     \
  X(kUnbatch, Unbatch)                                 \
  X(kShuffle, Shuffle)                                 \
  X(kRepeat, Repeat)                                   \
  X(kTake, Take)                                       \
  X(kSkip, Skip)                                       \
  X(kShard, Shard)                                     \
  X(kPrefetch, Prefetch)                               \
  X(kInterleave, Interleave)                           \
  X(kEnumerate, Enumerate)                             \
  X(kZip, Zip)                                         \
  X(kDataService, DataService)

#define SLUICE_DECLARE_OP_(op_case, name) extern const OpDef k##name##Op;
SLUICE_DATASET_OPS(SLUICE_DECLARE_OP_)
#undef SLUICE_DECLARE_OP_

const OpDef* FindOp(proto::DatasetNode::OpCase op_case) {
  switch (op_case) {
#define SLUICE_OP_CASE_(op_case, name) \
  case proto::DatasetNode::op_case:    \
    return &k##name##Op;
    SLUICE_DATASET_OPS(SLUICE_OP_CASE_)
#undef SLUICE_OP_CASE_
    case proto::DatasetNode::OP_NOT_SET:
      break;
  }
  return nullptr;
}

std::vector<const proto::DatasetNode*> InputsOf(const proto::DatasetNode& node) {
  const OpDef* op = FindOp(node.op_case());
  if (op == nullptr || op->inputs == nullptr) return {};
  return op->inputs(node);
}

std::vector<proto::DatasetNode*> MutableInputsOf(proto::DatasetNode* node) {
  const OpDef* op = FindOp(node->op_case());
  if (op == nullptr || op->mutable_inputs == nullptr) return {};
  return op->mutable_inputs(node);
}

absl::Status Invalid(absl::string_view op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", msg));
}

absl::Status CheckParallelCalls(absl::string_view op, int64_t num_parallel_calls) {
  if (num_parallel_calls == kAutotune ||
      (num_parallel_calls >= 0 && num_parallel_calls <= kMaxParallelCalls)) {
    return absl::OkStatus();
  }
  return Invalid(op, absl::StrCat("num_parallel_calls must be in [1, ", kMaxParallelCalls,
                                  "] or kAutotune; got ", num_parallel_calls));
}

absl::StatusOr<const Analysis*> FirstInput(const Analysis& a, absl::string_view op) {
  if (a.inputs.empty()) return Invalid(op, "missing input dataset");
  return a.inputs[0].get();
}

}  // namespace sluice::internal
