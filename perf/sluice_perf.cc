// sluice-perf: the perf suite.
//
//   sluice-perf transport [--quick] [--json out.json] [--plot out.png]
//   sluice-perf pipeline  [--quick] [--json out.json] [--plot out.png]
//
// transport: one client pulls pre-built elements (perf_payload) of each size
// from worker processes over ucx (UCX_TLS=tcp), ucx (shared memory) and
// grpc; the same run measures the ceilings (ucx_perftest on the same
// UCX_TLS, single-thread memcpy) and prints each figure as a ratio of its
// ceiling and of the gRPC path.
// pipeline: Distribute throughput of a CPU-bound map (perf_burn) on 1..N
// worker processes and several max_outstanding_requests.
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
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "perf/child_process.h"
#include "perf/cluster.h"
#include "perf/measure.h"
#include "perf/report.h"
#include "sluice/core/logging.h"
#include "sluice/core/status.h"

namespace sluice::perf {
namespace {

constexpr double kGB = 1e9;  // GB/s here are 1e9 bytes per second
constexpr double kPerftestMB = 1024.0 * 1024.0;  // ucx_perftest's "MB/s" are MiB/s

// ---- locating the binaries --------------------------------------------------

std::string SelfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string SelfDir() {
  std::string p = SelfPath();
  return p.substr(0, p.rfind('/'));
}

// `flag` when set, else the first candidate that exists.
absl::StatusOr<std::string> Locate(const std::string& what, const std::string& flag_name,
                                   const std::string& flag,
                                   const std::vector<std::string>& candidates) {
  if (!flag.empty()) {
    if (access(flag.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(flag_name, " ", flag, " does not exist"));
    }
    return flag;
  }
  for (const auto& c : candidates) {
    if (!c.empty() && access(c.c_str(), R_OK) == 0) return c;
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", what, " (looked at ",
                                          absl::StrJoin(candidates, ", "), "); pass ", flag_name));
}

struct Binaries {
  std::string worker;
  std::string plugin;
};

absl::StatusOr<Binaries> LocateBinaries(const std::string& worker_flag,
                                        const std::string& plugin_flag) {
  const std::string dir = SelfDir();
  Binaries b;
  SLUICE_ASSIGN_OR_RETURN(
      b.worker, Locate("the sluice-worker binary", "--worker_binary", worker_flag,
                       {dir + "/sluice-worker", dir + "/../tools/sluice-worker",
                        SLUICE_PERF_BUILD_WORKER}));
  SLUICE_ASSIGN_OR_RETURN(
      b.plugin, Locate("the perf UDF plugin", "--plugin", plugin_flag,
                       {dir + "/libsluice_perf_plugin.so", dir + "/../lib/libsluice_perf_plugin.so",
                        dir + "/../" SLUICE_PERF_INSTALL_LIBDIR "/libsluice_perf_plugin.so",
                        SLUICE_PERF_BUILD_PLUGIN}));
  return b;
}

// ---- options shared by the subcommands ---------------------------------------

struct CommonArgs {
  bool quick = false;
  std::string json_path;
  std::string plot_path;
  std::string worker_binary;
  std::string plugin;
  int64_t task_buffer_elements = 16;
  bool keep_logs = false;
};

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
  app->add_flag("--keep_logs", c->keep_logs, "keep the scratch directory with the children's logs");
}

// A transport under test: a name, the data-transfer protocol, UCX_TLS.
struct TransportSpec {
  std::string name;
  std::string protocol;
  std::string ucx_tls;  // empty: not set (grpc)
};

absl::StatusOr<TransportSpec> ParseTransport(const std::string& name, const std::string& shm_tls) {
  if (name == "ucx-tcp") return TransportSpec{name, "ucx", "tcp"};
  if (name == "ucx-shm") return TransportSpec{name, "ucx", shm_tls};
  if (name == "grpc") return TransportSpec{name, "grpc", ""};
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "': use ucx-tcp, ucx-shm or grpc"));
}

std::vector<std::pair<std::string, std::string>> ChildEnv(const TransportSpec& t) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!t.ucx_tls.empty()) env.emplace_back("UCX_TLS", t.ucx_tls);
  const char* level = std::getenv("SLUICE_LOG_LEVEL");
  env.emplace_back("SLUICE_LOG_LEVEL", level != nullptr ? level : "warn");
  return env;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  f << text;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

std::string CommandLine(int argc, char** argv) {
  std::vector<std::string> a(argv, argv + argc);
  return absl::StrJoin(a, " ");
}

// Runs `sluice-perf client` in a child with `t`'s environment and returns
// the record it wrote.
absl::StatusOr<Record> RunClientChild(const ClientOptions& o, const TransportSpec& t,
                                      const ScratchDir& scratch, const std::string& name,
                                      double timeout_s) {
  const std::string out = scratch.File(name + ".record");
  std::vector<std::string> args = {
      "client", "--service", o.service, "--protocol", o.protocol, "--workload", o.workload,
      "--arg", absl::StrCat(o.arg), "--max_outstanding_requests",
      absl::StrCat(o.max_outstanding_requests), "--warmup_elements",
      absl::StrCat(o.warmup_elements), "--max_elements", absl::StrCat(o.max_elements),
      "--max_bytes", absl::StrCat(o.max_bytes), "--max_seconds", absl::StrCat(o.max_seconds),
      "--latency_elements", absl::StrCat(o.latency_elements), "--latency_seconds",
      absl::StrCat(o.latency_seconds), "--plugin", o.plugin, "--out", out};
  ChildProcess child(name, scratch.File(name + ".log"));
  SLUICE_RETURN_IF_ERROR(child.Start(SelfPath(), args, ChildEnv(t)));
  absl::StatusOr<int> st = child.Wait(absl::Seconds(timeout_s));
  if (!st.ok()) {
    return absl::DeadlineExceededError(
        absl::StrCat(name, ": the client did not finish within ", timeout_s, " s; log:\n",
                     child.LogTail()));
  }
  if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
    return absl::InternalError(absl::StrCat(name, ": the client ", DescribeWaitStatus(*st),
                                            "; log:\n", child.LogTail()));
  }
  Record r = ParseRecord(ReadWholeFile(out));
  if (r.empty()) return absl::InternalError(absl::StrCat(name, ": the client wrote no results"));
  return r;
}

std::string OneLine(const absl::Status& s) {
  std::string m(s.message());
  std::replace(m.begin(), m.end(), '\n', ' ');
  if (m.size() > 300) m = m.substr(0, 300) + "...";
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", m);
}

// ---- ucx_perftest -------------------------------------------------------------

struct PerftestResult {
  double gb_per_s = 0;
  double msg_per_s = 0;
};

// One ucx_perftest run (server and client processes on 127.0.0.1, a free
// port) with UCX_TLS=`tls`. Parses the client's "Final:" line.
absl::StatusOr<PerftestResult> RunPerftest(const std::string& binary, const std::string& test,
                                           int64_t size, int64_t iters, const std::string& tls,
                                           const ScratchDir& scratch, const std::string& name) {
  const std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", tls}};
  const int64_t warmup = std::max<int64_t>(2, iters / 10);
  absl::Status last = absl::UnknownError("not run");
  for (int attempt = 0; attempt < 3; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(int port, PickFreeLoopbackPort());
    ChildProcess server(name + "-server", scratch.File(name + "-server.log"));
    SLUICE_RETURN_IF_ERROR(server.Start(binary, {"-p", absl::StrCat(port)}, env));
    // The client fails at once if the server is not listening yet: retry.
    for (int tries = 0; tries < 20; ++tries) {
      absl::SleepFor(absl::Milliseconds(tries == 0 ? 100 : 150));
      if (server.TryReap()) break;
      ChildProcess client(name, scratch.File(name + ".log"));
      SLUICE_RETURN_IF_ERROR(client.Start(
          binary, {"127.0.0.1", "-p", absl::StrCat(port), "-t", test, "-s", absl::StrCat(size),
                   "-n", absl::StrCat(iters), "-w", absl::StrCat(warmup)},
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

struct TransportArgs {
  CommonArgs common;
  std::vector<std::string> sizes;
  std::vector<std::string> transports = {"ucx-tcp", "ucx-shm", "grpc"};
  std::string shm_tls = "posix,cma,self,tcp";
  int workers = 1;
  int64_t max_outstanding = 8;
  double seconds = 0;           // 0: by mode
  int64_t max_elements = 0;     // 0: by mode
  int64_t latency_elements = -1;  // -1: by mode
  bool no_ceilings = false;
  std::string ucx_perftest;
};

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

std::string Num(double v, int precision = 3) {
  if (!std::isfinite(v)) return "-";
  if (v != 0 && std::fabs(v) < 0.01) return absl::StrFormat("%.2e", v);
  return absl::StrFormat("%.*f", precision, v);
}

std::string Count(double v) {
  if (!std::isfinite(v)) return "-";
  if (v >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (v >= 1e4) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

std::string Pct(double r) { return std::isfinite(r) ? absl::StrFormat("%.0f%%", r * 100) : "-"; }
std::string Times(double r) { return std::isfinite(r) ? absl::StrFormat("%.2fx", r) : "-"; }

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
      "set key left top\nset grid\n");
  std::map<int64_t, bool> sizes;
  for (const auto& r : rows) sizes[r.size] = true;
  std::vector<std::string> tics;
  for (const auto& [size, unused] : sizes) {
    tics.push_back(absl::StrCat(JsonQuote(SizeLabel(size)), " ", size));
  }
  absl::StrAppend(&s, "set xtics (", absl::StrJoin(tics, ", "), ")\n");
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
  const double seconds = a.seconds > 0 ? a.seconds : quick ? 0.8 : 3.0;
  const int64_t max_elements = a.max_elements > 0 ? a.max_elements : quick ? 100000 : 1000000;
  const int64_t latency_elements = a.latency_elements >= 0 ? a.latency_elements
                                   : quick                 ? 300
                                                           : 3000;
  const int64_t byte_budget = quick ? (int64_t{1} << 30) : (int64_t{8} << 30);
  const double memcpy_seconds = quick ? 0.15 : 0.5;
  const int64_t perftest_budget = quick ? (int64_t{512} << 20) : (int64_t{4} << 30);
  const std::vector<std::string> perftest_tests = {"ucp_am_bw", "tag_bw"};

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
    ClusterOptions co;
    co.num_workers = a.workers;
    co.worker_binary = bin.worker;
    co.plugin = bin.plugin;
    co.protocol = t.protocol;
    co.task_buffer_elements = a.common.task_buffer_elements;
    co.env = ChildEnv(t);
    co.scratch_dir = scratch.path();
    co.name = t.name;
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(co);
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
        o.warmup_elements = Clamp((int64_t{256} << 20) / size, 2, 200);
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
        // max_outstanding_requests each). Anything beyond that came over gRPC.
        if (rec.ok() && t.protocol == "ucx" &&
            RecordNumber(*rec, "ucx_elements_received") + static_cast<double>(a.max_outstanding) <
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
      const int64_t iters = Clamp(perftest_budget / row.size, 20, quick ? 30000 : 200000);
      for (const auto& test : perftest_tests) {
        progress.Step(absl::StrCat("ucx_perftest ", test, " ", t.name, " ", SizeLabel(row.size)));
        auto pt = RunPerftest(perftest, test, row.size, iters, t.ucx_tls, scratch,
                              absl::StrCat("perftest-", t.name, "-", test, "-", row.size));
        if (!pt.ok()) {
          row.perftest_error = OneLine(pt.status());
          continue;
        }
        (test == "tag_bw" ? row.tag_gbps : row.am_gbps) = pt->gb_per_s;
      }
    }
  }
  progress.Step("done");
  std::fprintf(stderr, "\n");

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
      "during the timed pass. perftest = max of ucx_perftest ucp_am_bw and tag_bw on the same "
      "UCX_TLS and size (%%pt = sluice/perftest); memcpy = single-thread memcpy of blocks of "
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
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  if (!a.common.json_path.empty()) {
    std::vector<std::string> row_json, note_json;
    for (const auto& row : rows) row_json.push_back(TransportRowJson(row, rows));
    for (const auto& n : notes) note_json.push_back(JsonQuote(n));
    std::string json = absl::StrCat(
        "{\n  \"tool\": \"sluice-perf\",\n  \"mode\": \"transport\",\n  \"quick\": ",
        quick ? "true" : "false", ",\n  \"command\": ", JsonQuote(command),
        ",\n  \"machine\": ", machine.Json(), ",\n  \"workers\": ", a.workers,
        ",\n  \"max_outstanding_requests\": ", a.max_outstanding,
        ",\n  \"units\": {\"gb_per_s\": \"1e9 bytes/s\", \"latency\": \"microseconds per Next() "
        "with max_outstanding_requests=1\", \"client_cpu_s_per_gb\": \"client process CPU "
        "seconds (user+sys) per 1e9 payload bytes\"},\n  \"rows\": ",
        JsonArrayLines(row_json, "  "), ",\n  \"targets\": ", JsonArrayLines(target_json, "  "),
        ",\n  \"notes\": ", JsonArrayLines(note_json, "  "), "\n}\n");
    SLUICE_RETURN_IF_ERROR(WriteFile(a.common.json_path, json));
  }
  if (any_failed) {
    scratch.Keep();
    return absl::InternalError(
        absl::StrCat("some measurements failed; logs kept in ", scratch.path()));
  }
  return absl::OkStatus();
}

// ---- pipeline ---------------------------------------------------------------------

struct PipelineArgs {
  CommonArgs common;
  std::vector<int> workers;
  std::vector<int64_t> max_outstanding;
  double work_us = 1000;
  double seconds = 0;
  std::string transport = "ucx-tcp";
  std::string shm_tls = "posix,cma,self,tcp";
};

struct PipelineRow {
  int workers = 0;
  int64_t max_outstanding = 0;
  std::optional<Record> rec;
  std::string error;
  double eps = 0;
  double client_cpu_us_per_element = 0;
};

absl::Status RunPipeline(const PipelineArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  SLUICE_ASSIGN_OR_RETURN(TransportSpec t, ParseTransport(a.transport, a.shm_tls));
  std::vector<int> workers = a.workers;
  if (workers.empty()) workers = quick ? std::vector<int>{1, 2} : std::vector<int>{1, 2, 3, 4};
  std::vector<int64_t> mors = a.max_outstanding;
  if (mors.empty()) mors = {1, 4, 16};
  const double seconds = a.seconds > 0 ? a.seconds : quick ? 1.5 : 4.0;
  SLUICE_ASSIGN_OR_RETURN(BurnCalibration burn, CalibrateBurn(bin.plugin, a.work_us));
  const double local_eps = 1e6 / burn.us_per_element;
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf"));
  if (a.common.keep_logs) scratch.Keep();
  Progress progress("pipeline", static_cast<int>(workers.size() * mors.size()));

  std::vector<PipelineRow> rows;
  bool any_failed = false;
  for (int w : workers) {
    ClusterOptions co;
    co.num_workers = w;
    co.worker_binary = bin.worker;
    co.plugin = bin.plugin;
    co.protocol = t.protocol;
    co.task_buffer_elements = a.common.task_buffer_elements;
    co.env = ChildEnv(t);
    co.scratch_dir = scratch.path();
    co.name = absl::StrCat("pipeline-w", w);
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(co);
    for (int64_t m : mors) {
      progress.Step(absl::StrCat(w, " worker(s), max_outstanding_requests=", m));
      PipelineRow row;
      row.workers = w;
      row.max_outstanding = m;
      absl::StatusOr<Record> rec = absl::UnknownError("not run");
      if (!cluster.ok()) rec = cluster.status();
      if (cluster.ok()) {
        ClientOptions o;
        o.service = (*cluster)->target();
        o.protocol = t.protocol;
        o.workload = "burn";
        o.arg = burn.rounds;
        o.max_outstanding_requests = m;
        o.warmup_elements = 20;
        o.max_elements = int64_t{1} << 40;
        o.max_bytes = int64_t{1} << 60;
        o.max_seconds = seconds;
        o.plugin = bin.plugin;
        rec = RunClientChild(o, t, scratch, absl::StrCat("pipeline-client-w", w, "-m", m),
                             seconds + 120);
      }
      if (rec.ok()) {
        row.rec = *std::move(rec);
        const double secs = RecordNumber(*row.rec, "seconds");
        const double n = RecordNumber(*row.rec, "elements");
        row.eps = secs > 0 ? n / secs : 0;
        row.client_cpu_us_per_element =
            n > 0 ? (RecordNumber(*row.rec, "cpu_user_s") + RecordNumber(*row.rec, "cpu_sys_s")) *
                        1e6 / n
                  : 0;
      } else {
        row.error = OneLine(rec.status());
        std::fprintf(stderr, "\nsluice-perf: pipeline %d worker(s) m=%lld failed: %s\n", w,
                     static_cast<long long>(m), std::string(rec.status().message()).c_str());
        any_failed = true;
      }
      rows.push_back(std::move(row));
    }
  }
  progress.Step("done");
  std::fprintf(stderr, "\n");

  auto base = [&](int64_t m) -> double {
    for (const auto& r : rows) {
      if (r.max_outstanding == m && r.workers == workers.front() && r.rec) return r.eps;
    }
    return 0;
  };
  std::printf("sluice-perf pipeline%s: Distribute(FromTensors.Repeat.Map(perf_burn)), %s, "
              "parallel_epochs\n",
              quick ? " --quick" : "", t.name.c_str());
  std::printf("machine: %s\n", machine.Describe().c_str());
  std::printf("work per element: %lld perf_burn rounds = %.0f us on one cpu here "
              "(local, one thread: %.0f elements/s)\n",
              static_cast<long long>(burn.rounds), burn.us_per_element, local_eps);
  std::printf("%7s %9s %11s %9s %11s %14s\n", "workers", "max_out", "elements/s", "speedup",
              "x local", "client us/elem");
  std::vector<std::string> row_json;
  for (const auto& r : rows) {
    JsonObject j;
    j.Add("workers", r.workers).Add("max_outstanding_requests", r.max_outstanding);
    if (!r.rec) {
      std::printf("%7d %9lld  FAILED: %s\n", r.workers, static_cast<long long>(r.max_outstanding),
                  r.error.substr(0, 200).c_str());
      row_json.push_back(j.Add("error", r.error).str());
      continue;
    }
    const double b = base(r.max_outstanding);
    const double speedup = b > 0 ? r.eps / b : std::nan("");
    std::printf("%7d %9lld %11s %9s %11s %14s\n", r.workers,
                static_cast<long long>(r.max_outstanding), Num(r.eps, 0).c_str(),
                Times(speedup).c_str(), Times(r.eps / local_eps).c_str(),
                Num(r.client_cpu_us_per_element, 1).c_str());
    row_json.push_back(j.Add("elements", static_cast<int64_t>(RecordNumber(*r.rec, "elements")))
                           .Add("seconds", RecordNumber(*r.rec, "seconds"))
                           .Add("elements_per_s", r.eps)
                           .Add("speedup_vs_first_worker_count", speedup)
                           .Add("ratio_vs_local_one_thread", r.eps / local_eps)
                           .Add("client_cpu_us_per_element", r.client_cpu_us_per_element)
                           .str());
  }
  std::printf("speedup = elements/s over the %d-worker row with the same max_outstanding; "
              "x local = over one local thread running the same map. Workers, the client "
              "and their progress threads share this machine's %d cpus, so growth stops near "
              "%d workers.\n",
              workers.front(), machine.nproc, machine.nproc);
  std::vector<std::string> notes;
  if (!a.common.plot_path.empty()) {
    std::string s = absl::StrCat(
        GnuplotPngHeader(a.common.plot_path, 900, 600), "set title ", JsonQuote("sluice-perf pipeline: elements/s vs worker processes"),
        "\nset xlabel 'worker processes'\nset ylabel 'elements/s'\nset key left top\nset grid\n"
        "set xtics 1\nset yrange [0:*]\n");
    std::vector<std::string> plots;
    for (size_t i = 0; i < mors.size(); ++i) {
      absl::StrAppend(&s, "$d", i, " << EOD\n");
      for (const auto& r : rows) {
        if (r.max_outstanding == mors[i] && r.rec) absl::StrAppend(&s, r.workers, " ", r.eps, "\n");
      }
      absl::StrAppend(&s, "EOD\n");
      plots.push_back(absl::StrCat("$d", i, " using 1:2 with linespoints lw 2 title ",
                                   JsonQuote(absl::StrCat("max_outstanding_requests=", mors[i]))));
    }
    plots.push_back(absl::StrCat(local_eps, "*x with lines dt 2 title 'ideal (local rate x workers)'"));
    absl::StrAppend(&s, "plot ", absl::StrJoin(plots, ", \\\n     "), "\n");
    std::string note;
    absl::Status st = RunGnuplot(s, a.common.plot_path, &note);
    notes.push_back(st.ok() ? note : OneLine(st));
  }
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  if (!a.common.json_path.empty()) {
    std::vector<std::string> note_json;
    for (const auto& n : notes) note_json.push_back(JsonQuote(n));
    std::string json = absl::StrCat(
        "{\n  \"tool\": \"sluice-perf\",\n  \"mode\": \"pipeline\",\n  \"quick\": ",
        quick ? "true" : "false", ",\n  \"command\": ", JsonQuote(command),
        ",\n  \"machine\": ", machine.Json(), ",\n  \"transport\": ", JsonQuote(t.name),
        ",\n  \"burn_rounds\": ", burn.rounds, ",\n  \"us_per_element_local\": ",
        burn.us_per_element, ",\n  \"rows\": ", JsonArrayLines(row_json, "  "),
        ",\n  \"notes\": ", JsonArrayLines(note_json, "  "), "\n}\n");
    SLUICE_RETURN_IF_ERROR(WriteFile(a.common.json_path, json));
  }
  if (any_failed) {
    scratch.Keep();
    return absl::InternalError(
        absl::StrCat("some measurements failed; logs kept in ", scratch.path()));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"sluice-perf: the sluice perf suite (transport ceilings and pipeline scaling)"};
  app.require_subcommand(1);

  TransportArgs ta;
  CLI::App* transport = app.add_subcommand(
      "transport", "pre-built elements of each size over ucx-tcp, ucx-shm and grpc, with ceilings");
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
  transport->add_option("--latency_elements", ta.latency_elements,
                        "Next() calls timed in the latency pass (0 skips it)");
  transport->add_flag("--no_ceilings", ta.no_ceilings, "skip ucx_perftest");
  transport->add_option("--ucx_perftest", ta.ucx_perftest, "ucx_perftest binary (default: PATH)");

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

  // Internal: one measuring client (see the process model at the top).
  ClientOptions co;
  std::string out;
  CLI::App* client = app.add_subcommand("client", "");
  client->group("");  // hidden from --help
  client->add_option("--service", co.service)->required();
  client->add_option("--protocol", co.protocol);
  client->add_option("--workload", co.workload);
  client->add_option("--arg", co.arg);
  client->add_option("--max_outstanding_requests", co.max_outstanding_requests);
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
  const std::string command = CommandLine(argc, argv);
  absl::Status s;
  if (client->parsed()) {
    absl::StatusOr<Record> r = RunClient(co);
    s = r.ok() ? WriteFile(out, FormatRecord(*r)) : r.status();
  } else {
    InstallChildCleanupOnSignal();
    s = transport->parsed() ? RunTransport(ta, command) : RunPipeline(pa, command);
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
