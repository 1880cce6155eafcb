#include "sluice/dataset/webdataset.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sluice/core/status.h"

namespace sluice {
namespace {

constexpr char kKeyField[] = "__key__";
// Read-ahead of the archive: large enough that a sample is a few reads.
constexpr size_t kBlockBytes = size_t{1} << 20;
// A member's declared size is believed up to this much at once: a corrupt
// header cannot make the reader allocate more than the data it really has
// plus this.
constexpr size_t kMaxUpfrontBytes = size_t{64} << 20;

}  // namespace

absl::StatusOr<std::vector<WebDatasetFieldSpec>> ParseWebDatasetFields(
    const std::vector<std::string>& fields) {
  if (fields.empty()) {
    return absl::InvalidArgumentError("WebDataset: name at least one field (\"jpg\", \"cls\")");
  }
  std::vector<WebDatasetFieldSpec> out;
  std::vector<std::string> seen;  // lower case, as members' fields compare
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string f = absl::AsciiStrToLower(fields[i]);
    if (std::find(seen.begin(), seen.end(), f) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat("WebDataset: field '", fields[i],
                                                     "' is named twice"));
    }
    WebDatasetFieldSpec spec;
    if (f == kKeyField) {
      spec.key = true;
    } else {
      for (absl::string_view alt : absl::StrSplit(f, ';')) {
        if (alt.empty() || alt.front() == '.' || alt.find('/') != absl::string_view::npos) {
          return absl::InvalidArgumentError(absl::StrCat(
              "WebDataset: field '", fields[i],
              "' is not an extension (\"jpg\"), alternatives (\"jpg;png\") or \"__key__\""));
        }
        spec.alternatives.emplace_back(alt);
      }
    }
    out.push_back(std::move(spec));
    seen.push_back(f);
  }
  return out;
}

WebDatasetShardReader::WebDatasetShardReader(std::string path,
                                             std::vector<WebDatasetFieldSpec> fields,
                                             bool skip_incomplete, archive* a)
    : path_(std::move(path)), fields_(std::move(fields)), skip_incomplete_(skip_incomplete),
      a_(a) {}

WebDatasetShardReader::~WebDatasetShardReader() { archive_read_free(a_); }

absl::StatusOr<std::unique_ptr<WebDatasetShardReader>> WebDatasetShardReader::Open(
    const std::string& path, std::vector<WebDatasetFieldSpec> fields, bool skip_incomplete) {
  archive* a = archive_read_new();
  if (a == nullptr) return absl::ResourceExhaustedError("WebDataset: cannot allocate a reader");
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  archive_read_support_format_empty(a);  // a shard of no samples
  if (archive_read_open_filename(a, path.c_str(), kBlockBytes) != ARCHIVE_OK) {
    // Opening detects the compression and the format: bytes that are no
    // tar are the shard's fault, a file that cannot be read is not.
    const int err = archive_errno(a);
    const char* msg = archive_error_string(a);
    absl::Status s;
    if (err == ENOENT) {
      s = absl::NotFoundError(absl::StrCat("WebDataset: no such shard '", path, "'"));
    } else if (err <= 0 || err == EILSEQ) {  // libarchive's own: a format error
      s = absl::DataLossError(absl::StrCat("WebDataset: shard '", path,
                                           "' is truncated or corrupt at byte offset 0 (not a "
                                           "tar archive): ",
                                           msg ? msg : "unknown error"));
    } else {
      s = absl::UnavailableError(
          absl::StrCat("WebDataset: cannot open shard '", path, "': ", msg ? msg : "?"));
    }
    archive_read_free(a);
    return s;
  }
  return std::unique_ptr<WebDatasetShardReader>(
      new WebDatasetShardReader(path, std::move(fields), skip_incomplete, a));
}

absl::Status WebDatasetShardReader::ArchiveError(const char* what) {
  done_ = true;
  const char* msg = archive_error_string(a_);
  return absl::DataLossError(absl::StrCat(
      "WebDataset: shard '", path_, "' is truncated or corrupt at byte offset ",
      archive_filter_bytes(a_, 0), " (", what, "): ", msg ? msg : "unknown error"));
}

absl::StatusOr<bool> WebDatasetShardReader::ReadMember() {
  while (true) {
    archive_entry* e = nullptr;
    const int r = archive_read_next_header(a_, &e);
    if (r == ARCHIVE_EOF) return false;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ArchiveError("reading a member's header");
    if (archive_entry_filetype(e) != AE_IFREG) continue;
    const char* p = archive_entry_pathname(e);
    if (p == nullptr) continue;
    absl::string_view path(p);
    while (absl::ConsumePrefix(&path, "./")) {
    }
    const size_t slash = path.rfind('/');
    const size_t base_at = slash == absl::string_view::npos ? 0 : slash + 1;
    const absl::string_view base = path.substr(base_at);
    if (slash == absl::string_view::npos && absl::StartsWith(base, "__") &&
        absl::EndsWith(base, "__")) {
      continue;  // top-level metadata, as the webdataset library passes over
    }
    const size_t dot = base.find('.');
    if (dot == absl::string_view::npos || dot == 0) continue;  // no key or no field
    Member m;
    m.key = std::string(path.substr(0, base_at + dot));
    m.field = absl::AsciiStrToLower(base.substr(dot + 1));
    m.offset = archive_read_header_position(a_);
    m.size = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;
    pending_ = std::move(m);
    return true;
  }
}

absl::Status WebDatasetShardReader::ReadData(int64_t declared, std::string* out) {
  // Sized to the declared size (at most kMaxUpfrontBytes at first); grown
  // only if the member really holds more, which a probe read tells without
  // growing the buffer at the end of a member of the declared size.
  out->assign(declared > 0 ? std::min(static_cast<size_t>(declared), kMaxUpfrontBytes)
                           : size_t{1} << 16,
              '\0');
  size_t have = 0;
  while (true) {
    if (have == out->size()) {
      char probe[4096];
      const la_ssize_t n = archive_read_data(a_, probe, sizeof(probe));
      if (n < 0) return ArchiveError("reading a member's data");
      if (n == 0) break;
      out->resize(std::max(have * 2, have + static_cast<size_t>(n)));
      std::memcpy(out->data() + have, probe, static_cast<size_t>(n));
      have += static_cast<size_t>(n);
      continue;
    }
    const la_ssize_t n = archive_read_data(a_, out->data() + have, out->size() - have);
    if (n < 0) return ArchiveError("reading a member's data");
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  out->resize(have);
  return absl::OkStatus();
}

absl::StatusOr<bool> WebDatasetShardReader::NextGroup(WebDatasetSample* sample, Group* g) {
  if (done_) return false;
  if (!pending_) {
    SLUICE_ASSIGN_OR_RETURN(bool more, ReadMember());
    if (!more) {
      done_ = true;
      return false;
    }
  }
  g->key = pending_->key;
  g->offset = pending_->offset;
  g->fields.clear();
  // rank[i]: which alternative of field i the sample gave (lower is
  // preferred); size() when none yet.
  std::vector<size_t> rank(fields_.size());
  for (size_t i = 0; i < fields_.size(); ++i) rank[i] = fields_[i].alternatives.size();
  while (pending_ && pending_->key == g->key) {
    const Member m = std::move(*pending_);
    pending_.reset();
    if (std::find(g->fields.begin(), g->fields.end(), m.field) != g->fields.end()) {
      done_ = true;
      return absl::InvalidArgumentError(absl::StrCat(
          "WebDataset: sample '", g->key, "' of shard '", path_, "' has two '", m.field,
          "' members (the second's header at byte offset ", m.offset, ")"));
    }
    g->fields.push_back(m.field);
    for (size_t i = 0; i < fields_.size(); ++i) {
      const auto& alts = fields_[i].alternatives;
      const size_t r = static_cast<size_t>(std::find(alts.begin(), alts.end(), m.field) -
                                           alts.begin());
      if (r >= rank[i]) continue;
      rank[i] = r;
      if (sample != nullptr) SLUICE_RETURN_IF_ERROR(ReadData(m.size, &sample->values[i]));
      break;  // a member is one field's (fields are distinct extensions)
    }
    SLUICE_ASSIGN_OR_RETURN(bool more, ReadMember());
    if (!more) done_ = true;
  }
  g->missing = -1;
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (fields_[i].key) {
      if (sample != nullptr) sample->values[i] = g->key;
    } else if (rank[i] == fields_[i].alternatives.size() && g->missing < 0) {
      g->missing = static_cast<int64_t>(i);
    }
  }
  if (sample != nullptr) sample->key = g->key;
  ++index_;
  return true;
}

absl::StatusOr<std::optional<WebDatasetSample>> WebDatasetShardReader::Next() {
  while (true) {
    WebDatasetSample s;
    s.values.resize(fields_.size());
    Group g;
    SLUICE_ASSIGN_OR_RETURN(bool got, NextGroup(&s, &g));
    if (!got) return std::optional<WebDatasetSample>();
    if (g.missing < 0) return std::optional<WebDatasetSample>(std::move(s));
    if (skip_incomplete_) continue;
    done_ = true;
    return absl::InvalidArgumentError(absl::StrCat(
        "WebDataset: sample '", g.key, "' of shard '", path_, "' (header at byte offset ",
        g.offset, ") has no '",
        absl::StrJoin(fields_[static_cast<size_t>(g.missing)].alternatives, "' or '"),
        "' member (it has: ", absl::StrJoin(g.fields, ", "),
        "); skip_incomplete passes over such samples"));
  }
}

absl::Status WebDatasetShardReader::Skip(int64_t n) {
  Group g;
  for (int64_t i = 0; i < n; ++i) {
    SLUICE_ASSIGN_OR_RETURN(bool got, NextGroup(nullptr, &g));
    if (!got) {
      return absl::InvalidArgumentError(absl::StrCat("WebDataset: shard '", path_, "' has ", index_,
                                                     " sample(s), fewer than ", n));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteWebDatasetShard(const std::string& path,
                                  const std::vector<std::pair<std::string, std::string>>& members) {
  archive* a = archive_write_new();
  if (a == nullptr) return absl::ResourceExhaustedError("cannot allocate a tar writer");
  auto fail = [&](absl::string_view what) {
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "cannot write tar shard '", path, "' (", what, "): ",
        archive_error_string(a) != nullptr ? archive_error_string(a) : std::strerror(errno)));
    archive_write_free(a);
    return s;
  };
  if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK) return fail("format");
  if (archive_write_open_filename(a, path.c_str()) != ARCHIVE_OK) return fail("open");
  archive_entry* e = archive_entry_new();
  for (const auto& [name, bytes] : members) {
    archive_entry_clear(e);
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(bytes.size()));
    archive_entry_set_mtime(e, 0, 0);
    if (archive_write_header(a, e) != ARCHIVE_OK ||
        archive_write_data(a, bytes.data(), bytes.size()) !=
            static_cast<la_ssize_t>(bytes.size())) {
      archive_entry_free(e);
      return fail(name);
    }
  }
  archive_entry_free(e);
  if (archive_write_close(a) != ARCHIVE_OK) return fail("close");
  archive_write_free(a);
  return absl::OkStatus();
}

}  // namespace sluice
