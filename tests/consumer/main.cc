// Links an installed sluice and runs the seed pipeline locally.
#include <cstdio>

#include <sluice/sluice.h>

int main() {
  using sluice::expr::x;
  auto it = sluice::Dataset::Range(5).Map(x * x).Map(x + 1).MakeIterator();
  if (!it.ok()) return 2;
  while (true) {
    auto e = (*it)->Next();
    if (!e.ok()) return 3;
    if (!e->has_value()) break;
    std::printf("%lld ", static_cast<long long>((**e)[0].at<int64_t>(0)));
  }
  std::printf("\n");
  return 0;
}
