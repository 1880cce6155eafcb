// Distribute / FromDatasetId / RegisterDataset and the data-service
// iterator.
//
// The iterator's threads (all started in Create, joined in the destructor):
//  - a heartbeat thread long-polls ClientHeartbeat to learn the
//    iteration's tasks, lost tasks, failure and end;
//  - min(max_outstanding_requests, kMaxFetchers) fetcher threads each keep
//    one GetElement in flight, on the readable task with the fewest in
//    flight (round-robin among equals; a task with nothing ready gets only
//    quick probes while another has elements: PickTaskLocked), so at most
//    max_outstanding_requests replies are requested, held or buffered at
//    once. A UCX reply batches small elements that were ready together (at
//    most kMaxElementsPerReply, kMaxBytesPerReply of frames, and in a
//    shared job the consumer's fair share: worker/task_runner.h); a larger
//    element comes alone. A task's replies are delivered in the order its
//    worker handed them out (HoldLocked), across tasks as they come.
//    Coordinated reads: each fetcher instead takes the next round and asks
//    that round's task for this consumer's element; rounds are delivered in
//    order, at most max_outstanding_requests of them requested or buffered.
// Next() runs on the caller's thread and takes buffered elements.
#include "sluice/client/distribute.h"

#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "control/service.grpc.pb.h"
#include "sluice/control/dispatcher_impl.h"
#include "sluice/control/grpc_util.h"
#include "sluice/control/security_internal.h"
#include "sluice/core/interrupt.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/topology/topology.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

constexpr int64_t kMaxFetchers = 64;
constexpr absl::Duration kHeartbeatWait = absl::Milliseconds(1000);
constexpr absl::Duration kElementWait = absl::Milliseconds(500);

struct Counters {
  std::atomic<int64_t> elements{0}, bytes{0}, lost_tasks{0}, worker_errors{0}, started{0},
      released{0}, duplicates{0}, rounds_skipped{0};
};
Counters& GetCounters() {
  static Counters* c = new Counters();
  return *c;
}

absl::Status Unreachable(const std::string& address, int64_t timeout_ms, const grpc::Status& s) {
  return absl::UnavailableError(absl::StrCat(
      "cannot reach the sluice dispatcher at ", address, " within ", timeout_ms, " ms (",
      s.error_message(), "); check the address, and that this client and the dispatcher agree "
      "on TLS (DistributeOptions::tls)"));
}

// What the client presents to the service, from the node's options (the
// token falls back to $SLUICE_AUTH_TOKEN).
ClientSecurity SecurityOf(const proto::DatasetNode::DataService& node) {
  ClientSecurity s;
  s.tls.cert_file = node.tls_cert_file();
  s.tls.key_file = node.tls_key_file();
  s.tls.ca_file = node.tls_ca_file();
  s.auth_token = internal::ClientAuthToken(node.auth_token());
  return s;
}

// Runs a unary dispatcher call that waits for the channel to connect, up to
// `timeout_ms`; transport failures become Unavailable naming the address.
template <typename Req, typename Resp, typename Method>
absl::Status Call(proto::DispatcherService::Stub* stub, Method method, const Req& req, Resp* resp,
                  const std::string& address, int64_t timeout_ms) {
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, absl::Milliseconds(timeout_ms));
  ctx.set_wait_for_ready(true);
  grpc::Status s = (stub->*method)(&ctx, req, resp);
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Unreachable(address, timeout_ms, s);
  }
  return internal::FromGrpcStatus(s, address);
}

class DataServiceIterator final : public Iterator {
 public:
  static absl::StatusOr<std::unique_ptr<Iterator>> Create(
      const proto::DatasetNode::DataService& node, int64_t repetition) {
    SLUICE_ASSIGN_OR_RETURN(std::string address, internal::ParseServiceAddress(node.service()));
    SLUICE_ASSIGN_OR_RETURN(proto::ProcessingMode mode,
                            internal::ParseProcessingMode(node.processing_mode()));
    if (node.data_transfer_protocol() == "ucx") {
      // Place this process's UCX receive pool and progress thread (the
      // first UCX iterator decides; the decision is logged once).
      PlacementConfig pc;
      pc.numa_node = node.numa_node().empty() ? "auto" : node.numa_node();
      pc.cpu_list = node.cpu_list();
      pc.gpu_pci_bus_id = node.gpu_pci_bus_id();
      auto hooks = MakeBindingHooks(pc);
      if (!hooks.ok()) {
        if (absl::IsInvalidArgument(hooks.status())) {
          return absl::InvalidArgumentError(
              absl::StrCat("Distribute placement: ", hooks.status().message()));
        }
        spdlog::warn("sluice client: no topology ({}); UCX buffers stay unbound",
                     std::string(hooks.status().message()));
      } else {
        DataPlanePlacement dp;
        dp.allocate = hooks->allocate;
        dp.verify = hooks->verify;
        dp.on_progress_thread_start = hooks->bind_thread;
        dp.description = hooks->description;
        SetClientDataPlanePlacement(std::move(dp));
      }
    }
    ClientSecurity security = SecurityOf(node);
    SLUICE_ASSIGN_OR_RETURN(auto channel, internal::MakeSecureChannel(address, security));
    std::unique_ptr<DataServiceIterator> it(
        new DataServiceIterator(node, address, std::move(security), std::move(channel)));
    const int64_t timeout = node.dispatcher_timeout_ms();
    std::string dataset_id = node.dataset_id();
    if (node.has_dataset()) {
      proto::RegisterDatasetRequest req;
      *req.mutable_dataset() = node.dataset();
      proto::RegisterDatasetResponse resp;
      SLUICE_RETURN_IF_ERROR(Call(it->stub_.get(), &proto::DispatcherService::Stub::RegisterDataset,
                                  req, &resp, address, timeout));
      dataset_id = resp.dataset_id();
    }
    proto::GetOrCreateJobRequest job_req;
    job_req.set_dataset_id(dataset_id);
    job_req.set_processing_mode(mode);
    job_req.set_job_name(node.job_name());
    job_req.set_num_consumers(node.num_consumers());
    SLUICE_ASSIGN_OR_RETURN(proto::TargetWorkers target,
                            internal::ParseTargetWorkers(node.target_workers()));
    job_req.set_target_workers(target);
    proto::GetOrCreateJobResponse job;
    SLUICE_RETURN_IF_ERROR(Call(it->stub_.get(), &proto::DispatcherService::Stub::GetOrCreateJob,
                                job_req, &job, address, timeout));
    proto::GetOrCreateIterationRequest iter_req;
    iter_req.set_job_id(job.job_id());
    iter_req.set_repetition(repetition);
    iter_req.set_consumer_index(node.consumer_index());
    iter_req.set_host_id(internal::LocalHostId());
    proto::GetOrCreateIterationResponse iter;
    SLUICE_RETURN_IF_ERROR(Call(it->stub_.get(),
                                &proto::DispatcherService::Stub::GetOrCreateIteration, iter_req,
                                &iter, address, timeout));
    it->client_id_ = iter.iteration_client_id();
    GetCounters().started++;
    // Learn the current tasks at once; the heartbeat thread retries
    // transport failures.
    absl::Status hb = it->Heartbeat(absl::ZeroDuration());
    if (!hb.ok() && !absl::IsUnavailable(hb) && !absl::IsDeadlineExceeded(hb)) return hb;
    it->StartThreads();
    return std::unique_ptr<Iterator>(std::move(it));
  }

  ~DataServiceIterator() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      for (auto& [id, t] : tasks_) t.transport->Cancel();
      if (heartbeat_ctx_ != nullptr) heartbeat_ctx_->TryCancel();
    }
    for (auto& t : threads_) t.join();
    if (client_id_ != 0) {
      proto::ReleaseIterationClientRequest req;
      req.set_iteration_client_id(client_id_);
      proto::ReleaseIterationClientResponse resp;
      grpc::ClientContext ctx;
      internal::SetTimeout(&ctx, absl::Seconds(1));
      grpc::Status s = stub_->ReleaseIterationClient(&ctx, req, &resp);
      if (s.ok()) GetCounters().released++;
    }
  }

  absl::StatusOr<std::optional<Element>> Next() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !results_.empty() || !error_.ok() || DoneLocked();
    };
    // Once everything was read, the end needs the dispatcher's word: cut
    // the heartbeat's long poll short, also when the last reply or the
    // finished state arrives while this call waits (else the end waited
    // for the poll to run out, up to kHeartbeatWait).
    auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ready() || (!nudged_ && ReadAllLocked());
    };
    const absl::Time waiting_since = absl::Now();
    while (!ready()) {
      if (ReadAllLocked()) NudgeHeartbeatLocked();
      if (mu_.AwaitWithTimeout(absl::Condition(&wake), kInterruptPollInterval)) continue;
      WarnIfStalledLocked(absl::Now() - waiting_since);
      // The caller may give up (Ctrl-C in Python): nothing was taken.
      mu_.Unlock();
      absl::Status interrupted = CheckInterrupt();
      mu_.Lock();
      if (!interrupted.ok()) return interrupted;
    }
    if (!results_.empty()) {
      std::vector<Element>& batch = results_.front();
      Element e = std::move(batch[next_in_batch_++]);
      if (next_in_batch_ == batch.size()) {
        results_.pop_front();
        next_in_batch_ = 0;
        ++generation_;  // a reply slot is free: wake a fetcher waiting for one
      }
      return std::optional<Element>(std::move(e));
    }
    if (!error_.ok()) return error_;
    return std::optional<Element>();
  }

 private:
  // A reply of a task that arrived before an earlier one of the same task:
  // `count` elements from its seq on (`elements`: those not dropped as
  // duplicates), and `horizon`, the number of requests sent to the task
  // when it arrived (every request that can carry an earlier reply is
  // numbered below it).
  struct HeldReply {
    int64_t count = 0;
    std::vector<Element> elements;
    int64_t horizon = 0;
  };

  struct Task {
    int64_t id = 0;
    std::string worker;
    std::shared_ptr<ElementTransport> transport;
    bool end_of_sequence = false;
    bool lost = false;
    int64_t received = 0;
    int64_t in_flight = 0;
    int failures = 0;
    absl::Time retry_after = absl::InfinitePast();
    int64_t starting_round = 0;  // coordinated reads
    // distributed_epoch: elements received per split, not yet acknowledged
    // to the worker (the next request to it carries them).
    std::map<int64_t, int64_t> unacked;
    // Per-task order (see HoldLocked): the seq of the next element to
    // deliver, the replies that arrived ahead of an earlier one (by seq),
    // and the requests in flight to this task (numbered in sending order).
    // INVARIANT: held is empty when outstanding is (ReleaseHeldLocked runs
    // after every reply).
    int64_t next_seq = 0;
    std::map<int64_t, HeldReply> held;
    int64_t requests_sent = 0;
    std::set<int64_t> outstanding;
    // Its last reply was not_ready: the worker had nothing buffered.
    bool idle = false;
  };

  // Deduplication state of one split: indices [0, prefix) and `beyond`
  // were delivered.
  struct SplitSeen {
    int64_t prefix = 0;
    std::set<int64_t> beyond;
  };

  DataServiceIterator(const proto::DatasetNode::DataService& node, std::string address,
                      ClientSecurity security, std::shared_ptr<grpc::Channel> channel)
      : node_(node),
        address_(std::move(address)),
        security_(std::move(security)),
        max_element_bytes_(node.max_element_bytes() > 0 ? node.max_element_bytes()
                                                        : kDefaultMaxElementBytes),
        coordinated_(node.num_consumers() > 0),
        mode_(internal::ParseProcessingMode(node.processing_mode())
                  .value_or(proto::PROCESSING_MODE_UNSPECIFIED)),
        distributed_(mode_ == proto::DISTRIBUTED_EPOCH),
        stub_(proto::DispatcherService::NewStub(std::move(channel))) {}

  // The transport to a task's worker: UCX when both sides want it (with
  // gRPC as the fallback), gRPC otherwise.
  absl::StatusOr<std::unique_ptr<ElementTransport>> Connect(const proto::TaskInfo& info) {
    bool ucx = node_.data_transfer_protocol() == "ucx" && info.transfer_protocol() == "ucx";
    if (!ucx) {
      if (node_.data_transfer_protocol() == "ucx" && !warned_no_ucx_) {
        warned_no_ucx_ = true;
        spdlog::warn("sluice client: worker {} serves elements over gRPC only; using gRPC",
                     info.worker_address());
      }
      return MakeGrpcElementTransport(info.worker_address(), security_, max_element_bytes_);
    }
    auto grpc = MakeGrpcElementTransport(info.worker_address(), security_, max_element_bytes_);
    if (!grpc.ok()) return grpc.status();
    auto u = MakeUcxElementTransport(info.transfer_address(), security_.auth_token,
                                     max_element_bytes_);
    if (!u.ok()) {
      if (node_.no_grpc_fallback()) return u.status();
      spdlog::warn("sluice client: cannot use UCX to worker {} ({}); falling back to gRPC",
                   info.worker_address(), std::string(u.status().message()));
      return grpc;
    }
    return MakeFallbackTransport(*std::move(u), *std::move(grpc), info.worker_address(),
                                 !node_.no_grpc_fallback());
  }

  // Every task this client knows was read to its end (or lost), nothing is
  // in flight, and the dispatcher said the iteration finished.
  bool ReadAllLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!iteration_finished_ || in_flight_ > 0) return false;
    for (const auto& [id, t] : tasks_) {
      if (!t.end_of_sequence && !t.lost) return false;
    }
    return true;
  }

  // The end, confirmed with the dispatcher: the client read everything
  // and told the dispatcher so at the version it had seen finished (a
  // worker that joined meanwhile would have given it a task to read).
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return confirmed_end_; }

  // Next() has waited `waited` for an element: once it is kStallWarning
  // with no worker to read (none registered, or every task lost), say so,
  // once per iterator, with where the dispatcher is.
  void WarnIfStalledLocked(absl::Duration waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (warned_stall_ || waited < absl::Milliseconds(node_.stall_warning_ms())) return;
    if (node_.stall_warning_ms() <= 0) return;
    int64_t live = 0;
    for (const auto& [id, t] : tasks_) live += !t.lost && !t.end_of_sequence;
    if (live > 0) return;
    warned_stall_ = true;
    spdlog::warn(
        "sluice client: no element for {}: {} (dispatcher {}, {} processing); waiting for a "
        "worker to register with the dispatcher (sluice-worker --dispatcher {})",
        absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(100))),
        tasks_.empty() ? "no worker has a task for this iteration"
                       : absl::StrCat("all ", tasks_.size(), " task(s) were lost or ended"),
        address_, node_.processing_mode(), address_);
  }

  // Next() waits for the end: cut the heartbeat's long poll short so that
  // the end is confirmed at once.
  void NudgeHeartbeatLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (nudged_) return;
    nudged_ = true;
    if (heartbeat_ctx_ != nullptr) heartbeat_ctx_->TryCancel();
  }

  void StartThreads() {
    threads_.emplace_back([this] { HeartbeatLoop(); });
    int64_t n = std::min<int64_t>(node_.max_outstanding_requests(), kMaxFetchers);
    for (int64_t i = 0; i < n; ++i) {
      threads_.emplace_back([this] { coordinated_ ? FetchRoundLoop() : FetchLoop(); });
    }
  }

  // One heartbeat; records tasks, losses, failure and the end.
  absl::Status Heartbeat(absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_) {
    proto::ClientHeartbeatRequest req;
    req.set_iteration_client_id(client_id_);
    grpc::ClientContext ctx;
    bool at_end;
    {
      absl::MutexLock l(&mu_);
      if (stop_) return absl::CancelledError("stopping");
      // Read to the end (the user took every element): ask to end.
      at_end = ReadAllLocked() && results_.empty();
      if (at_end) wait = absl::ZeroDuration();
      internal::SetTimeout(&ctx, wait + absl::Seconds(5));
      req.set_at_end(at_end);
      req.set_known_version(version_);
      req.set_wait_ms(absl::ToInt64Milliseconds(wait));
      req.set_current_round(coordinated_ ? next_round_ : -1);
      req.set_blocked_round(honoured_block_);
      heartbeat_ctx_ = &ctx;
    }
    proto::ClientHeartbeatResponse resp;
    grpc::Status s = stub_->ClientHeartbeat(&ctx, req, &resp);
    absl::MutexLock l(&mu_);
    heartbeat_ctx_ = nullptr;
    if (!s.ok()) return internal::FromGrpcStatus(s, absl::StrCat("heartbeat to ", address_));
    if (at_end && resp.iteration_finished() && resp.version() == req.known_version()) {
      confirmed_end_ = true;  // the dispatcher recorded it at this same state
    }
    nudged_ = false;
    version_ = resp.version();
    for (const proto::TaskInfo& info : resp.tasks()) {
      auto it = tasks_.find(info.task_id());
      if (it == tasks_.end()) {
        auto transport = Connect(info);
        if (!transport.ok()) {
          error_ = transport.status();
          return error_;
        }
        Task t;
        t.id = info.task_id();
        t.worker = info.worker_address();
        t.transport = std::move(*transport);
        t.starting_round = info.starting_round();
        it = tasks_.emplace(t.id, std::move(t)).first;
      }
      Task& t = it->second;
      if (info.lost() && !t.lost && !t.end_of_sequence) {
        t.lost = true;
        t.transport->Cancel();
        GetCounters().lost_tasks++;
        spdlog::warn(
            "sluice client: lost task {} on worker {} after receiving {} element(s) from it; {}",
            t.id, t.worker, t.received,
            distributed_ ? "its unfinished splits go to the remaining workers"
            : internal::StaticShardingOf(mode_)
                ? "its shard is read again, from its start, by the worker that takes its place"
                : "the rest of its output is lost and the iteration continues from the "
                  "remaining workers");
      }
    }
    split_watermark_ = std::max(split_watermark_, resp.completed_split_watermark());
    ForgetCompletedSplitsLocked();
    if (resp.has_error() && resp.error().code() != 0 && error_.ok()) {
      error_ = internal::FromProto(resp.error());
    }
    iteration_finished_ = resp.iteration_finished();
    // Honour a joining round only from at or below it (else the dispatcher
    // sees our round and picks a later one).
    const int64_t block = coordinated_ ? resp.block_round() : -1;
    honoured_block_ = block >= 0 && next_round_ <= block ? block : -1;
    ++generation_;
    return absl::OkStatus();
  }

  // Drops the deduplication state of splits below the dispatcher's
  // watermark (completed: no worker produces them again) -- but not while a
  // request to a lost task is in flight, whose late reply could be a
  // duplicate of one of them.
  void ForgetCompletedSplitsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, t] : tasks_) {
      if (t.lost && t.in_flight > 0) return;
    }
    seen_.erase(seen_.begin(), seen_.lower_bound(split_watermark_));
  }

  // Records (split, index); false if it was delivered before.
  bool FirstDeliveryLocked(int64_t split_id, int64_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (split_id <= 0 || index < 0) return true;  // untracked
    // A late reply for a split forgotten as completed: prefer delivering it
    // (at least once) to dropping an element that may be new.
    if (split_id < split_watermark_ && !seen_.count(split_id)) return true;
    SplitSeen& s = seen_[split_id];
    if (index < s.prefix || s.beyond.count(index)) return false;
    if (index != s.prefix) {
      s.beyond.insert(index);
      return true;
    }
    ++s.prefix;
    while (!s.beyond.empty() && *s.beyond.begin() == s.prefix) {
      s.beyond.erase(s.beyond.begin());
      ++s.prefix;
    }
    return true;
  }

  void HeartbeatLoop() {
    absl::Time failing_since = absl::InfiniteFuture();
    while (true) {
      absl::Status s = Heartbeat(kHeartbeatWait);
      absl::MutexLock l(&mu_);
      if (stop_ || !error_.ok() || DoneLocked()) return;
      if (s.ok() || (absl::IsCancelled(s) && nudged_)) {  // a nudge cut the poll short
        failing_since = absl::InfiniteFuture();
        nudged_ = false;
        continue;
      }
      if (absl::IsNotFound(s)) {  // our iteration client was released or timed out
        error_ = s;
        return;
      }
      absl::Time now = absl::Now();
      if (failing_since == absl::InfiniteFuture()) failing_since = now;
      if (now - failing_since > absl::Milliseconds(node_.dispatcher_timeout_ms())) {
        error_ = absl::UnavailableError(absl::StrCat(
            "lost contact with the sluice dispatcher at ", address_, " for more than ",
            node_.dispatcher_timeout_ms(), " ms: ", s.message()));
        return;
      }
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::Milliseconds(200));
    }
  }

  // Picks the task for the next request and the request's wait, or null
  // if no task may be asked now; `free` > 0 request slots are free
  // (max_outstanding_requests minus replies requested, held or buffered).
  // Among the tasks that may be asked, the one with the fewest requests in
  // flight, the first after `rr_` among equals: preferring the least loaded
  // keeps fetchers from piling up on a task with nothing ready (each such
  // request waits up to kElementWait) while another has elements buffered.
  //
  // The last free slot is never parked (a request that may wait
  // kElementWait for an element) when that could hold up elements: it gets
  // a probe (wait 0; the worker answers at once) instead
  //  - while another task than the one asked is busy (its last reply had
  //    elements). With one slot (max_outstanding_requests = 1) every other
  //    request used to wait kElementWait on a task with nothing to give --
  //    in distributed_epoch the task of a worker that read its last split
  //    and waits for the epoch's end, which needs the acknowledgements of
  //    the other task's elements -- and the client ran at ~2 elements per
  //    kElementWait;
  //  - in distributed_epoch while other requests are in flight: with every
  //    slot parked, the acknowledgements of the last elements received
  //    could not be sent, and the epoch's end waited for a parked request
  //    to time out.
  // A task whose last reply was not_ready (idle) gets at most one request
  // at a time while another task is busy, and a probe of an idle task
  // needs a reply with elements since the last one (probe_allowed_), so
  // probes never spin. With nothing in flight a request may always wait.
  Task* PickTaskLocked(int64_t free, absl::Duration* wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = absl::Now();
    auto readable = [now](const Task& t) {
      return !t.end_of_sequence && !t.lost && t.retry_after <= now;
    };
    int64_t busy = 0;
    for (const auto& [id, t] : tasks_) busy += readable(t) && !t.idle;
    // Whether another task than `t` is busy.
    auto others_busy = [busy](const Task& t) { return busy > (t.idle ? 0 : 1); };
    // Whether a request to `t` now is a probe.
    auto probe = [&](const Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return free < 2 && (others_busy(t) || (distributed_ && in_flight_ > 0));
    };
    auto start = tasks_.upper_bound(rr_);
    Task* best = nullptr;
    for (int pass = 0; pass < 2; ++pass) {
      for (auto it = pass == 0 ? start : tasks_.begin(); it != tasks_.end(); ++it) {
        if (pass == 1 && it == start) break;
        Task& t = it->second;
        if (!readable(t)) continue;
        if (t.idle && ((others_busy(t) && t.in_flight > 0) || (probe(t) && !probe_allowed_))) {
          continue;
        }
        if (best == nullptr || t.in_flight < best->in_flight) best = &t;
      }
    }
    if (best == nullptr) return nullptr;
    rr_ = best->id;
    *wait = kElementWait;
    if (probe(*best)) {
      *wait = absl::ZeroDuration();
      if (best->idle) probe_allowed_ = false;
    }
    return best;
  }

  void FetchLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    const int64_t max = node_.max_outstanding_requests();
    while (true) {
      std::shared_ptr<ElementTransport> transport;
      int64_t task_id;
      int64_t request_number;
      ElementRequest req;
      {
        absl::MutexLock l(&mu_);
        while (true) {
          if (stop_ || !error_.ok() || DoneLocked()) return;
          Task* t = nullptr;
          const int64_t free =
              max - static_cast<int64_t>(results_.size()) - held_replies_ - in_flight_;
          if (free > 0) t = PickTaskLocked(free, &req.wait);
          if (t != nullptr) {
            transport = t->transport;
            task_id = t->id;
            ++t->in_flight;
            request_number = t->requests_sent++;
            t->outstanding.insert(request_number);
            // Acknowledged once sent: a lost request's acks are not resent
            // (an ack counted twice could complete a split too early); the
            // worker's ack timeout covers them.
            while (!t->unacked.empty() && req.acks.size() < kMaxAcksPerRequest) {
              req.acks.push_back({t->unacked.begin()->first, t->unacked.begin()->second});
              t->unacked.erase(t->unacked.begin());
            }
            break;
          }
          // Nothing readable now: wait for a change (or a retry time).
          const int64_t seen = generation_;
          auto woken = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stop_ || !error_.ok() || generation_ != seen;
          };
          mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Milliseconds(50));
        }
        ++in_flight_;
      }
      req.task_id = task_id;
      req.consumer_index = node_.consumer_index();
      req.client_id = client_id_;
      req.max_outstanding = std::min<int64_t>(max, kMaxFetchers);
      req.shared_job = !node_.job_name().empty();
      req.max_elements = kMaxElementsPerReply;
      req.max_bytes = kMaxBytesPerReply;
      auto r = transport->GetElement(req);
      absl::MutexLock l(&mu_);
      --in_flight_;
      ++generation_;
      auto it = tasks_.find(task_id);
      if (it == tasks_.end()) continue;
      Task& t = it->second;
      t.outstanding.erase(request_number);
      if (--t.in_flight == 0 && t.lost) ForgetCompletedSplitsLocked();
      HandleReplyLocked(t, std::move(r));
      ReleaseHeldLocked(t);
    }
  }

  // One reply (or failure) of a request to `t`.
  void HandleReplyLocked(Task& t, absl::StatusOr<ElementResult> r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (r.ok()) {
      t.failures = 0;
      if (r->end_of_sequence) {
        t.end_of_sequence = true;
      } else if (r->not_ready || r->elements.empty()) {
        t.idle = true;
      } else {
        t.idle = false;
        probe_allowed_ = true;
        t.received += static_cast<int64_t>(r->elements.size());
        GetCounters().elements += static_cast<int64_t>(r->elements.size());
        GetCounters().bytes += static_cast<int64_t>(r->bytes);
        std::vector<Element> fresh;
        fresh.reserve(r->elements.size());
        for (size_t i = 0; i < r->elements.size(); ++i) {
          SplitPosition pos = i < r->positions.size() ? r->positions[i] : SplitPosition{};
          if (pos.split_id > 0) ++t.unacked[pos.split_id];
          if (FirstDeliveryLocked(pos.split_id, pos.index)) {
            fresh.push_back(std::move(r->elements[i]));
          } else {
            GetCounters().duplicates++;  // a reassigned split's element we already have
          }
        }
        HoldLocked(t, r->seq, static_cast<int64_t>(r->elements.size()), std::move(fresh));
      }
      return;
    }
    if (stop_ || t.lost) return;
    absl::Status s = r.status();
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s)) {
      // The worker may be restarting or gone; the dispatcher decides
      // (it marks the task lost after worker_timeout_ms).
      GetCounters().worker_errors++;
      if (t.failures++ == 0) {
        spdlog::warn("sluice client: task {} on worker {}: {}; retrying", t.id, t.worker,
                     std::string(s.message()));
      }
      t.retry_after = absl::Now() + std::min(absl::Milliseconds(20) * (1 << std::min(t.failures, 6)),
                                             absl::Seconds(1));
      return;
    }
    if (error_.ok()) error_ = s;  // the worker's own error, e.g. the dataset failed
  }

  // Per-task order. The worker numbers the elements it hands this consumer
  // from a task (a reply's seq is its first element's; ElementResult::seq)
  // in production order, but replies of concurrent requests arrive in any
  // order: a reply is held until the replies before it were delivered.
  // A reply with no seq (-1), or one behind what was delivered, is
  // delivered as it comes (never dropped). Across tasks, replies are
  // delivered as they become deliverable (interleaved).
  void HoldLocked(Task& t, int64_t seq, int64_t count, std::vector<Element> elements)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (seq < t.next_seq || t.held.count(seq)) {
      if (!elements.empty()) results_.push_back(std::move(elements));
      return;
    }
    t.held.emplace(seq, HeldReply{count, std::move(elements), t.requests_sent});
    ++held_replies_;
  }

  // Delivers `t`'s held replies that are next in seq order. A gap below
  // the first held reply is given up when no request that can fill it is
  // left: the worker handed out the missing elements before that reply,
  // so to a request sent before it arrived (numbered below its horizon);
  // once none of those is in flight, the missing reply was lost (the
  // worker died, the request failed or was cancelled after the worker had
  // taken its elements) and waiting longer would stall the task forever.
  // A lost task's requests are cancelled, so its held replies are then
  // delivered too, as today's late replies of a lost task are.
  void ReleaseHeldLocked(Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!t.held.empty()) {
      auto first = t.held.begin();
      if (first->first != t.next_seq && !t.outstanding.empty() &&
          *t.outstanding.begin() < first->second.horizon) {
        return;  // an earlier reply may still come
      }
      t.next_seq = first->first + first->second.count;
      if (!first->second.elements.empty()) results_.push_back(std::move(first->second.elements));
      t.held.erase(first);
      --held_replies_;
    }
  }

  // Coordinated reads: the task that serves `round`, the (round mod n)-th
  // by id of the n tasks started at or before it; null when there is none,
  // or when every task has ended or was lost (nothing left to read).
  Task* TaskForRoundLocked(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Task*> active;
    bool any_live = false;
    for (auto& [id, t] : tasks_) {
      if (t.starting_round > round) continue;
      active.push_back(&t);
      any_live = any_live || (!t.lost && !t.end_of_sequence);
    }
    if (!any_live) return nullptr;
    return active[round % static_cast<int64_t>(active.size())];
  }

  // Coordinated reads: `round` resolved (nullopt: skipped); delivers every
  // resolved round in order.
  void ResolveRoundLocked(int64_t round, std::optional<Element> e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!e) GetCounters().rounds_skipped++;
    rounds_.emplace(round, std::move(e));
    for (auto it = rounds_.begin(); it != rounds_.end() && it->first == deliver_round_;
         it = rounds_.erase(it)) {
      if (it->second) results_.push_back({*std::move(it->second)});
      ++deliver_round_;
    }
    ++generation_;
  }

  // Coordinated reads: each fetcher takes the next round, asks its task
  // for this consumer's element of it until it resolves, and repeats. A
  // round whose task ended or was lost is skipped by every consumer alike.
  void FetchRoundLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    const int64_t max = node_.max_outstanding_requests();
    while (true) {
      int64_t round;
      int64_t task_id;
      std::shared_ptr<ElementTransport> transport;
      {
        absl::MutexLock l(&mu_);
        while (true) {
          if (stop_ || !error_.ok()) return;
          Task* t = nullptr;
          if (next_round_ - deliver_round_ + static_cast<int64_t>(results_.size()) < max &&
              (honoured_block_ < 0 || next_round_ < honoured_block_)) {
            t = TaskForRoundLocked(next_round_);
          }
          if (t != nullptr) {
            round = next_round_++;
            if (t->lost || t->end_of_sequence) {
              ResolveRoundLocked(round, std::nullopt);
              continue;
            }
            task_id = t->id;
            transport = t->transport;
            ++t->in_flight;
            ++in_flight_;
            break;
          }
          const int64_t seen = generation_;
          auto woken = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stop_ || !error_.ok() || generation_ != seen;
          };
          mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Milliseconds(50));
        }
      }
      FetchRound(round, task_id, *transport);
    }
  }

  void FetchRound(int64_t round, int64_t task_id, ElementTransport& transport)
      ABSL_LOCKS_EXCLUDED(mu_) {
    ElementRequest req;
    req.task_id = task_id;
    req.consumer_index = node_.consumer_index();
    req.round = round;
    req.wait = kElementWait;
    req.max_bytes = kMaxBytesPerReply;
    int failures = 0;
    while (true) {
      auto r = transport.GetElement(req);
      absl::MutexLock l(&mu_);
      Task& t = tasks_.at(task_id);
      auto resolve = [&](std::optional<Element> e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        --t.in_flight;
        --in_flight_;
        ResolveRoundLocked(round, std::move(e));
      };
      if (stop_) return resolve(std::nullopt);
      if (r.ok() && !r->end_of_sequence && !r->not_ready && !r->elements.empty()) {
        t.received++;
        GetCounters().elements++;
        GetCounters().bytes += static_cast<int64_t>(r->bytes);
        return resolve(std::move(r->elements[0]));
      }
      if (r.ok() && r->end_of_sequence) t.end_of_sequence = true;
      if (t.lost || t.end_of_sequence) return resolve(std::nullopt);
      if (r.ok()) continue;  // not ready yet
      absl::Status s = r.status();
      if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s) && !absl::IsCancelled(s)) {
        if (error_.ok()) error_ = s;
        return resolve(std::nullopt);
      }
      // The worker may be restarting or gone; the dispatcher decides.
      GetCounters().worker_errors++;
      if (failures++ == 0) {
        spdlog::warn("sluice client: round {} from task {} on worker {}: {}; retrying", round,
                     t.id, t.worker, std::string(s.message()));
      }
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopped),
                           std::min(absl::Milliseconds(20) * (1 << std::min(failures, 6)),
                                    absl::Seconds(1)));
    }
  }

  const proto::DatasetNode::DataService node_;
  const std::string address_;
  const ClientSecurity security_;  // for the dispatcher and every worker
  const int64_t max_element_bytes_;
  const bool coordinated_;
  const proto::ProcessingMode mode_;
  const bool distributed_;
  std::unique_ptr<proto::DispatcherService::Stub> stub_;
  int64_t client_id_ = 0;
  std::vector<std::thread> threads_;

  absl::Mutex mu_;
  std::map<int64_t, Task> tasks_ ABSL_GUARDED_BY(mu_);
  // Replies not yet fully consumed (each non-empty), and the position in
  // the first.
  std::deque<std::vector<Element>> results_ ABSL_GUARDED_BY(mu_);
  size_t next_in_batch_ ABSL_GUARDED_BY(mu_) = 0;
  // Replies held for per-task order (Task::held), across tasks; they count
  // against max_outstanding_requests like results_.
  int64_t held_replies_ ABSL_GUARDED_BY(mu_) = 0;
  // A probe of an idle task may be sent (see PickTaskLocked).
  bool probe_allowed_ ABSL_GUARDED_BY(mu_) = true;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rr_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t version_ ABSL_GUARDED_BY(mu_) = -1;
  bool iteration_finished_ ABSL_GUARDED_BY(mu_) = false;
  bool confirmed_end_ ABSL_GUARDED_BY(mu_) = false;  // see DoneLocked()
  bool nudged_ ABSL_GUARDED_BY(mu_) = false;         // see NudgeHeartbeatLocked()
  bool warned_no_ucx_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_stall_ ABSL_GUARDED_BY(mu_) = false;  // see WarnIfStalledLocked()
  // Bumped when a request completes or a buffered reply is consumed.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // distributed_epoch: per split, what was delivered (see FirstDeliveryLocked).
  std::map<int64_t, SplitSeen> seen_ ABSL_GUARDED_BY(mu_);
  int64_t split_watermark_ ABSL_GUARDED_BY(mu_) = 0;
  // Coordinated reads: the next round to request, the next to deliver, the
  // resolved rounds not yet delivered (nullopt: skipped), and the joining
  // round this consumer honours (-1: none; see ClientHeartbeatResponse).
  // INVARIANT: deliver_round_ <= next_round_; no round >= honoured_block_
  // is requested while honoured_block_ >= 0.
  int64_t next_round_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t deliver_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::optional<Element>> rounds_ ABSL_GUARDED_BY(mu_);
  int64_t honoured_block_ ABSL_GUARDED_BY(mu_) = -1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* heartbeat_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
};

absl::StatusOr<std::unique_ptr<Iterator>> CreateDataServiceIterator(
    const proto::DatasetNode::DataService& node, int64_t repetition) {
  return DataServiceIterator::Create(node, repetition);
}

void InstallFactory() { internal::SetDataServiceIteratorFactory(&CreateDataServiceIterator); }

bool ContainsDataService(const internal::Analysis& a) {
  if (a.node->op_case() == proto::DatasetNode::kDataService) return true;
  for (const auto& in : a.inputs) {
    if (ContainsDataService(*in)) return true;
  }
  return a.sub != nullptr && ContainsDataService(*a.sub);
}

absl::Status ValidateOptions(const DistributeOptions& o) {
  SLUICE_RETURN_IF_ERROR(internal::ParseProcessingMode(o.processing_mode).status());
  if (o.service.empty()) {
    return absl::InvalidArgumentError(
        "Distribute: options.service is empty; set it to the dispatcher's grpc://host:port");
  }
  SLUICE_RETURN_IF_ERROR(internal::ParseServiceAddress(o.service).status());
  if (o.max_outstanding_requests <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Distribute: max_outstanding_requests must be > 0; got ", o.max_outstanding_requests));
  }
  if (o.data_transfer_protocol != "grpc" && o.data_transfer_protocol != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("Distribute: unknown data_transfer_protocol '",
                                                   o.data_transfer_protocol,
                                                   "'; expected grpc or ucx"));
  }
  SLUICE_ASSIGN_OR_RETURN(proto::TargetWorkers target,
                          internal::ParseTargetWorkers(o.target_workers));
  if (target == proto::TARGET_WORKERS_LOCAL && o.num_consumers.has_value()) {
    return absl::InvalidArgumentError(
        "Distribute: coordinated reads (num_consumers) need non-local workers; "
        "target_workers=LOCAL does not combine with them");
  }
  if (o.consumer_index.has_value() != o.num_consumers.has_value()) {
    return absl::InvalidArgumentError(
        "Distribute: coordinated reads need both consumer_index and num_consumers");
  }
  if (o.num_consumers.has_value()) {
    if (*o.num_consumers <= 0 || *o.consumer_index < 0 || *o.consumer_index >= *o.num_consumers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Distribute: coordinated reads need num_consumers > 0 and consumer_index in [0, "
          "num_consumers); got consumer_index ", *o.consumer_index, ", num_consumers ",
          *o.num_consumers));
    }
    if (o.job_name.empty()) {
      return absl::InvalidArgumentError(
          "Distribute: coordinated reads (num_consumers) need a job_name shared by the consumers");
    }
  }
  if (o.dispatcher_timeout_ms <= 0) {
    return absl::InvalidArgumentError("Distribute: dispatcher_timeout_ms must be > 0");
  }
  if (o.stall_warning_ms < 0) {
    return absl::InvalidArgumentError("Distribute: stall_warning_ms must be >= 0 (0: never)");
  }
  if (o.max_element_bytes <= 0) {
    return absl::InvalidArgumentError("Distribute: max_element_bytes must be > 0");
  }
  SLUICE_RETURN_IF_ERROR(internal::ValidateAuthToken(o.auth_token, "Distribute"));
  return absl::OkStatus();
}

proto::DatasetNode MakeNode(const DistributeOptions& o) {
  proto::DatasetNode n;
  auto* d = n.mutable_data_service();
  d->set_processing_mode(o.processing_mode);
  d->set_service(o.service);
  d->set_job_name(o.job_name);
  d->set_max_outstanding_requests(o.max_outstanding_requests);
  d->set_data_transfer_protocol(o.data_transfer_protocol);
  d->set_consumer_index(o.consumer_index.value_or(-1));
  d->set_num_consumers(o.num_consumers.value_or(0));
  d->set_dispatcher_timeout_ms(o.dispatcher_timeout_ms);
  d->set_no_grpc_fallback(!o.fallback_to_grpc);
  d->set_numa_node(o.numa_node);
  d->set_cpu_list(o.cpu_list);
  d->set_gpu_pci_bus_id(o.gpu_pci_bus_id);
  d->set_tls_cert_file(o.tls.cert_file);
  d->set_tls_key_file(o.tls.key_file);
  d->set_tls_ca_file(o.tls.ca_file);
  d->set_auth_token(o.auth_token);
  d->set_max_element_bytes(o.max_element_bytes);
  d->set_stall_warning_ms(o.stall_warning_ms);
  d->set_target_workers(o.target_workers);
  return n;
}

}  // namespace

Dataset Dataset::Distribute(const DistributeOptions& options) const {
  InstallFactory();
  if (!status().ok()) return *this;
  absl::Status s = ValidateOptions(options);
  if (s.ok() && ContainsDataService(*rep()->analysis)) {
    s = absl::InvalidArgumentError("Distribute: the pipeline already contains a Distribute");
  }
  if (!s.ok()) return internal::MakeErrorDataset(std::move(s));
  proto::DatasetNode n = MakeNode(options);
  *n.mutable_data_service()->mutable_dataset() = def();
  return internal::MakeDataServiceDataset(std::move(n), this);
}

Dataset Dataset::FromDatasetId(const std::string& processing_mode, const std::string& service,
                               const std::string& dataset_id, const DistributeOptions& options) {
  InstallFactory();
  DistributeOptions o = options;
  o.processing_mode = processing_mode;
  o.service = service;
  absl::Status s = ValidateOptions(o);
  if (s.ok() && dataset_id.empty()) s = absl::InvalidArgumentError("FromDatasetId: empty dataset_id");
  if (!s.ok()) return internal::MakeErrorDataset(std::move(s));
  proto::DatasetNode n = MakeNode(o);
  n.mutable_data_service()->set_dataset_id(dataset_id);
  return internal::MakeDataServiceDataset(std::move(n), nullptr);
}

namespace {

absl::StatusOr<std::string> RegisterWith(const std::string& service, const Dataset& dataset,
                                         const std::string& dataset_id,
                                         const ClientSecurity& security, int64_t timeout_ms) {
  SLUICE_RETURN_IF_ERROR(dataset.status());
  if (ContainsDataService(*dataset.rep()->analysis)) {
    // Its Distribute options (the auth token among them) stay in this process.
    return absl::InvalidArgumentError(
        "RegisterDataset: the pipeline contains a Distribute; register the part before it");
  }
  SLUICE_ASSIGN_OR_RETURN(std::string address, internal::ParseServiceAddress(service));
  SLUICE_ASSIGN_OR_RETURN(auto channel, internal::MakeSecureChannel(address, security));
  auto stub = proto::DispatcherService::NewStub(channel);
  proto::RegisterDatasetRequest req;
  *req.mutable_dataset() = dataset.def();
  req.set_dataset_id(dataset_id);
  proto::RegisterDatasetResponse resp;
  SLUICE_RETURN_IF_ERROR(Call(stub.get(), &proto::DispatcherService::Stub::RegisterDataset, req,
                              &resp, address, timeout_ms));
  return resp.dataset_id();
}

}  // namespace

absl::StatusOr<std::string> RegisterDataset(const std::string& service, const Dataset& dataset,
                                            int64_t timeout_ms) {
  ClientSecurity security;
  security.auth_token = internal::ClientAuthToken("");
  return RegisterWith(service, dataset, "", security, timeout_ms);
}

absl::StatusOr<std::string> RegisterDataset(const Dataset& dataset,
                                            const DistributeOptions& options,
                                            const std::string& dataset_id) {
  SLUICE_RETURN_IF_ERROR(internal::ValidateAuthToken(options.auth_token, "RegisterDataset"));
  ClientSecurity security{options.tls, internal::ClientAuthToken(options.auth_token)};
  return RegisterWith(options.service, dataset, dataset_id, security,
                      options.dispatcher_timeout_ms);
}

DataServiceStats GetDataServiceStats() {
  Counters& c = GetCounters();
  DataServiceStats s;
  s.elements_received = c.elements.load();
  s.bytes_received = c.bytes.load();
  s.lost_tasks = c.lost_tasks.load();
  s.worker_errors = c.worker_errors.load();
  s.iterations_started = c.started.load();
  s.iterations_released = c.released.load();
  s.duplicates_dropped = c.duplicates.load();
  s.rounds_skipped = c.rounds_skipped.load();
  return s;
}

}  // namespace sluice
