// Static sharding: rewrites a pipeline so that worker `index` of
// `num_shards` reads one shard of it (dataset_internal.h). What each op
// contributes (which input names files, shard hints) is declared in its
// OpDef (dataset/ops/).
#include "absl/strings/str_cat.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {

namespace {

using N = proto::DatasetNode;

// Whether some node under `n` (Interleave functions included) satisfies `pred`.
template <typename Pred>
bool Contains(const N& n, const Pred& pred) {
  if (pred(n)) return true;
  for (const N* in : InputsOf(n)) {
    if (Contains(*in, pred)) return true;
  }
  const OpDef* op = FindOp(n.op_case());
  return op != nullptr && op->function != nullptr && Contains(*op->function(n), pred);
}

FileSharding FileShardingOf(const N& n) {
  const OpDef* op = FindOp(n.op_case());
  return op == nullptr ? FileSharding::kNone : op->file_sharding;
}

bool IsReader(const N& n) { return FileShardingOf(n) == FileSharding::kReadsFiles; }

// Replaces `*n` by Shard(`*n`, num_shards, index).
void WrapInShard(N* n, int64_t num_shards, int64_t index) {
  N inner;
  inner.Swap(n);
  N::Shard* s = n->mutable_shard();
  s->mutable_input()->Swap(&inner);
  s->set_num_shards(num_shards);
  s->set_index(index);
}

// Number of files a file source yields, when known without reading them.
absl::StatusOr<int64_t> KnownFiles(const N& n) {
  const OpDef* op = FindOp(n.op_case());
  if (op == nullptr || op->known_files == nullptr) return kUnknownCardinality;
  return op->known_files(n);
}

// Finds the file sources under `n` (outside Interleave functions) and wraps
// each in a Shard.
absl::Status ShardFiles(N* n, int64_t num_shards, int64_t index, int* found) {
  auto shard_here = [&](N* source) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(int64_t files, KnownFiles(*source));
    if (files >= 0 && files < num_shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file sharding: the pipeline reads ", files, " file(s) for ", num_shards,
          " workers (the dispatcher's worker_addresses); every worker needs at least one file: "
          "use fewer workers or processing_mode=data"));
    }
    WrapInShard(source, num_shards, index);
    ++*found;
    return absl::OkStatus();
  };
  auto lists_files = [](const N& x) { return FileShardingOf(x) == FileSharding::kListsFiles; };
  const FileSharding role = FileShardingOf(*n);
  if (role == FileSharding::kListsFiles) return shard_here(n);
  if (role == FileSharding::kReadsFiles ||
      (role == FileSharding::kReadsFilesInFunction &&
       Contains(*FindOp(n->op_case())->function(*n), IsReader))) {
    N* files = MutableInputsOf(n)[0];
    // The file names come from a ListFiles further down: shard that one.
    if (!Contains(*files, lists_files)) return shard_here(files);
  }
  for (N* in : MutableInputsOf(n)) SLUICE_RETURN_IF_ERROR(ShardFiles(in, num_shards, index, found));
  return absl::OkStatus();
}

bool IsHint(const N& n) {
  const OpDef* op = FindOp(n.op_case());
  return op != nullptr && op->is_shard_hint != nullptr && op->is_shard_hint(n);
}

void FillHints(N* n, int64_t num_shards, int64_t index, int* found) {
  if (IsHint(*n)) {
    FindOp(n->op_case())->fill_shard_hint(n, num_shards, index);
    ++*found;
  }
  for (N* in : MutableInputsOf(n)) FillHints(in, num_shards, index, found);
  const OpDef* op = FindOp(n->op_case());
  if (op != nullptr && op->mutable_function != nullptr) {
    FillHints(op->mutable_function(n), num_shards, index, found);
  }
}

}  // namespace

bool ContainsShardHint(const proto::DatasetNode& root) { return Contains(root, IsHint); }

absl::StatusOr<proto::DatasetDef> ApplyStaticSharding(const proto::DatasetDef& def,
                                                      StaticSharding policy, int64_t num_shards,
                                                      int64_t index) {
  if (num_shards <= 0 || index < 0 || index >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("static sharding: shard ", index, " of ",
                                                   num_shards, " does not exist"));
  }
  proto::DatasetDef out = def;
  N* root = out.mutable_root();
  if (policy == StaticSharding::kHint) {
    int found = 0;
    FillHints(root, num_shards, index, &found);
    if (found == 0) {
      return absl::InvalidArgumentError(
          "processing_mode=hint: the pipeline has no Shard(kShardHint, kShardHint) to fill in");
    }
    return out;
  }
  if (ContainsShardHint(*root)) {
    return absl::InvalidArgumentError(
        "the pipeline has Shard(kShardHint, kShardHint), which only processing_mode=hint fills "
        "in");
  }
  if (policy == StaticSharding::kFile || policy == StaticSharding::kFileOrData) {
    int found = 0;
    SLUICE_RETURN_IF_ERROR(ShardFiles(root, num_shards, index, &found));
    if (found > 0) return out;
    if (policy == StaticSharding::kFile) {
      return absl::InvalidArgumentError(
          "processing_mode=file: the pipeline has no file source to shard (ListFiles, or file "
          "names read by ReadRecords/ReadFixedLengthRecords); use processing_mode=data");
    }
  }
  WrapInShard(root, num_shards, index);
  return out;
}

}  // namespace sluice::internal
