// Unit tests of sluice::internal::IterationVersions: the versions the
// dispatcher's long polls compare, and the tasks changed since a version.
#include "sluice/control/iteration_versions.h"

#include "tests/test_util.h"

namespace sluice::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

TEST(IterationVersionsTest, AClientGetsTheTasksChangedAfterTheVersionItKnows) {
  IterationVersions v;
  EXPECT_EQ(v.version(7), 0);
  v.Bump(7, {30, 10});  // version 1
  v.Bump(7);            // 2: a change without tasks (an error, the end)
  v.Bump(7, {20, 10});  // 3
  v.Bump(8, {99});      // another iteration's
  EXPECT_EQ(v.version(7), 3);
  EXPECT_THAT(v.ChangedSince(7, 0), Optional(ElementsAre(10, 20, 30)));  // sorted, each once
  EXPECT_THAT(v.ChangedSince(7, 1), Optional(ElementsAre(10, 20)));
  EXPECT_THAT(v.ChangedSince(7, 2), Optional(ElementsAre(10, 20)));
  EXPECT_THAT(v.ChangedSince(7, 3), Optional(IsEmpty()));
  EXPECT_EQ(v.ChangedSince(7, 4), std::nullopt);  // not a version of this dispatcher's
  EXPECT_EQ(v.ChangedSince(7, -1), std::nullopt);
  EXPECT_THAT(v.ChangedSince(8, 0), Optional(ElementsAre(99)));
}

TEST(IterationVersionsTest, AfterARestartOnlyTheNewVersionsHaveDeltas) {
  IterationVersions v;
  v.Bump(7, {1});
  v.Bump(7, {2});
  v.Restart(7, 100);  // a replayed dispatcher: versions jump past any a client knew
  EXPECT_EQ(v.version(7), 102);
  EXPECT_EQ(v.ChangedSince(7, 2), std::nullopt);  // the whole list
  EXPECT_THAT(v.ChangedSince(7, 102), Optional(IsEmpty()));
  v.Bump(7, {3});
  EXPECT_THAT(v.ChangedSince(7, 102), Optional(ElementsAre(3)));
  v.BumpSplits(7);
  EXPECT_EQ(v.split_version(7), 1);
  EXPECT_EQ(v.version(7), 103);  // splits have a version of their own
  v.Forget(7);
  EXPECT_EQ(v.version(7), 0);
}

}  // namespace
}  // namespace sluice::internal
