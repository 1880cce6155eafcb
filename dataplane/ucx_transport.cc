// The client side of the UCX data plane.
//
// One process-wide UcxClient owns the receive pool and uses the process's
// UCX worker and progress thread (ucx::Worker::Shared, shared with any
// in-process UcxElementServer). Each UcxElementTransport is one endpoint to one
// worker. A GetElement call posts a request AM and waits; the reply's AM
// handler (progress thread) takes a slot from the pool and receives the
// rendezvous payload straight into it with ucp_am_recv_data_nbx and the
// slot's memh; the decoded Tensors view the slot, which returns to the pool
// when the last of them is dropped.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "sluice/control/security.h"
#include "sluice/core/frame.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/ucx_pool.h"
#include "sluice/dataplane/ucx_protocol.h"
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

absl::Mutex g_placement_mu;
DataPlanePlacement* g_placement ABSL_GUARDED_BY(g_placement_mu) = nullptr;
bool g_client_created ABSL_GUARDED_BY(g_placement_mu) = false;

struct UcxCounters {
  std::atomic<int64_t> elements{0}, bytes{0}, copied{0};
  PoolStats pool;
};
UcxCounters& Counters() {
  static UcxCounters* c = new UcxCounters();
  return *c;
}

// A request waiting for its reply. Completed exactly once (the first of
// reply, endpoint error, cancellation wins); any thread may complete it.
struct Pending {
  bool Complete(absl::StatusOr<ElementResult> r) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    if (done) return false;
    result = std::move(r);
    done = true;
    return true;
  }
  // True if completed within `timeout`.
  bool Wait(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    auto is_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; };
    return mu.AwaitWithTimeout(absl::Condition(&is_done), timeout);
  }
  absl::StatusOr<ElementResult> Take() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    return std::move(result);
  }

  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<ElementResult> result ABSL_GUARDED_BY(mu) = absl::UnknownError("no reply");
  // Progress thread only:
  uint64_t id = 0;  // request id, once registered
  std::shared_ptr<SlotPool::Buffer> buffer;
  uint16_t kind = 0;        // 0 (one frame), kReplySplitFrame or kReplyBatch
  size_t header_bytes = 0;  // split frame: the inline header in front
  size_t data_size = 0;     // bytes received after header_bytes
  SplitPosition position;   // of a single element
  int64_t seq = -1;         // of the first element
  uint64_t max_element_bytes = 0;  // a larger reply is refused unreceived
  std::string peer;                // the worker's address, for errors
};

class UcxClient;
extern std::atomic<UcxClient*> g_client;

class UcxClient {
 public:
  static absl::StatusOr<UcxClient*> Get() {
    static absl::Mutex mu;
    static UcxClient* client = nullptr;  // lives for the process
    static absl::Status* error = nullptr;
    absl::MutexLock l(&mu);
    if (client != nullptr) return client;
    if (error != nullptr) return *error;
    DataPlanePlacement placement;
    {
      absl::MutexLock pl(&g_placement_mu);
      if (g_placement != nullptr) placement = *g_placement;
      g_client_created = true;
    }
    if (!placement.description.empty()) {
      spdlog::info("sluice client data plane: {}", placement.description);
    }
    auto ctx = ucx::Context::Get();
    absl::StatusOr<std::shared_ptr<ucx::Worker>> worker =
        ctx.ok() ? ucx::Worker::Shared(placement.on_progress_thread_start)
                 : absl::StatusOr<std::shared_ptr<ucx::Worker>>(ctx.status());
    if (!worker.ok()) {
      error = new absl::Status(worker.status());
      return *error;
    }
    auto* c = new UcxClient(*ctx, *std::move(worker), std::move(placement));
    absl::Status s;
    c->worker_->Run([&] {
      s = ucx::SetAmHandler(c->worker_->handle(), ucx::kElementAm, &UcxClient::OnReply, c);
    });
    if (!s.ok()) {
      error = new absl::Status(s);
      return s;
    }
    client = c;
    g_client.store(c);
    return client;
  }

  ucx::Worker* worker() { return worker_.get(); }
  SlotPool* pool() { return pool_.get(); }

  // Progress thread only.
  uint64_t Register(std::shared_ptr<Pending> p) {
    uint64_t id = next_id_++;
    pending_[id] = std::move(p);
    return id;
  }
  void Forget(uint64_t id) { pending_.erase(id); }

 private:
  UcxClient(std::shared_ptr<ucx::Context> ctx, std::shared_ptr<ucx::Worker> worker,
            DataPlanePlacement placement)
      : pool_(std::make_shared<SlotPool>(ctx, &MaxPoolBytes, &Counters().pool,
                                         std::move(placement))),
        worker_(std::move(worker)) {}

  static void Complete(const std::shared_ptr<Pending>& p, absl::StatusOr<ElementResult> r) {
    p->Complete(std::move(r));
  }

  static absl::Status BadReply(absl::string_view what) {
    return absl::DataLossError(absl::StrCat("worker sent a bad element: ", what));
  }

  // Decodes the batch blob in `buffer` (see ucx_protocol.h) in place.
  static absl::Status DecodeBatch(const std::shared_ptr<SlotPool::Buffer>& buffer, size_t size,
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
      auto decoded = DecodeFrame(data + e.offset, e.size, buffer);
      if (!decoded.ok()) return BadReply(decoded.status().message());
      r->elements.push_back(std::move(decoded->element));
      r->positions.push_back({e.split_id, e.split_index});
    }
    return absl::OkStatus();
  }

  // The reply's data is in p->buffer: decode it in place.
  static void Decode(const std::shared_ptr<Pending>& p) {
    ElementResult r;
    const size_t received = p->header_bytes + p->data_size;
    if (p->kind == ucx::kReplyBatch) {
      absl::Status s = DecodeBatch(p->buffer, p->data_size, &r);
      if (!s.ok()) return Complete(p, s);
    } else {
      size_t frame_size = received;
      if (p->kind == ucx::kReplySplitFrame) {
        // The payload area's trailing alignment padding was not sent.
        frame_size = p->header_bytes + ucx::AlignUp64(p->data_size);
        std::memset(p->buffer->data + received, 0, frame_size - received);
      }
      auto decoded = DecodeFrame(p->buffer->data, frame_size, p->buffer);
      if (!decoded.ok()) return Complete(p, BadReply(decoded.status().message()));
      r.elements.push_back(std::move(decoded->element));
      r.positions.push_back(p->position);
    }
    r.bytes = received;
    r.seq = p->seq;
    Counters().elements += static_cast<int64_t>(r.elements.size());
    Counters().bytes += static_cast<int64_t>(received);
    p->buffer.reset();  // the tensors hold it now
    Complete(p, std::move(r));
  }

  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxClient*>(arg);
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    auto drop = [&] {
      if (rndv) ucp_am_data_release(self->worker_->handle(), data);
      return UCS_OK;
    };
    ucx::ReplyHeader h;
    if (header_length < sizeof(h)) return drop();
    std::memcpy(&h, header, sizeof(h));
    auto it = self->pending_.find(h.request_id);
    if (h.magic != ucx::kReplyMagic || it == self->pending_.end()) {
      return drop();  // stale (the caller gave up) or malformed
    }
    std::shared_ptr<Pending> p = std::move(it->second);
    self->pending_.erase(it);
    const uint8_t* inline_bytes = static_cast<const uint8_t*>(header) + sizeof(h);
    const size_t inline_len = std::min<size_t>(h.inline_len, header_length - sizeof(h));
    if (h.flags & ucx::kReplyError) {
      std::string msg(reinterpret_cast<const char*>(inline_bytes), inline_len);
      Complete(p, absl::Status(static_cast<absl::StatusCode>(h.code), msg));
      return drop();
    }
    if (h.flags & (ucx::kReplyEndOfSequence | ucx::kReplyNotReady)) {
      ElementResult r;
      r.end_of_sequence = h.flags & ucx::kReplyEndOfSequence;
      r.not_ready = h.flags & ucx::kReplyNotReady;
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
    if (p->kind == (ucx::kReplySplitFrame | ucx::kReplyBatch) ||
        (p->kind == ucx::kReplySplitFrame && (inline_len == 0 || inline_len % 64 != 0))) {
      Complete(p, BadReply("inconsistent reply flags"));
      return drop();
    }
    p->header_bytes = p->kind == ucx::kReplySplitFrame ? inline_len : 0;
    p->position = {h.split_id, h.split_index};
    p->seq = h.seq;
    p->data_size = length;
    auto buffer = self->pool_->Acquire(p->header_bytes + ucx::AlignUp64(length));
    if (!buffer.ok()) {
      Complete(p, buffer.status());
      return drop();
    }
    p->buffer = *std::move(buffer);
    std::memcpy(p->buffer->data, inline_bytes, p->header_bytes);  // a frame header, not payload
    uint8_t* dest = p->buffer->data + p->header_bytes;
    if (!rndv) {
      // Eager data (the worker did not use rendezvous): one copy, counted.
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
        Complete(c->p, ucx::UcsError(status, "receiving an element"));
      }
      ucp_request_free(request);
    };
    ucs_status_ptr_t st = ucp_am_recv_data_nbx(self->worker_->handle(), data, dest, length, &rp);
    if (st == nullptr) {  // completed in place
      delete ctx;
      Decode(p);
    } else if (UCS_PTR_IS_ERR(st)) {
      delete ctx;
      Complete(p, ucx::UcsError(UCS_PTR_STATUS(st), "ucp_am_recv_data_nbx"));
    }
    return UCS_INPROGRESS;
  }

  std::shared_ptr<SlotPool> pool_;
  std::shared_ptr<ucx::Worker> worker_;  // the process's (ucx::Worker::Shared)
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;  // progress thread only
  uint64_t next_id_ = 1;                                 // progress thread only
};

std::atomic<UcxClient*> g_client{nullptr};

class UcxElementTransport final : public ElementTransport {
 public:
  static absl::StatusOr<std::unique_ptr<ElementTransport>> Connect(const std::string& address,
                                                                   const std::string& token,
                                                                   int64_t max_element_bytes) {
    if (token.size() > kMaxAuthTokenBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth token longer than ", kMaxAuthTokenBytes, " bytes"));
    }
    if (max_element_bytes <= 0) {
      return absl::InvalidArgumentError("max_element_bytes must be > 0");
    }
    SLUICE_ASSIGN_OR_RETURN(UcxClient * client, UcxClient::Get());
    sockaddr_storage ss;
    socklen_t len;
    absl::Status ps = ucx::ParseSockaddr(address, &ss, &len);
    if (!ps.ok()) return ps;
    std::unique_ptr<UcxElementTransport> t(
        new UcxElementTransport(client, address, token, max_element_bytes));
    absl::Status status;
    UcxElementTransport* raw = t.get();
    client->worker()->Run([&] {
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                     UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
      p.sockaddr.addrlen = len;
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = &UcxElementTransport::OnError;
      p.err_handler.arg = raw;
      ucs_status_t s = ucp_ep_create(client->worker()->handle(), &p, &raw->ep_);
      if (s != UCS_OK) status = ucx::UcsError(s, absl::StrCat("ucx connect to ", address));
    });
    if (!status.ok()) return status;
    return std::unique_ptr<ElementTransport>(std::move(t));
  }

  ~UcxElementTransport() override {
    Cancel();
    UcxElementTransport* raw = this;
    client_->worker()->Run([raw] {
      if (raw->ep_ != nullptr) {
        ucx::CloseEndpointForce(raw->ep_);
        raw->ep_ = nullptr;
      }
      // Requests still registered complete as cancelled.
      for (auto& [id, p] : raw->mine_) {
        raw->client_->Forget(id);
        p->Complete(absl::CancelledError("transport closed"));
      }
      raw->mine_.clear();
    });
  }

  absl::StatusOr<ElementResult> GetElement(const ElementRequest& request) override {
    // Backpressure: while the receive pool is at its cap (the user holds
    // that much), wait for buffers to come back before asking for more.
    while (client_->pool()->OverCap()) {
      {
        absl::MutexLock l(&mu_);
        if (cancelled_) return absl::CancelledError("transport cancelled");
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    auto p = std::make_shared<Pending>();
    p->max_element_bytes = static_cast<uint64_t>(max_element_bytes_);
    p->peer = address_;
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return absl::CancelledError("transport cancelled");
      waiting_.insert(p.get());
    }
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
    h.flags = request.shared_job ? ucx::kRequestSharedJob : 0;
    h.client_id = request.client_id;
    h.token_len = static_cast<uint16_t>(token_.size());
    h.ack_count = static_cast<uint16_t>(std::min(request.acks.size(), kMaxAcksPerRequest));
    std::string acks(h.ack_count * sizeof(ucx::AckEntry), '\0');
    for (uint32_t i = 0; i < h.ack_count; ++i) {
      const ucx::AckEntry a{request.acks[i].split_id, request.acks[i].count};
      std::memcpy(acks.data() + i * sizeof(a), &a, sizeof(a));
    }
    UcxElementTransport* raw = this;
    client_->worker()->Post([raw, p, h, acks = std::move(acks)]() mutable {
      if (raw->ep_ == nullptr || !raw->error_.ok()) {
        p->Complete(raw->error_.ok() ? absl::UnavailableError("endpoint closed") : raw->error_);
        return;
      }
      h.request_id = raw->client_->Register(p);
      p->id = h.request_id;
      raw->mine_[h.request_id] = p;
      // The header, the token, then the acks (ucx_protocol.h); kept until sent.
      auto* hdr = new std::string(sizeof(h) + raw->token_.size(), '\0');
      std::memcpy(hdr->data(), &h, sizeof(h));
      std::memcpy(hdr->data() + sizeof(h), raw->token_.data(), raw->token_.size());
      hdr->append(acks);
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS;
      rp.flags = UCP_AM_SEND_FLAG_REPLY;
      rp.user_data = hdr;
      rp.cb.send = [](void* req, ucs_status_t, void* user_data) {
        delete static_cast<std::string*>(user_data);
        ucp_request_free(req);
      };
      ucs_status_ptr_t st = ucp_am_send_nbx(raw->ep_, ucx::kGetElementAm, hdr->data(),
                                            hdr->size(), nullptr, 0, &rp);
      if (st == nullptr) {
        delete hdr;
      } else if (UCS_PTR_IS_ERR(st)) {
        delete hdr;
        raw->client_->Forget(h.request_id);
        raw->mine_.erase(h.request_id);
        p->Complete(ucx::UcsError(UCS_PTR_STATUS(st), "sending a request"));
      }
    });
    bool got = p->Wait(request.wait + absl::Seconds(30));
    // This request is over for us either way: drop it from the maps (after
    // its registration, which was posted first); a late reply finds nothing
    // and is dropped by the AM handler.
    client_->worker()->Post([raw, p] {
      if (p->id == 0) return;
      raw->mine_.erase(p->id);
      raw->client_->Forget(p->id);
    });
    {
      absl::MutexLock l(&mu_);
      waiting_.erase(p.get());
      if (cancelled_ && !got) return absl::CancelledError("transport cancelled");
    }
    if (!got) {
      return absl::DeadlineExceededError(
          absl::StrCat("no reply from worker ", address_, " over ucx"));
    }
    return p->Take();
  }

  void Cancel() override {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    for (Pending* p : waiting_) p->Complete(absl::CancelledError("transport cancelled"));
  }

  std::string protocol() const override { return "ucx"; }

 private:
  UcxElementTransport(UcxClient* client, std::string address, std::string token,
                      int64_t max_element_bytes)
      : client_(client), address_(std::move(address)), token_(std::move(token)),
        max_element_bytes_(max_element_bytes) {}

  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<UcxElementTransport*>(arg);
    self->error_ = ucx::UcsError(status, absl::StrCat("ucx endpoint to ", self->address_));
    // Fail every request in flight on this endpoint: a dead peer must not
    // leave callers waiting.
    for (auto& [id, p] : self->mine_) {
      self->client_->Forget(id);
      p->Complete(self->error_);
    }
    self->mine_.clear();
    ucx::CloseEndpointForce(ep);
    self->ep_ = nullptr;
  }

  UcxClient* client_;
  const std::string address_;
  const std::string token_;  // sent in every request; empty: none
  const int64_t max_element_bytes_;
  // Progress thread only:
  ucp_ep_h ep_ = nullptr;
  absl::Status error_;
  std::map<uint64_t, std::shared_ptr<Pending>> mine_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Pending*> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<ElementTransport>> MakeUcxElementTransport(
    const std::string& address, const std::string& auth_token, int64_t max_element_bytes) {
  return UcxElementTransport::Connect(address, auth_token, max_element_bytes);
}

}  // namespace internal

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
  }
  return s;
}

}  // namespace sluice
