// UCX runtime: RAII owners of the UCX handles and the progress model.
// Internal to dataplane/: UCX headers never reach a public header.
//
// Progress model (one per UcxWorker): a dedicated progress thread owns the
// ucp_worker. Every UCX call on that worker (endpoint creation, sends,
// receives, AM handlers, completion callbacks) runs on that thread. Other
// threads hand it work with Post(), which queues a closure and, only when
// the thread sleeps, wakes it through an eventfd of its own. The thread
// drains ucp_worker_progress(), then arms the worker (ucp_worker_arm;
// UCS_ERR_BUSY means more events: progress again) and sleeps in poll() on
// the worker's event fd and its own. (Waking it with ucp_worker_signal
// instead left the signal in UCX's event fd for ucp_worker_arm to find
// after the posted work ran: a second drain of every interface, two
// epoll_waits per tcp interface, for each request a client sent.) With
// busy_poll it never sleeps (lowest latency, one core spent).
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

  // Runs `fn` on the progress thread (soon). Safe from any thread; after
  // the worker stopped, `fn` is dropped.
  void Post(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `fn` on the progress thread and waits for it.
  void Run(std::function<void()> fn);
  // Runs `fn` on the progress thread on every pass of its loop, at least
  // every 100 ms (timers: request deadlines, retries). It must be cheap.
  void AddTick(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Times the thread's sleep ran out with work posted meanwhile: a Post
  // that did not wake it (0 unless the wake-up logic is broken).
  int64_t missed_wakeups() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return missed_wakeups_;
  }
  // Only on the progress thread.
  ucp_worker_h handle() const { return h_; }
  const std::shared_ptr<Context>& context() const { return ctx_; }

 private:
  Worker(std::shared_ptr<Context> ctx, ucp_worker_h h, int efd, int post_fd, bool busy_poll)
      : ctx_(std::move(ctx)), h_(h), efd_(efd), post_fd_(post_fd), busy_poll_(busy_poll) {}
  void Loop();
  void WakeProgressThread();  // any thread

  std::shared_ptr<Context> ctx_;
  ucp_worker_h h_;
  int efd_;      // UCX's (ucp_worker_get_efd)
  int post_fd_;  // an eventfd: Post and stop wake the sleeping thread
  bool busy_poll_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> posted_ ABSL_GUARDED_BY(mu_);
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;  // between its last look at posted_ and waking
  int64_t missed_wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  // Replaced (not changed) by AddTick, so a loop pass copies a pointer.
  std::shared_ptr<const std::vector<std::function<void()>>> ticks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  absl::Notification loop_left_;  // the progress thread makes no more UCX calls
};

// Progress thread only: installs an active-message handler on `worker`.
absl::Status SetAmHandler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void* arg);
// Progress thread only: a client endpoint to the listener at "host:port",
// with peer error handling (`on_error(arg, ep, status)` when the peer dies).
absl::StatusOr<ucp_ep_h> ConnectEndpoint(ucp_worker_h worker, const std::string& host_port,
                                         ucp_err_handler_cb_t on_error, void* arg);
// Progress thread only: a server endpoint for a listener's connection
// request, with peer error handling as ConnectEndpoint's.
absl::StatusOr<ucp_ep_h> AcceptEndpoint(ucp_worker_h worker, ucp_conn_request_h request,
                                        ucp_err_handler_cb_t on_error, void* arg);
// Progress thread only: closes `ep` at once (peer error handling mode).
void CloseEndpointForce(ucp_ep_h ep);
// The UCX settings sluice applies unless the user set them (name without
// the UCX_ prefix, value) for UCX_TLS = `ucx_tls` (default: the
// environment's): docs/dataplane.md "UCX 1.13". A transport's settings only
// where UCX_TLS lets UCX load it. Benchmarks give them to ucx_perftest, so
// that its ceiling uses the same transports.
std::vector<std::pair<std::string, std::string>> SluiceUcxDefaults(
    std::optional<std::string> ucx_tls = std::nullopt);

// Progress thread only: the transports `ep` uses and what for, from UCX's
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
