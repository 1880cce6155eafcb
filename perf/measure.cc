#include "perf/measure.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sluice/client/distribute.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/udf.h"

namespace sluice::perf {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double CpuSeconds(const timeval& tv) { return tv.tv_sec + tv.tv_usec * 1e-6; }

Dataset WorkloadDataset(const ClientOptions& o) {
  const std::string udf = o.workload == "burn"    ? "perf_burn"
                          : o.workload == "ints"  ? "perf_ints"
                          : o.workload == "text"  ? "perf_text"
                          : o.workload == "noise" ? "perf_noise"
                                                  : "perf_payload";
  Dataset ds = Dataset::FromTensors({Element{Tensor::Scalar<int64_t>(o.arg)}})
                   .Repeat(-1)
                   .Map(Udf(udf));
  // fresh: every element a new tensor the worker computes (x + 0 over the
  // payload's bytes), not the same bytes served again.
  if (o.workload == "fresh") ds = ds.Map(expr::x + 0);
  return ds;
}

absl::StatusOr<std::unique_ptr<Iterator>> Open(const ClientOptions& o, int64_t outstanding) {
  DistributeOptions d;
  d.service = o.service;
  d.data_transfer_protocol = o.protocol;
  d.fallback_to_grpc = false;  // measure the path asked for, or fail
  d.max_outstanding_requests = outstanding;
  d.compression = o.compression;
  if (o.max_elements_per_reply > 0) d.max_elements_per_reply = o.max_elements_per_reply;
  Dataset ds = WorkloadDataset(o).Apply(Distribute(d));
  SLUICE_RETURN_IF_ERROR(ds.status());
  return ds.MakeIterator();
}

// One element; end of input is an error here (the workloads repeat forever).
absl::StatusOr<size_t> NextPayloadBytes(Iterator& it) {
  SLUICE_ASSIGN_OR_RETURN(std::optional<Element> e, it.Next());
  if (!e.has_value()) return absl::InternalError("the service ended an infinite dataset");
  size_t bytes = 0;
  for (const Tensor& t : *e) bytes += t.byte_size();
  return bytes;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

std::string FormatRecord(const Record& r) {
  std::string out;
  for (const auto& [k, v] : r) absl::StrAppend(&out, k, "=", v, "\n");
  return out;
}

Record ParseRecord(const std::string& text) {
  Record r;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    r[kv.first] = kv.second;
  }
  return r;
}

double RecordNumber(const Record& r, const std::string& key, double fallback) {
  auto it = r.find(key);
  double v = 0;
  if (it == r.end() || !absl::SimpleAtod(it->second, &v)) return fallback;
  return v;
}

absl::StatusOr<Record> RunClient(const ClientOptions& o) {
  if (!o.plugin.empty()) SLUICE_RETURN_IF_ERROR(LoadPlugin(o.plugin));
  Record r;
  {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Iterator> it, Open(o, o.max_outstanding_requests));
    for (int64_t i = 0; i < o.warmup_elements; ++i) {
      SLUICE_RETURN_IF_ERROR(NextPayloadBytes(*it).status());
    }
    const TransportStats ts0 = GetTransportStats();
    const DataServiceStats wire0 = GetDataServiceStats();
    rusage ru0{};
    getrusage(RUSAGE_SELF, &ru0);
    const Clock::time_point t0 = Clock::now();
    int64_t elements = 0, bytes = 0;
    double seconds = 0;
    while (elements < o.max_elements && bytes < o.max_bytes && seconds < o.max_seconds) {
      SLUICE_ASSIGN_OR_RETURN(size_t b, NextPayloadBytes(*it));
      ++elements;
      bytes += static_cast<int64_t>(b);
      seconds = SecondsSince(t0);
    }
    rusage ru1{};
    getrusage(RUSAGE_SELF, &ru1);
    const TransportStats ts1 = GetTransportStats();
    // What arrived over the wire meanwhile, which is not what Next()
    // returned meanwhile (replies in flight and buffered at either end).
    const DataServiceStats wire1 = GetDataServiceStats();
    r["wire_bytes"] = absl::StrCat(wire1.bytes_received - wire0.bytes_received);
    r["wire_elements"] = absl::StrCat(wire1.elements_received - wire0.elements_received);
    r["elements"] = absl::StrCat(elements);
    r["bytes"] = absl::StrCat(bytes);
    r["seconds"] = absl::StrCat(seconds);
    r["cpu_user_s"] = absl::StrCat(CpuSeconds(ru1.ru_utime) - CpuSeconds(ru0.ru_utime));
    r["cpu_sys_s"] = absl::StrCat(CpuSeconds(ru1.ru_stime) - CpuSeconds(ru0.ru_stime));
    r["client_payload_bytes_copied"] =
        absl::StrCat(ts1.client_payload_bytes_copied - ts0.client_payload_bytes_copied);
    r["ucx_elements_received"] =
        absl::StrCat(ts1.ucx_elements_received - ts0.ucx_elements_received);
    r["ucx_bytes_received"] = absl::StrCat(ts1.ucx_bytes_received - ts0.ucx_bytes_received);
    r["dedicated_buffer_allocations"] =
        absl::StrCat(ts1.dedicated_buffer_allocations - ts0.dedicated_buffer_allocations);
    r["pool_high_water_mark"] = absl::StrCat(ts1.pool_high_water_mark);
    r["ucx_lanes"] = ts1.ucx_lanes;
  }
  if (o.latency_elements > 0) {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Iterator> it, Open(o, 1));
    for (int i = 0; i < 3; ++i) SLUICE_RETURN_IF_ERROR(NextPayloadBytes(*it).status());
    std::vector<double> us;
    const Clock::time_point start = Clock::now();
    while (static_cast<int64_t>(us.size()) < o.latency_elements &&
           (us.size() < 5 || SecondsSince(start) < o.latency_seconds)) {
      const Clock::time_point t = Clock::now();
      SLUICE_RETURN_IF_ERROR(NextPayloadBytes(*it).status());
      us.push_back(SecondsSince(t) * 1e6);
    }
    double sum = 0;
    for (double u : us) sum += u;
    r["lat_n"] = absl::StrCat(us.size());
    r["lat_mean_us"] = absl::StrCat(sum / static_cast<double>(us.size()));
    r["lat_p50_us"] = absl::StrCat(Percentile(us, 0.50));
    r["lat_p99_us"] = absl::StrCat(Percentile(us, 0.99));
  }
  return r;
}

MemcpyResult MeasureMemcpy(int64_t size, int64_t working_set, double seconds) {
  const size_t block = static_cast<size_t>(std::max<int64_t>(size, 1));
  const size_t blocks = std::max<size_t>(1, static_cast<size_t>(working_set) / block);
  const size_t span = blocks * block;
  // Kept between calls (one thread calls this): allocating and touching
  // hundreds of MiB per size would cost more than the measurement.
  static std::shared_ptr<uint8_t> src, dst;
  static size_t capacity = 0;
  if (capacity < span) {
    src = AllocateAligned(span);
    dst = AllocateAligned(span);
    std::memset(src.get(), 1, span);  // touch every page before timing
    std::memset(dst.get(), 2, span);
    capacity = span;
  }
  int64_t copied = 0, count = 0;
  size_t next = 0;
  const Clock::time_point t0 = Clock::now();
  double elapsed = 0;
  do {
    // Check the clock every ~1 MiB (or every block when blocks are larger).
    for (int64_t burst = std::max<int64_t>(1, (1 << 20) / size); burst > 0; --burst) {
      std::memcpy(dst.get() + next * block, src.get() + next * block, block);
      next = next + 1 == blocks ? 0 : next + 1;
      copied += size;
      ++count;
    }
    elapsed = SecondsSince(t0);
  } while (elapsed < seconds);
  // Read the destination so the copies are observable.
  volatile uint8_t sink = dst.get()[span - 1];
  (void)sink;
  return {static_cast<double>(copied) / elapsed / 1e9, static_cast<double>(count) / elapsed};
}

absl::StatusOr<BurnCalibration> CalibrateBurn(const std::string& plugin, double target_us) {
  SLUICE_RETURN_IF_ERROR(LoadPlugin(plugin));
  SLUICE_ASSIGN_OR_RETURN(const UdfEntry* burn, FindUdf("perf_burn"));
  auto time_rounds = [&](int64_t rounds, int reps) -> absl::StatusOr<double> {
    const Element in{Tensor::Scalar<int64_t>(rounds)};
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < reps; ++i) SLUICE_RETURN_IF_ERROR(burn->fn(in).status());
    return SecondsSince(t0) * 1e6 / reps;
  };
  const int64_t probe = 1 << 20;
  double probe_us = 1e300;
  for (int i = 0; i < 3; ++i) {
    SLUICE_ASSIGN_OR_RETURN(double us, time_rounds(probe, 1));
    probe_us = std::min(probe_us, us);
  }
  BurnCalibration c;
  c.rounds = std::max<int64_t>(1, static_cast<int64_t>(probe * target_us / probe_us));
  // The fastest of several tries: other processes on a shared machine only
  // ever make a try slower.
  c.us_per_element = 1e300;
  for (int i = 0; i < 5; ++i) {
    SLUICE_ASSIGN_OR_RETURN(double us, time_rounds(c.rounds, 5));
    c.us_per_element = std::min(c.us_per_element, us);
  }
  return c;
}

}  // namespace sluice::perf
