// Unit tests of sluice::IndexSet (a split's delivered or skipped elements
// in service checkpoints).
#include "sluice/core/index_set.h"

#include <cstdint>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(IndexSetTest, InOrderIndicesBecomeAPrefixWithNoBitmap) {
  IndexSet s;
  for (int64_t i = 0; i < 1000; ++i) EXPECT_TRUE(s.Insert(i));
  EXPECT_EQ(s.prefix(), 1000);
  EXPECT_EQ(s.beyond(), "");
  EXPECT_EQ(s.size(), 1000);
  EXPECT_FALSE(s.Insert(5));  // already in
  EXPECT_TRUE(s.Contains(999));
  EXPECT_FALSE(s.Contains(1000));
  EXPECT_FALSE(s.Contains(-1));
}

TEST(IndexSetTest, ScatteredIndicesRoundTripThroughTheSavedForm) {
  std::mt19937_64 rng(7);
  IndexSet s;
  std::set<int64_t> want;
  for (int i = 0; i < 3000; ++i) {
    const int64_t v = static_cast<int64_t>(rng() % 5000);
    EXPECT_EQ(s.Insert(v), want.insert(v).second);
  }
  const IndexSet back(s.prefix(), s.beyond());
  EXPECT_EQ(back.size(), static_cast<int64_t>(want.size()));
  for (int64_t v = 0; v < 5100; ++v) EXPECT_EQ(back.Contains(v), want.count(v) == 1) << v;
}

TEST(IndexSetTest, FillingTheGapMovesEverythingIntoThePrefix) {
  IndexSet s;
  for (int64_t i = 1; i < 200; ++i) s.Insert(i);
  EXPECT_EQ(s.prefix(), 0);
  s.Insert(0);
  EXPECT_EQ(s.prefix(), 200);
  EXPECT_EQ(s.beyond(), "");
}

TEST(IndexSetTest, MergeUnitesTwoSetsWhicheverHasTheLongerPrefix) {
  IndexSet even, odd;
  for (int64_t i = 0; i < 300; i += 2) even.Insert(i);
  for (int64_t i = 1; i < 301; i += 2) odd.Insert(i);
  odd.Insert(0);
  IndexSet a = even, b = odd;
  a.Merge(odd);
  b.Merge(even);
  for (const IndexSet* m : {&a, &b}) {
    EXPECT_EQ(m->prefix(), 300);
    EXPECT_TRUE(m->Contains(299));
    EXPECT_FALSE(m->Contains(300));
    EXPECT_EQ(m->size(), 300);
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Filling a long gap at the front of a large bitmap one index at a time
// stays linear (the prefix absorbs words, not a shift per index).
TEST(IndexSetTest, AbsorbingALongBitmapFromTheFrontKeepsEveryIndex) {
  IndexSet s;
  constexpr int64_t kN = 1 << 20;
  for (int64_t i = 1; i < kN; i += 2) s.Insert(i);
  for (int64_t i = 0; i < kN; i += 2) s.Insert(i);
  EXPECT_EQ(s.prefix(), kN);
  EXPECT_EQ(s.size(), kN);
  EXPECT_EQ(s.beyond(), "");
  s.Insert(kN + 3);
  const IndexSet back(s.prefix(), s.beyond());
  EXPECT_TRUE(back.Contains(kN + 3));
  EXPECT_FALSE(back.Contains(kN + 2));
  EXPECT_EQ(back.size(), kN + 1);
}

}  // namespace
}  // namespace sluice
