// grpc.health.v1.Health on the dispatcher's and the worker's gRPC servers.
#include "sluice/control/dispatch_server.h"
#include "sluice/worker/worker_server.h"
#include "tests/obs/health_check_client.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using sluice_test::HealthCheck;
using sluice_test::kServing;

TEST(HealthTest, DispatcherAndWorkerServeHealthChecks) {
  DispatcherConfig dc;
  ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start(dc));
  EXPECT_EQ(HealthCheck(dispatcher->address()).value_or(-1), kServing);

  WorkerConfig wc;
  wc.dispatcher_address = dispatcher->address();
  wc.data_transfer_protocol = "grpc";
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerServer::Start(wc));
  EXPECT_EQ(HealthCheck(worker->address()).value_or(-1), kServing);

  // grpc's default service knows only the overall status ("").
  EXPECT_STATUS(HealthCheck(worker->address(), "no.such.Service"), absl::StatusCode::kNotFound,
                "");

  // Stopped servers no longer answer SERVING (they do not answer at all).
  const std::string worker_address = worker->address();
  worker->Stop();
  EXPECT_NE(HealthCheck(worker_address).value_or(-1), kServing);
  const std::string dispatcher_address = dispatcher->address();
  dispatcher->Stop();
  EXPECT_NE(HealthCheck(dispatcher_address).value_or(-1), kServing);
}

}  // namespace
}  // namespace sluice
