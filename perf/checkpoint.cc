// sluice-perf checkpoint: what a distributed_epoch consumer's service
// checkpoint costs over an ImageNet-sized split table (docs/perf.md,
// docs/checkpointing.md).
//
// A Range of N elements (1.28 M, ImageNet's files; 128 k quick) is split by
// a sluice-dispatcher process in runs of --split_elements (256: the split
// table of ImageNet's 1.28 M files in the dispatcher's automatic runs) over
// `workers` sluice-worker processes. This process reads the epoch and, at
// 10%, 50% and 90% of it, times Iterator::Save() `saves` times and keeps
// the checkpoint's size. After the 90% save the iterator is dropped and
// the checkpoint restored: the restore's time to its first element is
// measured beside a fresh iterator's in the same run, and the rest of the
// epoch is read and checked to be exactly the elements not delivered.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "perf/cluster.h"
#include "perf/measure.h"
#include "perf/report.h"
#include "perf/suite.h"
#include "sluice/client/distribute.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"

namespace sluice::perf {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct SavePoint {
  double fraction = 0;
  int64_t delivered = 0;
  int64_t bytes = 0;
  double p50_ms = 0, max_ms = 0;
};

// Times `saves` Save() calls of `it` (which must not move meanwhile).
absl::StatusOr<SavePoint> MeasureSaves(Iterator& it, int saves, std::string* last) {
  std::vector<double> ms;
  for (int i = 0; i < saves; ++i) {
    const auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(*last, it.Save());
    ms.push_back(Since(t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  SavePoint p;
  p.bytes = static_cast<int64_t>(last->size());
  p.p50_ms = ms[ms.size() / 2];
  p.max_ms = ms.back();
  return p;
}

}  // namespace

absl::Status RunCheckpoint(const CheckpointArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  const int64_t n = a.elements > 0 ? a.elements : quick ? 128000 : 1280000;
  const int saves = std::max(1, a.saves);
  if (a.split_elements < 1) return absl::InvalidArgumentError("--split_elements must be >= 1");
  if (a.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  SLUICE_ASSIGN_OR_RETURN(const std::string dispatcher,
                          LocateDispatcherBinary(a.dispatcher_binary));
  SLUICE_ASSIGN_OR_RETURN(TransportSpec t, ParseTransport(a.transport, a.shm_tls));
  for (const auto& [k, v] : ChildEnv(t)) setenv(k.c_str(), v.c_str(), 1);
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf_checkpoint"));
  if (a.common.keep_logs) scratch.Keep();
  Progress progress("checkpoint", 6);
  progress.Step("service");
  ClusterOptions co = ClusterFor(bin, a.common, t, a.workers, scratch, "checkpoint");
  co.dispatcher_binary = dispatcher;
  co.dispatcher_args = {"--range_split_elements", absl::StrCat(a.split_elements)};
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, Cluster::Start(co));

  DistributeOptions opt;
  opt.service = cluster->target();
  opt.processing_mode = "distributed_epoch";
  opt.data_transfer_protocol = t.protocol;
  opt.max_outstanding_requests = a.max_outstanding;
  const Dataset ds = Dataset::Range(n).Apply(Distribute(opt));
  SLUICE_RETURN_IF_ERROR(ds.status());

  std::vector<SavePoint> points;
  std::string checkpoint;
  int64_t delivered = 0;
  long double delivered_sum = 0;
  double read_s = 0;
  {
    SLUICE_ASSIGN_OR_RETURN(auto it, ds.MakeIterator());
    const auto t0 = Clock::now();
    for (const double fraction : {0.1, 0.5, 0.9}) {
      progress.Step(absl::StrCat("read to ", static_cast<int>(fraction * 100), "% and save"));
      const int64_t until = static_cast<int64_t>(fraction * static_cast<double>(n));
      for (; delivered < until; ++delivered) {
        SLUICE_ASSIGN_OR_RETURN(auto e, it->Next());
        if (!e.has_value()) {
          return absl::DataLossError(absl::StrCat("the epoch ended after ", delivered, " of ", n));
        }
        delivered_sum += static_cast<long double>((*e)[0].at<int64_t>(0));
      }
      read_s += Since(t0);
      SLUICE_ASSIGN_OR_RETURN(SavePoint p, MeasureSaves(*it, saves, &checkpoint));
      p.fraction = fraction;
      p.delivered = delivered;
      points.push_back(p);
    }
  }
  // A fresh pass (the anchor), then the restore, each to its first element.
  progress.Step("fresh iterator and restore");
  double fresh_s = 0, restore_s = 0;
  {
    const auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(auto fresh, ds.MakeIterator());
    SLUICE_ASSIGN_OR_RETURN(auto first, fresh->Next());
    fresh_s = Since(t0);
    if (!first.has_value()) return absl::DataLossError("a fresh pass yielded nothing");
  }
  SLUICE_ASSIGN_OR_RETURN(auto resumed, [&]() -> absl::StatusOr<std::unique_ptr<Iterator>> {
    const auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(auto it, ds.MakeIterator(checkpoint));
    restore_s = Since(t0);
    return it;
  }());
  progress.Step("the rest of the epoch, checked");
  int64_t rest = 0;
  long double rest_sum = 0;
  double first_after_restore_s = -1;
  const auto r0 = Clock::now();
  while (true) {
    SLUICE_ASSIGN_OR_RETURN(auto e, resumed->Next());
    if (!e.has_value()) break;
    if (first_after_restore_s < 0) first_after_restore_s = Since(r0);
    rest_sum += static_cast<long double>((*e)[0].at<int64_t>(0));
    ++rest;
  }
  const double rest_s = Since(r0);
  restore_s += std::max(0.0, first_after_restore_s);
  const long double total = static_cast<long double>(n) * static_cast<long double>(n - 1) / 2;
  const bool exact = rest == n - delivered && rest_sum + delivered_sum == total;
  progress.Finish();

  std::printf("sluice-perf checkpoint%s\n", quick ? " --quick" : "");
  std::printf("machine: %s\n", machine.Describe().c_str());
  std::printf("pipeline: Range(%lld) in distributed_epoch, splits of %lld (%lld splits an epoch), "
              "%s, %d worker process(es), a sluice-dispatcher process; %d Save() calls a "
              "point\n\n",
              static_cast<long long>(n), static_cast<long long>(a.split_elements),
              static_cast<long long>((n + a.split_elements - 1) / a.split_elements),
              t.name.c_str(), a.workers, saves);
  std::printf("%-10s %12s %12s %12s %12s\n", "point", "delivered", "bytes", "save p50 ms",
              "save max ms");
  std::vector<std::string> rows;
  for (const SavePoint& p : points) {
    std::printf("%-10s %12s %12s %12s %12s\n", Pct(p.fraction).c_str(), Count(p.delivered).c_str(),
                Count(static_cast<double>(p.bytes)).c_str(), Num(p.p50_ms, 3).c_str(),
                Num(p.max_ms, 3).c_str());
    JsonObject j;
    j.Add("fraction", p.fraction).Add("delivered", p.delivered).Add("bytes", p.bytes);
    j.Add("save_p50_ms", p.p50_ms).Add("save_max_ms", p.max_ms);
    rows.push_back(j.str());
  }
  std::printf("\nfresh iterator to its first element: %s s; restore (MakeIterator(checkpoint)) "
              "to its first element: %s s (%s of fresh)\n",
              Num(fresh_s, 3).c_str(), Num(restore_s, 3).c_str(),
              Times(restore_s / fresh_s).c_str());
  std::printf("the rest after the restore: %s elements in %s s, %s\n", Count(rest).c_str(),
              Num(rest_s, 2).c_str(),
              exact ? "exactly the elements not delivered" : "NOT the elements not delivered");
  std::printf("the first 90%%: %s s\n\n", Num(read_s, 2).c_str());

  const SavePoint& last = points.back();
  std::vector<std::string> notes;
  const bool imagenet = n >= 1280000 && a.split_elements <= 256;
  if (!imagenet) notes.push_back("targets are for 1.28 M elements in splits of <= 256");
  notes.push_back(absl::StrCat("target: Save() under 10 ms: p50 ", Num(last.p50_ms, 3),
                               " ms, max ", Num(last.max_ms, 3), " ms at 90%: ",
                               last.max_ms < 10 ? "MET" : "MISSED"));
  notes.push_back(absl::StrCat("target: under 1 MiB a consumer: ", Count(last.bytes),
                               " bytes at 90%: ", last.bytes < (1 << 20) ? "MET" : "MISSED"));
  notes.push_back(absl::StrCat("target: restore under 1 s: ", Num(restore_s, 3), " s: ",
                               restore_s < 1 ? "MET" : "MISSED"));
  if (!exact) {
    notes.push_back(absl::StrCat("FAILED: the rest was ", rest, " elements; expected ",
                                 n - delivered));
  }
  Report report;
  report.mode = "checkpoint";
  report.command = command;
  report.machine = machine;
  report.fields = {{"elements", absl::StrCat(n)},
                   {"split_elements", absl::StrCat(a.split_elements)},
                   {"workers", absl::StrCat(a.workers)},
                   {"transport", JsonQuote(t.name)},
                   {"fresh_first_element_s", absl::StrCat(fresh_s)},
                   {"restore_first_element_s", absl::StrCat(restore_s)},
                   {"rest_exact", exact ? "true" : "false"}};
  report.sections = {{"saves", rows}};
  report.notes = notes;
  SLUICE_RETURN_IF_ERROR(cluster->CheckWorkersAlive());
  return FinishRun(a.common, report, !exact, scratch);
}

}  // namespace sluice::perf
