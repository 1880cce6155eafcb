#include "sluice/control/dispatcher_impl.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

namespace {

// A caller-chosen dataset id: 1-128 bytes of [A-Za-z0-9._-].
absl::Status ValidateDatasetId(const std::string& id) {
  constexpr size_t kMaxDatasetIdBytes = 128;
  const bool ok_chars = std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (id.size() > kMaxDatasetIdBytes || !ok_chars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterDataset: dataset id '", absl::CHexEscape(id.substr(0, kMaxDatasetIdBytes)),
        "' must be 1-", kMaxDatasetIdBytes, " characters of [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int64_t> MatchWorkerAddress(
    const std::vector<std::string>& patterns, const std::string& address,
    const std::function<bool(int64_t)>& free) {
  std::optional<int64_t> wildcard;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& p = patterns[i];
    if (p == address) return static_cast<int64_t>(i);
    constexpr std::string_view kPort = ":%port%";
    if (!wildcard && p.size() > kPort.size() && p.ends_with(kPort) &&
        address.starts_with(p.substr(0, p.size() - kPort.size() + 1)) &&
        address.find(':', p.size() - kPort.size() + 1) == std::string::npos &&
        free(static_cast<int64_t>(i))) {
      wildcard = static_cast<int64_t>(i);
    }
  }
  return wildcard;
}

absl::Status ValidateWorkerAddresses(const std::vector<std::string>& patterns) {
  std::set<std::string> seen;
  for (const std::string& p : patterns) {
    size_t colon = p.rfind(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < p.size();
    if (ok && p.substr(colon + 1) != "%port%") {
      for (char c : p.substr(colon + 1)) ok = ok && c >= '0' && c <= '9';
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker_addresses: '", p, "' is not host:port or host:%port%"));
    }
    if (p.substr(colon + 1) != "%port%" && !seen.insert(p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_addresses: '", p, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

DispatcherImpl::DispatcherImpl(DispatcherConfig config, Clock clock, WorkerProbe probe)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      probe_(std::move(probe)),
      shard_claims_(config_.worker_addresses.size()) {}

absl::Duration DispatcherImpl::MaxWorkerWait() const {
  return absl::Milliseconds(config_.worker_timeout_ms) / kLongPollTimeoutFraction;
}

absl::Duration DispatcherImpl::MaxClientWait() const {
  return absl::Milliseconds(config_.client_timeout_ms) / kLongPollTimeoutFraction;
}

void DispatcherImpl::WakeLocked(const PollKey& key) {
  if (polls_.Wake(key)) poll_cv_.Signal();
}

void DispatcherImpl::BumpVersionLocked(Iteration& it) {
  ++it.version;
  WakeLocked(VersionKey(it.id));
}

void DispatcherImpl::BumpSplitVersionLocked(Iteration& it) {
  ++it.split_version;
  WakeLocked(SplitsKey(it.id));
}

absl::Status DispatcherImpl::RunPollLocked(PollFn& poll, const IsCancelled& cancelled) {
  PollStep step;
  while (true) {
    const bool timed_out = step.wait && !step.ready();
    step = PollStep();
    step.timed_out = timed_out;
    absl::Status s = poll(&step);
    if (!s.ok() || !step.wait) return s;
    if (!polls_.Await(mu_, step.key, step.ready, step.deadline - absl::Now(), cancelled,
                      kCancelCheckInterval)) {
      // The caller went away: no reply reaches it, and nothing is credited.
      return absl::CancelledError("the caller went away");
    }
  }
}

int64_t DispatcherImpl::NewPollId() {
  absl::MutexLock l(&mu_);
  return polls_.NewId();
}

void DispatcherImpl::StartPoll(int64_t id, absl::StatusOr<PollFn> poll, PollDone done) {
  absl::Status s = poll.status();
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) {
      // The poll thread may be gone: nothing would send a queued reply.
      s = absl::UnavailableError("the dispatcher is shutting down");
      poll = s;
    }
    PollStep step;
    if (s.ok()) s = (*poll)(&step);
    if (s.ok() && step.wait && !shutdown_) {
      ParkLocked(id, {*std::move(poll), std::move(step), std::move(done)});
      return;
    }
    // Answered now. Unless what it saw is already durable, the poll thread
    // sends the reply once it is: a callback thread never waits for a disk.
    if (!shutdown_ && journal_ != nullptr &&
        (journal_durable_ < journal_applied_ || !journal_error_.ok())) {
      QueueReplyLocked(std::move(done), std::move(s));
      return;
    }
  }
  done(std::move(s));
}

void DispatcherImpl::QueueReplyLocked(PollDone done, absl::Status s) {
  replies_.push_back({journal_applied_, std::move(done), std::move(s)});
  EnsurePollThreadLocked();
  poll_cv_.Signal();
}

void DispatcherImpl::EnsurePollThreadLocked() {
  if (!poll_thread_.joinable()) poll_thread_ = std::thread([this] { PollThread(); });
}

void DispatcherImpl::StartWorkerHeartbeat(int64_t id, const proto::WorkerHeartbeatRequest& req,
                                          proto::WorkerHeartbeatResponse* resp, PollDone done) {
  StartPoll(id, WorkerHeartbeatPoll(req, resp), std::move(done));
}
void DispatcherImpl::StartClientHeartbeat(int64_t id, const proto::ClientHeartbeatRequest& req,
                                          proto::ClientHeartbeatResponse* resp, PollDone done) {
  StartPoll(id, ClientHeartbeatPoll(req, resp), std::move(done));
}
void DispatcherImpl::StartGetSplit(int64_t id, const proto::GetSplitRequest& req,
                                   proto::GetSplitResponse* resp, PollDone done) {
  StartPoll(id, GetSplitPoll(req, resp), std::move(done));
}

void DispatcherImpl::ParkLocked(int64_t id, Parked parked) {
  polls_.Park(id, std::move(parked));
  EnsurePollThreadLocked();
  poll_cv_.Signal();  // the poll thread may sleep past this deadline
}

std::optional<DispatcherImpl::Parked> DispatcherImpl::UnparkLocked(int64_t id) {
  return polls_.Unpark(id);
}

void DispatcherImpl::CancelPoll(int64_t id) {
  std::optional<Parked> parked;
  {
    absl::MutexLock l(&mu_);
    parked = UnparkLocked(id);
  }
  if (parked) parked->done(absl::CancelledError("the caller went away"));
}

void DispatcherImpl::PollThread() {
  absl::MutexLock l(&mu_);
  while (!(shutdown_ && polls_.empty() && replies_.empty())) {
    bool progress = false;
    // Woken polls, and polls whose wait ran out (all of them at shutdown):
    // their next step, and their reply queued when they answer.
    for (const auto& [id, timed_out] : polls_.Due(absl::Now(), shutdown_)) {
      const Parked* p = polls_.Find(id);
      if (p == nullptr) continue;  // answered or cancelled already
      const bool ready = p->step.ready();
      if (!timed_out && !ready) continue;  // a wake-up that did not concern it
      progress = true;
      Parked parked = *UnparkLocked(id);
      PollStep step;
      step.timed_out = !ready;
      absl::Status s = parked.poll(&step);
      if (s.ok() && step.wait && !shutdown_) {
        ParkLocked(id, {std::move(parked.poll), std::move(step), std::move(parked.done)});
      } else {
        replies_.push_back({journal_applied_, std::move(parked.done), std::move(s)});
      }
    }
    // Group commit for the replies: write what they wait for (unless a
    // writer runs: its end wakes this thread).
    if (!replies_.empty() && journal_ != nullptr && journal_error_.ok() && !journal_writing_ &&
        journal_durable_ < replies_.back().target) {
      WriteJournalLocked();  // releases mu_ while it writes
      progress = true;
    }
    // The replies whose state is durable (every one, failing, once the
    // journal failed) go out, in order, without the lock.
    const bool failed = journal_ != nullptr && !journal_error_.ok();
    std::vector<PendingReply> send;
    while (!replies_.empty() &&
           (journal_ == nullptr || failed || replies_.front().target <= journal_durable_)) {
      send.push_back(std::move(replies_.front()));
      replies_.pop_front();
    }
    if (!send.empty()) {
      const absl::Status error = failed ? journal_error_ : absl::OkStatus();
      mu_.Unlock();
      for (PendingReply& r : send) r.done(error.ok() ? std::move(r.status) : error);
      mu_.Lock();
      continue;
    }
    if (progress) continue;
    poll_cv_.WaitWithDeadline(&mu_, polls_.NextDeadline());
  }
}

DispatcherImpl::~DispatcherImpl() {
  Shutdown();
  if (poll_thread_.joinable()) poll_thread_.join();
  if (compact_thread_.joinable()) compact_thread_.join();
}

absl::Status DispatcherImpl::ValidateRegistration(const proto::WorkerHeartbeatRequest& req) {
  SLUICE_RETURN_IF_ERROR(ValidateDialableAddress(req.worker_address(), "worker_address"));
  const std::string& protocol = req.transfer_protocol();
  // The dispatcher relays the name to clients, which know the protocols
  // (dataplane/transport_registry.h); it only checks that it is a name.
  const bool name_like =
      protocol.size() <= 32 && std::all_of(protocol.begin(), protocol.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.';
      });
  if (!name_like) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", req.worker_address(), ": transfer_protocol '",
        absl::CHexEscape(protocol.substr(0, 64)),
        "' is not a protocol name (at most 32 letters, digits, '_', '-' or '.')"));
  }
  if (!req.transfer_address().empty()) {
    SLUICE_RETURN_IF_ERROR(ValidateDialableAddress(
        req.transfer_address(), absl::StrCat("worker ", req.worker_address(), ": transfer_address")));
  }
  return absl::OkStatus();
}

void DispatcherImpl::Shutdown() {
  absl::MutexLock l(&mu_);
  shutdown_ = true;
  polls_.WakeAllThreads();
  poll_cv_.Signal();  // answers every parked poll
}

// ---- journal ------------------------------------------------------------------

namespace {

template <typename Map, typename Key>
absl::Status MustExist(const Map& m, const Key& key, absl::string_view what) {
  if (m.count(key)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(what, " ", key, " does not exist"));
}

}  // namespace

absl::Status DispatcherImpl::RecordLocked(const proto::JournalRecord& rec) {
  if (rec.updates_size() == 0) return absl::OkStatus();
  std::string bytes;
  if (journal_ != nullptr) {
    SLUICE_RETURN_IF_ERROR(journal_error_);
    if (!rec.SerializeToString(&bytes)) {
      return absl::InternalError("dispatcher journal: cannot serialize a state change");
    }
    if (bytes.size() > kMaxRecordBytes) {
      return absl::UnavailableError(absl::StrCat(
          "the dispatcher cannot journal this change (a record of ", bytes.size(),
          " bytes exceeds the journal's limit of ", kMaxRecordBytes, " bytes)"));
    }
  }
  for (const proto::JournalUpdate& u : rec.updates()) {
    absl::Status s = ApplyLocked(u);
    if (!s.ok()) {
      // Inconsistent with the state: a bug (and a replay would stop at this
      // record, so it is not journaled).
      spdlog::error("dispatcher: cannot apply a state change: {}", std::string(s.message()));
      return absl::InternalError(absl::StrCat("dispatcher state change failed: ", s.message()));
    }
  }
  if (journal_ != nullptr) {
    journal_queue_.push_back(std::move(bytes));
    ++journal_applied_;
    ++stats_.journal_records;
    ++records_in_journal_;
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::AwaitDurable(absl::Status reply) {
  absl::MutexLock l(&mu_);
  if (journal_ == nullptr) return reply;
  const int64_t target = journal_applied_;
  while (journal_durable_ < target && journal_error_.ok()) {
    if (journal_writing_) {
      journal_cv_.Wait(&mu_);
    } else {
      WriteJournalLocked();
    }
  }
  if (!journal_error_.ok()) return journal_error_;
  return reply;
}

void DispatcherImpl::WriteJournalLocked() {
  journal_writing_ = true;
  std::vector<std::string> batch;
  batch.swap(journal_queue_);
  const int64_t upto = journal_applied_;
  // Records after a snapshot being written go into the compacted journal
  // too, when it is installed.
  if (compacting_) retained_.insert(retained_.end(), batch.begin(), batch.end());
  // Records and bytes: a snapshot of a big fleet (hundreds of thousands of
  // tasks) is large while the records that follow (splits) are small, so
  // counting records alone would rewrite it every few seconds.
  JournalWriter* journal = journal_.get();
  if (!compacting_ &&
      records_in_journal_ >= std::max(compaction_min_records_, 4 * records_in_last_snapshot_) &&
      journal->size() >= 4 * bytes_in_last_snapshot_) {
    // The snapshot holds every change applied so far, this batch's too; it
    // is written by a thread of its own while appends go on.
    compacting_ = true;
    compact_upto_ = journal_applied_;
    if (compact_thread_.joinable()) compact_thread_.join();  // it has left the lock for good
    compact_thread_ = std::thread(
        [this, snapshot = SnapshotLocked(), before = journal->size()]() mutable {
          CompactInBackground(std::move(snapshot), before);
        });
  }
  mu_.Unlock();
  const absl::Status written = journal->AppendBatch(batch);
  mu_.Lock();
  journal_writing_ = false;
  stats_.journal_syncs = journal->syncs();
  if (written.ok()) {
    journal_durable_ = upto;
  } else {
    spdlog::error("dispatcher: journal write failed; no further change is accepted and every "
                  "request fails until the dispatcher is restarted (it replays its journal): {}",
                  std::string(written.message()));
    journal_error_ = absl::UnavailableError(absl::StrCat(
        "the dispatcher cannot journal changes (", written.message(),
        "); it must be restarted, retry later"));
  }
  journal_cv_.SignalAll();
  poll_cv_.Signal();  // replies waiting in the poll thread may go out
}

void DispatcherImpl::CompactInBackground(std::vector<std::string> snapshot,
                                         uint64_t bytes_before) {
  absl::Status s = journal_->WriteCompacted(snapshot);
  absl::MutexLock l(&mu_);
  while (journal_writing_) journal_cv_.Wait(&mu_);
  if (s.ok()) s = journal_error_;
  if (s.ok()) {
    // Every retained record is in the old journal now; the new one gets
    // them after the snapshot. Appends wait meanwhile (a short write).
    journal_writing_ = true;
    std::vector<std::string> tail = std::move(retained_);
    mu_.Unlock();
    s = journal_->InstallCompacted(tail);
    mu_.Lock();
    journal_writing_ = false;
    stats_.journal_syncs = journal_->syncs();
  }
  compacting_ = false;
  retained_.clear();
  if (s.ok()) {
    CompactedLocked(snapshot, bytes_before);
    records_in_journal_ += journal_applied_ - compact_upto_;  // applied since the snapshot
  } else {
    // The old journal stays in use, whole; it just stays long.
    spdlog::warn("dispatcher: journal compaction failed: {}", std::string(s.message()));
    records_in_last_snapshot_ = records_in_journal_;  // do not retry at every write
    bytes_in_last_snapshot_ = bytes_before;
  }
  journal_cv_.SignalAll();
  poll_cv_.Signal();
}

void DispatcherImpl::CompactedLocked(const std::vector<std::string>& snapshot,
                                     uint64_t bytes_before) {
  // The snapshot's own size (the installed file may hold records appended
  // while it was written, after it).
  uint64_t bytes = kJournalHeaderBytes;
  for (const std::string& r : snapshot) bytes += kJournalRecordHeaderBytes + r.size();
  spdlog::info("dispatcher: journal compacted from {} records ({} bytes) to a snapshot of {} "
               "records ({} bytes)",
               records_in_journal_, bytes_before, snapshot.size(), bytes);
  records_in_journal_ = records_in_last_snapshot_ = static_cast<int64_t>(snapshot.size());
  bytes_in_last_snapshot_ = bytes;
  ++stats_.journal_compactions;
}

void DispatcherImpl::SetCompactionMinRecords(int64_t min_records) {
  absl::MutexLock l(&mu_);
  compaction_min_records_ = std::max<int64_t>(1, min_records);
}

void DispatcherImpl::SetJournalFaultHookForTesting(
    std::function<void(JournalWriter::Stage)> hook) {
  absl::MutexLock l(&mu_);
  while (journal_writing_) journal_cv_.Wait(&mu_);
  if (journal_ != nullptr) journal_->SetFaultHookForTesting(std::move(hook));
}

absl::Status DispatcherImpl::CompactJournal() {
  absl::MutexLock l(&mu_);
  if (journal_ == nullptr) return absl::FailedPreconditionError("no journal is open");
  while (journal_writing_ || compacting_) journal_cv_.Wait(&mu_);
  SLUICE_RETURN_IF_ERROR(journal_error_);
  return CompactLocked();
}

absl::Status DispatcherImpl::CompactLocked() {
  // No writer runs (the caller made sure): the snapshot replaces the
  // journal and everything queued.
  std::vector<std::string> records = SnapshotLocked();
  const uint64_t before = journal_->size();
  SLUICE_RETURN_IF_ERROR(journal_->Rewrite(records));
  journal_queue_.clear();
  journal_durable_ = journal_applied_;
  stats_.journal_syncs = journal_->syncs();
  CompactedLocked(records, before);
  return absl::OkStatus();
}

// ---- the RPCs: each returns once what it saw is durable ------------------------

absl::Status DispatcherImpl::WorkerHeartbeat(const proto::WorkerHeartbeatRequest& req,
                                             proto::WorkerHeartbeatResponse* resp,
                                             const IsCancelled& cancelled) {
  return AwaitDurable(WorkerHeartbeatUnsynced(req, resp, cancelled));
}
absl::Status DispatcherImpl::WorkerUpdate(const proto::WorkerUpdateRequest& req,
                                          proto::WorkerUpdateResponse* resp) {
  return AwaitDurable(WorkerUpdateUnsynced(req, resp));
}
absl::Status DispatcherImpl::RegisterDataset(const proto::RegisterDatasetRequest& req,
                                             proto::RegisterDatasetResponse* resp) {
  return AwaitDurable(RegisterDatasetUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetDatasetDef(const proto::GetDatasetDefRequest& req,
                                           proto::GetDatasetDefResponse* resp) {
  return AwaitDurable(GetDatasetDefUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetOrCreateJob(const proto::GetOrCreateJobRequest& req,
                                            proto::GetOrCreateJobResponse* resp) {
  return AwaitDurable(GetOrCreateJobUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetOrCreateIteration(const proto::GetOrCreateIterationRequest& req,
                                                  proto::GetOrCreateIterationResponse* resp) {
  return AwaitDurable(GetOrCreateIterationUnsynced(req, resp));
}
absl::Status DispatcherImpl::ClientHeartbeat(const proto::ClientHeartbeatRequest& req,
                                             proto::ClientHeartbeatResponse* resp,
                                             const IsCancelled& cancelled) {
  return AwaitDurable(ClientHeartbeatUnsynced(req, resp, cancelled));
}
absl::Status DispatcherImpl::ReleaseIterationClient(
    const proto::ReleaseIterationClientRequest& req, proto::ReleaseIterationClientResponse* resp) {
  return AwaitDurable(ReleaseIterationClientUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetWorkers(const proto::GetWorkersRequest& req,
                                        proto::GetWorkersResponse* resp) {
  return AwaitDurable(GetWorkersUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetDataServiceMetadata(
    const proto::GetDataServiceMetadataRequest& req, proto::GetDataServiceMetadataResponse* resp) {
  return AwaitDurable(GetDataServiceMetadataUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetDataServiceConfig(const proto::GetDataServiceConfigRequest& req,
                                                  proto::GetDataServiceConfigResponse* resp) {
  return AwaitDurable(GetDataServiceConfigUnsynced(req, resp));
}
absl::Status DispatcherImpl::GetSplit(const proto::GetSplitRequest& req,
                                      proto::GetSplitResponse* resp,
                                      const IsCancelled& cancelled) {
  return AwaitDurable(GetSplitUnsynced(req, resp, cancelled));
}
void DispatcherImpl::Tick() {
  TickUnsynced();
  // Nobody waits for what Tick changed (lost workers, collected
  // iterations); write it now rather than with the next request.
  AwaitDurable(absl::OkStatus()).IgnoreError();
}

std::vector<std::string> DispatcherImpl::SnapshotLocked() {
  std::vector<std::string> out;
  proto::JournalRecord rec;
  size_t bytes = 0;  // of the updates in `rec` before the last (which is being filled)
  auto add = [&]() -> proto::JournalUpdate* {
    // Records of at most 1000 updates keep each far below kMaxRecordBytes
    // unless dataset definitions are huge (one per update). The size is
    // summed update by update: the whole record's, asked at every update,
    // made a snapshot of 100,000 tasks take a third of a second.
    if (rec.updates_size() > 0) bytes += rec.updates(rec.updates_size() - 1).ByteSizeLong();
    if (rec.updates_size() >= 1000 || bytes > kMaxRecordBytes / 4) {
      out.push_back(rec.SerializeAsString());
      rec.Clear();
      bytes = 0;
    }
    return rec.add_updates();
  };
  for (const auto& [id, d] : datasets_) {
    auto* u = add()->mutable_register_dataset();
    u->set_dataset_id(id);
    *u->mutable_dataset() = d.def;
    u->set_fingerprint(d.fingerprint);
  }
  for (const auto& [id, j] : jobs_) {
    auto* u = add()->mutable_create_job();
    u->set_job_id(id);
    u->set_dataset_id(j.dataset_id);
    u->set_processing_mode(j.mode);
    u->set_job_name(j.name);
    u->set_num_consumers(j.num_consumers);
    u->set_target_workers(j.target_workers);
    *u->mutable_split_source() = j.split_source;
    u->set_split_tracked(j.split_tracked);
  }
  // Workers, and stand-ins for the gone workers some tasks still name
  // (removed again below).
  for (const auto& [addr, w] : workers_) {
    auto* u = add()->mutable_register_worker();
    u->set_address(addr);
    u->set_transfer_address(w.transfer_address);
    u->set_transfer_protocol(w.protocol);
    u->set_index(w.index);
    u->set_host_id(w.host_id);
  }
  // address -> its shard (index) and host
  std::map<std::string, std::pair<int64_t, std::string>> gone;
  for (const auto& [id, t] : tasks_) {
    if (!workers_.count(t.worker)) {
      gone.emplace(t.worker, std::make_pair(std::max<int64_t>(0, t.shard), t.host_id));
    }
  }
  for (const auto& [addr, shard_host] : gone) {
    auto* u = add()->mutable_register_worker();
    u->set_address(addr);
    u->set_index(shard_host.first);
    u->set_host_id(shard_host.second);
  }
  for (const auto& [id, it] : iterations_) {
    auto* u = add()->mutable_create_iteration();
    u->set_iteration_id(id);
    u->set_job_id(it.job_id);
    u->set_repetition(it.repetition);
    u->set_finished(it.finished);
    if (it.splits != nullptr) {
      u->set_has_splits(true);
      u->set_positions(it.splits->positions);
      u->set_split_elements(it.splits->split_elements);
      for (const std::string& f : it.splits->files) u->add_files(f);
    }
    if (!it.error.ok()) {
      auto* e = add()->mutable_iteration_error();
      e->set_iteration_id(id);
      *e->mutable_error() = ToProto(it.error);
    }
  }
  // Every task exists before any finishes (an iteration is finished once
  // all of its tasks are).
  std::map<std::string, std::vector<int64_t>> delivered;
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> started;  // (it, round) -> tasks
  for (const auto& [id, t] : tasks_) {
    auto* u = add()->mutable_create_task();
    u->set_task_id(id);
    u->set_iteration_id(t.iteration_id);
    u->set_worker_address(t.worker);
    u->set_pending(t.pending);
    if (t.delivered) delivered[t.worker].push_back(id);
    if (!t.pending && t.starting_round != 0) started[{t.iteration_id, t.starting_round}].push_back(id);
  }
  for (const auto& [addr, ids] : delivered) {
    auto* u = add()->mutable_tasks_delivered();
    u->set_worker_address(addr);
    for (int64_t id : ids) u->add_task_ids(id);
  }
  for (const auto& [key, ids] : started) {
    auto* u = add()->mutable_start_tasks();
    u->set_iteration_id(key.first);
    u->set_starting_round(key.second);
    for (int64_t id : ids) u->add_task_ids(id);
  }
  for (const auto& [id, it] : iterations_) {
    if (it.splits == nullptr) continue;
    const SplitProvider& p = *it.splits;
    auto* u = add()->mutable_split_provider_state();
    u->set_iteration_id(id);
    u->set_done_below(p.done_below);
    for (const auto& [e, ep] : p.epochs) {
      auto* es = u->add_epochs();
      es->set_epoch(e);
      for (int64_t q : ep.queue) es->add_queue(q);
      es->set_next_position(ep.next_position);
      es->set_open(ep.open);
    }
    for (const auto& [sid, o] : p.open) {
      auto* os = u->add_open();
      *os->mutable_split() = o.def;
      os->set_holder_task(o.holder_task);
    }
  }
  for (const auto& [id, t] : tasks_) {
    if (!t.completed && !t.lost) continue;
    auto* u = add()->mutable_finish_task();
    u->set_task_id(id);
    u->set_lost(t.lost);
  }
  for (const auto& [id, it] : iterations_) {
    if (it.collected) add()->mutable_collect_iteration()->set_iteration_id(id);
  }
  for (const auto& [id, c] : clients_) {
    auto* u = add()->mutable_create_client();
    u->set_client_id(id);
    u->set_iteration_id(c.iteration_id);
    u->set_consumer_index(c.consumer_index);
    u->set_host_id(c.host_id);
    if (c.at_end) add()->mutable_client_at_end()->set_client_id(id);
  }
  for (const auto& [addr, shard_host] : gone) add()->mutable_remove_worker()->set_address(addr);
  for (size_t i = 0; i < shard_claims_.size(); ++i) {
    if (shard_claims_[i].empty()) continue;
    auto* u = add()->mutable_shard_claim();
    u->set_index(static_cast<int64_t>(i));
    u->set_address(shard_claims_[i]);
  }
  auto* c = add()->mutable_counters();
  c->set_next_id(next_id_);
  c->set_next_worker_index(next_worker_index_);
  out.push_back(rec.SerializeAsString());
  return out;
}

absl::Status DispatcherImpl::ApplySplitProviderStateLocked(
    const proto::SplitProviderStateUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Iteration& it = iterations_.at(u.iteration_id());
  if (it.splits == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("iteration ", it.id, " has no split provider"));
  }
  SplitProvider& p = *it.splits;
  p.done_below = u.done_below();
  p.epochs.clear();
  for (const auto& es : u.epochs()) {
    Epoch& e = p.epochs[es.epoch()];
    e.queue.assign(es.queue().begin(), es.queue().end());
    e.next_position = es.next_position();
    e.open = es.open();
  }
  p.open.clear();
  for (const auto& os : u.open()) {
    const int64_t id = os.split().split_id();
    OpenSplit o;
    o.def = os.split();
    o.holder_task = os.holder_task();
    p.open.emplace(id, std::move(o));
    if (os.holder_task() != 0) {
      SLUICE_RETURN_IF_ERROR(MustExist(tasks_, os.holder_task(), "task"));
      tasks_.at(os.holder_task()).held_splits.insert(id);
    }
    next_id_ = std::max(next_id_, id + 1);
  }
  BumpSplitVersionLocked(it);
  return absl::OkStatus();
}

absl::Status DispatcherImpl::ApplyLocked(const proto::JournalUpdate& u) {
  switch (u.kind_case()) {
    case proto::JournalUpdate::kRegisterDataset: {
      const auto& r = u.register_dataset();
      datasets_.try_emplace(r.dataset_id(), DatasetEntry{r.dataset_id(), r.dataset(), r.fingerprint()});
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kCreateJob: {
      const auto& r = u.create_job();
      SLUICE_RETURN_IF_ERROR(MustExist(datasets_, r.dataset_id(), "dataset"));
      Job job;
      job.id = r.job_id();
      job.dataset_id = r.dataset_id();
      job.mode = r.processing_mode();
      job.name = r.job_name();
      job.num_consumers = r.num_consumers();
      job.target_workers = r.target_workers();
      job.split_source = r.split_source();
      job.split_tracked = r.split_tracked();
      if (!jobs_.emplace(job.id, job).second) {
        return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " exists"));
      }
      if (!job.name.empty()) job_by_name_[job.name] = job.id;
      next_id_ = std::max(next_id_, job.id + 1);
      ++stats_.jobs;
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kCreateIteration: {
      const auto& r = u.create_iteration();
      SLUICE_RETURN_IF_ERROR(MustExist(jobs_, r.job_id(), "job"));
      Iteration it;
      it.id = r.iteration_id();
      it.job_id = r.job_id();
      it.repetition = r.repetition();
      it.finished = r.finished();
      if (r.has_splits()) {
        it.splits = std::make_unique<SplitProvider>();
        it.splits->positions = r.positions();
        it.splits->split_elements = std::max<int64_t>(1, r.split_elements());
        it.splits->files.assign(r.files().begin(), r.files().end());
      }
      if (!iterations_.emplace(it.id, std::move(it)).second) {
        return absl::AlreadyExistsError(absl::StrCat("iteration ", r.iteration_id(), " exists"));
      }
      jobs_.at(r.job_id()).iteration_by_repetition[r.repetition()] = r.iteration_id();
      next_id_ = std::max(next_id_, r.iteration_id() + 1);
      ++stats_.iterations;
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kRegisterWorker: {
      const auto& r = u.register_worker();
      Worker w;
      w.address = r.address();
      w.transfer_address = r.transfer_address();
      w.protocol = r.transfer_protocol();
      w.index = r.index();
      w.host_id = r.host_id();
      w.last_heartbeat = clock_();
      auto known = workers_.find(r.address());
      if (known != workers_.end()) {
        // Registered again (it restarted): new addresses, same index.
        known->second.transfer_address = r.transfer_address();
        known->second.protocol = r.transfer_protocol();
        known->second.host_id = r.host_id();
        return absl::OkStatus();
      }
      workers_.emplace(w.address, std::move(w));
      if (config_.worker_addresses.empty()) {
        next_worker_index_ = std::max(next_worker_index_, r.index() + 1);
      } else if (r.index() >= 0 && r.index() < static_cast<int64_t>(shard_claims_.size())) {
        shard_claims_[r.index()] = r.address();
      }
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kCreateTask:
      return CreateTaskLocked(u.create_task());
    case proto::JournalUpdate::kTasksDelivered: {
      const auto& r = u.tasks_delivered();
      SLUICE_RETURN_IF_ERROR(MustExist(workers_, r.worker_address(), "worker"));
      std::set<int64_t> ids(r.task_ids().begin(), r.task_ids().end());
      for (int64_t id : ids) {
        auto t = tasks_.find(id);
        if (t != tasks_.end()) t->second.delivered = true;
      }
      auto& pending = workers_.at(r.worker_address()).pending_new;
      pending.erase(std::remove_if(pending.begin(), pending.end(),
                                   [&ids](const proto::TaskDef& d) { return ids.count(d.task_id()); }),
                    pending.end());
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kFinishTask: {
      SLUICE_RETURN_IF_ERROR(MustExist(tasks_, u.finish_task().task_id(), "task"));
      FinishTaskLocked(tasks_.at(u.finish_task().task_id()), u.finish_task().lost());
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kIterationError: {
      const auto& r = u.iteration_error();
      SLUICE_RETURN_IF_ERROR(MustExist(iterations_, r.iteration_id(), "iteration"));
      Iteration& it = iterations_.at(r.iteration_id());
      if (it.error.ok()) {
        it.error = FromProto(r.error());
        BumpVersionLocked(it);
      }
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kCreateClient: {
      const auto& r = u.create_client();
      SLUICE_RETURN_IF_ERROR(MustExist(iterations_, r.iteration_id(), "iteration"));
      Client c;
      c.id = r.client_id();
      c.iteration_id = r.iteration_id();
      c.consumer_index = r.consumer_index();
      c.host_id = r.host_id();
      c.last_heartbeat = clock_();
      if (!clients_.emplace(c.id, c).second) {
        return absl::AlreadyExistsError(absl::StrCat("iteration client ", c.id, " exists"));
      }
      Iteration& it = iterations_.at(c.iteration_id);
      if (c.consumer_index >= 0) it.consumer_clients[c.consumer_index] = c.id;
      it.clients.insert(c.id);
      next_id_ = std::max(next_id_, c.id + 1);
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kRemoveClient:
      RemoveClientLocked(u.remove_client().client_id());
      return absl::OkStatus();
    case proto::JournalUpdate::kClientAtEnd: {
      auto c = clients_.find(u.client_at_end().client_id());
      if (c != clients_.end()) c->second.at_end = true;
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kCollectIteration: {
      const int64_t id = u.collect_iteration().iteration_id();
      SLUICE_RETURN_IF_ERROR(MustExist(iterations_, id, "iteration"));
      CollectLocked(iterations_.at(id));
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kDropJob: {
      const int64_t id = u.drop_job().job_id();
      SLUICE_RETURN_IF_ERROR(MustExist(jobs_, id, "job"));
      const Job& job = jobs_.at(id);
      for (const auto& [rep, iteration_id] : job.iteration_by_repetition) {
        WakeLocked(VersionKey(iteration_id));
        WakeLocked(SplitsKey(iteration_id));
        iterations_.erase(iteration_id);
      }
      if (!job.name.empty()) job_by_name_.erase(job.name);
      jobs_.erase(id);
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kRemoveWorker:
      RemoveWorkerLocked(u.remove_worker().address());
      return absl::OkStatus();
    case proto::JournalUpdate::kAssignSplit:
      return AssignSplitLocked(u.assign_split());
    case proto::JournalUpdate::kCompleteSplits: {
      const auto& r = u.complete_splits();
      SLUICE_RETURN_IF_ERROR(MustExist(tasks_, r.task_id(), "task"));
      Task& t = tasks_.at(r.task_id());
      Iteration& it = iterations_.at(t.iteration_id);
      if (it.splits == nullptr) return absl::OkStatus();
      for (int64_t id : r.split_ids()) CompleteSplitLocked(it, t, id);
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kStartTasks: {
      const auto& r = u.start_tasks();
      SLUICE_RETURN_IF_ERROR(MustExist(iterations_, r.iteration_id(), "iteration"));
      Iteration& it = iterations_.at(r.iteration_id());
      for (int64_t id : r.task_ids()) {
        auto t = tasks_.find(id);
        if (t != tasks_.end()) {
          t->second.pending = false;
          t->second.starting_round = r.starting_round();
          t->second.info_version = it.version + 1;  // the version bumped below
          it.task_changes.emplace(t->second.info_version, id);
        }
        it.pending_tasks.erase(std::remove(it.pending_tasks.begin(), it.pending_tasks.end(), id),
                               it.pending_tasks.end());
      }
      it.ready_consumers.clear();
      BumpVersionLocked(it);
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kRequeueSplits: {
      const auto& r = u.requeue_splits();
      SLUICE_RETURN_IF_ERROR(MustExist(tasks_, r.task_id(), "task"));
      Task& t = tasks_.at(r.task_id());
      Iteration& it = iterations_.at(t.iteration_id);
      if (it.splits == nullptr) return absl::OkStatus();
      RequeueSplitsLocked(it, t, std::set<int64_t>(r.split_ids().begin(), r.split_ids().end()));
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kCounters:
      next_id_ = std::max(next_id_, u.counters().next_id());
      next_worker_index_ = std::max(next_worker_index_, u.counters().next_worker_index());
      return absl::OkStatus();
    case proto::JournalUpdate::kShardClaim: {
      const auto& r = u.shard_claim();
      if (r.index() >= 0 && r.index() < static_cast<int64_t>(shard_claims_.size())) {
        shard_claims_[r.index()] = r.address();
      }
      return absl::OkStatus();
    }
    case proto::JournalUpdate::kSplitProviderState:
      return ApplySplitProviderStateLocked(u.split_provider_state());
    case proto::JournalUpdate::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("journal update of an unknown kind (a newer dispatcher's?)");
}

absl::Status DispatcherImpl::OpenJournal(FsyncPolicy policy) {
  if (config_.work_dir.empty()) {
    return absl::InvalidArgumentError("fault_tolerant_mode needs a work_dir for the journal");
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> records, ReadJournal(config_.work_dir));
  absl::MutexLock l(&mu_);
  if (journal_ != nullptr || next_id_ != 1 || !workers_.empty()) {
    return absl::FailedPreconditionError("OpenJournal: the dispatcher is already in use");
  }
  replaying_ = true;
  for (size_t i = 0; i < records.size(); ++i) {
    proto::JournalRecord rec;
    absl::Status s;
    if (!rec.ParseFromString(records[i])) {
      s = absl::InvalidArgumentError("it does not parse");
    }
    for (int k = 0; s.ok() && k < rec.updates_size(); ++k) s = ApplyLocked(rec.updates(k));
    if (!s.ok()) {
      replaying_ = false;
      return absl::DataLossError(
          absl::StrCat("dispatcher journal ", config_.work_dir, "/", std::string(kJournalFileName),
                       ": record ", i + 1, " of ", records.size(), " cannot be applied (",
                       s.message(), "); it was written by an incompatible dispatcher or is "
                       "damaged"));
    }
  }
  replaying_ = false;
  // What was not journaled starts afresh: timeouts count from now, and
  // versions move on so that every client's long poll returns at once.
  const absl::Time now = clock_();
  const int64_t version_jump = absl::ToUnixMicros(now);
  for (auto& [id, it] : iterations_) {
    it.started = true;
    if (it.clients.empty()) it.idle_since = now;
    it.version += version_jump;
    it.delta_base = it.version;  // versions clients knew before are not this dispatcher's
  }
  for (auto& [addr, w] : workers_) w.last_heartbeat = now;
  for (auto& [id, c] : clients_) c.last_heartbeat = now;
  stats_.replayed_records = static_cast<int64_t>(records.size());
  SLUICE_ASSIGN_OR_RETURN(journal_, JournalWriter::Open(config_.work_dir, policy));
  records_in_journal_ = static_cast<int64_t>(records.size());
  if (records_in_journal_ >= compaction_min_records_) {
    absl::Status s = CompactLocked();
    if (!s.ok()) {
      spdlog::warn("dispatcher: journal compaction failed: {}", std::string(s.message()));
    }
  }
  int64_t open_tasks = 0;
  for (const auto& [id, t] : tasks_) open_tasks += !t.completed && !t.lost;
  spdlog::info("dispatcher: journal {} replayed ({} records): {} dataset(s), {} job(s), {} "
               "iteration(s), {} running task(s), {} worker(s), {} client(s)",
               journal_->path(), records.size(), datasets_.size(), jobs_.size(),
               iterations_.size(), open_tasks, workers_.size(), clients_.size());
  return absl::OkStatus();
}

std::string DispatcherImpl::DurableStateString() {
  absl::MutexLock l(&mu_);
  std::string out;
  for (const auto& [id, d] : datasets_) absl::StrAppend(&out, "dataset ", id, " ", d.fingerprint, "\n");
  for (const auto& [id, j] : jobs_) {
    absl::StrAppend(&out, "job ", id, " ", j.dataset_id, " mode=", j.mode, " name=", j.name,
                    " consumers=", j.num_consumers, " target=", j.target_workers, " reps=");
    for (const auto& [rep, it] : j.iteration_by_repetition) absl::StrAppend(&out, rep, ":", it, ",");
    absl::StrAppend(&out, "\n");
  }
  for (const auto& [id, it] : iterations_) {
    absl::StrAppend(&out, "iteration ", id, " job=", it.job_id, " rep=", it.repetition,
                    " tasks=", absl::StrJoin(it.tasks, ","), " clients=",
                    absl::StrJoin(it.clients, ","), " finished=", it.finished,
                    " collected=", it.collected, " error=", it.error.ToString(),
                    " pending=", absl::StrJoin(it.pending_tasks, ","), "\n");
    if (it.splits != nullptr) {
      const SplitProvider& p = *it.splits;
      absl::StrAppend(&out, "  splits positions=", p.positions, " per=", p.split_elements,
                      " files=", absl::StrJoin(p.files, ","), " done_below=", p.done_below, "\n");
      for (const auto& [e, ep] : p.epochs) {
        absl::StrAppend(&out, "  epoch ", e, " queue=", absl::StrJoin(ep.queue, ","),
                        " next=", ep.next_position, " open=", ep.open, "\n");
      }
      for (const auto& [sid, o] : p.open) {
        absl::StrAppend(&out, "  open ", sid, " holder=", o.holder_task, " ",
                        o.def.ShortDebugString(), "\n");
      }
    }
  }
  for (const auto& [id, t] : tasks_) {
    absl::StrAppend(&out, "task ", id, " it=", t.iteration_id, " worker=", t.worker,
                    " host=", t.host_id,
                    " completed=", t.completed, " lost=", t.lost, " delivered=", t.delivered,
                    " held=", absl::StrJoin(t.held_splits, ","), " shard=", t.shard,
                    " start=", t.starting_round, " pending=", t.pending, "\n");
  }
  for (const auto& [addr, w] : workers_) {
    absl::StrAppend(&out, "worker ", addr, " ", w.transfer_address, " ", w.protocol,
                    " host=", w.host_id,
                    " index=", w.index, " tasks=", absl::StrJoin(w.tasks, ","), " undelivered=");
    for (const auto& d : w.pending_new) absl::StrAppend(&out, d.task_id(), ",");
    absl::StrAppend(&out, "\n");
  }
  for (const auto& [id, c] : clients_) {
    absl::StrAppend(&out, "client ", id, " it=", c.iteration_id, " consumer=", c.consumer_index,
                    " host=", c.host_id, " at_end=", c.at_end, "\n");
  }
  absl::StrAppend(&out, "shard_claims=", absl::StrJoin(shard_claims_, ","), "\n");
  return out;
}

// ---- workers ------------------------------------------------------------------

void DispatcherImpl::AddCreateTaskLocked(proto::JournalRecord& rec, int64_t iteration_id,
                                         bool pending, const std::string& address) {
  proto::CreateTaskUpdate* u = rec.add_updates()->mutable_create_task();
  u->set_task_id(next_id_++);
  u->set_iteration_id(iteration_id);
  u->set_worker_address(address);
  u->set_pending(pending);
}

absl::Status DispatcherImpl::CreateTaskLocked(const proto::CreateTaskUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  SLUICE_RETURN_IF_ERROR(MustExist(workers_, u.worker_address(), "worker"));
  if (tasks_.count(u.task_id())) {
    return absl::AlreadyExistsError(absl::StrCat("task ", u.task_id(), " exists"));
  }
  Iteration& it = iterations_.at(u.iteration_id());
  Worker& w = workers_.at(u.worker_address());
  const Job& job = jobs_.at(it.job_id);
  Task t;
  t.id = u.task_id();
  t.iteration_id = it.id;
  t.worker = w.address;
  t.host_id = w.host_id;
  proto::TaskDef def;
  def.set_task_id(t.id);
  def.set_iteration_id(it.id);
  def.set_dataset_id(job.dataset_id);
  *def.mutable_dataset() = datasets_.at(job.dataset_id).def;
  def.set_processing_mode(job.mode);
  def.set_worker_index(w.index);
  def.set_split_tracked(job.split_tracked);
  if (StaticShardingOf(job.mode)) {
    t.shard = w.index;
    def.set_num_shards(static_cast<int64_t>(config_.worker_addresses.size()));
  }
  def.set_num_consumers(job.num_consumers);
  if (u.pending()) {
    // Joins at a round every consumer agrees to (CoordinateLocked).
    t.pending = true;
    if (it.pending_tasks.empty()) {
      int64_t furthest = 0;
      for (const auto& [consumer, round] : it.consumer_rounds) furthest = std::max(furthest, round);
      it.target_round = furthest + kRoundLead;
      it.ready_consumers.clear();
    }
    it.pending_tasks.push_back(t.id);
  }
  w.pending_new.push_back(std::move(def));
  WakeLocked(WorkerKey(w.address));
  w.tasks.insert(t.id);
  it.tasks.insert(t.id);
  it.finished = false;  // a late joiner's task runs
  BumpVersionLocked(it);
  t.info_version = it.version;
  it.task_changes.emplace(t.info_version, t.id);
  next_id_ = std::max(next_id_, t.id + 1);
  tasks_.emplace(t.id, std::move(t));
  return absl::OkStatus();
}

bool DispatcherImpl::NeedsTaskLocked(const Iteration& it, int64_t worker_index) {
  if (!StaticShardingOf(jobs_.at(it.job_id).mode)) return true;
  for (int64_t id : it.tasks) {
    const Task& t = tasks_.at(id);
    if (t.shard == worker_index && !t.lost) return false;
  }
  return true;
}

bool DispatcherImpl::ReadsHostLocked(const Iteration& it, const std::string& host) {
  if (jobs_.at(it.job_id).target_workers != proto::TARGET_WORKERS_LOCAL) return true;
  for (int64_t id : it.clients) {
    auto c = clients_.find(id);
    if (c != clients_.end() && c->second.host_id == host) return true;
  }
  return false;
}

absl::StatusOr<int64_t> DispatcherImpl::FindShardLocked(const std::string& address) {
  for (size_t i = 0; i < shard_claims_.size(); ++i) {
    if (shard_claims_[i] == address) return static_cast<int64_t>(i);
  }
  std::optional<int64_t> index =
      MatchWorkerAddress(config_.worker_addresses, address,
                         [this](int64_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           const std::string& holder = shard_claims_[i];
                           return holder.empty() || !workers_.count(holder);
                         });
  if (!index) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " is not in the dispatcher's worker_addresses [",
        absl::StrJoin(config_.worker_addresses, ", "),
        "] (or every matching entry is held by a live worker); list it, or start the worker "
        "with a listed worker_address"));
  }
  return *index;
}

void DispatcherImpl::FinishTaskLocked(Task& t, bool lost) {
  if (t.completed || t.lost) return;
  if (lost) {
    t.lost = true;
  } else {
    t.completed = true;
  }
  // A lost task's open splits go to other tasks; a task that ended its
  // pipeline on its own (e.g. Take) chose not to read the rest of its.
  ReleaseSplitsLocked(t, /*requeue=*/lost);
  auto it = iterations_.find(t.iteration_id);
  if (it == iterations_.end()) return;
  BumpVersionLocked(it->second);
  t.info_version = it->second.version;
  it->second.task_changes.emplace(t.info_version, t.id);
  UpdateFinishedLocked(it->second);
}

bool DispatcherImpl::AcceptsTasksLocked(const Iteration& it) {
  if (it.collected) return false;
  if (!it.finished) return true;
  for (int64_t id : it.clients) {
    auto c = clients_.find(id);
    if (c != clients_.end() && !c->second.at_end) return true;
  }
  return false;
}

void DispatcherImpl::UpdateFinishedLocked(Iteration& it) {
  if (it.finished || it.tasks.empty()) return;
  std::set<int64_t> completed_shards;
  for (int64_t id : it.tasks) {
    const Task& t = tasks_.at(id);
    if (!t.completed && !t.lost) return;
    if (t.completed) completed_shards.insert(t.shard);
  }
  // Every task was lost before producing all its data: the iteration
  // waits for a worker to join (or come back) and take it on, as tf.data
  // does, rather than ending short.
  if (completed_shards.empty()) return;
  // Static sharding: an iteration ends only once every shard was read to
  // its end (a lost worker's shard waits for a worker to take it again).
  if (StaticShardingOf(jobs_.at(it.job_id).mode) &&
      completed_shards.size() < config_.worker_addresses.size()) {
    return;
  }
  it.finished = true;
  BumpVersionLocked(it);
}

absl::StatusOr<DispatcherImpl::PollFn> DispatcherImpl::WorkerHeartbeatPoll(
    const proto::WorkerHeartbeatRequest& req, proto::WorkerHeartbeatResponse* resp) {
  if (req.worker_address().empty()) {
    return absl::InvalidArgumentError("WorkerHeartbeat: worker_address is empty");
  }
  const std::string& addr = req.worker_address();
  const std::string transfer_address =
      req.transfer_address().empty() ? addr : req.transfer_address();
  const std::string protocol = req.transfer_protocol().empty() ? "grpc" : req.transfer_protocol();
  // New, or known but back with other addresses (it restarted): check it.
  // (A known worker's heartbeat without addresses leaves them as they are.)
  auto moved = [&req, transfer_address, protocol](const Worker& w) {
    return (!req.transfer_address().empty() && w.transfer_address != transfer_address) ||
           (!req.transfer_protocol().empty() && w.protocol != protocol) ||
           (!req.host_id().empty() && w.host_id != req.host_id());
  };
  bool check;
  {
    absl::MutexLock l(&mu_);
    auto w = workers_.find(addr);
    check = w == workers_.end() || moved(w->second);
  }
  if (check) {
    // A worker gets tasks only once its addresses answered: one that
    // registered at an address where nothing listens would hold every
    // pipeline it is given until it timed out.
    SLUICE_RETURN_IF_ERROR(ValidateRegistration(req));
    if (probe_) {
      absl::Status reachable = probe_(req);
      if (!reachable.ok()) {
        spdlog::warn("dispatcher: refused to register worker {}: {}", addr,
                     std::string(reachable.message()));
        return absl::FailedPreconditionError(absl::StrCat(
            "the dispatcher cannot reach worker ", addr, ": ", reachable.message(),
            "; it registers only once its addresses answer (check --worker_address, "
            "--data_transfer_address and firewalls)"));
      }
    }
  }
  return PollFn([this, &req, resp, moved, transfer_address, protocol,
                 first = true](PollStep* step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable {
    const std::string& addr = req.worker_address();
    if (first) {
      first = false;
      absl::Status s = WorkerHeartbeatBeginLocked(req, transfer_address, protocol, moved);
      if (!s.ok()) return s;
      // The condition looks the worker up again: Tick() may remove it while
      // the poll waits (its entry must not be referenced across the wait).
      auto has_news = [addr, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto it = workers_.find(addr);
        return shutdown_ || it == workers_.end() || !it->second.pending_new.empty() ||
               !it->second.pending_delete.empty();
      };
      const absl::Duration wait = std::min(absl::Milliseconds(req.wait_ms()), MaxWorkerWait());
      if (wait > absl::ZeroDuration() && !has_news()) {
        *step = {true, WorkerKey(addr), has_news, absl::Now() + wait};
        return absl::OkStatus();
      }
    }
    // The worker may have been removed while we waited (Tick after timeout).
    auto wit = workers_.find(addr);
    if (wit == workers_.end()) return absl::OkStatus();
    Worker& w2 = wit->second;
    if (!w2.pending_new.empty()) {
      proto::JournalRecord delivered;
      proto::TasksDeliveredUpdate* d = delivered.add_updates()->mutable_tasks_delivered();
      d->set_worker_address(addr);
      for (const proto::TaskDef& def : w2.pending_new) {
        d->add_task_ids(def.task_id());
        *resp->add_new_tasks() = def;
      }
      SLUICE_RETURN_IF_ERROR(RecordLocked(delivered));
    }
    for (int64_t id : w2.pending_delete) resp->add_tasks_to_delete(id);
    w2.pending_delete.clear();
    w2.last_heartbeat = clock_();
    resp->set_worker_timeout_ms(config_.worker_timeout_ms);
    return absl::OkStatus();
  });
}

absl::Status DispatcherImpl::WorkerHeartbeatUnsynced(const proto::WorkerHeartbeatRequest& req,
                                                     proto::WorkerHeartbeatResponse* resp,
                                                     const IsCancelled& cancelled) {
  SLUICE_ASSIGN_OR_RETURN(PollFn poll, WorkerHeartbeatPoll(req, resp));
  absl::MutexLock l(&mu_);
  return RunPollLocked(poll, cancelled);
}

absl::Status DispatcherImpl::WorkerHeartbeatBeginLocked(
    const proto::WorkerHeartbeatRequest& req, const std::string& transfer_address,
    const std::string& protocol, const std::function<bool(const Worker&)>& moved) {
  const std::string& addr = req.worker_address();
  auto wit = workers_.find(addr);
  if (wit != workers_.end() && moved(wit->second)) {
    proto::JournalRecord rec;
    proto::RegisterWorkerUpdate* r = rec.add_updates()->mutable_register_worker();
    r->set_address(addr);
    r->set_transfer_address(transfer_address);
    r->set_transfer_protocol(protocol);
    r->set_index(wit->second.index);
    r->set_host_id(req.host_id().empty() ? wit->second.host_id : req.host_id());
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    spdlog::info("dispatcher: worker {} is back with transfer {} over {}", addr, transfer_address,
                 protocol);
  }
  if (wit == workers_.end()) {
    int64_t index = next_worker_index_;
    if (!config_.worker_addresses.empty()) {
      SLUICE_ASSIGN_OR_RETURN(index, FindShardLocked(addr));
    }
    proto::JournalRecord rec;
    proto::RegisterWorkerUpdate* r = rec.add_updates()->mutable_register_worker();
    r->set_address(addr);
    r->set_transfer_address(transfer_address);
    r->set_transfer_protocol(protocol);
    r->set_index(index);
    r->set_host_id(req.host_id());
    // A worker that joins mid-job gets a task for every running iteration
    // that reads its host.
    for (auto& [id, it] : iterations_) {
      if (AcceptsTasksLocked(it) && ReadsHostLocked(it, req.host_id()) &&
          NeedsTaskLocked(it, index)) {
        AddCreateTaskLocked(rec, id, jobs_.at(it.job_id).num_consumers > 0 && it.started, addr);
      }
    }
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    wit = workers_.find(addr);
    spdlog::info("dispatcher: worker {} on host {} registered as worker {} (transfer {} over {})",
                 addr, wit->second.host_id, wit->second.index, wit->second.transfer_address,
                 wit->second.protocol);
  }
  Worker& w = wit->second;
  w.last_heartbeat = clock_();
  // Tasks whose output was read, and reconciliation: tasks this worker
  // should hold but does not (it restarted) are lost; tasks it holds that
  // we no longer know are deleted.
  proto::JournalRecord finished;
  std::set<int64_t> held(req.current_tasks().begin(), req.current_tasks().end());
  std::set<int64_t> done_tasks(req.finished_tasks().begin(), req.finished_tasks().end());
  std::set<int64_t> lost_in;  // iterations that lost a task of this worker
  for (int64_t id : w.tasks) {
    const Task& t = tasks_.at(id);
    if (t.completed || t.lost) continue;
    const bool done = done_tasks.count(id) > 0;
    const bool gone = !done && t.delivered && !held.count(id);
    if (!done && !gone) continue;
    proto::FinishTaskUpdate* f = finished.add_updates()->mutable_finish_task();
    f->set_task_id(id);
    f->set_lost(gone);
    if (gone) {
      spdlog::warn("dispatcher: worker {} no longer holds task {}; marking it lost", addr, id);
      lost_in.insert(t.iteration_id);
    }
  }
  SLUICE_RETURN_IF_ERROR(RecordLocked(finished));
  // The restarted worker gets a task again (its data starts over; under
  // static sharding it reads its shard again).
  proto::JournalRecord again;
  for (int64_t iteration_id : lost_in) {
    Iteration& it = iterations_.at(iteration_id);
    if (AcceptsTasksLocked(it) && ReadsHostLocked(it, w.host_id) && NeedsTaskLocked(it, w.index)) {
      AddCreateTaskLocked(again, iteration_id, jobs_.at(it.job_id).num_consumers > 0, addr);
    }
  }
  SLUICE_RETURN_IF_ERROR(RecordLocked(again));
  for (int64_t id : held) {
    if (!w.tasks.count(id)) w.pending_delete.push_back(id);
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::WorkerUpdateUnsynced(const proto::WorkerUpdateRequest& req,
                                          proto::WorkerUpdateResponse* resp) {
  absl::MutexLock l(&mu_);
  if (!workers_.count(req.worker_address())) {
    return absl::NotFoundError(absl::StrCat("WorkerUpdate: worker '",
                                            absl::CHexEscape(req.worker_address().substr(0, 256)),
                                            "' is not registered"));
  }
  for (const auto& u : req.updates()) {
    auto t = tasks_.find(u.task_id());
    if (t == tasks_.end()) {
      return absl::NotFoundError(absl::StrCat("WorkerUpdate: task ", u.task_id(),
                                              " does not exist (collected, or never created)"));
    }
    if (t->second.worker != req.worker_address()) {
      return absl::FailedPreconditionError(absl::StrCat("WorkerUpdate: task ", u.task_id(),
                                                        " belongs to worker ", t->second.worker,
                                                        ", not ", req.worker_address()));
    }
  }
  proto::JournalRecord rec;
  std::set<int64_t> failed;  // iterations given an error in this record
  for (const auto& u : req.updates()) {
    auto t = tasks_.find(u.task_id());
    if (u.has_error() && u.error().code() != 0) {
      auto it = iterations_.find(t->second.iteration_id);
      if (it != iterations_.end() && it->second.error.ok() && failed.insert(it->first).second) {
        proto::IterationErrorUpdate* e = rec.add_updates()->mutable_iteration_error();
        e->set_iteration_id(it->first);
        *e->mutable_error() = u.error();
        spdlog::warn("dispatcher: iteration {} failed on worker {}: {}", it->first,
                     req.worker_address(), u.error().message());
      }
    }
    if ((u.completed() || u.has_error()) && !t->second.completed && !t->second.lost) {
      rec.add_updates()->mutable_finish_task()->set_task_id(t->first);
    }
  }
  return RecordLocked(rec);
}

// ---- datasets and jobs --------------------------------------------------------------

absl::Status DispatcherImpl::RegisterDatasetUnsynced(const proto::RegisterDatasetRequest& req,
                                             proto::RegisterDatasetResponse* resp) {
  if (req.dataset().version() != 1 || !req.dataset().has_root() ||
      req.dataset().root().op_case() == proto::DatasetNode::OP_NOT_SET) {
    return absl::InvalidArgumentError(
        "RegisterDataset: the dataset definition is empty or of an unsupported version");
  }
  const bool named = !req.dataset_id().empty();
  if (named) SLUICE_RETURN_IF_ERROR(ValidateDatasetId(req.dataset_id()));
  const uint64_t fp = DefFingerprint(req.dataset());
  absl::MutexLock l(&mu_);
  // The caller's id, or "ds-" and the fingerprint: identical definitions
  // share it; a (vanishingly unlikely) collision between different
  // definitions gets a suffixed id.
  for (int suffix = 0;; ++suffix) {
    const std::string id = named ? req.dataset_id()
                                 : absl::StrCat("ds-", absl::Hex(fp, absl::kZeroPad16),
                                                suffix ? absl::StrCat("-", suffix) : "");
    auto it = datasets_.find(id);
    if (it == datasets_.end()) {
      proto::JournalRecord rec;
      proto::RegisterDatasetUpdate* r = rec.add_updates()->mutable_register_dataset();
      r->set_dataset_id(id);
      *r->mutable_dataset() = req.dataset();
      r->set_fingerprint(fp);
      SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
      resp->set_dataset_id(id);
      return absl::OkStatus();
    }
    if (CanonicalBytes(it->second.def) == CanonicalBytes(req.dataset())) {
      resp->set_dataset_id(id);
      return absl::OkStatus();
    }
    if (named) {
      return absl::AlreadyExistsError(absl::StrCat(
          "RegisterDataset: dataset id '", id,
          "' is registered with a different definition; choose another id"));
    }
  }
}

absl::Status DispatcherImpl::GetDatasetDefUnsynced(const proto::GetDatasetDefRequest& req,
                                           proto::GetDatasetDefResponse* resp) {
  absl::MutexLock l(&mu_);
  auto it = datasets_.find(req.dataset_id());
  if (it == datasets_.end()) {
    return absl::NotFoundError(absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
  }
  *resp->mutable_dataset() = it->second.def;
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetOrCreateJobUnsynced(const proto::GetOrCreateJobRequest& req,
                                            proto::GetOrCreateJobResponse* resp) {
  if (!proto::ProcessingMode_IsValid(req.processing_mode()) ||
      req.processing_mode() == proto::PROCESSING_MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError("GetOrCreateJob: processing_mode is unspecified or unknown");
  }
  const std::optional<StaticSharding> sharding = StaticShardingOf(req.processing_mode());
  if (sharding && config_.worker_addresses.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "processing_mode=", ProcessingModeName(req.processing_mode()),
        " (static sharding) needs the dispatcher's worker_addresses: the fixed list of workers, "
        "worker i of N reading shard i (sluice-dispatcher --worker_addresses)"));
  }
  if (req.num_consumers() < 0) {
    return absl::InvalidArgumentError("GetOrCreateJob: num_consumers must be >= 0");
  }
  if (req.num_consumers() > 0 && req.job_name().empty()) {
    return absl::InvalidArgumentError(
        "coordinated reads (num_consumers) need a job_name shared by the consumers");
  }
  if (!proto::TargetWorkers_IsValid(req.target_workers())) {
    return absl::InvalidArgumentError("GetOrCreateJob: target_workers is unknown");
  }
  const bool local = req.target_workers() == proto::TARGET_WORKERS_LOCAL;
  if (local && req.num_consumers() > 0) {
    // As tf.data: each round is read from one worker, whichever host it is on.
    return absl::InvalidArgumentError(
        "coordinated reads (num_consumers) need non-local workers: every consumer reads every "
        "round's worker; target_workers=LOCAL does not combine with them");
  }
  if (local && sharding) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_workers=LOCAL does not combine with static sharding (processing_mode=",
        ProcessingModeName(req.processing_mode()),
        "): an iteration ends only once every worker's shard was read, and a consumer reading "
        "only its host's workers would never see that; use parallel_epochs or "
        "distributed_epoch"));
  }
  if (req.num_consumers() > 0 && req.processing_mode() == proto::DISTRIBUTED_EPOCH) {
    return absl::InvalidArgumentError(
        "coordinated reads (num_consumers) do not combine with distributed_epoch: use "
        "parallel_epochs or a static sharding mode");
  }
  absl::MutexLock l(&mu_);
  if (!datasets_.count(req.dataset_id())) {
    return absl::NotFoundError(absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
  }
  if (!req.job_name().empty()) {
    auto named = job_by_name_.find(req.job_name());
    if (named != job_by_name_.end()) {
      const Job& job = jobs_.at(named->second);
      if (job.mode != req.processing_mode()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job '", job.name, "' exists with processing_mode=", ProcessingModeName(job.mode),
            "; requested ", ProcessingModeName(req.processing_mode())));
      }
      if (job.dataset_id != req.dataset_id()) {
        return absl::InvalidArgumentError(absl::StrCat("job '", job.name, "' exists for dataset ",
                                                       job.dataset_id, "; requested ",
                                                       req.dataset_id()));
      }
      if (job.num_consumers != req.num_consumers()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job '", job.name, "' exists with num_consumers=", job.num_consumers, "; requested ",
            req.num_consumers()));
      }
      if (job.target_workers != req.target_workers()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job '", job.name, "' exists with target_workers=",
            TargetWorkersName(job.target_workers), "; requested ",
            TargetWorkersName(req.target_workers()), " (a job's consumers all use the same)"));
      }
      resp->set_job_id(job.id);
      return absl::OkStatus();
    }
  }
  const proto::DatasetDef& def = datasets_.at(req.dataset_id()).def;
  if (req.num_consumers() > 0) {
    auto ds = Dataset::FromDef(def);
    if (!ds.ok()) return ds.status();
    if (ds->Cardinality() != kInfiniteCardinality) {
      return absl::InvalidArgumentError(absl::StrCat(
          "coordinated reads (num_consumers) need an infinite dataset (end the pipeline before "
          "Distribute with Repeat()); this one has cardinality ",
          ds->Cardinality() == kUnknownCardinality ? std::string("unknown")
                                                   : std::to_string(ds->Cardinality())));
    }
  }
  if (sharding) {
    // Workers apply the same rewrite; checking it here turns a pipeline
    // that cannot be sharded into an error for the client at once.
    auto sharded = ApplyStaticSharding(def, *sharding,
                                       static_cast<int64_t>(config_.worker_addresses.size()), 0);
    if (!sharded.ok() && absl::IsInvalidArgument(sharded.status())) return sharded.status();
    if (!sharded.ok()) {
      spdlog::info("dispatcher: cannot check the sharding of dataset {} here ({}); workers will",
                   req.dataset_id(), std::string(sharded.status().message()));
    }
  } else if (ContainsShardHint(def.root())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pipeline has Shard(kShardHint, kShardHint), which only processing_mode=hint fills "
        "in; requested processing_mode=", ProcessingModeName(req.processing_mode())));
  }
  proto::JournalRecord rec;
  proto::CreateJobUpdate* job = rec.add_updates()->mutable_create_job();
  if (req.processing_mode() == proto::DISTRIBUTED_EPOCH) {
    auto source = FindSplitSource(def.root());
    if (!source.ok()) return source.status();
    *job->mutable_split_source() = *source->source;
    job->set_split_tracked(source->tracked);
  }
  job->set_job_id(next_id_++);
  job->set_dataset_id(req.dataset_id());
  job->set_processing_mode(req.processing_mode());
  job->set_job_name(req.job_name());
  job->set_num_consumers(req.num_consumers());
  job->set_target_workers(req.target_workers());
  SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
  resp->set_job_id(job->job_id());
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetOrCreateIterationUnsynced(const proto::GetOrCreateIterationRequest& req,
                                                  proto::GetOrCreateIterationResponse* resp) {
  if (req.repetition() < 0) {
    return absl::InvalidArgumentError("GetOrCreateIteration: repetition must be >= 0");
  }
  absl::MutexLock l(&mu_);
  auto jit = jobs_.find(req.job_id());
  if (jit == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " does not exist"));
  }
  const Job& job = jit->second;
  if (job.num_consumers > 0 &&
      (req.consumer_index() < 0 || req.consumer_index() >= job.num_consumers)) {
    return absl::InvalidArgumentError(absl::StrCat("GetOrCreateIteration: consumer_index ",
                                                   req.consumer_index(), " is not in [0, ",
                                                   job.num_consumers, ") for job '", job.name,
                                                   "'"));
  }
  const bool local = job.target_workers == proto::TARGET_WORKERS_LOCAL;
  if (local) {
    // As tf.data, a consumer reading only local workers needs one.
    std::set<std::string> hosts;
    for (const auto& [addr, w] : workers_) hosts.insert(w.host_id);
    if (req.host_id().empty() || !hosts.count(req.host_id())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target_workers=LOCAL reads only the workers on this consumer's host '",
          absl::CHexEscape(req.host_id().substr(0, 256)),
          "', but no worker is registered from it (workers' hosts: [",
          absl::StrJoin(hosts, ", "),
          "]); start a worker on this host, or set SLUICE_HOST_ID to name the same host in "
          "both processes"));
    }
  }
  proto::JournalRecord rec;
  int64_t iteration_id;
  bool created = false;
  auto existing = job.iteration_by_repetition.find(req.repetition());
  if (existing != job.iteration_by_repetition.end()) {
    iteration_id = existing->second;
    const Iteration& it = iterations_.at(iteration_id);
    if (it.collected && !it.finished) {
      return absl::FailedPreconditionError(absl::StrCat(
          "iteration ", req.repetition(), " of job '", job.name,
          "' was garbage-collected after no client read it for ", config_.job_gc_timeout_ms,
          " ms"));
    }
    if (job.num_consumers > 0 && it.consumer_clients.count(req.consumer_index())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "consumer_index ", req.consumer_index(), " of job '", job.name,
          "' is already reading iteration ", req.repetition(),
          "; every consumer needs its own index"));
    }
    // LOCAL: the first consumer on this host brings tasks on its workers.
    if (local && AcceptsTasksLocked(it) && !ReadsHostLocked(it, req.host_id())) {
      for (const auto& [addr, w] : workers_) {
        if (w.host_id == req.host_id() && NeedsTaskLocked(it, w.index)) {
          AddCreateTaskLocked(rec, iteration_id, false, addr);
        }
      }
    }
  } else {
    proto::CreateIterationUpdate* ci = rec.add_updates()->mutable_create_iteration();
    if (job.mode == proto::DISTRIBUTED_EPOCH) {
      SLUICE_RETURN_IF_ERROR(PlanSplitProviderLocked(job, ci));
    }
    iteration_id = next_id_++;
    ci->set_iteration_id(iteration_id);
    ci->set_job_id(job.id);
    ci->set_repetition(req.repetition());
    for (const auto& [addr, w] : workers_) {
      if (!local || w.host_id == req.host_id()) AddCreateTaskLocked(rec, iteration_id, false, addr);
    }
    created = true;
  }
  proto::CreateClientUpdate* c = rec.add_updates()->mutable_create_client();
  c->set_client_id(next_id_++);
  c->set_iteration_id(iteration_id);
  c->set_consumer_index(job.num_consumers > 0 ? req.consumer_index() : -1);
  c->set_host_id(req.host_id());
  SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
  // Tasks created from now on join a running iteration.
  if (created) iterations_.at(iteration_id).started = true;
  resp->set_iteration_id(iteration_id);
  resp->set_iteration_client_id(c->client_id());
  return absl::OkStatus();
}

// ---- clients --------------------------------------------------------------------

DispatcherImpl::PollFn DispatcherImpl::ClientHeartbeatPoll(const proto::ClientHeartbeatRequest& req,
                                                           proto::ClientHeartbeatResponse* resp) {
  return [this, &req, resp, iteration_id = int64_t{-1}](PollStep* step)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable -> absl::Status {
    const int64_t known_version = req.known_version();
    auto cit = clients_.find(req.iteration_client_id());
    if (iteration_id < 0) {  // the first step
      if (cit == clients_.end()) {
        return absl::NotFoundError(absl::StrCat("iteration client ", req.iteration_client_id(),
                                                " is unknown (released or timed out)"));
      }
      cit->second.last_heartbeat = clock_();
      iteration_id = cit->second.iteration_id;
      if (cit->second.consumer_index >= 0) {
        auto iit = iterations_.find(iteration_id);
        if (iit != iterations_.end()) {
          CoordinateLocked(iit->second, cit->second.consumer_index, req.current_round(),
                           req.blocked_round());
        }
      }
      auto changed = [this, known_version, id = iteration_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto it = iterations_.find(id);
        return shutdown_ || it == iterations_.end() || it->second.version != known_version;
      };
      const absl::Duration wait = std::min(absl::Milliseconds(req.wait_ms()), MaxClientWait());
      if (wait > absl::ZeroDuration() && !changed()) {
        *step = {true, VersionKey(iteration_id), changed, absl::Now() + wait};
        return absl::OkStatus();
      }
    }
    if (cit != clients_.end()) cit->second.last_heartbeat = clock_();
    auto iit = iterations_.find(iteration_id);
    if (iit == iterations_.end()) {
      return absl::NotFoundError(absl::StrCat("iteration ", iteration_id, " no longer exists"));
    }
    const Iteration& it = iit->second;
    // The client ends iff it sees the same finished state we record it on.
    if (req.at_end() && cit != clients_.end() && !cit->second.at_end && it.finished &&
        known_version == it.version) {
      proto::JournalRecord rec;
      rec.add_updates()->mutable_client_at_end()->set_client_id(cit->first);
      SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    }
    FillClientHeartbeatLocked(it, cit != clients_.end() ? cit->second.host_id : std::string(),
                              known_version, resp);
    return absl::OkStatus();
  };
}

absl::Status DispatcherImpl::ClientHeartbeatUnsynced(const proto::ClientHeartbeatRequest& req,
                                                     proto::ClientHeartbeatResponse* resp,
                                                     const IsCancelled& cancelled) {
  PollFn poll = ClientHeartbeatPoll(req, resp);
  absl::MutexLock l(&mu_);
  return RunPollLocked(poll, cancelled);
}

void DispatcherImpl::FillClientHeartbeatLocked(const Iteration& it, const std::string& host,
                                               int64_t known_version,
                                               proto::ClientHeartbeatResponse* resp) {
  // A client that knows a version of this dispatcher's gets only the tasks
  // added or changed since (none when the poll ran out): with thousands of
  // workers, every consumer receiving the whole list at every change was
  // most of the dispatcher's work (sluice-perf dispatcher).
  const bool delta = known_version >= it.delta_base && known_version <= it.version;
  resp->set_tasks_delta(delta);
  auto job = jobs_.find(it.job_id);
  const bool local = job != jobs_.end() && job->second.target_workers == proto::TARGET_WORKERS_LOCAL;
  std::vector<int64_t> changed;
  if (delta) {
    for (auto c = it.task_changes.upper_bound(known_version); c != it.task_changes.end(); ++c) {
      changed.push_back(c->second);
    }
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  }
  for (int64_t id : delta ? changed : std::vector<int64_t>(it.tasks.begin(), it.tasks.end())) {
    auto found = tasks_.find(id);
    if (found == tasks_.end() || !it.tasks.count(id)) continue;
    const Task& t = found->second;
    if (t.pending) continue;
    if (local && t.host_id != host) continue;  // another consumer host's workers
    proto::TaskInfo* info = resp->add_tasks();
    info->set_task_id(id);
    info->set_starting_round(t.starting_round);
    info->set_worker_address(t.worker);
    auto w = workers_.find(t.worker);
    if (w != workers_.end()) {
      info->set_transfer_address(w->second.transfer_address);
      info->set_transfer_protocol(w->second.protocol);
    }
    info->set_lost(t.lost);
  }
  resp->set_iteration_finished(it.finished || (it.collected && it.tasks.empty()));
  if (it.splits != nullptr) {
    resp->set_completed_split_watermark(it.splits->open.empty() ? next_id_
                                                                : it.splits->open.begin()->first);
  }
  resp->set_block_round(it.pending_tasks.empty() ? -1 : it.target_round);
  if (!it.error.ok()) *resp->mutable_error() = ToProto(it.error);
  resp->set_version(it.version);
}

void DispatcherImpl::CoordinateLocked(Iteration& it, int64_t consumer_index,
                                      int64_t current_round, int64_t blocked_round) {
  it.consumer_rounds[consumer_index] = std::max<int64_t>(0, current_round);
  if (it.pending_tasks.empty()) return;
  if (current_round > it.target_round) {
    // This consumer already read past the target: pick a later one, which
    // every consumer must agree to again.
    it.target_round = current_round + kRoundLead;
    it.ready_consumers.clear();
    BumpVersionLocked(it);
    return;
  }
  if (blocked_round != it.target_round) return;  // it learns the target in this reply
  it.ready_consumers.insert(consumer_index);
  const Job& job = jobs_.at(it.job_id);
  if (static_cast<int64_t>(it.ready_consumers.size()) < job.num_consumers) return;
  proto::JournalRecord rec;
  proto::StartTasksUpdate* start = rec.add_updates()->mutable_start_tasks();
  start->set_iteration_id(it.id);
  for (int64_t id : it.pending_tasks) start->add_task_ids(id);
  start->set_starting_round(it.target_round);
  if (!RecordLocked(rec).ok()) return;  // logged; the next heartbeat tries again
  spdlog::info("dispatcher: iteration {}: {} task(s) join the coordinated reads at round {}",
               it.id, start->task_ids_size(), start->starting_round());
}

void DispatcherImpl::RemoveClientLocked(int64_t client_id) {
  auto cit = clients_.find(client_id);
  if (cit == clients_.end()) return;
  auto iit = iterations_.find(cit->second.iteration_id);
  clients_.erase(cit);
  if (iit == iterations_.end()) return;
  iit->second.clients.erase(client_id);
  for (auto c = iit->second.consumer_clients.begin(); c != iit->second.consumer_clients.end(); ++c) {
    if (c->second == client_id) {
      iit->second.ready_consumers.erase(c->first);
      iit->second.consumer_clients.erase(c);
      break;
    }
  }
  if (iit->second.clients.empty()) iit->second.idle_since = clock_();
}

absl::Status DispatcherImpl::ReleaseIterationClientUnsynced(const proto::ReleaseIterationClientRequest& req,
                                                    proto::ReleaseIterationClientResponse* resp) {
  absl::MutexLock l(&mu_);
  if (!clients_.count(req.iteration_client_id())) {
    return absl::NotFoundError(absl::StrCat("iteration client ", req.iteration_client_id(),
                                            " is unknown (released or timed out)"));
  }
  proto::JournalRecord rec;
  rec.add_updates()->mutable_remove_client()->set_client_id(req.iteration_client_id());
  return RecordLocked(rec);
}

// ---- maintenance -----------------------------------------------------------------

void DispatcherImpl::CollectLocked(Iteration& it) {
  for (int64_t id : it.tasks) {
    auto t = tasks_.find(id);
    if (t == tasks_.end()) continue;
    auto w = workers_.find(t->second.worker);
    if (w != workers_.end()) {
      w->second.tasks.erase(id);
      w->second.pending_delete.push_back(id);
      WakeLocked(WorkerKey(w->first));
    }
    tasks_.erase(t);
  }
  it.tasks.clear();
  it.splits.reset();
  BumpSplitVersionLocked(it);
  it.collected = true;
  BumpVersionLocked(it);
  ++stats_.collected_iterations;
}

void DispatcherImpl::RemoveWorkerLocked(const std::string& address) {
  auto wit = workers_.find(address);
  if (wit == workers_.end()) return;
  int64_t lost = 0;
  for (int64_t id : wit->second.tasks) {
    auto t = tasks_.find(id);
    if (t == tasks_.end()) continue;
    if (!t->second.completed && !t->second.lost) ++lost;
    FinishTaskLocked(t->second, true);
  }
  if (!replaying_) {
    spdlog::warn("dispatcher: worker {} lost: no heartbeat for {} ms (worker_timeout_ms={}); {} "
                 "unfinished task(s) lost",
                 address, absl::ToInt64Milliseconds(clock_() - wit->second.last_heartbeat),
                 config_.worker_timeout_ms, lost);
  }
  WakeLocked(WorkerKey(wit->first));
  workers_.erase(wit);
  ++stats_.lost_workers;
}

void DispatcherImpl::TickUnsynced() {
  absl::MutexLock l(&mu_);
  absl::Time now = clock_();
  proto::JournalRecord expired;
  for (auto& [addr, w] : workers_) {
    if (now - w.last_heartbeat > absl::Milliseconds(config_.worker_timeout_ms)) {
      expired.add_updates()->mutable_remove_worker()->set_address(addr);
    }
  }
  for (auto& [id, c] : clients_) {
    if (now - c.last_heartbeat > absl::Milliseconds(config_.client_timeout_ms)) {
      spdlog::warn("dispatcher: iteration client {} timed out after {} ms; releasing it", id,
                   config_.client_timeout_ms);
      expired.add_updates()->mutable_remove_client()->set_client_id(id);
    }
  }
  if (!RecordLocked(expired).ok()) return;  // logged; the next tick tries again
  proto::JournalRecord collect;
  for (auto& [id, it] : iterations_) {
    if (it.collected || !it.clients.empty()) continue;
    const Job& job = jobs_.at(it.job_id);
    bool anonymous = job.name.empty();
    if (it.finished || anonymous ||
        now - it.idle_since > absl::Milliseconds(config_.job_gc_timeout_ms)) {
      collect.add_updates()->mutable_collect_iteration()->set_iteration_id(id);
    }
  }
  if (!RecordLocked(collect).ok()) return;
  // An anonymous job has no name to come back by: once every iteration of
  // it is collected, forget it entirely.
  proto::JournalRecord drop;
  for (const auto& [job_id, job] : jobs_) {
    if (!job.name.empty() || job.iteration_by_repetition.empty()) continue;
    bool all_collected = true;
    for (const auto& [rep, id] : job.iteration_by_repetition) {
      all_collected = all_collected && iterations_.at(id).collected;
    }
    if (all_collected) drop.add_updates()->mutable_drop_job()->set_job_id(job_id);
  }
  RecordLocked(drop).IgnoreError();  // logged; the next tick tries again
}

// ---- distributed_epoch: splits ------------------------------------------------------

absl::Status DispatcherImpl::PlanSplitProviderLocked(const Job& job,
                                                     proto::CreateIterationUpdate* u) {
  auto plan = SplitSourcePositions(job.split_source);
  // NotFound / Unavailable: a ListFiles pattern, globbed here.
  if (absl::IsNotFound(plan.status()) || absl::IsUnavailable(plan.status())) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("distributed_epoch: ", plan.status().message(),
                                     " on the dispatcher (it lists the files to split them; "
                                     "workers and the dispatcher must see the same file system)"));
  }
  if (!plan.ok()) return plan.status();
  u->set_has_splits(true);
  u->set_positions(plan->positions);
  u->set_split_elements(
      plan->multi_position_splits ? std::max<int64_t>(1, config_.range_split_elements) : 1);
  for (std::string& f : plan->files) u->add_files(std::move(f));
  return absl::OkStatus();
}

void DispatcherImpl::CompleteSplitLocked(Iteration& it, Task& t, int64_t split_id) {
  SplitProvider& p = *it.splits;
  auto o = p.open.find(split_id);
  // Unknown (completed before) or reassigned since: the report is stale.
  if (o == p.open.end() || o->second.holder_task != t.id) return;
  const int64_t epoch = o->second.def.epoch();
  p.open.erase(o);
  t.held_splits.erase(split_id);
  ++stats_.splits_completed;
  BumpSplitVersionLocked(it);
  auto e = p.epochs.find(epoch);
  if (e != p.epochs.end()) --e->second.open;
  // Forget epochs that completed, lowest first.
  while (true) {
    auto low = p.epochs.find(p.done_below);
    if (low == p.epochs.end()) break;
    const Epoch& ep = low->second;
    if (ep.open > 0 || !ep.queue.empty() || ep.next_position < p.positions) break;
    p.epochs.erase(low);
    ++p.done_below;
  }
}

void DispatcherImpl::ReleaseSplitsLocked(Task& t, bool requeue) {
  if (t.held_splits.empty()) return;
  auto iit = iterations_.find(t.iteration_id);
  if (iit == iterations_.end() || iit->second.splits == nullptr) {
    t.held_splits.clear();
    return;
  }
  Iteration& it = iit->second;
  std::set<int64_t> held;
  held.swap(t.held_splits);
  if (!requeue) {
    for (int64_t id : held) {
      t.held_splits.insert(id);
      CompleteSplitLocked(it, t, id);
    }
    t.held_splits.clear();
    return;
  }
  SplitProvider& p = *it.splits;
  // Highest id first onto the front: the queue then hands them out in order.
  for (auto r = held.rbegin(); r != held.rend(); ++r) {
    auto o = p.open.find(*r);
    if (o == p.open.end()) continue;
    o->second.holder_task = 0;
    p.epochs[o->second.def.epoch()].queue.push_front(*r);
    ++stats_.splits_reassigned;
  }
  if (!replaying_) {
    spdlog::warn("dispatcher: task {} was lost holding {} unfinished split(s) of iteration {}; "
                 "they go to the remaining workers",
                 t.id, held.size(), it.id);
  }
  BumpSplitVersionLocked(it);
}

void DispatcherImpl::RequeueSplitsLocked(Iteration& it, Task& t, const std::set<int64_t>& ids) {
  SplitProvider& p = *it.splits;
  // Highest id first onto the front: the queue then hands them out in order.
  for (auto r = ids.rbegin(); r != ids.rend(); ++r) {
    auto o = p.open.find(*r);
    if (o == p.open.end() || o->second.holder_task != t.id) continue;
    o->second.holder_task = 0;
    t.held_splits.erase(*r);
    p.epochs[o->second.def.epoch()].queue.push_front(*r);
    ++stats_.splits_reassigned;
  }
  BumpSplitVersionLocked(it);
}

bool DispatcherImpl::PlanSplitLocked(const Iteration& it, int64_t task_id, int64_t epoch,
                                     proto::GetSplitResponse* resp,
                                     proto::AssignSplitUpdate* assign) {
  const SplitProvider& p = *it.splits;
  resp->set_epoch_had_splits(p.positions > 0);
  if (epoch < p.done_below) {
    resp->set_end_of_splits(true);
    return false;
  }
  static const Epoch kFresh;
  auto found = p.epochs.find(epoch);
  const Epoch& e = found == p.epochs.end() ? kFresh : found->second;
  assign->set_task_id(task_id);
  if (!e.queue.empty()) {
    *assign->mutable_split() = p.open.at(e.queue.front()).def;
    return true;
  }
  if (e.next_position < p.positions) {
    proto::SplitProto* def = assign->mutable_split();
    def->set_split_id(next_id_++);
    def->set_epoch(epoch);
    const int64_t begin = e.next_position;
    const int64_t end = p.files.empty() ? std::min(p.positions, begin + p.split_elements)
                                        : begin + 1;
    // A file split carries its file and its position in the sorted list
    // (what seeds random functions on its elements: SourceKey).
    def->set_begin(begin);
    def->set_end(end);
    if (!p.files.empty()) def->set_file(p.files[begin]);
    assign->set_created(true);
    assign->set_next_position(end);
    return true;
  }
  if (e.open == 0) {
    resp->set_end_of_splits(true);
  } else {
    resp->set_not_ready(true);  // others hold the rest: one may be lost
  }
  return false;
}

absl::Status DispatcherImpl::AssignSplitLocked(const proto::AssignSplitUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(tasks_, u.task_id(), "task"));
  Task& t = tasks_.at(u.task_id());
  Iteration& it = iterations_.at(t.iteration_id);
  if (it.splits == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("iteration ", it.id, " has no splits to assign"));
  }
  SplitProvider& p = *it.splits;
  const int64_t id = u.split().split_id();
  Epoch& e = p.epochs[u.split().epoch()];
  if (u.created()) {
    if (p.open.count(id)) return absl::AlreadyExistsError(absl::StrCat("split ", id, " exists"));
    OpenSplit o;
    o.def = u.split();
    p.open.emplace(id, std::move(o));
    e.next_position = u.next_position();
    ++e.open;
    ++stats_.splits_created;
    next_id_ = std::max(next_id_, id + 1);
  } else {
    auto q = std::find(e.queue.begin(), e.queue.end(), id);
    if (q == e.queue.end() || !p.open.count(id)) {
      return absl::NotFoundError(absl::StrCat("split ", id, " is not queued"));
    }
    e.queue.erase(q);
  }
  p.open.at(id).holder_task = t.id;
  t.held_splits.insert(id);
  return absl::OkStatus();
}

DispatcherImpl::PollFn DispatcherImpl::GetSplitPoll(const proto::GetSplitRequest& req,
                                                    proto::GetSplitResponse* resp) {
  const absl::Time deadline = clock_() + absl::Milliseconds(std::max<int64_t>(0, req.wait_ms()));
  // Each step completes what the request reports and plans a split; when
  // none is ready yet it waits for a change to the iteration's splits.
  return [this, &req, resp, deadline](PollStep* step)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    auto t = tasks_.find(req.task_id());
    if (t == tasks_.end()) {
      return absl::NotFoundError(
          absl::StrCat("GetSplit: task ", req.task_id(), " does not exist (collected)"));
    }
    Task& task = t->second;
    if (task.worker != req.worker_address()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: task ", task.id, " belongs to worker ", task.worker, ", not ",
          req.worker_address()));
    }
    Iteration& it = iterations_.at(task.iteration_id);
    if (it.splits == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: iteration ", it.id, " is not distributed_epoch (or was collected)"));
    }
    proto::JournalRecord rec;
    proto::CompleteSplitsUpdate completed;
    for (int64_t id : req.completed_splits()) {
      if (task.held_splits.count(id)) completed.add_split_ids(id);
    }
    if (completed.split_ids_size() > 0) {
      completed.set_task_id(task.id);
      *rec.add_updates()->mutable_complete_splits() = std::move(completed);
    }
    if (req.reports_held() && !req.report_only() && !task.lost) {
      // Splits handed to this task whose reply never reached it.
      std::set<int64_t> reported(req.held_splits().begin(), req.held_splits().end());
      reported.insert(req.completed_splits().begin(), req.completed_splits().end());
      proto::RequeueSplitsUpdate requeue;
      for (int64_t id : task.held_splits) {
        if (!reported.count(id)) requeue.add_split_ids(id);
      }
      if (requeue.split_ids_size() > 0) {
        spdlog::warn("dispatcher: task {} never received split(s) {}; handing them out again",
                     task.id, absl::StrJoin(requeue.split_ids(), ","));
        requeue.set_task_id(task.id);
        *rec.add_updates()->mutable_requeue_splits() = std::move(requeue);
      }
    }
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    if (req.report_only()) return absl::OkStatus();
    if (task.lost) {
      // Its splits went to other workers; handing it more would strand them.
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: task ", task.id, " on worker ", task.worker,
          " was declared lost (no heartbeat for ", config_.worker_timeout_ms,
          " ms); its splits were reassigned"));
    }
    resp->Clear();
    proto::JournalRecord assign;
    if (PlanSplitLocked(it, task.id, req.epoch(), resp,
                        assign.add_updates()->mutable_assign_split())) {
      SLUICE_RETURN_IF_ERROR(RecordLocked(assign));
      *resp->mutable_split() = assign.updates(0).assign_split().split();
      return absl::OkStatus();
    }
    if (!resp->not_ready() || shutdown_ || step->timed_out || clock_() >= deadline) {
      return absl::OkStatus();
    }
    // Wait for a change to the splits (a completion, a reassignment).
    const int64_t iteration_id = it.id, seen = it.split_version;
    auto changed = [this, iteration_id, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto i = iterations_.find(iteration_id);
      return shutdown_ || i == iterations_.end() || i->second.split_version != seen;
    };
    *step = {true, SplitsKey(iteration_id), changed, absl::Now() + (deadline - clock_())};
    return absl::OkStatus();
  };
}

absl::Status DispatcherImpl::GetSplitUnsynced(const proto::GetSplitRequest& req,
                                              proto::GetSplitResponse* resp,
                                              const IsCancelled& cancelled) {
  PollFn poll = GetSplitPoll(req, resp);
  absl::MutexLock l(&mu_);
  return RunPollLocked(poll, cancelled);
}

// ---- introspection ------------------------------------------------------------------

absl::Status DispatcherImpl::GetWorkersUnsynced(const proto::GetWorkersRequest& req,
                                        proto::GetWorkersResponse* resp) {
  absl::MutexLock l(&mu_);
  for (const auto& [addr, w] : workers_) {
    auto* info = resp->add_workers();
    info->set_address(addr);
    info->set_transfer_address(w.transfer_address);
    info->set_transfer_protocol(w.protocol);
    info->set_num_tasks(static_cast<int64_t>(w.tasks.size()));
    info->set_host_id(w.host_id);
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetDataServiceMetadataUnsynced(
    const proto::GetDataServiceMetadataRequest& req,
    proto::GetDataServiceMetadataResponse* resp) {
  proto::DatasetDef def;
  {
    absl::MutexLock l(&mu_);
    auto it = datasets_.find(req.dataset_id());
    if (it == datasets_.end()) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
    }
    def = it->second.def;
    resp->set_fingerprint(it->second.fingerprint);
  }
  // The dispatcher loads no plugins, so a definition with UDFs may not
  // analyze here; its cardinality is then unknown.
  auto ds = Dataset::FromDef(def);
  resp->set_cardinality(ds.ok() ? ds->Cardinality() : kUnknownCardinality);
  resp->set_element_spec(ds.ok() ? ds->element_spec().ToString() : "(unknown)");
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetDataServiceConfigUnsynced(const proto::GetDataServiceConfigRequest& req,
                                                  proto::GetDataServiceConfigResponse* resp) {
  resp->set_fault_tolerant_mode(config_.fault_tolerant_mode);
  resp->set_worker_timeout_ms(config_.worker_timeout_ms);
  resp->set_client_timeout_ms(config_.client_timeout_ms);
  resp->set_job_gc_timeout_ms(config_.job_gc_timeout_ms);
  return absl::OkStatus();
}

DispatcherImpl::Stats DispatcherImpl::GetStats() {
  absl::MutexLock l(&mu_);
  Stats s = stats_;
  s.workers = static_cast<int64_t>(workers_.size());
  s.iteration_clients = static_cast<int64_t>(clients_.size());
  s.live_tasks = static_cast<int64_t>(tasks_.size());
  s.datasets = static_cast<int64_t>(datasets_.size());
  s.current_jobs = static_cast<int64_t>(jobs_.size());
  for (const auto& [id, it] : iterations_) s.active_iterations += !it.finished && !it.collected;
  const absl::Time now = clock_();
  for (const auto& [addr, w] : workers_) {
    s.max_worker_heartbeat_age_ms =
        std::max(s.max_worker_heartbeat_age_ms, absl::ToInt64Milliseconds(now - w.last_heartbeat));
  }
  for (const auto& [id, c] : clients_) {
    s.max_client_heartbeat_age_ms =
        std::max(s.max_client_heartbeat_age_ms, absl::ToInt64Milliseconds(now - c.last_heartbeat));
  }
  return s;
}

}  // namespace sluice::internal
