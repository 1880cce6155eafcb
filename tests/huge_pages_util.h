// Test helpers: does this machine give advised memory huge pages, and how
// much of a mapping they back.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "sluice/core/huge_pages.h"

namespace sluice_test {

// The kernel's THP mode (the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled), or "" without THP.
inline std::string ThpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "";
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

// AnonHugePages (kB) of the mapping that holds `p`, from /proc/self/smaps;
// -1 when no mapping holds it.
inline int64_t AnonHugeKbOf(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stoll(line.substr(std::strlen("AnonHugePages:")));
    }
  }
  return -1;
}

// Skips unless this machine gives huge pages to advised memory.
#define SLUICE_SKIP_WITHOUT_HUGE_PAGES()                                                   \
  do {                                                                                     \
    if (!::sluice::HugePagesEnabled()) GTEST_SKIP() << "SLUICE_HUGE_PAGES turns them off"; \
    const std::string mode = ::sluice_test::ThpMode();                                     \
    if (mode != "always" && mode != "madvise") {                                           \
      GTEST_SKIP() << "the kernel's transparent huge pages are '" << mode << "'";          \
    }                                                                                      \
  } while (false)

}  // namespace sluice_test
