#include "sluice/core/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "spdlog/spdlog.h"

namespace sluice {

std::optional<bool> ParseHugePagesSetting(const char* value) {
  if (value == nullptr) return true;
  const std::string v = absl::AsciiStrToLower(value);
  if (v.empty() || v == "1" || v == "on" || v == "true" || v == "yes" || v == "auto") return true;
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  return std::nullopt;
}

bool HugePagesEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SLUICE_HUGE_PAGES");
    std::optional<bool> on = ParseHugePagesSetting(v);
    if (!on.has_value()) {
      spdlog::warn(
          "sluice: SLUICE_HUGE_PAGES='{}' is not one of 0/off/false/no or "
          "1/on/true/yes/auto; huge pages stay on",
          v);
      return true;
    }
    return *on;
  }();
  return enabled;
}

void* MapHugePageAligned(size_t bytes) {
  if (bytes == 0) return nullptr;
  // Over-map by one huge page and cut the ends off, so the start is aligned.
  const size_t span = bytes + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t end = (aligned + bytes + page - 1) / page * page;  // the mapping's own tail page
  if ((aligned > start && munmap(raw, aligned - start) != 0) ||
      (start + span > end && munmap(reinterpret_cast<void*>(end), start + span - end) != 0)) {
    munmap(raw, span);  // a cut failed (out of mappings): give it all back
    return nullptr;
  }
  void* p = reinterpret_cast<void*>(aligned);
  // The whole mapping, tail page included: one VMA, not split at the end.
  if (HugePagesEnabled()) madvise(p, end - aligned, MADV_HUGEPAGE);
  return p;
}

void UnmapHugePageAligned(void* data, size_t bytes) {
  if (data != nullptr) munmap(data, bytes);
}

}  // namespace sluice
