// TaskRunner: runs one task's dataset on its own thread into a bounded
// element buffer that GetElement calls drain first-come-first-served (so
// consumers sharing a job split the elements).
//
// Order: the buffer is FIFO, so each consumer (ElementRequest::client_id)
// receives its part of the task in production order. The runner numbers
// the elements it hands each consumer (0, 1, ... per consumer; a reply's
// seq is its first element's number), so a client with several requests
// in flight can restore that order whatever order the replies arrive in.
//
// Redelivery: a reply can be lost in transit after the runner handed its
// elements out (a connection that drops it, a request timing out). The
// runner keeps each consumer's replies, as handed out, until the consumer
// says it holds them (ElementRequest::delivered_seq, on every request), and
// resends them when asked (ElementRequest::resend). What it keeps is bounded
// by kMaxRetainedBytes per consumer; what it had to forget, it reports as
// DataLoss when asked for, never as silence. Coordinated reads keep each
// consumer's round elements the same way, by round, until its requests say
// it holds every round below (ElementRequest::delivered_seq): a round
// asked again after a lost reply gets the same element, resent.
//
// The buffer holds up to `buffer_elements` encoded elements; small ones may
// run ahead further, up to kSmallBufferBytes of frames (at most
// kMaxBufferedElements), so that a batched request finds a batch ready.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/service.pb.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/worker/split_client.h"

namespace sluice::internal {

class TaskRunner {
 public:
  // Frames are encoded into buffers from `allocator` (registered memory on
  // the UCX path).
  // `bind_thread` (optional) runs first on the producer thread.
  // `splits` (distributed_epoch) feeds the pipeline's source and tags the
  // elements; the runner stops it.
  TaskRunner(proto::TaskDef def, int64_t buffer_elements, FrameAllocator allocator,
             std::function<void()> bind_thread = {}, std::unique_ptr<SplitClient> splits = {});
  ~TaskRunner();  // stops and joins the producer

  static constexpr size_t kSmallBufferBytes = size_t{1} << 20;
  static constexpr size_t kMaxBufferedElements = 4096;

  // Waits up to `wait` for an element, then hands request.client_id's
  // consumer that element and up to n - 1 more that are ready now, while
  // their frames total at most request.max_bytes, where n is
  // request.max_elements bounded by the consumer's fair share (below);
  // split (zero-copy) frames are never batched with others. The batch's
  // seq numbers its first element among those handed to this consumer.
  // Redelivery (see the top): request.delivered_seq forgets what the
  // consumer holds; request.resend answers at once with the elements kept
  // from delivered_seq on (within the reply that first carried them,
  // resent set), or DataLoss when they were forgotten. end_of_sequence
  // carries in seq how many elements this consumer was handed in all, and
  // is only answered to a consumer that holds them all (its
  // delivered_seq): until then the request waits (up to `wait`; another
  // request of the consumer may say it holds them) and is answered
  // not_ready, so that the task is finished (below) once its end is out.
  // The task's error (for example a dataset that does not validate on this
  // worker) is returned as is.
  //
  // Fair share. A task may be read by several consumers: the request says
  // its job is shared (it has a name; the others may not have asked yet),
  // or other consumers asked within kConsumerIdle. Then, with `sharers` =
  // max(2, consumers active), `ready` = elements buffered when the request
  // is served and R = request.max_outstanding, a reply takes at most
  //   max(1, ready / (sharers * R))
  // elements. Why this bound: a consumer has at most R requests in flight.
  // Even if all R are served back to back, each takes at most a
  // 1 / (sharers * R) part of what is left, so together at most
  // 1 - (1 - 1/(sharers * R))^R <= 1/sharers of what was ready (Bernoulli's
  // inequality): no consumer's burst takes more than its share, and every
  // other consumer's requests find elements. A cap of ready / sharers per
  // reply would not do: R replies of the first consumer to ask would take
  // 1 - (1 - 1/sharers)^R of it, nearly everything. Batching stays where
  // it pays: when the worker runs ahead of its consumers (ready large;
  // with 4096 small elements buffered, 2 sharers and R = 8, 256 per reply);
  // when the consumers keep up, ready is small and a reply carries about
  // one element, as in tf.data, but the worker is then the bottleneck.
  // Should replies be too small to keep up, elements accumulate and the
  // cap grows with them. A private job's consumer (shared_job false, no
  // other consumer seen) is never capped.
  static constexpr absl::Duration kConsumerIdle = absl::Seconds(5);
  // What a consumer's kept replies may total (frame bytes) before the
  // oldest are forgotten; the latest reply is always kept. Replies are
  // forgotten at the consumer's next request normally, so this holds about
  // max_outstanding_requests replies at most.
  static constexpr size_t kMaxRetainedBytes = size_t{64} << 20;
  absl::StatusOr<ServedBatch> GetBatch(const ElementRequest& request, absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // distributed_epoch: a client received these elements.
  void Ack(const std::vector<SplitAck>& acks);

  // Coordinated reads (TaskDef.num_consumers > 0): the element of
  // `consumer_index` in `round`. The first request for a round takes the
  // next num_consumers elements (waiting up to `wait` for them; not_ready
  // if they are not there yet), one per consumer; later requests for the
  // round get their consumer's. Rounds may open in any order. At most
  // kMaxOpenRounds rounds are open (some consumer has not taken its
  // element) unless the round is below an open one: a consumer ahead waits
  // for the slowest. `delivered_round` (-1: says nothing): the consumer
  // holds every round below it. A round the consumer took and does not
  // hold yet is answered again with the same element (resent); one it
  // holds, or one of the last kClosedRoundsKept closed it never took, is
  // FailedPrecondition; one forgotten past kMaxRetainedBytes is DataLoss;
  // end_of_sequence once the dataset cannot fill a round.
  static constexpr size_t kMaxOpenRounds = 16;
  absl::StatusOr<ServedBatch> GetRound(absl::Duration wait, int64_t consumer_index,
                                       int64_t round, int64_t delivered_round = -1)
      ABSL_LOCKS_EXCLUDED(mu_);

  // True once the task failed, or the producer ended, every element was
  // handed out, and each consumer holds what it was handed (said so in a
  // request, or asked nothing for kConsumerIdle: it left). Reported to the
  // dispatcher as completed, after which the dispatcher never declares the
  // task lost, so a reply in transit keeps it unfinished: should the worker
  // die then, the task is lost and its data read again (a static shard by
  // the worker that takes the place) instead of the consumer waiting for
  // that reply forever. A stopped task (its worker going away) is not
  // finished: its consumers may not have been told its end.
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status error() const ABSL_LOCKS_EXCLUDED(mu_);
  const proto::TaskDef& def() const { return def_; }
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // For metrics: the buffer's occupancy now, and what was produced into it
  // and handed out of it (frames and their bytes) since the task started.
  struct Counters {
    int64_t buffered_elements = 0, buffered_bytes = 0;
    int64_t produced_elements = 0, served_elements = 0, served_bytes = 0;
    // Handed out, never acknowledged, counted delivered at the ack timeout
    // (SplitClient::elements_unacknowledged; distributed_epoch only).
    int64_t unacknowledged_elements = 0;
  };
  Counters counters() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Produce();
  // The most elements `request`'s reply may carry now (see GetBatch).
  int64_t BatchLimitLocked(const ElementRequest& request, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Consumer;
  // Redelivery (see the top): keeps `batch` for `consumer`; forgets what
  // the consumer holds; answers a resend.
  void RetainLocked(Consumer& consumer, const ServedBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetDeliveredLocked(Consumer& consumer, int64_t delivered_seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The consumer is going away (ElementRequest::leaving): what it was
  // handed and never received counts as delivered (acknowledged to the
  // split client), and it no longer holds back the task's end or shares.
  void LeaveLocked(Consumer& consumer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::StatusOr<ServedBatch>> ResendLocked(const Consumer& consumer,
                                                          const ElementRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const proto::TaskDef def_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  const FrameAllocator allocator_;
  const std::unique_ptr<SplitClient> splits_;  // null unless distributed_epoch
  std::deque<FrameBuffer> buffer_ ABSL_GUARDED_BY(mu_);
  size_t buffered_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // frame bytes in buffer_
  bool produced_all_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);  // buffered_* computed by counters()
  // The consumers that asked for elements (by client id; one small entry
  // per iteration client that ever read this task, which lives for one
  // iteration): the number the next element handed to each gets, and
  // whether it is active (a request being served, or one within
  // kConsumerIdle).
  struct Consumer {
    int64_t next_seq = 0;
    int64_t serving = 0;
    absl::Time last_seen = absl::InfinitePast();
    // Replies handed out and not yet known to be held by the consumer, in
    // seq order (contiguous up to next_seq); what they total; the first
    // seq still kept (below it: held by the consumer, or forgotten).
    std::deque<ServedBatch> retained;
    size_t retained_bytes = 0;
    int64_t retained_from = 0;
    int64_t delivered = 0;  // the highest delivered_seq it sent
    // It holds every element handed to it (anonymous consumers are never
    // asked).
    bool HoldsAll() const { return delivered >= next_seq; }
    bool left = false;  // said it is going away (ElementRequest::leaving)
  };
  std::map<int64_t, Consumer> consumers_ ABSL_GUARDED_BY(mu_);
  // Coordinated reads: open rounds, each slot a consumer's element until it
  // takes it, and the latest closed ones (to refuse a round asked again).
  static constexpr size_t kClosedRoundsKept = 4096;
  std::map<int64_t, std::vector<std::optional<FrameBuffer>>> rounds_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> closed_rounds_ ABSL_GUARDED_BY(mu_);
  // Coordinated reads, per consumer index: the round elements it took and
  // does not hold yet (Redelivery), their bytes, and the rounds it took
  // that had to be forgotten (the latest kClosedRoundsKept).
  struct TakenRounds {
    std::map<int64_t, FrameBuffer> frames;
    size_t bytes = 0;
    std::set<int64_t> forgotten;
  };
  std::vector<TakenRounds> taken_rounds_ ABSL_GUARDED_BY(mu_);
  std::thread producer_;
};

}  // namespace sluice::internal
