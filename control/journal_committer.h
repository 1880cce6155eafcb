// JournalCommitter: the dispatcher journal's group commit and compaction
// (fault_tolerant_mode). Internal to control/.
//
// Group commit, as LevelDB's DBImpl::Write: every state change is applied
// under the dispatcher's mutex and its record queued here (Queue).
// AwaitDurable returns once every record queued so far is durable: the
// first caller that finds records queued and no write running becomes the
// writer (Write) and writes the whole queue with one write and one
// fdatasync, with the mutex released, while the others wait for it. So no
// reply reveals a change that a crash can lose, and concurrent changes
// share one fsync. A failed write is sticky (error()): the state in memory
// is then ahead of the journal, so every later change and reply fails
// (Unavailable) until the dispatcher is restarted and replays its journal.
//
// Compaction: once the journal holds min_records records, and four times
// the records and the bytes of the last snapshot, the writer captures the
// state (the SnapshotFn, under the mutex) and a thread of its own builds
// the snapshot's records from the capture and writes them beside the
// journal while appends go on; then the
// records appended meanwhile follow it, it is synced and renamed over the
// journal (JournalWriter::WriteCompacted / InstallCompacted).
//
// Locking, as LevelDB's VersionSet::LogAndApply: the committer has no mutex
// of its own. The dispatcher holds it as a member guarded by its mutex, so
// every call is made holding that mutex; the calls that write take the
// mutex as `mu` and release it while they write, and the compaction thread
// takes it. Every member is guarded by that mutex, except that the writer
// of the moment (writing_) uses journal_ without it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/synchronization/mutex.h"
#include "control/journal.pb.h"
#include "sluice/control/journal.h"

namespace sluice::internal {

class JournalCommitter {
 public:
  // The state as records that rebuild it from nothing, in two steps: the
  // SnapshotFn is called holding the mutex and captures the state; what it
  // returns makes the records without the mutex (on the compaction
  // thread), from the capture alone.
  using BuildRecordsFn = std::function<std::vector<proto::JournalRecord>()>;
  using SnapshotFn = std::function<BuildRecordsFn()>;
  // Called holding the mutex whenever a write or a compaction ends (so
  // that replies waiting elsewhere than in AwaitDurable may go out).
  using WrittenFn = std::function<void()>;
  JournalCommitter(SnapshotFn snapshot, WrittenFn written);
  // Joins the compaction thread, which takes the mutex: call without it.
  ~JournalCommitter();
  JournalCommitter(const JournalCommitter&) = delete;
  JournalCommitter& operator=(const JournalCommitter&) = delete;

  // The default of SetCompactionMinRecords.
  static constexpr int64_t kCompactionMinRecords = 10000;

  // Applies `records` (read from `dir`'s journal: ReadJournal) in order,
  // each update with `apply`. DataLoss naming the record that does not
  // parse or apply.
  static absl::Status Replay(const std::string& dir, const std::vector<std::string>& records,
                             const std::function<absl::Status(const proto::JournalUpdate&)>& apply);
  // Opens `dir`/journal for appending after `replayed` records were read
  // back from it, and compacts it now when they are enough.
  absl::Status Open(const std::string& dir, FsyncPolicy policy, int64_t replayed);
  bool is_open() const { return journal_ != nullptr; }
  const std::string& path() const { return journal_->path(); }

  // `rec` serialized, to Queue once applied: the sticky error once a write
  // failed, Unavailable when it exceeds kMaxRecordBytes. Call only when
  // is_open().
  absl::StatusOr<std::string> Encode(const proto::JournalRecord& rec) const;
  // A record whose change was applied: written by the next group commit.
  void Queue(std::string record);

  // Records queued since Open.
  int64_t applied() const { return applied_; }
  // Whether the first `target` records are written and synced (or no
  // journal is open).
  bool Durable(int64_t target) const { return !is_open() || target <= durable_; }
  // Not OK once a write failed.
  const absl::Status& error() const { return error_; }
  // Whether a reply now would reveal a change not yet durable.
  bool Behind() const { return is_open() && (durable_ < applied_ || !error_.ok()); }
  // Whether a caller waiting for `target` should become the writer now.
  bool NeedsWriter(int64_t target) const {
    return is_open() && error_.ok() && !writing_ && durable_ < target;
  }

  // `reply` once every record queued so far is durable (writing them, or
  // waiting for the writer of the moment), or the sticky error. Releases
  // `mu` while it writes or waits.
  absl::Status AwaitDurable(absl::Mutex& mu, absl::Status reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Replies of callers that hold no thread (the dispatcher's parked long
  // polls): `done(status)` runs once every record queued so far is durable,
  // or with the sticky error, from SendReplies.
  using Done = std::function<void(absl::Status)>;
  void QueueReply(Done done, absl::Status status);
  bool replies_pending() const { return !replies_.empty(); }
  // Writes what the queued replies wait for (unless a write runs: its end
  // calls the WrittenFn), then sends the replies now durable (every one,
  // failing, once a write failed), in order, with `mu` released. True when
  // it did either.
  bool SendReplies(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Takes the whole queue (and, when the journal has grown enough, starts
  // a compaction), writes and syncs it with `mu` released, then marks it
  // durable and wakes the waiters. Call only when NeedsWriter.
  void Write(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Compaction now: waits for a running write or compaction, then rewrites
  // the journal as a snapshot, holding `mu` throughout.
  absl::Status Compact(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits until no write and no background compaction runs.
  void AwaitIdle(absl::Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SetCompactionMinRecords(int64_t min_records);
  // Tests: see JournalWriter::SetFaultHookForTesting. Waits for a running
  // write. Call after Open.
  void SetFaultHookForTesting(absl::Mutex& mu, std::function<void(JournalWriter::Stage)> hook)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  struct Counters {
    int64_t records = 0;      // queued since start
    int64_t compactions = 0;
    int64_t syncs = 0;        // fdatasync calls (one per group commit)
  };
  const Counters& counters() const { return counters_; }

 private:
  // Builds the snapshot's records (`build`) and writes them as the
  // compacted journal while appends go on, then installs it with the
  // records appended meanwhile (compact_thread_).
  void CompactInBackground(absl::Mutex& mu, BuildRecordsFn build,
                           uint64_t bytes_before) ABSL_LOCKS_EXCLUDED(mu);
  // With no write running: the snapshot replaces the journal and the queue.
  absl::Status CompactNow();
  // Bookkeeping after `snapshot` replaced a journal of `bytes_before` bytes.
  void Compacted(const std::vector<std::string>& snapshot, uint64_t bytes_before);

  const SnapshotFn snapshot_;
  const WrittenFn written_;
  // Set once, by Open; written by the one writer of the moment (writing_)
  // without the mutex.
  std::unique_ptr<JournalWriter> journal_;
  std::vector<std::string> queue_;  // applied, not yet written
  int64_t applied_ = 0;             // records queued since start
  int64_t durable_ = 0;             // ... of them written and synced
  bool writing_ = false;
  absl::Status error_;  // sticky: see AwaitDurable
  absl::CondVar cv_;    // a write finished
  bool compacting_ = false;           // compact_thread_ is writing a snapshot
  int64_t compact_upto_ = 0;          // the records the snapshot holds
  std::vector<std::string> retained_;  // written since the snapshot
  std::thread compact_thread_;
  int64_t min_records_ = kCompactionMinRecords;
  int64_t records_in_journal_ = 0;
  // How the compaction under way went (logged when it ends).
  struct CompactionTiming {
    absl::Duration snapshot_under_lock, build, write, install;
    int64_t tail_records = 0;
  };
  CompactionTiming timing_;
  int64_t records_in_last_snapshot_ = 0;
  uint64_t bytes_in_last_snapshot_ = 0;
  Counters counters_;
  struct PendingReply {
    int64_t target = 0;  // the records applied before it
    Done done;
    absl::Status status;
  };
  std::deque<PendingReply> replies_;  // targets ascending
};

}  // namespace sluice::internal
