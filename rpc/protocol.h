// What the dispatcher, its workers and its clients agree on beyond the
// messages of rpc/service.proto: the names of processing modes and of
// target_workers, how a process names its host, which static sharding a
// mode implies, and how long a long poll may be held.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dataset/dataset.pb.h"
#include "rpc/service.pb.h"
#include "sluice/dataset/dataset_internal.h"

namespace sluice::internal {

// The dispatcher holds a long poll at most this fraction of the caller's
// timeout (worker_timeout_ms / client_timeout_ms), so a caller's liveness
// never lapses while its poll waits.
inline constexpr int64_t kLongPollTimeoutFraction = 3;

// processing_mode names <-> enum: parallel_epochs (alias off),
// distributed_epoch (alias dynamic), file, data, file_or_data, hint.
absl::StatusOr<proto::ProcessingMode> ParseProcessingMode(const std::string& name);
std::string ProcessingModeName(proto::ProcessingMode mode);
// target_workers names <-> enum, case-insensitive as tf.data's: "AUTO"
// (also ""), "ANY", "LOCAL".
absl::StatusOr<proto::TargetWorkers> ParseTargetWorkers(const std::string& name);
std::string TargetWorkersName(proto::TargetWorkers target);
// This process's host id (TargetWorkers): $SLUICE_HOST_ID when set and not
// empty, else gethostname().
std::string LocalHostId();
// The static sharding policy of a mode; nullopt for the epoch modes.
std::optional<StaticSharding> StaticShardingOf(proto::ProcessingMode mode);

// How deep a dataset definition may nest and still cross the service.
// Protobuf parses at most 100 nested messages (gRPC's parser and the
// journal's use that default), and the deepest place a definition travels
// is a journal record (JournalRecord > JournalUpdate >
// RegisterDatasetUpdate > DatasetDef). A chained op nests two levels, so
// about 45 chained ops, or one expression about 90 operations deep.
inline constexpr int kMaxWireDatasetDepth = 100 - 3;
// InvalidArgument, naming `what` and the limit, when `def` nests deeper
// than kMaxWireDatasetDepth (the service would refuse it with an empty
// INTERNAL error from gRPC's parser).
absl::Status CheckWireDepth(const proto::DatasetDef& def, const char* what);

}  // namespace sluice::internal
