// SplitClient: a worker task's view of the dispatcher's split provider
// (distributed_epoch). The task's pipeline source reads splits from it; it
// keeps up to `prefetch` splits requested ahead, so the source rarely
// waits for a GetSplit round trip, and it reports completed splits.
//
// Threads: the pipeline's thread calls the SplitSource methods and Tag();
// Sent() and Acked() may be called from any thread (the data plane's serving
// threads). Two owned threads talk to the dispatcher: a fetcher (GetSplit
// for the next split of the current epoch, long-polling while others hold
// the epoch's last splits) and a reporter (sends completions at once, so
// the epoch's end and reassignment decisions never wait for a fetch). Both
// are joined by Stop() and the destructor.
//
// Completion: a split is completed once the source has read it to the end
// and, for a tracked pipeline, a client acknowledged every element tagged
// with it (Acked; clients acknowledge what they received in their next
// request to the task). Elements sent (Sent) but unacknowledged for
// kAckTimeout count as delivered: their client left or cannot reach this
// worker, and the epoch must still end. Untracked pipelines (Batch,
// Shuffle, ...) cannot tie elements to splits; their splits complete when
// read to the end.
//
// Read ahead: a tracked pipeline through read-ahead ops (SplitPassing::
// kReadsAhead: Prefetch, a deterministic parallel Map) produces elements
// of splits its source has already left. Each element carries its split
// up the pipeline (Iterator::ElementSplit; Tag() is given the root's), and
// a split read to the end completes only once no read-ahead op holds an
// element of it (ReadAhead, Released). Their threads, not the one that
// calls Tag(), then read the source; one waits for a split at the epoch's
// end while the consumer drains what the ops hold.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/service.grpc.pb.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataset/dataset_internal.h"

namespace sluice::internal {

class SplitClient final : public SplitSource {
 public:
  // `stub` must outlive this object.
  SplitClient(proto::DispatcherService::Stub* stub, std::string worker_address, int64_t task_id,
              bool tracked, int prefetch = 2);
  ~SplitClient() override;  // Stop()
  SplitClient(const SplitClient&) = delete;
  SplitClient& operator=(const SplitClient&) = delete;

  // Wakes a waiting source (it gets Cancelled), cancels RPCs, joins threads.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t BeginEpoch() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<Split>> Next(int64_t epoch) override ABSL_LOCKS_EXCLUDED(mu_);
  bool EpochHadSplits(int64_t epoch) override ABSL_LOCKS_EXCLUDED(mu_);

  // The element the pipeline just produced, from `split` (the root
  // iterator's ElementSplit()): its split and index in it (split_id -1
  // when untracked), counted as not yet served; or, when a resumed split
  // delivered it before (`skip`), counted as delivered: the caller drops
  // it.
  struct Tagged {
    SplitPosition position;
    bool skip = false;
  };
  Tagged Tag(int64_t split) ABSL_LOCKS_EXCLUDED(mu_);
  // SplitSource's read-ahead calls (see the top of this file).
  void ReadAhead(int64_t split) override ABSL_LOCKS_EXCLUDED(mu_);
  void Released(int64_t split) override ABSL_LOCKS_EXCLUDED(mu_);
  // An element tagged with `split_id` was handed to the data plane.
  void Sent(int64_t split_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A client received `count` elements tagged with `split_id`.
  void Acked(int64_t split_id, int64_t count) ABSL_LOCKS_EXCLUDED(mu_);
  // Elements counted delivered because kAckTimeout passed without an
  // acknowledgement (their client died or never said goodbye), since start.
  int64_t elements_unacknowledged() const ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr absl::Duration kAckTimeout = absl::Seconds(10);

 private:
  void FetchLoop();
  void ReportLoop();
  void FinishReadingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes `split_id` if it was read to the end and its elements were
  // acknowledged (or, with `timed_out`, sent long enough ago).
  void MaybeCompleteLocked(int64_t split_id, bool timed_out = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits a retry interval (returns early on Stop).
  void PauseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One GetSplit call (cancelled by Stop).
  grpc::Status Call(const proto::GetSplitRequest& req, proto::GetSplitResponse* resp,
                    absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  proto::DispatcherService::Stub* const stub_;
  const std::string worker_address_;
  const int64_t task_id_;
  const bool tracked_;
  const size_t prefetch_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t began_ ABSL_GUARDED_BY(mu_) = 0;   // source iterators started
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = -1;  // the epoch being fetched
  std::deque<Split> queue_ ABSL_GUARDED_BY(mu_);  // fetched, not yet read
  bool ended_ ABSL_GUARDED_BY(mu_) = false;        // epoch_ has no more splits
  std::map<int64_t, bool> had_splits_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> current_ ABSL_GUARDED_BY(mu_);  // the split being read
  // A tracked split being read, or read and not yet completed.
  struct SplitElements {
    SplitPosition range;  // epoch, begin, end
    IndexSet skip;        // indices delivered before the checkpoint it resumes from
    int64_t tagged = 0, sent = 0, acked = 0;
    int64_t read_ahead = 0;  // held by read-ahead ops (ReadAhead, not yet Released)
    absl::Time last_sent = absl::InfinitePast();
  };
  std::map<int64_t, SplitElements> elements_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> read_ ABSL_GUARDED_BY(mu_);  // read to the end, elements unacknowledged
  std::vector<int64_t> completed_ ABSL_GUARDED_BY(mu_);  // to report
  int64_t unacknowledged_ ABSL_GUARDED_BY(mu_) = 0;     // elements_unacknowledged()
  // Received and not yet reported completed: sent with every fetch so the
  // dispatcher hands out again a split whose reply never arrived.
  std::set<int64_t> held_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  std::thread fetcher_, reporter_;
};

}  // namespace sluice::internal
