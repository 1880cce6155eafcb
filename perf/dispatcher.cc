// sluice-perf dispatcher: one real dispatcher against a simulated fleet.
//
// The dispatcher is the sluice-dispatcher binary in its own process
// (fault-tolerant mode, journal in the scratch directory), so its CPU time,
// resident set and disk writes are its own; --dispatcher_binary points at
// another build (today's main, to measure a change before and after).
// This process simulates the fleet with the real RPCs and the real
// defaults, from a few threads (gRPC's callback API):
//  - workers: a listening TCP socket each (the dispatcher probes a new
//    worker's address), a WorkerHeartbeat long poll back to back (wait =
//    heartbeat_interval_ms, 1 s by default, as sluice-worker), and, once the
//    fleet is up, a split loop: every 1/splits_per_worker_s seconds a
//    GetSplit fetch for the next of its tasks (round robin), and the split's
//    completion (report_only) one period later, as a worker's SplitClient
//    does. A real worker runs its tasks' fetches concurrently; the
//    simulated one keeps one fetch in flight, so the fleet's split rate is
//    fixed and the same for every build measured.
//  - consumers: GetOrCreateIteration of their job (consumers_per_job share
//    a job_name, distributed_epoch, Range source large enough that no epoch
//    ends during the run), then a ClientHeartbeat long poll back to back
//    (wait 1 s, as the client).
// Latencies are measured where they mean something: a long poll that came
// back with nothing new was held for its whole wait, so its round trip
// minus the wait is how late the dispatcher answered ("lateness"); a GetSplit
// that handed out a split was not held at all.
// The calls/s rows run RegisterDataset, GetOrCreateIteration and GetSplit
// in closed loops, 1 and 64 calls in flight (callback API: no thread per
// caller), against a fresh dispatcher each.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "rpc/service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "perf/suite.h"
#include "sluice/core/status.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"

namespace sluice::perf {
namespace {

using Stub = proto::DispatcherService::Stub;
using SteadyClock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;

double MsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
}

// ---- the dispatcher process ---------------------------------------------------

// What the dispatcher process did over a window.
struct Usage {
  double cpu_s = 0;
  int64_t write_bytes = 0;
  double journal_records = 0;
  double journal_syncs = -1;  // -1: the build has no such counter
  double lost_workers = 0;    // declared lost (no heartbeat for worker_timeout_ms)
};

Usage ReadUsage(const DispatcherProcess& d) {
  Usage u;
  u.cpu_s = ProcCpuSeconds(d.child->pid()).value_or(0);
  u.write_bytes = ProcWriteBytes(d.child->pid()).value_or(0);
  auto m = ReadMetrics(d.metrics_port);
  u.journal_records = Metric(m, "sluice_dispatcher_journal_records_total", 0);
  u.journal_syncs = Metric(m, "sluice_dispatcher_journal_syncs_total", -1);
  u.lost_workers = Metric(m, "sluice_dispatcher_lost_workers_total", 0);
  return u;
}

// fsyncs in a window: the counter when the build has it; before it, the
// journal synced once per record.
double Syncs(const Usage& a, const Usage& b) {
  if (a.journal_syncs >= 0 && b.journal_syncs >= 0) return b.journal_syncs - a.journal_syncs;
  return b.journal_records - a.journal_records;
}

std::vector<std::unique_ptr<Stub>> MakeStubs(int port, int connections) {
  std::vector<std::unique_ptr<Stub>> stubs;
  for (int i = 0; i < connections; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("sluice.perf.connection", i);  // a connection of its own
    args.SetMaxReceiveMessageSize(-1);
    stubs.push_back(proto::DispatcherService::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
  }
  return stubs;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d));
}

// Range(first, 2^40) (a different `first` per job: datasets are
// deduplicated by fingerprint) and `map_ops` Maps after it: a definition of
// a pipeline's size (nothing here runs it).
Dataset FleetDataset(int64_t first, int map_ops) {
  using expr::x;
  Dataset d = Dataset::Range(first, int64_t{1} << 40);
  for (int i = 0; i < map_ops; ++i) d = d.Map(x * 3 + i);
  return d;
}

// Registers FleetDataset(first, map_ops) and the job `name` over it; its
// job id.
absl::StatusOr<int64_t> CreateJob(Stub* stub, int64_t first, proto::ProcessingMode mode,
                                  const std::string& name, int map_ops = 0) {
  proto::RegisterDatasetRequest rreq;
  *rreq.mutable_dataset() = FleetDataset(first, map_ops).def();
  proto::RegisterDatasetResponse rresp;
  grpc::ClientContext rctx;
  SetDeadline(&rctx, absl::Seconds(30));
  grpc::Status s = stub->RegisterDataset(&rctx, rreq, &rresp);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("RegisterDataset: code ", s.error_code(), ": ", s.error_message()));
  }
  proto::GetOrCreateJobRequest jreq;
  jreq.set_dataset_id(rresp.dataset_id());
  jreq.set_processing_mode(mode);
  jreq.set_job_name(name);
  proto::GetOrCreateJobResponse jresp;
  grpc::ClientContext jctx;
  SetDeadline(&jctx, absl::Seconds(30));
  s = stub->GetOrCreateJob(&jctx, jreq, &jresp);
  if (!s.ok()) return absl::InternalError(absl::StrCat("GetOrCreateJob: ", s.error_message()));
  return jresp.job_id();
}

// A listening socket on 127.0.0.1 for a simulated worker's address (the
// dispatcher connects once to check that a new worker answers).
absl::StatusOr<std::pair<int, std::string>> ListenSocket() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ResourceExhaustedError("socket() failed: raise the open-file limit");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return absl::InternalError("bind/listen on 127.0.0.1 failed");
  }
  return std::make_pair(fd, absl::StrCat("127.0.0.1:", ntohs(a.sin_port)));
}

// ---- measurements ---------------------------------------------------------------

// A DispatcherService method of the stub's callback API, e.g.
// &Stub::async_interface::GetSplit.
template <typename Req, typename Resp>
using AsyncMethod = void (Stub::async_interface::*)(grpc::ClientContext*, const Req*, Resp*,
                                                    std::function<void(grpc::Status)>);

// One call through gRPC's callback API: `done(status, request, response,
// round-trip ms)` runs on a gRPC thread when it completes (and may make
// the next call). The call holds a token of `calls`, whose owner keeps the
// stub's channel until all are gone (internal::CallbackCallGuard).
template <typename Req, typename Resp, typename Done>
void CallAsync(Stub* stub, AsyncMethod<Req, Resp> method, Req req, absl::Duration timeout,
               internal::CallbackCallGuard& calls, Done done) {
  struct State {
    std::shared_ptr<void> hold;  // destroyed after the context
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
    SteadyClock::time_point start;
  };
  auto* c = new State;
  c->hold = calls.Hold();
  c->req = std::move(req);
  SetDeadline(&c->ctx, timeout);
  c->start = SteadyClock::now();
  (stub->async()->*method)(&c->ctx, &c->req, &c->resp, [c, done](grpc::Status s) {
    done(s, c->req, c->resp, MsSince(c->start));
    delete c;
  });
}

class Latencies {
 public:
  void Add(double ms) {
    absl::MutexLock l(&mu_);
    v_.push_back(static_cast<float>(ms));
  }
  void Clear() {
    absl::MutexLock l(&mu_);
    v_.clear();
  }
  // p in [0, 1]; NaN when empty.
  double Percentile(double p) {
    absl::MutexLock l(&mu_);
    if (v_.empty()) return std::nan("");
    std::vector<float> s = v_;
    const size_t k = std::min(s.size() - 1, static_cast<size_t>(p * static_cast<double>(s.size())));
    std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k), s.end());
    return s[k];
  }
  int64_t count() {
    absl::MutexLock l(&mu_);
    return static_cast<int64_t>(v_.size());
  }

 private:
  absl::Mutex mu_;
  std::vector<float> v_ ABSL_GUARDED_BY(mu_);
};

// Runs functions at given times, on one thread.
class Scheduler {
 public:
  Scheduler() : thread_([this] { Loop(); }) {}
  ~Scheduler() { Stop(); }
  void At(SteadyClock::time_point when, std::function<void()> fn) {
    absl::MutexLock l(&mu_);
    queue_.push(Item{when, seq_++, std::move(fn)});
    cv_.Signal();
  }
  void Now(std::function<void()> fn) { At(SteadyClock::now(), std::move(fn)); }
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      cv_.Signal();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Item {
    SteadyClock::time_point when;
    uint64_t seq;
    mutable std::function<void()> fn;
    bool operator>(const Item& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  void Loop() {
    absl::MutexLock l(&mu_);
    while (!stop_) {
      if (queue_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      const auto when = queue_.top().when;
      if (when > SteadyClock::now()) {
        cv_.WaitWithDeadline(&mu_, absl::FromChrono(std::chrono::system_clock::now() +
                                                   (when - SteadyClock::now())));
        continue;
      }
      std::function<void()> fn = std::move(queue_.top().fn);
      queue_.pop();
      mu_.Unlock();
      fn();
      mu_.Lock();
    }
  }
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// ---- the fleet ---------------------------------------------------------------------

struct FleetOptions {
  int workers = 0;
  int consumers = 0;
  int jobs = 0;
  double splits_per_worker_s = 1;
  int64_t heartbeat_ms = 1000;
  int connections = 64;
  int map_ops = 0;  // Maps in each job's dataset definition (FleetDataset)
  double seconds = 0;
  double warmup_timeout_s = 300;
};

struct SimWorker {
  int index = 0;
  int fd = -1;
  std::string address;
  std::string host;
  Stub* stub = nullptr;
  absl::Mutex mu;
  std::vector<int64_t> tasks ABSL_GUARDED_BY(mu);
  std::set<int64_t> known ABSL_GUARDED_BY(mu);
  size_t next ABSL_GUARDED_BY(mu) = 0;
  bool registered ABSL_GUARDED_BY(mu) = false;
  bool fetching ABSL_GUARDED_BY(mu) = false;  // a GetSplit fetch is in flight
};

struct SimConsumer {
  int64_t client_id = 0;
  Stub* stub = nullptr;
  // Touched only by its one heartbeat chain.
  int64_t version = -1;
  absl::flat_hash_set<int64_t> tasks;  // of its iteration, as a client learns them
};

class Fleet {
 public:
  Fleet(FleetOptions o, int port) : o_(o), stubs_(MakeStubs(port, o.connections)) {}
  ~Fleet() {
    for (auto& w : workers_) {
      if (w->fd >= 0) close(w->fd);
    }
  }

  absl::Status Setup();
  void StartHeartbeats();
  void StartSplits();
  // Stops issuing calls and waits (up to `timeout`) for those in flight.
  void Stop(absl::Duration timeout);

  int64_t registered() const { return registered_.load(); }
  // Tasks the simulated workers hold now (tasks of lost workers are
  // replaced by new ones when they come back, so this, not the tasks ever
  // received, says the fleet is up).
  int64_t tasks_held() {
    int64_t n = 0;
    for (auto& w : workers_) {
      absl::MutexLock l(&w->mu);
      n += static_cast<int64_t>(w->tasks.size());
    }
    return n;
  }
  // Tasks the simulated consumers know (each must learn every task of its
  // iteration, one per worker, before the fleet is up).
  int64_t tasks_known() const { return tasks_known_.load(); }
  int64_t errors() const { return errors_.load(); }
  std::string last_error() {
    absl::MutexLock l(&error_mu_);
    return last_error_;
  }
  int64_t worker_heartbeats() const { return worker_heartbeats_.load(); }
  int64_t client_heartbeats() const { return client_heartbeats_.load(); }
  int64_t splits() const { return splits_.load(); }

  Latencies worker_late, client_late, get_split, report;

 private:
  template <typename Req, typename Resp, typename Done>
  void Call(Stub* stub, AsyncMethod<Req, Resp> method, Req req, absl::Duration timeout,
            Done done);
  void WorkerHeartbeat(SimWorker* w);
  void FetchSplit(SimWorker* w);
  void ReportSplit(SimWorker* w, int64_t task, int64_t split);
  void ClientHeartbeat(SimConsumer* c);
  void Failed(const grpc::Status& s, const char* what);
  SteadyClock::duration SplitPeriod() const {
    return std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double>(1.0 / o_.splits_per_worker_s));
  }

  const FleetOptions o_;
  std::vector<std::unique_ptr<Stub>> stubs_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::vector<std::unique_ptr<SimConsumer>> consumers_;
  Scheduler sched_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> registered_{0}, errors_{0}, tasks_known_{0};
  std::atomic<int64_t> worker_heartbeats_{0}, client_heartbeats_{0}, splits_{0};
  absl::Mutex error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  // Last: destroyed first, it waits for every call (calls still in flight
  // when Stop gave up included) before stubs_ goes.
  internal::CallbackCallGuard calls_;
};

template <typename Req, typename Resp, typename Done>
void Fleet::Call(Stub* stub, AsyncMethod<Req, Resp> method, Req req, absl::Duration timeout,
                 Done done) {
  in_flight_++;
  CallAsync<Req, Resp>(stub, method, std::move(req), timeout, calls_,
                       [this, done](const grpc::Status& s, const Req& q, const Resp& r, double ms) {
                         done(s, q, r, ms);
                         in_flight_--;
                       });
}

void Fleet::Failed(const grpc::Status& s, const char* what) {
  if (stopping_) return;
  errors_++;
  absl::MutexLock l(&error_mu_);
  last_error_ = absl::StrCat(what, ": ", s.error_message());
}

absl::Status Fleet::Setup() {
  // Datasets, jobs and the consumers' iterations, from 16 threads.
  std::vector<int64_t> job_ids(static_cast<size_t>(o_.jobs));
  for (int j = 0; j < o_.jobs; ++j) {
    SLUICE_ASSIGN_OR_RETURN(job_ids[static_cast<size_t>(j)],
                            CreateJob(stubs_[static_cast<size_t>(j) % stubs_.size()].get(), j,
                                      proto::DISTRIBUTED_EPOCH, absl::StrCat("fleet-job-", j),
                                      o_.map_ops));
  }
  consumers_.resize(static_cast<size_t>(o_.consumers));
  std::atomic<int> next{0};
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < o_.consumers; i = next++) {
        auto c = std::make_unique<SimConsumer>();
        c->stub = stubs_[static_cast<size_t>(i) % stubs_.size()].get();
        proto::GetOrCreateIterationRequest req;
        req.set_job_id(job_ids[static_cast<size_t>(i % o_.jobs)]);
        req.set_repetition(0);
        req.set_consumer_index(-1);
        proto::GetOrCreateIterationResponse resp;
        grpc::ClientContext ctx;
        SetDeadline(&ctx, absl::Seconds(60));
        grpc::Status s = c->stub->GetOrCreateIteration(&ctx, req, &resp);
        if (!s.ok()) {
          absl::MutexLock l(&mu);
          first_error = absl::InternalError(absl::StrCat("GetOrCreateIteration: ", s.error_message()));
          return;
        }
        c->client_id = resp.iteration_client_id();
        consumers_[static_cast<size_t>(i)] = std::move(c);
      }
    });
  }
  for (auto& t : threads) t.join();
  SLUICE_RETURN_IF_ERROR(first_error);
  for (int i = 0; i < o_.workers; ++i) {
    auto w = std::make_unique<SimWorker>();
    w->index = i;
    SLUICE_ASSIGN_OR_RETURN(auto listen, ListenSocket());
    w->fd = listen.first;
    w->address = listen.second;
    w->host = absl::StrCat("sim-host-", i / 8);
    w->stub = stubs_[static_cast<size_t>(i) % stubs_.size()].get();
    workers_.push_back(std::move(w));
  }
  return absl::OkStatus();
}

void Fleet::StartHeartbeats() {
  // Spread over a second, as a fleet that did not start in one instant.
  const auto start = SteadyClock::now();
  for (size_t i = 0; i < consumers_.size(); ++i) {
    SimConsumer* c = consumers_[i].get();
    sched_.At(start + std::chrono::microseconds(1000000 * i / consumers_.size()),
              [this, c] { ClientHeartbeat(c); });
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    SimWorker* w = workers_[i].get();
    sched_.At(start + std::chrono::microseconds(1000000 * i / workers_.size()),
              [this, w] { WorkerHeartbeat(w); });
  }
}

void Fleet::StartSplits() {
  const auto start = SteadyClock::now();
  const auto period = SplitPeriod();
  for (size_t i = 0; i < workers_.size(); ++i) {
    SimWorker* w = workers_[i].get();
    sched_.At(start + period * static_cast<int64_t>(i) / static_cast<int64_t>(workers_.size()),
              [this, w] { FetchSplit(w); });
  }
}

void Fleet::WorkerHeartbeat(SimWorker* w) {
  if (stopping_) return;
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address(w->address);
  req.set_transfer_address(w->address);
  req.set_transfer_protocol("grpc");
  req.set_host_id(w->host);
  {
    absl::MutexLock l(&w->mu);
    req.set_wait_ms(w->registered ? o_.heartbeat_ms : 0);
    for (int64_t t : w->tasks) req.add_current_tasks(t);
  }
  Call<proto::WorkerHeartbeatRequest, proto::WorkerHeartbeatResponse>(
      w->stub,
      &Stub::async_interface::WorkerHeartbeat,
      std::move(req), absl::Milliseconds(o_.heartbeat_ms) + absl::Seconds(30),
      [this, w](const grpc::Status& s, const proto::WorkerHeartbeatRequest& q,
                const proto::WorkerHeartbeatResponse& r, double ms) {
        if (!s.ok()) {
          Failed(s, "WorkerHeartbeat");
          if (!stopping_) {
            sched_.At(SteadyClock::now() + std::chrono::milliseconds(500),
                      [this, w] { WorkerHeartbeat(w); });
          }
          return;
        }
        worker_heartbeats_++;
        {
          absl::MutexLock l(&w->mu);
          if (!w->registered) {
            w->registered = true;
            registered_++;
          }
          for (const auto& def : r.new_tasks()) {
            if (w->known.insert(def.task_id()).second) w->tasks.push_back(def.task_id());
          }
          for (int64_t id : r.tasks_to_delete()) {
            w->known.erase(id);
            w->tasks.erase(std::remove(w->tasks.begin(), w->tasks.end(), id), w->tasks.end());
          }
        }
        // Held for the whole wait (nothing new): how late the answer came.
        if (q.wait_ms() > 0 && r.new_tasks().empty() && r.tasks_to_delete().empty() &&
            ms >= static_cast<double>(q.wait_ms()) - 1) {
          worker_late.Add(ms - static_cast<double>(q.wait_ms()));
        }
        sched_.Now([this, w] { WorkerHeartbeat(w); });
      });
}

void Fleet::FetchSplit(SimWorker* w) {
  if (stopping_) return;
  sched_.At(SteadyClock::now() + SplitPeriod(), [this, w] { FetchSplit(w); });
  int64_t task = 0;
  {
    absl::MutexLock l(&w->mu);
    // One fetch in flight: a fetch not back by the next period skips it
    // (a dispatcher that falls behind gets no more calls than it answers).
    if (w->tasks.empty() || w->fetching) return;
    w->fetching = true;
    task = w->tasks[w->next++ % w->tasks.size()];
  }
  proto::GetSplitRequest req;
  req.set_worker_address(w->address);
  req.set_task_id(task);
  req.set_epoch(0);
  Call<proto::GetSplitRequest, proto::GetSplitResponse>(
      w->stub,
      &Stub::async_interface::GetSplit,
      std::move(req), absl::Seconds(30),
      [this, w, task](const grpc::Status& s, const proto::GetSplitRequest&,
                      const proto::GetSplitResponse& r, double ms) {
        {
          absl::MutexLock l(&w->mu);
          w->fetching = false;
        }
        if (!s.ok()) return Failed(s, "GetSplit");
        if (!r.has_split()) return;
        splits_++;
        get_split.Add(ms);
        const int64_t split = r.split().split_id();
        sched_.At(SteadyClock::now() + SplitPeriod(),
                  [this, w, task, split] { ReportSplit(w, task, split); });
      });
}

void Fleet::ReportSplit(SimWorker* w, int64_t task, int64_t split) {
  if (stopping_) return;
  proto::GetSplitRequest req;
  req.set_worker_address(w->address);
  req.set_task_id(task);
  req.set_epoch(0);
  req.set_report_only(true);
  req.add_completed_splits(split);
  Call<proto::GetSplitRequest, proto::GetSplitResponse>(
      w->stub,
      &Stub::async_interface::GetSplit,
      std::move(req), absl::Seconds(30),
      [this](const grpc::Status& s, const proto::GetSplitRequest&, const proto::GetSplitResponse&,
             double ms) {
        if (!s.ok()) return Failed(s, "GetSplit (report)");
        report.Add(ms);
      });
}

void Fleet::ClientHeartbeat(SimConsumer* c) {
  if (stopping_) return;
  proto::ClientHeartbeatRequest req;
  req.set_iteration_client_id(c->client_id);
  req.set_known_version(c->version);
  req.set_wait_ms(c->version < 0 ? 0 : 1000);
  req.set_current_round(-1);
  req.set_blocked_round(-1);
  Call<proto::ClientHeartbeatRequest, proto::ClientHeartbeatResponse>(
      c->stub,
      &Stub::async_interface::ClientHeartbeat,
      std::move(req), absl::Seconds(31),
      [this, c](const grpc::Status& s, const proto::ClientHeartbeatRequest& q,
                const proto::ClientHeartbeatResponse& r, double ms) {
        if (!s.ok()) {
          Failed(s, "ClientHeartbeat");
          if (!stopping_) {
            sched_.At(SteadyClock::now() + std::chrono::milliseconds(500),
                      [this, c] { ClientHeartbeat(c); });
          }
          return;
        }
        client_heartbeats_++;
        if (q.wait_ms() > 0 && r.version() == q.known_version() &&
            ms >= static_cast<double>(q.wait_ms()) - 1) {
          client_late.Add(ms - static_cast<double>(q.wait_ms()));
        }
        c->version = r.version();
        const int64_t before = static_cast<int64_t>(c->tasks.size());
        if (!r.tasks_delta()) c->tasks.clear();
        for (const proto::TaskInfo& t : r.tasks()) c->tasks.insert(t.task_id());
        tasks_known_ += static_cast<int64_t>(c->tasks.size()) - before;
        sched_.Now([this, c] { ClientHeartbeat(c); });
      });
}

void Fleet::Stop(absl::Duration timeout) {
  stopping_ = true;
  const absl::Time deadline = absl::Now() + timeout;
  while (in_flight_.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  sched_.Stop();
  while (in_flight_.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
}

// ---- calls/s rows ----------------------------------------------------------------

// What the dispatcher processes get in their environment: with
// --journal_sync_delay_us, the slow-sync library preloaded (perf/slow_sync.cc).
using DispatcherEnv = std::vector<std::pair<std::string, std::string>>;

absl::StatusOr<DispatcherEnv> SlowSyncEnv(int64_t delay_us) {
  if (delay_us <= 0) return DispatcherEnv{};
  SLUICE_ASSIGN_OR_RETURN(const std::string lib, LocateSlowSyncLibrary());
  // Appended to what this process was given (a sanitizer build's runtime).
  auto appended = [](const char* name, const std::string& value, const char* sep) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? absl::StrCat(v, sep, value) : value;
  };
  return DispatcherEnv{
      {"SLUICE_PERF_SYNC_DELAY_US", absl::StrCat(delay_us)},
      {"LD_PRELOAD", appended("LD_PRELOAD", lib, ":")},
      // A sanitizer build's dispatcher: its runtime is then not the first
      // library loaded, which ASan refuses unless told.
      {"ASAN_OPTIONS", appended("ASAN_OPTIONS", "verify_asan_link_order=0", ":")}};
}

struct RateRow {
  std::string op;
  int callers = 0;
  double calls_per_s = 0;
  double p50_ms = 0, p99_ms = 0;
  double fsyncs_per_s = 0;
  int64_t errors = 0;
  std::string error;
};

// Calls one op in `callers` concurrent closed loops for `seconds` against a
// fresh dispatcher.
RateRow RunRate(const std::string& binary, const ScratchDir& scratch, const std::string& op,
                int callers, double seconds, const DispatcherEnv& env) {
  RateRow row;
  row.op = op;
  row.callers = callers;
  auto fail = [&](const absl::Status& s) {
    row.error = OneLine(s);
    return row;
  };
  auto d = StartDispatcherProcess(binary, scratch.path(), absl::StrCat("rate-", op, "-", callers),
                                  {}, env);
  if (!d.ok()) return fail(d.status());
  auto stubs = MakeStubs(d->port, std::min(callers, 16));
  internal::CallbackCallGuard in_flight;  // after stubs: waited for before they go
  auto stub_for = [&](int c) { return stubs[static_cast<size_t>(c) % stubs.size()].get(); };
  auto call_ok = [](grpc::Status s, const char* what) {
    return s.ok() ? absl::OkStatus()
                  : absl::InternalError(absl::StrCat(what, ": ", s.error_message()));
  };

  // Setup for GetOrCreateIteration (a job per caller) and GetSplit (a job,
  // an iteration and a task per caller, on one simulated worker).
  std::vector<int64_t> jobs(static_cast<size_t>(callers)), tasks, clients;
  std::string worker_address;
  int worker_fd = -1;
  if (op != "RegisterDataset") {
    for (int c = 0; c < callers; ++c) {
      auto job = CreateJob(stub_for(c), c,
                           op == "GetSplit" ? proto::DISTRIBUTED_EPOCH : proto::PARALLEL_EPOCHS,
                           absl::StrCat("rate-", c));
      if (!job.ok()) return fail(job.status());
      jobs[static_cast<size_t>(c)] = *job;
    }
  }
  auto worker_heartbeat = [&](proto::WorkerHeartbeatResponse* resp) {
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(worker_address);
    req.set_transfer_address(worker_address);
    req.set_transfer_protocol("grpc");
    req.set_host_id("sim-host");
    for (int64_t t : tasks) req.add_current_tasks(t);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(30));
    return call_ok(stubs[0]->WorkerHeartbeat(&ctx, req, resp), "WorkerHeartbeat");
  };
  if (op == "GetSplit") {
    auto listen = ListenSocket();
    if (!listen.ok()) return fail(listen.status());
    worker_fd = listen->first;
    worker_address = listen->second;
    proto::WorkerHeartbeatResponse hb;
    absl::Status s = worker_heartbeat(&hb);  // registers
    for (int c = 0; c < callers && s.ok(); ++c) {
      proto::GetOrCreateIterationRequest req;
      req.set_job_id(jobs[static_cast<size_t>(c)]);
      req.set_consumer_index(-1);
      proto::GetOrCreateIterationResponse resp;
      grpc::ClientContext ctx;
      SetDeadline(&ctx, absl::Seconds(30));
      s = call_ok(stub_for(c)->GetOrCreateIteration(&ctx, req, &resp), "GetOrCreateIteration");
      clients.push_back(resp.iteration_client_id());
    }
    // The worker learns its tasks, in the order the iterations were made.
    while (s.ok() && static_cast<int>(tasks.size()) < callers) {
      proto::WorkerHeartbeatResponse r;
      s = worker_heartbeat(&r);
      for (const auto& def : r.new_tasks()) tasks.push_back(def.task_id());
    }
    std::sort(tasks.begin(), tasks.end());
    if (!s.ok()) {
      close(worker_fd);
      return fail(s);
    }
  }
  // Keeps the worker and the clients alive while the callers run.
  std::atomic<bool> done{false};
  std::thread keepalive;
  if (op == "GetSplit") {
    keepalive = std::thread([&] {
      while (!done) {
        proto::WorkerHeartbeatResponse r;
        worker_heartbeat(&r).IgnoreError();
        for (int64_t id : clients) {
          proto::ClientHeartbeatRequest req;
          req.set_iteration_client_id(id);
          req.set_known_version(-1);
          req.set_current_round(-1);
          req.set_blocked_round(-1);
          proto::ClientHeartbeatResponse resp;
          grpc::ClientContext ctx;
          SetDeadline(&ctx, absl::Seconds(10));
          stubs[0]->ClientHeartbeat(&ctx, req, &resp).ok();
        }
        for (int i = 0; i < 10 && !done; ++i) absl::SleepFor(absl::Milliseconds(50));
      }
    });
  }

  Latencies lat;
  std::atomic<int64_t> calls{0}, errors{0};
  absl::Mutex err_mu;
  std::string last_error;
  const Usage u0 = ReadUsage(*d);
  const auto start = SteadyClock::now();
  const auto end = start + std::chrono::duration_cast<SteadyClock::duration>(
                               std::chrono::duration<double>(seconds));
  // `callers` chains of calls through the callback API, each issuing its
  // next call when the last one completes (closed loops without a thread
  // per caller: the simulated callers cost little of the cpus the
  // dispatcher shares with them). A chain ends by making no next call;
  // in_flight.WaitForAll() returns once every chain ended and its last
  // callback returned.
  std::function<void(int, int64_t, int64_t)> next;  // caller, call index, split held
  auto completed = [&](const grpc::Status& s, double ms) {
    if (!s.ok()) {
      errors++;
      absl::MutexLock l(&err_mu);
      last_error = s.error_message();
      return;
    }
    calls++;
    lat.Add(ms);
  };
  next = [&](int c, int64_t k, int64_t held) {
    if (SteadyClock::now() >= end) return;
    Stub* stub = stub_for(c);
    if (op == "RegisterDataset") {
      proto::RegisterDatasetRequest req;
      *req.mutable_dataset() = Dataset::Range(1000 + c * int64_t{100000000} + k).def();
      CallAsync<proto::RegisterDatasetRequest, proto::RegisterDatasetResponse>(
          stub,
          &Stub::async_interface::RegisterDataset,
          std::move(req), absl::Seconds(30), in_flight,
          [&, c, k](const grpc::Status& st, const proto::RegisterDatasetRequest&,
                    const proto::RegisterDatasetResponse&, double ms) {
            completed(st, ms);
            next(c, k + 1, -1);
          });
    } else if (op == "GetOrCreateIteration") {
      proto::GetOrCreateIterationRequest req;
      req.set_job_id(jobs[static_cast<size_t>(c)]);
      req.set_repetition(k);
      req.set_consumer_index(-1);
      CallAsync<proto::GetOrCreateIterationRequest, proto::GetOrCreateIterationResponse>(
          stub,
          &Stub::async_interface::GetOrCreateIteration,
          std::move(req), absl::Seconds(30), in_flight,
          [&, c, k](const grpc::Status& st, const proto::GetOrCreateIterationRequest&,
                    const proto::GetOrCreateIterationResponse&, double ms) {
            completed(st, ms);
            next(c, k + 1, -1);
          });
    } else {
      // A worker's fetch that reports the split it finished: one split
      // completed and one created per call.
      proto::GetSplitRequest req;
      req.set_worker_address(worker_address);
      req.set_task_id(tasks[static_cast<size_t>(c)]);
      req.set_epoch(0);
      if (held >= 0) req.add_completed_splits(held);
      CallAsync<proto::GetSplitRequest, proto::GetSplitResponse>(
          stub,
          &Stub::async_interface::GetSplit,
          std::move(req), absl::Seconds(30), in_flight,
          [&, c, k, held](const grpc::Status& st, const proto::GetSplitRequest&,
                          const proto::GetSplitResponse& r, double ms) {
            completed(st, ms);
            const int64_t now_held =
                !st.ok() ? held : r.has_split() ? r.split().split_id() : -1;
            next(c, k + 1, now_held);
          });
    }
  };
  for (int c = 0; c < callers; ++c) next(c, 0, -1);
  in_flight.WaitForAll();
  const double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const Usage u1 = ReadUsage(*d);
  done = true;
  if (keepalive.joinable()) keepalive.join();
  if (worker_fd >= 0) close(worker_fd);
  row.calls_per_s = static_cast<double>(calls.load()) / secs;
  row.p50_ms = lat.Percentile(0.5);
  row.p99_ms = lat.Percentile(0.99);
  row.fsyncs_per_s = Syncs(u0, u1) / secs;
  row.errors = errors.load();
  if (row.errors > 0) row.error = absl::StrCat(row.errors, " call(s) failed, e.g. ", last_error);
  return row;
}

}  // namespace

absl::Status RunDispatcher(const DispatcherArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  SLUICE_ASSIGN_OR_RETURN(const std::string binary, LocateDispatcherBinary(a.dispatcher_binary));
  FleetOptions fo;
  fo.workers = a.workers > 0 ? a.workers : quick ? 200 : 2000;
  fo.consumers = a.consumers > 0 ? a.consumers : quick ? 200 : 2000;
  fo.jobs = a.jobs > 0 ? a.jobs : quick ? 20 : 200;
  fo.splits_per_worker_s = a.splits_per_worker_s;
  fo.connections = a.connections;
  fo.map_ops = a.map_ops;
  fo.seconds = a.seconds > 0 ? a.seconds : quick ? 10 : 60;
  const double rate_seconds = a.rate_seconds > 0 ? a.rate_seconds : quick ? 2 : 5;
  if (fo.jobs > fo.consumers) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs ", fo.jobs, " > --consumers ",
                                                   fo.consumers, ": every job needs a consumer"));
  }
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(const DispatcherEnv env, SlowSyncEnv(a.journal_sync_delay_us));
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf_dispatcher"));
  if (a.common.keep_logs) scratch.Keep();
  bool any_failed = false;

  // calls/s
  std::vector<RateRow> rates;
  if (!a.no_rates) {
    const std::vector<std::string> ops = {"RegisterDataset", "GetOrCreateIteration", "GetSplit"};
    Progress progress("dispatcher calls/s", static_cast<int>(ops.size() * a.callers.size()));
    for (const auto& op : ops) {
      for (int callers : a.callers) {
        progress.Step(absl::StrCat(op, ", ", callers, " caller(s)"));
        rates.push_back(RunRate(binary, scratch, op, callers, rate_seconds, env));
        if (!rates.back().error.empty()) {
          std::fprintf(stderr, "\nsluice-perf: dispatcher %s x%d: %s\n", op.c_str(), callers,
                       rates.back().error.c_str());
          any_failed = true;
        }
      }
    }
    progress.Finish();
  }

  // The fleet.
  struct FleetResult {
    bool ran = false;
    std::string error;
    double setup_s = 0, warmup_s = 0, seconds = 0;
    // When the workers held every task (the consumers knew theirs at warmup_s).
    double workers_up_s = -1;
    int64_t registered = 0, tasks = 0;
    double lost_in_warmup = 0, lost = 0;
    double cpu_cores = 0, sim_cpu_cores = 0;
    int64_t rss = 0, peak_rss = 0;
    double journal_bytes_per_s = 0, records_per_s = 0, fsyncs_per_s = 0;
    double worker_hb_per_s = 0, client_hb_per_s = 0, splits_per_s = 0;
    double wl[3] = {0, 0, 0}, cl[3] = {0, 0, 0}, gs[3] = {0, 0, 0}, rp[3] = {0, 0, 0};
    int64_t errors = 0;
    std::string last_error;
    int64_t journal_bytes = 0, restart_peak_rss = 0;  // the restart from the journal
    double restart_s = 0;
  } fr;
  if (!a.no_fleet) {
    auto d = StartDispatcherProcess(binary, scratch.path(), "fleet", {}, env);
    if (!d.ok()) {
      fr.error = OneLine(d.status());
    } else {
      fr.ran = true;
      Fleet fleet(fo, d->port);
      const auto t0 = SteadyClock::now();
      std::fprintf(stderr, "fleet: %d workers, %d consumers, %d jobs: registering the jobs\n",
                   fo.workers, fo.consumers, fo.jobs);
      absl::Status s = fleet.Setup();
      fr.setup_s = MsSince(t0) / 1000;
      if (!s.ok()) {
        fr.error = OneLine(s);
      } else {
        fleet.StartHeartbeats();
        // Up when every worker holds its tasks (one per job) and every
        // consumer knows every task of its iteration (one per worker).
        const int64_t want_tasks = int64_t{fo.workers} * fo.jobs;
        const int64_t want_known = int64_t{fo.consumers} * fo.workers;
        const auto w0 = SteadyClock::now();
        double last_print = 0;
        while (fleet.registered() < fo.workers || fleet.tasks_held() < want_tasks ||
               fleet.tasks_known() < want_known) {
          const double el = MsSince(w0) / 1000;
          if (fr.workers_up_s < 0 && fleet.tasks_held() >= want_tasks) fr.workers_up_s = el;
          const std::string progress = absl::StrCat(
              fleet.registered(), "/", fo.workers, " workers registered, ", fleet.tasks_held(),
              "/", want_tasks, " tasks held, ", fleet.tasks_known(), "/", want_known,
              " tasks known to the consumers");
          if (el > fo.warmup_timeout_s) {
            fr.error = absl::StrCat("warm-up: after ", fo.warmup_timeout_s, " s, ", progress,
                                    "; last error: ", fleet.last_error());
            break;
          }
          if (el - last_print >= 5) {
            last_print = el;
            std::fprintf(stderr, "fleet: warm-up %.0f s: %s, %.0f workers lost so far\n", el,
                         progress.c_str(),
                         Metric(ReadMetrics(d->metrics_port), "sluice_dispatcher_lost_workers_total",
                                0));
          }
          absl::SleepFor(absl::Milliseconds(100));
        }
        fr.warmup_s = MsSince(w0) / 1000;
        if (fr.workers_up_s < 0 && fr.error.empty()) fr.workers_up_s = fr.warmup_s;
        fr.registered = fleet.registered();
        fr.tasks = fleet.tasks_held();
        fr.lost_in_warmup = ReadUsage(*d).lost_workers;
        if (fr.error.empty()) {
          fleet.StartSplits();
          absl::SleepFor(absl::Seconds(2));  // the split loops reach their rate
          for (Latencies* l : {&fleet.worker_late, &fleet.client_late, &fleet.get_split,
                               &fleet.report}) {
            l->Clear();
          }
          const Usage u0 = ReadUsage(*d);
          const double sim0 = SelfCpuSeconds();
          const int64_t whb0 = fleet.worker_heartbeats(), chb0 = fleet.client_heartbeats(),
                        sp0 = fleet.splits(), e0 = fleet.errors();
          const auto m0 = SteadyClock::now();
          for (double el = 0; el < fo.seconds; el = MsSince(m0) / 1000) {
            absl::SleepFor(absl::Milliseconds(std::min(5000.0, (fo.seconds - el) * 1000)));
            std::fprintf(stderr, "fleet: measuring %.0f/%.0f s, %lld splits, %lld errors\n",
                         MsSince(m0) / 1000, fo.seconds,
                         static_cast<long long>(fleet.splits() - sp0),
                         static_cast<long long>(fleet.errors() - e0));
          }
          const double secs = MsSince(m0) / 1000;
          // (Before ReadUsage: its metrics request waits for the dispatcher,
          // seconds when it is overloaded, while the simulator runs on.)
          fr.sim_cpu_cores = (SelfCpuSeconds() - sim0) / secs;
          const Usage u1 = ReadUsage(*d);
          fr.seconds = secs;
          fr.cpu_cores = (u1.cpu_s - u0.cpu_s) / secs;
          fr.rss = ProcRss(absl::StrCat(d->child->pid())).value_or(0);
          fr.peak_rss = ProcPeakRss(absl::StrCat(d->child->pid())).value_or(0);
          fr.journal_bytes_per_s = static_cast<double>(u1.write_bytes - u0.write_bytes) / secs;
          fr.records_per_s = (u1.journal_records - u0.journal_records) / secs;
          fr.fsyncs_per_s = Syncs(u0, u1) / secs;
          fr.lost = u1.lost_workers - u0.lost_workers;
          fr.worker_hb_per_s = static_cast<double>(fleet.worker_heartbeats() - whb0) / secs;
          fr.client_hb_per_s = static_cast<double>(fleet.client_heartbeats() - chb0) / secs;
          fr.splits_per_s = static_cast<double>(fleet.splits() - sp0) / secs;
          const double ps[3] = {0.5, 0.99, 0.999};
          for (int i = 0; i < 3; ++i) {
            fr.wl[i] = fleet.worker_late.Percentile(ps[i]);
            fr.cl[i] = fleet.client_late.Percentile(ps[i]);
            fr.gs[i] = fleet.get_split.Percentile(ps[i]);
            fr.rp[i] = fleet.report.Percentile(ps[i]);
          }
          fr.errors = fleet.errors() - e0;
          fr.last_error = fleet.last_error();
        }
      }
      d->child->KillAndReap();  // fails the long polls in flight at once
      fleet.Stop(absl::Seconds(30));
      if (fr.error.empty() && fr.seconds > 0) {
        // The restart: a new process replays the journal of the one just
        // killed; it writes its port file once it serves.
        std::error_code ec;
        for (const auto& f : std::filesystem::directory_iterator(d->work_dir, ec)) {
          fr.journal_bytes += static_cast<int64_t>(f.file_size(ec));
        }
        const std::string log = absl::StrCat(scratch.path(), "/fleet.log");
        std::filesystem::rename(log, absl::StrCat(scratch.path(), "/fleet-before-restart.log"), ec);
        std::filesystem::remove(absl::StrCat(scratch.path(), "/fleet.port"), ec);
        const auto r0 = SteadyClock::now();
        auto r = StartDispatcherProcess(binary, scratch.path(), "fleet", {}, env);
        if (r.ok()) {
          fr.restart_s = MsSince(r0) / 1000;
          fr.restart_peak_rss = ProcPeakRss(absl::StrCat(r->child->pid())).value_or(0);
          r->child->KillAndReap();
        } else {
          fr.error = absl::StrCat("restart from the journal: ", OneLine(r.status()));
        }
      }
    }
    if (!fr.error.empty()) {
      std::fprintf(stderr, "sluice-perf: dispatcher fleet: %s\n", fr.error.c_str());
      any_failed = true;
    }
  }

  // The report.
  std::printf("sluice-perf dispatcher%s: one sluice-dispatcher process (fault-tolerant, journal "
              "fsync'd, %s)\n",
              quick ? " --quick" : "", binary.c_str());
  if (a.journal_sync_delay_us > 0) {
    std::printf("journal syncs made %lld us longer than this machine's disk made them "
                "(--journal_sync_delay_us: a slower disk, emulated)\n",
                static_cast<long long>(a.journal_sync_delay_us));
  }
  std::printf("machine: %s\n", machine.Describe().c_str());
  Report report;
  report.mode = "dispatcher";
  report.command = command;
  report.machine = machine;
  report.fields.emplace_back("journal_sync_delay_us", absl::StrCat(a.journal_sync_delay_us));
  if (!rates.empty()) {
    std::printf("\ncalls/s, closed loop, a fresh dispatcher per row (GetSplit: each call reports "
                "the caller's last split completed and takes a new one)\n");
    std::printf("%-22s %7s %10s %9s %9s %10s\n", "op", "callers", "calls/s", "p50 ms", "p99 ms",
                "fsyncs/s");
    std::vector<std::string> js;
    for (const auto& r : rates) {
      std::printf("%-22s %7d %10s %9s %9s %10s%s\n", r.op.c_str(), r.callers,
                  Count(r.calls_per_s).c_str(), Num(r.p50_ms).c_str(), Num(r.p99_ms).c_str(),
                  Count(r.fsyncs_per_s).c_str(), r.error.empty() ? "" : "  (errors)");
      JsonObject j;
      j.Add("op", r.op).Add("callers", r.callers).Add("calls_per_s", r.calls_per_s);
      j.Add("p50_ms", r.p50_ms).Add("p99_ms", r.p99_ms).Add("fsyncs_per_s", r.fsyncs_per_s);
      j.Add("error", r.error);
      js.push_back(j.str());
    }
    report.sections.emplace_back("rates", std::move(js));
  }
  if (fr.ran) {
    std::printf("\nfleet: %d workers, %d consumers, %d jobs (distributed_epoch, %d consumers "
                "each), %.3g split(s)/s per worker, heartbeats every %lld ms, %d connections\n",
                fo.workers, fo.consumers, fo.jobs, fo.consumers / fo.jobs, fo.splits_per_worker_s,
                static_cast<long long>(fo.heartbeat_ms), fo.connections);
    std::printf("  each job's dataset definition: %zu bytes (Range and %d Map(s), --map_ops)\n",
                FleetDataset(0, fo.map_ops).def().ByteSizeLong(), fo.map_ops);
    std::printf("  setup %.1f s, warm-up %.1f s (%lld workers registered, %lld tasks held by "
                "%.1f s, every consumer knowing its iteration's tasks by %.1f s; %.0f workers "
                "declared lost and back)\n",
                fr.setup_s, fr.warmup_s, static_cast<long long>(fr.registered),
                static_cast<long long>(fr.tasks), fr.workers_up_s, fr.warmup_s,
                fr.lost_in_warmup);
    if (fr.seconds > 0) {
      std::printf("  measured %.0f s: dispatcher %.2f cores (simulator %.2f), RSS %.0f MiB "
                  "(peak %.0f MiB)\n",
                  fr.seconds, fr.cpu_cores, fr.sim_cpu_cores, static_cast<double>(fr.rss) / kMiB,
                  static_cast<double>(fr.peak_rss) / kMiB);
      std::printf("  journal: %s records/s, %s fsyncs/s, %.2f MiB/s written to disk\n",
                  Count(fr.records_per_s).c_str(), Count(fr.fsyncs_per_s).c_str(),
                  fr.journal_bytes_per_s / kMiB);
      std::printf("  calls: %s worker heartbeats/s, %s client heartbeats/s, %s splits/s\n",
                  Count(fr.worker_hb_per_s).c_str(), Count(fr.client_hb_per_s).c_str(),
                  Count(fr.splits_per_s).c_str());
      std::printf("  %-34s %9s %9s %9s\n", "ms", "p50", "p99", "p99.9");
      auto line = [](const char* what, const double* v) {
        std::printf("  %-34s %9s %9s %9s\n", what, Num(v[0]).c_str(), Num(v[1]).c_str(),
                    Num(v[2]).c_str());
      };
      line("worker heartbeat lateness", fr.wl);
      line("client heartbeat lateness", fr.cl);
      line("GetSplit (a split handed out)", fr.gs);
      line("GetSplit report_only", fr.rp);
      std::printf("  workers declared lost while measuring: %.0f\n", fr.lost);
      std::printf("  errors: %lld%s%s\n", static_cast<long long>(fr.errors),
                  fr.errors > 0 ? ", e.g. " : "", fr.errors > 0 ? fr.last_error.c_str() : "");
    }
    if (fr.restart_s > 0) {
      std::printf("  restart (killed, then a new process replays its journal of %.1f MiB): "
                  "serving after %.2f s, peak RSS %.0f MiB\n",
                  static_cast<double>(fr.journal_bytes) / kMiB, fr.restart_s,
                  static_cast<double>(fr.restart_peak_rss) / kMiB);
    }
    JsonObject j;
    j.Add("workers", fo.workers).Add("consumers", fo.consumers).Add("jobs", fo.jobs);
    j.Add("splits_per_worker_s", fo.splits_per_worker_s).Add("connections", fo.connections);
    j.Add("setup_s", fr.setup_s).Add("warmup_s", fr.warmup_s).Add("seconds", fr.seconds);
    j.Add("workers_up_s", fr.workers_up_s);
    j.Add("registered", fr.registered).Add("tasks", fr.tasks);
    j.Add("lost_in_warmup", fr.lost_in_warmup).Add("lost_workers", fr.lost);
    j.Add("dispatcher_cores", fr.cpu_cores).Add("simulator_cores", fr.sim_cpu_cores);
    j.Add("rss_bytes", fr.rss).Add("peak_rss_bytes", fr.peak_rss);
    j.Add("journal_records_per_s", fr.records_per_s).Add("fsyncs_per_s", fr.fsyncs_per_s);
    j.Add("journal_bytes_per_s", fr.journal_bytes_per_s);
    j.Add("worker_heartbeats_per_s", fr.worker_hb_per_s);
    j.Add("client_heartbeats_per_s", fr.client_hb_per_s).Add("splits_per_s", fr.splits_per_s);
    const char* pn[3] = {"p50", "p99", "p999"};
    for (int i = 0; i < 3; ++i) {
      j.Add(absl::StrCat("worker_heartbeat_lateness_ms_", pn[i]), fr.wl[i]);
      j.Add(absl::StrCat("client_heartbeat_lateness_ms_", pn[i]), fr.cl[i]);
      j.Add(absl::StrCat("get_split_ms_", pn[i]), fr.gs[i]);
      j.Add(absl::StrCat("report_ms_", pn[i]), fr.rp[i]);
    }
    j.Add("errors", fr.errors).Add("error", fr.error);
    j.Add("map_ops", fo.map_ops).Add("journal_bytes", fr.journal_bytes);
    j.Add("restart_s", fr.restart_s).Add("restart_peak_rss_bytes", fr.restart_peak_rss);
    report.fields.emplace_back("fleet", j.str());
    report.notes.push_back(
        "targets (issue: control plane v2): with 2,000 workers and 2,000 consumers the dispatcher "
        "under 1 core, heartbeat p99 under 50 ms, GetSplit p99 under 10 ms; GetSplit with 64 "
        "callers at least 10x today's main (run --dispatcher_binary with a build of it)");
    report.notes.push_back(
        "the simulator shares this machine's cpus with the dispatcher: on a small machine its "
        "own CPU (shown) competes with the dispatcher's");
  }
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
