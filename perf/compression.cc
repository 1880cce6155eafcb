// sluice-perf compression: wire compression (DistributeOptions::compression)
// per codec, payload kind and transport, in one run (docs/perf.md).
//
// Each transport gets one worker process; each row is one measuring client
// process (`sluice-perf client`) pulling S-byte elements of one kind --
// int64 counters, English text, random bytes (as incompressible as JPEG
// data) -- with one codec. Rows: GB/s of payload delivered (uncompressed
// bytes over the timed pass), the wire bytes per payload byte, and the CPU
// per GB of payload of the client (its timed pass) and of the worker (its
// whole share of the row: the warm-up's few elements included).
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "perf/cluster.h"
#include "perf/measure.h"
#include "perf/report.h"
#include "perf/suite.h"
#include "sluice/core/status.h"

namespace sluice::perf {
namespace {

struct Row {
  std::string transport, workload, codec;
  double gbps = std::nan(""), wire_ratio = std::nan("");
  double client_cpu_per_gb = std::nan(""), worker_cpu_per_gb = std::nan("");
  std::string error;
};

}  // namespace

absl::Status RunCompression(const CompressionArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  const int64_t size = a.size > 0 ? a.size : (int64_t{1} << 20);
  const double seconds = a.seconds > 0 ? a.seconds : quick ? 0.5 : 2.0;
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf_compression"));
  if (a.common.keep_logs) scratch.Keep();
  Progress progress("compression", static_cast<int>(a.transports.size() * a.workloads.size() *
                                                    a.codecs.size()));
  std::vector<Row> rows;
  bool any_failed = false;
  for (const std::string& tname : a.transports) {
    SLUICE_ASSIGN_OR_RETURN(TransportSpec t, ParseTransport(tname, kDefaultShmTls));
    absl::StatusOr<std::unique_ptr<Cluster>> cluster =
        Cluster::Start(ClusterFor(bin, a.common, t, 1, scratch, t.name));
    for (const std::string& workload : a.workloads) {
      for (const std::string& codec : a.codecs) {
        progress.Step(absl::StrCat(t.name, " ", workload, " ", codec));
        Row row;
        row.transport = t.name;
        row.workload = workload;
        row.codec = codec;
        absl::Status st = cluster.status();
        if (st.ok()) {
          ClientOptions o;
          o.service = (*cluster)->target();
          o.protocol = t.protocol;
          o.workload = workload;
          o.compression = codec;
          o.arg = size;
          o.warmup_elements = 4;
          o.max_elements = int64_t{1} << 40;
          o.max_bytes = int64_t{1} << 50;
          o.max_seconds = seconds;
          o.plugin = bin.plugin;
          const int pid = (*cluster)->worker_pids().at(0);
          const double w0 = ProcCpuSeconds(pid).value_or(0);
          absl::StatusOr<Record> r =
              RunClientChild(o, t, scratch, absl::StrCat(t.name, "-", workload, "-", codec),
                             seconds + 120);
          const double w1 = ProcCpuSeconds(pid).value_or(0);
          st = r.status();
          if (r.ok()) {
            const double bytes = RecordNumber(*r, "bytes");
            const double gb = bytes / 1e9;
            const double secs = RecordNumber(*r, "seconds");
            row.gbps = secs > 0 ? gb / secs : std::nan("");
            // Per element on both sides: the elements received over the
            // window are not the ones returned over it (a few were
            // buffered before it, a few after), and every element of a
            // workload has the same size.
            const double elements = RecordNumber(*r, "elements");
            const double wire_elements = RecordNumber(*r, "wire_elements");
            row.wire_ratio = bytes > 0 && wire_elements > 0
                                 ? (RecordNumber(*r, "wire_bytes") / wire_elements) /
                                       (bytes / elements)
                                 : std::nan("");
            row.client_cpu_per_gb =
                (RecordNumber(*r, "cpu_user_s") + RecordNumber(*r, "cpu_sys_s")) / gb;
            row.worker_cpu_per_gb = (w1 - w0) / gb;
          }
        }
        if (!st.ok()) {
          row.error = OneLine(st);
          any_failed = true;
        }
        rows.push_back(row);
      }
    }
  }
  progress.Finish();

  std::printf("sluice-perf compression%s\n", quick ? " --quick" : "");
  std::printf("machine: %s\n", machine.Describe().c_str());
  std::printf("elements of %s, one worker process per transport, one client process per row, "
              "timed %.1f s; wire: bytes received per payload byte\n\n",
              SizeLabel(size).c_str(), seconds);
  std::printf("%-9s %-6s %-5s %8s %8s %16s %16s\n", "transport", "kind", "codec", "GB/s", "wire",
              "client cpu s/GB", "worker cpu s/GB");
  std::vector<std::string> row_json;
  for (const Row& r : rows) {
    JsonObject j;
    j.Add("transport", r.transport).Add("workload", r.workload).Add("codec", r.codec);
    if (!r.error.empty()) {
      std::printf("%-9s %-6s %-5s  FAILED: %s\n", r.transport.c_str(), r.workload.c_str(),
                  r.codec.c_str(), r.error.substr(0, 160).c_str());
      row_json.push_back(j.Add("error", r.error).str());
      continue;
    }
    std::printf("%-9s %-6s %-5s %8s %8s %16s %16s\n", r.transport.c_str(), r.workload.c_str(),
                r.codec.c_str(), Num(r.gbps, 3).c_str(), Num(r.wire_ratio, 3).c_str(),
                Num(r.client_cpu_per_gb, 3).c_str(), Num(r.worker_cpu_per_gb, 3).c_str());
    row_json.push_back(j.Add("gbps", r.gbps)
                           .Add("wire_bytes_per_payload_byte", r.wire_ratio)
                           .Add("client_cpu_s_per_gb", r.client_cpu_per_gb)
                           .Add("worker_cpu_s_per_gb", r.worker_cpu_per_gb)
                           .str());
  }
  std::printf("\n");
  Report report;
  report.mode = "compression";
  report.command = command;
  report.machine = machine;
  report.fields = {{"element_bytes", absl::StrCat(size)},
                   {"seconds", absl::StrCat(seconds)}};
  report.sections = {{"rows", row_json}};
  report.notes = {
      "ints: int64 counters; text: English text; noise: random bytes (as incompressible as JPEG "
      "data, which workers send as they are when a codec saves less than an eighth)",
      "worker cpu counts the row's warm-up elements too (4 of them)"};
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
