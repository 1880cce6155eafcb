// The service demo: an in-process dispatcher and two workers.
//  1. The seed example: Range(5).Map(x*x).Distribute(parallel_epochs).Map(x+1)
//     -> every worker produces the whole dataset, so each of 1 2 5 10 17
//     arrives twice.
//  2. A shared job: two consumers read job "shared" for three iterations
//     and split each iteration's elements between them.
#include <algorithm>
#include <cstdio>
#include <thread>

#include <sluice/sluice.h>

namespace {

using sluice::expr::x;

// Reads one pass; returns the int64 values or prints the error.
bool Drain(const sluice::Dataset& ds, std::vector<int64_t>* out) {
  auto it = ds.MakeIterator();
  if (!it.ok()) {
    std::fprintf(stderr, "error: %s\n", it.status().ToString().c_str());
    return false;
  }
  while (true) {
    auto e = (*it)->Next();
    if (!e.ok()) {
      std::fprintf(stderr, "error: %s\n", e.status().ToString().c_str());
      return false;
    }
    if (!e->has_value()) return true;
    out->push_back((**e)[0].at<int64_t>(0));
  }
}

std::string Join(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  std::string s;
  for (int64_t x : v) s += std::to_string(x) + " ";
  return s;
}

}  // namespace

int main() {
  auto dispatcher = sluice::DispatchServer::Start({});
  if (!dispatcher.ok()) {
    std::fprintf(stderr, "dispatcher: %s\n", dispatcher.status().ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<sluice::WorkerServer>> workers;
  for (int i = 0; i < 2; ++i) {
    sluice::WorkerConfig wc;
    wc.dispatcher_address = (*dispatcher)->address();
    auto w = sluice::WorkerServer::Start(wc);
    if (!w.ok()) {
      std::fprintf(stderr, "worker: %s\n", w.status().ToString().c_str());
      return 1;
    }
    workers.push_back(*std::move(w));
  }
  std::printf("dispatcher %s, workers %s %s\n", (*dispatcher)->target().c_str(),
              workers[0]->address().c_str(), workers[1]->address().c_str());

  sluice::DistributeOptions opt;
  opt.service = (*dispatcher)->target();
  opt.processing_mode = "parallel_epochs";
  auto seed = sluice::Dataset::Range(5).Map(x * x).Distribute(opt).Map(x + 1);
  std::vector<int64_t> got;
  if (!Drain(seed, &got)) return 1;
  std::printf("seed example (2 workers, parallel_epochs), sorted: %s\n", Join(got).c_str());

  // Each consumer builds its own dataset (as each trainer process would);
  // its k-th iterator reads the job's k-th iteration.
  opt.job_name = "shared";
  std::vector<int64_t> by_consumer[2][3];
  bool ok[2] = {true, true};
  std::thread consumers[2];
  for (int c = 0; c < 2; ++c) {
    consumers[c] = std::thread([&, c] {
      auto shared = sluice::Dataset::Range(10).Distribute(opt);
      for (int iteration = 0; iteration < 3 && ok[c]; ++iteration) {
        ok[c] = Drain(shared, &by_consumer[c][iteration]);
      }
    });
  }
  for (auto& t : consumers) t.join();
  if (!ok[0] || !ok[1]) return 1;
  for (int iteration = 0; iteration < 3; ++iteration) {
    std::vector<int64_t> all = by_consumer[0][iteration];
    all.insert(all.end(), by_consumer[1][iteration].begin(), by_consumer[1][iteration].end());
    std::printf("job 'shared' iteration %d: consumer 0 got [%s], consumer 1 got [%s]; union: %s\n",
                iteration, Join(by_consumer[0][iteration]).c_str(),
                Join(by_consumer[1][iteration]).c_str(), Join(all).c_str());
  }
  for (auto& w : workers) w->Stop();
  (*dispatcher)->Stop();
  return 0;
}
