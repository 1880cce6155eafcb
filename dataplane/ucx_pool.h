// SlotPool: registered buffers allocated once and reused. Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/ucx_runtime.h"

namespace sluice::internal {

struct PoolStats {
  std::atomic<int64_t> dedicated{0}, in_use{0}, high_water{0};
};

// Arenas verified on (or found off) their intended NUMA node, process-wide.
std::atomic<int64_t>& ArenasVerified();
std::atomic<int64_t>& ArenasMisplaced();

// A pool of registered memory (the client's receive pool, the worker's
// send pool). Memory is registered once, in arenas (8 MiB, or larger for
// large elements); element buffers are carved out of an arena back to back
// (64-byte aligned) and share its memh. An arena is reused once every buffer
// carved from it is released. Memory use therefore follows the bytes held,
// not the number of elements. Past the cap (`max_bytes`), or for a buffer
// larger than kMaxArenaBytes, a buffer gets its own registration: counted
// in PoolStats::dedicated, never a failure. Callers apply backpressure with
// OverCap() before asking for more.
class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  static constexpr size_t kArenaBytes = size_t{8} << 20;
  static constexpr size_t kMaxArenaBytes = size_t{256} << 20;

  // Always held by a shared_ptr: buffers keep their pool alive.
  // `max_bytes` is consulted on each allocation; `stats` outlives the pool.
  SlotPool(std::shared_ptr<ucx::Context> ctx, size_t (*max_bytes)(), PoolStats* stats,
           DataPlanePlacement placement = {})
      : ctx_(std::move(ctx)), max_bytes_(max_bytes), stats_(stats),
        placement_(std::move(placement)) {}

  ~SlotPool() {
    absl::MutexLock l(&mu_);
    for (auto& a : arenas_) {
      if (a->pinned) pinner_.unpin(a->mem->data());
    }
  }

  struct Arena {
    std::shared_ptr<ucx::Memory> mem;
    size_t used = 0;   // bump offset
    int64_t live = 0;  // buffers carved and not yet released
    bool pinned = false;
  };
  // Page-locks memory for a device (cudaHostRegister); pin returns false
  // when it could not (the arena is then used as it is).
  struct Pinner {
    std::function<bool(void* data, size_t bytes)> pin;
    std::function<void(void* data)> unpin;
  };
  struct Buffer {
    uint8_t* data = nullptr;
    size_t size = 0;
    ucp_mem_h memh = nullptr;
    std::shared_ptr<ucx::Memory> own;  // dedicated registration, else null
    Arena* arena = nullptr;
  };

  // A buffer of at least `bytes`; the shared_ptr's deleter returns it
  // (from any thread).
  absl::StatusOr<std::shared_ptr<Buffer>> Acquire(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    auto* buf = new Buffer();
    buf->size = bytes;
    CarveInto(buf, need);
    if (buf->arena == nullptr) {
      auto m = ucx::Memory::Allocate(ctx_, need);
      if (!m.ok()) {
        delete buf;
        return m.status();
      }
      buf->own = *std::move(m);
      buf->data = buf->own->data();
      buf->memh = buf->own->memh();
      stats_->dedicated++;
    }
    return Hand(buf);
  }

  // A buffer of at least `bytes` from an arena (registered, and pinned
  // when the pool pins), or null when none has room within the cap: for
  // memory that need not be registered (decompressed elements), which the
  // caller then takes from the heap instead of registering a buffer.
  std::shared_ptr<Buffer> TryAcquireInArena(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    auto* buf = new Buffer();
    buf->size = bytes;
    CarveInto(buf, need);
    if (buf->arena == nullptr) {
      delete buf;
      return nullptr;
    }
    return Hand(buf);
  }

  // Pins every arena, those there now and those to come, once each.
  // Dedicated buffers (past the cap, or larger than kMaxArenaBytes) are not
  // pinned: that would cost a registration per element.
  void PinArenas(Pinner pinner) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (pinner_.pin) return;  // already pinning
    pinner_ = std::move(pinner);
    for (auto& a : arenas_) PinLocked(*a);
  }
  size_t pinned_bytes() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return pinned_;
  }

  // Runs (on the releasing thread, no lock held) whenever a buffer comes
  // back. Set before the first Acquire.
  void SetReleaseHook(std::function<void()> hook) { release_hook_ = std::move(hook); }

  size_t registered_bytes() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return registered_;
  }

  // True while the registered bytes held reach the cap: hold off new
  // requests until buffers are released.
  bool OverCap() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return registered_ >= max_bytes_() && free_.empty() && !CurrentHasRoomLocked(64);
  }

 private:
  // Carves `need` bytes for `buf` from an arena when one has room (else
  // leaves buf->arena null).
  void CarveInto(Buffer* buf, size_t need) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    Arena* a = CarveLocked(need);
    if (a == nullptr) return;
    buf->data = a->mem->data() + a->used;
    buf->memh = a->mem->memh();
    buf->arena = a;
    a->used += need;
    ++a->live;
  }

  // `buf`, counted in use, owned by a shared_ptr that returns it.
  std::shared_ptr<Buffer> Hand(Buffer* buf) {
    int64_t used = ++stats_->in_use;
    int64_t hw = stats_->high_water.load();
    while (used > hw && !stats_->high_water.compare_exchange_weak(hw, used)) {
    }
    return std::shared_ptr<Buffer>(buf, [pool = shared_from_this()](Buffer* b) { pool->Release(b); });
  }

  bool CurrentHasRoomLocked(size_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return current_ != nullptr && current_->used + need <= current_->mem->size();
  }

  // An arena with `need` bytes free at its end, or null (use a dedicated
  // buffer).
  Arena* CarveLocked(size_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (need > kMaxArenaBytes) return nullptr;
    if (CurrentHasRoomLocked(need)) return current_;
    // Retire the current arena (it is recycled when its last buffer goes).
    if (current_ != nullptr && current_->live == 0) {
      current_->used = 0;
      free_.push_back(current_);
    }
    current_ = nullptr;
    size_t want = std::max(kArenaBytes, need);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->mem->size() >= want) {
        current_ = *it;
        free_.erase(it);
        return current_;
      }
    }
    if (registered_ + want > max_bytes_()) return nullptr;
    auto m = AllocateArena(want);
    if (!m.ok()) return nullptr;
    arenas_.push_back(std::make_unique<Arena>());
    Arena* a = arenas_.back().get();
    a->mem = *std::move(m);
    if (pinner_.pin) PinLocked(*a);
    registered_ += want;
    current_ = a;
    return a;
  }

  // Placement-aware: memory from placement_.allocate (bound to a node) is
  // registered and its location verified once.
  absl::StatusOr<std::shared_ptr<ucx::Memory>> AllocateArena(size_t bytes) {
    if (!placement_.allocate) return ucx::Memory::Allocate(ctx_, bytes);
    auto mem = placement_.allocate(bytes);
    if (!mem.ok()) return mem.status();
    if (placement_.verify) {
      if (placement_.verify(mem->get(), bytes)) {
        ArenasVerified()++;
      } else {
        ArenasMisplaced()++;
      }
    }
    return ucx::Memory::Register(ctx_, *std::move(mem), bytes);
  }

  void PinLocked(Arena& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (a.pinned) return;
    a.pinned = pinner_.pin(a.mem->data(), a.mem->size());
    if (a.pinned) pinned_ += a.mem->size();
  }

  void Release(Buffer* b) ABSL_LOCKS_EXCLUDED(mu_) {
    --stats_->in_use;
    if (b->arena != nullptr) {
      absl::MutexLock l(&mu_);
      Arena* a = b->arena;
      if (--a->live == 0 && a != current_) {
        a->used = 0;
        free_.push_back(a);
      }
    }
    delete b;
    if (release_hook_) release_hook_();
  }

  std::shared_ptr<ucx::Context> ctx_;
  size_t (*const max_bytes_)();
  PoolStats* const stats_;
  const DataPlanePlacement placement_;
  std::function<void()> release_hook_;  // see SetReleaseHook
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Arena>> arenas_ ABSL_GUARDED_BY(mu_);
  std::vector<Arena*> free_ ABSL_GUARDED_BY(mu_);  // no live buffers
  Arena* current_ ABSL_GUARDED_BY(mu_) = nullptr;  // being carved
  size_t registered_ ABSL_GUARDED_BY(mu_) = 0;
  Pinner pinner_ ABSL_GUARDED_BY(mu_);
  size_t pinned_ ABSL_GUARDED_BY(mu_) = 0;
};

// Frames workers encoded into registered memory (for tests and metrics).
int64_t WorkerFramesRegistered();
int64_t WorkerZeroCopyPayloads();
int64_t WorkerBatchedReplies();
// UCX replies that failed to send (at once or in their completion).
int64_t WorkerUcxSendErrors();
// Of those, rendezvous sends whose memory was held for a grace period
// because the client may still read it (send_quarantine.h).
int64_t WorkerUcxSendsQuarantined();

}  // namespace sluice::internal
