// SendQuarantine: memory a peer was offered by rendezvous and may still
// read. Internal.
//
// A UCX rendezvous send offers the receiver the sender's buffer; the
// receiver reads it when it handles the offer (RTS), and the send completes
// when the receiver says it is done. If the send's endpoint closes first (a
// server stopping, a client declared dead), UCX completes the send with an
// error at once, and the buffer would go back to its pool, or its tensor to
// the heap. UCX 1.13 cannot revoke a same-host peer's access to it: cma reads
// the sender's memory by process id and address (process_vm_readv), and
// sluice sets CMA_MEMORY_INVALIDATE=y (ucx_runtime.cc) so that cma carries
// rendezvous data on endpoints with peer error handling -- a capability
// cma's own documentation says it does not really have yet. A peer that
// still reads after the send failed then receives whatever the memory holds
// by then (another element's bytes) as its own, with no error: the UCX
// stress test caught one such element in CI (2026-12-07).
//
// So the memory of a failed rendezvous send is held here for a grace period
// before it is released: a live peer reads as soon as its progress loop
// handles the offer (milliseconds), long before the grace ends. Memory held
// is what was in flight when endpoints closed, for one grace period.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sluice::internal {

class SendQuarantine {
 public:
  static constexpr absl::Duration kDefaultGrace = absl::Seconds(10);

  explicit SendQuarantine(absl::Duration grace = kDefaultGrace) : grace_(grace) {}

  // Keeps `memory` (`bytes` of data) until `now` + the grace period, and
  // releases whatever is due by `now`.
  void Hold(std::shared_ptr<const void> memory, size_t bytes, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Entry> due;
    {
      absl::MutexLock l(&mu_);
      TakeDueLocked(now, &due);
      held_.push_back({std::move(memory), bytes, now + grace_});
      held_bytes_ += bytes;
      ++total_held_;
    }
    // `due` is released here, outside the lock: a release may return a
    // buffer to its pool, which takes the pool's lock.
  }

  // Releases what is due by `now`.
  void ReleaseDue(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Entry> due;  // released after the lock (declared before it; see Hold)
    absl::MutexLock l(&mu_);
    TakeDueLocked(now, &due);
  }

  // Bytes held now, and sends held since the start (for metrics and tests).
  size_t held_bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return held_bytes_;
  }
  int64_t total_held() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return total_held_;
  }

 private:
  struct Entry {
    std::shared_ptr<const void> memory;
    size_t bytes;
    absl::Time until;
  };

  // Entries are held in order of their deadlines (one grace for all).
  void TakeDueLocked(absl::Time now, std::vector<Entry>* due) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!held_.empty() && held_.front().until <= now) {
      held_bytes_ -= held_.front().bytes;
      due->push_back(std::move(held_.front()));
      held_.pop_front();
    }
  }

  const absl::Duration grace_;
  mutable absl::Mutex mu_;
  std::deque<Entry> held_ ABSL_GUARDED_BY(mu_);
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::internal
