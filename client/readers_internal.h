// The data-service iterator's reading strategies. Internal to client/.
//
// The iterator (distribute.cc) learns the iteration's tasks from the
// dispatcher and owns one Reader: FcfsReader (first come, first served:
// every mode but coordinated reads) or RoundReader (coordinated reads).
// A reader decides which requests to send (Plan) and digests their
// outcomes (OnReply); it never sends, waits or locks. The iterator calls
// it under its own mutex, sends what Plan returned after releasing it
// (GetElementAsync: no thread per request), and calls Plan again after
// every event that can free or create work: a reply, an element taken by
// Next(), a heartbeat, a retry time reached (Reader::NextWakeup).
//
// Building blocks, each testable alone: TaskOrder (a task's replies in the
// order its worker handed them out) and SplitDedup (distributed_epoch:
// drop an element of a reassigned split already delivered).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/client/distribute.h"
#include "rpc/service.pb.h"
#include "sluice/core/index_set.h"
#include "sluice/core/tensor.h"
#include "sluice/dataplane/element_transport.h"

namespace sluice::internal {

// Received elements with their split positions (parallel; positions may
// be empty: untracked).
struct Piece {
  std::vector<Element> elements;
  std::vector<SplitPosition> positions;
};

// Per-task order and redelivery. The worker numbers the elements it hands
// this consumer from a task (a reply's seq is its first element's) in
// production order, but replies of concurrent requests arrive in any
// order: a reply is held until the replies before it were delivered. A
// reply with no seq (-1) is delivered as it comes.
//
// Lost replies. A request that fails in transit (Failed) may have lost a
// reply whose elements the worker had already handed out. The task then
// recovers: its requests ask the worker to resend from delivered() on
// (ElementRequest::resend), which fills the gaps one reply at a time,
// until the worker has nothing to resend (EndRecovery). Elements received
// twice (a slow reply and its resend) are dropped.
//
// Outside a recovery, a gap below the first held reply is given up when no
// request that can fill it is left: the worker handed out the missing
// elements before that reply, so to a request sent before it arrived
// (numbered below its horizon); once none of those is in flight, the
// missing reply is gone for good (the worker died, or the request was
// cancelled) and waiting longer would stall the task forever. An element
// of a given-up gap that arrives late is still delivered.
class TaskOrder {
 public:
  // A request is sent; returns its number (sending order).
  int64_t Sent();
  // Request `number` is over (its reply arrived or it was cancelled).
  void Done(int64_t number);
  // Request `number` failed in transit: Done, and recover.
  void Failed(int64_t number);
  // A reply's elements from `seq` (`piece`); appends what is deliverable
  // now to `out`. Returns how many elements were dropped as received
  // before.
  int64_t Arrived(int64_t seq, Piece piece, std::vector<Piece>* out);
  // Delivers held replies whose gap can no longer be filled (see above);
  // call after Done() and EndRecovery().
  void Release(std::vector<Piece>* out);

  void StartRecovery() { recovering_ = true; }
  void EndRecovery() { recovering_ = false; }
  bool recovering() const { return recovering_; }
  // Every element below it was delivered (or given up).
  int64_t delivered() const { return next_seq_; }
  // Whether all of the first `total` elements were delivered or given up.
  bool Complete(int64_t total) const { return held_.empty() && next_seq_ >= total; }
  // Replies held back (they count against max_outstanding_requests).
  int64_t held() const { return static_cast<int64_t>(held_.size()); }
  int64_t outstanding() const { return static_cast<int64_t>(outstanding_.size()); }

 private:
  struct Held {
    Piece piece;
    int64_t horizon = 0;  // requests sent when it arrived
    int64_t end(int64_t seq) const { return seq + static_cast<int64_t>(piece.elements.size()); }
  };
  bool IsHeld(int64_t seq) const;
  bool TakeGivenUp(int64_t seq);

  int64_t next_seq_ = 0;
  int64_t sent_ = 0;
  bool recovering_ = false;
  std::map<int64_t, Held> held_;  // by first seq; disjoint, above next_seq_
  std::set<int64_t> outstanding_;
  // Given-up gaps below next_seq_ (start -> end), the latest
  // kGivenUpKept.
  static constexpr size_t kGivenUpKept = 256;
  std::map<int64_t, int64_t> given_up_;
};

// distributed_epoch: which (split, index) were delivered. Splits below the
// dispatcher's watermark are complete (no worker produces them again) and
// are forgotten -- but not while a lost task's request is in flight, whose
// late reply could repeat one of them.
class SplitDedup {
 public:
  // Records (split, index); false if it was delivered before. Untracked
  // positions (split <= 0 or index < 0) are always new.
  bool FirstDelivery(int64_t split_id, int64_t index);
  // The dispatcher's completed-split watermark; forgets below it unless
  // `hold` (a lost task still has requests in flight).
  void SetWatermark(int64_t watermark, bool hold);
  size_t tracked_splits() const { return seen_.size(); }
  // The indices of `split_id` recorded (empty for one never seen).
  IndexSet Seen(int64_t split_id) const;

 private:
  std::map<int64_t, IndexSet> seen_;
  int64_t watermark_ = 0;
};

// distributed_epoch: how far this consumer got, per split, for its
// service checkpoint (proto::ServiceCheckpoint; docs/checkpointing.md).
// An element counts as delivered once Next() returned it: elements
// received but still buffered are not. A split is done when every split
// below the dispatcher's watermark completed (all its elements reached
// consumers) and this consumer holds none of its elements undelivered.
class SplitProgressTracker {
 public:
  // The iteration resumed from `from`: its done ranges stay done, and its
  // partly delivered splits keep their delivered elements (this
  // iteration's workers skip them), so that a checkpoint of the resumed
  // iteration holds them too.
  void Seed(const proto::ServiceCheckpoint& from);
  // An element arrived (it may wait for order or be dropped as a
  // duplicate: until Next() returns it, its split is not done).
  void Arrived(const SplitPosition& pos);
  // Next() returned it.
  void Returned(const SplitPosition& pos);
  void SetWatermark(int64_t watermark) { watermark_ = std::max(watermark_, watermark); }
  // Whether an element without a (sane) split position was returned: the
  // pipeline before Distribute does not tie elements to splits.
  bool untracked() const { return untracked_; }
  // The checkpoint, over a source of `positions` positions per epoch.
  proto::ServiceCheckpoint Save(int64_t positions) const;

 private:
  struct Progress {
    int64_t epoch = 0, begin = 0, end = 0;
    int64_t arrived = 0;
    IndexSet delivered;  // returned by Next() in this iteration
  };
  // Whether `pos` is a position this tracker can hold.
  static bool Tracked(const SplitPosition& pos);
  std::map<int64_t, Progress> splits_;  // by split id
  // Seed(): by (epoch, begin).
  struct Carried {
    int64_t end = 0;
    bool done = false;
    IndexSet delivered;
  };
  std::map<std::pair<int64_t, int64_t>, Carried> carried_;
  int64_t watermark_ = 0;
  bool untracked_ = false;
};

// Merges the service checkpoints of every consumer of one iteration, saved
// at the same step, into one (consumers = their count): delivered indices
// united, a split done only when it was complete before the earliest of
// the saves (the lowest watermark) and no consumer held any of its
// elements undelivered. InvalidArgument for checkpoints of different
// iterations or sources.
absl::StatusOr<proto::ServiceCheckpoint> MergeServiceCheckpoints(
    const std::vector<proto::ServiceCheckpoint>& parts);

// A task of the iteration, as the client reads it.
struct ClientTask {
  int64_t id = 0;
  std::string worker;
  std::shared_ptr<ElementTransport> transport;
  int64_t starting_round = 0;  // coordinated reads
  bool end_of_sequence = false;
  bool lost = false;
  int64_t received = 0;
  int64_t in_flight = 0;
  // The worker answered end_of_sequence, having handed this consumer
  // eos_total elements (-1: it did not say), while replies were in flight
  // or missing: the task ends once they are all delivered.
  bool eos_pending = false;
  int64_t eos_total = -1;
  bool eos_after_resend = false;  // it answered a resend request
  int failures = 0;
  absl::Time retry_after = absl::InfinitePast();
  bool idle = false;  // its last reply was not_ready
  // distributed_epoch: elements received per split, not yet acknowledged
  // to the worker (the next request to it carries them).
  std::map<int64_t, int64_t> unacked;
  TaskOrder order;
};

// A request a reader decided on; `number` and `round` identify it in
// OnReply.
struct PlannedRequest {
  int64_t task_id = 0;
  std::shared_ptr<ElementTransport> transport;
  ElementRequest request;
  int64_t number = -1;  // the task's request number (FcfsReader)
  int64_t round = -1;   // coordinated reads
};

// What every reader needs to know about its consumer.
// Requests one consumer keeps in flight at most, whatever its
// max_outstanding_requests (each may hold a worker's serving slot for up
// to element_wait).
inline constexpr int64_t kMaxRequestsInFlight = 64;
// How long a closing iterator waits for the workers to hear it leave
// (FcfsReader::Leave): answers come in a round trip, but a goodbye still
// unsent when this runs out is cancelled with the rest (a TSan CI run on a
// loaded machine missed 0.5 s).
inline constexpr absl::Duration kLeaveAllowance = absl::Seconds(2);

struct ReaderOptions {
  int64_t max_outstanding = 1;  // max_outstanding_requests
  int64_t consumer_index = -1;
  int64_t client_id = 0;
  bool shared_job = false;
  bool distributed = false;  // distributed_epoch: acks and dedup
  absl::Duration element_wait = absl::Milliseconds(500);
  FrameCodec compression = FrameCodec::kNone;  // asked of the workers
  int64_t max_elements_per_reply = kMaxElementsPerReply;
};

// Counters a reader adds to (the iterator reports them process-wide).
struct ReaderCounters {
  int64_t elements = 0, bytes = 0, worker_errors = 0, duplicates = 0, rounds_skipped = 0;
};

class Reader {
 public:
  virtual ~Reader() = default;
  // The requests to send now; each is counted in flight until OnReply.
  virtual std::vector<PlannedRequest> Plan(std::map<int64_t, ClientTask>& tasks,
                                           absl::Time now) = 0;
  // The outcome of a planned request (its task may be gone: ignored then).
  virtual void OnReply(std::map<int64_t, ClientTask>& tasks, const PlannedRequest& sent,
                       absl::StatusOr<ElementResult> r, absl::Time now) = 0;
  // A task was found lost (its requests are being cancelled).
  virtual void OnTaskLost(std::map<int64_t, ClientTask>& tasks, ClientTask& t) {}
  // The dispatcher's completed-split watermark (distributed_epoch).
  virtual void SetSplitWatermark(std::map<int64_t, ClientTask>& tasks, int64_t watermark) {}
  // distributed_epoch: what this consumer received of each split in `ids`
  // (reassigned from a lost task; ClientHeartbeatRequest.reported_splits),
  // or nullopt while a lost task's request is in flight (its reply could
  // still add to them). A reader without splits received none.
  virtual std::optional<std::vector<proto::SplitProgress>> SplitReports(
      const std::map<int64_t, ClientTask>& tasks, const std::vector<int64_t>& ids) const;

  // Elements ready for Next(), in delivery order.
  bool HasElement() const { return !results_.empty(); }
  Element TakeElement();
  // distributed_epoch: this consumer's progress (FcfsReader), else null.
  virtual const SplitProgressTracker* progress() const { return nullptr; }
  // The key the worker gave the element TakeElement last returned
  // (Iterator::ElementKey), when its pipeline keeps one.
  std::optional<uint64_t> last_key() const { return last_key_; }
  int64_t in_flight() const { return in_flight_; }
  // The earliest time Plan may have something new to send without another
  // event (a retry backoff ending); InfiniteFuture if none.
  virtual absl::Time NextWakeup(const std::map<int64_t, ClientTask>& tasks) const;
  // The first error that ends the iteration (a worker's own error).
  const absl::Status& error() const { return error_; }
  // The iterator is going away: failures (its own cancellations) are
  // neither retried nor logged.
  void Stop() { stopping_ = true; }
  // The iterator is going away: a request to each task it still reads
  // saying so (ElementRequest::leaving, with the acks it owes), not
  // counted in flight; none for a reader whose worker keeps no consumers.
  virtual std::vector<PlannedRequest> Leave(std::map<int64_t, ClientTask>& tasks) { return {}; }
  ReaderCounters& counters() { return counters_; }

 protected:
  // A failed request to `t`: transport failures are retried after a
  // backoff (the dispatcher decides whether the worker is lost); the
  // worker's own errors end the iteration. True if retried.
  bool RetryOrFail(ClientTask& t, const absl::Status& s, absl::Time now,
                   const std::string& what);

  bool stopping_ = false;
  // Next() took the element at `pos` (FcfsReader records it).
  virtual void OnTaken(const SplitPosition& pos) {}

  std::deque<Piece> results_;  // each non-empty, positions as many as elements
  size_t next_in_batch_ = 0;
  std::optional<uint64_t> last_key_;
  int64_t in_flight_ = 0;
  absl::Status error_;
  ReaderCounters counters_;
};

// First come, first served: up to max_outstanding replies requested, held
// or buffered at once, spread over the readable tasks (the one with the
// fewest in flight; see Plan in readers.cc for probes of idle tasks), each
// task's replies delivered in its worker's order, distributed_epoch
// duplicates dropped.
class FcfsReader final : public Reader {
 public:
  explicit FcfsReader(ReaderOptions options) : options_(options) {}
  std::vector<PlannedRequest> Plan(std::map<int64_t, ClientTask>& tasks, absl::Time now) override;
  void OnReply(std::map<int64_t, ClientTask>& tasks, const PlannedRequest& sent,
               absl::StatusOr<ElementResult> r, absl::Time now) override;
  void OnTaskLost(std::map<int64_t, ClientTask>& tasks, ClientTask& t) override;
  void SetSplitWatermark(std::map<int64_t, ClientTask>& tasks, int64_t watermark) override;
  std::optional<std::vector<proto::SplitProgress>> SplitReports(
      const std::map<int64_t, ClientTask>& tasks, const std::vector<int64_t>& ids) const override;
  std::vector<PlannedRequest> Leave(std::map<int64_t, ClientTask>& tasks) override;
  const SplitDedup& dedup() const { return dedup_; }
  const SplitProgressTracker* progress() const override {
    return options_.distributed ? &progress_ : nullptr;
  }
  void SeedProgress(const proto::ServiceCheckpoint& from) { progress_.Seed(from); }

 private:
  ClientTask* Pick(std::map<int64_t, ClientTask>& tasks, int64_t free, absl::Time now,
                   absl::Duration* wait);
  // A request to `t`, counted in flight unless it says the consumer leaves.
  PlannedRequest Request(ClientTask& t, absl::Duration wait, bool leaving = false);
  // Acknowledges `pieces`' split elements, drops those of reassigned
  // splits already delivered, and queues the rest for Next().
  void Deliver(ClientTask& t, std::vector<Piece> pieces);
  // The worker said end_of_sequence and nothing is in flight: the task ends
  // if everything it handed out arrived; otherwise it recovers, or fails
  // with DataLoss when a recovery found nothing to resend.
  void FinishEndOfSequence(ClientTask& t);
  bool LostTaskInFlight(const std::map<int64_t, ClientTask>& tasks) const;
  void OnTaken(const SplitPosition& pos) override {
    if (options_.distributed) progress_.Returned(pos);
  }

  const ReaderOptions options_;
  SplitDedup dedup_;
  SplitProgressTracker progress_;
  int64_t watermark_ = 0;
  int64_t held_ = 0;            // replies held for order, across tasks
  bool probe_allowed_ = true;   // a probe of an idle task may be sent
  int64_t rr_ = -1;             // round-robin position
};

// Coordinated reads: round r is served by the (r mod n)-th by id of the n
// tasks started at or before it; each round is requested until it
// resolves (an element, or skipped when its task ended or was lost, as
// every consumer skips it); rounds are delivered in order, at most
// max_outstanding of them requested or buffered. A joining round the
// dispatcher announces (block) is not passed until the new task starts.
class RoundReader final : public Reader {
 public:
  // Its consumer starts at `first_round` (a resumed iteration's).
  RoundReader(ReaderOptions options, int64_t first_round)
      : options_(options),
        next_round_(first_round),
        deliver_round_(first_round),
        return_round_(first_round) {}
  std::vector<PlannedRequest> Plan(std::map<int64_t, ClientTask>& tasks, absl::Time now) override;
  void OnReply(std::map<int64_t, ClientTask>& tasks, const PlannedRequest& sent,
               absl::StatusOr<ElementResult> r, absl::Time now) override;
  absl::Time NextWakeup(const std::map<int64_t, ClientTask>& tasks) const override;

  int64_t next_round() const { return next_round_; }
  // The round whose element Next() returns next (what a checkpoint holds:
  // rounds received but not returned are read again after a restore).
  int64_t return_round() const { return return_round_; }
  // The dispatcher's joining round (-1: none): honoured only from at or
  // below it (else the dispatcher sees our round and picks a later one).
  void SetBlock(int64_t block) { honoured_block_ = block >= 0 && next_round_ <= block ? block : -1; }
  int64_t honoured_block() const { return honoured_block_; }

 private:
  struct Retry {
    int64_t round;
    int64_t task_id;
    absl::Time at;
  };
  ClientTask* TaskForRound(std::map<int64_t, ClientTask>& tasks, int64_t round);
  // The round's element (none: the round was skipped) and where it came from.
  void Resolve(int64_t round, std::optional<Element> e, SplitPosition pos = {});
  PlannedRequest Request(ClientTask& t, int64_t round);
  void OnTaken(const SplitPosition&) override {
    return_round_ = result_rounds_.front() + 1;
    result_rounds_.pop_front();
  }

  const ReaderOptions options_;
  // INVARIANT: deliver_round_ <= next_round_; no round >= honoured_block_
  // is started while honoured_block_ >= 0.
  int64_t next_round_ = 0;
  int64_t deliver_round_ = 0;
  int64_t return_round_ = 0;
  std::map<int64_t, Piece> rounds_;  // resolved, not delivered (empty: skipped)
  std::deque<int64_t> result_rounds_;  // the round of each piece in results_
  std::vector<Retry> retries_;  // rounds to ask again (not ready, or failed)
  int64_t honoured_block_ = -1;
};

}  // namespace sluice::internal
