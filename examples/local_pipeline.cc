// The seed pipeline, run locally with no service:
//   Range(5).Map(x*x).Map(x+1)  ->  1 2 5 10 17
// then a larger pipeline that batches, shuffles and filters.
#include <cstdio>

#include <sluice/sluice.h>

namespace {

int Run(const sluice::Dataset& ds, const char* title) {
  std::printf("%s\n  ", title);
  auto it = ds.MakeIterator();
  if (!it.ok()) {
    std::fprintf(stderr, "error: %s\n", it.status().ToString().c_str());
    return 1;
  }
  while (true) {
    auto e = (*it)->Next();
    if (!e.ok()) {
      std::fprintf(stderr, "error: %s\n", e.status().ToString().c_str());
      return 1;
    }
    if (!e->has_value()) break;
    std::printf("%s ", sluice::ElementDebugString(**e).c_str());
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main() {
  using sluice::expr::x;
  auto seed = sluice::Dataset::Range(5).Map(x * x).Map(x + 1);
  if (Run(seed, "Range(5).Map(x*x).Map(x+1):") != 0) return 1;

  auto evens = sluice::Dataset::Range(20)
                   .Filter(x % 2 == 0)
                   .Map(x.Cast(sluice::DType::kFloat32) * 0.5)
                   .Shuffle(8, /*seed=*/42)
                   .Batch(4);
  return Run(evens, "Range(20).Filter(x%2==0).Map(float(x)*0.5).Shuffle(8, seed 42).Batch(4):");
}
