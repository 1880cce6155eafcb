// SplitProvider: one distributed_epoch iteration's splits (the glossary's
// "split", control/dispatcher_impl.h). Internal to control/.
//
// An epoch's positions (a Range's elements, a FromTensors' rows, a
// ListFiles' files) are cut into splits lazily, in order, as tasks ask.
// A split is open from creation until its holder reports it completed; a
// lost holder's open splits go back to the front of their epoch's queue and
// are handed out before new ones. An epoch ends (end_of_splits) only once
// every split of it completed; epochs below done_below completed and are
// forgotten.
//
// Exactly once across consumers: a split reassigned from a lost task may
// have sent elements to any consumer of the iteration, and each consumer
// drops only its own duplicates. So a lost task's splits (of a
// split-tracked pipeline) wait in the queue until every client of the
// iteration said which of their elements it received (Reported; a client
// that goes away counts as having said), and the worker that takes one
// skips those (SplitProto::skip, as for a resumed checkpoint).
//
// Two halves, as the dispatcher uses them:
//  - policy (const): Describe plans a provider for a new iteration, Next
//    decides a task's next split, Report turns a GetSplit request's
//    completions and the splits it did not receive into updates;
//  - state changes (DispatcherState::Apply calls them, replaying the
//    journal's updates): Assign, Complete, Requeue, Release, Restore.
// Save/Restore are the provider's snapshot (SplitProviderStateUpdate).
// Not thread-safe; holds no clock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/journal.pb.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/index_set.h"
#include "rpc/service.pb.h"

namespace sluice::internal {

class SplitProvider {
 public:
  struct OpenSplit {
    proto::SplitProto def;
    int64_t holder_task = 0;  // 0: queued
    std::set<int64_t> awaiting;  // queued: clients whose report it waits for
  };
  struct Epoch {
    std::deque<int64_t> queue;  // open splits to hand out (reassigned ones first)
    int64_t next_position = 0;  // splits are created lazily from here
    int64_t open = 0;           // created, not completed
  };

  // Policy: the provider of a new iteration over `source` (the job's split
  // source) into `u`: its positions per epoch, the positions per split and,
  // for ListFiles, the files as listed now. A split holds
  // range_split_elements positions of a Range, file_split_files files of a
  // ListFiles (0: AutoFileRun of the number listed), one FromTensors
  // element. The files go into packed_files. NotFound / Unavailable when
  // the files cannot be listed here.
  static absl::Status Describe(const proto::DatasetNode& source, int64_t range_split_elements,
                               int64_t file_split_files, proto::CreateIterationUpdate* u);
  // InvalidArgument unless `resume` fits a source of `positions` positions
  // per epoch (the positions it was saved with; ranges inside them, not
  // empty, disjoint within an epoch).
  static absl::Status CheckResume(const proto::ServiceCheckpoint& resume, int64_t positions);
  // Whether the iteration was created to resume from exactly `resume`.
  bool ResumesFrom(const proto::ServiceCheckpoint& resume) const {
    return resume_def_ && resume_def_->SerializeAsString() == resume.SerializeAsString();
  }
  // The files per split when not configured: about 256 splits for a small
  // listing (a small corpus still spreads over many workers), runs of 256
  // files from 65,536 files on (ImageNet's 1.28 M files take 5,000
  // GetSplit calls an epoch, not 1.28 M).
  static int64_t AutoFileRun(int64_t files) {
    return std::clamp<int64_t>(files / 256, 1, kMaxAutoFileRun);
  }
  static constexpr int64_t kMaxAutoFileRun = 256;
  // The provider `u` describes (has_splits), its files listed in `files`
  // or packed in `packed_files`. DataLoss when the packed listing does not
  // unpack, or when the files listed are not `positions`.
  static absl::StatusOr<std::unique_ptr<SplitProvider>> Create(
      const proto::CreateIterationUpdate& u);
  // The provider of an update whose files (if any) are listed in `files`.
  explicit SplitProvider(const proto::CreateIterationUpdate& u);
  // Writes what the constructor reads back into `u`.
  void DescribeTo(proto::CreateIterationUpdate* u) const;

  // Policy: the next split of `epoch` for `task`. True with `assign` filled
  // in (a queued split, or a new one at the epoch's next position, created
  // with split_id 0: the caller gives it a fresh id); false with `resp`
  // saying the epoch ended or that nothing is available yet (others hold
  // its remaining splits, or the queued ones wait for reports). Sets
  // resp->epoch_had_splits either way.
  bool Next(int64_t task, int64_t epoch, proto::GetSplitResponse* resp,
            proto::AssignSplitUpdate* assign) const;
  // A file split handed to a worker names its files (positions [begin,
  // end) of the listing; `file` when it has one): what the worker reads.
  // Splits are journaled and snapshotted without the names, which the
  // listing already holds. No-op for other sources.
  void NameFiles(proto::SplitProto* def) const;
  // Policy: adds to `rec` what a GetSplit request of `task` reports: the
  // splits it completed (of those it holds), and, when it fetches and
  // `reports_held` (and was not `lost`), the splits it holds here but did
  // not list: their reply never reached it, so they go back to the queue.
  void Report(int64_t task, bool lost, const proto::GetSplitRequest& req,
              proto::JournalRecord* rec) const;

  // Policy: adds to `rec` what a ClientHeartbeat request of `client` (of
  // `iteration`) reports: the indices it received of the splits it was
  // asked about (Reported); from a client that does not report (an older
  // version), nothing of each split in `awaited` (those waiting for it).
  // InvalidArgument for indices out of bounds.
  static absl::Status ClientReport(int64_t iteration, int64_t client,
                                   const proto::ClientHeartbeatRequest& req,
                                   const std::vector<int64_t>& awaited, proto::JournalRecord* rec);

  // State changes. Assign: the split `u` describes goes to u.task_id.
  // AlreadyExists for a created split that exists, NotFound for a queued
  // one that is not queued, FailedPrecondition for one that waits for
  // reports.
  absl::Status Assign(const proto::AssignSplitUpdate& u);
  // `task` completed `split`: true when it held it (else the report is
  // stale: completed before, or reassigned since). Forgets completed epochs.
  bool Complete(int64_t task, int64_t split);
  // The splits of `ids` that `task` holds go back to the front of their
  // epochs' queues, in id order, each waiting for the reports of the
  // clients in `awaiting`; returns how many.
  int64_t Requeue(int64_t task, const std::set<int64_t>& ids,
                  const std::set<int64_t>& awaiting = {});
  // `task` ended: its open splits are requeued (it was lost; returns how
  // many), waiting for `awaiting`'s reports, or completed (it ended on its
  // own, e.g. a Take: it chose not to read the rest; returns 0).
  // `*completed` counts the completions.
  int64_t Release(int64_t task, bool requeue, int64_t* completed,
                  const std::set<int64_t>& awaiting = {});
  // `client` received `delivered` of `split`'s output: the split's workers
  // skip those from now on, and it no longer waits for that client. False
  // (nothing changed) unless the split waited for it.
  bool Reported(int64_t client, int64_t split, const IndexSet& delivered);
  // `client` went away (released, timed out): no split waits for it.
  // False if none did.
  bool ClientGone(int64_t client);
  // The queued splits that wait for `client`'s report.
  std::vector<int64_t> AwaitingReport(int64_t client) const;
  // The provider as `u` saved it (epochs, open splits and their holders).
  void Restore(const proto::SplitProviderStateUpdate& u);
  void Save(proto::SplitProviderStateUpdate* u) const;

  // The open splits `task` holds.
  const std::set<int64_t>& Held(int64_t task) const;
  // The lowest open split id (every split below it completed); nullopt
  // when none is open.
  std::optional<int64_t> LowestOpen() const;
  const std::map<int64_t, OpenSplit>& open() const { return open_; }
  const std::map<int64_t, Epoch>& epochs() const { return epochs_; }
  int64_t done_below() const { return done_below_; }
  int64_t positions() const { return positions_; }

 private:
  void Enqueue(std::map<int64_t, OpenSplit>::iterator o);
  // A resumed iteration (CreateIterationUpdate::resume): the first
  // position from `p` on in `epoch` that no done range covers.
  int64_t SkipDone(int64_t epoch, int64_t p) const;

  // The resume checkpoint's ranges by epoch and begin: done ones are
  // skipped; the others are handed out as they were cut, with their
  // delivered elements to skip (SplitProto::skip).
  struct ResumeRange {
    int64_t end = 0;
    bool done = false;
    IndexSet delivered;
  };
  std::map<int64_t, std::map<int64_t, ResumeRange>> resume_;
  std::optional<proto::ServiceCheckpoint> resume_def_;

  int64_t positions_ = 0;          // source positions per epoch (files: count)
  int64_t split_elements_ = 1;     // positions per split
  std::vector<std::string> files_;  // ListFiles: the matched files, sorted
  std::string packed_files_;        // files_ packed, when they came packed
  std::map<int64_t, Epoch> epochs_;
  int64_t done_below_ = 0;  // every epoch below this has completed
  std::map<int64_t, OpenSplit> open_;
  // INVARIANT: held_[t] is the set of open splits whose holder_task is t
  // (no empty sets).
  std::map<int64_t, std::set<int64_t>> held_;
};

}  // namespace sluice::internal
