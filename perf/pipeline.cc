// sluice-perf pipeline: Distribute throughput of a CPU-bound map
// (perf_burn) on 1..N worker processes and several max_outstanding_requests.
// See docs/perf.md.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "perf/suite.h"
#include "sluice/core/status.h"

namespace sluice::perf {
namespace {

struct PipelineRow {
  int workers = 0;
  int64_t max_outstanding = 0;
  std::optional<Record> rec;
  std::string error;
  double eps = 0;
  double client_cpu_us_per_element = 0;
};

// The least CPU a client can spend per element on this machine when
// replies come one at a time, `gap_us` apart: one thread sleeping in poll()
// on a loopback TCP socket, woken by each reply, reading it (recv) and
// sending the next request (send); no data plane, no second thread. In
// this process (its own threads), measured by RUSAGE_THREAD. NaN when the
// socket setup fails.
double WakeupFloorUs(double gap_us, int n) {
  auto thread_cpu_us = [] {
    rusage r{};
    getrusage(RUSAGE_THREAD, &r);
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 + r.ru_utime.tv_usec +
           r.ru_stime.tv_usec;
  };
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return std::nan("");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return std::nan("");
  }
  constexpr size_t kRequest = 100, kReply = 200;  // about a request and a small reply
  const int one = 1;
  std::thread server([&] {
    const int s = accept(listener, nullptr, nullptr);
    if (s < 0) return;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[kReply] = {};
    for (int i = 0; i < n; ++i) {
      if (recv(s, buf, kRequest, MSG_WAITALL) != static_cast<ssize_t>(kRequest)) break;
      std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(gap_us));
      if (send(s, buf, kReply, MSG_NOSIGNAL) != static_cast<ssize_t>(kReply)) break;
    }
    close(s);
  });
  double floor_us = std::nan("");
  const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c >= 0 && connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[kReply] = {};
    const double cpu0 = thread_cpu_us();
    int done = 0;
    bool ok = send(c, buf, kRequest, MSG_NOSIGNAL) == static_cast<ssize_t>(kRequest);
    for (; ok && done < n; ++done) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 10000) != 1) break;
      ok = recv(c, buf, kReply, MSG_WAITALL) == static_cast<ssize_t>(kReply);
      if (ok && done + 1 < n) {
        ok = send(c, buf, kRequest, MSG_NOSIGNAL) == static_cast<ssize_t>(kRequest);
      }
    }
    if (ok && done == n) floor_us = (thread_cpu_us() - cpu0) / n;
  }
  if (c >= 0) close(c);  // ends the server's recv
  shutdown(listener, SHUT_RDWR);  // ends its accept, had the connect failed
  server.join();
  close(listener);
  return floor_us;
}

}  // namespace

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
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(
        ClusterFor(bin, a.common, t, w, scratch, absl::StrCat("pipeline-w", w)));
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
  progress.Finish();
  // Replies as far apart as the work per element makes them.
  const double floor_us = WakeupFloorUs(burn.us_per_element, quick ? 1000 : 3000);

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
  std::printf("client us/elem floor on this machine: %s us (one thread woken by poll() per "
              "reply, then recv and send on loopback TCP, replies %.0f us apart; no data plane, "
              "no thread hand-off; docs/perf.md)\n",
              Num(floor_us, 1).c_str(), burn.us_per_element);
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
    plots.push_back(absl::StrCat(local_eps, "*(x < ", machine.nproc, " ? x : ", machine.nproc,
                                 ") with lines dt 2 title 'ideal: local rate x min(workers, ",
                                 machine.nproc, " cpus)'"));
    absl::StrAppend(&s, "plot ", absl::StrJoin(plots, ", \\\n     "), "\n");
    std::string note;
    absl::Status st = RunGnuplot(s, a.common.plot_path, &note);
    notes.push_back(st.ok() ? note : OneLine(st));
  }
  Report report;
  report.mode = "pipeline";
  report.command = command;
  report.machine = machine;
  report.fields = {{"transport", JsonQuote(t.name)},
                   {"burn_rounds", absl::StrCat(burn.rounds)},
                   {"us_per_element_local", absl::StrCat(burn.us_per_element)},
                   {"client_cpu_us_floor",
                    std::isfinite(floor_us) ? absl::StrCat(floor_us) : std::string("null")}};
  report.sections = {{"rows", row_json}};
  report.notes = notes;
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
