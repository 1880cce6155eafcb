// UcxElementServer. Threads: the UCX progress thread (accepts connections,
// receives requests, sends replies) and `threads` serving threads that call
// the ElementSource (which may block) and post the reply back.
#include "sluice/dataplane/ucx_server.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataplane/ucx_pool.h"
#include "sluice/dataplane/ucx_protocol.h"
#include "sluice/dataplane/ucx_runtime.h"
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
size_t SendPoolBytes() { return size_t{512} << 20; }
}  // namespace

int64_t WorkerFramesRegistered() { return g_registered_frames.load(); }

std::atomic<int64_t>& ArenasVerified() {
  static std::atomic<int64_t> v{0};
  return v;
}
std::atomic<int64_t>& ArenasMisplaced() {
  static std::atomic<int64_t> v{0};
  return v;
}

FrameAllocator HeapFrameAllocator() {
  return [](size_t size) -> absl::StatusOr<FrameBuffer> {
    auto mem = std::shared_ptr<uint8_t[]>(new uint8_t[size == 0 ? 1 : size]);
    FrameBuffer f;
    f.data = mem.get();
    f.size = size;
    f.owner = std::move(mem);
    return f;
  };
}

struct UcxElementServer::Impl {
  ElementSource source;
  std::shared_ptr<SlotPool> send_pool;
  std::unique_ptr<ucx::Worker> worker;
  ucp_listener_h listener = nullptr;
  std::string address;
  std::set<ucp_ep_h> eps;  // progress thread only

  struct Job {
    ucp_ep_h ep;
    ElementRequest request;
    uint64_t request_id;
  };
  absl::Mutex mu;
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> threads;
  bool stopped = false;

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    // A client went away: forget its endpoint (replies to it are dropped).
    if (self->eps.erase(ep)) ucx::CloseEndpointForce(ep);
  }

  static void OnConnRequest(ucp_conn_request_h req, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = req;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::OnEpError;
    p.err_handler.arg = self;
    ucp_ep_h ep = nullptr;
    ucs_status_t s = ucp_ep_create(self->worker->handle(), &p, &ep);
    if (s != UCS_OK) {
      spdlog::warn("worker ucx: cannot accept a connection: {}", ucs_status_string(s));
      return;
    }
    self->eps.insert(ep);
  }

  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (header_length != sizeof(RequestHeader) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
      spdlog::warn("worker ucx: dropped a malformed request ({} header bytes)", header_length);
      return UCS_OK;
    }
    RequestHeader h;
    std::memcpy(&h, header, sizeof(h));
    if (h.magic != ucx::kRequestMagic || h.version != ucx::kProtocolVersion) {
      spdlog::warn("worker ucx: dropped a request with bad magic/version");
      return UCS_OK;
    }
    Job job;
    job.ep = param->reply_ep;
    job.request_id = h.request_id;
    job.request.task_id = h.task_id;
    job.request.consumer_index = h.consumer_index;
    job.request.round = h.round;
    job.request.wait = absl::Milliseconds(std::clamp<int64_t>(h.wait_ms, 0, 10000));
    absl::MutexLock l(&self->mu);
    self->jobs.push_back(job);
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
      auto r = source(job.request);
      auto reply = std::make_shared<std::string>(sizeof(ReplyHeader), '\0');
      auto frame = std::make_shared<FrameBuffer>();
      ReplyHeader h{};
      h.magic = ucx::kReplyMagic;
      h.request_id = job.request_id;
      h.split_id = -1;
      h.split_index = -1;
      if (!r.ok()) {
        h.flags = ucx::kReplyError;
        h.code = static_cast<uint32_t>(r.status().code());
        std::string msg(r.status().message().substr(0, ucx::kMaxErrorMessage));
        h.message_len = static_cast<uint32_t>(msg.size());
        reply->append(msg);
      } else if (r->end_of_sequence) {
        h.flags = ucx::kReplyEndOfSequence;
      } else if (r->not_ready) {
        h.flags = ucx::kReplyNotReady;
      } else {
        *frame = std::move(r->frame);
        h.frame_size = frame->size;
        h.split_id = r->split_id;
        h.split_index = r->split_index;
      }
      std::memcpy(reply->data(), &h, sizeof(h));
      ucp_ep_h ep = job.ep;
      worker->Post([this, ep, reply, frame] { Send(ep, reply, frame); });
    }
  }

  // On the progress thread.
  void Send(ucp_ep_h ep, std::shared_ptr<std::string> reply, std::shared_ptr<FrameBuffer> frame) {
    if (!eps.count(ep)) return;  // the client disconnected meanwhile
    struct Holder {
      std::shared_ptr<std::string> reply;
      std::shared_ptr<FrameBuffer> frame;
    };
    auto* holder = new Holder{std::move(reply), std::move(frame)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      delete static_cast<Holder*>(user_data);
      ucp_request_free(request);
    };
    p.user_data = holder;
    const FrameBuffer& f = *holder->frame;
    // Rendezvous: the payload goes straight into the client's slot.
    p.flags = f.size == 0 ? 0 : UCP_AM_SEND_FLAG_RNDV;
    if (f.memh != nullptr) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = static_cast<ucp_mem_h>(f.memh);
    }
    ucs_status_ptr_t st = ucp_am_send_nbx(ep, ucx::kElementAm, holder->reply->data(),
                                          holder->reply->size(), f.size == 0 ? nullptr : f.data,
                                          f.size, &p);
    if (st == nullptr) {
      delete holder;
    } else if (UCS_PTR_IS_ERR(st)) {
      spdlog::warn("worker ucx: reply failed: {}", ucs_status_string(UCS_PTR_STATUS(st)));
      delete holder;
    }
  }
};

UcxElementServer::UcxElementServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxElementServer::~UcxElementServer() { Stop(); }

absl::StatusOr<std::unique_ptr<UcxElementServer>> UcxElementServer::Start(
    const std::string& host_port, ElementSource source, int threads,
    DataPlanePlacement placement) {
  sockaddr_storage ss;
  socklen_t len;
  absl::Status ps = ucx::ParseSockaddr(host_port, &ss, &len);
  if (!ps.ok()) return ps;
  auto ctx = ucx::Context::Get();
  if (!ctx.ok()) return ctx.status();
  auto worker = ucx::Worker::Create(*ctx, ucx::BusyPollFromEnv(),
                                    placement.on_progress_thread_start);
  if (!worker.ok()) return worker.status();
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source);
  impl->worker = *std::move(worker);
  impl->send_pool =
      std::make_shared<SlotPool>(*ctx, &SendPoolBytes, &SendPoolStats(), std::move(placement));
  Impl* raw = impl.get();
  absl::Status status;
  impl->worker->Run([&] {
    status = ucx::SetAmHandler(raw->worker->handle(), ucx::kGetElementAm, &Impl::OnRequest, raw);
    if (!status.ok()) return;
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    lp.sockaddr.addrlen = len;
    lp.conn_handler.cb = &Impl::OnConnRequest;
    lp.conn_handler.arg = raw;
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
  });
  if (!status.ok()) {
    UcxElementServer failed(std::move(impl));  // Stop() releases what was created
    return status;
  }
  for (int i = 0; i < threads; ++i) impl->threads.emplace_back([raw] { raw->Serve(); });
  return std::unique_ptr<UcxElementServer>(new UcxElementServer(std::move(impl)));
}

std::string UcxElementServer::address() const { return impl_->address; }

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
  raw->worker->Run([raw] {
    for (ucp_ep_h ep : raw->eps) ucx::CloseEndpointForce(ep);
    raw->eps.clear();
    if (raw->listener != nullptr) ucp_listener_destroy(raw->listener);
    raw->listener = nullptr;
  });
  raw->worker.reset();
}

}  // namespace sluice::internal
