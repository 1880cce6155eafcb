// sluice-perf transport: one client pulls pre-built elements of each size
// over ucx-tcp, ucx-shm and grpc; the same run measures the ceilings
// (ucx_perftest on the same UCX_TLS, single-thread memcpy) and reports each
// figure as a ratio of its ceiling and of the gRPC path. Beside each UCX row
// the same pull from Python (perf/python_client.py, the `sluice` package,
// against the same workers, right after the C++ client), and at the end
// torch's DataLoader handing pre-built tensors of each size to its main
// process (perf/torch_transport.py). See docs/perf.md.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "sluice/dataplane/ucx_runtime.h"

namespace sluice::perf {
namespace {

constexpr double kPerftestMB = 1024.0 * 1024.0;  // ucx_perftest's "MB/s" are MiB/s

// ---- ucx_perftest -------------------------------------------------------------

struct PerftestResult {
  double gb_per_s = 0;
  double msg_per_s = 0;
};

// One ucx_perftest run (server and client processes on 127.0.0.1, a free
// port) with UCX_TLS=`tls` and sluice's own UCX settings (SluiceUcxDefaults:
// with them UCX 1.13 keeps shared memory under peer error handling). Parses
// the client's "Final:" line. With `peer_errors` both sides run with -e
// (endpoints with peer error handling), as sluice's endpoints are: UCX then
// selects the same transports for both. Without it, UCX may pick transports
// sluice cannot use safely: the raw ceiling.
absl::StatusOr<PerftestResult> RunPerftest(const std::string& binary, const std::string& test,
                                           int64_t size, int64_t iters, const std::string& tls,
                                           bool peer_errors, const ScratchDir& scratch,
                                           const std::string& name) {
  std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", tls}};
  for (const auto& [k, v] : internal::ucx::SluiceUcxDefaults(tls)) {
    if (std::getenv(absl::StrCat("UCX_", k).c_str()) == nullptr) {
      env.emplace_back(absl::StrCat("UCX_", k), v);
    }
  }
  const std::vector<std::string> e = peer_errors ? std::vector<std::string>{"-e"}
                                                 : std::vector<std::string>{};
  const int64_t warmup = std::clamp<int64_t>(iters / 10, 2, 2000);
  absl::Status last = absl::UnknownError("not run");
  for (int attempt = 0; attempt < 3; ++attempt) {
    SLUICE_ASSIGN_OR_RETURN(int port, PickFreeLoopbackPort());
    ChildProcess server(name + "-server", scratch.File(name + "-server.log"));
    std::vector<std::string> server_args = {"-p", absl::StrCat(port)};
    server_args.insert(server_args.end(), e.begin(), e.end());
    SLUICE_RETURN_IF_ERROR(server.Start(binary, server_args, env));
    // The client fails at once if the server is not listening yet: retry.
    for (int tries = 0; tries < 20; ++tries) {
      absl::SleepFor(absl::Milliseconds(tries == 0 ? 100 : 150));
      if (server.TryReap()) break;
      ChildProcess client(name, scratch.File(name + ".log"));
      std::vector<std::string> client_args = {"127.0.0.1", "-p", absl::StrCat(port)};
      client_args.insert(client_args.end(), e.begin(), e.end());
      for (const std::string& arg : {std::string("-t"), test, std::string("-s"),
                                     absl::StrCat(size), std::string("-n"), absl::StrCat(iters),
                                     std::string("-w"), absl::StrCat(warmup)}) {
        client_args.push_back(arg);
      }
      SLUICE_RETURN_IF_ERROR(client.Start(binary, client_args, env));
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

// The measuring client of a row.
inline constexpr char kCpp[] = "c++";        // sluice-perf client (measure.cc)
inline constexpr char kPython[] = "python";  // perf/python_client.py
inline constexpr char kTorch[] = "torch";    // perf/torch_transport.py (transport "DataLoader")

// python_client.py and torch_transport.py exit with this when they cannot
// import sluice (or numpy) / torch: their rows are skipped with a note.
constexpr int kPythonImportExit = 3;

struct TransportRow {
  std::string client = kCpp;
  TransportSpec transport;
  int64_t size = 0;
  std::optional<Record> rec;
  std::string error;
  // derived
  double gbps = 0, eps = 0, cpu_s = 0, cpu_per_gb = 0;
  std::optional<double> am_gbps, tag_gbps, memcpy_gbps;
  // ucp_am_bw without -e (no peer error handling): the raw ceiling.
  std::optional<double> am_raw_gbps;
  std::string perftest_error;
};

double Ratio(double a, std::optional<double> b) {
  return b.has_value() && *b > 0 ? a / *b : std::nan("");
}

// The client's UCX receipt counter against its Next() count: they differ
// by the elements buffered at the pass's start and end (at most
// max_outstanding_requests replies, each batching up to
// kMaxElementsPerReply small elements). Anything beyond that came over
// gRPC.
absl::Status CheckArrivedOverUcx(const Record& r, int64_t max_outstanding) {
  if (RecordNumber(r, "ucx_elements_received") +
          static_cast<double>(max_outstanding * kMaxElementsPerReply) <
      RecordNumber(r, "elements")) {
    return absl::InternalError(absl::StrCat(
        "only ", RecordNumber(r, "ucx_elements_received"), " of ", RecordNumber(r, "elements"),
        " elements arrived over UCX (did a worker serve gRPC only?)"));
  }
  return absl::OkStatus();
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
    if (r.client == kCpp && r.transport.protocol == "grpc" && r.size == size && r.rec) return &r;
  }
  return nullptr;
}

// The C++ client's row of the same transport and size as a python row.
const TransportRow* CppRow(const std::vector<TransportRow>& rows, const TransportRow& row) {
  if (row.client != kPython) return nullptr;
  for (const auto& r : rows) {
    if (r.client == kCpp && r.transport.name == row.transport.name && r.size == row.size &&
        r.rec) {
      return &r;
    }
  }
  return nullptr;
}

// Per-element time of `row` minus the C++ row's, microseconds: what the
// Python layer adds to each element. Shown up to kOverheadMaxSize, where the
// per-element cost dominates (above, the difference is transfer-time noise).
constexpr int64_t kOverheadMaxSize = 4096;
double OverheadUs(const TransportRow& row, const TransportRow* cpp) {
  if (cpp == nullptr || row.eps <= 0 || cpp->eps <= 0) return std::nan("");
  return 1e6 / row.eps - 1e6 / cpp->eps;
}

std::string TransportRowJson(const TransportRow& row, const std::vector<TransportRow>& rows) {
  JsonObject j;
  j.Add("client", row.client)
      .Add("transport", row.transport.name)
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
      .Add("client_cpu_s_per_gb", row.cpu_per_gb);
  // Counters of the sluice clients; null for torch's.
  for (const char* key :
       {"client_payload_bytes_copied", "ucx_elements_received", "dedicated_buffer_allocations"}) {
    if (r.count(key) != 0) {
      j.Add(key, static_cast<int64_t>(RecordNumber(r, key)));
    } else {
      j.AddRaw(key, "null");
    }
  }
  j.Add("perftest_am_bw_gb_per_s", row.am_gbps.value_or(std::nan("")))
      .Add("perftest_am_bw_no_e_gb_per_s", row.am_raw_gbps.value_or(std::nan("")))
      .Add("ratio_vs_perftest_no_e", Ratio(row.gbps, row.am_raw_gbps))
      .Add("perftest_tag_bw_gb_per_s", row.tag_gbps.value_or(std::nan("")))
      .Add("ratio_vs_perftest", Ratio(row.gbps, ceiling))
      .Add("memcpy_gb_per_s", row.memcpy_gbps.value_or(std::nan("")))
      .Add("ratio_vs_memcpy", Ratio(row.gbps, row.memcpy_gbps))
      .Add("ratio_vs_grpc", g != nullptr && g != &row ? Ratio(row.gbps, g->gbps) : std::nan(""));
  if (row.client == kPython) {
    const TransportRow* cpp = CppRow(rows, row);
    j.Add("ratio_vs_cpp", cpp != nullptr ? Ratio(row.gbps, cpp->gbps) : std::nan(""))
        .Add("overhead_us_per_element_vs_cpp", OverheadUs(row, cpp));
  }
  if (row.client == kTorch) {
    j.Add("workers_cpu_s", RecordNumber(r, "workers_cpu_s"))
        .Add("num_workers", static_cast<int64_t>(RecordNumber(r, "num_workers")));
  }
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
    if (!row.rec || row.client != kCpp || row.transport.protocol != "ucx") continue;
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
  // The Python layer, against the C++ client of the same run.
  for (const auto& row : rows) {
    const TransportRow* cpp = row.rec ? CppRow(rows, row) : nullptr;
    if (cpp == nullptr) continue;
    const std::string cell = absl::StrCat("python ", row.transport.name, " ", SizeLabel(row.size));
    if (row.size >= (1 << 20) && cpp->gbps > 0) {
      const double r = row.gbps / cpp->gbps;
      t.push_back({absl::StrCat(cell, ": >= 90% of the C++ client's GB/s"), r >= 0.9,
                   absl::StrFormat("%.1f%% (%.2f vs %.2f GB/s)", r * 100, row.gbps, cpp->gbps)});
    }
    if (row.size == 64) {
      const double us = OverheadUs(row, cpp);
      t.push_back({absl::StrCat(cell, ": <= 2 us per element over C++"),
                   std::isfinite(us) && us <= 2.0,
                   absl::StrFormat("%+.2f us (%.2f vs %.2f us per element)", us, 1e6 / row.eps,
                                   1e6 / cpp->eps)});
    }
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
    std::vector<std::pair<int64_t, double>> py;
    for (const auto& r : rows) {
      if (r.transport.name != name || !r.rec) continue;
      if (r.client == kPython) {
        py.emplace_back(r.size, r.gbps);
        continue;
      }
      pts.emplace_back(r.size, r.gbps);
      if (auto c = Ceiling(r)) ceil.emplace_back(r.size, *c);
    }
    add_series("sluice " + name, absl::StrCat("linespoints lw 2 pt 7 lc ", color), pts);
    add_series("sluice from Python, " + name, absl::StrCat("linespoints lw 1 pt 9 lc ", color),
               py);
    add_series("ucx_perftest, " + name + "'s UCX_TLS",
               absl::StrCat("linespoints dt 2 pt 6 lc ", color), ceil);
  }
  std::vector<std::pair<int64_t, double>> torch_pts;
  for (const auto& r : rows) {
    if (r.client == kTorch && r.rec) torch_pts.emplace_back(r.size, r.gbps);
  }
  add_series("torch DataLoader", "linespoints lw 2 pt 5 lc rgb 'orange'", torch_pts);
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
  std::printf("%-6s %-10s %8s %8s %9s %9s %9s %9s %8s %10s %6s %8s %6s %9s %6s %7s %6s %7s\n",
              "client", "transport", "size", "GB/s", "elem/s", "p50 us", "p99 us", "cpuS/GB",
              "copied", "perftest", "%pt", "pt-raw", "%raw", "memcpy", "%mcp", "x grpc", "%c++",
              "+us/el");
  for (const auto& row : rows) {
    if (!row.rec) {
      std::printf("%-6s %-10s %8s  FAILED: %s\n", row.client.c_str(), row.transport.name.c_str(),
                  SizeLabel(row.size).c_str(), row.error.substr(0, 200).c_str());
      continue;
    }
    const Record& r = *row.rec;
    const TransportRow* g = row.client == kTorch ? nullptr : GrpcRow(rows, row.size);
    const TransportRow* cpp = CppRow(rows, row);
    const std::optional<double> c = Ceiling(row);
    std::printf("%-6s %-10s %8s %8s %9s %9s %9s %9s %8s %10s %6s %8s %6s %9s %6s %7s %6s %7s\n",
                row.client.c_str(), row.transport.name.c_str(), SizeLabel(row.size).c_str(),
                Num(row.gbps).c_str(),
                Count(row.eps).c_str(), Num(RecordNumber(r, "lat_p50_us", std::nan("")), 1).c_str(),
                Num(RecordNumber(r, "lat_p99_us", std::nan("")), 1).c_str(),
                Num(row.cpu_per_gb, 2).c_str(),
                Count(RecordNumber(r, "client_payload_bytes_copied", std::nan(""))).c_str(),
                c ? Num(*c).c_str() : "-", Pct(Ratio(row.gbps, c)).c_str(),
                row.am_raw_gbps ? Num(*row.am_raw_gbps).c_str() : "-",
                Pct(Ratio(row.gbps, row.am_raw_gbps)).c_str(),
                row.memcpy_gbps ? Num(*row.memcpy_gbps).c_str() : "-",
                Pct(Ratio(row.gbps, row.memcpy_gbps)).c_str(),
                g != nullptr && g != &row ? Times(Ratio(row.gbps, g->gbps)).c_str() : "-",
                cpp != nullptr ? Pct(Ratio(row.gbps, cpp->gbps)).c_str() : "-",
                cpp != nullptr && row.size <= kOverheadMaxSize
                    ? absl::StrFormat("%+.2f", OverheadUs(row, cpp)).c_str()
                    : "-");
  }
  // Which transports carried the bytes, from UCX's own endpoint description
  // (TransportStats::ucx_lanes: rma_bw carries the rendezvous data).
  std::map<std::string, std::string> lanes;
  for (const auto& row : rows) {
    if (row.client != kCpp || !row.rec || row.transport.protocol != "ucx") continue;
    auto it = row.rec->find("ucx_lanes");
    if (it != row.rec->end() && !it->second.empty()) lanes[row.transport.name] = it->second;
  }
  for (const auto& [name, l] : lanes) std::printf("%s lanes: %s\n", name.c_str(), l.c_str());
}

// A Python child's outcome: its record, or `missing` (it could not import
// what it needs: the rows are skipped with a note, not failed).
struct PythonOutcome {
  absl::StatusOr<std::vector<Record>> records = absl::UnknownError("not run");
  bool missing = false;
  std::string missing_why;
};

// Runs `python script args...` with PYTHONPATH=`python_path` (when set) and
// `t`'s environment; it writes one JSON object per line to `--out`.
PythonOutcome RunPythonChild(const std::string& python, const std::string& script,
                             std::vector<std::string> args, const std::string& python_path,
                             const TransportSpec& t, const ScratchDir& scratch,
                             const std::string& name, double timeout_s) {
  PythonOutcome o;
  const std::string out = scratch.File(name + ".json");
  args.insert(args.begin(), script);
  args.push_back("--out");
  args.push_back(out);
  std::vector<std::pair<std::string, std::string>> env = ChildEnv(t);
  if (!python_path.empty()) {
    env.emplace_back("PYTHONPATH", python_path);
    // A sanitizer build's module needs the ASan runtime loaded first (and
    // CPython's allocations would read as leaks).
    if (std::string_view(SLUICE_PERF_PYTHON_PRELOAD).size() > 0) {
      env.emplace_back("LD_PRELOAD", SLUICE_PERF_PYTHON_PRELOAD);
      env.emplace_back("ASAN_OPTIONS", "detect_leaks=0");
    }
  }
  env.emplace_back("PYTHONDONTWRITEBYTECODE", "1");  // no __pycache__ in the source tree
  ChildProcess child(name, scratch.File(name + ".log"));
  absl::Status st = child.Start(python, args, env);
  absl::StatusOr<int> ws = st.ok() ? child.Wait(absl::Seconds(timeout_s)) : st;
  if (!ws.ok()) {
    o.records = absl::Status(ws.status().code(), absl::StrCat(name, ": ", ws.status().message(),
                                                               "; log:\n", child.LogTail()));
    return o;
  }
  std::vector<Record> records;
  for (absl::string_view line : absl::StrSplit(ReadWholeFile(out), '\n', absl::SkipEmpty())) {
    Record r = ParseJsonRecord(std::string(line));
    if (!r.empty()) records.push_back(std::move(r));
  }
  if (WIFEXITED(*ws) && WEXITSTATUS(*ws) == kPythonImportExit) {
    o.missing = true;
    o.missing_why = !records.empty() && records[0].count("message") != 0
                        ? records[0]["message"]
                        : child.LogTail(300);
    return o;
  }
  if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0 || records.empty()) {
    o.records = absl::InternalError(absl::StrCat(name, ": ", python, " ", script, " ",
                                                 DescribeWaitStatus(*ws), "; log:\n",
                                                 child.LogTail()));
    return o;
  }
  o.records = std::move(records);
  return o;
}

// The python_client.py arguments for the C++ client's options `o`.
std::vector<std::string> PythonClientArgs(const ClientOptions& o) {
  return {"--service", o.service, "--protocol", o.protocol, "--size", absl::StrCat(o.arg),
          "--max_outstanding_requests", absl::StrCat(o.max_outstanding_requests),
          "--warmup_elements", absl::StrCat(o.warmup_elements), "--max_elements",
          absl::StrCat(o.max_elements), "--max_bytes", absl::StrCat(o.max_bytes),
          "--max_seconds", absl::StrCat(o.max_seconds), "--latency_elements",
          absl::StrCat(o.latency_elements), "--latency_seconds", absl::StrCat(o.latency_seconds),
          "--plugin", o.plugin};
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
  // The pass lasts `seconds` unless the elements or bytes run out first. The
  // byte cap used to be 1 GiB quick and 8 GiB full, which ended a 16 MiB
  // pass at 8 GB/s after 0.13 s (quick) or 1 s, whatever --seconds said.
  const int64_t byte_budget =
      a.max_bytes > 0 ? a.max_bytes
                      : std::max<int64_t>(quick ? (int64_t{1} << 30) : (int64_t{8} << 30),
                                          static_cast<int64_t>(seconds * 32e9));
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

  // The python and torch rows: skipped, with a note, when python, its
  // scripts or the sluice package are missing (the torch rows need only torch).
  std::string python_skip, torch_skip;
  std::string python = a.python;
  if (python.find('/') == std::string::npos) python = FindOnPath(python);
  absl::StatusOr<std::string> python_client = LocatePerfScript(
      "python_client.py", "--python_client", a.python_client, SLUICE_PERF_PYTHON_CLIENT);
  absl::StatusOr<std::string> torch_script = LocatePerfScript(
      "torch_transport.py", "--torch_script", a.torch_script, SLUICE_PERF_TORCH_TRANSPORT_SCRIPT);
  absl::StatusOr<std::string> python_path = LocatePythonPackageDir(a.python_path);
  if (a.no_python) {
    python_skip = torch_skip = "--no_python";
  } else if (python.empty() || access(python.c_str(), X_OK) != 0) {
    python_skip = torch_skip = absl::StrCat("no python at ", a.python, " (--python)");
  } else {
    if (!python_client.ok()) python_skip = std::string(python_client.status().message());
    else if (!python_path.ok()) python_skip = std::string(python_path.status().message());
    if (!torch_script.ok()) torch_skip = std::string(torch_script.status().message());
  }

  int ucx_transports = 0;
  for (const auto& t : transports) ucx_transports += t.protocol == "ucx";
  const int steps = static_cast<int>(sizes.size()) *
                        (1 + static_cast<int>(transports.size()) +
                         (python_skip.empty() ? ucx_transports : 0) +
                         (perftest.empty() ? 0
                                           : ucx_transports *
                                                 static_cast<int>(perftest_tests.size()))) +
                    (torch_skip.empty() ? 1 : 0);
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
  // A measured row's record, or its error (reported now), then its derived figures.
  auto finish_row = [&](TransportRow row, absl::StatusOr<Record> rec, const std::string& what) {
    if (rec.ok()) {
      row.rec = *std::move(rec);
    } else {
      row.error = OneLine(rec.status());
      std::fprintf(stderr, "\nsluice-perf: %s %s failed: %s\n", what.c_str(),
                   SizeLabel(row.size).c_str(), std::string(rec.status().message()).c_str());
      any_failed = true;
    }
    Derive(row);
    rows.push_back(std::move(row));
  };
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
      ClientOptions o;  // the python row below runs with the same options
      if (cluster.ok()) {
        o.service = (*cluster)->target();
        o.protocol = t.protocol;
        o.workload = "payload";
        o.arg = size;
        o.max_outstanding_requests = a.max_outstanding;
        // The anchor: gRPC as tf.data service reads it, one element per
        // call (sluice's own gRPC fallback batches; `files` measures it).
        if (t.protocol == "grpc") o.max_elements_per_reply = 1;
        o.warmup_elements = Clamp((int64_t{64} << 20) / size, 2, 200);
        o.max_elements = max_elements;
        o.max_bytes = byte_budget;
        o.max_seconds = seconds;
        o.latency_elements = latency_elements;
        o.latency_seconds = quick ? 0.25 : 1.0;
        o.plugin = bin.plugin;
        rec = RunClientChild(o, t, scratch, absl::StrCat(t.name, "-client-", size),
                             seconds + o.latency_seconds + 120);
        if (rec.ok() && t.protocol == "ucx") {
          if (absl::Status s = CheckArrivedOverUcx(*rec, a.max_outstanding); !s.ok()) rec = s;
        }
        if (!rec.ok()) {
          if (absl::Status alive = (*cluster)->CheckWorkersAlive(); !alive.ok()) {
            rec = absl::Status(rec.status().code(),
                               absl::StrCat(rec.status().message(), "; ", alive.message()));
          }
        }
      }
      finish_row(std::move(row), std::move(rec), t.name);

      // The same pull from Python, against the same workers, right after.
      if (t.protocol != "ucx" || !python_skip.empty()) continue;
      progress.Step(absl::StrCat("python ", t.name, " ", SizeLabel(size)));
      TransportRow py;
      py.client = kPython;
      py.transport = t;
      py.size = size;
      py.memcpy_gbps = memcpy_gbps[size];
      absl::StatusOr<Record> prec = absl::UnknownError("not run");
      if (!cluster.ok()) prec = cluster.status();
      if (cluster.ok()) {
        PythonOutcome out =
            RunPythonChild(python, *python_client, PythonClientArgs(o), *python_path, t, scratch,
                           absl::StrCat("python-", t.name, "-", size),
                           seconds + o.latency_seconds + 120);
        if (out.missing) {
          python_skip = absl::StrCat(python, " cannot import sluice (PYTHONPATH=", *python_path,
                                     "): ", out.missing_why);
          continue;
        }
        prec = out.records.ok() ? absl::StatusOr<Record>(out.records->front())
                                : absl::StatusOr<Record>(out.records.status());
        if (prec.ok()) {
          if (absl::Status s = CheckArrivedOverUcx(*prec, a.max_outstanding); !s.ok()) prec = s;
        }
      }
      finish_row(std::move(py), std::move(prec), "python " + t.name);
    }
    cluster = absl::CancelledError("stopped");  // workers gone before the ceilings run
    if (t.protocol != "ucx" || perftest.empty()) continue;
    for (auto& row : rows) {
      if (row.client != kCpp || row.transport.name != t.name) continue;
      // (test, -e): the -e runs are the ceilings the targets use; am_bw
      // without -e is the raw ceiling beside them.
      std::vector<std::pair<std::string, bool>> runs;
      for (const auto& test : perftest_tests) runs.emplace_back(test, true);
      runs.emplace_back("ucp_am_bw", false);
      for (const auto& [test, peer_errors] : runs) {
        const std::string label = absl::StrCat(test, peer_errors ? " -e" : "");
        progress.Step(absl::StrCat("ucx_perftest ", label, " ", t.name, " ", SizeLabel(row.size)));
        const std::string name = absl::StrCat("perftest-", t.name, "-", test,
                                              peer_errors ? "-e-" : "-", row.size);
        // A short probe sizes the run to about perftest_seconds: its rate
        // here ranges over four orders of magnitude with size and load.
        auto pt = RunPerftest(perftest, test, row.size,
                              Clamp((int64_t{64} << 20) / row.size, 20, 2000), t.ucx_tls,
                              peer_errors, scratch, name + "-probe");
        if (pt.ok()) {
          pt = RunPerftest(perftest, test, row.size,
                           Clamp(static_cast<int64_t>(pt->msg_per_s * perftest_seconds), 20,
                                 quick ? 20000 : 200000),
                           t.ucx_tls, peer_errors, scratch, name);
        }
        if (!pt.ok()) {
          row.perftest_error = OneLine(pt.status());
          continue;
        }
        if (!peer_errors) {
          row.am_raw_gbps = pt->gb_per_s;
        } else {
          (test == "tag_bw" ? row.tag_gbps : row.am_gbps) = pt->gb_per_s;
        }
      }
    }
  }
  // torch's DataLoader, every size in one script run (torch imports once),
  // after the services are gone.
  std::string torch_version;
  if (torch_skip.empty()) {
    progress.Step(absl::StrCat("torch DataLoader num_workers=", a.torch_workers));
    std::vector<std::string> size_list, warmups;
    for (int64_t size : sizes) {
      size_list.push_back(absl::StrCat(size));
      warmups.push_back(absl::StrCat(Clamp((int64_t{64} << 20) / size, 2, 200)));
    }
    const TransportSpec dl{"DataLoader", "torch", ""};
    PythonOutcome out = RunPythonChild(
        python, *torch_script,
        {"--sizes", absl::StrJoin(size_list, ","), "--num_workers", absl::StrCat(a.torch_workers),
         "--warmup_elements", absl::StrJoin(warmups, ","), "--max_elements",
         absl::StrCat(max_elements), "--max_bytes", absl::StrCat(byte_budget), "--max_seconds",
         absl::StrCat(seconds)},
        "", dl, scratch, "torch-transport",
        static_cast<double>(sizes.size()) * (seconds + 30) + 60);
    if (out.missing) {
      torch_skip = absl::StrCat(python, " cannot import torch: ", out.missing_why);
    } else {
      for (int64_t size : sizes) {
        TransportRow row;
        row.client = kTorch;
        row.transport = dl;
        row.size = size;
        row.memcpy_gbps = memcpy_gbps[size];
        if (out.records.ok()) {
          for (const Record& r : *out.records) {
            if (RecordNumber(r, "size", -1) == static_cast<double>(size)) row.rec = r;
          }
          if (row.rec && torch_version.empty()) {
            torch_version = absl::StrCat("torch ", (*row.rec)["torch"], ", DataLoader(batch_size=None, num_workers=",
                                         a.torch_workers, "), ",
                                         (*row.rec)["torch_threads"], " intra-op thread(s)");
          }
        }
        if (!row.rec) {
          row.error = out.records.ok() ? "no result for this size" : OneLine(out.records.status());
          std::fprintf(stderr, "\nsluice-perf: torch DataLoader %s failed: %s\n",
                       SizeLabel(size).c_str(), row.error.c_str());
          any_failed = true;
        }
        Derive(row);
        rows.push_back(std::move(row));
      }
    }
  }
  if (!python_skip.empty() && ucx_transports > 0) {
    notes.push_back(absl::StrCat("python rows skipped: ", python_skip));
  }
  if (!torch_skip.empty()) notes.push_back(absl::StrCat("torch rows skipped: ", torch_skip));
  progress.Finish();

  // ---- report ----
  std::printf("sluice-perf transport%s: one client, %d worker process(es), "
              "max_outstanding_requests=%lld\n",
              quick ? " --quick" : "", a.workers, static_cast<long long>(a.max_outstanding));
  std::printf("machine: %s\n", machine.Describe().c_str());
  std::printf("ucx-tcp: UCX_TLS=tcp; ucx-shm: UCX_TLS=%s; grpc: ElementService.GetElement\n",
              a.shm_tls.c_str());
  PrintTransportTable(rows);
  std::printf(
      "GB/s = 1e9 payload bytes/s delivered into client buffers (timed pass, up to %.1f s per "
      "row, after a warm-up); elem/s likewise. p50/p99 = time of one Next() with "
      "max_outstanding_requests=1 (request round trip + transfer). cpuS/GB = client process CPU "
      "(user+sys, all threads) per GB. copied = TransportStats::client_payload_bytes_copied "
      "during the timed pass. perftest = max of ucx_perftest -e (peer error handling, as "
      "sluice's endpoints) ucp_am_bw and tag_bw on the same UCX_TLS and size, with sluice's UCX settings (%%pt = sluice/perftest); pt-raw = ucp_am_bw without -e, which UCX may serve with transports sluice cannot use safely (%%raw = sluice/pt-raw); memcpy = single-thread memcpy of blocks of "
      "that size through 256 MiB buffers; x grpc = GB/s (= elem/s) ratio to the grpc row of the "
      "same size. grpc = one element per call, as tf.data service reads (max_elements_per_reply "
      "= 1; sluice's own gRPC fallback batches small elements, see `files`).\n",
      seconds);
  std::printf(
      "client: c++ = the sluice-perf client; python = perf/python_client.py (the sluice package "
      "from %s, each element a numpy array) right after the c++ row against the same workers "
      "(%%c++ = its GB/s over the c++ row's; +us/el = 1e6/elem/s minus the c++ row's: what the "
      "Python layer adds per element); torch = perf/torch_transport.py, DataLoader(batch_size="
      "None, num_workers=%d) handing each worker's one pre-built uint8 tensor to the main "
      "process (cpuS/GB: main process only).\n",
      python.c_str(), a.torch_workers);
  if (!torch_version.empty()) std::printf("torch: %s\n", torch_version.c_str());
  // Python's sluice next to torch's DataLoader, size by size.
  std::vector<std::string> versus_json;
  for (int64_t size : sizes) {
    const TransportRow* torch = nullptr;
    std::vector<std::string> cells;
    JsonObject j;
    j.Add("size_bytes", size);
    for (const auto& r : rows) {
      if (r.size != size || !r.rec) continue;
      if (r.client == kTorch) torch = &r;
      if (r.client != kPython) continue;
      cells.push_back(absl::StrFormat("python %s %s GB/s (%s elem/s)", r.transport.name,
                                      Num(r.gbps), Count(r.eps)));
      j.Add(absl::StrCat("python_", r.transport.name, "_gb_per_s"), r.gbps);
    }
    if (torch == nullptr || cells.empty()) continue;
    if (versus_json.empty()) std::printf("sluice from Python vs torch DataLoader:\n");
    double best = 0;
    for (const auto& r : rows) {
      if (r.size == size && r.rec && r.client == kPython) best = std::max(best, r.gbps);
    }
    std::printf("  %8s: %s; torch %s GB/s (%s elem/s); best python / torch %s\n",
                SizeLabel(size).c_str(), absl::StrJoin(cells, ", ").c_str(),
                Num(torch->gbps).c_str(), Count(torch->eps).c_str(),
                Times(Ratio(best, torch->gbps)).c_str());
    versus_json.push_back(j.Add("torch_gb_per_s", torch->gbps)
                              .Add("best_python_over_torch", Ratio(best, torch->gbps))
                              .str());
  }
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
      {"python", JsonQuote(python_skip.empty() ? python : "skipped")},
      {"torch", JsonQuote(torch_version.empty() ? "skipped" : torch_version)},
      {"units", JsonObject()
                    .Add("gb_per_s", "1e9 bytes/s")
                    .Add("latency", "microseconds per Next() with max_outstanding_requests=1")
                    .Add("client_cpu_s_per_gb",
                         "client process CPU seconds (user+sys) per 1e9 payload bytes")
                    .str()}};
  std::vector<std::string> row_json;
  for (const auto& row : rows) row_json.push_back(TransportRowJson(row, rows));
  report.sections = {
      {"rows", row_json}, {"targets", target_json}, {"python_vs_torch", versus_json}};
  report.notes = notes;
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
