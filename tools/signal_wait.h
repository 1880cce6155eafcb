// Blocks SIGINT/SIGTERM in every thread and waits for one (used by the
// server binaries: block before starting threads, wait after).
#pragma once

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

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

}  // namespace sluice::tools
