// An eventfd (Linux): a counter another thread writes to wake a thread
// that sleeps in poll()/epoll_wait() on fd(). Internal to sluice.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace sluice::internal {

class EventFd {
 public:
  // Non-blocking and close-on-exec; `create` false (or the kernel refusing
  // one) leaves fd() at -1, where Signal and Clear do nothing.
  explicit EventFd(bool create = true) : fd_(create ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1) {}
  ~EventFd() {
    if (fd_ >= 0) close(fd_);
  }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;

  int fd() const { return fd_; }
  // Makes fd() readable (any thread).
  void Signal() const { SignalFd(fd_); }
  // Makes it unreadable again.
  void Clear() const { ClearFd(fd_); }
  // The same for an eventfd someone else owns (-1: nothing).
  static void SignalFd(int fd) {
    const uint64_t one = 1;
    // EAGAIN: the counter is full, so it is readable anyway.
    if (fd >= 0) {
      [[maybe_unused]] ssize_t n = write(fd, &one, sizeof(one));
    }
  }
  static void ClearFd(int fd) {
    uint64_t count = 0;
    if (fd >= 0) {
      [[maybe_unused]] ssize_t n = read(fd, &count, sizeof(count));
    }
  }

 private:
  const int fd_;
};

}  // namespace sluice::internal
