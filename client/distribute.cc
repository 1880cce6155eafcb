// Distribute / FromDatasetId / RegisterDataset and the data-service
// iterator.
//
// Distribute and FromDatasetId build a DataService node (dataset/ops/
// data_service.cc) and attach to it a ServiceReader holding the
// DistributeOptions: the node says what is read (the dataset or its id, the
// job), the options how (TLS, token, data plane, placement, timeouts).
//
// The iterator is event-driven. Its threads (started in Create, joined in
// the destructor), whatever max_outstanding_requests is:
//  - a heartbeat thread long-polls ClientHeartbeat to learn the
//    iteration's tasks, lost tasks, failure and end;
//  - a timer thread sends the requests a retry backoff held back.
// A reader (client/readers_internal.h: first come first served, or
// coordinated rounds) decides which requests to send; they go out with
// ElementTransport::GetElementAsync, and each reply is digested on the
// transport's thread (the UCX progress thread, a gRPC callback thread),
// which sends the next requests. Next() runs on the caller's thread,
// waits on one condition and takes delivered elements.
//
// Lock order: mu_ is never held while calling a transport (requests are
// planned under it and sent after it is released), so a callback that runs
// on the sending thread can take it.
#include "sluice/client/distribute.h"

#include "sluice/client/readers_internal.h"

#include <atomic>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "rpc/service.grpc.pb.h"
#include "sluice/rpc/protocol.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/rpc/security_internal.h"
#include "sluice/core/event_fd.h"
#include "sluice/core/interrupt.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/transport_registry.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/ops/op.h"
#include "sluice/topology/topology.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

constexpr absl::Duration kHeartbeatWait = absl::Milliseconds(1000);
// How soon a heartbeat asks again while a report waits for a lost task's
// requests to end.
constexpr absl::Duration kReportRetry = absl::Milliseconds(20);
// Save() asks the dispatcher for its completed-split watermark (a heartbeat
// that does not wait) for at most this long, then saves with the one it has.
constexpr absl::Duration kSaveWatermarkWait = absl::Milliseconds(250);
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

// What the client presents to the service (the token falls back to
// $SLUICE_AUTH_TOKEN).
ClientSecurity SecurityOf(const DistributeOptions& options) {
  return ClientSecurity{options.tls, internal::ClientAuthToken(options.auth_token)};
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

// $SLUICE_UCX_EAGER_REPLIES: whether small replies may come in the reply
// message, copied once, instead of by rendezvous (EagerReplies;
// docs/dataplane.md). Read once; a bad value fails Distribute's checks.
absl::StatusOr<EagerReplies> EagerRepliesFromEnv() {
  static const absl::StatusOr<EagerReplies> v =
      ParseEagerReplies(std::getenv("SLUICE_UCX_EAGER_REPLIES"));
  return v;
}

// DistributeOptions::compression: the codec asked for, nullopt for AUTO.
absl::StatusOr<std::optional<FrameCodec>> ParseCompression(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "auto") return std::optional<FrameCodec>();
  if (n == "none" || n == "off") return std::optional<FrameCodec>(FrameCodec::kNone);
  if (n == "lz4") return std::optional<FrameCodec>(FrameCodec::kLz4);
  if (n == "zstd") return std::optional<FrameCodec>(FrameCodec::kZstd);
  return absl::InvalidArgumentError(absl::StrCat(
      "Distribute: compression must be AUTO, none, lz4 or zstd; got '", name, "'"));
}

// The codec the workers are asked for: AUTO is the protocol's choice
// (logged once per process and protocol).
FrameCodec ResolveCompression(const std::string& name,
                              const internal::TransportProtocol& protocol) {
  const std::optional<FrameCodec> asked = ParseCompression(name).value_or(FrameCodec::kNone);
  if (asked) return *asked;
  static absl::Mutex mu(absl::kConstInit);
  static std::set<std::string>* logged = new std::set<std::string>();
  absl::MutexLock l(&mu);
  if (logged->insert(protocol.name).second) {
    spdlog::info("Distribute: compression AUTO picked {} for the {} data plane",
                 FrameCodecName(protocol.auto_compression), protocol.name);
  }
  return protocol.auto_compression;
}

// Reads iteration `repetition` of the job `node` describes (the dataset or
// its id, the processing mode, the job's name, consumers and target
// workers, the dispatcher's address); `options` hold the client's own
// settings (its other fields are what built `node`).
class DataServiceIterator final : public Iterator {
 public:
  static absl::StatusOr<std::unique_ptr<Iterator>> Create(
      const proto::DatasetNode::DataService& node, const DistributeOptions& options,
      int64_t repetition, const std::string* resume) {
    SLUICE_ASSIGN_OR_RETURN(std::string address, internal::ParseServiceAddress(node.service()));
    SLUICE_ASSIGN_OR_RETURN(proto::ProcessingMode mode,
                            internal::ParseProcessingMode(node.processing_mode()));
    proto::ServiceCheckpoint resume_from;
    if (resume != nullptr) {
      if (mode != proto::DISTRIBUTED_EPOCH && node.num_consumers() == 0) {
        return absl::InvalidArgumentError(
            "the checkpoint holds a service position, but this Distribute is neither "
            "distributed_epoch nor coordinated reads: restore into the pipeline that saved it");
      }
      if (!resume_from.ParseFromString(*resume)) {
        return internal::CorruptCheckpoint("Distribute's position does not parse");
      }
    }
    SLUICE_ASSIGN_OR_RETURN(
        const internal::TransportProtocol* protocol,
        internal::FindTransportProtocol(options.data_transfer_protocol, "Distribute"));
    SLUICE_ASSIGN_OR_RETURN(
        const internal::TransportProtocol* grpc,
        internal::FindTransportProtocol(internal::kGrpcProtocol, "Distribute"));
    if (protocol->places_client_buffers) {
      // Place this process's receive pool and progress thread (the first
      // such iterator decides; the decision is logged once).
      PlacementConfig pc;
      pc.numa_node = options.numa_node.empty() ? "auto" : options.numa_node;
      pc.cpu_list = options.cpu_list;
      pc.gpu_pci_bus_id = options.gpu_pci_bus_id;
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
    const std::string& pinned = options.cuda_pinned;
    if (pinned != "off" && protocol->pin_client_buffers_for_cuda) {
      absl::Status s = protocol->pin_client_buffers_for_cuda();
      if (!s.ok() && pinned == "on") {
        return absl::Status(s.code(), absl::StrCat("Distribute: cuda_pinned=on: ", s.message()));
      }
      if (!s.ok()) {
        spdlog::debug("sluice client: receive arenas not pinned: {}", std::string(s.message()));
      }
    }
    ClientSecurity security = SecurityOf(options);
    SLUICE_ASSIGN_OR_RETURN(auto channel, internal::MakeSecureChannel(address, security));
    std::unique_ptr<DataServiceIterator> it(new DataServiceIterator(
        node, options, address, std::move(security), std::move(channel), protocol, grpc));
    const int64_t timeout = options.dispatcher_timeout_ms;
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
    if (resume != nullptr) *iter_req.mutable_resume() = resume_from;
    proto::GetOrCreateIterationResponse iter;
    SLUICE_RETURN_IF_ERROR(Call(it->stub_.get(),
                                &proto::DispatcherService::Stub::GetOrCreateIteration, iter_req,
                                &iter, address, timeout));
    it->client_id_ = iter.iteration_client_id();
    it->split_positions_ = iter.split_positions();
    it->first_round_ = iter.first_round();
    if (mode == proto::DISTRIBUTED_EPOCH) {
      // Whether the pipeline on the workers can resume (a FromDatasetId
      // consumer asks the dispatcher for it).
      proto::GetDatasetDefResponse registered;
      absl::Status known = absl::OkStatus();
      if (!node.has_dataset()) {
        proto::GetDatasetDefRequest req;
        req.set_dataset_id(dataset_id);
        known = Call(it->stub_.get(), &proto::DispatcherService::Stub::GetDatasetDef, req,
                     &registered, address, timeout);
      }
      auto source = internal::FindSplitSource(
          node.has_dataset() ? node.dataset().root() : registered.dataset().root());
      if (!known.ok()) {
        it->checkpoint_refusal_ = absl::StrCat(
            "Distribute cannot save its position: the dataset's definition could not be read "
            "to check that it resumes: ", known.message());
      } else if (source.ok() && source->unresumable_op != nullptr) {
        it->checkpoint_refusal_ = absl::StrCat(
            "Distribute cannot save its position: ", source->unresumable_op,
            " before it keeps the elements of a split from being produced again as they were "
            "(it ties them to no split, reads ahead across splits, or counts across them); "
            "move it after Distribute (docs/checkpointing.md)");
      }
    }
    it->MakeReader(resume != nullptr ? &resume_from : nullptr);
    GetCounters().started++;
    // Learn the current tasks at once; the heartbeat thread retries
    // transport failures.
    absl::Status hb = it->Heartbeat(absl::ZeroDuration());
    if (!hb.ok() && !absl::IsUnavailable(hb) && !absl::IsDeadlineExceeded(hb)) return hb;
    it->StartThreads();
    return std::unique_ptr<Iterator>(std::move(it));
  }

  // Stops the heartbeat and timer threads, cancels every request in flight
  // and waits for their callbacks, then releases the iteration client.
  ~DataServiceIterator() override {
    std::vector<std::shared_ptr<ElementTransport>> transports;
    std::vector<internal::PlannedRequest> leaving;
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      if (reader_ != nullptr) {
        reader_->Stop();
        leaving = reader_->Leave(tasks_);
      }
      for (auto& [id, t] : tasks_) transports.push_back(t.transport);
      if (heartbeat_ctx_ != nullptr) heartbeat_ctx_->TryCancel();
    }
    SayGoodbye(std::move(leaving));
    for (auto& t : transports) t->Cancel();
    {
      absl::MutexLock l(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return reader_ == nullptr || reader_->in_flight() == 0;  // (null: Create failed early)
      };
      mu_.Await(absl::Condition(&idle));
    }
    // Every request's callback ran; wait until the last of them has also
    // returned (it may still be past its last use of mu_).
    alive_.reset();
    callbacks_done_->WaitForNotification();
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

  // Tells the workers of the tasks it still reads that this consumer
  // leaves (ElementRequest::leaving): what they handed it counts as
  // delivered now, so their splits and tasks complete without waiting for
  // the ack or idle timeouts (a consumer that shares a job and stops early
  // held the others' epoch end back 10 s). Waits for their answers, at
  // most kLeaveAllowance.
  static void SayGoodbye(std::vector<internal::PlannedRequest> leaving) {
    if (leaving.empty()) return;
    struct Pending {
      absl::Mutex mu;
      size_t left ABSL_GUARDED_BY(mu) = 0;
    };
    auto pending = std::make_shared<Pending>();
    {
      absl::MutexLock l(&pending->mu);
      pending->left = leaving.size();
    }
    for (auto& p : leaving) {
      p.transport->GetElementAsync(p.request, [pending](absl::StatusOr<ElementResult>) {
        absl::MutexLock l(&pending->mu);
        --pending->left;
      });
    }
    absl::MutexLock l(&pending->mu);
    auto answered = [&pending]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pending->mu) {
      return pending->left == 0;
    };
    pending->mu.AwaitWithTimeout(absl::Condition(&answered), internal::kLeaveAllowance);
  }

  // This consumer's position in the iteration (proto::ServiceCheckpoint;
  // docs/checkpointing.md): distributed_epoch, by source positions;
  // coordinated reads, the round it returns next.
  absl::Status SaveState(proto::IteratorState* state) const override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!distributed_ && !coordinated_) {
      return absl::UnimplementedError(absl::StrCat(
          "Distribute cannot save a ", node_.processing_mode(),
          " position (Iterator::Save): every worker reads the whole dataset at its own pace, so "
          "no position of the job names what was delivered; use distributed_epoch "
          "(docs/checkpointing.md)"));
    }
    absl::MutexLock l(&mu_);
    if (!ErrorLocked().ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Distribute cannot save the position of a failed iteration: ",
          ErrorLocked().message()));
    }
    state->set_op(internal::kDataServiceOpName);
    if (coordinated_) {
      proto::ServiceCheckpoint c;
      c.set_version(1);
      c.set_consumers(1);
      c.set_num_consumers(node_.num_consumers());
      c.set_round(rounds_->return_round());
      state->set_blob(c.SerializeAsString());
      return absl::OkStatus();
    }
    if (!checkpoint_refusal_.empty()) return absl::UnimplementedError(checkpoint_refusal_);
    const internal::SplitProgressTracker* progress = reader_->progress();
    if (progress == nullptr || progress->untracked()) {
      return absl::UnimplementedError(
          "Distribute cannot save its position: the pipeline before it does not tie elements "
          "to splits of its source (an op such as Batch, Shuffle or Interleave runs before "
          "Distribute); move it after Distribute (docs/checkpointing.md)");
    }
    // A split is saved as done only below the watermark the consumer last
    // heard; the last long poll may be a second old, and every split that
    // completed since would be read again at the restore. Ask now.
    const int64_t want = heartbeats_sent_ + 1;
    fresh_watermark_wanted_ = true;
    NudgeHeartbeatLocked();
    auto heard = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return heartbeats_answered_ >= want || stop_ || DoneLocked() || !ErrorLocked().ok();
    };
    mu_.AwaitWithTimeout(absl::Condition(&heard), kSaveWatermarkWait);
    state->set_blob(progress->Save(split_positions_).SerializeAsString());
    return absl::OkStatus();
  }
  // The position was taken when the iteration was created (ServiceResume).
  absl::Status RestoreState(const proto::IteratorState& state) override {
    if (state.op() != internal::kDataServiceOpName) {
      return internal::CorruptCheckpoint(absl::StrCat("it saved ", state.op(),
                                                      " where the pipeline has Distribute"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<Element>> Next() override ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<internal::PlannedRequest> planned;
    absl::StatusOr<std::optional<Element>> out = std::optional<Element>();
    std::optional<uint64_t> key;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return reader_->HasElement() || !ErrorLocked().ok() || DoneLocked();
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
        if (WaitLocked(absl::Condition(&wake), kInterruptPollInterval)) continue;
        WarnIfStalledLocked(absl::Now() - waiting_since);
        // The caller may give up (Ctrl-C in Python): nothing was taken.
        mu_.Unlock();
        absl::Status interrupted = CheckInterrupt();
        mu_.Lock();
        if (!interrupted.ok()) return interrupted;
      }
      if (reader_->HasElement()) {
        out = std::optional<Element>(reader_->TakeElement());
        key = reader_->last_key();
        planned = PlanLocked();  // a reply slot may be free
      } else if (!ErrorLocked().ok()) {
        out = ErrorLocked();
      }
    }
    Send(std::move(planned));
    key_ = key;
    return out;
  }
  // The key the worker's pipeline gave the element (the ops that keep keys
  // on the worker keep it through Distribute): a random op after Distribute
  // draws the same whichever worker produced it.
  std::optional<uint64_t> ElementKey() const override { return key_; }

 private:
  DataServiceIterator(const proto::DatasetNode::DataService& node,
                      const DistributeOptions& options, std::string address,
                      ClientSecurity security, std::shared_ptr<grpc::Channel> channel,
                      const internal::TransportProtocol* protocol,
                      const internal::TransportProtocol* grpc)
      : node_(node),
        options_(options),
        protocol_(protocol),
        grpc_(grpc),
        address_(std::move(address)),
        security_(std::move(security)),
        max_element_bytes_(options.max_element_bytes),
        coordinated_(node.num_consumers() > 0),
        mode_(internal::ParseProcessingMode(node.processing_mode())
                  .value_or(proto::PROCESSING_MODE_UNSPECIFIED)),
        distributed_(mode_ == proto::DISTRIBUTED_EPOCH),
        compression_(ResolveCompression(options.compression, *protocol)),
        stub_(proto::DispatcherService::NewStub(std::move(channel))),
        callbacks_done_(std::make_shared<absl::Notification>()),
        alive_(nullptr, [done = callbacks_done_](void*) { done->Notify(); }),
        wake_fd_(static_cast<bool>(protocol->drive_client)) {}

  // The reader, once the client id is known; `resume` (a resumed
  // iteration's checkpoint) seeds a first-come reader's progress, so that a
  // checkpoint of the resumed iteration holds what it carried.
  void MakeReader(const proto::ServiceCheckpoint* resume) ABSL_LOCKS_EXCLUDED(mu_) {
    internal::ReaderOptions o;
    o.max_outstanding = node_.max_outstanding_requests();
    o.consumer_index = node_.consumer_index();
    o.client_id = client_id_;
    o.shared_job = !node_.job_name().empty();
    o.distributed = distributed_;
    o.element_wait = kElementWait;
    o.compression = compression_;
    o.max_elements_per_reply = options_.max_elements_per_reply;
    absl::MutexLock l(&mu_);
    if (coordinated_) {
      auto r = std::make_unique<internal::RoundReader>(o, first_round_);
      rounds_ = r.get();
      reader_ = std::move(r);
    } else {
      auto r = std::make_unique<internal::FcfsReader>(o);
      if (resume != nullptr) r->SeedProgress(*resume);
      reader_ = std::move(r);
    }
  }

  // The transport to a task's worker: the iteration's protocol when the
  // worker serves it, with gRPC (which every worker serves) as its
  // fallback; gRPC otherwise.
  absl::StatusOr<std::unique_ptr<ElementTransport>> Connect(const proto::TaskInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const internal::ElementTransportOptions o{
        security_, max_element_bytes_,
        EagerRepliesFromEnv().value_or(EagerReplies::kAuto)};
    auto grpc = grpc_->connect(info.worker_address(), o);
    if (protocol_ == grpc_) return grpc;
    if (info.transfer_protocol() != protocol_->name) {
      if (!warned_protocol_) {
        warned_protocol_ = true;
        spdlog::warn("sluice client: worker {} serves elements over {} only, not {}; using gRPC",
                     info.worker_address(),
                     info.transfer_protocol().empty() ? "gRPC" : info.transfer_protocol(),
                     protocol_->name);
      }
      return grpc;
    }
    if (!grpc.ok()) return grpc.status();
    auto primary = protocol_->connect(info.transfer_address(), o);
    if (!primary.ok()) {
      if (!options_.fallback_to_grpc) return primary.status();
      spdlog::warn("sluice client: cannot use {} to worker {} ({}); falling back to gRPC",
                   protocol_->name, info.worker_address(),
                   std::string(primary.status().message()));
      return grpc;
    }
    return MakeFallbackTransport(*std::move(primary), *std::move(grpc), info.worker_address(),
                                 options_.fallback_to_grpc);
  }

  // The iteration's error: the reader's (a worker's own error), else one
  // the dispatcher or the client itself found.
  absl::Status ErrorLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return error_.ok() ? reader_->error() : error_;
  }

  // Every task this client knows was read to its end (or lost), nothing is
  // in flight, and the dispatcher said the iteration finished.
  bool ReadAllLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!iteration_finished_ || reader_->in_flight() > 0) return false;
    for (const auto& [id, t] : tasks_) {
      if (!t.end_of_sequence && !t.lost) return false;
    }
    return true;
  }

  // The end, confirmed with the dispatcher: the client read everything
  // and told the dispatcher so at the version it had seen finished (a
  // worker that joined meanwhile would have given it a task to read).
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return confirmed_end_; }

  // Next() has waited `waited` for an element: once it is stall_warning_ms
  // with no worker to read (none registered, or every task lost), say so,
  // once per iterator, with where the dispatcher is.
  void WarnIfStalledLocked(absl::Duration waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (warned_stall_ || options_.stall_warning_ms <= 0 ||
        waited < absl::Milliseconds(options_.stall_warning_ms)) {
      return;
    }
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
  void NudgeHeartbeatLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (nudged_) return;
    nudged_ = true;
    if (heartbeat_ctx_ != nullptr) heartbeat_ctx_->TryCancel();
  }

  void StartThreads() {
    threads_.emplace_back([this] { HeartbeatLoop(); });
    threads_.emplace_back([this] { TimerLoop(); });
  }

  // Waits until `wake` holds (true) or `max` passed. Over a protocol that
  // lets it (TransportProtocol::drive_client), this thread runs the
  // protocol's progress meanwhile, so the reply it waits for wakes it
  // directly; changes that arrive otherwise (a heartbeat, a gRPC reply)
  // write wake_fd_ (WakeDriverLocked).
  bool WaitLocked(const absl::Condition& wake, absl::Duration max)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time deadline = absl::Now() + max;
    while (wake_fd_.fd() >= 0) {
      if (wake.Eval()) return true;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      driver_ = std::this_thread::get_id();
      mu_.Unlock();
      const bool drove = protocol_->drive_client(left, wake_fd_.fd());
      mu_.Lock();
      driver_.reset();
      wake_written_ = false;  // (the drive read it)
      if (!drove) break;  // another thread runs the callbacks: wait for them
    }
    return mu_.AwaitWithDeadline(wake, deadline);
  }

  // A thread other than the one driving the protocol in WaitLocked changed
  // what it waits for: wakes it.
  void WakeDriverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!driver_.has_value() || *driver_ == std::this_thread::get_id() || wake_written_) return;
    wake_written_ = true;
    wake_fd_.Signal();
  }

  // The requests the reader wants sent now (sent by Send, without mu_).
  std::vector<internal::PlannedRequest> PlanLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_ || !error_.ok()) return {};
    return reader_->Plan(tasks_, absl::Now());
  }

  // Sends planned requests; each reply comes back through OnReply on a
  // transport's thread (or at once, on this one).
  void Send(std::vector<internal::PlannedRequest> planned) ABSL_LOCKS_EXCLUDED(mu_) {
    for (auto& p : planned) {
      // Taken out first: the callback below takes `p` over.
      std::shared_ptr<ElementTransport> transport = p.transport;
      const ElementRequest request = std::move(p.request);
      transport->GetElementAsync(
          request, [this, p = std::move(p), alive = alive_](absl::StatusOr<ElementResult> r) mutable {
            OnReply(std::move(p), std::move(r));
          });
    }
  }

  void OnReply(internal::PlannedRequest p, absl::StatusOr<ElementResult> r)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<internal::PlannedRequest> planned;
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = absl::Now();
      const bool failed = !r.ok();
      reader_->OnReply(tasks_, p, std::move(r), now);
      WakeDriverLocked();  // (a reply from another protocol's thread)
      FlushCountersLocked();
      planned = PlanLocked();
      // Only a failure schedules a retry for later (a not-ready round is
      // planned again at once): wake the timer if that is sooner than it
      // sleeps. A reply with elements touches neither.
      if (failed && reader_->NextWakeup(tasks_) < timer_deadline_) timer_kick_ = true;
    }
    Send(std::move(planned));
  }

  void FlushCountersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    internal::ReaderCounters& c = reader_->counters();
    Counters& g = GetCounters();
    g.elements += c.elements;
    g.bytes += c.bytes;
    g.worker_errors += c.worker_errors;
    g.duplicates += c.duplicates;
    g.rounds_skipped += c.rounds_skipped;
    c = internal::ReaderCounters();
  }

  // Retries after a backoff: sleeps until the reader's next wakeup (or a
  // kick), then plans.
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::vector<internal::PlannedRequest> planned;
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
        timer_deadline_ = std::min(reader_->NextWakeup(tasks_), absl::Now() + absl::Seconds(1));
        timer_kick_ = false;
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || timer_kick_; };
        mu_.AwaitWithDeadline(absl::Condition(&woken), timer_deadline_);
        if (stop_) return;
        planned = PlanLocked();
      }
      Send(std::move(planned));
    }
  }

  // One heartbeat; records tasks, losses, failure and the end, then sends
  // what the reader can ask of new tasks.
  absl::Status Heartbeat(absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_) {
    proto::ClientHeartbeatRequest req;
    req.set_iteration_client_id(client_id_);
    req.set_reports_splits(true);
    grpc::ClientContext ctx;
    bool at_end;
    int64_t seq;
    {
      absl::MutexLock l(&mu_);
      if (stop_) return absl::CancelledError("stopping");
      // Read to the end (the user took every element): ask to end.
      at_end = ReadAllLocked() && !reader_->HasElement();
      if (at_end) wait = absl::ZeroDuration();
      if (fresh_watermark_wanted_) {  // Save() waits for this answer
        wait = absl::ZeroDuration();
        fresh_watermark_wanted_ = false;
      }
      if (!to_report_.empty()) {
        // Splits reassigned from a lost task wait for what we received of
        // them; a request to a lost task still in flight could add to it.
        auto reports = reader_->SplitReports(tasks_, to_report_);
        if (reports) {
          for (auto& r : *reports) *req.add_reported_splits() = std::move(r);
          wait = absl::ZeroDuration();
        } else {
          wait = std::min(wait, kReportRetry);
        }
      }
      seq = ++heartbeats_sent_;
      internal::SetTimeout(&ctx, wait + absl::Seconds(5));
      req.set_at_end(at_end);
      req.set_known_version(version_);
      req.set_wait_ms(absl::ToInt64Milliseconds(wait));
      req.set_current_round(rounds_ != nullptr ? rounds_->next_round() : -1);
      req.set_blocked_round(rounds_ != nullptr ? rounds_->honoured_block() : -1);
      heartbeat_ctx_ = &ctx;
    }
    proto::ClientHeartbeatResponse resp;
    grpc::Status s = stub_->ClientHeartbeat(&ctx, req, &resp);
    std::vector<std::shared_ptr<ElementTransport>> lost;
    std::vector<internal::PlannedRequest> planned;
    {
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
            WakeDriverLocked();
            return error_;
          }
          internal::ClientTask t;
          t.id = info.task_id();
          t.worker = info.worker_address();
          t.transport = std::move(*transport);
          t.starting_round = info.starting_round();
          it = tasks_.emplace(t.id, std::move(t)).first;
        }
        internal::ClientTask& t = it->second;
        if (info.lost() && !t.lost && !t.end_of_sequence) {
          t.lost = true;
          lost.push_back(t.transport);
          reader_->OnTaskLost(tasks_, t);
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
      reader_->SetSplitWatermark(tasks_, resp.completed_split_watermark());
      to_report_.assign(resp.report_splits().begin(), resp.report_splits().end());
      heartbeats_answered_ = seq;
      if (resp.has_error() && resp.error().code() != 0 && error_.ok()) {
        error_ = internal::FromProto(resp.error());
      }
      iteration_finished_ = resp.iteration_finished();
      if (rounds_ != nullptr) rounds_->SetBlock(resp.block_round());
      WakeDriverLocked();
      planned = PlanLocked();
    }
    // A lost task's requests end now (their callbacks run meanwhile).
    for (auto& t : lost) t->Cancel();
    Send(std::move(planned));
    return absl::OkStatus();
  }

  void HeartbeatLoop() {
    absl::Time failing_since = absl::InfiniteFuture();
    while (true) {
      absl::Status s = Heartbeat(kHeartbeatWait);
      absl::MutexLock l(&mu_);
      if (stop_ || !ErrorLocked().ok() || DoneLocked()) return;
      if (s.ok() || (absl::IsCancelled(s) && nudged_)) {  // a nudge cut the poll short
        failing_since = absl::InfiniteFuture();
        nudged_ = false;
        continue;
      }
      if (absl::IsNotFound(s)) {  // our iteration client was released or timed out
        error_ = s;
        WakeDriverLocked();
        return;
      }
      absl::Time now = absl::Now();
      if (failing_since == absl::InfiniteFuture()) failing_since = now;
      if (now - failing_since > absl::Milliseconds(options_.dispatcher_timeout_ms)) {
        error_ = absl::UnavailableError(absl::StrCat(
            "lost contact with the sluice dispatcher at ", address_, " for more than ",
            options_.dispatcher_timeout_ms, " ms: ", s.message()));
        WakeDriverLocked();
        return;
      }
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::Milliseconds(200));
    }
  }

  const proto::DatasetNode::DataService node_;
  const DistributeOptions options_;
  // The iteration's transfer protocol, and gRPC (its fallback).
  const internal::TransportProtocol* const protocol_;
  const internal::TransportProtocol* const grpc_;
  const std::string address_;
  const ClientSecurity security_;  // for the dispatcher and every worker
  const int64_t max_element_bytes_;
  const bool coordinated_;
  const proto::ProcessingMode mode_;
  const bool distributed_;
  const FrameCodec compression_;  // asked of the workers
  std::unique_ptr<proto::DispatcherService::Stub> stub_;
  // Every request's callback holds a copy of alive_; when the destructor
  // drops its own and the last callback is destroyed, callbacks_done_ fires.
  // (Written by the constructor and the destructor only: requests are sent
  // before their callbacks can let the destructor past in_flight() == 0.)
  const std::shared_ptr<absl::Notification> callbacks_done_;
  std::shared_ptr<void> alive_;
  int64_t client_id_ = 0;
  int64_t split_positions_ = 0;  // distributed_epoch: what checkpoints are saved over
  int64_t first_round_ = 0;      // coordinated reads: where the consumers start
  std::string checkpoint_refusal_;  // why Save() cannot work (set by Create)
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  std::map<int64_t, internal::ClientTask> tasks_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<internal::Reader> reader_ ABSL_GUARDED_BY(mu_);
  internal::RoundReader* rounds_ ABSL_GUARDED_BY(mu_) = nullptr;  // reader_, if coordinated
  int64_t version_ ABSL_GUARDED_BY(mu_) = -1;
  bool iteration_finished_ ABSL_GUARDED_BY(mu_) = false;
  bool confirmed_end_ ABSL_GUARDED_BY(mu_) = false;  // see DoneLocked()
  mutable bool nudged_ ABSL_GUARDED_BY(mu_) = false;  // see NudgeHeartbeatLocked()
  // distributed_epoch: splits the dispatcher asked us to report on
  // (ClientHeartbeatResponse.report_splits), as of its last answer.
  std::vector<int64_t> to_report_ ABSL_GUARDED_BY(mu_);
  // Heartbeats sent, the last one answered, and whether Save() wants the
  // next one at once (SaveState).
  int64_t heartbeats_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_answered_ ABSL_GUARDED_BY(mu_) = 0;
  mutable bool fresh_watermark_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_protocol_ ABSL_GUARDED_BY(mu_) = false;  // see Connect()
  bool warned_stall_ ABSL_GUARDED_BY(mu_) = false;  // see WarnIfStalledLocked()
  // The key of the element Next() last returned (only the caller's thread).
  std::optional<uint64_t> key_;
  // The timer thread sleeps until timer_deadline_ unless kicked.
  absl::Time timer_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool timer_kick_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the dispatcher's or the client's own
  grpc::ClientContext* heartbeat_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  // WaitLocked: the thread driving the protocol's progress, and its wake-up
  // (none where the protocol has no drive_client); written once until the
  // driver reads it.
  const internal::EventFd wake_fd_;
  std::optional<std::thread::id> driver_ ABSL_GUARDED_BY(mu_);
  bool wake_written_ ABSL_GUARDED_BY(mu_) = false;
};

// What Distribute and FromDatasetId attach to the node they build.
class ClientServiceReader final : public internal::ServiceReader {
 public:
  explicit ClientServiceReader(DistributeOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(
      const proto::DatasetNode::DataService& node, int64_t repetition,
      const std::string* resume) const override {
    return DataServiceIterator::Create(node, options_, repetition, resume);
  }

 private:
  const DistributeOptions options_;
};

// MergeCheckpoints: the path from a checkpoint's root to its Distribute
// state (empty when it has none).
bool PathToService(proto::IteratorState* state, std::vector<proto::IteratorState*>* path) {
  path->push_back(state);
  if (state->op() == internal::kDataServiceOpName) return true;
  for (proto::IteratorState& in : *state->mutable_inputs()) {
    if (PathToService(&in, path)) return true;
  }
  path->pop_back();
  return false;
}

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
  if (o.max_elements_per_reply < 1 || o.max_elements_per_reply > kMaxElementsPerReply) {
    return absl::InvalidArgumentError(
        absl::StrCat("Distribute: max_elements_per_reply must be in [1, ", kMaxElementsPerReply,
                     "]; got ", o.max_elements_per_reply));
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
  if (o.cuda_pinned != "auto" && o.cuda_pinned != "on" && o.cuda_pinned != "off") {
    return absl::InvalidArgumentError(absl::StrCat("Distribute: cuda_pinned must be auto, on or "
                                                   "off; got '", o.cuda_pinned, "'"));
  }
  SLUICE_RETURN_IF_ERROR(ParseCompression(o.compression).status());
  SLUICE_RETURN_IF_ERROR(EagerRepliesFromEnv().status());
  SLUICE_ASSIGN_OR_RETURN(
      const internal::TransportProtocol* protocol,
      internal::FindTransportProtocol(o.data_transfer_protocol, "Distribute"));
  if (o.cuda_pinned == "on" && !protocol->pin_client_buffers_for_cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Distribute: cuda_pinned=on needs a data plane with receive arenas (ucx); ",
        o.data_transfer_protocol, " has none"));
  }
  SLUICE_RETURN_IF_ERROR(internal::ValidateAuthToken(o.auth_token, "Distribute"));
  return absl::OkStatus();
}

// The node's description of what is read; the client's own settings
// (ClientServiceReader's) stay out of it.
proto::DatasetNode MakeNode(const DistributeOptions& o) {
  proto::DatasetNode n;
  auto* d = n.mutable_data_service();
  d->set_processing_mode(o.processing_mode);
  d->set_service(o.service);
  d->set_job_name(o.job_name);
  d->set_max_outstanding_requests(o.max_outstanding_requests);
  d->set_consumer_index(o.consumer_index.value_or(-1));
  d->set_num_consumers(o.num_consumers.value_or(0));
  d->set_target_workers(o.target_workers);
  return n;
}

Dataset DistributeDataset(const Dataset& input, const DistributeOptions& options) {
  absl::Status s = ValidateOptions(options);
  if (s.ok() && ContainsDataService(*input.rep()->analysis)) {
    s = absl::InvalidArgumentError("Distribute: the pipeline already contains a Distribute");
  }
  if (s.ok()) s = internal::CheckWireDepth(input.def(), "Distribute");
  if (!s.ok()) return internal::MakeErrorDataset(std::move(s));
  proto::DatasetNode n = MakeNode(options);
  *n.mutable_data_service()->mutable_dataset() = input.def();
  return internal::MakeDataServiceDataset(std::move(n), &input,
                                          std::make_shared<ClientServiceReader>(options));
}

}  // namespace

std::function<Dataset(const Dataset&)> Distribute(DistributeOptions options) {
  return [options = std::move(options)](const Dataset& input) {
    if (!input.status().ok()) return input;
    return DistributeDataset(input, options);
  };
}

Dataset FromDatasetId(const std::string& processing_mode, const std::string& service,
                      const std::string& dataset_id, const DistributeOptions& options) {
  DistributeOptions o = options;
  o.processing_mode = processing_mode;
  o.service = service;
  absl::Status s = ValidateOptions(o);
  if (s.ok() && dataset_id.empty()) s = absl::InvalidArgumentError("FromDatasetId: empty dataset_id");
  if (!s.ok()) return internal::MakeErrorDataset(std::move(s));
  proto::DatasetNode n = MakeNode(o);
  n.mutable_data_service()->set_dataset_id(dataset_id);
  return internal::MakeDataServiceDataset(std::move(n), nullptr,
                                          std::make_shared<ClientServiceReader>(std::move(o)));
}

namespace {

absl::StatusOr<std::string> RegisterWith(const std::string& service, const Dataset& dataset,
                                         const std::string& dataset_id,
                                         const ClientSecurity& security, int64_t timeout_ms) {
  SLUICE_RETURN_IF_ERROR(dataset.status());
  if (ContainsDataService(*dataset.rep()->analysis)) {
    // Workers cannot read from the service (the node has no reader there).
    return absl::InvalidArgumentError(
        "RegisterDataset: the pipeline contains a Distribute; register the part before it");
  }
  SLUICE_RETURN_IF_ERROR(internal::CheckWireDepth(dataset.def(), "RegisterDataset"));
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
  return RegisterWith(options.service, dataset, dataset_id, SecurityOf(options),
                      options.dispatcher_timeout_ms);
}

absl::StatusOr<std::string> MergeCheckpoints(const std::vector<std::string>& checkpoints) {
  if (checkpoints.empty()) return absl::InvalidArgumentError("MergeCheckpoints: no checkpoints");
  std::vector<proto::IteratorCheckpoint> parsed(checkpoints.size());
  std::vector<proto::ServiceCheckpoint> services(checkpoints.size());
  std::vector<std::vector<proto::IteratorState*>> paths(checkpoints.size());
  for (size_t i = 0; i < checkpoints.size(); ++i) {
    proto::IteratorCheckpoint& c = parsed[i];
    if (!c.ParseFromString(checkpoints[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MergeCheckpoints: checkpoint ", i, " cannot be parsed: truncated or corrupt"));
    }
    if (c.format_version() != parsed[0].format_version() ||
        c.fingerprint() != parsed[0].fingerprint()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MergeCheckpoints: checkpoint ", i, " is of another pipeline or format than checkpoint 0"));
    }
    if (!PathToService(c.mutable_root(), &paths[i]) ||
        !services[i].ParseFromString(paths[i].back()->blob())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MergeCheckpoints: checkpoint ", i, " holds no service position (a Distribute in "
          "distributed_epoch)"));
    }
    for (size_t d = 0; d + 1 < paths[i].size(); ++d) {
      if (paths[i][d]->elements_size() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MergeCheckpoints: in checkpoint ", i, ", ", paths[i][d]->op(), " after Distribute "
            "holds ", paths[i][d]->elements_size(), " element(s) that a merged checkpoint cannot "
            "keep; save when it holds none (after a whole batch was taken)"));
      }
    }
  }
  SLUICE_ASSIGN_OR_RETURN(proto::ServiceCheckpoint merged,
                          internal::MergeServiceCheckpoints(services));
  paths[0].back()->set_blob(merged.SerializeAsString());
  return parsed[0].SerializeAsString();
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
