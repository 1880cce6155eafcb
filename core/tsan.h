// Happens-before edges that ThreadSanitizer cannot see for itself: an
// object handed between threads by third-party code built without TSan
// (gRPC hands a server reactor from the handler's thread to the threads it
// calls OnCancel and OnDone on through its own lock-free queues). What a
// thread did before HappensBefore(p) happens before what another does after
// HappensAfter(p). No-ops, free, in every build but the `tsan` preset's.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define SLUICE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLUICE_TSAN 1
#endif
#endif

#ifdef SLUICE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace sluice::internal {

inline void HappensBefore(const void* p) {
#ifdef SLUICE_TSAN
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

inline void HappensAfter(const void* p) {
#ifdef SLUICE_TSAN
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace sluice::internal
