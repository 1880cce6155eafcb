// SendQuarantine (dataplane/send_quarantine.h): the memory of a failed
// rendezvous send stays alive for the grace period, so a peer that still
// reads it gets the element it was offered, and is released after it.
#include "sluice/dataplane/send_quarantine.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::internal {
namespace {

// A buffer filled with `value`, as a failed send's memory.
std::shared_ptr<std::vector<uint8_t>> Buffer(size_t bytes, uint8_t value) {
  return std::make_shared<std::vector<uint8_t>>(bytes, value);
}

TEST(SendQuarantineTest, HeldMemoryOutlivesItsSenderUntilTheGraceEnds) {
  SendQuarantine q(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto buffer = Buffer(4096, 0x5a);
  std::weak_ptr<std::vector<uint8_t>> watch = buffer;
  q.Hold(std::move(buffer), 4096, t0);
  EXPECT_EQ(q.held_bytes(), 4096u);
  EXPECT_EQ(q.total_held(), 1);

  // Within the grace the memory is alive and unchanged.
  q.ReleaseDue(t0 + absl::Seconds(9));
  auto still = watch.lock();
  ASSERT_NE(still, nullptr);
  EXPECT_EQ((*still)[4095], 0x5a);
  still.reset();

  q.ReleaseDue(t0 + absl::Seconds(10));
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(q.held_bytes(), 0u);
  EXPECT_EQ(q.total_held(), 1);  // a running count
}

TEST(SendQuarantineTest, EachHoldReleasesWhatIsDueAndKeepsTheRest) {
  SendQuarantine q(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto first = Buffer(100, 1), second = Buffer(200, 2);
  std::weak_ptr<std::vector<uint8_t>> w1 = first, w2 = second;
  q.Hold(std::move(first), 100, t0);
  q.Hold(std::move(second), 200, t0 + absl::Seconds(5));
  EXPECT_EQ(q.held_bytes(), 300u);

  // A later failure releases the first (due), not the second.
  q.Hold(Buffer(50, 3), 50, t0 + absl::Seconds(11));
  EXPECT_TRUE(w1.expired());
  EXPECT_FALSE(w2.expired());
  EXPECT_EQ(q.held_bytes(), 250u);
  EXPECT_EQ(q.total_held(), 3);

  q.ReleaseDue(t0 + absl::Seconds(30));
  EXPECT_TRUE(w2.expired());
  EXPECT_EQ(q.held_bytes(), 0u);
}

// A release may return a buffer to its pool, which reads the quarantine's
// figures or holds again from its own callbacks: it runs outside the lock.
TEST(SendQuarantineTest, ReleasesRunOutsideItsLock) {
  SendQuarantine q(absl::Seconds(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  size_t seen = 12345;
  std::shared_ptr<const void> memory(new int(7), [&](const void* p) {
    seen = q.held_bytes();  // would deadlock under the lock
    delete static_cast<const int*>(p);
  });
  q.Hold(std::move(memory), 8, t0);
  q.ReleaseDue(t0 + absl::Seconds(2));
  EXPECT_EQ(seen, 0u);
}

}  // namespace
}  // namespace sluice::internal
