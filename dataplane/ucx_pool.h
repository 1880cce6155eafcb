// SlotPool: registered buffers allocated once and reused. Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataplane/ucx_runtime.h"

namespace sluice::internal {

struct PoolStats {
  std::atomic<int64_t> dedicated{0}, in_use{0}, high_water{0};
};

// Preregistered slots (the client's receive pool, the worker's send pool). Slots are allocated (and registered) once,
// lazily, up to max_slots; their size follows the largest payload seen (a
// larger element raises the size; smaller old slots retire when returned).
// A payload that finds no free slot, or exceeds kMaxSlotBytes, gets a
// dedicated registered buffer (counted). Client memory stays bounded by the
// requests in flight (max_outstanding_requests) plus what the user holds.
class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  static constexpr size_t kMinSlotBytes = size_t{1} << 20;
  static constexpr size_t kMaxSlotBytes = size_t{64} << 20;
  static constexpr size_t kMinSlots = 4;

  // Always held by a shared_ptr: buffers keep their pool alive.
  // `max_bytes` is consulted on each allocation; `stats` outlives the pool.
  SlotPool(std::shared_ptr<ucx::Context> ctx, size_t (*max_bytes)(), PoolStats* stats)
      : ctx_(std::move(ctx)), max_bytes_(max_bytes), stats_(stats) {}

  struct Buffer {
    std::shared_ptr<ucx::Memory> mem;
    bool slot = false;
  };

  // A buffer of at least `bytes`; the shared_ptr's deleter returns it
  // (from any thread).
  absl::StatusOr<std::shared_ptr<Buffer>> Acquire(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<ucx::Memory> mem;
    bool slot = false;
    size_t alloc_size = bytes;
    {
      absl::MutexLock l(&mu_);
      if (bytes <= kMaxSlotBytes) {
        size_t s = kMinSlotBytes;
        while (s < bytes) s <<= 1;
        // Grow the slot size only while the pool can still hold a few
        // slots of the new size; rarer giants get dedicated buffers.
        const size_t max_pool_bytes = max_bytes_();
        if (bytes > slot_bytes_ && s * kMinSlots <= max_pool_bytes) {
          slot_bytes_ = s;
          // Retire free slots of the old size.
          size_t before = free_.size();
          free_.erase(std::remove_if(free_.begin(), free_.end(),
                                     [&](const auto& m) { return m->size() < slot_bytes_; }),
                      free_.end());
          allocated_ -= before - free_.size();
        }
        if (bytes > slot_bytes_) {
          // Too large for a slot: dedicated buffer below.
        } else if (!free_.empty()) {
          mem = std::move(free_.back());
          free_.pop_back();
          slot = true;
        } else if ((allocated_ + 1) * slot_bytes_ <= max_pool_bytes) {
          slot = true;
          ++allocated_;
          alloc_size = slot_bytes_;
        }
      }
    }
    if (mem == nullptr) {
      auto m = ucx::Memory::Allocate(ctx_, alloc_size);
      if (!m.ok()) {
        if (slot) {
          absl::MutexLock l(&mu_);
          --allocated_;
        }
        return m.status();
      }
      mem = *std::move(m);
      if (!slot) stats_->dedicated++;
    }
    int64_t used = ++stats_->in_use;
    int64_t hw = stats_->high_water.load();
    while (used > hw && !stats_->high_water.compare_exchange_weak(hw, used)) {
    }
    auto* buf = new Buffer{std::move(mem), slot};
    return std::shared_ptr<Buffer>(buf, [pool = shared_from_this()](Buffer* b) { pool->Release(b); });
  }

 private:
  void Release(Buffer* b) ABSL_LOCKS_EXCLUDED(mu_) {
    --stats_->in_use;
    if (b->slot) {
      absl::MutexLock l(&mu_);
      if (b->mem->size() >= slot_bytes_) {
        free_.push_back(std::move(b->mem));
      } else {
        --allocated_;  // retired: smaller than the current slot size
      }
    }
    delete b;
  }

  std::shared_ptr<ucx::Context> ctx_;
  size_t (*const max_bytes_)();
  PoolStats* const stats_;
  absl::Mutex mu_;
  size_t slot_bytes_ ABSL_GUARDED_BY(mu_) = kMinSlotBytes;
  size_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<ucx::Memory>> free_ ABSL_GUARDED_BY(mu_);
};


// Frames workers encoded into registered memory (for tests and metrics).
int64_t WorkerFramesRegistered();

}  // namespace sluice::internal
