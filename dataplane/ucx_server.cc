// UcxElementServer. Threads: the process's UCX worker's passes (its
// progress thread, or an in-process consumer driving it; shared with the
// client data plane and other in-process servers: ucx::Worker::Shared; they
// accept connections, receive requests, send replies) and `threads`
// serving threads that call the ElementSource (which may block) and post
// the reply back.
#include "sluice/dataplane/ucx_server.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "sluice/core/frame.h"
#include "sluice/rpc/security_internal.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/ucx_pool.h"
#include "sluice/dataplane/ucx_protocol.h"
#include "sluice/dataplane/ucx_runtime.h"
#include "sluice/dataplane/send_quarantine.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {

using ucx::ReplyHeader;
using ucx::RequestHeader;

namespace {
PoolStats& SendPoolStats() {
  static PoolStats* s = new PoolStats();
  return *s;
}
std::atomic<int64_t> g_registered_frames{0};
std::atomic<int64_t> g_zero_copy_payloads{0};
std::atomic<int64_t> g_batched_replies{0};
std::atomic<int64_t> g_send_errors{0};
size_t SendPoolBytes() { return size_t{512} << 20; }
// Failed rendezvous sends' memory, held for the peers that may still read
// it (send_quarantine.h); released by the servers' tick and by later holds.
SendQuarantine& Quarantine() {
  static SendQuarantine* q = new SendQuarantine();
  return *q;
}
}  // namespace

int64_t WorkerFramesRegistered() { return g_registered_frames.load(); }
int64_t WorkerZeroCopyPayloads() { return g_zero_copy_payloads.load(); }
int64_t WorkerBatchedReplies() { return g_batched_replies.load(); }
int64_t WorkerUcxSendErrors() { return g_send_errors.load(); }
int64_t WorkerUcxSendsQuarantined() { return Quarantine().total_held(); }

std::atomic<int64_t>& ArenasVerified() {
  static std::atomic<int64_t> v{0};
  return v;
}
std::atomic<int64_t>& ArenasMisplaced() {
  static std::atomic<int64_t> v{0};
  return v;
}

namespace {
// Every UcxElementServer of the process shares the process's UCX worker
// (ucx::Worker::Shared), so one AM handler serves them all and finds the
// server by the endpoint a request came on. In a UCX pass only.
//
// A stopped server's listener is not destroyed at once: it keeps
// answering for kListenerGrace first. UCX 1.13 may replay an async event it
// queued for a socket after the socket is gone: its missed-event queue is
// keyed by file descriptor and not purged when a handler is removed (fixed
// upstream in 1.18), so a stale event reaches whatever socket reuses the
// number. Destroying a listener at once crashed in uct_listener_reject when
// in-process servers restarted many times a second
// (tests/dataplane/ucx_stress_test.cc).
//
// Nor does the grace period reject connections: uct_listener_reject arms
// the socket for writing while UCX's async lock is held, sends the refusal
// and closes the socket, so the write event is nearly always left in the
// queue, and when the next accepted connection reuses the descriptor it
// fires on a server endpoint that has sent nothing:
// `tcp_sockcm_ep.c:416 Assertion ... UCT_TCP_SOCKCM_EP_SERVER_CREATED`
// killed a process whose workers stopped while clients reconnected. A
// stopped server instead accepts the connection the usual way and answers
// each request on it with Unavailable ("worker stopped"), which a client
// treats like any worker that went away; the endpoints close with the
// listener.
struct ListenerSlot {
  UcxElementServer::Impl* owner = nullptr;  // null once its server stopped
  ucp_listener_h listener = nullptr;
  absl::Time stopped_at = absl::InfiniteFuture();
  ucp_worker_h worker = nullptr;            // the process's (ucx::Worker::Shared)
  std::string address;                      // for the refusal's message
  std::set<ucp_ep_h> eps;                   // accepted after the server stopped
};
constexpr absl::Duration kListenerGrace = absl::Seconds(2);
struct ServerRegistry {
  std::map<ucp_ep_h, UcxElementServer::Impl*> owner;  // accepted endpoints
  std::map<ucp_ep_h, ListenerSlot*> stopped_owner;     // accepted after a server stopped
  std::vector<std::unique_ptr<ListenerSlot>> stopped;  // listeners in their grace period
  bool handler_installed = false;
};
ServerRegistry& Registry();

// A reply's AM header and what keeps its data alive until UCX is done.
struct Outgoing {
  std::string reply;
  std::vector<FrameBuffer> frames;
  std::shared_ptr<SlotPool::Buffer> blob;  // a packed batch
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* memh = nullptr;
  bool eager = false;  // small, and the client takes it so
};

// An error reply to request `request_id`: the header, then the message.
std::shared_ptr<Outgoing> ErrorReply(uint64_t request_id, const absl::Status& error) {
  auto out = std::make_shared<Outgoing>();
  ReplyHeader h{};
  h.magic = ucx::kReplyMagic;
  h.request_id = request_id;
  h.split_id = -1;
  h.split_index = -1;
  h.seq = -1;
  h.flags = ucx::kReplyError;
  h.code = static_cast<uint32_t>(error.code());
  const std::string msg(error.message().substr(0, ucx::kMaxInline));
  h.inline_len = static_cast<uint32_t>(msg.size());
  out->reply.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  out->reply.append(msg);
  return out;
}

// Sends `out` on `ep` (in a UCX pass). Rendezvous: the payload goes
// straight into the client's buffer; small replies go in the message when
// the client asked so.
void SendReply(ucp_ep_h ep, std::shared_ptr<Outgoing> out) {
  auto* holder = new std::shared_ptr<Outgoing>(std::move(out));
  const Outgoing& o = **holder;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    std::unique_ptr<std::shared_ptr<Outgoing>> out(
        static_cast<std::shared_ptr<Outgoing>*>(user_data));
    if (status != UCS_OK) {
      g_send_errors++;
      // Offered by rendezvous and failed: the client may still read it.
      const size_t bytes = (*out)->eager ? 0 : (*out)->size;
      if (bytes > 0) Quarantine().Hold(std::move(*out), bytes, absl::Now());
    }
    ucp_request_free(request);
  };
  p.user_data = holder;
  p.flags = o.size == 0 ? 0 : o.eager ? UCP_AM_SEND_FLAG_EAGER : UCP_AM_SEND_FLAG_RNDV;
  if (o.memh != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = static_cast<ucp_mem_h>(o.memh);
  }
  ucs_status_ptr_t st = ucp_am_send_nbx(ep, ucx::kElementAm, o.reply.data(), o.reply.size(),
                                        o.size == 0 ? nullptr : o.data, o.size, &p);
  if (st == nullptr) {
    delete holder;
  } else if (UCS_PTR_IS_ERR(st)) {
    spdlog::warn("worker ucx: reply failed: {}", ucs_status_string(UCS_PTR_STATUS(st)));
    g_send_errors++;
    delete holder;
  }
}

// The endpoints accepted by a stopped server's listener (in a UCX pass).
void OnStoppedEpError(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* slot = static_cast<ListenerSlot*>(arg);
  if (slot->eps.erase(ep)) {
    Registry().stopped_owner.erase(ep);
    ucx::CloseEndpointForce(ep);
  }
}
// Accepts a connection request (ucx::AcceptEndpoint); null, logged, when
// UCX could not make the endpoint.
ucp_ep_h Accept(ucp_worker_h worker, ucp_conn_request_h req, ucp_err_handler_cb_t on_error,
                void* arg) {
  absl::StatusOr<ucp_ep_h> ep = ucx::AcceptEndpoint(worker, req, on_error, arg);
  if (!ep.ok()) {
    spdlog::warn("worker ucx: cannot accept a connection: {}", ep.status().ToString());
    return nullptr;
  }
  return *ep;
}
void AcceptForStoppedServer(ListenerSlot* slot, ucp_conn_request_h req) {
  ucp_ep_h ep = Accept(slot->worker, req, &OnStoppedEpError, slot);
  if (ep == nullptr) return;
  slot->eps.insert(ep);
  Registry().stopped_owner[ep] = slot;
}
void CloseStoppedListener(ListenerSlot* slot) {
  for (ucp_ep_h ep : slot->eps) {
    Registry().stopped_owner.erase(ep);
    ucx::CloseEndpointForce(ep);
  }
  slot->eps.clear();
  ucp_listener_destroy(slot->listener);
}
ServerRegistry& Registry() {
  static ServerRegistry* r = new ServerRegistry();
  return *r;
}
}  // namespace

struct UcxElementServer::Impl {
  ElementSource source;
  std::shared_ptr<SlotPool> send_pool;
  std::shared_ptr<ucx::Worker> worker;  // the process's (ucx::Worker::Shared)
  ucp_listener_h listener = nullptr;
  std::unique_ptr<ListenerSlot> slot;  // the listener's handler argument
  std::string address;
  // Accepted endpoints and the number of the connection each carries, in a
  // UCX pass only. A reply goes out only on the connection its request came
  // on: UCX recycles endpoint handles, so a handle alone may by then name a
  // later client's connection (whose request ids are its own).
  std::map<ucp_ep_h, uint64_t> eps;
  uint64_t next_connection = 1;
  struct Peer {
    ucp_ep_h ep = nullptr;
    uint64_t connection = 0;  // 0: none (the endpoint was gone)
  };
  Peer PeerOf(ucp_ep_h ep) const {
    auto it = eps.find(ep);
    return {ep, it == eps.end() ? 0 : it->second};
  }

  std::string auth_token;  // empty: no auth
  std::atomic<int64_t> refusals{0}, serve_errors{0}, bytes_copied{0};

  struct Job {
    Peer peer;
    ElementRequest request;
    uint64_t request_id;
    absl::Status refusal;  // not OK: answer with this error, do not serve
    bool eager_small = false;  // ucx::kRequestEagerSmallReplies
  };
  absl::Mutex mu;
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> threads;
  bool stopped = false;

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    // A client went away: forget its endpoint (replies to it are dropped).
    if (self->eps.erase(ep)) {
      Registry().owner.erase(ep);
      ucx::CloseEndpointForce(ep);
    }
  }

  static void OnConnRequest(ucp_conn_request_h req, void* arg) {
    auto* slot = static_cast<ListenerSlot*>(arg);
    if (slot->owner == nullptr) {  // its server stopped
      AcceptForStoppedServer(slot, req);
      return;
    }
    Impl* self = slot->owner;
    ucp_ep_h ep = Accept(self->worker->handle(), req, &Impl::OnEpError, self);
    if (ep == nullptr) return;
    self->eps[ep] = self->next_connection++;
    Registry().owner[ep] = self;
  }

  // Queues `job` for a serving thread (in a UCX pass).
  void Enqueue(Job job) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    jobs.push_back(std::move(job));
  }

  // Answers a request it will not serve with `error` (in a UCX pass).
  void Refuse(ucp_ep_h ep, uint64_t request_id, absl::Status error) {
    if (refusals++ % 1000 == 0) {
      spdlog::warn("worker ucx {}: refused a request: {}", address, std::string(error.message()));
    }
    Job job{};
    job.peer = PeerOf(ep);
    job.request_id = request_id;
    job.refusal = std::move(error);
    Enqueue(std::move(job));
  }

  static ucs_status_t OnRequest(void*, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    const bool can_reply = param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
    // magic, version and request_id sit at the same offsets in every version.
    constexpr size_t kCommonPrefix = 16;
    if (header_length < kCommonPrefix || !can_reply) {
      spdlog::warn("worker ucx: dropped a malformed request ({} header bytes)", header_length);
      return UCS_OK;
    }
    uint32_t magic, version;
    uint64_t request_id;
    std::memcpy(&magic, header, 4);
    std::memcpy(&version, static_cast<const uint8_t*>(header) + 4, 4);
    std::memcpy(&request_id, static_cast<const uint8_t*>(header) + 8, 8);
    if (magic != ucx::kRequestMagic) {
      spdlog::warn("worker ucx: dropped a request with bad magic");
      return UCS_OK;
    }
    auto owner = Registry().owner.find(param->reply_ep);
    if (owner == Registry().owner.end()) {
      auto stopped = Registry().stopped_owner.find(param->reply_ep);
      if (stopped != Registry().stopped_owner.end()) {
        SendReply(param->reply_ep,
                  ErrorReply(request_id, absl::UnavailableError(absl::StrCat(
                                             "worker ", stopped->second->address, " stopped"))));
      }
      return UCS_OK;  // its server stopped, and the endpoint closed with it
    }
    Impl* self = owner->second;
    if (version != ucx::kProtocolVersion) {
      self->Refuse(param->reply_ep, request_id,
                   absl::FailedPreconditionError(absl::StrCat(
                       "worker ", self->address, " speaks UCX element protocol version ",
                       ucx::kProtocolVersion, ", the client ", version,
                       "; run the same sluice version on both")));
      return UCS_OK;
    }
    RequestHeader h;
    if (header_length < sizeof(h)) {
      self->Refuse(param->reply_ep, request_id,
                   absl::InvalidArgumentError("malformed UCX request: header too short"));
      return UCS_OK;
    }
    std::memcpy(&h, header, sizeof(h));
    if (h.token_len > kMaxAuthTokenBytes || h.ack_count > kMaxAcksPerRequest ||
        header_length != sizeof(h) + h.token_len + h.ack_count * sizeof(ucx::AckEntry)) {
      self->Refuse(param->reply_ep, request_id,
                   absl::InvalidArgumentError(absl::StrCat(
                       "malformed UCX request: ", header_length, " header bytes for a ",
                       h.token_len, "-byte token and ", h.ack_count, " acks")));
      return UCS_OK;
    }
    if (!self->auth_token.empty()) {
      absl::string_view token(static_cast<const char*>(header) + sizeof(h), h.token_len);
      if (!ConstantTimeEquals(token, self->auth_token)) {
        self->Refuse(param->reply_ep, request_id,
                     absl::UnauthenticatedError(AuthRefusal(
                         absl::StrCat("worker ", self->address), h.token_len > 0)));
        return UCS_OK;
      }
    }
    Job job;
    job.peer = self->PeerOf(param->reply_ep);
    job.request_id = h.request_id;
    job.request.task_id = h.task_id;
    job.request.consumer_index = h.consumer_index;
    job.request.round = h.round;
    job.request.wait = absl::Milliseconds(std::clamp<int64_t>(h.wait_ms, 0, 10000));
    job.request.max_elements =
        std::clamp<int64_t>(h.max_elements, 1, ucx::kMaxBatchElements);
    job.request.max_bytes = h.max_bytes;
    job.request.client_id = h.client_id;
    job.request.max_outstanding = std::max<int64_t>(1, h.max_outstanding);
    job.request.shared_job = h.flags & ucx::kRequestSharedJob;
    job.request.resend = h.flags & ucx::kRequestResend;
    job.request.leaving = h.flags & ucx::kRequestLeaving;
    job.request.compression = (h.flags & ucx::kRequestZstd)  ? FrameCodec::kZstd
                              : (h.flags & ucx::kRequestLz4) ? FrameCodec::kLz4
                                                             : FrameCodec::kNone;
    job.request.delivered_seq = h.delivered_seq;
    job.eager_small = h.flags & ucx::kRequestEagerSmallReplies;
    const auto* acks = static_cast<const uint8_t*>(header) + sizeof(RequestHeader) + h.token_len;
    for (uint32_t i = 0; i < h.ack_count; ++i) {
      ucx::AckEntry a;
      std::memcpy(&a, acks + i * sizeof(a), sizeof(a));
      job.request.acks.push_back({a.split_id, a.count});
    }
    self->Enqueue(std::move(job));
    return UCS_OK;
  }

  void Serve() {
    while (true) {
      Job job;
      {
        absl::MutexLock l(&mu);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stop || !jobs.empty(); };
        mu.Await(absl::Condition(&ready));
        if (stop) return;
        job = jobs.front();
        jobs.pop_front();
      }
      auto r = job.refusal.ok() ? source(job.request)
                                : absl::StatusOr<ServedBatch>(job.refusal);
      if (!r.ok() && job.refusal.ok() && !absl::IsCancelled(r.status())) serve_errors++;
      const Peer peer = job.peer;
      if (!r.ok()) {
        worker->Post([this, peer, out = ErrorReply(job.request_id, r.status())] {
          Send(peer, out);
        });
        continue;
      }
      auto out = std::make_shared<Outgoing>();
      out->reply.resize(sizeof(ReplyHeader));
      ReplyHeader h{};
      h.magic = ucx::kReplyMagic;
      h.request_id = job.request_id;
      h.split_id = -1;
      h.split_index = -1;
      h.seq = !r->frames.empty() || r->end_of_sequence ? r->seq : -1;
      if (r->frames.empty()) {
        h.flags = r->end_of_sequence ? ucx::kReplyEndOfSequence : ucx::kReplyNotReady;
      } else if (r->frames.size() == 1) {
        FrameBuffer& f = r->frames[0];
        h.split_id = f.position.split_id;
        h.split_index = f.position.index;
        h.key = f.position.key.value_or(0);
        if (f.payload != nullptr) {
          h.flags = ucx::kReplySplitFrame;
          out->reply.append(reinterpret_cast<const char*>(f.data), f.size);
          out->data = f.payload;
          out->size = f.payload_size;
          g_zero_copy_payloads++;
        } else {
          out->data = f.data;
          out->size = f.size;
          out->memh = f.memh;
        }
        if (f.position.key) h.flags |= ucx::kReplyKeyed;
        if (f.position.split_id >= 0) {
          h.flags |= ucx::kReplySplitRange;
          const ucx::SplitRange range{f.position.epoch, f.position.begin, f.position.end};
          out->reply.append(reinterpret_cast<const char*>(&range), sizeof(range));
        }
        out->frames = std::move(r->frames);
        if (r->resent) h.flags |= ucx::kReplyResent;
      } else {
        absl::Status s = PackBatch(r->frames, out.get());
        if (!s.ok()) {
          worker->Post([this, peer, err = ErrorReply(job.request_id, s)] { Send(peer, err); });
          continue;
        }
        h.flags = ucx::kReplyBatch | (r->resent ? ucx::kReplyResent : 0);
        g_batched_replies++;
      }
      out->eager = job.eager_small && out->size <= ucx::kEagerReplyBytes;
      h.inline_len = static_cast<uint32_t>(out->reply.size() - sizeof(h));
      h.data_size = out->size;
      std::memcpy(out->reply.data(), &h, sizeof(h));
      worker->Post([this, peer, out] { Send(peer, out); });
    }
  }

  // Packs several frames into one registered blob (see ucx_protocol.h).
  // The frames are small (batches hold only elements below
  // kZeroCopyPayloadBytes), so this copy is cheap next to a round trip each.
  absl::Status PackBatch(const std::vector<FrameBuffer>& frames, Outgoing* out) {
    const size_t n = frames.size();
    if (n > ucx::kMaxBatchElements) {
      return absl::InternalError(absl::StrCat("a batch of ", n, " elements exceeds the maximum ",
                                              ucx::kMaxBatchElements));
    }
    size_t total = ucx::AlignUp64(sizeof(ucx::BatchHeader) + n * sizeof(ucx::BatchEntry));
    std::vector<ucx::BatchEntry> entries(n);
    for (size_t i = 0; i < n; ++i) {
      const SplitPosition& pos = frames[i].position;
      entries[i] = {total,     frames[i].frame_size(), pos.split_id, pos.index,
                    pos.key.value_or(0), pos.key.has_value(), pos.epoch, pos.begin,
                    pos.end};
      total += ucx::AlignUp64(frames[i].frame_size());
    }
    SLUICE_ASSIGN_OR_RETURN(out->blob, send_pool->Acquire(total));
    uint8_t* p = out->blob->data;
    std::memset(p, 0, entries[0].offset);
    ucx::BatchHeader bh{ucx::kBatchMagic, static_cast<uint32_t>(n), 0};
    std::memcpy(p, &bh, sizeof(bh));
    std::memcpy(p + sizeof(bh), entries.data(), n * sizeof(ucx::BatchEntry));
    for (size_t i = 0; i < n; ++i) WriteFrame(frames[i], p + entries[i].offset);
    bytes_copied += static_cast<int64_t>(total);
    out->data = p;
    out->size = total;
    out->memh = out->blob->memh;
    return absl::OkStatus();
  }

  // In a UCX pass.
  void Send(const Peer& peer, std::shared_ptr<Outgoing> out) {
    // The client disconnected meanwhile (its handle may be another's now).
    if (peer.connection == 0 || PeerOf(peer.ep).connection != peer.connection) return;
    SendReply(peer.ep, std::move(out));
  }
};

UcxElementServer::UcxElementServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxElementServer::~UcxElementServer() { Stop(); }

absl::StatusOr<std::unique_ptr<UcxElementServer>> UcxElementServer::Start(
    ElementServerOptions options) {
  const std::string& host_port = options.listen_address;
  if (!options.source) return absl::InvalidArgumentError("UcxElementServer: no element source");
  if (options.threads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UcxElementServer: threads must be > 0; got ", options.threads));
  }
  sockaddr_storage ss;
  socklen_t len;
  absl::Status ps = ucx::ParseSockaddr(host_port, &ss, &len);
  if (!ps.ok()) return ps;
  auto ctx = ucx::Context::Get();
  if (!ctx.ok()) return ctx.status();
  auto worker = ucx::Worker::Shared(options.placement.on_progress_thread_start);
  if (!worker.ok()) return worker.status();
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(options.source);
  impl->auth_token = std::move(options.auth_token);
  impl->worker = *std::move(worker);
  impl->send_pool =
      std::make_shared<SlotPool>(*ctx, &SendPoolBytes, &SendPoolStats(),
                                 std::move(options.placement));
  Impl* raw = impl.get();
  absl::Status status;
  impl->worker->Run([&] {
    if (!Registry().handler_installed) {
      status = ucx::SetAmHandler(raw->worker->handle(), ucx::kGetElementAm, &Impl::OnRequest,
                                 nullptr);
      if (!status.ok()) return;
      Registry().handler_installed = true;
      raw->worker->AddTick([] {
        auto& stopped = Registry().stopped;
        const absl::Time now = absl::Now();
        Quarantine().ReleaseDue(now);
        for (auto it = stopped.begin(); it != stopped.end();) {
          if (now - (*it)->stopped_at < kListenerGrace) {
            ++it;
            continue;
          }
          CloseStoppedListener(it->get());
          it = stopped.erase(it);
        }
      });
    }
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    lp.sockaddr.addrlen = len;
    lp.conn_handler.cb = &Impl::OnConnRequest;
    raw->slot = std::make_unique<ListenerSlot>();
    raw->slot->owner = raw;
    raw->slot->worker = raw->worker->handle();
    lp.conn_handler.arg = raw->slot.get();
    ucs_status_t s = ucp_listener_create(raw->worker->handle(), &lp, &raw->listener);
    if (s != UCS_OK) {
      status = ucx::UcsError(s, absl::StrCat("ucp_listener_create on ", host_port,
                                             " (UCX_TLS must include tcp for connection setup)"));
      return;
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = ucp_listener_query(raw->listener, &attr);
    if (s != UCS_OK) {
      status = ucx::UcsError(s, "ucp_listener_query");
      return;
    }
    raw->address = ucx::SockaddrToString(attr.sockaddr);
    raw->slot->address = raw->address;
  });
  if (!status.ok()) {
    UcxElementServer failed(std::move(impl));  // Stop() releases what was created
    return status;
  }
  for (int i = 0; i < options.threads; ++i) impl->threads.emplace_back([raw] { raw->Serve(); });
  return std::unique_ptr<UcxElementServer>(new UcxElementServer(std::move(impl)));
}

std::string UcxElementServer::address() const { return impl_->address; }

ElementServerStats UcxElementServer::stats() const {
  return {impl_->serve_errors.load(), impl_->bytes_copied.load()};
}

FrameAllocator UcxElementServer::frame_allocator() const {
  std::shared_ptr<SlotPool> pool = impl_->send_pool;
  return [pool](size_t size) -> absl::StatusOr<FrameBuffer> {
    auto buf = pool->Acquire(size);
    if (!buf.ok()) return buf.status();
    FrameBuffer f;
    f.data = (*buf)->data;
    f.size = size;
    f.memh = (*buf)->memh;
    f.owner = *std::move(buf);
    g_registered_frames++;
    return f;
  };
}

void UcxElementServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  {
    absl::MutexLock l(&impl_->mu);
    impl_->stop = true;
  }
  for (auto& t : impl_->threads) t.join();
  Impl* raw = impl_.get();
  // After the serving threads joined, so every reply they posted runs
  // before this (Post is FIFO) and none runs after Impl is gone.
  raw->worker->Run([raw] {
    for (const auto& [ep, connection] : raw->eps) {
      Registry().owner.erase(ep);
      ucx::CloseEndpointForce(ep);
    }
    raw->eps.clear();
    if (raw->listener != nullptr) {
      raw->slot->owner = nullptr;
      raw->slot->listener = raw->listener;
      raw->slot->stopped_at = absl::Now();
      Registry().stopped.push_back(std::move(raw->slot));
    }
    raw->listener = nullptr;
  });
  raw->worker.reset();
}

}  // namespace sluice::internal
