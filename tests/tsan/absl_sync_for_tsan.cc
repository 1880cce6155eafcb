// ThreadSanitizer and Debian's abseil (the `tsan` preset only).
//
// TSan learns that one thread's writes happen before another's reads from
// the synchronization it sees: instrumented atomics and the pthread calls
// it intercepts. absl::Mutex, absl::CondVar and absl::Notification live in
// libabsl_synchronization.so, which Debian builds without TSan, so their
// locking is invisible and every access to state they guard would be
// reported as a race. This file, linked into every executable of the tsan
// build (which exports it with -rdynamic), interposes their entry points:
// each calls the library's own function (dlsym RTLD_NEXT) and tells TSan
// what it does: acquiring a mutex is an acquire on its address, releasing
// one (Unlock, and the waits that release it while they sleep) a release
// on it, Notify a release that the waits and HasBeenNotified (inline: an
// acquire load of the notification's flag) acquire. This is exactly the
// happens-before the library promises; no race in our code is hidden by
// it. (abseil built with TSan carries the same annotations itself.)
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

#define SLUICE_STR2(x) #x
#define SLUICE_STR(x) SLUICE_STR2(x)

// The library's definition of the function whose mangled name, after the
// inline namespace, is `rest` (e.g. "5Mutex4LockEv"); `konst` for a const
// member function.
template <typename Fn>
Fn Real(const char* rest, bool konst = false) {
  const std::string ns = SLUICE_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(konst ? "_ZNK4absl" : "_ZN4absl") +
                           std::to_string(ns.size()) + ns + rest;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_sync_for_tsan: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// A condition is evaluated inside the library, holding the mutex, by the
// waiting thread (after taking the mutex back) or by the one unlocking it
// (after our Unlock released it to TSan): an evaluation acquires the
// mutex's history before it reads what the mutex guards, and releases what
// it read, so the next holder is ordered after it.
struct Guarded {
  const absl::Mutex* mu;
  const absl::Condition* cond;
  static bool Eval(void* arg) {
    auto* g = static_cast<Guarded*>(arg);
    Acquire(g->mu);
    const bool met = g->cond->Eval();
    Release(g->mu);
    return met;
  }
};

// Notification's layout, to name its flag (HasBeenNotified reads it inline).
struct NotificationLayout {
  absl::Mutex mutex;
  std::atomic<bool> notified_yet;
};
static_assert(sizeof(NotificationLayout) == sizeof(absl::Notification));
const void* FlagOf(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + offsetof(NotificationLayout, notified_yet);
}

// absl's own deadlock detector (on in Debian's build) keeps its graph
// under an internal spin lock TSan cannot see; TSan detects lock-order
// inversions itself.
const bool kDeadlockDetectionOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  Acquire(this);
}
void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}
bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Release(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}
void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Guarded g{this, &cond};
  real(this, Condition(&Guarded::Eval, &g));
  Acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Guarded g{this, &cond};
  real(this, Condition(&Guarded::Eval, &g));
  Acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Guarded g{this, &cond};
  const bool met = real(this, Condition(&Guarded::Eval, &g), timeout);
  Acquire(this);  // held either way
  return met;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Guarded g{this, &cond};
  const bool met = real(this, Condition(&Guarded::Eval, &g), deadline);
  Acquire(this);
  return met;
}
// The waits release the mutex while they sleep and hold it again after.
void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  Guarded g{this, &cond};
  real(this, Condition(&Guarded::Eval, &g));
  Acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  Guarded g{this, &cond};
  const bool met = real(this, Condition(&Guarded::Eval, &g), timeout);
  Acquire(this);
  return met;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  Guarded g{this, &cond};
  const bool met = real(this, Condition(&Guarded::Eval, &g), deadline);
  Acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  Release(this);
  Release(FlagOf(this));
  real(this);
}
void Notification::WaitForNotification() const {
  static auto real =
      Real<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  real(this);
  Acquire(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
