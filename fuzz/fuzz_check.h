// Invariant checks for fuzz targets: a failed check prints what failed and
// aborts, which libFuzzer reports as a crash (and the replay driver as a
// failed test). Active in every build type, unlike assert().
#pragma once

#include <cstdio>
#include <cstdlib>

#define SLUICE_FUZZ_CHECK(cond)                                                      \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                           \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
