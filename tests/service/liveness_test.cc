// Hardening of the control plane against broken or hostile peers, with real
// sluice-dispatcher / sluice-worker processes (multiprocess_util.h) and raw
// gRPC calls shaped the way such a peer would send them. Labelled `fault`
// (scripts/test.sh repeats them):
//  - a long poll asking for an hour, or cancelled by its caller, does not
//    keep a worker alive past worker_timeout_ms;
//  - a SIGKILLed worker with a long heartbeat interval is lost within
//    worker_timeout_ms + 1 s;
//  - workers with bogus protocols, wildcard or unreachable addresses are
//    refused and cannot stall a real pipeline;
//  - updates and heartbeats naming unknown workers or other workers' tasks
//    are refused and change nothing;
//  - a second server on a live port fails with a clear error;
//  - invalid UTF-8 in a request leaves a JSON log parseable.
// The time bounds asserted are the service's liveness contract
// (docs/service.md, "Liveness"), not performance thresholds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sluice/client/distribute.h"
#include "sluice/dataset/dataset.h"
#include "tests/service/multiprocess_util.h"
#include "tests/test_util.h"

namespace sluice::mp_test {
namespace {

using ::testing::HasSubstr;

// A TCP listener on loopback that accepts nothing: connections complete in
// the kernel's backlog, so the dispatcher's reachability probe succeeds.
class LoopbackListener {
 public:
  LoopbackListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~LoopbackListener() {
    if (fd_ >= 0) close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  bool ok() const { return port_ > 0; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class LivenessTest : public MultiProcessTest {
 protected:
  std::unique_ptr<proto::DispatcherService::Stub> Stub() {
    return proto::DispatcherService::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", dispatcher_port_), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Heartbeat(const proto::WorkerHeartbeatRequest& req, absl::Duration deadline,
                         proto::WorkerHeartbeatResponse* resp = nullptr) {
    proto::WorkerHeartbeatResponse ignored;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    return Stub()->WorkerHeartbeat(&ctx, req, resp != nullptr ? resp : &ignored);
  }

  grpc::Status Update(const proto::WorkerUpdateRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::WorkerUpdateResponse resp;
    return Stub()->WorkerUpdate(&ctx, req, &resp);
  }

  // Whether the dispatcher lists a worker at `address`.
  bool Listed(const std::string& address) {
    auto workers = GetWorkers(absl::StrCat("127.0.0.1:", dispatcher_port_));
    EXPECT_OK(workers.status());
    if (!workers.ok()) return false;
    for (const auto& w : workers->workers()) {
      if (w.address() == address) return true;
    }
    return false;
  }

  // Polls until `address` is no longer listed; how long that took.
  absl::StatusOr<absl::Duration> TimeUntilUnlisted(const std::string& address,
                                                   absl::Time since) {
    absl::Status s = WaitUntil([&] { return !Listed(address); }, absl::Seconds(60),
                               absl::StrCat("worker ", address, " leaving GetWorkers"));
    if (!s.ok()) return s;
    return absl::Now() - since;
  }
};

// The first report: WorkerHeartbeat with wait_ms = 1 h and a short
// client deadline registered a worker that was still listed long after
// worker_timeout_ms. The dispatcher now bounds the wait and notices the
// cancellation, so the worker's liveness runs out worker_timeout_ms after
// its request.
TEST_F(LivenessTest, CancelledHourLongPollDoesNotKeepAWorkerAlive) {
  constexpr int64_t kTimeoutMs = 4000;
  ASSERT_OK(StartCluster(0, {"--worker_timeout_ms", std::to_string(kTimeoutMs)}, {}));
  LoopbackListener fake;
  ASSERT_TRUE(fake.ok());
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address(fake.address());
  req.set_transfer_protocol("grpc");
  req.set_wait_ms(3600000);
  const absl::Time sent = absl::Now();
  grpc::Status s = Heartbeat(req, absl::Milliseconds(300));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  ASSERT_TRUE(Listed(fake.address())) << "the heartbeat should have registered the worker";
  ASSERT_OK_AND_ASSIGN(absl::Duration gone, TimeUntilUnlisted(fake.address(), sent));
  EXPECT_LE(gone, absl::Milliseconds(kTimeoutMs + 1000))
      << "a worker whose only heartbeat was cancelled stayed listed";
}

// Without a client deadline, the server still answers an hour-long poll
// within a third of worker_timeout_ms.
TEST_F(LivenessTest, LongPollIsBoundedByTheServer) {
  ASSERT_OK(StartCluster(0, {"--worker_timeout_ms", "3000"}, {}));
  LoopbackListener fake;
  ASSERT_TRUE(fake.ok());
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address(fake.address());
  req.set_transfer_protocol("grpc");
  ASSERT_TRUE(Heartbeat(req, absl::Seconds(10)).ok());  // registers
  req.set_wait_ms(3600000);
  proto::WorkerHeartbeatResponse resp;
  // A hang guard: the old dispatcher held this call for the full hour.
  grpc::Status s = Heartbeat(req, absl::Seconds(30), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.worker_timeout_ms(), 3000);
}

// A worker whose heartbeat interval is far above the dispatcher's timeout
// is still declared lost within worker_timeout_ms + 1 s of a SIGKILL, and
// it warns about the interval at start.
TEST_F(LivenessTest, KilledWorkerWithLongHeartbeatIntervalIsLostWithinTheTimeout) {
  constexpr int64_t kTimeoutMs = 3000;
  ASSERT_OK(StartCluster(1, {"--worker_timeout_ms", std::to_string(kTimeoutMs)},
                         {"--heartbeat_interval_ms", "20000"}));
  const std::string worker = absl::StrCat("127.0.0.1:", worker_ports_[0]);
  ASSERT_TRUE(Listed(worker));
  // Let it settle into its long poll.
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_TRUE(Listed(worker)) << "a live worker with a long interval was dropped";
  workers_[0]->KillAndReap();
  const absl::Time killed = absl::Now();
  ASSERT_OK_AND_ASSIGN(absl::Duration gone, TimeUntilUnlisted(worker, killed));
  EXPECT_LE(gone, absl::Milliseconds(kTimeoutMs + 1000));
  EXPECT_THAT(workers_[0]->log(), HasSubstr("heartbeat_interval_ms=20000 is longer than"));
  EXPECT_THAT(dispatcher_->log(), HasSubstr("worker_timeout_ms=3000"));
}

// Heartbeats for addresses where nothing listens, or with made-up
// protocols, register nothing; a real distributed_epoch pipeline started
// afterwards delivers every element once.
TEST_F(LivenessTest, BogusAndUnreachableWorkersAreRefused) {
  ASSERT_OK(StartCluster(2, {"--worker_timeout_ms", "3000"}, {"--heartbeat_interval_ms", "200"}));
  LoopbackListener live;
  ASSERT_TRUE(live.ok());
  struct Case {
    std::string address, transfer_address, protocol;
    grpc::StatusCode code;
    std::string message;
  };
  const std::string nowhere = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  const std::vector<Case> cases = {
      {nowhere, "", "grpc", grpc::StatusCode::FAILED_PRECONDITION, "cannot reach"},
      {live.address(), "", "../../../etc/passwd", grpc::StatusCode::INVALID_ARGUMENT,
       "not a protocol name"},
      {live.address(), "", "ucx tcp", grpc::StatusCode::INVALID_ARGUMENT, "not a protocol name"},
      {live.address(), "", std::string(40, 'u'), grpc::StatusCode::INVALID_ARGUMENT,
       "not a protocol name"},
      {"0.0.0.0:7", "", "grpc", grpc::StatusCode::INVALID_ARGUMENT, "wildcard"},
      {"not an address", "", "grpc", grpc::StatusCode::INVALID_ARGUMENT, "worker_address"},
      {live.address(), nowhere, "ucx", grpc::StatusCode::FAILED_PRECONDITION,
       "data address (ucx)"},
  };
  for (const Case& c : cases) {
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(c.address);
    req.set_transfer_address(c.transfer_address);
    req.set_transfer_protocol(c.protocol);
    grpc::Status s = Heartbeat(req, absl::Seconds(10));
    EXPECT_EQ(s.error_code(), c.code) << c.address << " " << c.protocol << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  auto workers = GetWorkers(absl::StrCat("127.0.0.1:", dispatcher_port_));
  ASSERT_OK(workers.status());
  EXPECT_EQ(workers->workers_size(), 2) << workers->DebugString();

  Watchdog watchdog(absl::Seconds(120), "the pipeline after refused workers",
                    [this] { KillAllChildren(); });
  constexpr int64_t kN = 3000;
  DistributeOptions opt;
  opt.service = ServiceTarget();
  opt.processing_mode = "distributed_epoch";
  std::vector<int64_t> values;
  {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(opt)).MakeIterator());
    ASSERT_OK(Drain(*it, &values));
  }
  watchdog.Disarm();
  std::sort(values.begin(), values.end());
  std::vector<int64_t> expected(kN);
  for (int64_t i = 0; i < kN; ++i) expected[i] = i;
  EXPECT_EQ(values, expected);
}

// WorkerUpdates and heartbeats naming unknown workers, unknown tasks or
// another worker's tasks are refused, and the iteration they tried to end
// delivers everything.
TEST_F(LivenessTest, UpdatesFromUnknownSendersChangeNothing) {
  ASSERT_OK(StartCluster(2, {}, {"--heartbeat_interval_ms", "200", "--task_buffer_elements", "2"}));
  constexpr int64_t kN = 400;
  DistributeOptions opt;
  opt.service = ServiceTarget();
  opt.max_outstanding_requests = 1;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(opt)).MakeIterator());
  std::vector<int64_t> values;
  ASSERT_OK_AND_ASSIGN(auto first, it->Next());
  ASSERT_TRUE(first.has_value());
  values.push_back((*first)[0].at<int64_t>(0));

  const std::string w0 = absl::StrCat("127.0.0.1:", worker_ports_[0]);
  const std::string w1 = absl::StrCat("127.0.0.1:", worker_ports_[1]);
  ASSERT_OK_AND_ASSIGN(auto tasks0, GetWorkerTasks(w0));
  ASSERT_EQ(tasks0.tasks_size(), 1);
  const int64_t task0 = tasks0.tasks(0).task_id();

  auto update = [](const std::string& worker, int64_t task) {
    proto::WorkerUpdateRequest req;
    req.set_worker_address(worker);
    auto* u = req.add_updates();
    u->set_task_id(task);
    u->set_completed(true);
    u->mutable_error()->set_code(13);
    u->mutable_error()->set_message("forged failure");
    return req;
  };
  grpc::Status s = Update(update("10.255.255.1:1", task0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = Update(update(w1, task0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  s = Update(update(w0, 987654321));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // A heartbeat claiming worker 0's task as finished only tells its sender
  // to delete it. (It lists worker 1's own task: a heartbeat that left it
  // out would say worker 1 restarted, which only the token can tell from
  // impersonation.)
  ASSERT_OK_AND_ASSIGN(auto tasks1, GetWorkerTasks(w1));
  ASSERT_EQ(tasks1.tasks_size(), 1);
  proto::WorkerHeartbeatRequest hb;
  hb.set_worker_address(w1);
  hb.add_current_tasks(tasks1.tasks(0).task_id());
  hb.add_current_tasks(task0);
  hb.add_finished_tasks(task0);
  proto::WorkerHeartbeatResponse hb_resp;
  s = Heartbeat(hb, absl::Seconds(10), &hb_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(hb_resp.tasks_to_delete(), ::testing::Contains(task0));

  Watchdog watchdog(absl::Seconds(120), "the iteration after forged updates",
                    [this] { KillAllChildren(); });
  ASSERT_OK(Drain(*it, &values));
  watchdog.Disarm();
  // Both workers' full copies: nothing was ended or failed by the forgeries.
  std::map<int64_t, int> counts;
  for (int64_t v : values) ++counts[v];
  EXPECT_EQ(static_cast<int64_t>(values.size()), 2 * kN);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(counts[i], 2) << "value " << i;
}

// gRPC's default SO_REUSEPORT let a second dispatcher start on a live port
// and take half the new connections. Now it fails, saying why; so does a
// second worker.
TEST_F(LivenessTest, SecondServerOnALivePortFails) {
  ASSERT_OK(StartCluster(1, {}, {}));
  ChildProcess* second = Spawn(
      "dispatcher-2", SLUICE_DISPATCHER_BIN,
      {"--port", std::to_string(dispatcher_port_), "--log_format", "json"});
  ASSERT_NE(second, nullptr);
  auto status = second->WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "a second dispatcher on a live port keeps running";
  EXPECT_NE(*status, 0);
  EXPECT_THAT(second->log(), HasSubstr(absl::StrCat("port ", dispatcher_port_,
                                                    " is in use, another process serves it")));
  ChildProcess* worker = Spawn(
      "worker-2", SLUICE_WORKER_BIN,
      {"--dispatcher", absl::StrCat("127.0.0.1:", dispatcher_port_), "--port",
       std::to_string(worker_ports_[0])});
  ASSERT_NE(worker, nullptr);
  status = worker->WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "a second worker on a live port keeps running";
  EXPECT_NE(*status, 0);
  EXPECT_THAT(worker->log(), HasSubstr("is in use, another process serves it"));
  // The first dispatcher still serves everything.
  auto workers = GetWorkers(absl::StrCat("127.0.0.1:", dispatcher_port_));
  ASSERT_OK(workers.status());
  EXPECT_EQ(workers->workers_size(), 1);
}

// libprotobuf's complaint about invalid UTF-8 in a request goes through the
// logger: every line of a --log_format json log stays one JSON object.
TEST_F(LivenessTest, InvalidUtf8KeepsJsonLogsParseable) {
  ASSERT_OK(StartCluster(0, {"--log_format", "json"}, {}));
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address("\xff\xfe\xc3(:1");
  req.set_transfer_protocol("\xc0\xaf");
  grpc::Status s = Heartbeat(req, absl::Seconds(10));
  EXPECT_FALSE(s.ok());
  proto::WorkerUpdateRequest update;
  update.set_worker_address("\xed\xa0\x80");
  EXPECT_FALSE(Update(update).ok());
  ASSERT_OK(WaitUntil([&] { return dispatcher_->log().find("libprotobuf") != std::string::npos; },
                      absl::Seconds(10), "libprotobuf's message in the dispatcher's log"));
  const std::string log_path = scratch_.File("dispatcher.log");
  ChildProcess* python = Spawn(
      "python-json-check", "/usr/bin/python3",
      {"-c",
       "import json,sys\n"
       "for line in open(sys.argv[1], encoding='utf-8', errors='strict'):\n"
       "    obj = json.loads(line)\n"
       "    assert isinstance(obj, dict) and 'message' in obj, line\n",
       log_path});
  ASSERT_NE(python, nullptr);
  auto status = python->WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << "a line of the JSON log is not JSON:\n"
                        << python->log() << "\nlog:\n" << dispatcher_->log();
}

}  // namespace
}  // namespace sluice::mp_test
