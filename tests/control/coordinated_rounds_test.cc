// Unit tests of sluice::internal::CoordinatedRounds: choosing the round
// pending tasks join at, and agreeing on it.
#include "sluice/control/coordinated_rounds.h"

#include "tests/test_util.h"

namespace sluice::internal {
namespace {

using Outcome = CoordinatedRounds::Outcome;
constexpr int64_t kLead = CoordinatedRounds::kRoundLead;

TEST(CoordinatedRoundsTest, PendingTasksJoinOnceEveryConsumerHonoursTheTarget) {
  CoordinatedRounds r;
  EXPECT_FALSE(r.Started(1));
  r.Start(1, 0);
  EXPECT_TRUE(r.Started(1));
  EXPECT_EQ(r.Report(1, 0, 5, -1, /*pending=*/false, 2), Outcome::kNone);
  EXPECT_EQ(r.Report(1, 1, 7, -1, false, 2), Outcome::kNone);
  EXPECT_EQ(r.Target(1), -1);
  r.ChooseTarget(1);  // past the furthest consumer
  EXPECT_EQ(r.Target(1), 7 + kLead);
  EXPECT_EQ(r.Report(1, 0, 6, -1, true, 2), Outcome::kNone);  // learns the target
  EXPECT_EQ(r.Report(1, 0, 6, 7 + kLead, true, 2), Outcome::kNone);
  EXPECT_EQ(r.Report(1, 1, 8, 7 + kLead, true, 2), Outcome::kAllReady);
  r.Joined(1);
  EXPECT_EQ(r.Report(1, 1, 8, 7 + kLead, true, 2), Outcome::kNone);  // confirmations start over
}

// A resumed iteration's consumers start at its first round: a task that
// joins before any of them reports targets past it, not past round 0.
TEST(CoordinatedRoundsTest, AResumedIterationTargetsPastItsFirstRound) {
  CoordinatedRounds r;
  r.Start(1, 500);
  r.ChooseTarget(1);
  EXPECT_EQ(r.Target(1), 500 + kLead);
}

TEST(CoordinatedRoundsTest, ACheckpointResumesOnlyAJobOfAsManyConsumers) {
  proto::ServiceCheckpoint c;
  c.set_version(1);
  c.set_num_consumers(2);
  c.set_round(40);
  EXPECT_OK(CoordinatedRounds::CheckResume(c, 2));
  auto s = CoordinatedRounds::CheckResume(c, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("2 coordinated consumers"), std::string::npos) << s;
  proto::ServiceCheckpoint epoch = c;  // a distributed_epoch position
  epoch.set_num_consumers(0);
  epoch.set_positions(100);
  EXPECT_TRUE(absl::IsInvalidArgument(CoordinatedRounds::CheckResume(epoch, 2)));
  c.set_version(2);
  EXPECT_TRUE(absl::IsInvalidArgument(CoordinatedRounds::CheckResume(c, 2)));
  c.set_version(1);
  c.set_round(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(CoordinatedRounds::CheckResume(c, 2)));
}

TEST(CoordinatedRoundsTest, AConsumerPastTheTargetMovesIt) {
  CoordinatedRounds r;
  r.ChooseTarget(1);
  EXPECT_EQ(r.Target(1), kLead);
  EXPECT_EQ(r.Report(1, 0, kLead, kLead, true, 2), Outcome::kNone);
  EXPECT_EQ(r.Report(1, 1, kLead + 3, kLead, true, 2), Outcome::kTargetMoved);
  EXPECT_EQ(r.Target(1), 2 * kLead + 3);
  // Consumer 0's confirmation was of the old target.
  EXPECT_EQ(r.Report(1, 1, kLead + 3, 2 * kLead + 3, true, 2), Outcome::kNone);
  EXPECT_EQ(r.Report(1, 0, kLead, 2 * kLead + 3, true, 2), Outcome::kAllReady);
}

TEST(CoordinatedRoundsTest, AConsumerThatLeftNoLongerCounts) {
  CoordinatedRounds r;
  r.ChooseTarget(1);
  EXPECT_EQ(r.Report(1, 0, 0, kLead, true, 2), Outcome::kNone);
  r.Left(1, 0);
  EXPECT_EQ(r.Report(1, 1, 0, kLead, true, 2), Outcome::kNone);
  EXPECT_EQ(r.Report(1, 0, 0, kLead, true, 2), Outcome::kAllReady);
  r.Forget(1);
  EXPECT_EQ(r.Target(1), -1);
  EXPECT_FALSE(r.Started(1));
}

}  // namespace
}  // namespace sluice::internal
