// Static sharding: rewrites a pipeline so that worker `index` of
// `num_shards` reads one shard of it (dataset_internal.h).
#include <glob.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"

namespace sluice::internal {

absl::StatusOr<std::vector<std::string>> GlobFiles(const std::string& pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::NotFoundError(absl::StrCat("ListFiles: no files match '", pattern, "'"));
  }
  if (rc != 0) return absl::UnavailableError(absl::StrCat("ListFiles: cannot read '", pattern, "'"));
  return files;
}

namespace {

using N = proto::DatasetNode;

// The input datasets of `n` (not Interleave's function).
std::vector<N*> MutableInputs(N& n) {
  switch (n.op_case()) {
    case N::kReadRecords: return {n.mutable_read_records()->mutable_filenames()};
    case N::kReadFixedLengthRecords:
      return {n.mutable_read_fixed_length_records()->mutable_filenames()};
    case N::kMap: return {n.mutable_map()->mutable_input()};
    case N::kFilter: return {n.mutable_filter()->mutable_input()};
    case N::kBatch: return {n.mutable_batch()->mutable_input()};
    case N::kUnbatch: return {n.mutable_unbatch()->mutable_input()};
    case N::kShuffle: return {n.mutable_shuffle()->mutable_input()};
    case N::kRepeat: return {n.mutable_repeat()->mutable_input()};
    case N::kTake: return {n.mutable_take()->mutable_input()};
    case N::kSkip: return {n.mutable_skip()->mutable_input()};
    case N::kShard: return {n.mutable_shard()->mutable_input()};
    case N::kPrefetch: return {n.mutable_prefetch()->mutable_input()};
    case N::kInterleave: return {n.mutable_interleave()->mutable_input()};
    case N::kEnumerate: return {n.mutable_enumerate()->mutable_input()};
    case N::kZip: {
      std::vector<N*> out;
      for (N& in : *n.mutable_zip()->mutable_inputs()) out.push_back(&in);
      return out;
    }
    default: return {};
  }
}

// Whether some node under `n` (Interleave functions included) satisfies `pred`.
template <typename Pred>
bool Contains(const N& n, const Pred& pred) {
  if (pred(n)) return true;
  // The mutable accessors of fields that are set return them unchanged:
  // nothing is written through `m`.
  N& m = const_cast<N&>(n);
  for (N* in : MutableInputs(m)) {
    if (Contains(*in, pred)) return true;
  }
  return n.op_case() == N::kInterleave && Contains(n.interleave().fn(), pred);
}

bool IsReader(const N& n) {
  return n.op_case() == N::kReadRecords || n.op_case() == N::kReadFixedLengthRecords;
}

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
  if (n.op_case() == N::kListFiles) {
    SLUICE_ASSIGN_OR_RETURN(auto files, GlobFiles(n.list_files().pattern()));
    return static_cast<int64_t>(files.size());
  }
  if (n.op_case() == N::kFromTensors) return n.from_tensors().elements_size();
  return kUnknownCardinality;
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
  auto has_list_files = [](const N& x) { return x.op_case() == N::kListFiles; };
  if (n->op_case() == N::kListFiles) return shard_here(n);
  if (IsReader(*n) || (n->op_case() == N::kInterleave &&
                       Contains(n->interleave().fn(), IsReader))) {
    N* files = MutableInputs(*n)[0];
    // The file names come from a ListFiles further down: shard that one.
    if (!Contains(*files, has_list_files)) return shard_here(files);
  }
  for (N* in : MutableInputs(*n)) SLUICE_RETURN_IF_ERROR(ShardFiles(in, num_shards, index, found));
  return absl::OkStatus();
}

bool IsHint(const N& n) {
  return n.op_case() == N::kShard && n.shard().num_shards() == kShardHint;
}

void FillHints(N* n, int64_t num_shards, int64_t index, int* found) {
  if (IsHint(*n)) {
    n->mutable_shard()->set_num_shards(num_shards);
    n->mutable_shard()->set_index(index);
    ++*found;
  }
  for (N* in : MutableInputs(*n)) FillHints(in, num_shards, index, found);
  if (n->op_case() == N::kInterleave) {
    FillHints(n->mutable_interleave()->mutable_fn(), num_shards, index, found);
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
