// WebDataset shards: POSIX tar files (optionally gzip/zstd/... compressed)
// whose consecutive members sharing a key form one sample, as the
// webdataset library and LAION-style corpora write them:
//
//   000000.jpg  000000.cls  000001.jpg  000001.cls  ...
//
// A member's key is its path up to the first '.' of its base name, its
// field the rest after that '.', compared in lower case ("a/b.seg.PNG":
// key "a/b", field "seg.png"). Members that are not regular files, have no
// '.' in their base name, or are top-level "__name__" metadata are passed
// over. Read with libarchive, streaming: nothing but the requested fields of
// the current sample is held in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

struct archive;

namespace sluice {

// A requested field: one extension ("jpg"), alternatives taken in order
// ("jpg;jpeg;png": the first the sample has), or "__key__" (the sample's
// key as bytes).
struct WebDatasetFieldSpec {
  std::vector<std::string> alternatives;  // lower case
  bool key = false;                       // "__key__"
};
// Parses the requested fields; InvalidArgument for none, an empty one or a
// field named twice.
absl::StatusOr<std::vector<WebDatasetFieldSpec>> ParseWebDatasetFields(
    const std::vector<std::string>& fields);

struct WebDatasetSample {
  std::string key;
  std::vector<std::string> values;  // one per requested field, in order
};

class WebDatasetShardReader {
 public:
  // NotFound when `path` does not exist; Unavailable when it cannot be read.
  static absl::StatusOr<std::unique_ptr<WebDatasetShardReader>> Open(
      const std::string& path, std::vector<WebDatasetFieldSpec> fields, bool skip_incomplete);
  ~WebDatasetShardReader();
  WebDatasetShardReader(const WebDatasetShardReader&) = delete;
  WebDatasetShardReader& operator=(const WebDatasetShardReader&) = delete;

  // The next sample, nullopt at the end of the shard. Errors name the shard
  // and the byte offset: DataLoss for a truncated or corrupt archive;
  // InvalidArgument for a sample without a requested field (unless
  // skip_incomplete: it is passed over) or with two members of one field.
  absl::StatusOr<std::optional<WebDatasetSample>> Next();
  // Passes over `n` samples without reading their data (restoring a
  // checkpoint); the same errors as Next() but for missing fields.
  absl::Status Skip(int64_t n);
  // Samples read or passed over so far, incomplete ones included: the
  // index of the next sample in the shard.
  int64_t index() const { return index_; }
  const std::string& path() const { return path_; }

 private:
  struct Member {
    std::string key, field;
    int64_t offset = 0;  // of its header in the (uncompressed) stream
    int64_t size = -1;   // declared; -1 when not
  };
  // What one sample had (for errors).
  struct Group {
    std::string key;
    int64_t offset = 0;
    std::vector<std::string> fields;  // its members' fields
    int64_t missing = -1;             // the first requested field it lacks
  };
  WebDatasetShardReader(std::string path, std::vector<WebDatasetFieldSpec> fields,
                        bool skip_incomplete, archive* a);
  // The next member worth looking at into pending_, or false at the end.
  absl::StatusOr<bool> ReadMember();
  // One group of members sharing a key; values read when `sample` is set.
  absl::StatusOr<bool> NextGroup(WebDatasetSample* sample, Group* g);
  absl::Status ReadData(int64_t declared, std::string* out);
  absl::Status ArchiveError(const char* what);

  std::string path_;
  std::vector<WebDatasetFieldSpec> fields_;
  bool skip_incomplete_;
  archive* a_;
  std::optional<Member> pending_;  // header read, data not yet
  bool done_ = false;
  int64_t index_ = 0;
};

// Writes a tar shard (pax restricted: plain ustar unless a name is too
// long), members in order as (path in the archive, bytes), with fixed
// modes and times so the same members give the same bytes. Replaces `path`.
absl::Status WriteWebDatasetShard(const std::string& path,
                                  const std::vector<std::pair<std::string, std::string>>& members);

}  // namespace sluice
