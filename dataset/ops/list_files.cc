// ListFiles(pattern, recursive): the matching files, sorted, as string
// scalars; a split source (runs of files per split) and what FILE sharding
// shards.
#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {

namespace {

// The regular files (or links to them) under `dir`, at any depth.
absl::Status WalkFiles(const std::string& dir, std::vector<std::string>* files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) files->push_back(it->path().string());
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("ListFiles: cannot walk '", dir, "': ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> GlobFiles(const std::string& pattern, bool recursive) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  absl::Status walked;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc && walked.ok(); ++i) {
      std::error_code ec;
      if (recursive && std::filesystem::is_directory(g.gl_pathv[i], ec)) {
        walked = WalkFiles(g.gl_pathv[i], &files);
      } else {
        files.push_back(g.gl_pathv[i]);
      }
    }
  }
  globfree(&g);
  SLUICE_RETURN_IF_ERROR(walked);
  if (recursive) std::sort(files.begin(), files.end());
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::NotFoundError(absl::StrCat("ListFiles: no files match '", pattern, "'"));
  }
  if (rc != 0) return absl::UnavailableError(absl::StrCat("ListFiles: cannot read '", pattern, "'"));
  return files;
}

namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  if (a.node->list_files().pattern().empty()) return Invalid("ListFiles", "empty pattern");
  a.spec.components = {ScalarSpec(DType::kString)};
  a.cardinality = kUnknownCardinality;
  return absl::OkStatus();
}

// Globs when first pulled, so a missing file is an iteration error.
class ListFilesIterator : public NodeIterator {
 public:
  using NodeIterator::NodeIterator;
  Result Next() override {
    if (!listed_) {
      listed_ = true;
      SLUICE_ASSIGN_OR_RETURN(files_, GlobFiles(node().list_files().pattern(),
                                                node().list_files().recursive()));
    }
    if (i_ >= files_.size()) return End();
    key_ = SourceKey(0, static_cast<int64_t>(i_));
    return Some({Tensor::String(files_[i_++])});
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  // The position in the sorted list; the files are listed again on restore
  // (a file added or removed since moves what follows).
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveValues(state, {static_cast<int64_t>(i_)});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    int64_t i = 0;
    SLUICE_RETURN_IF_ERROR(RestoreValues(state, {&i}));
    if (i < 0) return CorruptCheckpoint("a negative ListFiles position");
    i_ = static_cast<size_t>(i);
    return absl::OkStatus();
  }

 private:
  bool listed_ = false;
  std::vector<std::string> files_;
  size_t i_ = 0;
  std::optional<uint64_t> key_;
};

// A split is a run of files (DispatcherConfig::file_split_files); it
// carries their names.
absl::StatusOr<SplitPositions> Positions(const proto::DatasetNode& node) {
  SplitPositions p;
  SLUICE_ASSIGN_OR_RETURN(p.files,
                          GlobFiles(node.list_files().pattern(), node.list_files().recursive()));
  p.positions = static_cast<int64_t>(p.files.size());
  return p;
}

absl::StatusOr<Element> ElementAt(const Analysis&, const Split& split, int64_t pos) {
  const int64_t i = pos - split.begin;
  if (i < 0 || i >= static_cast<int64_t>(split.files.size())) {
    return absl::OutOfRangeError(absl::StrCat("split ", split.id, " names file position ", pos,
                                              " but carries ", split.files.size(),
                                              " file(s) from position ", split.begin));
  }
  return Element{Tensor::String(split.files[static_cast<size_t>(i)])};
}

absl::StatusOr<int64_t> KnownFiles(const proto::DatasetNode& node) {
  SLUICE_ASSIGN_OR_RETURN(SplitPositions p, Positions(node));
  return p.positions;
}

const SplitSourceTraits kSplits = {.positions = &Positions, .element_at = &ElementAt};

}  // namespace

extern const OpDef kListFilesOp = {
    .name = "ListFiles",
    .analyze = &Analyze,
    .make_iterator = &MakeSourceIterator<ListFilesIterator>,
    .split_source = &kSplits,
    .file_sharding = FileSharding::kListsFiles,
    .known_files = &KnownFiles,
};

}  // namespace sluice::internal
