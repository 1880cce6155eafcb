// The client side of the UCX data plane.
//
// One process-wide UcxClient owns the receive pool, the requests in flight
// and one endpoint per worker address, and uses the process's UCX worker
// and its passes (ucx::Worker::Shared, shared with any in-process
// UcxElementServer; ucx_runtime.h). A UcxElementTransport reads one worker
// over the shared endpoint to its address. GetElementAsync sends a request
// AM (from the calling thread when the worker is free, else posted) and
// returns; the reply's AM handler (in a pass: on the progress thread, or on
// a consumer that drives progress while it waits, DriveUcxClient) takes a
// slot from the pool and
// receives the rendezvous payload straight into it with
// ucp_am_recv_data_nbx and the slot's memh, then runs the request's
// callback there; the decoded Tensors view the slot, which returns to the
// pool when the last of them is dropped. Timers (request deadlines,
// requests held back at the pool's cap, idle endpoints) run on the progress
// thread's loop (Worker::AddTick).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "sluice/rpc/security.h"
#include "sluice/core/frame.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/cuda_runtime.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/ucx_pool.h"
#include "sluice/dataplane/ucx_protocol.h"
#include "sluice/dataplane/transport_registry.h"
#include "sluice/dataplane/ucx_runtime.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace internal {
namespace {

// The receive pool's cap: SetUcxReceivePoolBytes, else
// $SLUICE_UCX_POOL_BYTES, else 1 GiB.
std::atomic<size_t> g_pool_bytes{0};
size_t MaxPoolBytes() {
  size_t v = g_pool_bytes.load();
  if (v != 0) return v;
  const char* env = std::getenv("SLUICE_UCX_POOL_BYTES");
  uint64_t bytes = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &bytes) && bytes > 0) return bytes;
  return size_t{1} << 30;
}

ABSL_CONST_INIT absl::Mutex g_placement_mu(absl::kConstInit);
DataPlanePlacement* g_placement ABSL_GUARDED_BY(g_placement_mu) = nullptr;
bool g_client_created ABSL_GUARDED_BY(g_placement_mu) = false;
// PinUcxReceivePoolForCuda: the runtime to pin the receive pool's arenas
// with (the client applies it when it is created).
const CudaRuntime* g_cuda_pin ABSL_GUARDED_BY(g_placement_mu) = nullptr;
std::atomic<int64_t> g_cuda_pin_failures{0};

SlotPool::Pinner CudaPinner(const CudaRuntime* rt) {
  SlotPool::Pinner p;
  p.pin = [rt](void* data, size_t bytes) {
    const int err = rt->host_register(data, bytes, kCudaHostRegisterPortable);
    if (err == 0) return true;
    if (g_cuda_pin_failures++ == 0) {
      spdlog::warn("sluice client: cudaHostRegister of a {}-byte receive arena failed: {} "
                   "(cudaError {}); it is used unpinned",
                   bytes, rt->get_error_string(err), err);
    }
    return false;
  };
  p.unpin = [rt](void* data) { rt->host_unregister(data); };
  return p;
}

struct UcxCounters {
  std::atomic<int64_t> elements{0}, bytes{0}, copied{0}, connects{0}, silent_endpoints_closed{0};
  PoolStats pool;
};
UcxCounters& Counters() {
  static UcxCounters* c = new UcxCounters();
  return *c;
}

// A request waiting for its reply. Completed exactly once (the first of
// reply, endpoint error, deadline, cancellation wins) from any thread: the
// callback runs on the completing thread, without a lock held.
struct Pending;

// What a transport's requests share with it: its cancellation, and the
// requests not yet completed (for Cancel). Outlives the transport while a
// request holds it.
struct TransportState {
  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::map<Pending*, std::shared_ptr<Pending>> waiting ABSL_GUARDED_BY(mu);
};

class UcxEndpoint;

struct Pending {
  // False if it was completed before.
  bool Complete(absl::StatusOr<ElementResult> r) ABSL_LOCKS_EXCLUDED(mu) {
    ElementCallback cb;
    {
      absl::MutexLock l(&mu);
      if (done) return false;
      done = true;
      cb = std::move(callback);
    }
    std::shared_ptr<TransportState> state = owner;  // `this` may go with the erase
    {
      absl::MutexLock l(&state->mu);
      state->waiting.erase(this);
    }
    cb(std::move(r));
    return true;
  }
  bool Done() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    return done;
  }

  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  ElementCallback callback ABSL_GUARDED_BY(mu);
  std::shared_ptr<TransportState> owner;
  // In a UCX pass only (ucx_runtime.h):
  uint64_t id = 0;                   // request id, once registered
  UcxEndpoint* endpoint = nullptr;   // while registered
  absl::Time deadline;
  std::shared_ptr<SlotPool::Buffer> buffer;
  std::shared_ptr<SlotPool> pool;  // compressed frames decompress into its arenas
  uint16_t kind = 0;        // 0 (one frame), kReplySplitFrame or kReplyBatch
  size_t header_bytes = 0;  // split frame: the inline header in front
  size_t data_size = 0;     // bytes received after header_bytes
  SplitPosition position;   // of a single element
  int64_t seq = -1;         // of the first element
  bool resent = false;      // ElementResult::resent
  uint64_t max_element_bytes = 0;  // a larger reply is refused unreceived
  std::string peer;                // the worker's address, for errors
};

// One UCX endpoint to one worker address, shared by every transport of the
// process to that address (each task of each iteration has a transport):
// connections are made when a worker is first read or comes back, not per
// task. In a UCX pass only, created and destroyed there.
//
// UCX 1.13 asserts in its TCP connection manager (tcp_sockcm_ep.c:416)
// when connections are set up and torn down at a high rate in one process
// (an event queued for a closed socket is replayed on a new one with the
// same fd); reusing endpoints keeps setups to one per worker (re)start.
class UcxEndpoint {
 public:
  explicit UcxEndpoint(std::string address) : address_(std::move(address)) {}
  ~UcxEndpoint() { Fail(absl::CancelledError("endpoint closed")); }

  absl::Status Connect(ucp_worker_h worker) {
    SLUICE_ASSIGN_OR_RETURN(ep_, ucx::ConnectEndpoint(worker, address_, &UcxEndpoint::OnError, this));
    return absl::OkStatus();
  }

  bool usable() const { return ep_ != nullptr && error_.ok(); }
  // The first reply on it: records which transports it uses (wireup is
  // done by then), once.
  void NoteLanes();
  // Known from the first reply on (NoteLanes): UcxRendezvousCopies.
  bool rendezvous_copies() const { return rendezvous_copies_; }
  ucp_ep_h handle() const { return ep_; }
  const std::string& address() const { return address_; }

  void Add(const std::shared_ptr<Pending>& p) {
    p->endpoint = this;
    requests_[p->id] = p;
  }
  void Remove(uint64_t id) { requests_.erase(id); }

  // Fails every request on it and closes it (a dead peer must not leave
  // callers waiting). `forget` drops each from the client's map.
  void Fail(absl::Status error);
  std::function<void(uint64_t)> forget;  // set by the client

 private:
  static void OnError(void* arg, ucp_ep_h, ucs_status_t status);

  const std::string address_;
  ucp_ep_h ep_ = nullptr;
  absl::Status error_;
  std::map<uint64_t, std::shared_ptr<Pending>> requests_;
  bool lanes_noted_ = false;
  bool rendezvous_copies_ = false;
};

void Complete(const std::shared_ptr<Pending>& p, absl::StatusOr<ElementResult> r) {
  p->Complete(std::move(r));
}

ABSL_CONST_INIT absl::Mutex g_lanes_mu(absl::kConstInit);
std::string* g_lanes ABSL_GUARDED_BY(g_lanes_mu) = nullptr;  // TransportStats::ucx_lanes

void UcxEndpoint::NoteLanes() {
  if (lanes_noted_ || ep_ == nullptr) return;
  lanes_noted_ = true;
  std::string lanes = ucx::DescribeLanes(ep_);
  rendezvous_copies_ = UcxRendezvousCopies(lanes);
  absl::MutexLock l(&g_lanes_mu);
  if (g_lanes == nullptr) g_lanes = new std::string();
  *g_lanes = std::move(lanes);
}

void UcxEndpoint::OnError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* self = static_cast<UcxEndpoint*>(arg);
  self->Fail(ucx::UcsPeerError(status, absl::StrCat("ucx endpoint to ", self->address_)));
}

void UcxEndpoint::Fail(absl::Status error) {
  if (error_.ok()) error_ = error;
  auto requests = std::move(requests_);
  requests_.clear();
  for (auto& [id, p] : requests) {
    if (forget) forget(id);
    p->endpoint = nullptr;
    Complete(p, error_);
  }
  if (ep_ != nullptr) {
    ucx::CloseEndpointForce(ep_);
    ep_ = nullptr;
  }
}

class UcxClient;
extern std::atomic<UcxClient*> g_client;

// How long an endpoint nobody uses is kept for the next iteration's tasks,
// and how soon after an endpoint to an address failed a new one is tried.
constexpr absl::Duration kEndpointLinger = absl::Seconds(60);
constexpr absl::Duration kReconnectAfter = absl::Milliseconds(200);

// UcxClient::Get makes the process's one client (g_client) under this,
// or records why it could not (lives for the process).
ABSL_CONST_INIT absl::Mutex g_get_client_mu(absl::kConstInit);
absl::Status* g_client_error ABSL_GUARDED_BY(g_get_client_mu) = nullptr;

class UcxClient {
 public:
  static absl::StatusOr<UcxClient*> Get() ABSL_LOCKS_EXCLUDED(g_get_client_mu) {
    absl::MutexLock l(&g_get_client_mu);
    if (UcxClient* existing = g_client.load()) return existing;
    if (g_client_error != nullptr) return *g_client_error;
    DataPlanePlacement placement;
    {
      absl::MutexLock pl(&g_placement_mu);
      if (g_placement != nullptr) placement = *g_placement;
      g_client_created = true;
    }
    const CudaRuntime* pin = nullptr;
    {
      absl::MutexLock pl(&g_placement_mu);
      pin = g_cuda_pin;
    }
    if (!placement.description.empty()) {
      spdlog::info("sluice client data plane: {}", placement.description);
    }
    auto ctx = ucx::Context::Get();
    absl::StatusOr<std::shared_ptr<ucx::Worker>> worker =
        ctx.ok() ? ucx::Worker::Shared(placement.on_progress_thread_start)
                 : absl::StatusOr<std::shared_ptr<ucx::Worker>>(ctx.status());
    if (!worker.ok()) {
      g_client_error = new absl::Status(worker.status());
      return *g_client_error;
    }
    auto* c = new UcxClient(*ctx, *std::move(worker), std::move(placement));
    absl::Status s;
    c->worker_->Run([&] {
      s = ucx::SetAmHandler(c->worker_->handle(), ucx::kElementAm, &UcxClient::OnReply, c);
    });
    if (!s.ok()) {
      g_client_error = new absl::Status(s);
      return s;
    }
    c->pool_->SetReleaseHook([c] {
      // Requests held back at the pool's cap may go now.
      if (c->deferred_count_.load() > 0) c->worker_->Post([c] { c->SendDeferred(); });
    });
    c->worker_->AddTick([c] { c->Tick(); });
    if (pin != nullptr) c->pool_->PinArenas(CudaPinner(pin));
    g_client.store(c);
    return c;
  }

  ucx::Worker* worker() { return worker_.get(); }
  SlotPool* pool() { return pool_.get(); }

  // In a UCX pass only. The endpoint to `address`: the cached one while
  // it works, else a new one (not within kReconnectAfter of the last
  // failure there: Unavailable then).
  absl::StatusOr<std::shared_ptr<UcxEndpoint>> EndpointFor(const std::string& address) {
    Cached& c = endpoints_[address];
    if (c.endpoint != nullptr && c.endpoint->usable()) return c.endpoint;
    const absl::Time now = absl::Now();
    if (c.endpoint != nullptr) {  // it failed
      c.failed_at = now;
      c.endpoint.reset();
    }
    if (now - c.failed_at < kReconnectAfter) {
      return absl::UnavailableError(absl::StrCat(
          "the ucx endpoint to ", address, " failed less than ",
          absl::FormatDuration(kReconnectAfter), " ago; not reconnecting yet"));
    }
    auto e = std::make_shared<UcxEndpoint>(address);
    e->forget = [this](uint64_t id) { pending_.erase(id); };
    absl::Status s = e->Connect(worker_->handle());
    if (!s.ok()) {
      c.failed_at = now;
      return s;
    }
    Counters().connects++;
    c.endpoint = e;
    return e;
  }

  // In a UCX pass only (ucx_runtime.h): sends `h` (header, token, acks) for `p` on `e`.
  void Send(const std::shared_ptr<UcxEndpoint>& e, const std::shared_ptr<Pending>& p,
            ucx::RequestHeader h, const std::string& tail) {
    h.request_id = next_id_++;
    p->id = h.request_id;
    pending_[p->id] = p;
    e->Add(p);
    // The header, the token, then the acks (ucx_protocol.h); kept until sent.
    auto* hdr = new std::string(sizeof(h), '\0');
    std::memcpy(hdr->data(), &h, sizeof(h));
    hdr->append(tail);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;
    rp.user_data = hdr;
    rp.cb.send = [](void* req, ucs_status_t, void* user_data) {
      delete static_cast<std::string*>(user_data);
      ucp_request_free(req);
    };
    ucs_status_ptr_t st =
        ucp_am_send_nbx(e->handle(), ucx::kGetElementAm, hdr->data(), hdr->size(), nullptr, 0, &rp);
    if (st == nullptr) {
      delete hdr;
    } else if (UCS_PTR_IS_ERR(st)) {
      delete hdr;
      Unregister(p->id);
      Complete(p, ucx::UcsPeerError(UCS_PTR_STATUS(st), "sending a request"));
    }
  }

  // In a UCX pass only (ucx_runtime.h): runs `send` once the receive pool is below its
  // cap (backpressure: the user holds that much), now if it is.
  void WhenPoolHasRoom(std::function<void()> send) {
    if (deferred_.empty() && !pool_->OverCap()) return send();
    deferred_.push_back(std::move(send));
    deferred_count_.store(static_cast<int64_t>(deferred_.size()));
  }

  // In a UCX pass only (ucx_runtime.h): drops `id` from the maps; null if unknown.
  // `replied`: its reply came, so the endpoint's wireup is done (see
  // UcxEndpoint::NoteLanes).
  std::shared_ptr<Pending> Unregister(uint64_t id, bool replied = false) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return nullptr;
    std::shared_ptr<Pending> p = std::move(it->second);
    pending_.erase(it);
    if (p->endpoint != nullptr) {
      if (replied) p->endpoint->NoteLanes();
      p->endpoint->Remove(id);
    }
    p->endpoint = nullptr;
    return p;
  }

 private:
  struct Cached {
    std::shared_ptr<UcxEndpoint> endpoint;
    absl::Time failed_at = absl::InfinitePast();
    absl::Time idle_since = absl::InfiniteFuture();
  };

  UcxClient(std::shared_ptr<ucx::Context> ctx, std::shared_ptr<ucx::Worker> worker,
            DataPlanePlacement placement)
      : pool_(std::make_shared<SlotPool>(ctx, &MaxPoolBytes, &Counters().pool,
                                         std::move(placement))),
        worker_(std::move(worker)) {}

  void SendDeferred() {
    while (!deferred_.empty() && !pool_->OverCap()) {
      auto send = std::move(deferred_.front());
      deferred_.pop_front();
      send();
    }
    deferred_count_.store(static_cast<int64_t>(deferred_.size()));
  }

  // Timers, on every progress loop pass (>= 10 per second): request
  // deadlines, held-back requests, endpoints nobody used for a while.
  void Tick() {
    const absl::Time now = absl::Now();
    if (now - last_tick_ < absl::Milliseconds(20)) return;
    last_tick_ = now;
    SendDeferred();
    std::vector<std::shared_ptr<Pending>> expired;
    for (auto& [id, p] : pending_) {
      if (p->deadline <= now) expired.push_back(p);
    }
    std::set<std::string> silent;
    for (auto& p : expired) {
      const uint64_t id = p->id;
      Unregister(id);
      Complete(p, absl::DeadlineExceededError(
                      absl::StrCat("no reply from worker ", p->peer, " over ucx")));
      silent.insert(p->peer);
    }
    // A worker answers every request within its wait: a connection that
    // left one unanswered past the allowance is not trusted again (UCX can
    // lose a peer without reporting it, e.g. a same-host transport after
    // another peer died). The next request reconnects; the others on it
    // fail now and are retried.
    for (const std::string& peer : silent) {
      auto c = endpoints_.find(peer);
      if (c != endpoints_.end() && c->second.endpoint != nullptr) {
        Counters().silent_endpoints_closed++;
        c->second.endpoint->Fail(absl::UnavailableError(absl::StrCat(
            "the ucx connection to worker ", peer, " left a request unanswered; reconnecting")));
      }
    }
    for (auto it = endpoints_.begin(); it != endpoints_.end();) {
      Cached& c = it->second;
      const bool unused = c.endpoint == nullptr || c.endpoint.use_count() == 1;
      if (!unused) {
        c.idle_since = absl::InfiniteFuture();
      } else if (c.idle_since == absl::InfiniteFuture()) {
        c.idle_since = now;
      }
      if (unused && now - c.idle_since > kEndpointLinger) {
        it = endpoints_.erase(it);  // closes it
      } else {
        ++it;
      }
    }
  }

  static absl::Status BadReply(absl::string_view what) {
    return absl::DataLossError(absl::StrCat("worker sent a bad element: ", what));
  }

  // Where a compressed frame of a reply decompresses: an arena of the
  // receive pool (registered, CUDA-pinned when asked), as an uncompressed
  // element lands; the heap when the pool has no room within its cap.
  static DecompressAllocator ArenaDecompressor(const std::shared_ptr<SlotPool>& pool) {
    if (pool == nullptr) return nullptr;
    return [pool](size_t bytes) -> std::shared_ptr<uint8_t> {
      std::shared_ptr<SlotPool::Buffer> b = pool->TryAcquireInArena(bytes);
      if (b == nullptr) return nullptr;
      uint8_t* data = b->data;
      return std::shared_ptr<uint8_t>(std::move(b), data);
    };
  }

  // Decodes the batch blob in `buffer` (see ucx_protocol.h) in place.
  static absl::Status DecodeBatch(const std::shared_ptr<SlotPool::Buffer>& buffer, size_t size,
                                  uint64_t max_element_bytes, const DecompressAllocator& alloc,
                                  ElementResult* r) {
    const uint8_t* data = buffer->data;
    ucx::BatchHeader bh;
    if (size < sizeof(bh)) return BadReply("batch shorter than its header");
    std::memcpy(&bh, data, sizeof(bh));
    if (bh.magic != ucx::kBatchMagic || bh.count == 0 || bh.count > ucx::kMaxBatchElements ||
        sizeof(bh) + uint64_t{bh.count} * sizeof(ucx::BatchEntry) > size) {
      return BadReply(absl::StrCat("malformed batch header (", bh.count, " elements in ", size,
                                   " bytes)"));
    }
    r->elements.reserve(bh.count);
    for (uint32_t i = 0; i < bh.count; ++i) {
      ucx::BatchEntry e;
      std::memcpy(&e, data + sizeof(bh) + i * sizeof(e), sizeof(e));
      if (e.offset % 64 != 0 || e.offset > size || e.size > size - e.offset) {
        return BadReply(absl::StrCat("batch entry ", i, " lies outside the ", size, "-byte batch"));
      }
      auto decoded = DecodeFrame(data + e.offset, e.size, buffer, max_element_bytes, alloc);
      if (absl::IsResourceExhausted(decoded.status())) return decoded.status();
      if (!decoded.ok()) return BadReply(decoded.status().message());
      r->elements.push_back(std::move(decoded->element));
      SplitPosition pos;
      pos.split_id = e.split_id;
      pos.index = e.split_index;
      if (e.keyed != 0) pos.key = e.key;
      pos.epoch = e.split_epoch;
      pos.begin = e.split_begin;
      pos.end = e.split_end;
      r->positions.push_back(pos);
    }
    return absl::OkStatus();
  }

  // The reply's data is in p->buffer: decode it in place.
  static void Decode(const std::shared_ptr<Pending>& p) {
    ElementResult r;
    const size_t received = p->header_bytes + p->data_size;
    const DecompressAllocator alloc = ArenaDecompressor(p->pool);
    if (p->kind == ucx::kReplyBatch) {
      absl::Status s = DecodeBatch(p->buffer, p->data_size, p->max_element_bytes, alloc, &r);
      if (!s.ok()) return Complete(p, s);
    } else {
      size_t frame_size = received;
      if (p->kind == ucx::kReplySplitFrame) {
        // The payload area's trailing alignment padding was not sent.
        frame_size = p->header_bytes + ucx::AlignUp64(p->data_size);
        std::memset(p->buffer->data + received, 0, frame_size - received);
      }
      auto decoded =
          DecodeFrame(p->buffer->data, frame_size, p->buffer, p->max_element_bytes, alloc);
      if (absl::IsResourceExhausted(decoded.status())) return Complete(p, decoded.status());
      if (!decoded.ok()) return Complete(p, BadReply(decoded.status().message()));
      r.elements.push_back(std::move(decoded->element));
      r.positions.push_back(p->position);
    }
    r.bytes = received;
    r.seq = p->seq;
    r.resent = p->resent;
    Counters().elements += static_cast<int64_t>(r.elements.size());
    Counters().bytes += static_cast<int64_t>(received);
    p->buffer.reset();  // the tensors hold it now
    Complete(p, std::move(r));
  }

  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxClient*>(arg);
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    // Returning UCS_OK without receiving drops the data: UCP itself then
    // answers a rendezvous (ATS) and frees the descriptor. Calling
    // ucp_am_data_release here as well did both twice -- a crash in
    // ucp_am_rndv_process_rts whenever a reply came for a request already
    // cancelled or timed out (ucx_stress_test reproduces it).
    auto drop = [] { return UCS_OK; };
    ucx::ReplyHeader h;
    if (header_length < sizeof(h)) return drop();
    std::memcpy(&h, header, sizeof(h));
    if (h.magic != ucx::kReplyMagic) return drop();
    std::shared_ptr<Pending> p = self->Unregister(h.request_id, /*replied=*/true);
    if (p == nullptr || p->Done()) return drop();  // stale: cancelled or timed out
    const uint8_t* inline_bytes = static_cast<const uint8_t*>(header) + sizeof(h);
    size_t inline_len = std::min<size_t>(h.inline_len, header_length - sizeof(h));
    ucx::SplitRange range{0, 0, 0};
    if (h.flags & ucx::kReplySplitRange) {
      if (inline_len < sizeof(range)) {
        Complete(p, BadReply("a split range flagged but not sent"));
        return drop();
      }
      inline_len -= sizeof(range);
      std::memcpy(&range, inline_bytes + inline_len, sizeof(range));
    }
    if (h.flags & ucx::kReplyError) {
      std::string msg(reinterpret_cast<const char*>(inline_bytes), inline_len);
      Complete(p, absl::Status(static_cast<absl::StatusCode>(h.code), msg));
      return drop();
    }
    if (h.flags & (ucx::kReplyEndOfSequence | ucx::kReplyNotReady)) {
      ElementResult r;
      r.end_of_sequence = h.flags & ucx::kReplyEndOfSequence;
      r.not_ready = h.flags & ucx::kReplyNotReady;
      if (r.end_of_sequence) r.seq = h.seq;
      Complete(p, std::move(r));
      return drop();
    }
    if (length > p->max_element_bytes) {
      // Never allocate what a (bogus or hostile) reply claims beyond the
      // limit; the data is released unreceived.
      Complete(p, absl::ResourceExhaustedError(absl::StrCat(
                      "worker ", p->peer, " sent a ", length,
                      "-byte element reply; this client accepts at most ", p->max_element_bytes,
                      " (DistributeOptions::max_element_bytes)")));
      return drop();
    }
    p->kind = h.flags & (ucx::kReplySplitFrame | ucx::kReplyBatch);
    p->resent = h.flags & ucx::kReplyResent;
    if (p->kind == (ucx::kReplySplitFrame | ucx::kReplyBatch) ||
        (p->kind == ucx::kReplySplitFrame && (inline_len == 0 || inline_len % 64 != 0))) {
      Complete(p, BadReply("inconsistent reply flags"));
      return drop();
    }
    p->header_bytes = p->kind == ucx::kReplySplitFrame ? inline_len : 0;
    p->position = {h.split_id, h.split_index,
                   (h.flags & ucx::kReplyKeyed) != 0 ? std::optional<uint64_t>(h.key)
                                                     : std::nullopt,
                   range.epoch, range.begin, range.end};
    p->seq = h.seq;
    p->data_size = length;
    auto buffer = self->pool_->Acquire(p->header_bytes + ucx::AlignUp64(length));
    if (!buffer.ok()) {
      Complete(p, buffer.status());
      return drop();
    }
    p->buffer = *std::move(buffer);
    p->pool = self->pool_;
    std::memcpy(p->buffer->data, inline_bytes, p->header_bytes);  // a frame header, not payload
    uint8_t* dest = p->buffer->data + p->header_bytes;
    if (!rndv) {
      // Eager data (a small reply the client asked so, see
      // kRequestEagerSmallReplies): one copy, counted.
      std::memcpy(dest, data, length);
      Counters().copied += static_cast<int64_t>(length);
      Decode(p);
      return UCS_OK;
    }
    struct Ctx {
      std::shared_ptr<Pending> p;
    };
    auto* ctx = new Ctx{p};
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = p->buffer->memh;
    rp.user_data = ctx;
    rp.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
      std::unique_ptr<Ctx> c(static_cast<Ctx*>(user_data));
      if (status == UCS_OK) {
        Decode(c->p);
      } else {
        Complete(c->p, ucx::UcsPeerError(status, "receiving an element"));
      }
      ucp_request_free(request);
    };
    ucs_status_ptr_t st = ucp_am_recv_data_nbx(self->worker_->handle(), data, dest, length, &rp);
    if (st == nullptr) {  // completed in place
      delete ctx;
      Decode(p);
    } else if (UCS_PTR_IS_ERR(st)) {
      delete ctx;
      Complete(p, ucx::UcsPeerError(UCS_PTR_STATUS(st), "ucp_am_recv_data_nbx"));
    }
    return UCS_INPROGRESS;
  }

  std::shared_ptr<SlotPool> pool_;
  std::shared_ptr<ucx::Worker> worker_;  // the process's (ucx::Worker::Shared)
  // In a UCX pass only (ucx_runtime.h):
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;  // registered requests
  // Starts at random: a worker that sent a reply on a recycled endpoint
  // handle, or any stray reply, finds no request of this process with its
  // id rather than another client's request with the same number.
  uint64_t next_id_ = (uint64_t{std::random_device{}()} << 32 | std::random_device{}()) >> 1;
  std::map<std::string, Cached> endpoints_;
  std::deque<std::function<void()>> deferred_;  // held back at the pool's cap
  absl::Time last_tick_ = absl::InfinitePast();
  std::atomic<int64_t> deferred_count_{0};
};

std::atomic<UcxClient*> g_client{nullptr};

// A transport to one worker address, over the process's shared endpoint to
// it (reconnected on the next request after a failure, so a worker that
// restarts at the same address is read again).
class UcxElementTransport final : public ElementTransport {
 public:
  static absl::StatusOr<std::unique_ptr<ElementTransport>> Connect(const std::string& address,
                                                                   const std::string& token,
                                                                   int64_t max_element_bytes,
                                                                   EagerReplies eager) {
    if (token.size() > kMaxAuthTokenBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth token longer than ", kMaxAuthTokenBytes, " bytes"));
    }
    if (max_element_bytes <= 0) {
      return absl::InvalidArgumentError("max_element_bytes must be > 0");
    }
    sockaddr_storage ss;
    socklen_t len;
    SLUICE_RETURN_IF_ERROR(ucx::ParseSockaddr(address, &ss, &len));
    SLUICE_ASSIGN_OR_RETURN(UcxClient * client, UcxClient::Get());
    // The endpoint is taken (or made) by the first request.
    return std::unique_ptr<ElementTransport>(new UcxElementTransport(
        client, address, token, max_element_bytes, eager));
  }

  ~UcxElementTransport() override {
    Cancel();
    // Every callback ran (those posted are before this in the queue); the
    // endpoint is released in a pass, where it lives.
    UcxElementTransport* raw = this;
    client_->worker()->Run([raw] { raw->endpoint_.reset(); });
  }

  void GetElementAsync(const ElementRequest& request, ElementCallback done) override {
    auto p = std::make_shared<Pending>();
    p->owner = state_;
    p->max_element_bytes = static_cast<uint64_t>(max_element_bytes_);
    p->peer = address_;
    p->deadline = absl::Now() + request.wait + request.transfer_allowance;
    bool cancelled;
    {
      absl::MutexLock l(&state_->mu);
      cancelled = state_->cancelled;
      if (!cancelled) {
        absl::MutexLock pl(&p->mu);
        p->callback = std::move(done);
        state_->waiting.emplace(p.get(), p);
      }
    }
    if (cancelled) return done(absl::CancelledError("transport cancelled"));
    ucx::RequestHeader h{};
    h.magic = ucx::kRequestMagic;
    h.version = ucx::kProtocolVersion;
    h.task_id = request.task_id;
    h.consumer_index = request.consumer_index;
    h.round = request.round;
    h.wait_ms = absl::ToInt64Milliseconds(request.wait);
    h.max_elements = static_cast<uint32_t>(
        std::clamp<int64_t>(request.max_elements, 1, ucx::kMaxBatchElements));
    h.max_bytes = static_cast<uint32_t>(
        std::clamp<int64_t>(request.max_bytes, 0, std::numeric_limits<uint32_t>::max()));
    h.max_outstanding = static_cast<uint16_t>(
        std::clamp<int64_t>(request.max_outstanding, 1, std::numeric_limits<uint16_t>::max()));
    h.flags = (request.shared_job ? ucx::kRequestSharedJob : 0) |
              (eager_ == EagerReplies::kAlways ? ucx::kRequestEagerSmallReplies : 0);
    h.client_id = request.client_id;
    h.delivered_seq = request.delivered_seq;
    if (request.resend) h.flags |= ucx::kRequestResend;
    if (request.leaving) h.flags |= ucx::kRequestLeaving;
    if (request.compression == FrameCodec::kLz4) h.flags |= ucx::kRequestLz4;
    if (request.compression == FrameCodec::kZstd) h.flags |= ucx::kRequestZstd;
    h.token_len = static_cast<uint16_t>(token_.size());
    h.ack_count = static_cast<uint16_t>(std::min(request.acks.size(), kMaxAcksPerRequest));
    std::string tail = token_;
    for (uint32_t i = 0; i < h.ack_count; ++i) {
      const ucx::AckEntry a{request.acks[i].split_id, request.acks[i].count};
      tail.append(reinterpret_cast<const char*>(&a), sizeof(a));
    }
    UcxElementTransport* raw = this;
    UcxClient* client = client_;
    // `raw` outlives the closures: its destructor's Run() comes after them.
    auto send = [raw, client, p, h, tail = std::move(tail)]() mutable {
      if (p->Done()) return;  // cancelled while held back
      if (raw->endpoint_ == nullptr || !raw->endpoint_->usable()) {
        auto e = client->EndpointFor(raw->address_);
        if (!e.ok()) return Complete(p, e.status());
        raw->endpoint_ = *std::move(e);
      }
      if (raw->eager_ == EagerReplies::kAuto && raw->endpoint_->rendezvous_copies()) {
        h.flags |= ucx::kRequestEagerSmallReplies;
      }
      client->Send(raw->endpoint_, p, h, tail);
    };
    // Sent from this thread when the worker is free (no wake-up of the
    // progress thread for each request).
    client->worker()->RunHereOrPost([client, send = std::move(send),
                                     leaving = request.leaving]() mutable {
      // A consumer that leaves gets no elements back: its goodbye needs no
      // room in the receive pool, which its own buffered elements may fill.
      if (leaving) return send();
      client->WhenPoolHasRoom(std::move(send));
    });
  }

  void Cancel() override {
    std::vector<std::shared_ptr<Pending>> waiting;
    {
      absl::MutexLock l(&state_->mu);
      state_->cancelled = true;
      for (auto& [raw, p] : state_->waiting) waiting.push_back(p);
    }
    // Complete() takes state_->mu itself.
    for (auto& p : waiting) p->Complete(absl::CancelledError("transport cancelled"));
  }

  std::string protocol() const override { return "ucx"; }

 private:
  UcxElementTransport(UcxClient* client, std::string address, std::string token,
                      int64_t max_element_bytes, EagerReplies eager)
      : client_(client), address_(std::move(address)), token_(std::move(token)),
        max_element_bytes_(max_element_bytes), eager_(eager),
        state_(std::make_shared<TransportState>()) {}

  UcxClient* const client_;
  const std::string address_;
  const std::string token_;  // sent in every request; empty: none
  const int64_t max_element_bytes_;
  const EagerReplies eager_;  // see MakeUcxElementTransport
  const std::shared_ptr<TransportState> state_;
  std::shared_ptr<UcxEndpoint> endpoint_;  // in a UCX pass only
};

}  // namespace

bool DriveUcxClient(absl::Duration max_wait, int wake_fd) {
  UcxClient* c = g_client.load();
  return c != nullptr && c->worker()->Drive(max_wait, wake_fd);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<ElementTransport>> MakeUcxElementTransport(
    const std::string& address, const std::string& auth_token, int64_t max_element_bytes,
    EagerReplies eager) {
  return internal::UcxElementTransport::Connect(address, auth_token, max_element_bytes, eager);
}

void SetClientDataPlanePlacement(DataPlanePlacement placement) {
  absl::MutexLock l(&internal::g_placement_mu);
  if (internal::g_client_created) {
    spdlog::info("sluice client data plane: placement already fixed; ignoring '{}'",
                 placement.description);
    return;
  }
  if (internal::g_placement == nullptr) {
    internal::g_placement = new DataPlanePlacement(std::move(placement));
  }
}

absl::Status PinUcxReceivePoolForCuda() {
  {
    // Every iterator with cuda_pinned=auto asks: once on, ask CUDA no more.
    absl::MutexLock l(&internal::g_placement_mu);
    if (internal::g_cuda_pin != nullptr) return absl::OkStatus();
  }
  SLUICE_ASSIGN_OR_RETURN(const internal::CudaRuntime* rt, internal::UsableCudaRuntime());
  {
    absl::MutexLock l(&internal::g_placement_mu);
    if (internal::g_cuda_pin != nullptr) return absl::OkStatus();
    internal::g_cuda_pin = rt;
  }
  spdlog::info("sluice client: receive arenas page-locked for CUDA ({})", rt->library);
  // A client made before applies it now (one made after, at its creation).
  if (internal::UcxClient* client = internal::g_client.load()) {
    client->pool()->PinArenas(internal::CudaPinner(rt));
  }
  return absl::OkStatus();
}

absl::Status SetUcxReceivePoolBytes(size_t bytes) {
  if (bytes < (size_t{1} << 20)) {
    return absl::InvalidArgumentError("the UCX receive pool needs at least 1 MiB");
  }
  internal::g_pool_bytes.store(bytes);
  return absl::OkStatus();
}

TransportStats GetTransportStats() {
  auto& c = internal::Counters();
  TransportStats s;
  s.ucx_elements_received = c.elements.load();
  s.ucx_endpoints_connected = c.connects.load();
  s.ucx_silent_endpoints_closed = c.silent_endpoints_closed.load();
  s.ucx_bytes_received = c.bytes.load();
  s.client_payload_bytes_copied = c.copied.load();
  s.dedicated_buffer_allocations = c.pool.dedicated.load();
  s.pool_buffers_in_use = c.pool.in_use.load();
  s.pool_high_water_mark = c.pool.high_water.load();
  s.worker_frames_in_registered_memory = internal::WorkerFramesRegistered();
  s.worker_zero_copy_payloads = internal::WorkerZeroCopyPayloads();
  s.worker_batched_replies = internal::WorkerBatchedReplies();
  s.worker_ucx_send_errors = internal::WorkerUcxSendErrors();
  s.pool_arenas_verified_on_node = internal::ArenasVerified().load();
  s.pool_arenas_misplaced = internal::ArenasMisplaced().load();
  if (internal::UcxClient* client = internal::g_client.load()) {
    s.receive_pool_registered_bytes = static_cast<int64_t>(client->pool()->registered_bytes());
    s.receive_pool_over_cap = client->pool()->OverCap();
    s.receive_pool_cuda_pinned_bytes = static_cast<int64_t>(client->pool()->pinned_bytes());
    s.ucx_consumer_driven_passes = client->worker()->driven_passes();
  }
  s.cuda_pin_failures = internal::g_cuda_pin_failures.load();
  {
    absl::MutexLock l(&internal::g_lanes_mu);
    if (internal::g_lanes != nullptr) s.ucx_lanes = *internal::g_lanes;
  }
  return s;
}

}  // namespace sluice
