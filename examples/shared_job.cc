// Two consumers share job "shared" for three iterations: the k-th pass of
// each consumer reads the job's k-th iteration, and the consumers split its
// elements first-come-first-served. Each iteration both consumers join
// before either reads, as trainers starting together do; a reply then
// takes only its consumer's fair share of what is ready, so neither
// consumer takes the whole iteration before the other asks.
#include <algorithm>
#include <barrier>
#include <thread>

#include "embedded_service.h"

int main() {
  sluice_examples::EmbeddedService service;
  if (!service.Start(2)) return 1;
  sluice::DistributeOptions opt;
  opt.service = service.dispatcher->target();
  opt.job_name = "shared";
  constexpr int kConsumers = 2, kIterations = 3;
  std::vector<int64_t> got[kConsumers][kIterations];
  bool ok[kConsumers] = {true, true};
  std::barrier joined(kConsumers);
  std::vector<std::thread> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.emplace_back([&, c] {
      // Each consumer builds its own dataset, as separate trainers would.
      auto ds = sluice::Dataset::Range(10).Apply(sluice::Distribute(opt));
      for (int i = 0; i < kIterations; ++i) {
        auto it = ds.MakeIterator();
        if (!it.ok()) {
          std::fprintf(stderr, "error: %s\n", it.status().ToString().c_str());
          ok[c] = false;
        }
        joined.arrive_and_wait();  // both consumers joined iteration i
        if (ok[c]) ok[c] = sluice_examples::DrainInt64(**it, &got[c][i]);
      }
    });
  }
  for (auto& t : consumers) t.join();
  if (!ok[0] || !ok[1]) return 1;
  for (int i = 0; i < kIterations; ++i) {
    std::vector<int64_t> all = got[0][i];
    all.insert(all.end(), got[1][i].begin(), got[1][i].end());
    std::printf("iteration %d: consumer 0 got [ %s], consumer 1 got [ %s]; together: %s\n", i,
                sluice_examples::Sorted(got[0][i]).c_str(),
                sluice_examples::Sorted(got[1][i]).c_str(), sluice_examples::Sorted(all).c_str());
  }
  return 0;
}
