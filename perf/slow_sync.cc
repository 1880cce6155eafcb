// libsluice_perf_slow_sync.so: preloaded (LD_PRELOAD) into a sluice-dispatcher
// by `sluice-perf dispatcher --journal_sync_delay_us N`, it makes every
// fdatasync and fsync of that process take N µs longer than the disk did,
// so the calls/s rows can be measured as on a disk whose sync costs more
// than this machine's (network block storage: about a millisecond). The
// same library goes into the dispatcher built from an older commit
// (--dispatcher_binary), so both sides of a comparison meet the same disk.
// SLUICE_PERF_SYNC_DELAY_US gives N.
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>

namespace {

long DelayUs() {
  static const long delay = [] {
    const char* v = std::getenv("SLUICE_PERF_SYNC_DELAY_US");
    return v == nullptr ? 0L : std::max(0L, std::strtol(v, nullptr, 10));
  }();
  return delay;
}

void Pause() {
  const long us = DelayUs();
  timespec t{us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

using SyncFn = int (*)(int);

SyncFn Next(const char* name) { return reinterpret_cast<SyncFn>(dlsym(RTLD_NEXT, name)); }

// The real sync, then the delay; errno as the real sync left it.
int SyncThenPause(SyncFn real, int fd) {
  const int r = real(fd);
  const int err = errno;
  Pause();
  errno = err;
  return r;
}

}  // namespace

extern "C" int fdatasync(int fd) {
  static const SyncFn real = Next("fdatasync");
  return SyncThenPause(real, fd);
}

extern "C" int fsync(int fd) {
  static const SyncFn real = Next("fsync");
  return SyncThenPause(real, fd);
}
