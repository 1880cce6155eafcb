// Test helpers: can this machine give memory huge pages, and was a mapping
// advised for them.
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

// Whether the mapping that holds `p` is advised for huge pages (the "hg"
// flag in its VmFlags, /proc/self/smaps): what sluice controls. Whether the
// kernel then finds free 2 MiB pages (AnonHugePages) depends on the
// machine's memory, so tests do not assert it.
inline bool HugePagesAdvised(const void* p) {
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
    if (inside && line.rfind("VmFlags:", 0) == 0) return (line + " ").find(" hg ") != std::string::npos;
  }
  return false;
}

// Skips where huge pages cannot be asked for: turned off, or a kernel
// without transparent huge pages.
#define SLUICE_SKIP_WITHOUT_HUGE_PAGES()                                              \
  do {                                                                                \
    if (!::sluice::HugePagesEnabled()) GTEST_SKIP() << "SLUICE_HUGE_PAGES turns them off"; \
    if (::sluice_test::ThpMode().empty()) {                                           \
      GTEST_SKIP() << "this kernel has no transparent huge pages";                    \
    }                                                                                 \
  } while (false)

}  // namespace sluice_test
