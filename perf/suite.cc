#include "perf/suite.h"

#include <limits.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sluice/core/status.h"

namespace sluice::perf {

// ---- process accounting -------------------------------------------------------

double SelfCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

absl::StatusOr<double> ProcCpuSeconds(int pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  const std::string stat = ReadWholeFile(path);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  // After "pid (comm)": state is field 3, utime field 14, stime field 15.
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  if (f.size() < 13) return absl::InternalError(absl::StrCat("unexpected ", path, ": ", stat));
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::strtod(f[11].c_str(), nullptr) + std::strtod(f[12].c_str(), nullptr)) / ticks;
}

namespace {
// The number after `key` on the first line of `path` that starts with it,
// times `scale`.
absl::StatusOr<int64_t> ProcField(const std::string& path, const std::string& key,
                                  int64_t scale) {
  std::istringstream in(ReadWholeFile(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      return static_cast<int64_t>(std::strtoll(line.c_str() + key.size(), nullptr, 10)) * scale;
    }
  }
  return absl::NotFoundError(absl::StrCat("no ", key, " in ", path));
}
}  // namespace

absl::StatusOr<int64_t> ProcPeakRss(const std::string& pid) {
  return ProcField(absl::StrCat("/proc/", pid, "/status"), "VmHWM:", 1024);
}
absl::StatusOr<int64_t> ProcRss(const std::string& pid) {
  return ProcField(absl::StrCat("/proc/", pid, "/status"), "VmRSS:", 1024);
}
absl::StatusOr<int64_t> ProcWriteBytes(int pid) {
  return ProcField(absl::StrCat("/proc/", pid, "/io"), "write_bytes:", 1);
}

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
                                          absl::StrJoin(candidates, ", "), ")",
                                          flag_name.empty() ? "" : "; pass ", flag_name));
}


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

absl::StatusOr<std::string> LocateSlowSyncLibrary() {
  const std::string dir = SelfDir();
  return Locate("the slow-sync library", "", "",
                {dir + "/libsluice_perf_slow_sync.so", dir + "/../lib/libsluice_perf_slow_sync.so",
                 dir + "/../" SLUICE_PERF_INSTALL_LIBDIR "/libsluice_perf_slow_sync.so",
                 SLUICE_PERF_BUILD_SLOW_SYNC});
}

absl::StatusOr<std::string> LocateDispatcherBinary(const std::string& flag) {
  const std::string dir = SelfDir();
  return Locate("the sluice-dispatcher binary", "--dispatcher_binary", flag,
                {dir + "/sluice-dispatcher", dir + "/../tools/sluice-dispatcher",
                 SLUICE_PERF_BUILD_DISPATCHER});
}

absl::StatusOr<std::string> LocatePythonPackageDir(const std::string& flag) {
  if (!flag.empty()) {
    if (access((flag + "/sluice/__init__.py").c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("--python_path ", flag,
                                              " holds no sluice package (sluice/__init__.py)"));
    }
    return flag;
  }
  const std::vector<std::string> dirs = {SelfDir() + "/../" SLUICE_PERF_PYTHON_INSTALL_DIR,
                                         SLUICE_PERF_BUILD_PYTHON_DIR};
  std::vector<std::string> looked;
  for (const auto& d : dirs) {
    if (d.empty()) continue;
    if (access((d + "/sluice/__init__.py").c_str(), R_OK) == 0) return d;
    looked.push_back(d);
  }
  return absl::NotFoundError(absl::StrCat(
      "the sluice Python package is not built (configure with -DSLUICE_BUILD_PYTHON=ON and "
      "build sluice_python) or not found (looked in ",
      absl::StrJoin(looked, ", "), "); pass --python_path"));
}

absl::StatusOr<std::string> LocatePerfScript(const std::string& name, const std::string& flag_name,
                                             const std::string& flag,
                                             const std::string& source_path) {
  return Locate(absl::StrCat("perf/", name), flag_name, flag,
                {SelfDir() + "/" + name,
                 SelfDir() + "/../" SLUICE_PERF_INSTALL_DATADIR "/sluice/" + name, source_path});
}

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

Record ParseJsonRecord(const std::string& line) {
  Record r;
  size_t i = line.find('{');
  if (i == std::string::npos) return r;
  auto skip_space = [&] {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
  };
  // A string without escapes (the children's keys and words have none).
  auto read_string = [&](std::string* out) {
    if (i >= line.size() || line[i] != '"') return false;
    const size_t end = line.find('"', i + 1);
    if (end == std::string::npos) return false;
    *out = line.substr(i + 1, end - i - 1);
    i = end + 1;
    return true;
  };
  ++i;
  while (true) {
    skip_space();
    std::string key, value;
    if (!read_string(&key)) break;
    skip_space();
    if (i >= line.size() || line[i] != ':') break;
    ++i;
    skip_space();
    if (i < line.size() && line[i] == '"') {
      if (!read_string(&value)) break;
      r[key] = value;
    } else if (i < line.size() && (line[i] == '{' || line[i] == '[')) {
      int depth = 0;  // skipped
      for (; i < line.size(); ++i) {
        depth += line[i] == '{' || line[i] == '[';
        depth -= line[i] == '}' || line[i] == ']';
        if (depth == 0) break;
      }
      ++i;
    } else {
      const size_t end = line.find_first_of(",}", i);
      value = line.substr(i, end == std::string::npos ? std::string::npos : end - i);
      while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) {
        value.pop_back();
      }
      r[key] = value == "true" ? "1" : value == "false" ? "0" : value == "null" ? "nan" : value;
      i = end == std::string::npos ? line.size() : end;
    }
    skip_space();
    if (i >= line.size() || line[i] != ',') break;
    ++i;
  }
  return r;
}

absl::StatusOr<Record> RunClientChild(const ClientOptions& o, const TransportSpec& t,
                                      const ScratchDir& scratch, const std::string& name,
                                      double timeout_s) {
  const std::string out = scratch.File(name + ".record");
  std::vector<std::string> args = {
      "client", "--service", o.service, "--protocol", o.protocol, "--workload", o.workload,
      "--compression", o.compression,
      "--max_elements_per_reply", absl::StrCat(o.max_elements_per_reply),
      "--arg", absl::StrCat(o.arg), "--max_outstanding_requests",
      absl::StrCat(o.max_outstanding_requests), "--warmup_elements",
      absl::StrCat(o.warmup_elements), "--max_elements", absl::StrCat(o.max_elements),
      "--max_bytes", absl::StrCat(o.max_bytes), "--max_seconds", absl::StrCat(o.max_seconds),
      "--latency_elements", absl::StrCat(o.latency_elements), "--latency_seconds",
      absl::StrCat(o.latency_seconds), "--plugin", o.plugin, "--out", out};
  SLUICE_ASSIGN_OR_RETURN(Record r, RunRecordChild(args, ChildEnv(t), out, scratch, name,
                                                   timeout_s));
  // A row that asked for UCX is carried by it, or it fails: a worker whose
  // UCX data plane could not start serves over gRPC, the client follows it
  // with a warning in its log, and the row would report gRPC's figures
  // under UCX's name.
  if (o.protocol == "ucx" && RecordNumber(r, "wire_elements") > 0 &&
      RecordNumber(r, "ucx_elements_received") == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": asked for ucx, but none of its ", RecordNumber(r, "wire_elements"),
        " elements came over UCX (a worker whose UCX data plane failed serves over gRPC; "
        "the workers' and the client's logs say why: --keep_logs)"));
  }
  return r;
}

absl::StatusOr<Record> RunRecordChild(const std::vector<std::string>& args,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      const std::string& out, const ScratchDir& scratch,
                                      const std::string& name, double timeout_s) {
  ChildProcess child(name, scratch.File(name + ".log"));
  SLUICE_RETURN_IF_ERROR(child.Start(SelfPath(), args, env));
  absl::StatusOr<int> st = child.Wait(absl::Seconds(timeout_s));
  if (!st.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(name, ": did not finish within ", timeout_s,
                                                    " s; log:\n", child.LogTail()));
  }
  if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
    return absl::InternalError(
        absl::StrCat(name, ": ", DescribeWaitStatus(*st), "; log:\n", child.LogTail()));
  }
  Record r = ParseRecord(ReadWholeFile(out));
  if (r.empty()) return absl::InternalError(absl::StrCat(name, ": wrote no results"));
  return r;
}

std::string OneLine(const absl::Status& s) {
  std::string m(s.message());
  std::replace(m.begin(), m.end(), '\n', ' ');
  if (m.size() > 300) m = m.substr(0, 300) + "...";
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", m);
}

ClusterOptions ClusterFor(const Binaries& bin, const CommonArgs& common, const TransportSpec& t,
                          int workers, const ScratchDir& scratch, std::string name) {
  ClusterOptions co;
  co.num_workers = workers;
  co.worker_binary = bin.worker;
  co.plugin = bin.plugin;
  co.protocol = t.protocol;
  co.task_buffer_elements = common.task_buffer_elements;
  co.worker_threads = common.worker_threads;
  co.env = ChildEnv(t);
  co.scratch_dir = scratch.path();
  co.name = std::move(name);
  return co;
}

std::string Num(double v, int precision) {
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

absl::Status FinishRun(const CommonArgs& common, const Report& report, bool any_failed,
                       ScratchDir& scratch) {
  for (const auto& n : report.notes) std::printf("note: %s\n", n.c_str());
  const double load_at_end = LoadAverage1m();
  std::printf("load average: %.2f at start, %.2f at end (on %d cpus)\n",
              report.machine.load_average_1m, load_at_end, report.machine.nproc);
  if (!common.json_path.empty()) {
    std::string json = absl::StrCat("{\n  \"tool\": \"sluice-perf\",\n  \"mode\": ",
                                    JsonQuote(report.mode), ",\n  \"quick\": ",
                                    common.quick ? "true" : "false", ",\n  \"command\": ",
                                    JsonQuote(report.command), ",\n  \"machine\": ",
                                    report.machine.Json(),
                                    ",\n  \"load_average_1m_at_end\": ", load_at_end);
    for (const auto& [key, value] : report.fields) {
      absl::StrAppend(&json, ",\n  ", JsonQuote(key), ": ", value);
    }
    for (const auto& [key, objects] : report.sections) {
      absl::StrAppend(&json, ",\n  ", JsonQuote(key), ": ", JsonArrayLines(objects, "  "));
    }
    std::vector<std::string> notes;
    for (const auto& n : report.notes) notes.push_back(JsonQuote(n));
    absl::StrAppend(&json, ",\n  \"notes\": ", JsonArrayLines(notes, "  "), "\n}\n");
    SLUICE_RETURN_IF_ERROR(WriteFile(common.json_path, json));
  }
  if (any_failed) {
    scratch.Keep();
    return absl::InternalError(
        absl::StrCat("some measurements failed; logs kept in ", scratch.path()));
  }
  return absl::OkStatus();
}

}  // namespace sluice::perf
