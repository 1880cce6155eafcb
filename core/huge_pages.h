// Transparent huge pages for the buffers bulk data crosses.
//
// Where the kernel's THP mode is "madvise" (Debian's and many distributions'
// default), anonymous memory gets 2 MiB pages only when a process asks for
// them. sluice asks for the receive and send arenas and for tensors of
// 2 MiB or more: a same-host transfer (UCX's cma, process_vm_readv) walks
// and pins every page of both buffers, 4096 of them per side for a 16 MiB
// element on 4 KiB pages and 8 on 2 MiB pages. On the transport suite's
// 16 MiB same-host row that was 1.6x the GB/s (perf/RESULTS.md).
//
// $SLUICE_HUGE_PAGES=0 (or off/false/no) turns it off for the process; it is
// read once. Where the kernel's mode is "never" the advice does nothing.
#pragma once

#include <cstddef>
#include <optional>

namespace sluice {

// Buffers from this size up are mapped on huge pages (one huge page).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// The switch's meaning for a value of $SLUICE_HUGE_PAGES (null: unset):
// false for 0/off/false/no, true for unset, 1/on/true/yes/auto; nullopt
// for anything else (the caller keeps the default and warns).
std::optional<bool> ParseHugePagesSetting(const char* value);
// Whether this process asks for huge pages ($SLUICE_HUGE_PAGES, read once;
// an unknown value warns once and keeps them on).
bool HugePagesEnabled();
// Whether a buffer of `bytes` is mapped on huge pages: from kHugePageBytes
// up, while huge pages are on. The one rule every allocator here follows.
inline bool WantsHugePages(size_t bytes) {
  return bytes >= kHugePageBytes && HugePagesEnabled();
}

// Anonymous memory of `bytes`, aligned to kHugePageBytes (so every whole
// 2 MiB of it can be one huge page, also on kernels before 6.7, which do not
// align large mappings themselves) and advised when huge pages are on; null
// when the kernel refuses. Free it with UnmapHugePageAligned(p, bytes).
void* MapHugePageAligned(size_t bytes);
void UnmapHugePageAligned(void* data, size_t bytes);

}  // namespace sluice
