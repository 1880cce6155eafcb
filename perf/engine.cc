// sluice-perf engine: the pipeline engine side by side with its anchors in
// one run (docs/perf.md):
//  1. expressions on a 16 MiB float32 tensor vs the same plain C++ loop
//     (and x + 0.0f vs memcpy), per element, into a fresh output each time;
//  2. a CPU-bound Map (perf_burn) in this process with num_parallel_calls
//     1, 2 and kAutotune;
//  3. fresh 16 MiB elements (Map(x + 0) on the worker) vs pre-built ones
//     from the same 2 worker processes, over each UCX transport.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "perf/suite.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/thread_pool.h"

namespace sluice::perf {
namespace {

using Clock = std::chrono::steady_clock;
using expr::x;

constexpr int64_t kTensorBytes = int64_t{16} << 20;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

// The median of `reps` timings of `step` (seconds each), after one warm-up.
absl::StatusOr<double> MedianSeconds(int reps, const std::function<absl::Status()>& step) {
  SLUICE_RETURN_IF_ERROR(step());
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const Clock::time_point t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(step());
    t.push_back(Since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One element of `it`, which must not end.
absl::Status Pull(Iterator& it) {
  SLUICE_ASSIGN_OR_RETURN(auto e, it.Next());
  if (!e.has_value()) return absl::InternalError("the pipeline ended");
  return absl::OkStatus();
}

struct ExprRow {
  std::string name, anchor;
  double engine_ms = 0, anchor_ms = 0;
};

absl::StatusOr<std::vector<ExprRow>> MeasureExpressions(int reps) {
  const int64_t n = kTensorBytes / 4;
  SLUICE_ASSIGN_OR_RETURN(Tensor in, Tensor::Allocate(DType::kFloat32, TensorShape({n})));
  float* src = reinterpret_cast<float*>(in.mutable_data());
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 1000) * 0.25f;
  Dataset source = Dataset::FromTensors({Element{in}}).Repeat();
  volatile float sink = 0;
  // Each anchor writes a fresh buffer per element, as the engine does.
  auto loop = [&]() -> absl::Status {
    std::unique_ptr<float[]> out(new float[n]);
    for (int64_t i = 0; i < n; ++i) out[i] = src[i] * 2.0f + 1.0f;
    sink = out[n - 1];
    return absl::OkStatus();
  };
  auto copy = [&]() -> absl::Status {
    std::unique_ptr<float[]> out(new float[n]);
    std::memcpy(out.get(), src, static_cast<size_t>(kTensorBytes));
    sink = out[n - 1];
    return absl::OkStatus();
  };
  std::vector<ExprRow> rows;
  struct Case {
    const char* name;
    expr::Expr e;
    const char* anchor;
    std::function<absl::Status()> anchor_step;
  };
  const Case cases[] = {{"x * 2.0f + 1.0f", x * 2.0f + 1.0f, "plain loop", loop},
                        {"x + 0.0f", x + 0.0f, "memcpy", copy}};
  for (const Case& c : cases) {
    SLUICE_ASSIGN_OR_RETURN(auto it, source.Map(c.e).MakeIterator());
    ExprRow r;
    r.name = c.name;
    r.anchor = c.anchor;
    SLUICE_ASSIGN_OR_RETURN(double engine, MedianSeconds(reps, [&] { return Pull(*it); }));
    SLUICE_ASSIGN_OR_RETURN(double anchor, MedianSeconds(reps, c.anchor_step));
    r.engine_ms = engine * 1e3;
    r.anchor_ms = anchor * 1e3;
    rows.push_back(r);
  }
  return rows;
}

struct MapRow {
  int64_t calls = 1;
  double eps = 0, cpu_per_element_us = 0;
};

absl::StatusOr<MapRow> MeasureMap(int64_t rounds, int64_t calls, double seconds) {
  Dataset ds = Dataset::FromTensors({Element{Tensor::Scalar<int64_t>(rounds)}})
                   .Repeat()
                   .Map(Udf("perf_burn"), calls);
  SLUICE_RETURN_IF_ERROR(ds.status());
  SLUICE_ASSIGN_OR_RETURN(auto it, ds.MakeIterator());
  for (int i = 0; i < 8; ++i) SLUICE_RETURN_IF_ERROR(Pull(*it));  // warm-up (kAutotune samples)
  const double cpu0 = ProcessCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  int64_t count = 0;
  while (Since(t0) < seconds) {
    SLUICE_RETURN_IF_ERROR(Pull(*it));
    ++count;
  }
  MapRow r;
  r.calls = calls;
  r.eps = count / Since(t0);
  r.cpu_per_element_us = (ProcessCpuSeconds() - cpu0) * 1e6 / std::max<int64_t>(1, count);
  return r;
}

struct FreshRow {
  std::string transport;
  double prebuilt_gbs = 0, fresh_gbs = 0;
  std::string error;
};

}  // namespace

absl::Status RunEngine(const EngineArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  std::vector<std::string> transports = a.transports;
  if (transports.empty()) {
    transports = quick ? std::vector<std::string>{"ucx-shm"}
                       : std::vector<std::string>{"ucx-shm", "ucx-tcp"};
  }
  const double seconds = a.seconds > 0 ? a.seconds : quick ? 1.0 : 3.0;
  const int reps = quick ? 9 : 31;
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf"));
  if (a.common.keep_logs) scratch.Keep();
  Progress progress("engine", 2 + 3 + static_cast<int>(transports.size()));
  bool any_failed = false;

  progress.Step("expressions on 16 MiB float32");
  SLUICE_ASSIGN_OR_RETURN(std::vector<ExprRow> exprs, MeasureExpressions(reps));

  progress.Step("calibrating perf_burn");
  SLUICE_ASSIGN_OR_RETURN(BurnCalibration burn, CalibrateBurn(bin.plugin, a.work_us));
  std::vector<MapRow> maps;
  for (int64_t calls : {int64_t{1}, int64_t{2}, kAutotune}) {
    progress.Step(absl::StrCat("Map(perf_burn, num_parallel_calls=",
                               calls == kAutotune ? std::string("kAutotune") : absl::StrCat(calls), ")"));
    SLUICE_ASSIGN_OR_RETURN(MapRow r, MeasureMap(burn.rounds, calls, seconds));
    maps.push_back(r);
  }

  std::vector<FreshRow> fresh;
  for (const std::string& name : transports) {
    progress.Step(absl::StrCat("fresh vs pre-built 16 MiB elements, 2 workers, ", name));
    FreshRow row;
    row.transport = name;
    absl::StatusOr<TransportSpec> t = ParseTransport(name, a.shm_tls);
    absl::Status st = t.status();
    if (st.ok()) {
      absl::StatusOr<std::unique_ptr<Cluster>> cluster =
          Cluster::Start(ClusterFor(bin, a.common, *t, a.workers, scratch, "engine-" + name));
      st = cluster.status();
      for (const char* workload : {"payload", "fresh"}) {
        if (!st.ok()) break;
        ClientOptions o;
        o.service = (*cluster)->target();
        o.protocol = t->protocol;
        o.workload = workload;
        o.arg = kTensorBytes;
        o.max_outstanding_requests = 8;
        o.warmup_elements = 8;
        o.max_elements = int64_t{1} << 40;
        o.max_bytes = int64_t{1} << 60;
        o.max_seconds = seconds;
        o.plugin = bin.plugin;
        absl::StatusOr<Record> rec = RunClientChild(
            o, *t, scratch, absl::StrCat("engine-", workload, "-", name), seconds + 120);
        st = rec.status();
        if (!st.ok()) break;
        const double secs = RecordNumber(*rec, "seconds");
        const double gbs = secs > 0 ? RecordNumber(*rec, "bytes") / secs / kGB : 0;
        (std::string(workload) == "fresh" ? row.fresh_gbs : row.prebuilt_gbs) = gbs;
      }
    }
    if (!st.ok()) {
      row.error = OneLine(st);
      std::fprintf(stderr, "\nsluice-perf: engine fresh elements over %s failed: %s\n",
                   name.c_str(), std::string(st.message()).c_str());
      any_failed = true;
    }
    fresh.push_back(row);
  }
  progress.Finish();

  std::printf("sluice-perf engine%s\n", quick ? " --quick" : "");
  std::printf("machine: %s; thread pool: %d thread(s)\n", machine.Describe().c_str(),
              ThreadPoolSize());
  std::printf("\n1. expressions: Map over FromTensors({float32[%lld]}).Repeat(), a fresh 16 MiB "
              "output per element, median of %d\n",
              static_cast<long long>(kTensorBytes / 4), reps);
  std::printf("%-18s %10s %12s %10s %9s\n", "expression", "engine ms", "anchor", "anchor ms",
              "ratio");
  std::vector<std::string> expr_json;
  for (const auto& r : exprs) {
    std::printf("%-18s %10s %12s %10s %9s\n", r.name.c_str(), Num(r.engine_ms, 2).c_str(),
                r.anchor.c_str(), Num(r.anchor_ms, 2).c_str(),
                Times(r.engine_ms / r.anchor_ms).c_str());
    expr_json.push_back(JsonObject()
                            .Add("expression", r.name)
                            .Add("engine_ms", r.engine_ms)
                            .Add("anchor", r.anchor)
                            .Add("anchor_ms", r.anchor_ms)
                            .Add("ratio", r.engine_ms / r.anchor_ms)
                            .str());
  }
  std::printf("\n2. Map(perf_burn) in this process: %lld rounds = %.0f us per call on one cpu\n",
              static_cast<long long>(burn.rounds), burn.us_per_element);
  std::printf("%-20s %12s %9s %16s\n", "num_parallel_calls", "elements/s", "speedup",
              "cpu us/element");
  std::vector<std::string> map_json;
  const double base = maps.empty() ? 0 : maps.front().eps;
  for (const auto& r : maps) {
    const std::string calls = r.calls == kAutotune ? "kAutotune" : absl::StrCat(r.calls);
    std::printf("%-20s %12s %9s %16s\n", calls.c_str(), Num(r.eps, 0).c_str(),
                Times(base > 0 ? r.eps / base : std::nan("")).c_str(),
                Num(r.cpu_per_element_us, 0).c_str());
    map_json.push_back(JsonObject()
                           .Add("num_parallel_calls", calls)
                           .Add("elements_per_s", r.eps)
                           .Add("speedup", base > 0 ? r.eps / base : 0)
                           .Add("cpu_us_per_element", r.cpu_per_element_us)
                           .str());
  }
  std::printf("\n3. 16 MiB elements from %d worker process(es), max_outstanding_requests 8: "
              "pre-built (perf_payload) vs fresh (perf_payload then Map(x + 0) on the worker)\n",
              a.workers);
  std::printf("%-10s %14s %12s %9s\n", "transport", "pre-built GB/s", "fresh GB/s", "fresh %");
  std::vector<std::string> fresh_json;
  for (const auto& r : fresh) {
    JsonObject j;
    j.Add("transport", r.transport);
    if (!r.error.empty()) {
      std::printf("%-10s  FAILED: %s\n", r.transport.c_str(), r.error.substr(0, 200).c_str());
      fresh_json.push_back(j.Add("error", r.error).str());
      continue;
    }
    std::printf("%-10s %14s %12s %9s\n", r.transport.c_str(), Num(r.prebuilt_gbs, 2).c_str(),
                Num(r.fresh_gbs, 2).c_str(), Pct(r.fresh_gbs / r.prebuilt_gbs).c_str());
    fresh_json.push_back(j.Add("prebuilt_gb_per_s", r.prebuilt_gbs)
                             .Add("fresh_gb_per_s", r.fresh_gbs)
                             .Add("fresh_ratio", r.fresh_gbs / r.prebuilt_gbs)
                             .str());
  }
  Report report;
  report.mode = "engine";
  report.command = command;
  report.machine = machine;
  report.fields = {{"thread_pool_threads", absl::StrCat(ThreadPoolSize())},
                   {"burn_rounds", absl::StrCat(burn.rounds)},
                   {"burn_us_per_call", absl::StrCat(burn.us_per_element)}};
  report.sections = {{"expressions", expr_json}, {"map", map_json}, {"fresh", fresh_json}};
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
