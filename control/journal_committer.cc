#include "sluice/control/journal_committer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "sluice/core/status.h"

namespace sluice::internal {

JournalCommitter::JournalCommitter(SnapshotFn snapshot, WrittenFn written)
    : snapshot_(std::move(snapshot)), written_(std::move(written)) {}

JournalCommitter::~JournalCommitter() {
  if (compact_thread_.joinable()) compact_thread_.join();
}

absl::Status JournalCommitter::Replay(
    const std::string& dir, const std::vector<std::string>& records,
    const std::function<absl::Status(const proto::JournalUpdate&)>& apply) {
  for (size_t i = 0; i < records.size(); ++i) {
    proto::JournalRecord rec;
    absl::Status s;
    if (!rec.ParseFromString(records[i])) s = absl::InvalidArgumentError("it does not parse");
    for (int k = 0; s.ok() && k < rec.updates_size(); ++k) s = apply(rec.updates(k));
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat(
          "dispatcher journal ", dir, "/", std::string(kJournalFileName), ": record ", i + 1,
          " of ", records.size(), " cannot be applied (", s.message(),
          "); it was written by an incompatible dispatcher or is damaged"));
    }
  }
  return absl::OkStatus();
}

absl::Status JournalCommitter::Open(const std::string& dir, FsyncPolicy policy,
                                    int64_t replayed) {
  SLUICE_ASSIGN_OR_RETURN(journal_, JournalWriter::Open(dir, policy));
  records_in_journal_ = replayed;
  if (records_in_journal_ >= min_records_) {
    absl::Status s = CompactNow();
    if (!s.ok()) {
      spdlog::warn("dispatcher: journal compaction failed: {}", std::string(s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JournalCommitter::Encode(const proto::JournalRecord& rec) const {
  SLUICE_RETURN_IF_ERROR(error_);
  std::string bytes;
  if (!rec.SerializeToString(&bytes)) {
    return absl::InternalError("dispatcher journal: cannot serialize a state change");
  }
  if (bytes.size() > kMaxRecordBytes) {
    return absl::UnavailableError(absl::StrCat(
        "the dispatcher cannot journal this change (a record of ", bytes.size(),
        " bytes exceeds the journal's limit of ", kMaxRecordBytes, " bytes)"));
  }
  return bytes;
}

void JournalCommitter::Queue(std::string record) {
  queue_.push_back(std::move(record));
  ++applied_;
  ++counters_.records;
  ++records_in_journal_;
}

absl::Status JournalCommitter::AwaitDurable(absl::Mutex& mu, absl::Status reply) {
  if (!is_open()) return reply;
  const int64_t target = applied_;
  while (durable_ < target && error_.ok()) {
    if (writing_) {
      cv_.Wait(&mu);
    } else {
      Write(mu);
    }
  }
  if (!error_.ok()) return error_;
  return reply;
}

void JournalCommitter::QueueReply(Done done, absl::Status status) {
  replies_.push_back({applied_, std::move(done), std::move(status)});
}

bool JournalCommitter::SendReplies(absl::Mutex& mu) {
  bool progress = false;
  if (!replies_.empty() && NeedsWriter(replies_.back().target)) {
    Write(mu);  // releases mu while it writes
    progress = true;
  }
  const bool failed = is_open() && !error_.ok();
  std::vector<PendingReply> send;
  while (!replies_.empty() && (failed || Durable(replies_.front().target))) {
    send.push_back(std::move(replies_.front()));
    replies_.pop_front();
  }
  if (send.empty()) return progress;
  const absl::Status error = failed ? error_ : absl::OkStatus();
  mu.Unlock();
  for (PendingReply& r : send) r.done(error.ok() ? std::move(r.status) : error);
  mu.Lock();
  return true;
}

void JournalCommitter::Write(absl::Mutex& mu) {
  writing_ = true;
  std::vector<std::string> batch;
  batch.swap(queue_);
  const int64_t upto = applied_;
  // Records after a snapshot being written go into the compacted journal
  // too, when it is installed.
  if (compacting_) retained_.insert(retained_.end(), batch.begin(), batch.end());
  // Records and bytes: a snapshot of a big fleet (hundreds of thousands of
  // tasks) is large while the records that follow (splits) are small, so
  // counting records alone would rewrite it every few seconds.
  JournalWriter* journal = journal_.get();
  if (!compacting_ &&
      records_in_journal_ >= std::max(min_records_, 4 * records_in_last_snapshot_) &&
      journal->size() >= 4 * bytes_in_last_snapshot_) {
    // The snapshot holds every change applied so far, this batch's too; it
    // is written by a thread of its own while appends go on.
    compacting_ = true;
    compact_upto_ = applied_;
    if (compact_thread_.joinable()) compact_thread_.join();  // it has left the lock for good
    const absl::Time t0 = absl::Now();
    BuildRecordsFn build = snapshot_();
    timing_.snapshot_under_lock = absl::Now() - t0;
    compact_thread_ = std::thread(
        [this, &mu, build = std::move(build), before = journal->size()]() mutable {
          CompactInBackground(mu, std::move(build), before);
        });
  }
  mu.Unlock();
  const absl::Status written = journal->AppendBatch(batch);
  mu.Lock();
  writing_ = false;
  counters_.syncs = journal->syncs();
  if (written.ok()) {
    durable_ = upto;
  } else {
    spdlog::error("dispatcher: journal write failed; no further change is accepted and every "
                  "request fails until the dispatcher is restarted (it replays its journal): {}",
                  std::string(written.message()));
    error_ = absl::UnavailableError(absl::StrCat(
        "the dispatcher cannot journal changes (", written.message(),
        "); it must be restarted, retry later"));
  }
  cv_.SignalAll();
  written_();
}

namespace {
std::vector<std::string> Serialize(const std::vector<proto::JournalRecord>& records) {
  std::vector<std::string> out;
  out.reserve(records.size());
  for (const proto::JournalRecord& r : records) out.push_back(r.SerializeAsString());
  return out;
}
}  // namespace

void JournalCommitter::CompactInBackground(absl::Mutex& mu, BuildRecordsFn build,
                                           uint64_t bytes_before) {
  const absl::Time t0 = absl::Now();
  const std::vector<std::string> snapshot = Serialize(build());
  build = nullptr;  // frees the capture before the write
  const absl::Time t1 = absl::Now();
  absl::Status s = journal_->WriteCompacted(snapshot);
  absl::MutexLock l(&mu);
  timing_.build = t1 - t0;
  timing_.write = absl::Now() - t1;
  while (writing_) cv_.Wait(&mu);
  if (s.ok()) s = error_;
  if (s.ok()) {
    // Every retained record is in the old journal now; the new one gets
    // them after the snapshot. Appends wait meanwhile (a short write).
    writing_ = true;
    std::vector<std::string> tail = std::move(retained_);
    timing_.tail_records = static_cast<int64_t>(tail.size());
    mu.Unlock();
    const absl::Time t2 = absl::Now();
    s = journal_->InstallCompacted(tail);
    mu.Lock();
    timing_.install = absl::Now() - t2;
    writing_ = false;
    counters_.syncs = journal_->syncs();
  }
  compacting_ = false;
  retained_.clear();
  if (s.ok()) {
    Compacted(snapshot, bytes_before);
    records_in_journal_ += applied_ - compact_upto_;  // applied since the snapshot
  } else {
    // The old journal stays in use, whole; it just stays long.
    spdlog::warn("dispatcher: journal compaction failed: {}", std::string(s.message()));
    records_in_last_snapshot_ = records_in_journal_;  // do not retry at every write
    bytes_in_last_snapshot_ = bytes_before;
  }
  cv_.SignalAll();
  written_();
}

void JournalCommitter::Compacted(const std::vector<std::string>& snapshot,
                                 uint64_t bytes_before) {
  // The snapshot's own size (the installed file may hold records appended
  // while it was written, after it).
  uint64_t bytes = kJournalHeaderBytes;
  for (const std::string& r : snapshot) bytes += kJournalRecordHeaderBytes + r.size();
  spdlog::info("dispatcher: journal compacted from {} records ({} bytes) to a snapshot of {} "
               "records ({} bytes): state captured in {} under the lock, records built and "
               "serialized in {} and written in {} without it, installed with {} records "
               "appended meanwhile in {} (appends waited)",
               records_in_journal_, bytes_before, snapshot.size(), bytes,
               absl::FormatDuration(timing_.snapshot_under_lock),
               absl::FormatDuration(timing_.build), absl::FormatDuration(timing_.write),
               timing_.tail_records,
               absl::FormatDuration(timing_.install));
  timing_ = {};
  records_in_journal_ = records_in_last_snapshot_ = static_cast<int64_t>(snapshot.size());
  bytes_in_last_snapshot_ = bytes;
  ++counters_.compactions;
}

void JournalCommitter::SetCompactionMinRecords(int64_t min_records) {
  min_records_ = std::max<int64_t>(1, min_records);
}

void JournalCommitter::SetFaultHookForTesting(absl::Mutex& mu,
                                              std::function<void(JournalWriter::Stage)> hook) {
  while (writing_) cv_.Wait(&mu);
  if (is_open()) journal_->SetFaultHookForTesting(std::move(hook));
}

void JournalCommitter::AwaitIdle(absl::Mutex& mu) {
  while (writing_ || compacting_) cv_.Wait(&mu);
}

absl::Status JournalCommitter::Compact(absl::Mutex& mu) {
  if (!is_open()) return absl::FailedPreconditionError("no journal is open");
  while (writing_ || compacting_) cv_.Wait(&mu);
  SLUICE_RETURN_IF_ERROR(error_);
  return CompactNow();
}

absl::Status JournalCommitter::CompactNow() {
  // No writer runs (the caller made sure): the snapshot replaces the
  // journal and everything queued.
  const std::vector<std::string> records = Serialize(snapshot_()());
  const uint64_t before = journal_->size();
  SLUICE_RETURN_IF_ERROR(journal_->Rewrite(records));
  queue_.clear();
  durable_ = applied_;
  counters_.syncs = journal_->syncs();
  Compacted(records, before);
  return absl::OkStatus();
}

}  // namespace sluice::internal
