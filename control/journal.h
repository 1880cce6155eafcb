// The dispatcher journal: an append-only log of opaque records in
// `<dir>/journal`. Each record will be one serialized state change (an
// `Update`); this layer neither knows nor checks what a record holds.
//
// File format (all integers little-endian)
//
//   offset        size  field
//   ------------  ----  -----------------------------------------------------
//   0             8     magic "SLUICEJN"
//   8             4     u32 version = 1
//   12            ...   records, back to back, each:
//     +0          4       u32 length N of the payload (N <= kMaxRecordBytes)
//     +4          4       u32 masked CRC32C of the payload
//                         (crc32c::Mask(crc32c::Value(payload)), as TFRecord)
//     +8          N       payload
//
// The file holds nothing else: the end of the last record is the end of the
// file. Masking keeps an all-zero region (what a file system may leave after
// a crash) from reading as a valid empty record.
//
// Recovery
//   A crash can leave a torn tail: a partial file header, record header or
//   payload at end of file. Media or software faults can leave a corrupt
//   record: a CRC mismatch or a length above kMaxRecordBytes. Either ends the
//   valid prefix: the records before it are the journal, and the file is
//   truncated (ftruncate) to that prefix so later appends follow the last
//   valid record. A warning names the file, the offset and the reason. A
//   record is never returned unless its CRC matches, so a corrupt record is
//   never misread as valid; the bytes after it are dropped even if they hold
//   valid records, because a journal is a sequence of state changes and
//   applying a later change without an earlier one is wrong.
//   A file whose first bytes are not a prefix of the file header (another
//   file, or a journal of a version this build does not read) is an error,
//   not a torn tail: it is left untouched.
//
// Concurrency: one JournalWriter per journal at a time; Open takes an
// exclusive advisory lock (flock) on the file, held until the writer is
// destroyed; ReadJournal holds it while it recovers, and fails while a
// writer (or another ReadJournal) holds it. A JournalWriter
// is not thread-safe: callers serialize Append (the dispatcher appends
// under its state mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::internal {

inline constexpr std::string_view kJournalMagic = "SLUICEJN";
inline constexpr uint32_t kJournalVersion = 1;
inline constexpr size_t kJournalHeaderBytes = 12;      // magic + version
inline constexpr size_t kJournalRecordHeaderBytes = 8;  // length + masked CRC
inline constexpr uint32_t kMaxRecordBytes = 64u << 20;  // 64 MiB
inline constexpr std::string_view kJournalFileName = "journal";

// When Append makes a record durable.
enum class FsyncPolicy : uint8_t {
  kEveryRecord,  // fdatasync before Append returns (the dispatcher's default)
  kNone,         // leave it to the OS (tests; a crash may lose recent records)
};

// The result of scanning journal bytes.
struct ParsedJournal {
  std::vector<std::string> records;  // the valid records, in order
  // Length of the valid prefix: the file header plus every valid record.
  // 0 when the input is empty or only a torn file header.
  uint64_t valid_bytes = 0;
  // Why the bytes from valid_bytes on were rejected; empty when none were.
  std::string tail_problem;
};

// Scans `bytes` (the contents of a journal file) without touching any file.
// Never fails on a torn or corrupt tail (see Recovery above); fails with
// FailedPrecondition when the bytes do not start with a prefix of the
// version-1 file header.
absl::StatusOr<ParsedJournal> ParseJournal(std::string_view bytes);

// Reads the records of `dir`/journal, in order, recovering it first: a bad
// tail is truncated away and logged (see Recovery). A missing directory or
// file is an empty journal (nothing is created). Errors name the path:
// FailedPrecondition for a file that is not a journal or is locked, the
// errno's code for I/O failures. The whole file is read into memory.
absl::StatusOr<std::vector<std::string>> ReadJournal(const std::string& dir);

// Appends records to `dir`/journal.
class JournalWriter final {
 public:
  // Opens `dir`/journal for appending, creating `dir` and the file (with its
  // header) when missing. An existing journal is recovered first as by
  // ReadJournal, so appends continue after its valid prefix.
  static absl::StatusOr<std::unique_ptr<JournalWriter>> Open(
      const std::string& dir, FsyncPolicy policy = FsyncPolicy::kEveryRecord);

  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // Appends one framed record; under kEveryRecord it is on stable storage
  // when this returns OK. A record above kMaxRecordBytes is InvalidArgument
  // and writes nothing. On an I/O failure the file is cut back to the last
  // whole record when possible; if that or a sync fails, the journal's state
  // on disk is unknown and every later Append fails (FailedPrecondition) —
  // reopen the journal, which recovers its valid prefix.
  absl::Status Append(std::string_view record);
  // Appends `records` in order with one write and (kEveryRecord) one
  // fdatasync: group commit. All or none: a record above kMaxRecordBytes
  // is InvalidArgument and writes nothing; an I/O failure cuts the file back
  // to where the batch began (as Append).
  absl::Status AppendBatch(const std::vector<std::string>& records);

  // Compaction: replaces the journal by one holding just `records`. They
  // are written to `<dir>/journal.compact`, synced, locked and renamed over
  // the journal (then the directory is synced), so a crash at any point
  // leaves either the old journal or the new one, whole. On failure the old
  // journal stays in use.
  absl::Status Rewrite(const std::vector<std::string>& records);
  // Rewrite in two steps, so that appends go on meanwhile (group commit
  // keeps answering while a large snapshot is written):
  // WriteCompacted writes and syncs `<dir>/journal.compact` and may run on
  // another thread concurrently with AppendBatch (it touches neither the
  // journal file nor its size; it must not run concurrently with itself or
  // InstallCompacted). InstallCompacted, not concurrent with AppendBatch,
  // appends `tail` (the records appended to the journal since the snapshot
  // was taken) to it, syncs it and renames it over the journal. Either
  // failing leaves the old journal in use (and the compacted file removed).
  absl::Status WriteCompacted(const std::vector<std::string>& records);
  absl::Status InstallCompacted(const std::vector<std::string>& tail);

  const std::string& path() const { return path_; }
  // Bytes in the file: its header and every record.
  uint64_t size() const { return size_; }
  // fdatasync calls on the journal file so far (appends and rewrites).
  int64_t syncs() const { return syncs_.load(); }
  // Tests: AppendBatch calls the hook just before its write and between
  // its write and its sync, to crash the process there.
  enum class Stage : uint8_t { kBeforeWrite, kBeforeSync };
  void SetFaultHookForTesting(std::function<void(Stage)> hook) { fault_hook_ = std::move(hook); }

 private:
  JournalWriter(std::string dir, std::string path, int fd, uint64_t size, FsyncPolicy policy);

  const std::string dir_;
  const std::string path_;
  int fd_;  // owned; holds the flock
  const FsyncPolicy policy_;
  // INVARIANT while broken_ is OK: the file ends at size_, after the last
  // whole record.
  uint64_t size_;
  absl::Status broken_;  // not OK once the file's contents are unknown
  std::atomic<int64_t> syncs_{0};
  // The compacted file WriteCompacted made, until InstallCompacted (-1: none).
  int compact_fd_ = -1;
  uint64_t compact_size_ = 0;
  void DropCompacted();
  std::function<void(Stage)> fault_hook_;
};

}  // namespace sluice::internal
