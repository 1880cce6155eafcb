// Child processes of sluice-perf (workers, measuring clients, ucx_perftest).
//
// Ownership: a ChildProcess SIGKILLs and reaps its child in its destructor,
// so no child outlives the scope that started it, on success or on error.
// Every live child is also recorded in a process-wide table that
// InstallChildCleanupOnSignal() uses: on SIGINT/SIGTERM the handler kills
// them all (kill() only: async-signal-safe) and exits. Children get
// PR_SET_PDEATHSIG, so they die even if sluice-perf itself is SIGKILLed.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::perf {

class ChildProcess {
 public:
  // `log_path` receives the child's stdout and stderr.
  ChildProcess(std::string name, std::string log_path);
  ~ChildProcess();  // KillAndReap()
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `path args...` with `env` ("K=V") added to (or replacing in) this
  // process's environment. Not thread-safe: one thread owns a ChildProcess.
  absl::Status Start(const std::string& path, const std::vector<std::string>& args,
                     const std::vector<std::pair<std::string, std::string>>& env = {});
  // Reaps the child if it has exited: its wait status then, else nullopt.
  std::optional<int> TryReap();
  // Waits for the child to exit; DeadlineExceeded (child left running) after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGKILLs (if running) and reaps. Idempotent.
  void KillAndReap();

  const std::string& name() const { return name_; }
  const std::string& command() const { return command_; }
  pid_t pid() const { return pid_; }
  // The last `max_bytes` of the child's log.
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  std::string name_;
  std::string log_path_;
  std::string command_;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
};

// "exited with status 1", "killed by signal 9".
std::string DescribeWaitStatus(int status);

// Polls `port_file` until it holds a port (a line ending in '\n'), `child`
// exits, or `timeout` passes; the error then includes the child's log.
absl::StatusOr<int> WaitForPortFile(ChildProcess& child, const std::string& port_file,
                                    absl::Duration timeout);

// Kills every live ChildProcess and exits (status 128+signal) on SIGINT or
// SIGTERM. Call once, early in main.
void InstallChildCleanupOnSignal();

// A fresh directory under $TMPDIR (or /tmp), removed by the destructor
// unless Keep() was called (to leave logs for a failed run).
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Create(const std::string& prefix);
  ScratchDir(ScratchDir&& o) noexcept : path_(std::exchange(o.path_, "")), keep_(o.keep_) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir();
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  void Keep() { keep_ = true; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
  bool keep_ = false;
};

// A loopback TCP port that was free a moment ago.
absl::StatusOr<int> PickFreeLoopbackPort();

std::string ReadWholeFile(const std::string& path);

}  // namespace sluice::perf
