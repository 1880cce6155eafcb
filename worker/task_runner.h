// TaskRunner: runs one task's dataset on its own thread into a bounded
// element buffer that GetElement calls drain first-come-first-served (so
// consumers sharing a job split the elements).
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
#include "control/service.pb.h"
#include "sluice/dataplane/ucx_server.h"
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

  // Waits up to `wait` for an element, then takes it and up to
  // max_elements - 1 more that are ready now, while their frames total at
  // most max_bytes; split (zero-copy) frames are never batched with others.
  // The task's error (for example a dataset that does not validate on this
  // worker) is returned as is.
  absl::StatusOr<ServedBatch> GetBatch(absl::Duration wait, int64_t max_elements = 1,
                                       int64_t max_bytes = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // distributed_epoch: a client received these elements.
  void Ack(const std::vector<SplitAck>& acks);

  // Coordinated reads (TaskDef.num_consumers > 0): the element of
  // `consumer_index` in `round`. The first request for a round takes the
  // next num_consumers elements (waiting up to `wait` for them; not_ready
  // if they are not there yet), one per consumer; later requests for the
  // round get their consumer's. Rounds may open in any order. At most
  // kMaxOpenRounds rounds are open (some consumer has not taken its
  // element) unless the round is below an open one: a consumer ahead waits
  // for the slowest. A round asked for twice by one consumer, or one of the
  // last kClosedRoundsKept closed, is FailedPrecondition; end_of_sequence
  // once the dataset cannot fill a round.
  static constexpr size_t kMaxOpenRounds = 16;
  absl::StatusOr<ServedBatch> GetRound(absl::Duration wait, int64_t consumer_index,
                                       int64_t round) ABSL_LOCKS_EXCLUDED(mu_);

  // True once the producer ended and every element was handed out, or the
  // task failed. Reported to the dispatcher as completed.
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status error() const ABSL_LOCKS_EXCLUDED(mu_);
  const proto::TaskDef& def() const { return def_; }
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // For metrics: the buffer's occupancy now, and what was produced into it
  // and handed out of it (frames and their bytes) since the task started.
  struct Counters {
    int64_t buffered_elements = 0, buffered_bytes = 0;
    int64_t produced_elements = 0, served_elements = 0, served_bytes = 0;
  };
  Counters counters() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Produce();

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
  // Coordinated reads: open rounds, each slot a consumer's element until it
  // takes it, and the latest closed ones (to refuse a round asked again).
  static constexpr size_t kClosedRoundsKept = 4096;
  std::map<int64_t, std::vector<std::optional<FrameBuffer>>> rounds_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> closed_rounds_ ABSL_GUARDED_BY(mu_);
  std::thread producer_;
};

}  // namespace sluice::internal
