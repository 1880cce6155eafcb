// UCX runtime: RAII owners of the UCX handles and the progress model.
// Internal to dataplane/: UCX headers never reach a public header.
//
// Progress model (one per UcxWorker). UCX calls on the worker run in a
// *pass*: one thread at a time holds the worker (a lock; the worker is
// UCS_THREAD_MODE_SERIALIZED) and makes every UCX call on it -- endpoint
// creation, sends, receives, AM handlers, completion callbacks. Two kinds of
// thread run passes:
//  - the dedicated progress thread, always: it drains
//    ucp_worker_progress(), arms the worker (ucp_worker_arm; UCS_ERR_BUSY
//    means more events: progress again), lets go of it and sleeps in
//    epoll_wait on the worker's event fd and an eventfd of its own;
//  - a consumer that waits for a reply (Drive): while the worker is free,
//    it takes it, arms it, and sleeps on those fds itself, having taken
//    them out of the progress thread's epoll set, so one reply wakes one
//    thread and the callback that delivers the reply runs on the thread
//    that wants it (no hand-off: one wake-up per reply instead of two).
//    It puts them back, armed, before it lets go.
// Other threads hand work to whoever runs the next pass with Post(), which
// queues a closure and, only when no pass is running, wakes the sleeper
// through the eventfd; RunHereOrPost() runs it at once, on the calling
// thread, when the worker is free (a request sent without waking anyone).
// (Waking the thread with ucp_worker_signal instead left the signal in
// UCX's event fd for ucp_worker_arm to find after the posted work ran: a
// second drain of every interface, two epoll_waits per tcp interface, for
// each request a client sent.) With busy_poll the progress thread never
// sleeps and nobody else drives (lowest latency, one core spent).
#pragma once

#include <ucp/api/ucp.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "sluice/core/event_fd.h"

namespace sluice::internal::ucx {

// A UCX status as an absl status: the code that fits (a dead or unreachable
// peer is Unavailable, a timeout DeadlineExceeded, a cancel Cancelled, bad
// input InvalidArgument, no memory ResourceExhausted, unknown ones
// Internal); the message names `what`, UCX's text and its numeric code.
// UCS_OK gives OK.
absl::StatusCode UcsStatusCode(ucs_status_t s);
absl::Status UcsError(ucs_status_t s, absl::string_view what);
// The same for a failure on a connection to a peer: a code UcsError would
// call Internal is Unavailable here, because an endpoint fails with whatever
// the transport saw when the peer went away (a dead same-host worker's
// shared-memory segment is gone: UCS_ERR_SHMEM_SEGMENT), and the caller's
// answer is the same as for a reset connection: try elsewhere or later.
absl::Status UcsPeerError(ucs_status_t s, absl::string_view what);

// The process's UCX context (features: active messages, wakeup).
class Context final {
 public:
  static absl::StatusOr<std::shared_ptr<Context>> Get();
  ~Context();
  ucp_context_h handle() const { return h_; }

 private:
  explicit Context(ucp_context_h h) : h_(h) {}
  ucp_context_h h_;
};

// Registered memory, its pages touched once: ucp_mem_map allocates it, or,
// from kHugePageBytes up, an anonymous mapping on huge pages does
// (core/huge_pages.h).
class Memory final {
 public:
  static absl::StatusOr<std::shared_ptr<Memory>> Allocate(std::shared_ptr<Context> ctx,
                                                          size_t bytes);
  // Registers memory the caller allocated (`owner` keeps it alive).
  static absl::StatusOr<std::shared_ptr<Memory>> Register(std::shared_ptr<Context> ctx,
                                                          std::shared_ptr<uint8_t> owner,
                                                          size_t bytes);
  ~Memory();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  Memory(std::shared_ptr<Context> ctx, ucp_mem_h memh, uint8_t* data, size_t size)
      : ctx_(std::move(ctx)), memh_(memh), data_(data), size_(size) {}
  std::shared_ptr<Context> ctx_;
  std::shared_ptr<uint8_t> owner_;  // caller-allocated memory (Register)
  ucp_mem_h memh_;
  uint8_t* data_;
  size_t size_;
};

class Worker final {
 public:
  // `on_start` (optional) runs first on the progress thread.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(std::shared_ptr<Context> ctx,
                                                        bool busy_poll,
                                                        std::function<void()> on_start = {});
  // The process's one worker, which the client data plane and every
  // in-process UcxElementServer share (each installs its own AM handler
  // id). The first caller creates it, and its `on_start` places the
  // progress thread; it lives for the process.
  //
  // One ucp_worker per process because UCX 1.13 keeps one table of async
  // event handlers for the whole process, keyed by fd: an event that one
  // worker queued as missed is replayed after the fd was closed and reused
  // by another worker's connection, and the process aborts
  // (async.c:643 `handler->async == async`; fixed upstream in 1.18,
  // "UCS/ASYNC: skip handler if released"). tests/dataplane/
  // ucx_stress_test.cc reproduces it with a worker per server.
  static absl::StatusOr<std::shared_ptr<Worker>> Shared(std::function<void()> on_start = {});
  ~Worker();  // stops and joins the progress thread, then destroys the worker
  // Stops the progress thread (no UCX call runs on it after this returns,
  // unless it was stuck for 2 s) and keeps the worker. Run at exit for the
  // shared worker.
  void StopForExit() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the shared worker exists and its progress thread still runs
  // (tests: it has stopped once the process's exit handlers ran).
  static bool SharedLoopRunning();

  // Runs `fn` in a pass (soon). Safe from any thread; after the worker
  // stopped, `fn` is dropped.
  void Post(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `fn` now, in a pass on this thread, when no thread holds the
  // worker (and busy_poll is off); otherwise Post(fn) (also in a pass: it
  // runs after the current callback). Either way `fn` runs once, unless the
  // worker stopped.
  void RunHereOrPost(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_, pass_mu_);
  // Runs `fn` in a pass and waits for it.
  void Run(std::function<void()> fn);
  // Runs `fn` on every pass of the progress thread's loop, at least every
  // 100 ms, and on a consumer's pass when it has not run for 100 ms
  // (timers: request deadlines, retries). It must be cheap.
  void AddTick(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // A waiting consumer's pass: if the worker is free, runs posted work on
  // this thread; if there was none, arms the worker and sleeps for events
  // up to `max_wait` or until `wake_fd` (an eventfd; -1: none) is written
  // (the caller's state changed elsewhere), and progresses what came. If another
  // thread holds the worker, sleeps until it lets go or `wake_fd` is
  // written, up to `max_wait`, without a pass. Reads `wake_fd` when it
  // woke on it. True when it did either (the caller looks at its state
  // again and may drive again); false when it could do neither (the worker
  // is taken and there is no wake_fd; busy_poll; the worker stopped): the
  // caller waits its own way, and whoever holds the worker runs the
  // callbacks.
  bool Drive(absl::Duration max_wait, int wake_fd = -1) ABSL_LOCKS_EXCLUDED(mu_, pass_mu_);
  // Whether this thread is running a pass of this worker (its UCX calls
  // are allowed here).
  bool InPass() const;
  // Passes run by Drive (tests, benchmarks).
  int64_t driven_passes() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return driven_passes_;
  }
  // Times the thread's sleep ran out with work posted meanwhile: a Post
  // that did not wake it (0 unless the wake-up logic is broken).
  int64_t missed_wakeups() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return missed_wakeups_;
  }
  // Only in a pass.
  ucp_worker_h handle() const { return h_; }
  const std::shared_ptr<Context>& context() const { return ctx_; }

 private:
  Worker(std::shared_ptr<Context> ctx, ucp_worker_h h, int efd, int epfd, bool busy_poll)
      : ctx_(std::move(ctx)), h_(h), efd_(efd), epfd_(epfd), busy_poll_(busy_poll) {}
  void Loop();
  // Adds (EPOLL_CTL_ADD) or removes (EPOLL_CTL_DEL) efd_, and post_ if
  // `post_too`, in the progress thread's epoll set; false if the kernel
  // refused.
  bool WatchSleeperFds(int op, bool post_too = true);
  // In a pass: BeginPass begins it (false: the worker stopped; `driven`: a
  // consumer's, counted); RunPosted
  // runs posted work and the ticks (true if there was posted work);
  // Progress runs that and progresses until UCX has nothing left (true if
  // any of that did something); NothingPosted is false while work is
  // posted, else the pass stops looking at the queue (Post wakes the
  // sleeper from here on); EndPass ends it: false while work is posted or
  // ucp_worker_arm finds events (run Progress again), true once Post wakes
  // the sleeper from here on.
  bool BeginPass(bool driven = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool NothingPosted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  bool RunPosted(bool ticks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  bool Progress(bool ticks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  bool EndPass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the pass (progressing until EndPass agrees) and lets go.
  void LeavePass() ABSL_UNLOCK_FUNCTION(pass_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `wake_fd` to wanting_ (false: no fd, or stopped) or removes it.
  bool Want(int wake_fd, bool want) ABSL_LOCKS_EXCLUDED(mu_);
  // Lets go of the worker and wakes the consumers waiting for it.
  void Release() ABSL_UNLOCK_FUNCTION(pass_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  std::shared_ptr<Context> ctx_;
  ucp_worker_h h_;
  int efd_;      // UCX's (ucp_worker_get_efd)
  EventFd post_;  // Post and stop wake the sleeping thread
  int epfd_;      // the progress thread sleeps on it: efd_ and post_, unless a Drive took them
  bool busy_poll_;
  // Held for a pass: whoever holds it may call UCX on the worker.
  absl::Mutex pass_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::deque<std::function<void()>> posted_ ABSL_GUARDED_BY(mu_);
  // A pass runs and will look at posted_ before it ends (else Post wakes
  // the sleeper).
  bool pass_running_ ABSL_GUARDED_BY(mu_) = false;
  // post_ holds a wake-up (written, not yet read). Written and read only
  // under mu_, and read only by the thread holding the worker, when its
  // pass begins or its sleep ends (TakePostWakeupLocked): a sleeper woken
  // by post_ that finds the worker taken leaves it to the holder, so no
  // thread reads away a wake-up meant for the holder's own sleep.
  bool post_signaled_ ABSL_GUARDED_BY(mu_) = false;
  void SignalPostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakePostWakeupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t missed_wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t driven_passes_ ABSL_GUARDED_BY(mu_) = 0;
  // Wake fds of consumers in Drive waiting for the worker to be let go.
  std::vector<int> wanting_ ABSL_GUARDED_BY(mu_);
  // Replaced (not changed) by AddTick, so a loop pass copies a pointer.
  std::shared_ptr<const std::vector<std::function<void()>>> ticks_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ticks_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  static constexpr absl::Duration kTickInterval = absl::Milliseconds(100);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  absl::Notification loop_left_;  // the progress thread makes no more UCX calls
};

// In a pass: installs an active-message handler on `worker`.
absl::Status SetAmHandler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void* arg);
// In a pass: a client endpoint to the listener at "host:port",
// with peer error handling (`on_error(arg, ep, status)` when the peer dies).
absl::StatusOr<ucp_ep_h> ConnectEndpoint(ucp_worker_h worker, const std::string& host_port,
                                         ucp_err_handler_cb_t on_error, void* arg);
// In a pass: a server endpoint for a listener's connection
// request, with peer error handling as ConnectEndpoint's.
absl::StatusOr<ucp_ep_h> AcceptEndpoint(ucp_worker_h worker, ucp_conn_request_h request,
                                        ucp_err_handler_cb_t on_error, void* arg);
// In a pass: closes `ep` at once (peer error handling mode).
void CloseEndpointForce(ucp_ep_h ep);
// The UCX settings sluice applies unless the user set them (name without
// the UCX_ prefix, value) for UCX_TLS = `ucx_tls` (default: the
// environment's): docs/dataplane.md "UCX 1.13". A transport's settings only
// where UCX_TLS lets UCX load it. Benchmarks give them to ucx_perftest, so
// that its ceiling uses the same transports.
std::vector<std::pair<std::string, std::string>> SluiceUcxDefaults(
    std::optional<std::string> ucx_tls = std::nullopt);

// In a pass: the transports `ep` uses and what for, from UCX's
// own endpoint description (ucp_ep_print_info), e.g.
// "posix/memory(am am_bw keepalive) cma/memory(rma_bw)".
std::string DescribeLanes(ucp_ep_h ep);

// $SLUICE_UCX_BUSY_POLL=1 makes progress threads busy-poll.
bool BusyPollFromEnv();

// "host:port" -> sockaddr_storage (IPv4 or IPv6 literal, or a resolvable name).
absl::Status ParseSockaddr(const std::string& host_port, struct sockaddr_storage* out,
                           socklen_t* len);
std::string SockaddrToString(const struct sockaddr_storage& ss);

}  // namespace sluice::internal::ucx
