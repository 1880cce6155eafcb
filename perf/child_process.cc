#include "perf/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace sluice::perf {
namespace {

// Live children, for the signal handler. A slot holds a pid or 0.
constexpr size_t kMaxChildren = 256;
std::array<std::atomic<pid_t>, kMaxChildren> g_children{};

void Track(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid)) return;
  }
}

void Untrack(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

void KillTrackedChildrenAndExit(int sig) {
  for (auto& slot : g_children) {
    pid_t pid = slot.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  _exit(128 + sig);
}

}  // namespace

ChildProcess::ChildProcess(std::string name, std::string log_path)
    : name_(std::move(name)), log_path_(std::move(log_path)) {}

ChildProcess::~ChildProcess() { KillAndReap(); }

absl::Status ChildProcess::Start(const std::string& path, const std::vector<std::string>& args,
                                 const std::vector<std::pair<std::string, std::string>>& env) {
  if (pid_ > 0) return absl::FailedPreconditionError(absl::StrCat(name_, " already started"));
  // Everything the child needs is built before fork: between fork and exec
  // the child calls only async-signal-safe functions.
  std::vector<std::string> argv_s = {path};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    bool replaced = false;
    for (const auto& [k, v] : env) replaced |= kv.substr(0, kv.find('=')) == k;
    if (!replaced) env_s.emplace_back(kv);
  }
  std::vector<std::string> env_desc;
  for (const auto& [k, v] : env) {
    env_s.push_back(absl::StrCat(k, "=", v));
    env_desc.push_back(absl::StrCat(k, "=", v));
  }
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  command_ = absl::StrCat(absl::StrJoin(env_desc, " "), env_desc.empty() ? "" : " ",
                          absl::StrJoin(argv_s, " "));
  const pid_t parent = getpid();
  const char* log = log_path_.c_str();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  pid_ = pid;
  exit_status_.reset();
  Track(pid);
  return absl::OkStatus();
}

std::optional<int> ChildProcess::TryReap() {
  if (pid_ <= 0) return exit_status_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    Untrack(pid_);
    exit_status_ = status;
    pid_ = -1;
  }
  return exit_status_;
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (auto s = TryReap()) return *s;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " did not finish within ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void ChildProcess::KillAndReap() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  Untrack(pid_);
  exit_status_ = status;
  pid_ = -1;
}

std::string ChildProcess::LogTail(size_t max_bytes) const {
  std::string log = ReadWholeFile(log_path_);
  if (log.size() > max_bytes) log = "..." + log.substr(log.size() - max_bytes);
  return log;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

absl::StatusOr<int> WaitForPortFile(ChildProcess& child, const std::string& port_file,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::string text = ReadWholeFile(port_file);
    if (!text.empty() && text.back() == '\n') {
      int port = std::atoi(text.c_str());
      if (port > 0 && port < 65536) return port;
      return absl::InternalError(absl::StrCat(child.name(), " wrote port file '", text, "'"));
    }
    if (auto st = child.TryReap()) {
      return absl::InternalError(absl::StrCat(child.name(), " ", DescribeWaitStatus(*st),
                                              " before it was serving (", child.command(),
                                              "); log:\n", child.LogTail()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(child.name(), " was not serving within ",
                                                      absl::FormatDuration(timeout), "; log:\n",
                                                      child.LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void InstallChildCleanupOnSignal() {
  struct sigaction sa {};
  sa.sa_handler = KillTrackedChildrenAndExit;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

absl::StatusOr<ScratchDir> ScratchDir::Create(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/", prefix,
                                  "_XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", tmpl, ": ", strerror(errno)));
  }
  return ScratchDir(buf.data());
}

ScratchDir::~ScratchDir() {
  if (path_.empty() || keep_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<int> PickFreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port <= 0) return absl::InternalError("cannot find a free loopback port");
  return port;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace sluice::perf
