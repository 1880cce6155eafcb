#include "sluice/control/dispatcher_impl.h"
#include "sluice/control/grpc_util.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"

namespace sluice::internal {

namespace {

struct ModeName {
  const char* name;
  proto::ProcessingMode mode;
};
// The first name of a mode is its canonical one; "off" and "dynamic" are
// tf.data's names of the sharding policies behind the two epoch modes.
constexpr ModeName kModeNames[] = {
    {"parallel_epochs", proto::PARALLEL_EPOCHS}, {"distributed_epoch", proto::DISTRIBUTED_EPOCH},
    {"file", proto::FILE_SHARDING},              {"data", proto::DATA_SHARDING},
    {"file_or_data", proto::FILE_OR_DATA_SHARDING}, {"hint", proto::HINT_SHARDING},
    {"off", proto::PARALLEL_EPOCHS},             {"dynamic", proto::DISTRIBUTED_EPOCH},
};

}  // namespace

absl::StatusOr<proto::ProcessingMode> ParseProcessingMode(const std::string& name) {
  for (const ModeName& m : kModeNames) {
    if (name == m.name) return m.mode;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown processing_mode '", name,
      "'; expected parallel_epochs (off), distributed_epoch (dynamic), file, data, "
      "file_or_data or hint"));
}

std::string ProcessingModeName(proto::ProcessingMode mode) {
  for (const ModeName& m : kModeNames) {
    if (mode == m.mode) return m.name;
  }
  return "unspecified";
}

std::optional<StaticSharding> StaticShardingOf(proto::ProcessingMode mode) {
  switch (mode) {
    case proto::FILE_SHARDING: return StaticSharding::kFile;
    case proto::DATA_SHARDING: return StaticSharding::kData;
    case proto::FILE_OR_DATA_SHARDING: return StaticSharding::kFileOrData;
    case proto::HINT_SHARDING: return StaticSharding::kHint;
    default: return std::nullopt;
  }
}

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

DispatcherImpl::DispatcherImpl(DispatcherConfig config, Clock clock)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      shard_claims_(config_.worker_addresses.size()) {}

void DispatcherImpl::Shutdown() {
  absl::MutexLock l(&mu_);
  shutdown_ = true;
}

// ---- workers ------------------------------------------------------------------

void DispatcherImpl::CreateTaskLocked(Iteration& it, Worker& w) {
  const Job& job = jobs_.at(it.job_id);
  Task t;
  t.id = next_id_++;
  t.iteration_id = it.id;
  t.worker = w.address;
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
  if (job.num_consumers > 0 && it.started) {
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
  w.tasks.insert(t.id);
  it.tasks.insert(t.id);
  ++it.version;
  tasks_.emplace(t.id, std::move(t));
}

bool DispatcherImpl::NeedsTaskLocked(const Iteration& it, const Worker& w) {
  if (!StaticShardingOf(jobs_.at(it.job_id).mode)) return true;
  for (int64_t id : it.tasks) {
    const Task& t = tasks_.at(id);
    if (t.shard == w.index && !t.lost) return false;
  }
  return true;
}

absl::StatusOr<int64_t> DispatcherImpl::ClaimShardLocked(const std::string& address) {
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
  shard_claims_[*index] = address;
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
  ++it->second.version;
  UpdateFinishedLocked(it->second);
}

void DispatcherImpl::UpdateFinishedLocked(Iteration& it) {
  if (it.finished || it.tasks.empty()) return;
  std::set<int64_t> completed_shards;
  for (int64_t id : it.tasks) {
    const Task& t = tasks_.at(id);
    if (!t.completed && !t.lost) return;
    if (t.completed) completed_shards.insert(t.shard);
  }
  // Static sharding: an iteration ends only once every shard was read to
  // its end (a lost worker's shard waits for a worker to take it again).
  if (StaticShardingOf(jobs_.at(it.job_id).mode) &&
      completed_shards.size() < config_.worker_addresses.size()) {
    return;
  }
  it.finished = true;
  ++it.version;
}

absl::Status DispatcherImpl::WorkerHeartbeat(const proto::WorkerHeartbeatRequest& req,
                                             proto::WorkerHeartbeatResponse* resp) {
  if (req.worker_address().empty()) {
    return absl::InvalidArgumentError("WorkerHeartbeat: worker_address is empty");
  }
  const std::string& addr = req.worker_address();
  absl::MutexLock l(&mu_);
  auto wit = workers_.find(addr);
  if (wit == workers_.end()) {
    Worker w;
    w.address = addr;
    w.transfer_address = req.transfer_address().empty() ? addr : req.transfer_address();
    w.protocol = req.transfer_protocol().empty() ? "grpc" : req.transfer_protocol();
    if (config_.worker_addresses.empty()) {
      w.index = next_worker_index_++;
    } else {
      SLUICE_ASSIGN_OR_RETURN(w.index, ClaimShardLocked(addr));
    }
    wit = workers_.emplace(addr, std::move(w)).first;
    spdlog::info("dispatcher: worker {} registered as worker {} (transfer {} over {})", addr,
                 wit->second.index, wit->second.transfer_address, wit->second.protocol);
    // A worker that joins mid-job gets a task for every running iteration.
    for (auto& [id, it] : iterations_) {
      if (!it.finished && !it.collected && NeedsTaskLocked(it, wit->second)) {
        CreateTaskLocked(it, wit->second);
      }
    }
  }
  Worker& w = wit->second;
  w.last_heartbeat = clock_();
  for (int64_t id : req.finished_tasks()) {
    auto t = tasks_.find(id);
    if (t != tasks_.end() && t->second.worker == addr) FinishTaskLocked(t->second, false);
  }
  // Reconcile: tasks this worker should hold but does not (it restarted)
  // are lost; tasks it holds that we no longer know are deleted.
  std::set<int64_t> held(req.current_tasks().begin(), req.current_tasks().end());
  std::set<int64_t> lost_in;  // iterations that lost a task of this worker
  for (int64_t id : w.tasks) {
    Task& t = tasks_.at(id);
    if (t.delivered && !held.count(id) && !t.completed && !t.lost) {
      spdlog::warn("dispatcher: worker {} no longer holds task {}; marking it lost", addr, id);
      FinishTaskLocked(t, true);
      lost_in.insert(t.iteration_id);
    }
  }
  // Static sharding: the restarted worker reads its shard again.
  for (int64_t iteration_id : lost_in) {
    Iteration& it = iterations_.at(iteration_id);
    if (!it.finished && !it.collected && StaticShardingOf(jobs_.at(it.job_id).mode) &&
        NeedsTaskLocked(it, w)) {
      CreateTaskLocked(it, w);
    }
  }
  for (int64_t id : held) {
    if (!w.tasks.count(id)) w.pending_delete.push_back(id);
  }
  // The condition looks the worker up again: Tick() may remove it while we
  // wait (its entry must not be referenced across the wait).
  auto has_news = [&addr, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = workers_.find(addr);
    return shutdown_ || it == workers_.end() || !it->second.pending_new.empty() ||
           !it->second.pending_delete.empty();
  };
  if (req.wait_ms() > 0 && !has_news()) {
    ++w.waiting;  // a worker inside a long poll is alive
    mu_.AwaitWithTimeout(absl::Condition(&has_news), absl::Milliseconds(req.wait_ms()));
    auto again = workers_.find(addr);
    if (again != workers_.end()) --again->second.waiting;
  }
  // The worker may have been removed while we waited (Tick after timeout).
  wit = workers_.find(addr);
  if (wit == workers_.end()) return absl::OkStatus();
  Worker& w2 = wit->second;
  for (auto& def : w2.pending_new) {
    auto t = tasks_.find(def.task_id());
    if (t != tasks_.end()) t->second.delivered = true;
    *resp->add_new_tasks() = std::move(def);
  }
  w2.pending_new.clear();
  for (int64_t id : w2.pending_delete) resp->add_tasks_to_delete(id);
  w2.pending_delete.clear();
  w2.last_heartbeat = clock_();
  return absl::OkStatus();
}

absl::Status DispatcherImpl::WorkerUpdate(const proto::WorkerUpdateRequest& req,
                                          proto::WorkerUpdateResponse* resp) {
  absl::MutexLock l(&mu_);
  for (const auto& u : req.updates()) {
    auto t = tasks_.find(u.task_id());
    if (t == tasks_.end()) continue;  // already collected
    if (u.has_error() && u.error().code() != 0) {
      auto it = iterations_.find(t->second.iteration_id);
      if (it != iterations_.end() && it->second.error.ok()) {
        it->second.error = FromProto(u.error());
        ++it->second.version;
        spdlog::warn("dispatcher: iteration {} failed on worker {}: {}", it->first,
                     req.worker_address(), std::string(it->second.error.message()));
      }
    }
    if (u.completed() || u.has_error()) FinishTaskLocked(t->second, false);
  }
  return absl::OkStatus();
}

// ---- datasets and jobs --------------------------------------------------------------

absl::Status DispatcherImpl::RegisterDataset(const proto::RegisterDatasetRequest& req,
                                             proto::RegisterDatasetResponse* resp) {
  if (req.dataset().version() != 1 || !req.dataset().has_root() ||
      req.dataset().root().op_case() == proto::DatasetNode::OP_NOT_SET) {
    return absl::InvalidArgumentError(
        "RegisterDataset: the dataset definition is empty or of an unsupported version");
  }
  uint64_t fp = DefFingerprint(req.dataset());
  absl::MutexLock l(&mu_);
  // Deduplicate by fingerprint; a (vanishingly unlikely) collision between
  // different definitions gets a suffixed id.
  for (int suffix = 0;; ++suffix) {
    std::string id = absl::StrCat("ds-", absl::Hex(fp, absl::kZeroPad16),
                                  suffix ? absl::StrCat("-", suffix) : "");
    auto it = datasets_.find(id);
    if (it == datasets_.end()) {
      datasets_.emplace(id, DatasetEntry{id, req.dataset(), fp});
      resp->set_dataset_id(id);
      return absl::OkStatus();
    }
    if (CanonicalBytes(it->second.def) == CanonicalBytes(req.dataset())) {
      resp->set_dataset_id(id);
      return absl::OkStatus();
    }
  }
}

absl::Status DispatcherImpl::GetDatasetDef(const proto::GetDatasetDefRequest& req,
                                           proto::GetDatasetDefResponse* resp) {
  absl::MutexLock l(&mu_);
  auto it = datasets_.find(req.dataset_id());
  if (it == datasets_.end()) {
    return absl::NotFoundError(absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
  }
  *resp->mutable_dataset() = it->second.def;
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetOrCreateJob(const proto::GetOrCreateJobRequest& req,
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
  Job job;
  if (req.processing_mode() == proto::DISTRIBUTED_EPOCH) {
    auto source = FindSplitSource(def.root());
    if (!source.ok()) return source.status();
    job.split_source = *source->source;
    job.split_tracked = source->tracked;
  }
  job.id = next_id_++;
  job.dataset_id = req.dataset_id();
  job.mode = req.processing_mode();
  job.name = req.job_name();
  job.num_consumers = req.num_consumers();
  if (!job.name.empty()) job_by_name_[job.name] = job.id;
  resp->set_job_id(job.id);
  jobs_.emplace(job.id, std::move(job));
  ++stats_.jobs;
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetOrCreateIteration(const proto::GetOrCreateIterationRequest& req,
                                                  proto::GetOrCreateIterationResponse* resp) {
  if (req.repetition() < 0) {
    return absl::InvalidArgumentError("GetOrCreateIteration: repetition must be >= 0");
  }
  absl::MutexLock l(&mu_);
  auto jit = jobs_.find(req.job_id());
  if (jit == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " does not exist"));
  }
  Job& job = jit->second;
  int64_t iteration_id;
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
  } else {
    Iteration it;
    if (job.mode == proto::DISTRIBUTED_EPOCH) SLUICE_RETURN_IF_ERROR(MakeSplitProviderLocked(job, it));
    it.id = next_id_++;
    it.job_id = job.id;
    it.repetition = req.repetition();
    iteration_id = it.id;
    auto& ref = iterations_.emplace(it.id, std::move(it)).first->second;
    job.iteration_by_repetition[req.repetition()] = iteration_id;
    for (auto& [addr, w] : workers_) CreateTaskLocked(ref, w);
    ref.started = true;
    ++stats_.iterations;
  }
  Iteration& it = iterations_.at(iteration_id);
  Client c;
  if (job.num_consumers > 0) {
    const int64_t ci = req.consumer_index();
    if (ci < 0 || ci >= job.num_consumers) {
      return absl::InvalidArgumentError(absl::StrCat("GetOrCreateIteration: consumer_index ", ci,
                                                     " is not in [0, ", job.num_consumers,
                                                     ") for job '", job.name, "'"));
    }
    if (it.consumer_clients.count(ci)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "consumer_index ", ci, " of job '", job.name, "' is already reading iteration ",
          req.repetition(), "; every consumer needs its own index"));
    }
    c.consumer_index = ci;
  }
  c.id = next_id_++;
  if (c.consumer_index >= 0) it.consumer_clients[c.consumer_index] = c.id;
  c.iteration_id = iteration_id;
  c.last_heartbeat = clock_();
  it.clients.insert(c.id);
  resp->set_iteration_id(iteration_id);
  resp->set_iteration_client_id(c.id);
  clients_.emplace(c.id, c);
  return absl::OkStatus();
}

// ---- clients --------------------------------------------------------------------

absl::Status DispatcherImpl::ClientHeartbeat(const proto::ClientHeartbeatRequest& req,
                                             proto::ClientHeartbeatResponse* resp) {
  const int64_t known_version = req.known_version();
  const absl::Duration wait = absl::Milliseconds(req.wait_ms());
  absl::MutexLock l(&mu_);
  auto cit = clients_.find(req.iteration_client_id());
  if (cit == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("iteration client ", req.iteration_client_id(),
                                            " is unknown (released or timed out)"));
  }
  cit->second.last_heartbeat = clock_();
  int64_t iteration_id = cit->second.iteration_id;
  if (cit->second.consumer_index >= 0) {
    auto iit = iterations_.find(iteration_id);
    if (iit != iterations_.end()) {
      CoordinateLocked(iit->second, cit->second.consumer_index, req.current_round(),
                       req.blocked_round());
    }
  }
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = iterations_.find(iteration_id);
    return shutdown_ || it == iterations_.end() || it->second.version != known_version;
  };
  if (wait > absl::ZeroDuration() && !changed()) {
    mu_.AwaitWithTimeout(absl::Condition(&changed), wait);
  }
  cit = clients_.find(req.iteration_client_id());
  if (cit != clients_.end()) cit->second.last_heartbeat = clock_();
  auto iit = iterations_.find(iteration_id);
  if (iit == iterations_.end()) {
    return absl::NotFoundError(absl::StrCat("iteration ", iteration_id, " no longer exists"));
  }
  const Iteration& it = iit->second;
  for (int64_t id : it.tasks) {
    const Task& t = tasks_.at(id);
    if (t.pending) continue;
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
  return absl::OkStatus();
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
    ++it.version;
    return;
  }
  if (blocked_round != it.target_round) return;  // it learns the target in this reply
  it.ready_consumers.insert(consumer_index);
  const Job& job = jobs_.at(it.job_id);
  if (static_cast<int64_t>(it.ready_consumers.size()) < job.num_consumers) return;
  for (int64_t id : it.pending_tasks) {
    auto t = tasks_.find(id);
    if (t == tasks_.end()) continue;
    t->second.pending = false;
    t->second.starting_round = it.target_round;
  }
  spdlog::info("dispatcher: iteration {}: {} task(s) join the coordinated reads at round {}",
               it.id, it.pending_tasks.size(), it.target_round);
  it.pending_tasks.clear();
  it.ready_consumers.clear();
  ++it.version;
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

absl::Status DispatcherImpl::ReleaseIterationClient(const proto::ReleaseIterationClientRequest& req,
                                                    proto::ReleaseIterationClientResponse* resp) {
  absl::MutexLock l(&mu_);
  if (!clients_.count(req.iteration_client_id())) {
    return absl::NotFoundError(absl::StrCat("iteration client ", req.iteration_client_id(),
                                            " is unknown (released or timed out)"));
  }
  RemoveClientLocked(req.iteration_client_id());
  return absl::OkStatus();
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
    }
    tasks_.erase(t);
  }
  it.tasks.clear();
  it.splits.reset();
  ++it.split_version;
  it.collected = true;
  ++it.version;
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
  spdlog::warn("dispatcher: worker {} timed out after {} ms; {} unfinished task(s) lost", address,
               config_.worker_timeout_ms, lost);
  workers_.erase(wit);
  ++stats_.lost_workers;
}

void DispatcherImpl::Tick() {
  absl::MutexLock l(&mu_);
  absl::Time now = clock_();
  std::vector<std::string> dead_workers;
  for (auto& [addr, w] : workers_) {
    if (w.waiting == 0 && now - w.last_heartbeat > absl::Milliseconds(config_.worker_timeout_ms)) {
      dead_workers.push_back(addr);
    }
  }
  for (const auto& a : dead_workers) RemoveWorkerLocked(a);
  std::vector<int64_t> dead_clients;
  for (auto& [id, c] : clients_) {
    if (now - c.last_heartbeat > absl::Milliseconds(config_.client_timeout_ms)) {
      dead_clients.push_back(id);
    }
  }
  for (int64_t id : dead_clients) {
    spdlog::warn("dispatcher: iteration client {} timed out after {} ms; releasing it", id,
                 config_.client_timeout_ms);
    RemoveClientLocked(id);
  }
  std::vector<int64_t> drop_jobs;
  for (auto& [id, it] : iterations_) {
    if (it.collected || !it.clients.empty()) continue;
    const Job& job = jobs_.at(it.job_id);
    bool anonymous = job.name.empty();
    if (it.finished || anonymous ||
        now - it.idle_since > absl::Milliseconds(config_.job_gc_timeout_ms)) {
      CollectLocked(it);
      if (anonymous) drop_jobs.push_back(job.id);
    }
  }
  // An anonymous job has no name to come back by: once every iteration of
  // it is collected, forget it entirely.
  std::sort(drop_jobs.begin(), drop_jobs.end());
  drop_jobs.erase(std::unique(drop_jobs.begin(), drop_jobs.end()), drop_jobs.end());
  drop_jobs.erase(std::remove_if(drop_jobs.begin(), drop_jobs.end(),
                                 [this](int64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                   for (auto& [rep, id] : jobs_.at(job_id).iteration_by_repetition) {
                                     if (!iterations_.at(id).collected) return true;
                                   }
                                   return false;
                                 }),
                  drop_jobs.end());
  for (int64_t job_id : drop_jobs) {
    for (auto& [rep, iteration_id] : jobs_.at(job_id).iteration_by_repetition) {
      iterations_.erase(iteration_id);
    }
    jobs_.erase(job_id);
  }
}

// ---- distributed_epoch: splits ------------------------------------------------------

namespace {

// Number of positions of a Range (as Python's len(range(...))).
int64_t RangeLength(const proto::DatasetNode::Range& r) {
  __int128 span = static_cast<__int128>(r.stop()) - r.start();
  if (r.step() == 0 || (r.step() > 0 && span <= 0) || (r.step() < 0 && span >= 0)) return 0;
  __int128 step = r.step();
  if (step < 0) {
    span = -span;
    step = -step;
  }
  return static_cast<int64_t>((span + step - 1) / step);
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) {
  auto files = GlobFiles(pattern);
  if (files.ok()) return files;
  return absl::Status(files.status().code(),
                      absl::StrCat("distributed_epoch: ", files.status().message(),
                                   " on the dispatcher (it lists the files to split them; "
                                   "workers and the dispatcher must see the same file system)"));
}

}  // namespace

absl::Status DispatcherImpl::MakeSplitProviderLocked(const Job& job, Iteration& it) {
  auto p = std::make_unique<SplitProvider>();
  const proto::DatasetNode& src = job.split_source;
  switch (src.op_case()) {
    case proto::DatasetNode::kRange:
      p->positions = RangeLength(src.range());
      p->split_elements = config_.range_split_elements;
      break;
    case proto::DatasetNode::kFromTensors:
      p->positions = src.from_tensors().elements_size();
      break;
    case proto::DatasetNode::kListFiles: {
      auto files = Glob(src.list_files().pattern());
      if (!files.ok()) return files.status();
      p->files = *std::move(files);
      p->positions = static_cast<int64_t>(p->files.size());
      break;
    }
    default:
      return absl::InternalError("distributed_epoch job without a split source");
  }
  p->split_elements = std::max<int64_t>(1, p->split_elements);
  it.splits = std::move(p);
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
  ++it.split_version;
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
  spdlog::warn("dispatcher: task {} was lost holding {} unfinished split(s) of iteration {}; "
               "they go to the remaining workers",
               t.id, held.size(), it.id);
  ++it.split_version;
}

void DispatcherImpl::NextSplitLocked(Iteration& it, Task& t, int64_t epoch,
                                     proto::GetSplitResponse* resp) {
  SplitProvider& p = *it.splits;
  resp->set_epoch_had_splits(p.positions > 0);
  if (epoch < p.done_below) {
    resp->set_end_of_splits(true);
    return;
  }
  Epoch& e = p.epochs[epoch];
  int64_t id = 0;
  if (!e.queue.empty()) {
    id = e.queue.front();
    e.queue.pop_front();
  } else if (e.next_position < p.positions) {
    id = next_id_++;
    OpenSplit o;
    o.def.set_split_id(id);
    o.def.set_epoch(epoch);
    const int64_t begin = e.next_position;
    const int64_t end = p.files.empty() ? std::min(p.positions, begin + p.split_elements)
                                        : begin + 1;
    if (p.files.empty()) {
      o.def.set_begin(begin);
      o.def.set_end(end);
    } else {
      o.def.set_begin(0);
      o.def.set_end(1);
      o.def.set_file(p.files[begin]);
    }
    e.next_position = end;
    ++e.open;
    ++stats_.splits_created;
    p.open.emplace(id, std::move(o));
  } else if (e.open == 0) {
    resp->set_end_of_splits(true);
    return;
  } else {
    resp->set_not_ready(true);  // others hold the rest: one may be lost
    return;
  }
  OpenSplit& o = p.open.at(id);
  o.holder_task = t.id;
  t.held_splits.insert(id);
  *resp->mutable_split() = o.def;
}

absl::Status DispatcherImpl::GetSplit(const proto::GetSplitRequest& req,
                                      proto::GetSplitResponse* resp) {
  const absl::Time deadline = clock_() + absl::Milliseconds(std::max<int64_t>(0, req.wait_ms()));
  absl::MutexLock l(&mu_);
  while (true) {
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
    for (int64_t id : req.completed_splits()) CompleteSplitLocked(it, task, id);
    if (req.report_only()) return absl::OkStatus();
    if (task.lost) {
      // Its splits went to other workers; handing it more would strand them.
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: task ", task.id, " on worker ", task.worker,
          " was declared lost (no heartbeat for ", config_.worker_timeout_ms,
          " ms); its splits were reassigned"));
    }
    resp->Clear();
    NextSplitLocked(it, task, req.epoch(), resp);
    if (!resp->not_ready() || shutdown_ || clock_() >= deadline) return absl::OkStatus();
    // Wait for a change to the splits (a completion, a reassignment).
    const int64_t iteration_id = it.id, seen = it.split_version;
    auto changed = [this, iteration_id, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto i = iterations_.find(iteration_id);
      return shutdown_ || i == iterations_.end() || i->second.split_version != seen;
    };
    mu_.AwaitWithTimeout(absl::Condition(&changed), deadline - clock_());
    if (!changed()) return absl::OkStatus();  // still not ready
  }
}

// ---- introspection ------------------------------------------------------------------

absl::Status DispatcherImpl::GetWorkers(const proto::GetWorkersRequest& req,
                                        proto::GetWorkersResponse* resp) {
  absl::MutexLock l(&mu_);
  for (const auto& [addr, w] : workers_) {
    auto* info = resp->add_workers();
    info->set_address(addr);
    info->set_transfer_address(w.transfer_address);
    info->set_transfer_protocol(w.protocol);
    info->set_num_tasks(static_cast<int64_t>(w.tasks.size()));
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::GetDataServiceMetadata(
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

absl::Status DispatcherImpl::GetDataServiceConfig(const proto::GetDataServiceConfigRequest& req,
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
    if (w.waiting > 0) continue;  // inside a long poll: alive now
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
