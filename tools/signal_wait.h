// Blocks SIGINT/SIGTERM in every thread and waits for one (used by the
// server binaries: block before starting threads, wait after).
#pragma once

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace sluice::tools {

inline sigset_t BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

inline int WaitForTerminationSignal(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

// Writes `text` to `path` atomically (write a temp file, then rename), so a
// reader polling for the file never sees it half written.
inline bool WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return false;
    f << text << "\n";
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Debian's abseil is built with its debug checks: every absl::Mutex
// acquisition, gRPC's included, records the lock order in a graph to
// detect deadlocks. In a dispatcher answering 64 GetSplit callers, the
// graph code alone took 3.6% of its CPU samples (perf/RESULTS.md). A release
// build of a server binary turns it off (so do the binaries the
// multi-process tests start); the in-process tests and debug builds keep
// it, since they are where a lock-order cycle should be reported.
inline void DropMutexDebugChecksInRelease() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

// The life of a server binary: with SIGINT/SIGTERM blocked (and the mutex
// debug checks dropped, above), `start()` the server, announce
// `where(*server)`, write its port to `port_file` when given, wait for a
// signal, Stop(). Returns the process exit code. Messages go through
// spdlog, so --log_format json makes every line JSON.
template <typename StartFn, typename WhereFn>
int ServeUntilSignal(const char* name, const std::string& port_file, StartFn start,
                     WhereFn where) {
  DropMutexDebugChecksInRelease();
  sigset_t signals = BlockTerminationSignals();
  auto server = start();
  if (!server.ok()) {
    spdlog::error("{}: {}", name, server.status().ToString());
    return 1;
  }
  spdlog::info("{}: serving {}", name, where(**server));
  if (!port_file.empty() && !WriteFileAtomically(port_file, std::to_string((*server)->port()))) {
    spdlog::error("{}: cannot write {}", name, port_file);
    return 1;
  }
  int sig = WaitForTerminationSignal(signals);
  spdlog::info("{}: signal {}, stopping", name, sig);
  (*server)->Stop();
  return 0;
}

}  // namespace sluice::tools
