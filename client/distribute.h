// Distribute: run the part of a pipeline before it on the service's workers.
//
//   sluice::DistributeOptions opt;
//   opt.service = dispatcher->target();          // "grpc://host:port"
//   opt.processing_mode = "parallel_epochs";
//   opt.job_name = "train";                      // optional: share one job
//   auto ds = sluice::Dataset::Range(5).Map(x * x).Apply(sluice::Distribute(opt)).Map(x + 1);
//   auto it = ds.MakeIterator();                 // a new iteration of the job
//
// The dataset's definition (Dataset::def(), Serialize(), DebugString())
// records what is read: the pipeline before Distribute, the service's
// address and the job (processing_mode, job_name, consumers,
// target_workers, max_outstanding_requests). The client's own settings
// (TLS files, auth token, data plane, placement, timeouts) stay in the
// Dataset value, not in its definition, so the definition holds no secret;
// a definition rebuilt with Dataset::FromDef reads nothing from the service
// (FailedPrecondition when iterated).
//
// Semantics (as tf.data service):
//  - parallel_epochs: every worker produces the whole dataset, so with N
//    workers each element arrives N times (in no particular order).
//  - distributed_epoch: the dispatcher splits the pipeline's one source and
//    workers pull splits, so each element is produced once per epoch; a
//    lost worker's unfinished splits are re-produced by the others and the
//    client drops elements it already delivered (docs/service.md states the
//    exact guarantee).
//  - job_name: every consumer (thread or process) using the name reads the
//    same job; the k-th iterator of each consumer reads the job's k-th
//    iteration and consumers split its elements first-come-first-served,
//    each reply taking at most the consumer's fair share of what its
//    worker has ready (docs/service.md). An iteration already read to the
//    end yields end-of-input at once.
//    Reusing a name with different parameters is InvalidArgument.
//  - no job_name: each iterator is a private, anonymous job.
//  - up to max_outstanding_requests element requests are in flight or
//    buffered, bounding client memory. Over UCX one reply may carry up to
//    256 small elements (256 KiB of frames) that were ready together;
//    larger elements come one per reply (docs/dataplane.md).
//  - order: a task's elements arrive in the order its worker produced them
//    (for a shared job: this consumer's part of them, in that order);
//    different tasks' elements interleave.
//  - a worker lost mid-stream does not hang the iterator: it finishes from
//    the remaining workers, logs what was lost and counts it
//    (DataServiceStats::lost_tasks).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "sluice/rpc/security.h"
#include "sluice/dataset/dataset.h"

namespace sluice {

// One reply (UCX or gRPC) batches at most this many small elements (fewer
// with DistributeOptions::max_elements_per_reply), and at most this many
// bytes of their frames (larger elements travel one per reply).
inline constexpr int64_t kMaxElementsPerReply = 256;
inline constexpr int64_t kMaxBytesPerReply = int64_t{256} << 10;

struct DistributeOptions {
  // "parallel_epochs" (every worker produces the whole dataset),
  // "distributed_epoch" (dynamic sharding: workers pull splits of the
  // source from the dispatcher), or a static sharding policy: "file",
  // "data", "file_or_data", "hint" (worker i of the dispatcher's
  // worker_addresses reads shard i). tf.data's names "off" and "dynamic"
  // are accepted for the first two. docs/service.md has the guarantees.
  std::string processing_mode = "parallel_epochs";
  // The dispatcher: "grpc://host:port" or "host:port".
  std::string service;
  std::string job_name;
  int64_t max_outstanding_requests = 8;
  // Which workers to read, as tf.data's target_workers (case-insensitive):
  // "AUTO" (the default; reads every worker, as "ANY"), "ANY", or "LOCAL":
  // only the workers on this process's host, so elements never cross the
  // network (same-host UCX uses shared memory). A host is named by its host
  // id: $SLUICE_HOST_ID, else gethostname(). Under LOCAL the job's tasks run
  // only on its consumers' hosts; creating an iterator with no worker on
  // this host is InvalidArgument. A job's consumers all use the same value.
  // LOCAL does not combine with coordinated reads or static sharding.
  std::string target_workers = "AUTO";
  // "ucx": elements land in this process's preregistered receive pool
  // without a copy (RDMA / shared memory / TCP, as UCX finds). "grpc": the
  // baseline path. A worker that serves gRPC only is read over gRPC.
  std::string data_transfer_protocol = "ucx";
  // When UCX cannot connect to a worker, read it over gRPC (with a
  // warning) instead of failing.
  bool fallback_to_grpc = true;
  // Placement of this process's UCX receive pool and progress thread (the
  // first iterator that uses UCX decides; see topology/topology.h):
  // "auto" = the NUMA node nearest the NIC UCX uses, or nearest
  // gpu_pci_bus_id when set; "none"; or a node number. cpu_list overrides
  // the cpus ("0-3,8").
  std::string numa_node = "auto";
  std::string cpu_list;
  std::string gpu_pci_bus_id;
  // Coordinated reads (tf.data's, for synchronous training): num_consumers
  // consumers of one job_name, each with its own consumer_index in
  // [0, num_consumers), read in rounds: in every round each consumer gets
  // one element, all from the same worker. Needs job_name, an infinite
  // dataset (Repeat()) and a mode other than distributed_epoch; set both or
  // neither. See docs/service.md.
  std::optional<int64_t> consumer_index;
  std::optional<int64_t> num_consumers;
  // Creating an iterator fails with Unavailable when the dispatcher cannot
  // be reached within this long; an iterator whose dispatcher stays
  // unreachable this long fails the same way.
  int64_t dispatcher_timeout_ms = 10000;
  // TLS to the dispatcher and to workers' gRPC servers: ca_file verifies
  // them (empty: system roots); cert_file/key_file are this client's
  // certificate, needed when the service uses mutual TLS. Empty: plain text.
  TlsConfig tls;
  // The service's shared secret, sent to the dispatcher and to every worker
  // (gRPC metadata and UCX requests). Empty: $SLUICE_AUTH_TOKEN if set,
  // else none. See docs/security.md.
  std::string auth_token;
  // A reply carrying a larger element (or batch) fails the iterator with
  // ResourceExhausted instead of being received.
  int64_t max_element_bytes = kDefaultMaxElementBytes;
  // When Next() has waited this long with no worker to read (none
  // registered, or all lost), the client logs one warning naming the
  // dispatcher. 0: never.
  int64_t stall_warning_ms = 30000;
  // Page-lock this process's receive arenas for CUDA (cudaHostRegister,
  // once per arena; docs/dataplane.md), so that copies of received
  // elements to a GPU run at the link rate: "auto" when the CUDA runtime
  // loads and sees a GPU, "on" (creating an iterator fails with
  // FailedPrecondition otherwise), "off". Process-wide once on. Applies to
  // data planes with receive arenas (ucx); "on" with grpc is
  // InvalidArgument.
  std::string cuda_pinned = "auto";
  // Wire compression of the elements, as tf.data's `compression`
  // (case-insensitive): "AUTO" (the default: what the data plane suits,
  // none over ucx, lz4 over grpc; logged once per process), "none", "lz4"
  // or "zstd". Workers compress each element that shrinks by at least an
  // eighth (incompressible ones, JPEG bytes, travel as they are), and this
  // process decompresses them (over ucx into its receive arenas, as
  // uncompressed elements land; over grpc into memory of its own).
  std::string compression = "AUTO";
  // The most elements one reply may batch, 1 to kMaxElementsPerReply (the
  // default): elements ready together on a worker travel in one reply, up
  // to kMaxBytesPerReply of them. 1 asks for one element per reply, as
  // tf.data service does (the perf suite's gRPC anchor).
  int64_t max_elements_per_reply = kMaxElementsPerReply;
};

// Everything before Distribute runs on the service's workers; the elements
// stream to this process, where later steps run. Each MakeIterator() of the
// result is a new iteration of the job. A transformation for
// Dataset::Apply: `ds.Apply(sluice::Distribute(options))`. Invalid options,
// or a pipeline that already contains a Distribute, give a dataset whose
// status() is InvalidArgument naming the field.
std::function<Dataset(const Dataset&)> Distribute(DistributeOptions options);

// Reads a dataset registered with RegisterDataset (as tf.data's
// from_dataset_id); `processing_mode` and `service` replace those of
// `options`.
Dataset FromDatasetId(const std::string& processing_mode, const std::string& service,
                      const std::string& dataset_id, const DistributeOptions& options);

// Registers `dataset` with the service and returns its id (identical
// definitions get the same id). This form uses plain-text gRPC and
// $SLUICE_AUTH_TOKEN; the second takes the service, TLS, token and timeout
// from `options`, and, when `dataset_id` is set, registers under that id
// (1-128 characters of [A-Za-z0-9._-], as tf.data's
// register_dataset(dataset_id=...)): registering the same definition under
// it again returns it, a different definition is AlreadyExists.
absl::StatusOr<std::string> RegisterDataset(const std::string& service, const Dataset& dataset,
                                            int64_t timeout_ms = 10000);
absl::StatusOr<std::string> RegisterDataset(const Dataset& dataset,
                                            const DistributeOptions& options,
                                            const std::string& dataset_id = "");

// Checkpoints of a job read by several consumers (docs/checkpointing.md):
// each consumer saves its iterator (Iterator::Save) at the same training
// step; this merges those checkpoints into one that every consumer of the
// resumed job restores (Dataset::MakeIterator(checkpoint)), with any
// number of consumers and workers: the resumed distributed_epoch iteration
// yields exactly the elements none of them delivered. The ops after
// Distribute resume from the first checkpoint's position; they must hold
// no elements at the save (save after a whole batch was taken), else
// InvalidArgument names the op. Checkpoints of different pipelines or
// iterations are InvalidArgument.
absl::StatusOr<std::string> MergeCheckpoints(const std::vector<std::string>& checkpoints);

// Process-wide counters of the data-service client.
struct DataServiceStats {
  int64_t elements_received = 0;
  int64_t bytes_received = 0;
  int64_t lost_tasks = 0;         // tasks whose worker was lost before their end
  int64_t worker_errors = 0;      // failed element requests (retried)
  int64_t iterations_started = 0;
  int64_t iterations_released = 0;
  // distributed_epoch: elements of a reassigned split that this process
  // had already delivered, dropped.
  int64_t duplicates_dropped = 0;
  // Coordinated reads: rounds skipped because their worker was lost.
  int64_t rounds_skipped = 0;
};
DataServiceStats GetDataServiceStats();

}  // namespace sluice
