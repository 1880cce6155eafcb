// The seed example on an in-process service with two workers:
//   Range(5).Map(x*x) runs on the workers, .Map(x+1) runs here.
// parallel_epochs: every worker produces the whole dataset, so each of
// 1 2 5 10 17 arrives twice.
#include <algorithm>

#include "embedded_service.h"

int main() {
  using sluice::expr::x;
  sluice_examples::EmbeddedService service;
  if (!service.Start(2)) return 1;
  sluice::DistributeOptions opt;
  opt.service = service.dispatcher->target();
  opt.processing_mode = "parallel_epochs";
  auto ds = sluice::Dataset::Range(5).Map(x * x).Apply(sluice::Distribute(opt)).Map(x + 1);
  std::vector<int64_t> got;
  if (!sluice_examples::DrainInt64(ds, &got)) return 1;
  std::printf("Range(5).Map(x*x).Distribute(parallel_epochs).Map(x+1), sorted: %s\n",
              sluice_examples::Sorted(got).c_str());
  return 0;
}
