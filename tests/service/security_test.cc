// Security of the service, end to end with an in-process dispatcher and
// workers on loopback: the shared-secret token on the control plane and on
// both data paths, TLS and mutual TLS on every gRPC connection (throwaway
// certificates made with the openssl CLI), and the request/element limits.
// ctest runs it under UCX_TLS=tcp and under shared memory. Timeouts here
// are hang guards (or the configured wait of a call expected to fail),
// never performance thresholds.

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sluice/client/distribute.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/rpc/security.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataset/dataset.h"
#include "sluice/worker/worker_server.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/service/security_test_util.h"

namespace sluice {
namespace {

using ::sluice_test::CollectScalars;
using ::testing::UnorderedElementsAreArray;
using ::sluice_test::MakePki;
using ::sluice_test::Pki;
using ::sluice_test::ScratchDir;

constexpr char kToken[] = "correct-horse-battery-staple";

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// Parameter: the data transfer protocol.
class SecurityTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new ScratchDir();
    pki_status_ = new absl::Status(MakePki(scratch_->path(), &pki_));
  }
  static void TearDownTestSuite() {
    delete scratch_;
    delete pki_status_;
    scratch_ = nullptr;
    pki_status_ = nullptr;
  }

  void StartDispatcher(DispatcherConfig dc = {}) {
    auto d = DispatchServer::Start(dc);
    ASSERT_OK(d);
    dispatcher_ = *std::move(d);
  }
  WorkerConfig Worker(const std::string& token, TlsConfig tls = {}) const {
    WorkerConfig wc;
    wc.dispatcher_address = dispatcher_->address();
    wc.heartbeat_interval_ms = 200;
    wc.dispatcher_timeout_ms = 5000;
    wc.data_transfer_protocol = GetParam();
    wc.auth_token = token;
    wc.tls = std::move(tls);
    return wc;
  }
  void StartWorker(const WorkerConfig& wc) {
    auto w = WorkerServer::Start(wc);
    ASSERT_OK(w);
    workers_.push_back(*std::move(w));
  }
  // A dispatcher and a worker requiring mutual TLS and kToken. The worker
  // serves with the server certificate and presents it to the dispatcher
  // as its client certificate.
  void StartMutualTlsService() {
    ASSERT_OK(*pki_status_);
    DispatcherConfig dc;
    dc.tls = pki_.server;
    dc.auth_token = kToken;
    StartDispatcher(dc);
    StartWorker(Worker(kToken, pki_.server));
  }
  DistributeOptions Options(const std::string& token, TlsConfig tls = {}) const {
    DistributeOptions o;
    o.service = dispatcher_->target();
    o.data_transfer_protocol = GetParam();
    o.fallback_to_grpc = false;  // a UCX run must really use UCX
    o.auth_token = token;
    o.tls = std::move(tls);
    o.dispatcher_timeout_ms = 5000;
    return o;
  }
  void TearDown() override {
    for (auto& w : workers_) w->Stop();
    if (dispatcher_) dispatcher_->Stop();
  }

  static ScratchDir* scratch_;
  static absl::Status* pki_status_;
  static Pki pki_;
  std::unique_ptr<DispatchServer> dispatcher_;
  std::vector<std::unique_ptr<WorkerServer>> workers_;
};
ScratchDir* SecurityTest::scratch_ = nullptr;
absl::Status* SecurityTest::pki_status_ = nullptr;
Pki SecurityTest::pki_;

TEST_P(SecurityTest, TheRightTokenWorksOnBothPlanes) {
  DispatcherConfig dc;
  dc.auth_token = kToken;
  StartDispatcher(dc);
  StartWorker(Worker(kToken));
  auto ds = Dataset::Range(20).Apply(Distribute(Options(kToken)));
  EXPECT_THAT(CollectScalars<int64_t>(ds).value(), UnorderedElementsAreArray(Iota(20)));
  DistributeOptions o = Options(kToken);
  ASSERT_OK_AND_ASSIGN(std::string id, RegisterDataset(Dataset::Range(5), o));
  auto by_id = FromDatasetId("parallel_epochs", o.service, id, o);
  EXPECT_THAT(CollectScalars<int64_t>(by_id).value(), UnorderedElementsAreArray(Iota(5)));
}

TEST_P(SecurityTest, TheClientReadsTheTokenFromTheEnvironment) {
  DispatcherConfig dc;
  dc.auth_token = kToken;
  StartDispatcher(dc);
  StartWorker(Worker(kToken));
  ASSERT_EQ(setenv("SLUICE_AUTH_TOKEN", kToken, 1), 0);
  auto got = CollectScalars<int64_t>(Dataset::Range(10).Apply(Distribute(Options(""))));
  unsetenv("SLUICE_AUTH_TOKEN");
  ASSERT_OK(got);
  EXPECT_THAT(*got, UnorderedElementsAreArray(Iota(10)));
}

TEST_P(SecurityTest, AWorkerWithoutTheTokenCannotRegister) {
  DispatcherConfig dc;
  dc.auth_token = kToken;
  StartDispatcher(dc);
  EXPECT_STATUS(WorkerServer::Start(Worker("")), absl::StatusCode::kUnauthenticated,
                "dispatcher refused the request: no auth token");
  EXPECT_STATUS(WorkerServer::Start(Worker("not-the-token")), absl::StatusCode::kUnauthenticated,
                "dispatcher refused the request: wrong auth token");
}

TEST_P(SecurityTest, AClientWithoutTheTokenCannotUseTheDispatcher) {
  DispatcherConfig dc;
  dc.auth_token = kToken;
  StartDispatcher(dc);
  StartWorker(Worker(kToken));
  for (const std::string token : {"", "wrong"}) {
    SCOPED_TRACE(token);
    DistributeOptions o = Options(token);
    // RegisterDataset, directly and as the iterator's first call.
    EXPECT_STATUS(RegisterDataset(Dataset::Range(5), o), absl::StatusCode::kUnauthenticated,
                  "dispatcher refused the request");
    EXPECT_STATUS(Dataset::Range(5).Apply(Distribute(o)).MakeIterator(),
                  absl::StatusCode::kUnauthenticated, "dispatcher refused the request");
  }
  // GetOrCreateJob (FromDatasetId registers nothing): a registered id is
  // not enough without the token.
  ASSERT_OK_AND_ASSIGN(std::string id, RegisterDataset(Dataset::Range(5), Options(kToken)));
  DistributeOptions bad = Options("wrong");
  EXPECT_STATUS(FromDatasetId("parallel_epochs", bad.service, id, bad).MakeIterator(),
                absl::StatusCode::kUnauthenticated, "dispatcher refused the request");
}

// The dispatcher lets the client in (it has no token), but the worker
// requires one: the client cannot read its elements on either data path.
TEST_P(SecurityTest, AWorkerRefusesElementsToAClientWithoutItsToken) {
  StartDispatcher();
  StartWorker(Worker(kToken));
  auto it = Dataset::Range(10).Apply(Distribute(Options("wrong"))).MakeIterator();
  ASSERT_OK(it);
  EXPECT_STATUS((*it)->Next(), absl::StatusCode::kUnauthenticated, "worker");
  // Straight at the worker's transports.
  ElementRequest req;
  req.wait = absl::ZeroDuration();
  for (const std::string token : {"", "wrong"}) {
    SCOPED_TRACE(token);
    ASSERT_OK_AND_ASSIGN(auto grpc,
                         MakeGrpcElementTransport(workers_[0]->address(), {{}, token}));
    EXPECT_STATUS(grpc->GetElement(req), absl::StatusCode::kUnauthenticated,
                  absl::StrCat("worker ", workers_[0]->address(), " refused the request"));
    if (GetParam() == "ucx") {
      ASSERT_OK_AND_ASSIGN(auto ucx,
                           MakeUcxElementTransport(workers_[0]->transfer_address(), token));
      EXPECT_STATUS(ucx->GetElement(req), absl::StatusCode::kUnauthenticated,
                    "refused the request");
    }
  }
  ASSERT_OK_AND_ASSIGN(auto good, MakeGrpcElementTransport(workers_[0]->address(), {{}, kToken}));
  EXPECT_OK(good->GetElement(req));  // not_ready (no such task), but admitted
}

// The token and the TLS files stay with the client (DistributeOptions),
// out of the dataset's definition, and reading still presents them.
TEST_P(SecurityTest, ADefinitionHoldsNoTokenAndNoTlsPath) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsService());
  DistributeOptions o = Options(kToken, pki_.client);
  ASSERT_OK_AND_ASSIGN(std::string id, RegisterDataset(Dataset::Range(5), o));
  const std::vector<std::pair<Dataset, std::vector<int64_t>>> datasets = {
      {Dataset::Range(20).Apply(Distribute(o)).Take(100), Iota(20)},
      {FromDatasetId("parallel_epochs", o.service, id, o), Iota(5)}};
  for (const auto& [ds, expected] : datasets) {
    ASSERT_OK_AND_ASSIGN(std::string bytes, ds.Serialize());
    for (const std::string& text : {bytes, ds.DebugString()}) {
      for (const std::string& secret :
           {std::string(kToken), o.tls.cert_file, o.tls.key_file, o.tls.ca_file}) {
        EXPECT_EQ(text.find(secret), std::string::npos) << secret;
      }
    }
    auto got = CollectScalars<int64_t>(ds);
    ASSERT_OK(got);
    EXPECT_THAT(*got, UnorderedElementsAreArray(expected));
    // Rebuilt from the definition, it has nothing to read the service with.
    ASSERT_OK_AND_ASSIGN(Dataset rebuilt, Dataset::Deserialize(bytes));
    EXPECT_STATUS(rebuilt.MakeIterator(), absl::StatusCode::kFailedPrecondition,
                  "rebuilt from its definition");
  }
}

TEST_P(SecurityTest, MutualTlsEverywhere) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsService());
  auto ds = Dataset::Range(20).Apply(Distribute(Options(kToken, pki_.client)));
  auto got = CollectScalars<int64_t>(ds);
  ASSERT_OK(got);
  EXPECT_THAT(*got, UnorderedElementsAreArray(Iota(20)));
  // And the gRPC data path straight at the worker, over mutual TLS.
  ElementRequest req;
  req.wait = absl::ZeroDuration();
  ASSERT_OK_AND_ASSIGN(auto t,
                       MakeGrpcElementTransport(workers_[0]->address(), {pki_.client, kToken}));
  EXPECT_OK(t->GetElement(req));
}

TEST_P(SecurityTest, TlsRefusesClientsWithoutAValidCertificateOrWithoutTls) {
  ASSERT_OK(*pki_status_);
  DispatcherConfig dc;
  dc.tls = pki_.server;
  StartDispatcher(dc);
  StartWorker(Worker("", pki_.server));
  auto expect_refused = [&](TlsConfig tls, const std::string& what) {
    SCOPED_TRACE(what);
    DistributeOptions o = Options("", std::move(tls));
    o.dispatcher_timeout_ms = 1000;  // the wait of a call that must fail
    EXPECT_STATUS(RegisterDataset(Dataset::Range(3), o), absl::StatusCode::kUnavailable,
                  "agree on TLS");
  };
  expect_refused({"", "", pki_.client.ca_file}, "TLS without a client certificate");
  expect_refused(pki_.rogue_client, "a client certificate from another CA");
  expect_refused({}, "plain text against a TLS server");
  // The worker's own gRPC server requires client certificates too.
  ElementRequest req;
  req.wait = absl::ZeroDuration();
  ASSERT_OK_AND_ASSIGN(auto plain, MakeGrpcElementTransport(workers_[0]->address()));
  EXPECT_STATUS(plain->GetElement(req), absl::StatusCode::kUnavailable, "GetElement from worker");
  ASSERT_OK_AND_ASSIGN(auto ok, MakeGrpcElementTransport(workers_[0]->address(), {pki_.client, ""}));
  EXPECT_OK(ok->GetElement(req));
}

TEST_P(SecurityTest, MissingOrBadTlsFilesAreClearErrors) {
  ASSERT_OK(*pki_status_);
  DispatcherConfig dc;
  dc.tls = pki_.server;
  dc.tls.cert_file = pki_.dir + "/does-not-exist.pem";
  EXPECT_STATUS(DispatchServer::Start(dc), absl::StatusCode::kInvalidArgument,
                "cannot read TLS cert_file '" + dc.tls.cert_file + "'");
  dc.tls = pki_.server;
  dc.tls.key_file.clear();
  EXPECT_STATUS(DispatchServer::Start(dc), absl::StatusCode::kInvalidArgument,
                "needs both cert_file and key_file");
  dc.tls = pki_.server;
  dc.tls.ca_file = pki_.dir + "/openssl.log";
  EXPECT_STATUS(DispatchServer::Start(dc), absl::StatusCode::kInvalidArgument, "not a PEM file");
  StartDispatcher();
  WorkerConfig wc = Worker("", pki_.server);
  wc.tls.key_file = pki_.dir + "/nope.key";
  EXPECT_STATUS(WorkerServer::Start(wc), absl::StatusCode::kInvalidArgument,
                "cannot read TLS key_file");
  DistributeOptions o = Options("", pki_.client);
  o.tls.ca_file = pki_.dir + "/nope.pem";
  EXPECT_STATUS(RegisterDataset(Dataset::Range(3), o), absl::StatusCode::kInvalidArgument,
                "cannot read TLS ca_file");
}

TEST_P(SecurityTest, OversizedRequestsAndElementsAreRefused) {
  DispatcherConfig dc;
  dc.max_request_bytes = 64 << 10;
  dc.max_dataset_def_bytes = 16 << 10;
  StartDispatcher(dc);
  StartWorker(Worker(""));
  auto constant = [](size_t bytes) {
    return Dataset::FromTensors({{Tensor::FromVector<uint8_t>(std::vector<uint8_t>(bytes, 1))}});
  };
  DistributeOptions o = Options("");
  EXPECT_STATUS(RegisterDataset(constant(32 << 10), o), absl::StatusCode::kInvalidArgument,
                "max_dataset_def_bytes");
  EXPECT_STATUS(RegisterDataset(constant(128 << 10), o), absl::StatusCode::kResourceExhausted,
                "");
  EXPECT_OK(RegisterDataset(constant(4 << 10), o));
  // An element larger than the client's limit fails the iterator.
  o.max_element_bytes = 8 << 10;
  auto ds = constant(12 << 10).Apply(Distribute(o));
  auto it = ds.MakeIterator();
  ASSERT_OK(it);
  EXPECT_STATUS((*it)->Next(), absl::StatusCode::kResourceExhausted, "");
}

TEST(ReadAuthTokenFileTest, StripsTheNewlineAndRefusesBadFiles) {
  ScratchDir dir;
  WriteFile(dir.File("token"), "s3cret\n");
  EXPECT_EQ(ReadAuthTokenFile(dir.File("token")).value_or(""), "s3cret");
  WriteFile(dir.File("crlf"), "s3cret\r\n");
  EXPECT_EQ(ReadAuthTokenFile(dir.File("crlf")).value_or(""), "s3cret");
  WriteFile(dir.File("empty"), "\n");
  EXPECT_STATUS(ReadAuthTokenFile(dir.File("empty")), absl::StatusCode::kInvalidArgument,
                "is empty");
  WriteFile(dir.File("spaces"), "two words\n");
  EXPECT_STATUS(ReadAuthTokenFile(dir.File("spaces")), absl::StatusCode::kInvalidArgument,
                "printable ASCII");
  EXPECT_STATUS(ReadAuthTokenFile(dir.File("missing")), absl::StatusCode::kInvalidArgument,
                "cannot read auth token file");
}

INSTANTIATE_TEST_SUITE_P(Protocols, SecurityTest, ::testing::Values("grpc", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sluice
