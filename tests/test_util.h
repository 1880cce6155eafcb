// Status-aware GoogleTest helpers shared by all sluice tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <optional>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/core/tensor.h"

#define SLUICE_TEST_CONCAT_INNER_(a, b) a##b
#define SLUICE_TEST_CONCAT_(a, b) SLUICE_TEST_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::absl::Status sluice_s_ = ::sluice_test::ToStatus(expr); \
    ASSERT_TRUE(sluice_s_.ok()) << sluice_s_;                 \
  } while (0)
#define EXPECT_OK(expr)                                       \
  do {                                                        \
    const ::absl::Status sluice_s_ = ::sluice_test::ToStatus(expr); \
    EXPECT_TRUE(sluice_s_.ok()) << sluice_s_;                 \
  } while (0)

#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  ASSERT_TRUE(tmp.ok()) << tmp.status();           \
  lhs = std::move(*tmp)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(SLUICE_TEST_CONCAT_(sluice_t_, __LINE__), lhs, expr)

// Asserts `expr` (a Status or StatusOr) failed with `expected_code` and a message
// containing `substr`.
#define EXPECT_STATUS(expr, expected_code, substr)                            \
  do {                                                                        \
    const ::absl::Status sluice_s_ = ::sluice_test::ToStatus(expr);           \
    EXPECT_EQ(sluice_s_.code(), expected_code) << sluice_s_;                  \
    EXPECT_THAT(std::string(sluice_s_.message()), ::testing::HasSubstr(substr)); \
  } while (0)

namespace sluice_test {

// Runs `fn` on another thread and fails the test if it does not finish in
// `limit` (a hang guard, not a performance check).
template <typename F>
auto WithHangGuard(F fn, std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto fut = std::async(std::launch::async, std::move(fn));
  if (fut.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "hang: did not finish within " << limit.count() << " s";
    std::abort();  // a hung call cannot be cancelled; stop the test binary
  }
  return fut.get();
}

// A uint8 tensor of `bytes` bytes whose content depends on every byte's
// position and on `seed` (corruption or a misplaced chunk shows).
// How much slower than a plain build the sanitizer builds run (ThreadSanitizer
// 5-15x, ASan 2x): liveness timeouts that declare a component lost (a
// worker's heartbeat deadline) are multiplied by it, so that a loaded
// sanitizer run does not lose a live worker. Hang guards need no scaling.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLUICE_TEST_TSAN_ 1
#endif
#if __has_feature(address_sanitizer)
#define SLUICE_TEST_ASAN_ 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SLUICE_TEST_TSAN_ 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SLUICE_TEST_ASAN_ 1
#endif
#if defined(SLUICE_TEST_TSAN_)
inline constexpr int64_t kSanitizerSlowdown = 4;
#elif defined(SLUICE_TEST_ASAN_)
inline constexpr int64_t kSanitizerSlowdown = 2;
#else
inline constexpr int64_t kSanitizerSlowdown = 1;
#endif

inline sluice::Tensor Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed) ^ (i >> 9));
  return sluice::Tensor::FromVector<uint8_t>(v);
}

inline absl::Status ToStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace sluice_test
