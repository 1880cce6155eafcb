// Interrupting a blocking call from the caller's side.
//
// A language binding installs a check for the calling thread around a call
// that may block for long (Python: one that runs the interpreter's signal
// handlers, so Ctrl-C raises KeyboardInterrupt). Waits inside sluice that
// may last (the data-service iterator's Next) wake at least every
// kInterruptPollInterval, call CheckInterrupt(), and return its error at
// once, leaving the object usable: nothing is consumed by an interrupted
// call.
//
// The check runs on the thread that installed it, never on sluice's own
// threads.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace sluice {

inline constexpr absl::Duration kInterruptPollInterval = absl::Milliseconds(100);

// Installs `check` for this thread while the object lives (nesting
// restores the outer one). The check returns OK to go on, or the error the
// blocking call returns (conventionally Cancelled).
class ScopedInterruptCheck {
 public:
  explicit ScopedInterruptCheck(std::function<absl::Status()> check);
  ~ScopedInterruptCheck();
  ScopedInterruptCheck(const ScopedInterruptCheck&) = delete;
  ScopedInterruptCheck& operator=(const ScopedInterruptCheck&) = delete;

 private:
  std::function<absl::Status()> check_;
  const std::function<absl::Status()>* outer_;
};

// This thread's check; OK when none is installed.
absl::Status CheckInterrupt();

}  // namespace sluice
