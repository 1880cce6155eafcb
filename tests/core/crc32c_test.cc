// Tests of CRC-32C (Castagnoli) and the TFRecord CRC masking.
#include "sluice/core/crc32c.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace sluice {
namespace {

// Bit-at-a-time reference implementation (reflected polynomial 0x82F63B78),
// independent of the table and SSE4.2 paths in crc32c.cc.
uint32_t ReferenceCrc32c(uint32_t crc, const uint8_t* p, size_t n) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

uint32_t ValueOf(const std::string& s) { return crc32c::Value(s.data(), s.size()); }

std::vector<uint8_t> RandomBytes(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(byte(rng));
  return v;
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(ValueOf("123456789"), 0xE3069283u);
  EXPECT_EQ(ValueOf(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(ValueOf(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(ValueOf("a"), 0xC1D04330u);
  EXPECT_EQ(ValueOf("The quick brown fox jumps over the lazy dog"), 0x22620404u);

  // RFC 3720 (iSCSI) B.4: 32 bytes ascending / descending.
  std::vector<uint8_t> asc(32), desc(32);
  for (int i = 0; i < 32; ++i) {
    asc[i] = static_cast<uint8_t>(i);
    desc[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c::Value(asc.data(), asc.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c::Value(desc.data(), desc.size()), 0x113FDB5Cu);
}

TEST(Crc32cTest, EmptyInput) {
  EXPECT_EQ(crc32c::Value(nullptr, 0), 0u);
  EXPECT_EQ(crc32c::Value("", 0), 0u);
  // Extending by zero bytes leaves any CRC unchanged.
  EXPECT_EQ(crc32c::Extend(0xE3069283u, "x", 0), 0xE3069283u);
  EXPECT_EQ(crc32c::Extend(0x12345678u, nullptr, 0), 0x12345678u);
}

TEST(Crc32cTest, ValueIsExtendFromZero) {
  const std::string s = "sluice element frame";
  EXPECT_EQ(crc32c::Value(s.data(), s.size()), crc32c::Extend(0, s.data(), s.size()));
}

TEST(Crc32cTest, MatchesReferenceForEveryLengthAndAlignment) {
  // Lengths 0..300 cover the 8-byte word loop and every tail length; offsets
  // 0..15 cover every misalignment of the start pointer.
  std::mt19937 rng(20240601);
  std::vector<uint8_t> buf = RandomBytes(rng, 512);
  for (size_t off = 0; off < 16; ++off) {
    for (size_t len = 0; len <= 300; ++len) {
      ASSERT_EQ(crc32c::Value(buf.data() + off, len), ReferenceCrc32c(0, buf.data() + off, len))
          << "off=" << off << " len=" << len;
    }
  }
}

TEST(Crc32cTest, ExtendWithNonZeroSeedMatchesReference) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<uint8_t> data = RandomBytes(rng, iter);
    uint32_t seed = any(rng);
    ASSERT_EQ(crc32c::Extend(seed, data.data(), data.size()),
              ReferenceCrc32c(seed, data.data(), data.size()))
        << "iter=" << iter;
  }
}

TEST(Crc32cTest, ExtendInPiecesEqualsOneShot) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 200; ++iter) {
    size_t n = std::uniform_int_distribution<size_t>(0, 2000)(rng);
    std::vector<uint8_t> data = RandomBytes(rng, n);
    const uint32_t whole = crc32c::Value(data.data(), data.size());
    ASSERT_EQ(whole, ReferenceCrc32c(0, data.data(), data.size()));

    // Random split points, including empty pieces.
    uint32_t crc = 0;
    size_t pos = 0;
    while (pos < n) {
      size_t piece = std::uniform_int_distribution<size_t>(0, std::min<size_t>(n - pos, 37))(rng);
      crc = crc32c::Extend(crc, data.data() + pos, piece);
      pos += piece;
    }
    EXPECT_EQ(crc, whole) << "iter=" << iter << " n=" << n;
  }
}

TEST(Crc32cTest, ExtendByteAtATimeEqualsOneShot) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data = RandomBytes(rng, 777);
  uint32_t crc = 0;
  for (uint8_t b : data) crc = crc32c::Extend(crc, &b, 1);
  EXPECT_EQ(crc, crc32c::Value(data.data(), data.size()));
}

TEST(Crc32cTest, DetectsSingleBitFlips) {
  std::mt19937 rng(11);
  std::vector<uint8_t> data = RandomBytes(rng, 64);
  const uint32_t base = crc32c::Value(data.data(), data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(crc32c::Value(data.data(), data.size()), base) << "byte " << i << " bit " << bit;
      data[i] ^= static_cast<uint8_t>(1u << bit);
    }
  }
}

TEST(Crc32cTest, MaskKnownValues) {
  // Mask(c) = rotr(c, 15) + 0xa282ead8, as TFRecord stores CRCs.
  EXPECT_EQ(crc32c::Mask(0), 0xA282EAD8u);
  EXPECT_EQ(crc32c::Mask(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(crc32c::Mask(0xC1D04330u), 0x28E46E78u);
  EXPECT_EQ(crc32c::Unmask(0xC78AB0E5u), 0xE3069283u);
}

TEST(Crc32cTest, MaskUnmaskAreInverse) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<uint32_t> values = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu, 0xa282ead8u};
  for (int i = 0; i < 10000; ++i) values.push_back(any(rng));
  for (uint32_t v : values) {
    EXPECT_EQ(crc32c::Unmask(crc32c::Mask(v)), v);
    EXPECT_EQ(crc32c::Mask(crc32c::Unmask(v)), v);
  }
  // Masking changes the value (it is not the identity on typical CRCs).
  EXPECT_NE(crc32c::Mask(0xE3069283u), 0xE3069283u);
  EXPECT_NE(crc32c::Mask(crc32c::Mask(0xE3069283u)), 0xE3069283u);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// The table-driven fallback must agree with the dispatching entry point on
// every length and alignment (here Extend() uses SSE4.2 when present).
TEST(Crc32cPortableTest, MatchesExtend) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 131 + 7));
  for (size_t start = 0; start < 8; ++start) {
    for (size_t len = 0; start + len <= data.size(); len += 37) {
      EXPECT_EQ(crc32c::internal::ExtendPortable(0x1234u, data.data() + start, len),
                crc32c::Extend(0x1234u, data.data() + start, len));
    }
  }
  EXPECT_EQ(crc32c::internal::ExtendPortable(0, "123456789", 9), 0xE3069283u);
}

}  // namespace
}  // namespace sluice
