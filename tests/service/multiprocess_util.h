// Shared by the multi-process test binaries (multiprocess_test, fault_test):
// real sluice-dispatcher and sluice-worker processes (SLUICE_DISPATCHER_BIN /
// SLUICE_WORKER_BIN) on loopback, ports chosen at run time, and the
// data-service client in the test process or as its own
// (sluice_test_client, SLUICE_TEST_CLIENT_BIN).
//
// Every child is owned by a ChildProcess guard that SIGKILLs and reaps it in
// its destructor, so no process outlives a test even when an assertion fails;
// children also get PR_SET_PDEATHSIG so they die if the test process
// crashes. Timeouts here are hang guards only, never performance thresholds.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "sluice/client/distribute.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "tests/test_util.h"

namespace sluice::mp_test {

inline constexpr absl::Duration kStartDeadline = absl::Seconds(20);  // port files must appear by then
inline constexpr absl::Duration kExitDeadline = absl::Seconds(20);   // a process asked to exit must

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A per-test scratch directory under ::testing::TempDir(), removed at the end.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir();
    if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
    tmpl += "sluice_mp_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One child process: started with fork/execv, stdout+stderr to `log_path`
// (stdout to `stdout_path` instead when that is given).
// The destructor SIGKILLs and reaps it if it is still unreaped.
class ChildProcess {
 public:
  ChildProcess(std::string name, std::string log_path)
      : name_(std::move(name)), log_path_(std::move(log_path)) {}
  ~ChildProcess() { KillAndReap(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `path args...`. Everything the child needs is prepared before fork
  // so the child calls only async-signal-safe functions until execv.
  absl::Status Start(const std::string& path, const std::vector<std::string>& args,
                     const std::string& stdout_path = "") {
    std::vector<std::string> argv_s = {path};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    command_ = absl::StrJoin(argv_s, " ");
    const pid_t parent = getpid();
    const char* log = log_path_.c_str();
    const char* out = stdout_path.empty() ? nullptr : stdout_path.c_str();
    absl::MutexLock l(&mu_);
    pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork failed: ", strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      // Undo any signal mask inherited from this (multi-threaded) process.
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      if (out != nullptr) {
        int ofd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (ofd >= 0) dup2(ofd, STDOUT_FILENO);
      }
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    pid_ = pid;
    return absl::OkStatus();
  }

  // SIGKILLs the child (if running) and reaps it. Idempotent.
  void KillAndReap() {
    absl::MutexLock l(&mu_);
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exit_status_ = status;
    pid_ = -1;
  }

  // Sends `sig` without reaping (safe from any thread: never signals a
  // reaped, possibly reused pid).
  void Signal(int sig) {
    absl::MutexLock l(&mu_);
    if (pid_ > 0) kill(pid_, sig);
  }

  // Reaps the child if it has exited; returns its wait status then.
  std::optional<int> TryReap() {
    absl::MutexLock l(&mu_);
    if (pid_ <= 0) return exit_status_;
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_status_ = status;
      pid_ = -1;
    }
    return exit_status_;
  }

  // Waits (bounded) for the child to exit on its own; nullopt if it did not.
  std::optional<int> WaitForExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (auto s = TryReap()) return s;
      if (absl::Now() > deadline) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  const std::string& name() const { return name_; }
  const std::string& command() const { return command_; }
  std::string log() const { return ReadFile(log_path_); }

 private:
  const std::string name_;
  const std::string log_path_;
  std::string command_;
  absl::Mutex mu_;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<int> exit_status_ ABSL_GUARDED_BY(mu_);
};

inline std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

// A port that was free a moment ago (nothing listens on it afterwards),
// below the kernel's ephemeral range (ip_local_port_range): a port a test
// restarts a process on must not be handed meanwhile to an outgoing
// connection of another test running beside it, which ephemeral ports are.
inline int UnusedLoopbackPort() {
  int ephemeral_low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 0;
    if (range >> low && low > 2048) ephemeral_low = low;
  }
  static std::atomic<uint64_t> draws{0};
  uint64_t x = static_cast<uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull +
               static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    x = x * 6364136223846793005ull + 1442695040888963407ull + draws.fetch_add(1);
    constexpr int kLowest = 1024;
    const uint64_t span = static_cast<uint64_t>(ephemeral_low - kLowest);
    const int port = kLowest + static_cast<int>((x >> 33) % span);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (free) return port;
  }
  return -1;
}

// The complete lines of `path` so far (a trailing partial line is left out).
inline std::vector<std::string> ReadLines(const std::string& path) {
  std::string text = ReadFile(path);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start));
  }
  return lines;
}

// Polls `done` every 20 ms until it holds; DeadlineExceeded naming `what`
// after `timeout` (a hang guard, never a performance threshold).
inline absl::Status WaitUntil(const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not happen within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

inline absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// The dispatcher's GetWorkers: each worker and how many tasks it holds.
inline absl::StatusOr<proto::GetWorkersResponse> GetWorkers(const std::string& dispatcher) {
  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(dispatcher, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::GetWorkersResponse resp;
  grpc::Status s = stub->GetWorkers(&ctx, proto::GetWorkersRequest(), &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("GetWorkers at ", dispatcher));
  return resp;
}

// The worker's GetWorkerTasks: the tasks it runs now.
inline absl::StatusOr<proto::GetWorkerTasksResponse> GetWorkerTasks(const std::string& worker) {
  auto stub = proto::WorkerService::NewStub(
      grpc::CreateChannel(worker, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::GetWorkerTasksResponse resp;
  grpc::Status s = stub->GetWorkerTasks(&ctx, proto::GetWorkerTasksRequest(), &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("GetWorkerTasks at ", worker));
  return resp;
}

// Fires if not disarmed in time: reports, SIGKILLs the children (which makes
// a hung client fail instead of hanging), and aborts if the test still does
// not finish.
class Watchdog {
 public:
  Watchdog(absl::Duration timeout, std::string what, std::function<void()> kill_children)
      : thread_([this, timeout, what = std::move(what), kill = std::move(kill_children)] {
          if (done_.WaitForNotificationWithTimeout(timeout)) return;
          fired_ = true;
          std::fprintf(stderr, "WATCHDOG: %s did not finish within %s; killing the children\n",
                       what.c_str(), absl::FormatDuration(timeout).c_str());
          kill();
          if (done_.WaitForNotificationWithTimeout(absl::Seconds(60))) return;
          std::fprintf(stderr, "WATCHDOG: %s still hung; aborting\n", what.c_str());
          std::abort();
        }) {}
  ~Watchdog() { Disarm(); }
  void Disarm() {
    if (!done_.HasBeenNotified()) done_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  bool fired() const { return fired_; }

 private:
  absl::Notification done_;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// A data path a parameterized test runs over: gRPC, or UCX on TCP or on
// shared memory (UCX_TLS is set for the test process and its children;
// ctest runs every test in its own process).
struct Transport {
  std::string name, protocol, ucx_tls;
};
inline void PrintTo(const Transport& t, std::ostream* os) { *os << t.name; }
inline auto AllTransports() {
  return ::testing::Values(Transport{"grpc", "grpc", ""}, Transport{"ucx_tcp", "ucx", "tcp"},
                           Transport{"ucx_shm", "ucx", "tcp,posix,cma,self"});
}
inline std::string TransportName(const ::testing::TestParamInfo<Transport>& info) {
  return info.param.name;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(scratch_.ok()) << "cannot create a scratch directory"; }

  void TearDown() override {
    // Sanitizer builds: a child's memory error or UB is a failure of this test.
    for (const auto& c : children_) {
      const std::string log = c->log();
      EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("ERROR: AddressSanitizer"))) << c->name();
      EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("runtime error:"))) << c->name();
    }
    if (HasFailure()) {
      for (const auto& c : children_) {
        std::string log = c->log();
        if (log.size() > 8000) log = "..." + log.substr(log.size() - 8000);
        std::fprintf(stderr, "---- %s (%s) log:\n%s\n", c->name().c_str(), c->command().c_str(),
                     log.c_str());
      }
    }
    // Workers first, then the dispatcher; all SIGKILLed and reaped.
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) (*it)->KillAndReap();
  }

  ChildProcess* Spawn(const std::string& name, const std::string& path,
                      const std::vector<std::string>& args, const std::string& stdout_path = "") {
    children_.push_back(std::make_unique<ChildProcess>(name, scratch_.File(name + ".log")));
    ChildProcess* c = children_.back().get();
    absl::Status s = c->Start(path, args, stdout_path);
    EXPECT_TRUE(s.ok()) << name << ": " << s;
    return s.ok() ? c : nullptr;
  }

  void KillAllChildren() {
    for (const auto& c : children_) c->Signal(SIGKILL);
  }

  // Polls `port_file` until it holds a port, `child` dies, or the deadline.
  absl::StatusOr<int> WaitForPort(ChildProcess* child, const std::string& port_file,
                                  absl::Time deadline) {
    while (true) {
      std::string text = ReadFile(port_file);
      if (!text.empty() && text.back() == '\n') {
        int port = std::atoi(text.c_str());
        if (port > 0 && port < 65536) return port;
        return absl::InternalError(
            absl::StrCat(child->name(), " wrote an invalid port file: '", text, "'"));
      }
      if (auto st = child->TryReap()) {
        return absl::InternalError(absl::StrCat(child->name(), " ", DescribeWaitStatus(*st),
                                                " before writing its port file; log:\n",
                                                child->log()));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            child->name(), " did not write its port file ", port_file, " within ",
            absl::FormatDuration(kStartDeadline), "; log:\n", child->log()));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  // Starts the dispatcher and `num_workers` workers and waits until all are
  // serving (a worker writes its port file only after registering).
  absl::Status StartCluster(int num_workers, const std::vector<std::string>& dispatcher_args,
                            const std::vector<std::string>& worker_args) {
    const absl::Time deadline = absl::Now() + kStartDeadline;
    dispatcher_args_ = {"--port", std::to_string(dispatcher_port_), "--port_file",
                        scratch_.File("dispatcher.port")};
    dispatcher_args_.insert(dispatcher_args_.end(), dispatcher_args.begin(),
                            dispatcher_args.end());
    absl::Status started = SpawnDispatcher("dispatcher", deadline);
    if (!started.ok()) return started;
    const std::string dispatcher_address = absl::StrCat("127.0.0.1:", dispatcher_port_);
    for (int i = 0; i < num_workers; ++i) {
      std::string name = absl::StrCat("worker", i);
      std::vector<std::string> wargs = {"--dispatcher", dispatcher_address, "--port", "0",
                                        "--port_file", scratch_.File(name + ".port")};
      wargs.insert(wargs.end(), worker_args.begin(), worker_args.end());
      ChildProcess* w = Spawn(name, SLUICE_WORKER_BIN, wargs);
      if (w == nullptr) return absl::InternalError(absl::StrCat("cannot start ", name));
      workers_.push_back(w);
    }
    for (int i = 0; i < num_workers; ++i) {
      auto wport = WaitForPort(workers_[i], scratch_.File(absl::StrCat("worker", i, ".port")),
                               deadline);
      if (!wport.ok()) return wport.status();
      worker_ports_.push_back(*wport);
    }
    return absl::OkStatus();
  }

  // Starts the dispatcher with dispatcher_args_ (on dispatcher_port_ if set)
  // and waits until it serves.
  absl::Status SpawnDispatcher(const std::string& name, absl::Time deadline) {
    std::filesystem::remove(scratch_.File("dispatcher.port"));
    dispatcher_ = Spawn(name, SLUICE_DISPATCHER_BIN, dispatcher_args_);
    if (dispatcher_ == nullptr) return absl::InternalError("cannot start the dispatcher");
    auto port = WaitForPort(dispatcher_, scratch_.File("dispatcher.port"), deadline);
    if (!port.ok()) return port.status();
    dispatcher_port_ = *port;
    return absl::OkStatus();
  }

  // kill -9 the dispatcher and start it again with the same arguments (the
  // cluster must have been started on a fixed dispatcher_port_).
  // SIGKILL, or with `graceful` SIGTERM and a wait for the exit, then a new
  // dispatcher on the same port with the same flags.
  absl::Status KillAndRestartDispatcher(bool graceful = false) {
    if (graceful) {
      dispatcher_->Signal(SIGTERM);
      if (!dispatcher_->WaitForExit(absl::Seconds(30)).has_value()) {
        return absl::DeadlineExceededError("the dispatcher did not exit within 30 s of SIGTERM");
      }
    } else {
      dispatcher_->KillAndReap();
    }
    ++dispatcher_restarts_;
    return SpawnDispatcher(absl::StrCat("dispatcher", dispatcher_restarts_),
                           absl::Now() + kStartDeadline);
  }

  std::string ServiceTarget() const { return absl::StrCat("grpc://127.0.0.1:", dispatcher_port_); }

  ScratchDir scratch_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  ChildProcess* dispatcher_ = nullptr;
  std::vector<ChildProcess*> workers_;
  int dispatcher_port_ = 0;  // set before StartCluster: serve on this port
  std::vector<std::string> dispatcher_args_;
  int dispatcher_restarts_ = 0;
  std::vector<int> worker_ports_;
};

// Reads `it` to the end, appending the scalar int64 values to `out`, calling
// `after_each(count)` after every element.
inline absl::Status Drain(Iterator& it, std::vector<int64_t>* out,
                   const std::function<void(int64_t)>& after_each = nullptr) {
  while (true) {
    auto e = it.Next();
    if (!e.ok()) return e.status();
    if (!e->has_value()) return absl::OkStatus();
    const Element& el = **e;
    if (el.size() != 1) return absl::InternalError("expected one component per element");
    out->push_back(el[0].at<int64_t>(0));
    if (after_each) after_each(static_cast<int64_t>(out->size()));
  }
}


}  // namespace sluice::mp_test
