#include "sluice/control/request_checks.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "sluice/control/coordinated_rounds.h"
#include "sluice/control/split_provider.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

absl::Status CheckRegisterDataset(const proto::RegisterDatasetRequest& req) {
  if (req.dataset().version() != 1 || !req.dataset().has_root() ||
      req.dataset().root().op_case() == proto::DatasetNode::OP_NOT_SET) {
    return absl::InvalidArgumentError(
        "RegisterDataset: the dataset definition is empty or of an unsupported version");
  }
  const std::string& id = req.dataset_id();
  constexpr size_t kMaxDatasetIdBytes = 128;
  const bool ok_chars = std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (id.size() > kMaxDatasetIdBytes || !ok_chars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterDataset: dataset id '", absl::CHexEscape(id.substr(0, kMaxDatasetIdBytes)),
        "' must be 1-", kMaxDatasetIdBytes, " characters of [A-Za-z0-9._-]"));
  }
  // Journaled, it must parse again when the dispatcher restarts.
  return CheckWireDepth(req.dataset(), "RegisterDataset");
}

absl::StatusOr<std::string> ResolveDatasetId(const DispatcherState& state,
                                             const proto::RegisterDatasetRequest& req,
                                             uint64_t fp, bool* known) {
  const bool named = !req.dataset_id().empty();
  for (int suffix = 0;; ++suffix) {
    const std::string id = named ? req.dataset_id()
                                 : absl::StrCat("ds-", absl::Hex(fp, absl::kZeroPad16),
                                                suffix ? absl::StrCat("-", suffix) : "");
    auto it = state.datasets().find(id);
    *known = it != state.datasets().end();
    if (!*known || CanonicalBytes(it->second.def) == CanonicalBytes(req.dataset())) return id;
    if (named) {
      return absl::AlreadyExistsError(absl::StrCat(
          "RegisterDataset: dataset id '", id,
          "' is registered with a different definition; choose another id"));
    }
  }
}

absl::StatusOr<std::optional<proto::RegisterWorkerUpdate>> ResolveRegistration(
    const DispatcherState& state, const proto::WorkerHeartbeatRequest& req) {
  const std::string& addr = req.worker_address();
  proto::RegisterWorkerUpdate u;
  u.set_address(addr);
  u.set_transfer_address(req.transfer_address().empty() ? addr : req.transfer_address());
  u.set_transfer_protocol(req.transfer_protocol().empty() ? "grpc" : req.transfer_protocol());
  u.set_host_id(req.host_id());
  auto known = state.workers().find(addr);
  if (known != state.workers().end()) {
    const DispatcherState::Worker& w = known->second;
    const bool moved =
        (!req.transfer_address().empty() && w.transfer_address != u.transfer_address()) ||
        (!req.transfer_protocol().empty() && w.protocol != u.transfer_protocol()) ||
        (!req.host_id().empty() && w.host_id != req.host_id());
    if (!moved) return std::nullopt;
    u.set_index(w.index);
    if (req.host_id().empty()) u.set_host_id(w.host_id);
    return u;
  }
  u.set_index(state.next_worker_index());
  if (state.shard_claims().size() > 0) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t index,
                            state.shard_claims().Find(addr, [&state](const std::string& a) {
                              return state.workers().count(a) > 0;
                            }));
    u.set_index(index);
  }
  return u;
}

absl::Status CheckRegistration(
    const proto::WorkerHeartbeatRequest& req,
    const std::function<absl::Status(const proto::WorkerHeartbeatRequest&)>& probe) {
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
  const absl::Status reachable = probe ? probe(req) : absl::OkStatus();
  if (!reachable.ok()) {
    spdlog::warn("dispatcher: refused to register worker {}: {}", req.worker_address(),
                 std::string(reachable.message()));
    return absl::FailedPreconditionError(absl::StrCat(
        "the dispatcher cannot reach worker ", req.worker_address(), ": ", reachable.message(),
        "; it registers only once its addresses answer (check --worker_address, "
        "--data_transfer_address and firewalls)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const DispatcherState::Dataset*> FindDataset(const DispatcherState& state,
                                                            const std::string& id) {
  auto it = state.datasets().find(id);
  if (it == state.datasets().end()) {
    return absl::NotFoundError(absl::StrCat("dataset '", id, "' is not registered"));
  }
  return &it->second;
}

absl::Status CheckWorkerUpdate(const DispatcherState& state,
                               const proto::WorkerUpdateRequest& req) {
  if (!state.workers().count(req.worker_address())) {
    return absl::NotFoundError(absl::StrCat("WorkerUpdate: worker '",
                                            absl::CHexEscape(req.worker_address().substr(0, 256)),
                                            "' is not registered"));
  }
  for (const auto& u : req.updates()) {
    auto t = state.tasks().find(u.task_id());
    if (t == state.tasks().end()) {
      return absl::NotFoundError(absl::StrCat("WorkerUpdate: task ", u.task_id(),
                                              " does not exist (collected, or never created)"));
    }
    if (t->second.worker != req.worker_address()) {
      return absl::FailedPreconditionError(absl::StrCat("WorkerUpdate: task ", u.task_id(),
                                                        " belongs to worker ", t->second.worker,
                                                        ", not ", req.worker_address()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const DispatcherState::Task*> CheckGetSplit(const DispatcherState& state,
                                                           const proto::GetSplitRequest& req) {
  auto t = state.tasks().find(req.task_id());
  if (t == state.tasks().end()) {
    return absl::NotFoundError(
        absl::StrCat("GetSplit: task ", req.task_id(), " does not exist (collected)"));
  }
  const DispatcherState::Task& task = t->second;
  if (task.worker != req.worker_address()) {
    return absl::FailedPreconditionError(absl::StrCat("GetSplit: task ", task.id,
                                                      " belongs to worker ", task.worker,
                                                      ", not ", req.worker_address()));
  }
  if (state.iterations().at(task.iteration_id).splits == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GetSplit: iteration ", task.iteration_id, " is not distributed_epoch (or was collected)"));
  }
  return &task;
}

absl::Status CheckJobRequest(const proto::GetOrCreateJobRequest& req, int64_t num_shards) {
  if (!proto::ProcessingMode_IsValid(req.processing_mode()) ||
      req.processing_mode() == proto::PROCESSING_MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError("GetOrCreateJob: processing_mode is unspecified or unknown");
  }
  const bool sharding = StaticShardingOf(req.processing_mode()).has_value();
  if (sharding && num_shards == 0) {
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
  return absl::OkStatus();
}

absl::Status CheckSameJob(const DispatcherState::Job& job,
                          const proto::GetOrCreateJobRequest& req) {
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
        "job '", job.name, "' exists with target_workers=", TargetWorkersName(job.target_workers),
        "; requested ", TargetWorkersName(req.target_workers()),
        " (a job's consumers all use the same)"));
  }
  return absl::OkStatus();
}

absl::Status CheckJobDataset(const proto::DatasetDef& def, const proto::GetOrCreateJobRequest& req,
                             int64_t num_shards) {
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
  const std::optional<StaticSharding> sharding = StaticShardingOf(req.processing_mode());
  if (sharding) {
    // Workers apply the same rewrite; checking it here turns a pipeline
    // that cannot be sharded into an error for the client at once.
    auto sharded = ApplyStaticSharding(def, *sharding, num_shards, 0);
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
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> FindNamedJob(const DispatcherState& state,
                                                    const proto::GetOrCreateJobRequest& req) {
  if (req.job_name().empty()) return std::optional<int64_t>();
  auto named = state.job_by_name().find(req.job_name());
  if (named == state.job_by_name().end()) return std::optional<int64_t>();
  const DispatcherState::Job& job = state.jobs().at(named->second);
  SLUICE_RETURN_IF_ERROR(CheckSameJob(job, req));
  return std::optional<int64_t>(job.id);
}

absl::StatusOr<proto::CreateJobUpdate> ResolveJob(const proto::DatasetDef& def,
                                                  const proto::GetOrCreateJobRequest& req,
                                                  int64_t num_shards) {
  SLUICE_RETURN_IF_ERROR(CheckJobDataset(def, req, num_shards));
  proto::CreateJobUpdate job;
  if (req.processing_mode() == proto::DISTRIBUTED_EPOCH) {
    SLUICE_ASSIGN_OR_RETURN(SplitSourceInfo source, FindSplitSource(def.root()));
    *job.mutable_split_source() = *source.source;
    job.set_split_tracked(source.tracked);
  }
  job.set_dataset_id(req.dataset_id());
  job.set_processing_mode(req.processing_mode());
  job.set_job_name(req.job_name());
  job.set_num_consumers(req.num_consumers());
  job.set_target_workers(req.target_workers());
  return job;
}

absl::Status CheckIterationRequest(const DispatcherState& state,
                                   const proto::GetOrCreateIterationRequest& req) {
  if (req.repetition() < 0) {
    return absl::InvalidArgumentError("GetOrCreateIteration: repetition must be >= 0");
  }
  auto found = state.jobs().find(req.job_id());
  if (found == state.jobs().end()) {
    return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " does not exist"));
  }
  const DispatcherState::Job& job = found->second;
  if (job.num_consumers > 0 &&
      (req.consumer_index() < 0 || req.consumer_index() >= job.num_consumers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetOrCreateIteration: consumer_index ", req.consumer_index(), " is not in [0, ",
        job.num_consumers, ") for job '", job.name, "'"));
  }
  if (req.has_resume() && job.num_consumers > 0) {
    SLUICE_RETURN_IF_ERROR(CoordinatedRounds::CheckResume(req.resume(), job.num_consumers));
  } else if (req.has_resume() && job.mode != proto::DISTRIBUTED_EPOCH) {
    return absl::InvalidArgumentError(
        "GetOrCreateIteration: only a distributed_epoch or coordinated-reads iteration "
        "resumes from a service checkpoint");
  }
  if (job.target_workers != proto::TARGET_WORKERS_LOCAL) return absl::OkStatus();
  // As tf.data, a consumer reading only local workers needs one.
  std::set<std::string> hosts;
  for (const auto& [addr, w] : state.workers()) hosts.insert(w.host_id);
  if (req.host_id().empty() || !hosts.count(req.host_id())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_workers=LOCAL reads only the workers on this consumer's host '",
        absl::CHexEscape(req.host_id().substr(0, 256)),
        "', but no worker is registered from it (workers' hosts: [", absl::StrJoin(hosts, ", "),
        "]); start a worker on this host, or set SLUICE_HOST_ID to name the same host in "
        "both processes"));
  }
  return absl::OkStatus();
}

absl::Status CheckJoin(const DispatcherState::Job& job, const DispatcherState::Iteration& it,
                       const proto::GetOrCreateIterationRequest& req, int64_t job_gc_timeout_ms) {
  if (it.collected && !it.finished) {
    return absl::FailedPreconditionError(absl::StrCat(
        "iteration ", req.repetition(), " of job '", job.name,
        "' was garbage-collected after no client read it for ", job_gc_timeout_ms, " ms"));
  }
  if (job.num_consumers > 0 && it.consumer_clients.count(req.consumer_index())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "consumer_index ", req.consumer_index(), " of job '", job.name,
        "' is already reading iteration ", req.repetition(),
        "; every consumer needs its own index"));
  }
  if (req.has_resume() && job.num_consumers > 0 && req.resume().round() != it.first_round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.name, "' already has iteration ", req.repetition(), ", started at round ",
        it.first_round, "; this consumer's checkpoint is at round ", req.resume().round(),
        ": every consumer must restore checkpoints of the same training step (merge them)"));
  }
  if (req.has_resume() && job.num_consumers == 0 &&
      (it.splits == nullptr || !it.splits->ResumesFrom(req.resume()))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.name, "' already has iteration ", req.repetition(),
        ", not created from this checkpoint: resume into a job that does not exist yet (a "
        "new job_name), with every consumer restoring the same merged checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace sluice::internal
