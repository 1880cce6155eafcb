// sluice-perf: the perf suite.
//
//   sluice-perf transport [--quick] [--json out.json] [--plot out.png]
//   sluice-perf pipeline  [--quick] [--json out.json] [--plot out.png]
//   sluice-perf engine    [--quick] [--json out.json]
//   sluice-perf images    [--quick] [--corpus DIR] [--json out.json]
//   sluice-perf dispatcher [--quick] [--workers N] [--consumers N] [--jobs N] [--json out.json]
//   sluice-perf files     [--quick] [--files N] [--file_split_files 0,1] [--json out.json]
//   sluice-perf compression [--quick] [--json out.json]
//   sluice-perf checkpoint [--quick] [--elements N] [--split_elements 256] [--json out.json]
//
// transport: one client pulls pre-built elements (perf_payload) of each size
// from worker processes over ucx (UCX_TLS=tcp), ucx (shared memory) and
// grpc; the same run measures the ceilings (ucx_perftest on the same
// UCX_TLS, single-thread memcpy) and prints each figure as a ratio of its
// ceiling and of the gRPC path.
// pipeline: Distribute throughput of a CPU-bound map (perf_burn) on 1..N
// worker processes and several max_outstanding_requests.
// engine: expressions vs plain loops, Map with num_parallel_calls 1, 2 and
// kAutotune, and fresh vs pre-built 16 MiB elements from worker processes.
// images: the ImageNet-style JPEG pipeline (image.h) locally and through
// Distribute, next to torchvision's DataLoader on the same corpus:
// images/s, CPU per image and peak RSS summed over every process.
//
// files: distributed_epoch over a corpus of many small files (ImageFolder +
// ReadFile) beside the same pipeline locally, with the dispatcher's splits,
// CPU and journal bytes per epoch (files.cc).
// checkpoint: a distributed_epoch consumer's service checkpoint, Save()
// time and bytes over an ImageNet-sized split table, and its restore beside
// a fresh iterator (checkpoint.cc).
// dispatcher: one sluice-dispatcher process (fault-tolerant, journal on
// disk) against a simulated fleet of workers and consumers in this process
// using the real RPCs (dispatcher.cc), and calls/s of the hot RPCs.
//
// Process model. UCX reads UCX_TLS once, when the process creates its UCX
// context, and the client keeps one context per process. So every client
// measurement runs in a child process: sluice-perf re-executes itself as
// `sluice-perf client ...` with UCX_TLS set for that transport, and the
// child writes its figures as key=value lines to a file. That also makes
// getrusage() of the child exactly "the client's CPU" and gives each
// configuration fresh counters. Workers are sluice-worker processes with
// the same UCX_TLS; the dispatcher runs in this process (it uses no UCX).
// Every child is owned by a ChildProcess (killed and reaped on every path,
// and on SIGINT/SIGTERM).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "perf/child_process.h"
#include "perf/measure.h"
#include "perf/suite.h"
#include "sluice/core/logging.h"

namespace sluice::perf {
namespace {

void AddCommonOptions(CLI::App* app, CommonArgs* c) {
  app->add_flag("--quick", c->quick, "fewer configurations and shorter passes (under a minute)");
  app->add_option("--json", c->json_path, "write the results as JSON to this file");
  app->add_option("--plot", c->plot_path, "write a PNG plot here (needs gnuplot)");
  app->add_option("--worker_binary", c->worker_binary,
                  "sluice-worker to start (default: next to sluice-perf or in the build tree)");
  app->add_option("--plugin", c->plugin,
                  "the perf UDF plugin (default: libsluice_perf_plugin.so next to sluice-perf)");
  app->add_option("--task_buffer_elements", c->task_buffer_elements,
                  "workers' --task_buffer_elements")
      ->capture_default_str();
  app->add_option("--worker_threads", c->worker_threads,
                  "workers' --worker_threads (default: workers on one host divide its cpus)");
  app->add_flag("--keep_logs", c->keep_logs, "keep the scratch directory with the children's logs");
}

int Main(int argc, char** argv) {
  CLI::App app{
      "sluice-perf: the sluice perf suite (transport ceilings, pipeline scaling, engine, images)"};
  app.require_subcommand(1);

  TransportArgs ta;
  CLI::App* transport = app.add_subcommand(
      "transport", "pre-built elements of each size over ucx-tcp, ucx-shm and grpc, with ceilings, "
      "from C++ and Python, next to torch's DataLoader");
  AddCommonOptions(transport, &ta.common);
  transport->add_option("--sizes", ta.sizes, "element sizes, e.g. 64,4K,1M (default by mode)")
      ->delimiter(',');
  transport->add_option("--transports", ta.transports, "ucx-tcp, ucx-shm, grpc")
      ->delimiter(',')
      ->capture_default_str();
  transport->add_option("--shm_tls", ta.shm_tls, "UCX_TLS of ucx-shm (tcp is needed to connect)")
      ->capture_default_str();
  transport->add_option("--workers", ta.workers, "worker processes")->capture_default_str();
  transport->add_option("--max_outstanding_requests", ta.max_outstanding,
                        "the client's max_outstanding_requests in the throughput pass")
      ->capture_default_str();
  transport->add_option("--seconds", ta.seconds, "timed pass per row (default 0.8 quick, 3 full)");
  transport->add_option("--max_elements", ta.max_elements, "cap on elements per timed pass");
  transport->add_option("--max_bytes", ta.max_bytes,
                        "cap on payload bytes per timed pass (default: what 32 GB/s moves in "
                        "--seconds, at least 1 GiB quick and 8 GiB full)");
  transport->add_option("--latency_elements", ta.latency_elements,
                        "Next() calls timed in the latency pass (0 skips it)");
  transport->add_flag("--no_ceilings", ta.no_ceilings, "skip ucx_perftest");
  transport->add_option("--ucx_perftest", ta.ucx_perftest, "ucx_perftest binary (default: PATH)");
  transport->add_flag("--no_python", ta.no_python,
                      "skip the python (sluice from Python) and torch DataLoader rows");
  transport->add_option("--python", ta.python, "python with numpy (and torch for the torch rows)")
      ->capture_default_str();
  transport->add_option("--python_path", ta.python_path,
                        "directory holding the sluice Python package (default: the build tree's "
                        "python/ or an installed lib/python3/dist-packages)");
  transport->add_option("--python_client", ta.python_client,
                        "python_client.py (default: next to sluice-perf or in the source tree)");
  transport->add_option("--torch_script", ta.torch_script,
                        "torch_transport.py (default: next to sluice-perf or in the source tree)");
  transport->add_option("--torch_workers", ta.torch_workers, "DataLoader num_workers")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));

  PipelineArgs pa;
  CLI::App* pipeline = app.add_subcommand(
      "pipeline", "Distribute throughput of a CPU-bound map on 1..N worker processes");
  AddCommonOptions(pipeline, &pa.common);
  pipeline->add_option("--workers", pa.workers, "worker counts, e.g. 1,2,4 (default by mode)")
      ->delimiter(',');
  pipeline->add_option("--max_outstanding_requests", pa.max_outstanding,
                       "values to try, e.g. 1,4,16")
      ->delimiter(',');
  pipeline->add_option("--work_us", pa.work_us, "CPU work per element, microseconds")
      ->capture_default_str();
  pipeline->add_option("--seconds", pa.seconds, "timed pass per row (default 1.5 quick, 4 full)");
  pipeline->add_option("--transport", pa.transport, "ucx-tcp, ucx-shm or grpc")
      ->capture_default_str();

  EngineArgs ea;
  CLI::App* engine = app.add_subcommand(
      "engine", "expressions vs plain loops, parallel Map, fresh vs pre-built elements");
  AddCommonOptions(engine, &ea.common);
  engine->add_option("--transports", ea.transports, "ucx-shm, ucx-tcp, grpc (default by mode)")
      ->delimiter(',');
  engine->add_option("--shm_tls", ea.shm_tls, "UCX_TLS of ucx-shm")->capture_default_str();
  engine->add_option("--workers", ea.workers, "worker processes for the fresh-element rows")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  engine->add_option("--work_us", ea.work_us, "CPU work per Map call, microseconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  engine->add_option("--seconds", ea.seconds, "timed pass per row (default 1 quick, 3 full)");

  ImagesArgs ia;
  ia.common.task_buffer_elements = 2;  // batches of 38 MiB: as DataLoader's prefetch_factor
  CLI::App* images = app.add_subcommand(
      "images", "JPEG decode + augment pipeline: sluice local, distributed, torch DataLoader");
  AddCommonOptions(images, &ia.common);
  images->add_option("--corpus", ia.corpus,
                     "image folder (DIR/<class>/<image>.jpg) to read; made there when missing or "
                     "empty (default: a corpus cached under $TMPDIR)");
  images->add_option("--images", ia.images, "images of the corpus made (default 128 quick, 1024)")
      ->check(CLI::PositiveNumber);
  images->add_option("--classes", ia.classes, "classes of the corpus made (default 10)")
      ->check(CLI::PositiveNumber);
  images->add_option("--workers", ia.workers, "worker counts of the distribute rows, e.g. 1,2")
      ->delimiter(',')
      ->capture_default_str();
  images->add_option("--torch_workers", ia.torch_workers, "DataLoader num_workers values, e.g. 0,2")
      ->delimiter(',')
      ->capture_default_str();
  images->add_option("--batch", ia.batch, "batch size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  images->add_option("--seed", ia.seed, "pipeline and corpus seed")->capture_default_str();
  images->add_option("--seconds", ia.seconds,
                     "timed passes per row last at least this long (whole passes, at least one; "
                     "default 1 quick, 3)");
  images->add_option("--transport", ia.transport, "ucx-shm, ucx-tcp or grpc")
      ->capture_default_str();
  images->add_option("--shm_tls", ia.shm_tls, "UCX_TLS of ucx-shm")->capture_default_str();
  images->add_option("--max_outstanding_requests", ia.max_outstanding,
                     "the distribute client's max_outstanding_requests")
      ->capture_default_str();
  images->add_option("--python", ia.python, "python with torch and torchvision")
      ->capture_default_str();
  images->add_option("--torch_script", ia.torch_script,
                     "torch_images.py (default: next to sluice-perf or in the source tree)");
  images->add_option("--corpus_tool", ia.corpus_tool,
                     "sluice-make-jpeg-corpus (default: next to sluice-perf or in the build tree)");
  images->add_option("--format", ia.format,
                     "folder (ImageFolder over the JPEG files) or webdataset (the same images in "
                     "tar shards; the DataLoader rows stream them with tarfile)")
      ->capture_default_str()
      ->check(CLI::IsMember({"folder", "webdataset"}));
  images->add_option("--samples_per_shard", ia.samples_per_shard,
                     "--format webdataset: images per shard (default: 16 shards)")
      ->check(CLI::NonNegativeNumber);
  images->add_option("--webdataset_tool", ia.webdataset_tool,
                     "sluice-make-webdataset (default: next to sluice-perf or in the build tree)");

  CompressionArgs ca;
  CLI::App* compression = app.add_subcommand(
      "compression", "wire compression (DistributeOptions::compression): GB/s, wire bytes and "
      "CPU per GB for each codec, payload kind and transport");
  AddCommonOptions(compression, &ca.common);
  compression->add_option("--size", ca.size, "element bytes (default 1 MiB)");
  compression->add_option("--seconds", ca.seconds, "timed pass per row (default 0.5 quick, 2)");
  compression->add_option("--transports", ca.transports, "grpc, ucx-tcp, ucx-shm")
      ->delimiter(',')
      ->capture_default_str();
  compression->add_option("--workloads", ca.workloads,
                          "ints (int64 counters), text, noise (random bytes)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"ints", "text", "noise"}));
  compression->add_option("--codecs", ca.codecs, "none, lz4, zstd, AUTO")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "lz4", "zstd", "AUTO"}));

  DispatcherArgs da;
  CLI::App* dispatcher = app.add_subcommand(
      "dispatcher", "one dispatcher against thousands of simulated workers and consumers, and "
      "calls/s of RegisterDataset, GetOrCreateIteration and GetSplit");
  AddCommonOptions(dispatcher, &da.common);
  dispatcher->add_option("--dispatcher_binary", da.dispatcher_binary,
                         "sluice-dispatcher to measure (default: next to sluice-perf or in the "
                         "build tree); another build's, to compare");
  dispatcher->add_option("--workers", da.workers, "simulated workers (default 2000; 200 quick)")
      ->check(CLI::Range(1, 10000));
  dispatcher->add_option("--consumers", da.consumers,
                         "simulated consumers (default 2000; 200 quick)")
      ->check(CLI::Range(1, 10000));
  dispatcher->add_option("--jobs", da.jobs,
                         "distributed_epoch jobs the consumers share (default 200; 20 quick)")
      ->check(CLI::Range(1, 10000));
  dispatcher->add_option("--splits_per_worker_s", da.splits_per_worker_s,
                         "GetSplit fetches per simulated worker per second")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1000.0));
  dispatcher->add_option("--connections", da.connections,
                         "gRPC connections the simulated fleet spreads over")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  dispatcher->add_option("--map_ops", da.map_ops,
                         "Maps after each job's Range: a dataset definition of a real "
                         "pipeline's size (the fleet never runs it)")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  dispatcher->add_option("--seconds", da.seconds, "fleet measurement (default 60; 10 quick)");
  dispatcher->add_option("--rate_seconds", da.rate_seconds,
                         "each calls/s row (default 5; 2 quick)");
  dispatcher->add_option("--callers", da.callers, "concurrent callers of the calls/s rows")
      ->delimiter(',')
      ->capture_default_str();
  dispatcher->add_flag("--no_rates", da.no_rates, "skip the calls/s rows");
  dispatcher->add_flag("--no_fleet", da.no_fleet, "skip the fleet simulation");
  dispatcher->add_option("--journal_sync_delay_us", da.journal_sync_delay_us,
                         "make each journal sync of the dispatcher (--dispatcher_binary's too) "
                         "this much longer: a slower disk, emulated (0: this machine's disk)")
      ->check(CLI::NonNegativeNumber);

  FilesArgs fa;
  CLI::App* files = app.add_subcommand(
      "files", "distributed_epoch over many small files beside the same pipeline locally: "
      "files/s, and the dispatcher's splits, CPU and journal bytes per epoch");
  AddCommonOptions(files, &fa.common);
  files->add_option("--corpus", fa.corpus,
                    "folder of the corpus, made there when missing, empty or made with other "
                    "sizes (default: cached under $TMPDIR)");
  files->add_option("--files", fa.files, "files of the corpus (default 200000; 20000 quick)")
      ->check(CLI::PositiveNumber);
  files->add_option("--file_bytes", fa.file_bytes, "bytes of each file")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  files->add_option("--classes", fa.classes, "class folders")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  files->add_option("--workers", fa.workers, "worker processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  files->add_option("--file_split_files", fa.file_split_files,
                    "the dispatcher's --file_split_files, a row each (0: its automatic runs)")
      ->delimiter(',')
      ->capture_default_str();
  files->add_option("--epochs", fa.epochs, "epochs a row (default 2; files/s over all but the "
                    "first)")
      ->check(CLI::Range(1, 1000));
  files->add_option("--transport", fa.transport, "ucx-tcp, ucx-shm or grpc")
      ->capture_default_str();
  files->add_option("--shm_tls", fa.shm_tls, "UCX_TLS of ucx-shm")->capture_default_str();
  files->add_option("--max_outstanding_requests", fa.max_outstanding,
                    "the client's max_outstanding_requests")
      ->capture_default_str();
  files->add_option("--dispatcher_binary", fa.dispatcher_binary,
                    "sluice-dispatcher to run (default: next to sluice-perf or in the build tree)");

  CheckpointArgs cka;
  CLI::App* checkpoint = app.add_subcommand(
      "checkpoint", "a distributed_epoch consumer's service checkpoint: Save() time and bytes "
      "over an ImageNet-sized split table, and its restore beside a fresh iterator");
  AddCommonOptions(checkpoint, &cka.common);
  checkpoint->add_option("--elements", cka.elements,
                         "elements of the Range (default 1280000; 128000 quick)")
      ->check(CLI::PositiveNumber);
  checkpoint->add_option("--split_elements", cka.split_elements,
                         "the dispatcher's --range_split_elements")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  checkpoint->add_option("--workers", cka.workers, "worker processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  checkpoint->add_option("--saves", cka.saves, "Save() calls timed at each point")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  checkpoint->add_option("--transport", cka.transport, "ucx-tcp, ucx-shm or grpc")
      ->capture_default_str();
  checkpoint->add_option("--shm_tls", cka.shm_tls, "UCX_TLS of ucx-shm")->capture_default_str();
  checkpoint->add_option("--max_outstanding_requests", cka.max_outstanding,
                         "the client's max_outstanding_requests")
      ->capture_default_str();
  checkpoint->add_option("--dispatcher_binary", cka.dispatcher_binary,
                         "sluice-dispatcher to run (default: next to sluice-perf or in the build "
                         "tree)");

  // Internal: one row of `files` (see files.cc).
  FilesClientOptions fo;
  std::string files_out;
  CLI::App* files_client = app.add_subcommand("files-client", "");
  files_client->group("");
  files_client->add_option("--corpus", fo.corpus)->required();
  files_client->add_option("--files", fo.files)->required();
  files_client->add_option("--file_bytes", fo.file_bytes)->required();
  files_client->add_option("--epochs", fo.epochs);
  files_client->add_option("--service", fo.service);
  files_client->add_option("--protocol", fo.protocol);
  files_client->add_option("--max_outstanding_requests", fo.max_outstanding);
  files_client->add_option("--out", files_out)->required();

  // Internal: one sluice row of `images` (see images.cc).
  ImagesClientOptions io;
  std::string images_out;
  CLI::App* images_client = app.add_subcommand("images-client", "");
  images_client->group("");
  images_client->add_option("--corpus", io.corpus)->required();
  images_client->add_option("--batch", io.batch);
  images_client->add_option("--seed", io.seed);
  images_client->add_option("--service", io.service);
  images_client->add_option("--protocol", io.protocol);
  images_client->add_option("--max_outstanding_requests", io.max_outstanding);
  images_client->add_option("--worker_pids", io.worker_pids)->delimiter(',');
  images_client->add_option("--min_seconds", io.min_seconds);
  images_client->add_option("--normalize_on_client", io.normalize_on_client);
  images_client->add_option("--webdataset", io.webdataset);
  images_client->add_option("--out", images_out)->required();

  // Internal: one measuring client (see the process model at the top).
  ClientOptions co;
  std::string out;
  CLI::App* client = app.add_subcommand("client", "");
  client->group("");  // hidden from --help
  client->add_option("--service", co.service)->required();
  client->add_option("--protocol", co.protocol);
  client->add_option("--workload", co.workload);
  client->add_option("--compression", co.compression);
  client->add_option("--arg", co.arg);
  client->add_option("--max_outstanding_requests", co.max_outstanding_requests);
  client->add_option("--max_elements_per_reply", co.max_elements_per_reply);
  client->add_option("--warmup_elements", co.warmup_elements);
  client->add_option("--max_elements", co.max_elements);
  client->add_option("--max_bytes", co.max_bytes);
  client->add_option("--max_seconds", co.max_seconds);
  client->add_option("--latency_elements", co.latency_elements);
  client->add_option("--latency_seconds", co.latency_seconds);
  client->add_option("--plugin", co.plugin);
  client->add_option("--out", out)->required();

  CLI11_PARSE(app, argc, argv);
  // The service's info lines would break up the table: warn unless asked.
  if (std::getenv("SLUICE_LOG_LEVEL") == nullptr) SetLogLevel("warn").IgnoreError();
  InitLoggingFromEnv();
  const std::string command = absl::StrJoin(std::vector<std::string>(argv, argv + argc), " ");
  absl::Status s;
  if (client->parsed()) {
    absl::StatusOr<Record> r = RunClient(co);
    s = r.ok() ? WriteFile(out, FormatRecord(*r)) : r.status();
  } else if (files_client->parsed()) {
    absl::StatusOr<Record> r = RunFilesClient(fo);
    s = r.ok() ? WriteFile(files_out, FormatRecord(*r)) : r.status();
  } else if (images_client->parsed()) {
    absl::StatusOr<Record> r = RunImagesClient(io);
    s = r.ok() ? WriteFile(images_out, FormatRecord(*r)) : r.status();
  } else {
    InstallChildCleanupOnSignal();
    s = transport->parsed() ? RunTransport(ta, command)
        : engine->parsed()  ? RunEngine(ea, command)
        : images->parsed()  ? RunImages(ia, command)
        : dispatcher->parsed() ? RunDispatcher(da, command)
        : compression->parsed() ? RunCompression(ca, command)
        : files->parsed() ? RunFiles(fa, command)
        : checkpoint->parsed() ? RunCheckpoint(cka, command)
                            : RunPipeline(pa, command);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "sluice-perf: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace sluice::perf

int main(int argc, char** argv) { return sluice::perf::Main(argc, argv); }
