// sluice_test_client: a data-service consumer as its own process, for the
// multi-process fault tests (not installed).
//
//   sluice_test_client --service grpc://host:port --mode distributed_epoch --range 1000
//
// Reads Range(--range) through Distribute and prints each element on its own
// line of stdout, flushed at once, so a test can follow its progress: a
// scalar int64 element as its value, anything else as its debug string.
// Logs (spdlog) go to stderr, never to stdout. Exits 0 at the end of input,
// 1 with a message on stderr when the iterator fails, 2 on a usage error.
//
// --pause_after K --resume_file F: after printing K elements, stop reading
// (the iterator stays alive, heartbeating, with its requests buffered) until
// F exists. A test uses it to act at a known point of the stream (kill this
// process, cut a link) without racing the stream's end.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "sluice/client/distribute.h"
#include "sluice/core/logging.h"
#include "sluice/dataset/dataset.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace {

void PrintElement(const sluice::Element& e) {
  if (e.size() == 1 && e[0].dtype() == sluice::DType::kInt64 && e[0].shape().is_scalar()) {
    std::printf("%lld\n", static_cast<long long>(e[0].at<int64_t>(0)));
  } else {
    std::printf("%s\n", sluice::ElementDebugString(e).c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::DistributeOptions opt;
  int64_t range = 0;
  int64_t sleep_ms_per_element = 0;
  int64_t pause_after = -1;
  std::string resume_file;
  CLI::App app{"sluice_test_client: reads Range(N) from a sluice service, one element per line"};
  app.add_option("--service", opt.service, "the dispatcher, grpc://host:port")->required();
  app.add_option("--mode", opt.processing_mode,
                 "processing mode: parallel_epochs, distributed_epoch, ...")
      ->capture_default_str();
  app.add_option("--range", range, "the dataset: Range(N) before Distribute")->required();
  app.add_option("--job_name", opt.job_name, "share this job (default: an anonymous job)");
  app.add_option("--protocol", opt.data_transfer_protocol, "data transfer protocol: ucx or grpc")
      ->capture_default_str();
  app.add_option("--max_outstanding_requests", opt.max_outstanding_requests,
                 "element requests in flight or buffered")
      ->capture_default_str();
  app.add_option("--dispatcher_timeout_ms", opt.dispatcher_timeout_ms,
                 "fail when the dispatcher is unreachable this long")
      ->capture_default_str();
  app.add_option("--sleep_ms_per_element", sleep_ms_per_element,
                 "sleep this long after each element (a slow consumer)")
      ->capture_default_str();
  app.add_option("--pause_after", pause_after,
                 "after this many elements, wait until --resume_file exists");
  app.add_option("--resume_file", resume_file, "see --pause_after");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help or the usage error
    return rc == 0 ? 0 : 2;
  }
  if (pause_after >= 0 && resume_file.empty()) {
    std::fprintf(stderr, "sluice_test_client: --pause_after needs --resume_file\n");
    return 2;
  }
  // stdout carries the elements only.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("sluice_test_client"));
  sluice::InitLoggingFromEnv();

  auto ds = sluice::Dataset::Range(range).Apply(sluice::Distribute(opt));
  auto it = ds.MakeIterator();
  if (!it.ok()) {
    std::fprintf(stderr, "sluice_test_client: %s\n", it.status().ToString().c_str());
    return 1;
  }
  int64_t count = 0;
  while (true) {
    if (count == pause_after) {
      while (!std::filesystem::exists(resume_file)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    auto e = (*it)->Next();
    if (!e.ok()) {
      std::fprintf(stderr, "sluice_test_client: after %lld element(s): %s\n",
                   static_cast<long long>(count), e.status().ToString().c_str());
      return 1;
    }
    if (!e->has_value()) break;
    PrintElement(**e);
    ++count;
    if (sleep_ms_per_element > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_per_element));
    }
  }
  it->reset();  // releases the iteration before reporting the end
  std::fprintf(stderr, "sluice_test_client: end of input after %lld element(s)\n",
               static_cast<long long>(count));
  return 0;
}
