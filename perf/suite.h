// The suites of sluice-perf (transport.cc, pipeline.cc, engine.cc, images.cc) and what they
// share: locating the binaries, the transports under test, running one
// measuring client in a child process, and finishing a report.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "perf/child_process.h"
#include "perf/cluster.h"
#include "perf/measure.h"
#include "perf/report.h"

namespace sluice::perf {

inline constexpr double kGB = 1e9;  // GB/s here are 1e9 bytes per second

// This executable (the measuring clients are re-executions of it), and its
// directory.
std::string SelfPath();
std::string SelfDir();
// `flag` when set (NotFound naming flag_name when it does not exist), else
// the first of `candidates` that exists; NotFound listing them otherwise.
absl::StatusOr<std::string> Locate(const std::string& what, const std::string& flag_name,
                                   const std::string& flag,
                                   const std::vector<std::string>& candidates);

struct Binaries {
  std::string worker;  // sluice-worker
  std::string plugin;  // libsluice_perf_plugin.so
};
// The flags when set, else next to sluice-perf, the build tree or an installed lib/.
absl::StatusOr<Binaries> LocateBinaries(const std::string& worker_flag,
                                        const std::string& plugin_flag);
// sluice-dispatcher: `flag` (--dispatcher_binary) when set, else next to
// sluice-perf or in the build tree.
absl::StatusOr<std::string> LocateDispatcherBinary(const std::string& flag);
// libsluice_perf_slow_sync.so (perf/slow_sync.cc): next to sluice-perf, installed,
// or in the build tree.
absl::StatusOr<std::string> LocateSlowSyncLibrary();

// The directory holding the `sluice` Python package (the PYTHONPATH of a
// Python child): `flag` when set, else an installed
// <prefix>/lib/python3/dist-packages beside sluice-perf's bin/, else the build
// tree's <build>/python (when it was configured with SLUICE_BUILD_PYTHON).
// NotFound naming the places looked at otherwise.
absl::StatusOr<std::string> LocatePythonPackageDir(const std::string& flag);
// A script of perf/ (`name`): `flag` when set, else next to sluice-perf, in
// an installed share/sluice/, or in the source tree (`source_path`).
absl::StatusOr<std::string> LocatePerfScript(const std::string& name, const std::string& flag_name,
                                             const std::string& flag,
                                             const std::string& source_path);

// Options every suite takes.
struct CommonArgs {
  bool quick = false;
  std::string json_path;
  std::string plot_path;
  std::string worker_binary;
  std::string plugin;
  int64_t task_buffer_elements = 16;
  int64_t worker_threads = 0;  // the workers' --worker_threads (0: they size their pools)
  bool keep_logs = false;
};

// A transport under test: a name, the data-transfer protocol, UCX_TLS.
struct TransportSpec {
  std::string name;
  std::string protocol;
  std::string ucx_tls;  // empty: not set (grpc)
};
inline constexpr char kDefaultShmTls[] = "posix,cma,self,tcp";
// "ucx-tcp", "ucx-shm" (UCX_TLS = shm_tls) or "grpc".
absl::StatusOr<TransportSpec> ParseTransport(const std::string& name, const std::string& shm_tls);
// The environment of the workers and clients of `t`.
std::vector<std::pair<std::string, std::string>> ChildEnv(const TransportSpec& t);

// The service for `t` with `workers` worker processes, logs under `scratch`.
ClusterOptions ClusterFor(const Binaries& bin, const CommonArgs& common, const TransportSpec& t,
                          int workers, const ScratchDir& scratch, std::string name);

// Runs `sluice-perf client` in a child process with `t`'s environment and
// returns the record it wrote; the error carries the child's log.
absl::StatusOr<Record> RunClientChild(const ClientOptions& o, const TransportSpec& t,
                                      const ScratchDir& scratch, const std::string& name,
                                      double timeout_s);

// Runs this executable with `args` (an internal subcommand that writes its
// Record to `out`) in a child process logging to `name`.log under
// `scratch`, and returns the record; the error carries the child's log.
absl::StatusOr<Record> RunRecordChild(const std::vector<std::string>& args,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      const std::string& out, const ScratchDir& scratch,
                                      const std::string& name, double timeout_s);

absl::Status WriteFile(const std::string& path, const std::string& text);

// Process accounting from /proc. CPU: utime + stime of every thread, seconds
// (SelfCpuSeconds: getrusage of this process). Peak (VmHWM) and current
// (VmRSS) resident set of `pid` ("self" for this process), bytes. Bytes the
// process caused to be written to storage (/proc/<pid>/io write_bytes).
double SelfCpuSeconds();
absl::StatusOr<double> ProcCpuSeconds(int pid);
absl::StatusOr<int64_t> ProcPeakRss(const std::string& pid);
absl::StatusOr<int64_t> ProcRss(const std::string& pid);
absl::StatusOr<int64_t> ProcWriteBytes(int pid);
// A flat one-line JSON object ({"k": 1.5, "s": "word", ...}, as the Python
// children print) as a Record: numbers and strings as their text, true/false
// as 1/0, null as "nan". Nested values are skipped. Empty if not an object.
Record ParseJsonRecord(const std::string& line);
// "INTERNAL: message" on one line, shortened.
std::string OneLine(const absl::Status& s);

// Table cells: numbers, counts (12.3k), percentages, ratios ("-" when not finite).
std::string Num(double v, int precision = 3);
std::string Count(double v);
std::string Pct(double ratio);
std::string Times(double ratio);

// The end of a suite: prints the notes, writes --json (the header fields,
// `fields` as raw JSON values, `sections` as arrays of one-line objects, the
// notes), and fails naming the kept scratch directory if anything failed.
struct Report {
  std::string mode;
  std::string command;
  MachineInfo machine;
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<std::pair<std::string, std::vector<std::string>>> sections;
  std::vector<std::string> notes;
};
absl::Status FinishRun(const CommonArgs& common, const Report& report, bool any_failed,
                       ScratchDir& scratch);

struct TransportArgs {
  CommonArgs common;
  std::vector<std::string> sizes;  // empty: by mode
  std::vector<std::string> transports = {"ucx-tcp", "ucx-shm", "grpc"};
  std::string shm_tls = kDefaultShmTls;
  int workers = 1;
  int64_t max_outstanding = 8;
  double seconds = 0;             // 0: by mode
  int64_t max_elements = 0;       // 0: by mode
  int64_t max_bytes = 0;          // 0: enough for --seconds (see transport.cc)
  int64_t latency_elements = -1;  // -1: by mode
  bool no_ceilings = false;
  std::string ucx_perftest;       // empty: from PATH
  // The python rows (perf/python_client.py: sluice from Python over each
  // UCX transport) and the torch DataLoader rows (perf/torch_transport.py).
  bool no_python = false;
  std::string python = "/usr/bin/python3";  // Debian's, with numpy (and python3-torch)
  std::string python_path;        // empty: LocatePythonPackageDir
  std::string python_client;      // empty: python_client.py located as LocatePerfScript
  std::string torch_script;       // empty: torch_transport.py likewise
  int torch_workers = 2;          // DataLoader num_workers
};
absl::Status RunTransport(const TransportArgs& args, const std::string& command);

// `compression` (perf/compression.cc): codecs x payload kinds x transports.
struct CompressionArgs {
  CommonArgs common;
  int64_t size = 0;  // element bytes; 0: 1 MiB
  double seconds = 0;  // timed pass per row; 0: 0.5 quick, 2
  std::vector<std::string> transports = {"grpc", "ucx-tcp"};
  std::vector<std::string> workloads = {"ints", "text", "noise"};
  std::vector<std::string> codecs = {"none", "lz4", "zstd"};
};
absl::Status RunCompression(const CompressionArgs& args, const std::string& command);

// `files` (perf/files.cc): distributed_epoch over a corpus of many small
// files, against the same pipeline locally, with the dispatcher's splits,
// CPU and journal bytes per epoch.
struct FilesArgs {
  CommonArgs common;
  std::string corpus;       // empty: cached under $TMPDIR by its sizes
  int64_t files = 0;        // 0: 200,000 (20,000 quick)
  int64_t file_bytes = 4096;
  int64_t classes = 100;
  int workers = 2;
  std::vector<int64_t> file_split_files = {0, 1};  // the dispatcher's, one row each
  int epochs = 0;           // 0: 2
  std::string transport = "ucx-tcp";
  std::string shm_tls = kDefaultShmTls;
  int64_t max_outstanding = 8;
  std::string dispatcher_binary;  // empty: next to sluice-perf or in the build tree
};
absl::Status RunFiles(const FilesArgs& args, const std::string& command);

// `checkpoint` (perf/checkpoint.cc): a distributed_epoch consumer's
// Save() time and checkpoint bytes over an ImageNet-sized split table, and
// its restore beside a fresh iterator.
struct CheckpointArgs {
  CommonArgs common;
  int64_t elements = 0;         // 0: 1.28 M (128 k quick)
  int64_t split_elements = 256;  // the dispatcher's --range_split_elements
  int workers = 2;
  int saves = 20;               // Save() calls timed at each point
  std::string transport = "ucx-tcp";
  std::string shm_tls = kDefaultShmTls;
  int64_t max_outstanding = 8;
  std::string dispatcher_binary;  // empty: next to sluice-perf or in the build tree
};
absl::Status RunCheckpoint(const CheckpointArgs& args, const std::string& command);

// One row of `files`, in a child process (`sluice-perf files-client`):
// `epochs` epochs of the pipeline, locally (service empty) or through
// Distribute (distributed_epoch), each checked to be the corpus exactly.
struct FilesClientOptions {
  std::string corpus;
  int64_t files = 0;
  int64_t file_bytes = 0;
  int epochs = 2;
  std::string service;  // empty: local
  std::string protocol = "ucx";
  int64_t max_outstanding = 8;
};
// epoch<E>_s for each epoch, files_per_epoch, cpu_s (this process, all epochs).
absl::StatusOr<Record> RunFilesClient(const FilesClientOptions& options);

struct DispatcherArgs {
  CommonArgs common;
  std::string dispatcher_binary;  // empty: next to sluice-perf or in the build tree
  int workers = 0;                // 0: by mode (2000; 200 quick)
  int consumers = 0;              // likewise
  int jobs = 0;                   // 0: by mode (200; 20 quick)
  double splits_per_worker_s = 1;
  int connections = 64;           // gRPC connections the simulated fleet shares
  int map_ops = 0;                // Maps in each job's dataset definition
  double seconds = 0;             // fleet measurement (0: 60 s; 10 quick)
  double rate_seconds = 0;        // each calls/s row (0: 5 s; 2 quick)
  std::vector<int> callers = {1, 64};
  bool no_rates = false;
  bool no_fleet = false;
  // > 0: every journal sync of the dispatcher (and of --dispatcher_binary)
  // takes this much longer, as on a slower disk (perf/slow_sync.cc).
  int64_t journal_sync_delay_us = 0;
};
absl::Status RunDispatcher(const DispatcherArgs& args, const std::string& command);

struct PipelineArgs {
  CommonArgs common;
  std::vector<int> workers;              // empty: by mode
  std::vector<int64_t> max_outstanding;  // empty: 1, 4, 16
  double work_us = 1000;
  double seconds = 0;  // 0: by mode
  std::string transport = "ucx-tcp";
  std::string shm_tls = kDefaultShmTls;
};
absl::Status RunPipeline(const PipelineArgs& args, const std::string& command);

struct EngineArgs {
  CommonArgs common;
  std::vector<std::string> transports;  // empty: by mode (ucx-shm; full: ucx-shm, ucx-tcp)
  std::string shm_tls = kDefaultShmTls;
  int workers = 2;
  double work_us = 1000;  // perf_burn per call in the Map rows
  double seconds = 0;     // 0: by mode
};
absl::Status RunEngine(const EngineArgs& args, const std::string& command);

struct ImagesArgs {
  CommonArgs common;
  std::string corpus;          // empty: a cached corpus under $TMPDIR
  int64_t images = 0;          // 0: by mode (128 quick, 1024 full)
  int64_t classes = 0;         // 0: by corpus size
  std::vector<int> workers = {1, 2};
  std::vector<int> torch_workers = {0, 2};
  int64_t batch = 64;
  uint64_t seed = 42;
  double seconds = -1;         // timed passes last at least this long; -1: by mode (1 quick, 3)
  std::string transport = "ucx-shm";
  std::string shm_tls = kDefaultShmTls;
  int64_t max_outstanding = 4;
  std::string python = "/usr/bin/python3";
  std::string torch_script;    // empty: torch_images.py next to sluice-perf or in the source tree
  std::string corpus_tool;     // empty: sluice-make-jpeg-corpus next to sluice-perf or in the build
  // "folder" (ImageFolder over the JPEG files) or "webdataset" (the same
  // images in tar shards made by sluice-make-webdataset; the torch rows
  // stream them with tarfile, as the webdataset library does).
  std::string format = "folder";
  int64_t samples_per_shard = 0;  // 0: a sixteenth of the corpus (16 shards)
  std::string webdataset_tool;    // empty: sluice-make-webdataset next to sluice-perf or in the build
};
absl::Status RunImages(const ImagesArgs& args, const std::string& command);

// One sluice row of `images`, run in a child process (`sluice-perf
// images-client`): a warm-up pass, then timed passes over the corpus (whole
// passes, at least one, until min_seconds), in this process (service empty)
// or through Distribute.
struct ImagesClientOptions {
  std::string corpus;
  int64_t batch = 64;
  uint64_t seed = 42;
  std::string service;         // empty: local
  std::string protocol = "ucx";
  int64_t max_outstanding = 4;
  std::vector<int> worker_pids;  // their CPU and peak RSS are added to the record
  double min_seconds = 0;
  // Batches stay uint8 through Distribute; the client normalizes them.
  bool normalize_on_client = false;
  // Non-empty: read the WebDataset shards DIR/shard-*.tar (jpg, cls)
  // instead of the folder `corpus`.
  std::string webdataset;
};
// images, batches, passes, seconds, cpu_s (this process + worker_pids, timed pass),
// client_cpu_s, workers_cpu_s, peak_rss_bytes (VmHWM summed), client_rss_bytes,
// workers_rss_bytes, thread_pool_threads.
absl::StatusOr<Record> RunImagesClient(const ImagesClientOptions& options);

}  // namespace sluice::perf
