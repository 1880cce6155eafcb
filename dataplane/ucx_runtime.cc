#include "sluice/dataplane/ucx_runtime.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "sluice/core/huge_pages.h"
#include "sluice/core/status.h"

namespace sluice::internal::ucx {

absl::StatusCode UcsStatusCode(ucs_status_t s) {
  switch (s) {
    case UCS_OK:
      return absl::StatusCode::kOk;
    case UCS_ERR_CANCELED:
      return absl::StatusCode::kCancelled;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::StatusCode::kInvalidArgument;
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NOT_IMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_BUFFER_TOO_SMALL:
      return absl::StatusCode::kResourceExhausted;
    case UCS_ERR_NO_ELEM:
    case UCS_ERR_NO_DEVICE:
      return absl::StatusCode::kNotFound;
    case UCS_ERR_ALREADY_EXISTS:
      return absl::StatusCode::kAlreadyExists;
    case UCS_ERR_OUT_OF_RANGE:
      return absl::StatusCode::kOutOfRange;
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::StatusCode::kDataLoss;
    // The peer or the path to it: worth retrying elsewhere or later.
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_BUSY:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status UcsError(ucs_status_t s, absl::string_view what) {
  if (s == UCS_OK) return absl::OkStatus();
  return absl::Status(UcsStatusCode(s), absl::StrCat(what, ": ", ucs_status_string(s),
                                                     " (UCX status ", static_cast<int>(s), ")"));
}

absl::Status UcsPeerError(ucs_status_t s, absl::string_view what) {
  absl::Status error = UcsError(s, what);
  if (error.code() != absl::StatusCode::kInternal) return error;
  return absl::UnavailableError(error.message());
}

namespace {
// Settings sluice changes from UCX's defaults, each for a reason:
//  - ADAPTIVE_PROGRESS=n: UCX deactivates interfaces no endpoint uses and
//    re-arms them from a progress callback; under connection churn that
//    path aborts the process in UCX 1.13 ("failed to modify ... event
//    handler", ucp_worker.c:634). Keeping interfaces active costs nothing
//    measurable here (sluice-perf transport, docs/dataplane.md).
//  - CMA_MEMORY_INVALIDATE=y: same-host peers move element data over
//    shared memory. sluice's endpoints ask for peer error handling (a dead
//    worker must fail requests, not hang them), and UCX 1.13 then keeps
//    only transports that declare it; cma's rendezvous lane needs memory
//    invalidation as well. With it, a worker and a client on one host send
//    their messages over tcp loopback and the rendezvous data by cma (the
//    kernel copies from one process straight into the other's registered
//    memory).
//    SLUICE_UCX_SHM=0 leaves it unset (data over tcp loopback too).
//    Not POSIX_ERROR_HANDLING / SYSV_ERROR_HANDLING (which let the mm
//    transports carry messages too, set here until 2026-12-06): an mm
//    receive FIFO is shared by every sender, which claims a slot (a CAS on
//    the FIFO's head) and then marks it written (the element's owner bit,
//    uct_mm_ep_am_common_send in mm_ep.c). A sender killed in between
//    leaves a slot that is never marked, and the receiver, reading in
//    order, waits on it forever: a worker SIGKILLed mid-reply wedged its
//    client's FIFO, and that client heard nothing more from any same-host
//    worker (MembershipTest.TwoConsumersOfASharedJob...UnderWorkerKills/
//    ucx_shm hung in 1 to 3 of 16 runs; 0 of 16 without them).
// They are set in the environment (unless already set: a UCX_* variable the
// user set wins) before UCX reads it: ucp_config_modify does not reach the
// transports' own settings.
constexpr std::pair<const char*, const char*> kUcxDefaults[] = {
    {"ADAPTIVE_PROGRESS", "n"},
};
// Each with the transport it belongs to: set only when UCX_TLS lets UCX
// use that transport (UCX prints "unused env variables" to stdout for a
// setting no loaded transport reads).
struct TransportSetting {
  const char* transport;
  const char* name;
  const char* value;
};
constexpr TransportSetting kUcxSharedMemoryDefaults[] = {
    {"cma", "CMA_MEMORY_INVALIDATE", "y"},
};

bool SharedMemoryEnabled() {
  const char* v = std::getenv("SLUICE_UCX_SHM");
  return v == nullptr || std::string(v) != "0";
}

// Whether UCX_TLS = `tls` lets UCX use shared-memory transport `tl`: unset
// or "all"; listed by name or by an alias covering it ("sm"/"shm": every
// shared-memory transport, "mm": posix and sysv); or, for an exclusion list
// ("^..."), not excluded.
bool TlsAllows(absl::string_view tls, absl::string_view tl) {
  if (tls.empty()) return true;
  const bool exclude = absl::ConsumePrefix(&tls, "^");
  bool listed = false;
  for (absl::string_view name : absl::StrSplit(tls, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    absl::ConsumePrefix(&name, "\\");  // a strict name
    if (name == tl || name == "all" || name == "sm" || name == "shm" ||
        (name == "mm" && tl != "cma")) {
      listed = true;
    }
  }
  return exclude ? !listed : listed;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> SluiceUcxDefaults(
    std::optional<std::string> ucx_tls) {
  if (!ucx_tls.has_value()) {
    const char* env = std::getenv("UCX_TLS");
    ucx_tls = env != nullptr ? env : "";
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, value] : kUcxDefaults) out.emplace_back(name, value);
  if (SharedMemoryEnabled()) {
    for (const TransportSetting& s : kUcxSharedMemoryDefaults) {
      if (TlsAllows(*ucx_tls, s.transport)) out.emplace_back(s.name, s.value);
    }
  }
  return out;
}

namespace {
// The process's UCX context while anyone holds it (Context::Get), and its
// shared worker (Worker::Shared; never destroyed: lives for the process).
ABSL_CONST_INIT absl::Mutex g_context_mu(absl::kConstInit);
std::weak_ptr<Context>* g_context ABSL_GUARDED_BY(g_context_mu) = nullptr;
ABSL_CONST_INIT absl::Mutex g_shared_worker_mu(absl::kConstInit);
std::shared_ptr<Worker>* g_shared_worker ABSL_GUARDED_BY(g_shared_worker_mu) = nullptr;
}  // namespace

absl::StatusOr<std::shared_ptr<Context>> Context::Get() {
  absl::MutexLock l(&g_context_mu);
  if (g_context == nullptr) g_context = new std::weak_ptr<Context>();
  if (auto c = g_context->lock()) return c;
  // sluice's UCX defaults (above; docs/dataplane.md, "UCX 1.13"); a UCX_*
  // variable the user set wins.
  for (const auto& [name, value] : SluiceUcxDefaults()) {
    setenv(absl::StrCat("UCX_", name).c_str(), value.c_str(), /*overwrite=*/0);
  }
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcsError(s, "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_context_h h = nullptr;
  s = ucp_init(&params, config, &h);
  ucp_config_release(config);
  if (s != UCS_OK) return UcsError(s, "ucp_init");
  std::shared_ptr<Context> c(new Context(h));
  *g_context = c;
  return c;
}

Context::~Context() { ucp_cleanup(h_); }

absl::StatusOr<std::shared_ptr<Memory>> Memory::Allocate(std::shared_ptr<Context> ctx,
                                                         size_t bytes) {
  // Large buffers are our own mapping, on huge pages: UCX would allocate
  // them as SysV or POSIX shared memory wherever those transports load,
  // which the kernel backs with small pages (huge_pages.h). UCX allocates
  // when the kernel refuses the mapping.
  if (WantsHugePages(bytes)) {
    if (void* mapped = MapHugePageAligned(bytes)) {
      std::memset(mapped, 0, bytes);  // first touch, as below
      std::shared_ptr<uint8_t> owner(static_cast<uint8_t*>(mapped),
                                     [bytes](uint8_t* q) { UnmapHugePageAligned(q, bytes); });
      return Register(std::move(ctx), std::move(owner), bytes);
    }
  }
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.address = nullptr;
  p.length = bytes == 0 ? 64 : bytes;
  p.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(ctx->handle(), &p, &memh);
  if (s != UCS_OK) return UcsError(s, absl::StrCat("ucp_mem_map of ", bytes, " bytes"));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  s = ucp_mem_query(memh, &attr);
  if (s != UCS_OK) {
    ucp_mem_unmap(ctx->handle(), memh);
    return UcsError(s, "ucp_mem_query");
  }
  auto* data = static_cast<uint8_t*>(attr.address);
  // First touch, so the pages exist (and land on the allocating thread's
  // NUMA node) before any transfer.
  std::memset(data, 0, p.length);
  return std::shared_ptr<Memory>(new Memory(std::move(ctx), memh, data, bytes));
}

absl::StatusOr<std::shared_ptr<Memory>> Memory::Register(std::shared_ptr<Context> ctx,
                                                         std::shared_ptr<uint8_t> owner,
                                                         size_t bytes) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = owner.get();
  p.length = bytes;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(ctx->handle(), &p, &memh);
  if (s != UCS_OK) return UcsError(s, absl::StrCat("ucp_mem_map (register) of ", bytes, " bytes"));
  std::shared_ptr<Memory> m(new Memory(std::move(ctx), memh, owner.get(), bytes));
  m->owner_ = std::move(owner);
  return m;
}

Memory::~Memory() { ucp_mem_unmap(ctx_->handle(), memh_); }

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(std::shared_ptr<Context> ctx,
                                                       bool busy_poll,
                                                       std::function<void()> on_start) {
  ucp_worker_params_t p{};
  p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time calls UCX on it: the one running a pass (the
  // progress thread or a driving consumer; see the header).
  p.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h h = nullptr;
  ucs_status_t s = ucp_worker_create(ctx->handle(), &p, &h);
  if (s != UCS_OK) return UcsError(s, "ucp_worker_create");
  int efd = -1;
  s = ucp_worker_get_efd(h, &efd);
  if (s != UCS_OK) {
    ucp_worker_destroy(h);
    return UcsError(s, "ucp_worker_get_efd");
  }
  const int epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) {
    ucp_worker_destroy(h);
    return absl::ResourceExhaustedError(
        absl::StrCat("epoll for the UCX progress thread: ", std::strerror(errno)));
  }
  std::unique_ptr<Worker> w(new Worker(std::move(ctx), h, efd, epfd, busy_poll));
  if (w->post_.fd() < 0 || !w->WatchSleeperFds(EPOLL_CTL_ADD)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("eventfd for the UCX progress thread: ", std::strerror(errno)));
  }
  Worker* raw = w.get();
  w->thread_ = std::thread([raw, on_start = std::move(on_start)] {
    if (on_start) on_start();
    raw->Loop();
    raw->loop_left_.Notify();
  });
  return w;
}

namespace {
// At exit, before the libraries' own finalizers: the shared worker's
// progress thread stops making UCX calls (see Worker::Shared).
void StopSharedWorkerAtExit() {
  std::shared_ptr<Worker> w;
  {
    absl::MutexLock l(&g_shared_worker_mu);
    if (g_shared_worker != nullptr) w = *g_shared_worker;
  }
  if (w != nullptr) w->StopForExit();
}
}  // namespace

void Worker::StopForExit() {
  if (InPass()) return;  // exit() called from a callback: nothing to wait for
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    SignalPostLocked();
  }
  // Bounded: an exit never hangs on it (a callback blocked on a lock some
  // frozen thread holds); past it the process exits as it would have.
  if (loop_left_.WaitForNotificationWithTimeout(absl::Seconds(2)) && thread_.joinable()) {
    thread_.join();  // it is returning
  }
  // A consumer's pass still running ends within its wait; later ones see
  // stop_ and do not start. Bounded too.
  for (absl::Time end = absl::Now() + absl::Seconds(2); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(1))) {
    if (pass_mu_.TryLock()) {
      pass_mu_.Unlock();
      break;
    }
  }
}

bool Worker::SharedLoopRunning() {
  absl::MutexLock l(&g_shared_worker_mu);
  return g_shared_worker != nullptr && !(*g_shared_worker)->loop_left_.HasBeenNotified();
}

absl::StatusOr<std::shared_ptr<Worker>> Worker::Shared(std::function<void()> on_start) {
  absl::MutexLock l(&g_shared_worker_mu);
  if (g_shared_worker != nullptr) return *g_shared_worker;
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, Context::Get());
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Worker> w,
                          Create(std::move(ctx), BusyPollFromEnv(), std::move(on_start)));
  g_shared_worker = new std::shared_ptr<Worker>(std::move(w));
  // The shared worker lives for the process, so its thread would still be
  // progressing UCX while exit() runs the libraries' finalizers: libucm's
  // removes the malloc hooks a UCX call on that thread was using, and the
  // process died of SIGSEGV after main returned (a trainer's job would be
  // marked failed). Handlers registered now run before those finalizers.
  std::atexit(StopSharedWorkerAtExit);
  return *g_shared_worker;
}

Worker::~Worker() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    SignalPostLocked();
  }
  if (thread_.joinable()) thread_.join();
  pass_mu_.Lock();  // a consumer's pass ends; none starts after stop_
  pass_mu_.Unlock();
  ucp_worker_destroy(h_);
  close(epfd_);
}

namespace {
// The worker whose pass this thread runs (Worker::InPass).
thread_local const Worker* t_pass_of = nullptr;
}  // namespace

bool Worker::InPass() const { return t_pass_of == this; }

void Worker::Post(std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  if (stop_) return;
  posted_.push_back(std::move(fn));
  // A running pass looks at the queue, under mu_, before it ends.
  if (!pass_running_) SignalPostLocked();
}

void Worker::SignalPostLocked() {
  if (post_signaled_) return;  // one wake-up is enough until it is taken
  post_signaled_ = true;
  post_.Signal();
}

void Worker::TakePostWakeupLocked() {
  if (!post_signaled_) return;
  post_signaled_ = false;
  post_.Clear();
}

void Worker::RunHereOrPost(std::function<void()> fn) {
  // In a pass (a callback): after the callback, as Post has always done.
  if (InPass() || busy_poll_) return Post(std::move(fn));
  if (!pass_mu_.TryLock()) return Post(std::move(fn));
  if (!BeginPass()) {
    Release();  // (consumers waiting for the worker learn that it stopped)
    return;     // stopped: dropped, as Post would
  }
  RunPosted(false);  // what was posted before it runs before it
  fn();
  // No progress, so no arm either: what the sleeper armed for still wakes
  // it (the worker's fd is level-triggered: events pending on it, or left
  // by this pass, keep it readable).
  while (!NothingPosted()) RunPosted(false);
  Release();
}

void Worker::Run(std::function<void()> fn) {
  if (InPass()) return fn();
  absl::Notification done;
  RunHereOrPost([&] {
    fn();
    done.Notify();
  });
  // If the worker stopped before running it, the closure was dropped.
  while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    absl::MutexLock l(&mu_);
    if (stop_) return;
  }
}

void Worker::AddTick(std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  auto ticks = ticks_ != nullptr ? std::make_shared<std::vector<std::function<void()>>>(*ticks_)
                                 : std::make_shared<std::vector<std::function<void()>>>();
  ticks->push_back(std::move(fn));
  ticks_ = std::move(ticks);
}

bool Worker::WatchSleeperFds(int op, bool post_too) {
  bool ok = true;
  for (int fd : {efd_, post_too ? post_.fd() : -1}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ok = epoll_ctl(epfd_, op, fd, &ev) == 0 && ok;
  }
  return ok;
}

bool Worker::BeginPass(bool driven) {
  absl::MutexLock l(&mu_);
  if (stop_) return false;
  TakePostWakeupLocked();  // what was posted, this pass runs
  pass_running_ = true;
  if (driven) ++driven_passes_;
  t_pass_of = this;
  return true;
}

bool Worker::RunPosted(bool ticks) {
  std::deque<std::function<void()>> work;
  std::shared_ptr<const std::vector<std::function<void()>>> tick_fns;
  {
    absl::MutexLock l(&mu_);
    work.swap(posted_);
    // The ticks: always on the progress thread's passes; in a consumer's
    // when they are due (the consumer may hold the worker while the
    // progress thread waits for it).
    const absl::Time now = absl::Now();
    if (ticks || now - last_ticks_ >= kTickInterval) {
      tick_fns = ticks_;
      last_ticks_ = now;
    }
  }
  for (auto& fn : work) fn();
  if (tick_fns != nullptr) {
    for (const auto& fn : *tick_fns) fn();
  }
  return !work.empty();
}

bool Worker::Progress(bool ticks) {
  const bool ran = RunPosted(ticks);
  bool progressed = false;
  while (ucp_worker_progress(h_) != 0) progressed = true;
  return progressed || ran;
}

bool Worker::NothingPosted() {
  absl::MutexLock l(&mu_);
  if (!posted_.empty()) return false;
  pass_running_ = false;  // from here on, Post wakes the sleeper
  return true;
}

bool Worker::EndPass() {
  if (!NothingPosted()) return false;
  // Armed, the worker's fd tells its sleeper of every later event, whoever
  // sleeps on it. BUSY: events are pending; progress again.
  if (ucp_worker_arm(h_) != UCS_ERR_BUSY) return true;
  absl::MutexLock l(&mu_);
  pass_running_ = true;
  return false;
}

void Worker::LeavePass() {
  while (!EndPass()) Progress(false);
  Release();
}

void Worker::Release() {
  t_pass_of = nullptr;
  pass_mu_.Unlock();
  // Consumers that found the worker taken may drive now (under mu_: one
  // that stops waiting removes its fd first, so none is written after).
  absl::MutexLock l(&mu_);
  for (int fd : wanting_) EventFd::SignalFd(fd);
  wanting_.clear();
}

bool Worker::Want(int wake_fd, bool want) {
  absl::MutexLock l(&mu_);
  if (!want) {
    wanting_.erase(std::remove(wanting_.begin(), wanting_.end(), wake_fd), wanting_.end());
    return true;
  }
  if (wake_fd < 0 || stop_) return false;
  wanting_.push_back(wake_fd);
  return true;
}

bool Worker::Drive(absl::Duration max_wait, int wake_fd) {
  if (busy_poll_ || InPass()) return false;
  const int ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(max_wait), 0, std::numeric_limits<int>::max()));
  if (!pass_mu_.TryLock()) {
    // Taken (the progress thread, or another consumer): sleep until the
    // caller's state changes or the worker is let go, then try again.
    if (!Want(wake_fd, true)) return false;
    if (!pass_mu_.TryLock()) {  // (let go meanwhile?)
      pollfd pfd = {wake_fd, POLLIN, 0};
      if (poll(&pfd, 1, ms) > 0) EventFd::ClearFd(wake_fd);
      Want(wake_fd, false);
      return true;
    }
    Want(wake_fd, false);
  }
  if (!BeginPass(/*driven=*/true)) {
    Release();  // stopped (consumers waiting for the worker learn it)
    return false;
  }
  bool slept = false;
  // Armed without a progress call first (each one epoll_waits every tcp
  // interface): the worker's fd is level-triggered, so events that came
  // since the last pass end the sleep at once, and they are progressed
  // after it.
  if (!RunPosted(false) && EndPass()) {
    // Nothing posted: sleep here, on the fds the progress thread would
    // sleep on, the worker's taken out of its set meanwhile so that a
    // reply wakes only this thread (a progress thread woken anyway waits
    // for the worker, then finds nothing to do). post_ stays in its set:
    // work posted while a consumer drives is rare across processes (a
    // request made on another thread), and each epoll_ctl is a system
    // call on every sleep.
    WatchSleeperFds(EPOLL_CTL_DEL, /*post_too=*/false);
    slept = true;
    pollfd pfds[3] = {{efd_, POLLIN, 0}, {post_.fd(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    poll(pfds, wake_fd >= 0 ? 3 : 2, ms);
    if (wake_fd >= 0 && (pfds[2].revents & POLLIN)) EventFd::ClearFd(wake_fd);
    {
      absl::MutexLock l(&mu_);
      TakePostWakeupLocked();
      pass_running_ = true;
    }
    Progress(false);
  }
  while (!EndPass()) Progress(false);
  // Armed and drained: the progress thread wakes for what comes next.
  if (slept) WatchSleeperFds(EPOLL_CTL_ADD, /*post_too=*/false);
  Release();
  return true;
}

void Worker::Loop() {
  while (true) {
    pass_mu_.Lock();
    if (!BeginPass()) {
      Release();  // stopped (consumers waiting for the worker learn it)
      break;
    }
    bool ticks = true;
    do {
      Progress(ticks);
      ticks = false;
    } while (!busy_poll_ && !EndPass());
    // (Busy-polling, pass_running_ stays true: nobody sleeps, so Post
    // never wakes anyone.)
    Release();
    if (busy_poll_) continue;
    // Bounded: Post and stop wake it anyway; the ticks run at least this
    // often.
    // Woken by post_, it leaves the wake-up for the pass it begins next
    // (BeginPass takes it), or for a consumer that holds the worker
    // meanwhile and sleeps on post_ itself (Drive).
    epoll_event events[2];
    const int ready = epoll_wait(epfd_, events, 2, 100);
    absl::MutexLock l(&mu_);
    // The sleep ran out with work posted meanwhile and no pass to run it: a
    // Post that did not wake it (never expected; counted for the tests).
    if (ready == 0 && !posted_.empty() && !pass_running_) ++missed_wakeups_;
  }
  // Drain what is still posted so completions and closes run.
  absl::MutexLock pass(&pass_mu_);
  t_pass_of = this;
  for (int i = 0; i < 100 && ucp_worker_progress(h_) != 0; ++i) {
  }
  t_pass_of = nullptr;
}

absl::Status SetAmHandler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb,
                          void* arg) {
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = id;
  hp.cb = cb;
  hp.arg = arg;
  ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &hp);
  return s == UCS_OK ? absl::OkStatus() : UcsError(s, "ucp_worker_set_am_recv_handler");
}

namespace {
// Endpoint parameters with peer error handling: `on_error(arg, ...)` when
// the peer dies or the connection fails. Both sides' endpoints use it.
ucp_ep_params_t PeerErrorHandlingParams(ucp_err_handler_cb_t on_error, void* arg) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_error;
  p.err_handler.arg = arg;
  return p;
}
}  // namespace

absl::StatusOr<ucp_ep_h> ConnectEndpoint(ucp_worker_h worker, const std::string& host_port,
                                         ucp_err_handler_cb_t on_error, void* arg) {
  sockaddr_storage ss;
  socklen_t len;
  SLUICE_RETURN_IF_ERROR(ParseSockaddr(host_port, &ss, &len));
  ucp_ep_params_t p = PeerErrorHandlingParams(on_error, arg);
  p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  p.sockaddr.addrlen = len;
  ucp_ep_h ep = nullptr;
  ucs_status_t s = ucp_ep_create(worker, &p, &ep);
  if (s != UCS_OK) return UcsPeerError(s, absl::StrCat("ucx connect to ", host_port));
  return ep;
}

absl::StatusOr<ucp_ep_h> AcceptEndpoint(ucp_worker_h worker, ucp_conn_request_h request,
                                        ucp_err_handler_cb_t on_error, void* arg) {
  ucp_ep_params_t p = PeerErrorHandlingParams(on_error, arg);
  p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = request;
  ucp_ep_h ep = nullptr;
  ucs_status_t s = ucp_ep_create(worker, &p, &ep);
  if (s != UCS_OK) return UcsPeerError(s, "ucx accept");
  return ep;
}

std::string DescribeLanes(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return "";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string text(buf, len);
  std::free(buf);
  // Lines "#   lane[0]:  3:posix/memory.0 md[2] -> md[2]/posix/sysdev[255] am am_bw#0
  // keepalive" and "#   lane[2]: cm tcp" (ucp_ep.c, ucp_ep_config_print).
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t at = line.find("lane[");
    if (at == absl::string_view::npos) continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line.substr(line.find(':', at) + 1), ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    // The connection-manager lane carries no data (and UCX 1.13 may print
    // another component's name for it).
    if (words[0] == "cm") continue;
    absl::string_view tl = words[0].substr(words[0].find(':') + 1);
    tl = tl.substr(0, tl.rfind('.'));  // the path index
    std::vector<std::string> roles;
    bool after = false;
    for (absl::string_view w : words) {
      if (absl::StrContains(w, "sysdev[")) {
        after = true;
        continue;
      }
      if (after) roles.emplace_back(w.substr(0, w.find('#')));
    }
    out.push_back(absl::StrCat(tl, "(", absl::StrJoin(roles, " "), ")"));
  }
  return absl::StrJoin(out, " ");
}

void CloseEndpointForce(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
}

bool BusyPollFromEnv() {
  const char* v = std::getenv("SLUICE_UCX_BUSY_POLL");
  return v != nullptr && std::string(v) == "1";
}

absl::Status ParseSockaddr(const std::string& host_port, struct sockaddr_storage* out,
                           socklen_t* len) {
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("address '", host_port, "' has no port"));
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", host_port, "' has a bad port"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  if (out->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(out)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(out)->sin6_port = htons(static_cast<uint16_t>(port));
  }
  return absl::OkStatus();
}

std::string SockaddrToString(const struct sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    return absl::StrCat(buf, ":", ntohs(a->sin_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
  return absl::StrCat("[", buf, "]:", ntohs(a->sin6_port));
}

}  // namespace sluice::internal::ucx
