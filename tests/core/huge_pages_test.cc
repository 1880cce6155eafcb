#include "sluice/core/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "sluice/core/tensor.h"
#include "tests/huge_pages_util.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
using sluice_test::HugePagesAdvised;

TEST(HugePagesTest, TheSwitchReadsLikeOtherBooleans) {
  EXPECT_EQ(ParseHugePagesSetting(nullptr), true);  // unset: on
  for (const char* on : {"", "1", "on", "ON", "true", "yes", "auto"}) {
    EXPECT_EQ(ParseHugePagesSetting(on), true) << on;
  }
  for (const char* off : {"0", "off", "Off", "false", "no"}) {
    EXPECT_EQ(ParseHugePagesSetting(off), false) << off;
  }
  EXPECT_EQ(ParseHugePagesSetting("2"), std::nullopt);
  EXPECT_EQ(ParseHugePagesSetting("huge"), std::nullopt);
}

TEST(HugePagesTest, AMappedBufferIsAlignedAndAdvisedForHugePages) {
  SLUICE_SKIP_WITHOUT_HUGE_PAGES();
  const size_t bytes = 8 * kMiB + 4096;  // not a multiple of a huge page
  void* p = MapHugePageAligned(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  std::memset(p, 0x5a, bytes);
  EXPECT_TRUE(HugePagesAdvised(p));
  EXPECT_EQ(static_cast<uint8_t*>(p)[bytes - 1], 0x5a);
  UnmapHugePageAligned(p, bytes);
}

TEST(HugePagesTest, LargeTensorsAreAlignedAndAdvisedForHugePages) {
#if defined(SLUICE_TEST_ASAN_) || defined(SLUICE_TEST_TSAN_)
  GTEST_SKIP() << "sanitizer builds take every block from the heap";
#endif
  SLUICE_SKIP_WITHOUT_HUGE_PAGES();
  ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::Allocate(DType::kUInt8, TensorShape({16 * static_cast<int64_t>(kMiB)})));
  std::memset(const_cast<uint8_t*>(t.data()), 1, t.byte_size());
  EXPECT_TRUE(HugePagesAdvised(t.data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kHugePageBytes, 0u);
  // Zeroed as before, whether the block is fresh or recycled.
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<uint8_t> b = AllocateAligned(4 * kMiB);
    ASSERT_NE(b, nullptr);
    for (size_t i = 0; i < 4 * kMiB; i += 4096) ASSERT_EQ(b.get()[i], 0) << i;
    std::memset(b.get(), 7, 4 * kMiB);
  }
}

}  // namespace
}  // namespace sluice
