// sluice-perf transport: one client pulls pre-built elements of each size
// over ucx-tcp, ucx-shm and grpc; the same run measures the ceilings
// (ucx_perftest on the same UCX_TLS, single-thread memcpy) and reports each
// figure as a ratio of its ceiling and of the gRPC path. See docs/perf.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "perf/suite.h"
#include "sluice/client/distribute.h"
#include "sluice/core/status.h"

namespace sluice::perf {
namespace {

constexpr double kPerftestMB = 1024.0 * 1024.0;  // ucx_perftest's "MB/s" are MiB/s

// ---- ucx_perftest -------------------------------------------------------------

struct PerftestResult {
  double gb_per_s = 0;
  double msg_per_s = 0;
};

// One ucx_perftest run (server and client processes on 127.0.0.1, a free
// port) with UCX_TLS=`tls`. Parses the client's "Final:" line. Both sides
// run with -e (endpoints with peer error handling), as sluice's endpoints
// are: UCX then selects the same transports for both. (On UCX 1.13 that
// excludes shared memory, which lacks peer failure detection, so the shm
// configuration runs over tcp in both; see perf/RESULTS.md.)
absl::StatusOr<PerftestResult> RunPerftest(const std::string& binary, const std::string& test,
                                           int64_t size, int64_t iters, const std::string& tls,
                                           const ScratchDir& scratch, const std::string& name) {
  const std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", tls}};
  const int64_t warmup = std::clamp<int64_t>(iters / 10, 2, 2000);
  absl::Status last = absl::UnknownError("not run");
  for (int attempt = 0; attempt < 3; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(int port, PickFreeLoopbackPort());
    ChildProcess server(name + "-server", scratch.File(name + "-server.log"));
    SLUICE_RETURN_IF_ERROR(server.Start(binary, {"-p", absl::StrCat(port), "-e"}, env));
    // The client fails at once if the server is not listening yet: retry.
    for (int tries = 0; tries < 20; ++tries) {
      absl::SleepFor(absl::Milliseconds(tries == 0 ? 100 : 150));
      if (server.TryReap()) break;
      ChildProcess client(name, scratch.File(name + ".log"));
      SLUICE_RETURN_IF_ERROR(client.Start(
          binary, {"127.0.0.1", "-p", absl::StrCat(port), "-e", "-t", test, "-s",
                   absl::StrCat(size), "-n", absl::StrCat(iters), "-w", absl::StrCat(warmup)},
          env));
      absl::StatusOr<int> st = client.Wait(absl::Seconds(120));
      if (!st.ok()) return st.status();
      const std::string log = ReadWholeFile(scratch.File(name + ".log"));
      for (absl::string_view line : absl::StrSplit(log, '\n')) {
        if (!absl::ConsumePrefix(&line, "Final:")) continue;
        std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
        // iterations, latency p50/avg/overall, bandwidth avg/overall, rate avg/overall
        double mb = 0, rate = 0;
        if (f.size() >= 8 && absl::SimpleAtod(f[5], &mb) && absl::SimpleAtod(f[7], &rate)) {
          return PerftestResult{mb * kPerftestMB / kGB, rate};
        }
      }
      last = absl::InternalError(absl::StrCat("ucx_perftest ", test, " -s ", size, ": ",
                                              DescribeWaitStatus(*st), "; output:\n",
                                              log.substr(0, 2000)));
      if (log.find("Connection refused") == std::string::npos &&
          log.find("connect") == std::string::npos) {
        return last;
      }
    }
  }
  return last;
}

// ---- transport ------------------------------------------------------------------

struct TransportRow {
  TransportSpec transport;
  int64_t size = 0;
  std::optional<Record> rec;
  std::string error;
  // derived
  double gbps = 0, eps = 0, cpu_s = 0, cpu_per_gb = 0;
  std::optional<double> am_gbps, tag_gbps, memcpy_gbps;
  std::string perftest_error;
};

double Ratio(double a, std::optional<double> b) {
  return b.has_value() && *b > 0 ? a / *b : std::nan("");
}

void Derive(TransportRow& row) {
  if (!row.rec) return;
  const Record& r = *row.rec;
  const double secs = RecordNumber(r, "seconds");
  const double bytes = RecordNumber(r, "bytes");
  row.gbps = secs > 0 ? bytes / secs / kGB : 0;
  row.eps = secs > 0 ? RecordNumber(r, "elements") / secs : 0;
  row.cpu_s = RecordNumber(r, "cpu_user_s") + RecordNumber(r, "cpu_sys_s");
  row.cpu_per_gb = bytes > 0 ? row.cpu_s / (bytes / kGB) : 0;
}

std::optional<double> Ceiling(const TransportRow& row) {
  if (!row.am_gbps && !row.tag_gbps) return std::nullopt;
  return std::max(row.am_gbps.value_or(0), row.tag_gbps.value_or(0));
}

const TransportRow* GrpcRow(const std::vector<TransportRow>& rows, int64_t size) {
  for (const auto& r : rows) {
    if (r.transport.protocol == "grpc" && r.size == size && r.rec) return &r;
  }
  return nullptr;
}

std::string TransportRowJson(const TransportRow& row, const std::vector<TransportRow>& rows) {
  JsonObject j;
  j.Add("transport", row.transport.name)
      .Add("protocol", row.transport.protocol)
      .Add("ucx_tls", row.transport.ucx_tls)
      .Add("size_bytes", row.size);
  if (!row.rec) return j.Add("error", row.error).str();
  const Record& r = *row.rec;
  const TransportRow* g = GrpcRow(rows, row.size);
  const std::optional<double> ceiling = Ceiling(row);
  j.Add("elements", static_cast<int64_t>(RecordNumber(r, "elements")))
      .Add("bytes", static_cast<int64_t>(RecordNumber(r, "bytes")))
      .Add("seconds", RecordNumber(r, "seconds"))
      .Add("gb_per_s", row.gbps)
      .Add("elements_per_s", row.eps)
      .Add("latency_p50_us", RecordNumber(r, "lat_p50_us", std::nan("")))
      .Add("latency_p99_us", RecordNumber(r, "lat_p99_us", std::nan("")))
      .Add("latency_samples", static_cast<int64_t>(RecordNumber(r, "lat_n")))
      .Add("client_cpu_s", row.cpu_s)
      .Add("client_cpu_s_per_gb", row.cpu_per_gb)
      .Add("client_payload_bytes_copied",
           static_cast<int64_t>(RecordNumber(r, "client_payload_bytes_copied")))
      .Add("ucx_elements_received", static_cast<int64_t>(RecordNumber(r, "ucx_elements_received")))
      .Add("dedicated_buffer_allocations",
           static_cast<int64_t>(RecordNumber(r, "dedicated_buffer_allocations")))
      .Add("perftest_am_bw_gb_per_s", row.am_gbps.value_or(std::nan("")))
      .Add("perftest_tag_bw_gb_per_s", row.tag_gbps.value_or(std::nan("")))
      .Add("ratio_vs_perftest", Ratio(row.gbps, ceiling))
      .Add("memcpy_gb_per_s", row.memcpy_gbps.value_or(std::nan("")))
      .Add("ratio_vs_memcpy", Ratio(row.gbps, row.memcpy_gbps))
      .Add("ratio_vs_grpc", g != nullptr && g != &row ? Ratio(row.gbps, g->gbps) : std::nan(""));
  if (!row.perftest_error.empty()) j.Add("perftest_error", row.perftest_error);
  return j.str();
}

struct Target {
  std::string what;
  bool met;
  std::string detail;
};

std::vector<Target> EvaluateTargets(const std::vector<TransportRow>& rows) {
  std::vector<Target> t;
  for (const auto& row : rows) {
    if (!row.rec || row.transport.protocol != "ucx") continue;
    const std::string cell = absl::StrCat(row.transport.name, " ", SizeLabel(row.size));
    const TransportRow* g = GrpcRow(rows, row.size);
    if (row.size >= (1 << 20)) {
      if (auto c = Ceiling(row)) {
        double r = row.gbps / *c;
        t.push_back({absl::StrCat(cell, ": >= 90% of ucx_perftest"), r >= 0.9,
                     absl::StrFormat("%.0f%% (%.2f of %.2f GB/s)", r * 100, row.gbps, *c)});
      }
      if (g != nullptr && g->gbps > 0) {
        double r = row.gbps / g->gbps;
        t.push_back({absl::StrCat(cell, ": >= 3x gRPC"), r >= 3,
                     absl::StrFormat("%.2fx (%.2f vs %.2f GB/s)", r, row.gbps, g->gbps)});
      }
    }
    if (row.size <= 4096 && g != nullptr && g->eps > 0) {
      double r = row.eps / g->eps;
      t.push_back({absl::StrCat(cell, ": >= 10x gRPC elements/s"), r >= 10,
                   absl::StrFormat("%.2fx (%.0f vs %.0f elements/s)", r, row.eps, g->eps)});
    }
    const double copied = RecordNumber(*row.rec, "client_payload_bytes_copied");
    t.push_back({absl::StrCat(cell, ": 0 client payload copies"), copied == 0,
                 absl::StrFormat("%.0f bytes copied", copied)});
  }
  return t;
}

std::string TransportPlotScript(const std::vector<TransportRow>& rows,
                                const std::vector<std::string>& transports,
                                const std::string& png, const std::string& title) {
  std::string s = absl::StrCat(
      GnuplotPngHeader(png, 1100, 700), "set title ", JsonQuote(title), "\nset logscale x 2\nset logscale y 10\n",
      "set xlabel 'element size (bytes)'\nset ylabel 'GB/s (1e9 bytes/s) into client buffers'\n",
      "set key right bottom\nset grid\n");
  std::map<int64_t, bool> sizes;
  for (const auto& r : rows) sizes[r.size] = true;
  std::vector<std::string> tics;
  for (const auto& [size, unused] : sizes) {
    tics.push_back(absl::StrCat(JsonQuote(SizeLabel(size)), " ", size));
  }
  absl::StrAppend(&s, "set xtics (", absl::StrJoin(tics, ", "), ")\n");
  if (!sizes.empty()) {
    absl::StrAppend(&s, "set xrange [", sizes.begin()->first / 1.5, ":",
                    sizes.rbegin()->first * 1.5, "]\n");
  }
  std::vector<std::string> plots;
  int block = 0;
  auto add_series = [&](const std::string& label, const std::string& style,
                        const std::vector<std::pair<int64_t, double>>& points) {
    if (points.empty()) return;
    const std::string name = absl::StrCat("$d", block++);
    absl::StrAppend(&s, name, " << EOD\n");
    for (const auto& [x, y] : points) {
      if (y > 0) absl::StrAppend(&s, x, " ", y, "\n");
    }
    absl::StrAppend(&s, "EOD\n");
    plots.push_back(absl::StrCat(name, " using 1:2 with ", style, " title ", JsonQuote(label)));
  };
  int color = 0;
  for (const auto& name : transports) {
    ++color;
    std::vector<std::pair<int64_t, double>> pts, ceil;
    for (const auto& r : rows) {
      if (r.transport.name != name || !r.rec) continue;
      pts.emplace_back(r.size, r.gbps);
      if (auto c = Ceiling(r)) ceil.emplace_back(r.size, *c);
    }
    add_series("sluice " + name, absl::StrCat("linespoints lw 2 pt 7 lc ", color), pts);
    add_series("ucx_perftest, " + name + "'s UCX_TLS",
               absl::StrCat("linespoints dt 2 pt 6 lc ", color), ceil);
  }
  std::map<int64_t, double> memcpy_pts;
  for (const auto& r : rows) {
    if (r.memcpy_gbps) memcpy_pts[r.size] = *r.memcpy_gbps;
  }
  add_series("memcpy, 1 thread", "linespoints dt 3 pt 4 lc 0",
             std::vector<std::pair<int64_t, double>>(memcpy_pts.begin(), memcpy_pts.end()));
  absl::StrAppend(&s, "plot ", absl::StrJoin(plots, ", \\\n     "), "\n");
  return s;
}

void PrintTransportTable(const std::vector<TransportRow>& rows) {
  std::printf("%-8s %8s %8s %9s %9s %9s %9s %8s %10s %6s %9s %6s %7s\n", "transport", "size",
              "GB/s", "elem/s", "p50 us", "p99 us", "cpuS/GB", "copied", "perftest", "%pt",
              "memcpy", "%mcp", "x grpc");
  for (const auto& row : rows) {
    if (!row.rec) {
      std::printf("%-8s %8s  FAILED: %s\n", row.transport.name.c_str(),
                  SizeLabel(row.size).c_str(), row.error.substr(0, 200).c_str());
      continue;
    }
    const Record& r = *row.rec;
    const TransportRow* g = GrpcRow(rows, row.size);
    const std::optional<double> c = Ceiling(row);
    std::printf("%-8s %8s %8s %9s %9s %9s %9s %8s %10s %6s %9s %6s %7s\n",
                row.transport.name.c_str(), SizeLabel(row.size).c_str(), Num(row.gbps).c_str(),
                Count(row.eps).c_str(), Num(RecordNumber(r, "lat_p50_us", std::nan("")), 1).c_str(),
                Num(RecordNumber(r, "lat_p99_us", std::nan("")), 1).c_str(),
                Num(row.cpu_per_gb, 2).c_str(),
                Count(RecordNumber(r, "client_payload_bytes_copied")).c_str(),
                c ? Num(*c).c_str() : "-", Pct(Ratio(row.gbps, c)).c_str(),
                row.memcpy_gbps ? Num(*row.memcpy_gbps).c_str() : "-",
                Pct(Ratio(row.gbps, row.memcpy_gbps)).c_str(),
                g != nullptr && g != &row ? Times(Ratio(row.gbps, g->gbps)).c_str() : "-");
  }
}

int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, v)); }

}  // namespace

absl::Status RunTransport(const TransportArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  std::vector<int64_t> sizes;
  std::vector<std::string> size_text = a.sizes;
  if (size_text.empty()) {
    size_text = quick ? std::vector<std::string>{"64", "4K", "1M", "16M"}
                      : std::vector<std::string>{"64", "4K", "64K", "1M", "4M", "16M", "64M"};
  }
  for (const auto& s : size_text) {
    SLUICE_ASSIGN_OR_RETURN(int64_t v, ParseSize(s));
    sizes.push_back(v);
  }
  std::vector<TransportSpec> transports;
  for (const auto& t : a.transports) {
    SLUICE_ASSIGN_OR_RETURN(TransportSpec spec, ParseTransport(t, a.shm_tls));
    transports.push_back(spec);
  }
  const std::string perftest = a.no_ceilings ? ""
                               : !a.ucx_perftest.empty() ? a.ucx_perftest
                                                         : FindOnPath("ucx_perftest");
  const double seconds = a.seconds > 0 ? a.seconds : quick ? 0.6 : 3.0;
  const int64_t max_elements = a.max_elements > 0 ? a.max_elements : quick ? 100000 : 1000000;
  const int64_t latency_elements = a.latency_elements >= 0 ? a.latency_elements
                                   : quick                 ? 300
                                                           : 3000;
  const int64_t byte_budget = quick ? (int64_t{1} << 30) : (int64_t{8} << 30);
  const double memcpy_seconds = quick ? 0.15 : 0.5;
  const double perftest_seconds = quick ? 0.3 : 1.0;
  // Quick mode runs the active-message test only: the API sluice's UCX path uses.
  const std::vector<std::string> perftest_tests =
      quick ? std::vector<std::string>{"ucp_am_bw"} : std::vector<std::string>{"ucp_am_bw", "tag_bw"};

  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf"));
  if (a.common.keep_logs) scratch.Keep();
  const MachineInfo machine = DescribeMachine();
  std::vector<std::string> notes;
  if (perftest.empty()) {
    notes.push_back(a.no_ceilings ? "ucx_perftest ceilings skipped (--no_ceilings)"
                                  : "ucx_perftest is not installed (package ucx-utils): no UCX "
                                    "ceilings, ratios vs perftest are missing");
  }

  int ucx_transports = 0;
  for (const auto& t : transports) ucx_transports += t.protocol == "ucx";
  const int steps = static_cast<int>(sizes.size()) *
                    (1 + static_cast<int>(transports.size()) +
                     (perftest.empty() ? 0 : ucx_transports * static_cast<int>(perftest_tests.size())));
  Progress progress("transport", steps);

  // The memcpy ceiling, once per size (this process, one thread).
  std::map<int64_t, double> memcpy_gbps;
  for (int64_t size : sizes) {
    progress.Step(absl::StrCat("memcpy ", SizeLabel(size)));
    memcpy_gbps[size] =
        MeasureMemcpy(size, std::max<int64_t>(int64_t{256} << 20, 2 * size), memcpy_seconds)
            .gb_per_s;
  }

  std::vector<TransportRow> rows;
  bool any_failed = false;
  for (const auto& t : transports) {
    absl::StatusOr<std::unique_ptr<Cluster>> cluster =
        Cluster::Start(ClusterFor(bin, a.common, t, a.workers, scratch, t.name));
    for (int64_t size : sizes) {
      progress.Step(absl::StrCat(t.name, " ", SizeLabel(size)));
      TransportRow row;
      row.transport = t;
      row.size = size;
      row.memcpy_gbps = memcpy_gbps[size];
      absl::StatusOr<Record> rec = absl::UnknownError("not run");
      if (!cluster.ok()) rec = cluster.status();
      if (cluster.ok()) {
        ClientOptions o;
        o.service = (*cluster)->target();
        o.protocol = t.protocol;
        o.workload = "payload";
        o.arg = size;
        o.max_outstanding_requests = a.max_outstanding;
        o.warmup_elements = Clamp((int64_t{64} << 20) / size, 2, 200);
        o.max_elements = max_elements;
        o.max_bytes = byte_budget;
        o.max_seconds = seconds;
        o.latency_elements = latency_elements;
        o.latency_seconds = quick ? 0.25 : 1.0;
        o.plugin = bin.plugin;
        rec = RunClientChild(o, t, scratch, absl::StrCat(t.name, "-client-", size),
                             seconds + o.latency_seconds + 120);
        // The counter counts receipts, the pass counts Next() calls: they
        // differ by the elements buffered at its start and end (at most
        // max_outstanding_requests replies, each batching up to
        // kMaxElementsPerReply small elements). Anything beyond that came
        // over gRPC.
        if (rec.ok() && t.protocol == "ucx" &&
            RecordNumber(*rec, "ucx_elements_received") +
                    static_cast<double>(a.max_outstanding * kMaxElementsPerReply) <
                RecordNumber(*rec, "elements")) {
          rec = absl::InternalError(absl::StrCat(
              "only ", (*rec)["ucx_elements_received"], " of ", (*rec)["elements"],
              " elements arrived over UCX (did a worker serve gRPC only?)"));
        }
        if (!rec.ok()) {
          if (absl::Status alive = (*cluster)->CheckWorkersAlive(); !alive.ok()) {
            rec = absl::Status(rec.status().code(),
                               absl::StrCat(rec.status().message(), "; ", alive.message()));
          }
        }
      }
      if (rec.ok()) {
        row.rec = *std::move(rec);
      } else {
        row.error = OneLine(rec.status());
        std::fprintf(stderr, "\nsluice-perf: %s %s failed: %s\n", t.name.c_str(),
                     SizeLabel(size).c_str(), std::string(rec.status().message()).c_str());
        any_failed = true;
      }
      Derive(row);
      rows.push_back(std::move(row));
    }
    cluster = absl::CancelledError("stopped");  // workers gone before the ceilings run
    if (t.protocol != "ucx" || perftest.empty()) continue;
    for (auto& row : rows) {
      if (row.transport.name != t.name) continue;
      for (const auto& test : perftest_tests) {
        progress.Step(absl::StrCat("ucx_perftest ", test, " ", t.name, " ", SizeLabel(row.size)));
        const std::string name = absl::StrCat("perftest-", t.name, "-", test, "-", row.size);
        // A short probe sizes the run to about perftest_seconds: its rate
        // here ranges over four orders of magnitude with size and load.
        auto pt = RunPerftest(perftest, test, row.size,
                              Clamp((int64_t{64} << 20) / row.size, 20, 2000), t.ucx_tls,
                              scratch, name + "-probe");
        if (pt.ok()) {
          pt = RunPerftest(perftest, test, row.size,
                           Clamp(static_cast<int64_t>(pt->msg_per_s * perftest_seconds), 20,
                                 quick ? 20000 : 200000),
                           t.ucx_tls, scratch, name);
        }
        if (!pt.ok()) {
          row.perftest_error = OneLine(pt.status());
          continue;
        }
        (test == "tag_bw" ? row.tag_gbps : row.am_gbps) = pt->gb_per_s;
      }
    }
  }
  progress.Finish();

  // ---- report ----
  std::printf("sluice-perf transport%s: one client, %d worker process(es), "
              "max_outstanding_requests=%lld\n",
              quick ? " --quick" : "", a.workers, static_cast<long long>(a.max_outstanding));
  std::printf("machine: %s\n", machine.Describe().c_str());
  std::printf("ucx-tcp: UCX_TLS=tcp; ucx-shm: UCX_TLS=%s; grpc: WorkerService.GetElement\n",
              a.shm_tls.c_str());
  PrintTransportTable(rows);
  std::printf(
      "GB/s = 1e9 payload bytes/s delivered into client buffers (timed pass, up to %.1f s per "
      "row, after a warm-up); elem/s likewise. p50/p99 = time of one Next() with "
      "max_outstanding_requests=1 (request round trip + transfer). cpuS/GB = client process CPU "
      "(user+sys, all threads) per GB. copied = TransportStats::client_payload_bytes_copied "
      "during the timed pass. perftest = max of ucx_perftest -e (peer error handling, as "
      "sluice's endpoints) ucp_am_bw and tag_bw on the same UCX_TLS and size (%%pt = sluice/perftest); memcpy = single-thread memcpy of blocks of "
      "that size through 256 MiB buffers; x grpc = GB/s (= elem/s) ratio to the grpc row of the "
      "same size.\n",
      seconds);
  for (const auto& row : rows) {
    if (!row.perftest_error.empty()) {
      std::printf("note: ucx_perftest for %s %s failed: %s\n", row.transport.name.c_str(),
                  SizeLabel(row.size).c_str(), row.perftest_error.c_str());
    }
  }
  const std::vector<Target> targets = EvaluateTargets(rows);
  if (!targets.empty()) std::printf("targets:\n");
  std::vector<std::string> target_json;
  for (const auto& t : targets) {
    std::printf("  %-6s %s: %s\n", t.met ? "MET" : "MISSED", t.what.c_str(), t.detail.c_str());
    target_json.push_back(
        JsonObject().Add("target", t.what).Add("met", t.met).Add("detail", t.detail).str());
  }
  if (!a.common.plot_path.empty()) {
    std::string note;
    absl::Status s = RunGnuplot(
        TransportPlotScript(rows, a.transports, a.common.plot_path,
                            absl::StrCat("sluice-perf transport: ", machine.nproc, " cpus, ",
                                         machine.cpu_model)),
        a.common.plot_path, &note);
    notes.push_back(s.ok() ? note : OneLine(s));
  }
  Report report;
  report.mode = "transport";
  report.command = command;
  report.machine = machine;
  report.fields = {
      {"workers", absl::StrCat(a.workers)},
      {"max_outstanding_requests", absl::StrCat(a.max_outstanding)},
      {"units", JsonObject()
                    .Add("gb_per_s", "1e9 bytes/s")
                    .Add("latency", "microseconds per Next() with max_outstanding_requests=1")
                    .Add("client_cpu_s_per_gb",
                         "client process CPU seconds (user+sys) per 1e9 payload bytes")
                    .str()}};
  std::vector<std::string> row_json;
  for (const auto& row : rows) row_json.push_back(TransportRowJson(row, rows));
  report.sections = {{"rows", row_json}, {"targets", target_json}};
  report.notes = notes;
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
