// The checks a dispatcher request passes before it changes anything: what
// its fields must say, alone and together, and whether it fits the jobs,
// iterations and workers that exist. Pure functions of the request, the
// dispatcher's configuration and its (const) state; DispatcherImpl calls
// them holding its mutex where they read the state. Each error names the
// field and the fix. Internal to control/.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/journal.pb.h"
#include "dataset/dataset.pb.h"
#include "rpc/service.pb.h"
#include "sluice/control/dispatcher_state.h"

namespace sluice::internal {

// RegisterDataset: a version-1 definition with a root op, no deeper than
// its journal record can carry (CheckWireDepth), and a caller-chosen id
// (if any) of 1-128 bytes of [A-Za-z0-9._-].
absl::Status CheckRegisterDataset(const proto::RegisterDatasetRequest& req);
// The registered dataset `id`, or NotFound naming it.
absl::StatusOr<const DispatcherState::Dataset*> FindDataset(const DispatcherState& state,
                                                            const std::string& id);
// RegisterDataset's id: the caller's, or "ds-" and the definition's
// fingerprint `fp` (identical definitions share it; a collision between
// different definitions gets a suffixed id). `*known`: a dataset of that
// id and this definition exists. AlreadyExists when the caller's id is
// registered with another definition.
absl::StatusOr<std::string> ResolveDatasetId(const DispatcherState& state,
                                             const proto::RegisterDatasetRequest& req,
                                             uint64_t fp, bool* known);
// WorkerHeartbeat: the RegisterWorkerUpdate it makes, or nullopt when the
// worker is registered with these addresses and host (a field the request
// leaves empty keeps what is recorded). Its transfer address defaults to
// its worker address, its protocol to grpc. A new worker's index is the
// next one, or under static sharding the worker_addresses entry it takes
// (FailedPrecondition when none is free); a known one keeps its own.
absl::StatusOr<std::optional<proto::RegisterWorkerUpdate>> ResolveRegistration(
    const DispatcherState& state, const proto::WorkerHeartbeatRequest& req);
// A registering worker: its addresses are dialable host:port, its transfer
// protocol a name (the dispatcher relays it to clients, which know the
// protocols), and its addresses answer `probe` (FailedPrecondition; empty:
// unchecked). A worker that registered at an address where nothing
// listens would hold every pipeline it is given until it timed out.
absl::Status CheckRegistration(
    const proto::WorkerHeartbeatRequest& req,
    const std::function<absl::Status(const proto::WorkerHeartbeatRequest&)>& probe);
// WorkerUpdate: the worker is registered and every task named is its own.
absl::Status CheckWorkerUpdate(const DispatcherState& state,
                               const proto::WorkerUpdateRequest& req);
// GetSplit: the task exists, is the worker's and reads a distributed_epoch
// iteration. Returns it.
absl::StatusOr<const DispatcherState::Task*> CheckGetSplit(const DispatcherState& state,
                                                           const proto::GetSplitRequest& req);
// GetOrCreateJob, alone: a known processing mode and target, and the
// combinations that work (static sharding needs worker_addresses, of which
// there are `num_shards`; coordinated reads a job name, non-local workers
// and no distributed_epoch; LOCAL no static sharding).
absl::Status CheckJobRequest(const proto::GetOrCreateJobRequest& req, int64_t num_shards);
// GetOrCreateJob: the id of the job it names when that exists, and asks
// for it as it is (CheckSameJob); nullopt when it names none that exists.
absl::StatusOr<std::optional<int64_t>> FindNamedJob(const DispatcherState& state,
                                                    const proto::GetOrCreateJobRequest& req);
// GetOrCreateJob naming a job that exists: it must ask for it as it is.
absl::Status CheckSameJob(const DispatcherState::Job& job, const proto::GetOrCreateJobRequest& req);
// A new job's pipeline `def`: coordinated reads need it infinite, static
// sharding needs it shardable (checked as the workers will rewrite it,
// when it can be here), and a shard hint needs processing_mode=hint.
absl::Status CheckJobDataset(const proto::DatasetDef& def, const proto::GetOrCreateJobRequest& req,
                             int64_t num_shards);
// The new job `req` asks for over `def`, once CheckJobDataset passed: its
// parameters and, for distributed_epoch, its split source (all but its id).
// Builds and analyses the pipeline: call without the dispatcher's lock.
absl::StatusOr<proto::CreateJobUpdate> ResolveJob(const proto::DatasetDef& def,
                                                  const proto::GetOrCreateJobRequest& req,
                                                  int64_t num_shards);
// GetOrCreateIteration: a repetition >= 0 of a job that exists, a
// consumer_index in [0, num_consumers) under coordinated reads, a service
// checkpoint to resume from only for distributed_epoch or coordinated reads
// (and a valid one for the latter), and, under target_workers=LOCAL, a
// worker registered from the consumer's host.
absl::Status CheckIterationRequest(const DispatcherState& state,
                                   const proto::GetOrCreateIterationRequest& req);
// GetOrCreateIteration joining iteration `it` that exists: not collected
// before it finished (after `job_gc_timeout_ms` without clients), no
// other client reads it as the same consumer, and a consumer resuming from a
// checkpoint joins only the iteration made from that checkpoint (the same
// round under coordinated reads, the same splits under distributed_epoch).
absl::Status CheckJoin(const DispatcherState::Job& job, const DispatcherState::Iteration& it,
                       const proto::GetOrCreateIterationRequest& req, int64_t job_gc_timeout_ms);

}  // namespace sluice::internal
