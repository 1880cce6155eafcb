// Tests of the element frame: layout, encoding, zero-copy decoding, and the
// decoder's validation of corrupt (untrusted) frames.
#include "sluice/core/frame.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sluice/core/tensor.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

bool IsAligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }
uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

template <typename T>
void Put(Bytes& b, size_t off, T v) {
  ASSERT_LE(off + sizeof(T), b.size());
  std::memcpy(b.data() + off, &v, sizeof(T));
}
template <typename T>
T Get(const Bytes& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}

// A numeric tensor of `shape` filled with deterministic bytes (0/1 for bool).
Tensor Patterned(DType dtype, TensorShape shape, uint32_t seed = 1) {
  auto t = Tensor::Allocate(dtype, std::move(shape));
  EXPECT_TRUE(t.ok()) << t.status();
  uint8_t* p = t->mutable_data();
  uint32_t x = seed * 2654435761u + 12345;
  for (size_t i = 0; i < t->byte_size(); ++i) {
    x = x * 1103515245u + 12345;
    p[i] = dtype == DType::kBool ? static_cast<uint8_t>((x >> 16) & 1)
                                 : static_cast<uint8_t>(x >> 16);
  }
  return *std::move(t);
}

Tensor Strs(const std::vector<std::string>& v, TensorShape shape) {
  auto t = Tensor::Strings(v, std::move(shape));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// One component of every dtype, with assorted shapes.
Element AllDTypesElement() {
  Element e;
  int i = 0;
  for (DType d : kAllDTypes) {
    if (d == DType::kString) {
      e.push_back(Strs({"alpha", "", std::string("\x00\xff" "bin", 5), "z"}, TensorShape({2, 2})));
    } else {
      TensorShape shapes[] = {TensorShape({3}), TensorShape(), TensorShape({2, 3, 4}),
                              TensorShape({0}), TensorShape({1, 5})};
      e.push_back(Patterned(d, shapes[i % 5], static_cast<uint32_t>(i)));
    }
    ++i;
  }
  return e;
}

Bytes ToBytes(const OwnedFrame& f) { return Bytes(f.data.get(), f.data.get() + f.size); }

Bytes EncodeBytes(const Element& e, uint16_t flags = 0) {
  auto f = EncodeFrame(e, flags);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return {};
  return ToBytes(*f);
}

// Every decoded tensor's bytes (and each string) must lie inside [lo, hi);
// reads them all so that ASan sees any stray access.
void ExpectInside(const Element& e, const uint8_t* lo, const uint8_t* hi) {
  for (const Tensor& t : e) {
    ASSERT_TRUE(t.valid());
    if (t.byte_size() == 0) continue;
    ASSERT_GE(Addr(t.data()), Addr(lo));
    ASSERT_LE(Addr(t.data()) + t.byte_size(), Addr(hi));
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < t.byte_size(); ++i) sink = sink ^ t.data()[i];
    if (t.dtype() == DType::kString) {
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        std::string_view s = t.str(i);
        ASSERT_GE(Addr(s.data()), Addr(t.data()));
        ASSERT_LE(Addr(s.data()) + s.size(), Addr(t.data()) + t.byte_size());
        for (char c : s) sink = sink ^ static_cast<uint8_t>(c);
      }
    } else {
      ASSERT_EQ(t.byte_size(), static_cast<size_t>(t.num_elements()) * DTypeSize(t.dtype()));
    }
  }
}

// Decodes from a heap copy of exactly bytes.size() bytes, so that ASan
// reports any read past the end, and checks the views of a success.
absl::Status DecodeCopy(const Bytes& bytes) {
  Bytes copy(bytes.begin(), bytes.end());
  auto d = DecodeFrame(copy.data(), copy.size(), nullptr);
  if (d.ok()) ExpectInside(d->element, copy.data(), copy.data() + copy.size());
  return d.status();
}

// Decodes the header and payload of `bytes` (split at `h`) from separate
// exact-size buffers.
absl::Status DecodePartsCopy(const Bytes& bytes, size_t h) {
  Bytes header(bytes.begin(), bytes.begin() + std::min(h, bytes.size()));
  Bytes payload(bytes.begin() + std::min(h, bytes.size()), bytes.end());
  auto d = DecodeFrameParts(header.data(), header.size(), payload.data(), payload.size(), nullptr);
  header.clear();
  header.shrink_to_fit();  // the views must not refer to the header
  if (d.ok()) ExpectInside(d->element, payload.data(), payload.data() + payload.size());
  return d.status();
}

void ExpectRoundTrip(const Element& e, uint16_t flags = 0) {
  ASSERT_OK_AND_ASSIGN(OwnedFrame f, EncodeFrame(e, flags));
  ASSERT_OK_AND_ASSIGN(FrameLayout layout, ComputeFrameLayout(e));
  EXPECT_EQ(f.size, layout.frame_size());
  EXPECT_EQ(f.size % 64, 0u);
  ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrame(f.data.get(), f.size, f.data));
  EXPECT_EQ(d.flags, flags);
  ASSERT_EQ(d.element.size(), e.size());
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_TRUE(d.element[i].Equals(e[i]))
        << "component " << i << ": " << d.element[i].DebugString() << " vs " << e[i].DebugString();
    EXPECT_EQ(d.element[i].dtype(), e[i].dtype());
    EXPECT_EQ(d.element[i].shape(), e[i].shape());
  }
  ExpectInside(d.element, f.data.get() + layout.header_size, f.data.get() + f.size);
}

// ---------------------------------------------------------------------------
// Round trips

TEST(FrameRoundTripTest, SingleComponentOfEveryDType) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(DTypeName(d));
    if (d == DType::kString) {
      ExpectRoundTrip({Tensor::Strings({"a", "bc", "", "def"})});
    } else {
      ExpectRoundTrip({Patterned(d, TensorShape({2, 3}))});
    }
  }
}

TEST(FrameRoundTripTest, MultiComponentAllDTypes) {
  Element e = AllDTypesElement();
  ASSERT_EQ(e.size(), 14u);
  ExpectRoundTrip(e);
  ExpectRoundTrip(e, kFrameEndOfSequence);
}

TEST(FrameRoundTripTest, ScalarsEmptiesAndRank3) {
  ExpectRoundTrip({Tensor::Scalar<int64_t>(-42)});
  ExpectRoundTrip({Tensor::Scalar(true), Tensor::Scalar<double>(2.5), Tensor::String("s")});
  ExpectRoundTrip({Tensor::String("")});
  ExpectRoundTrip({Patterned(DType::kFloat32, TensorShape({0}))});
  ExpectRoundTrip({Tensor::Strings({})});  // string shape [0]
  ExpectRoundTrip({Patterned(DType::kInt32, TensorShape({3, 0, 2}))});
  ExpectRoundTrip({Patterned(DType::kUInt16, TensorShape({2, 3, 4}))});
  ExpectRoundTrip({Strs({"a", "b", "c", "d", "e", "f"}, TensorShape({1, 2, 3}))});
  // Empty components between non-empty ones.
  ExpectRoundTrip({Patterned(DType::kInt8, TensorShape({5})), Tensor::Strings({}),
                   Patterned(DType::kFloat64, TensorShape({0, 4})),
                   Patterned(DType::kInt8, TensorShape({70}))});
}

TEST(FrameRoundTripTest, EmptyElement) {
  ASSERT_OK_AND_ASSIGN(FrameLayout layout, ComputeFrameLayout({}));
  EXPECT_EQ(layout.header_size, 64u);
  EXPECT_EQ(layout.payload_size, 0u);
  ExpectRoundTrip({});
  ExpectRoundTrip({}, kFrameEndOfSequence);
}

TEST(FrameRoundTripTest, MaxRank) {
  std::vector<int64_t> dims(kMaxFrameRank, 1);
  dims[0] = 2;
  dims[31] = 3;
  ExpectRoundTrip({Patterned(DType::kInt16, TensorShape(dims))});
  dims.push_back(1);
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Allocate(DType::kInt8, TensorShape(dims)));
  EXPECT_STATUS(ComputeFrameLayout({t}), kInvalid, "has rank 33; frames allow at most 32");
  EXPECT_STATUS(EncodeFrame({t}), kInvalid, "rank 33");
}

TEST(FrameRoundTripTest, MaxComponents) {
  Element e;
  for (uint32_t i = 0; i < kMaxFrameComponents; ++i) {
    e.push_back(Tensor::Scalar<uint8_t>(static_cast<uint8_t>(i)));
  }
  ExpectRoundTrip(e);
  e.push_back(Tensor::Scalar<uint8_t>(1));
  EXPECT_STATUS(ComputeFrameLayout(e), kInvalid,
                "element has 4097 components; a frame holds at most 4096");
  EXPECT_STATUS(EncodeFrame(e), kInvalid, "4097 components");
  Bytes buf(1 << 20);
  EXPECT_STATUS(EncodeFrame(e, 0, absl::Span<uint8_t>(buf)), kInvalid, "4097 components");
}

TEST(FrameRoundTripTest, InvalidTensorIsRejected) {
  Element e = {Tensor::Scalar<int32_t>(1), Tensor()};
  EXPECT_STATUS(ComputeFrameLayout(e), kInvalid, "component 1 is an invalid tensor");
  EXPECT_STATUS(EncodeFrame(e), kInvalid, "invalid tensor");
}

TEST(FrameRoundTripTest, FlagsRoundTrip) {
  const uint16_t all_flags[] = {0, kFrameEndOfSequence, kFrameSkip,
                                kFrameEndOfSequence | kFrameSkip};
  for (uint16_t flags : all_flags) {
    SCOPED_TRACE(flags);
    ExpectRoundTrip({Tensor::Scalar<int32_t>(3)}, flags);
    ExpectRoundTrip({}, flags);
    Bytes b = EncodeBytes({Tensor::Scalar<int32_t>(3)}, flags);
    EXPECT_EQ(Get<uint16_t>(b, 6), flags);
    ASSERT_OK_AND_ASSIGN(FrameLayout layout, ParseFrameHeader(b.data(), b.size()));
    EXPECT_EQ(layout.flags, flags);
    ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrame(b.data(), b.size(), nullptr));
    EXPECT_EQ(d.flags, flags);
  }
}

// ---------------------------------------------------------------------------
// Layout: the byte table in frame.h

TEST(FrameLayoutTest, MatchesTheByteTable) {
  Element e = {Tensor::FromVector(std::vector<int32_t>{10, 20, 30}), Tensor::Strings({"ab"}),
               Tensor::Scalar<double>(1.5)};
  ASSERT_OK_AND_ASSIGN(FrameLayout layout, ComputeFrameLayout(e));
  // Header: 24 + (24 + 8) + (24 + 8) + 24 = 112 -> 128.
  EXPECT_EQ(layout.header_size, 128u);
  // Payload: [0,12) ; [64, 64+16+2) ; [128, 136) -> 192.
  EXPECT_EQ(layout.payload_size, 192u);
  EXPECT_EQ(layout.frame_size(), 320u);

  Bytes b = EncodeBytes(e, kFrameEndOfSequence);
  ASSERT_EQ(b.size(), 320u);
  EXPECT_EQ(b[0], 'S');
  EXPECT_EQ(b[1], 'L');
  EXPECT_EQ(b[2], 'F');
  EXPECT_EQ(b[3], 'R');
  EXPECT_EQ(Get<uint32_t>(b, 0), kFrameMagic);
  EXPECT_EQ(Get<uint16_t>(b, 4), 1);
  EXPECT_EQ(Get<uint16_t>(b, 6), kFrameEndOfSequence);
  EXPECT_EQ(Get<uint32_t>(b, 8), 3u);
  EXPECT_EQ(Get<uint32_t>(b, 12), 128u);
  EXPECT_EQ(Get<uint64_t>(b, 16), 320u);
  // Descriptor 0 at 24: int32 [3].
  EXPECT_EQ(b[24], static_cast<uint8_t>(DType::kInt32));
  EXPECT_EQ(b[25], 1);
  for (int k = 26; k < 32; ++k) EXPECT_EQ(b[k], 0) << k;
  EXPECT_EQ(Get<uint64_t>(b, 32), 0u);
  EXPECT_EQ(Get<uint64_t>(b, 40), 12u);
  EXPECT_EQ(Get<int64_t>(b, 48), 3);
  // Descriptor 1 at 56: string [1].
  EXPECT_EQ(b[56], static_cast<uint8_t>(DType::kString));
  EXPECT_EQ(b[57], 1);
  for (int k = 58; k < 64; ++k) EXPECT_EQ(b[k], 0) << k;
  EXPECT_EQ(Get<uint64_t>(b, 64), 64u);
  EXPECT_EQ(Get<uint64_t>(b, 72), 18u);
  EXPECT_EQ(Get<int64_t>(b, 80), 1);
  // Descriptor 2 at 88: float64 scalar.
  EXPECT_EQ(b[88], static_cast<uint8_t>(DType::kFloat64));
  EXPECT_EQ(b[89], 0);
  EXPECT_EQ(Get<uint64_t>(b, 96), 128u);
  EXPECT_EQ(Get<uint64_t>(b, 104), 8u);
  // Zero padding up to H.
  for (int k = 112; k < 128; ++k) EXPECT_EQ(b[k], 0) << k;
  // Payloads, each 64-aligned relative to H, zero padded.
  EXPECT_EQ(Get<int32_t>(b, 128), 10);
  EXPECT_EQ(Get<int32_t>(b, 132), 20);
  EXPECT_EQ(Get<int32_t>(b, 136), 30);
  for (int k = 140; k < 192; ++k) EXPECT_EQ(b[k], 0) << k;
  EXPECT_EQ(Get<uint64_t>(b, 192), 0u);
  EXPECT_EQ(Get<uint64_t>(b, 200), 2u);
  EXPECT_EQ(b[208], 'a');
  EXPECT_EQ(b[209], 'b');
  for (int k = 210; k < 256; ++k) EXPECT_EQ(b[k], 0) << k;
  EXPECT_EQ(Get<double>(b, 256), 1.5);
  for (int k = 264; k < 320; ++k) EXPECT_EQ(b[k], 0) << k;

  ASSERT_OK_AND_ASSIGN(FrameLayout parsed, ParseFrameHeader(b.data(), b.size()));
  EXPECT_EQ(parsed.flags, kFrameEndOfSequence);
  EXPECT_EQ(parsed.header_size, 128u);
  EXPECT_EQ(parsed.payload_size, 192u);
  // The header alone is enough for ParseFrameHeader.
  ASSERT_OK_AND_ASSIGN(FrameLayout from_header, ParseFrameHeader(b.data(), 128));
  EXPECT_EQ(from_header.frame_size(), 320u);
}

TEST(FrameLayoutTest, ParseFrameHeaderErrors) {
  Bytes b = EncodeBytes({Tensor::Scalar<int32_t>(1)});
  EXPECT_STATUS(ParseFrameHeader(nullptr, 64), kInvalid, "truncated");
  EXPECT_STATUS(ParseFrameHeader(b.data(), 23), kInvalid,
                "truncated: 23 bytes is shorter than the 24-byte fixed header");
  EXPECT_STATUS(ParseFrameHeader(b.data(), 24), kInvalid, "truncated: header claims 64 bytes");
}

// ---------------------------------------------------------------------------
// Encoding into caller buffers

TEST(FrameEncodeTest, IntoSpan) {
  Element e = AllDTypesElement();
  ASSERT_OK_AND_ASSIGN(FrameLayout layout, ComputeFrameLayout(e));
  Bytes owned = EncodeBytes(e, kFrameSkip);
  ASSERT_EQ(owned.size(), layout.frame_size());

  // Too small: an error, and nothing written.
  Bytes small(layout.frame_size() - 1, 0xAB);
  EXPECT_STATUS(EncodeFrame(e, 0, absl::Span<uint8_t>(small)), kInvalid,
                absl::StrCat("frame needs ", layout.frame_size(), " bytes; buffer has ",
                             layout.frame_size() - 1));
  for (uint8_t c : small) ASSERT_EQ(c, 0xAB);
  EXPECT_STATUS(EncodeFrame(e, 0, absl::Span<uint8_t>()), kInvalid, "buffer has 0");

  // Exactly the frame size, prefilled with garbage: the same bytes as the
  // owned encoding (every padding byte is written).
  Bytes exact(layout.frame_size(), 0xCD);
  ASSERT_OK(EncodeFrame(e, kFrameSkip, absl::Span<uint8_t>(exact)));
  EXPECT_EQ(exact, owned);

  // Larger: bytes past the frame are left alone.
  Bytes big(layout.frame_size() + 100, 0xEE);
  ASSERT_OK(EncodeFrame(e, kFrameSkip, absl::Span<uint8_t>(big)));
  EXPECT_TRUE(std::equal(owned.begin(), owned.end(), big.begin()));
  for (size_t i = owned.size(); i < big.size(); ++i) ASSERT_EQ(big[i], 0xEE) << i;

  ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrame(big.data(), layout.frame_size(), nullptr));
  EXPECT_TRUE(ElementsEqual(d.element, e));
  EXPECT_EQ(d.flags, kFrameSkip);
}

TEST(FrameEncodeTest, EmptyElementIntoTooSmallBuffer) {
  Bytes b(63);
  EXPECT_STATUS(EncodeFrame({}, 0, absl::Span<uint8_t>(b)), kInvalid, "frame needs 64 bytes");
}

// ---------------------------------------------------------------------------
// Zero copy and lifetime

TEST(FrameDecodeTest, DecodedTensorsViewTheFrame) {
  Element e = AllDTypesElement();
  ASSERT_OK_AND_ASSIGN(OwnedFrame f, EncodeFrame(e));
  EXPECT_TRUE(IsAligned64(f.data.get()));
  ASSERT_OK_AND_ASSIGN(FrameLayout layout, ComputeFrameLayout(e));
  const uint8_t* payload = f.data.get() + layout.header_size;
  const uint8_t* end = f.data.get() + f.size;
  ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrame(f.data.get(), f.size, f.data));
  ASSERT_EQ(d.element.size(), e.size());
  for (size_t i = 0; i < d.element.size(); ++i) {
    const Tensor& t = d.element[i];
    SCOPED_TRACE(i);
    EXPECT_GE(Addr(t.data()), Addr(payload));
    EXPECT_LE(Addr(t.data()) + t.byte_size(), Addr(end));
    EXPECT_EQ((Addr(t.data()) - Addr(payload)) % 64, 0u);
    EXPECT_TRUE(IsAligned64(t.data())) << "payloads of an aligned frame are 64-byte aligned";
    EXPECT_EQ(t.owner().get(), static_cast<const void*>(f.data.get()));
  }
  // Writing to the frame is visible through the decoded tensors: no copy.
  const Tensor& first = d.element[0];  // bool [3]
  ASSERT_EQ(first.dtype(), DType::kBool);
  uint8_t* w = f.data.get() + (Addr(first.data()) - Addr(f.data.get()));
  *w = 1;
  EXPECT_EQ(first.data()[0], 1);
  *w = 0;
  EXPECT_EQ(first.data()[0], 0);
}

TEST(FrameDecodeTest, OwnerStaysAliveWhileAnyTensorDoes) {
  Bytes encoded = EncodeBytes({Tensor::Scalar<int64_t>(7), Tensor::Strings({"keep", "me"})});
  bool freed = false;
  auto* storage = new Bytes(encoded);
  const uint8_t* raw = storage->data();
  std::shared_ptr<const void> owner(storage, [&freed](Bytes* p) {
    freed = true;
    delete p;
  });
  std::optional<DecodedFrame> d;
  {
    auto r = DecodeFrame(raw, encoded.size(), owner);
    ASSERT_OK(r);
    d = *std::move(r);
  }
  owner.reset();
  EXPECT_FALSE(freed);
  Tensor kept = d->element[1];
  d.reset();
  EXPECT_FALSE(freed) << "a decoded tensor must keep the frame alive";
  EXPECT_GE(Addr(kept.data()), Addr(raw));
  EXPECT_LT(Addr(kept.data()), Addr(raw) + encoded.size());
  EXPECT_EQ(kept.str(0), "keep");
  EXPECT_EQ(kept.str(1), "me");
  kept = Tensor();
  EXPECT_TRUE(freed) << "the frame must be released with the last tensor";
}

TEST(FrameDecodeTest, MisalignedFrameStillDecodes) {
  Element e = AllDTypesElement();
  Bytes encoded = EncodeBytes(e);
  Bytes shifted(encoded.size() + 3);
  std::memcpy(shifted.data() + 3, encoded.data(), encoded.size());
  ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrame(shifted.data() + 3, encoded.size(), nullptr));
  EXPECT_TRUE(ElementsEqual(d.element, e));
}

TEST(FrameDecodeTest, DecodeFramePartsSeparateBuffers) {
  Element e = AllDTypesElement();
  e.push_back(Tensor::String("last"));
  ASSERT_OK_AND_ASSIGN(OwnedFrame f, EncodeFrame(e, kFrameEndOfSequence));
  ASSERT_OK_AND_ASSIGN(FrameLayout layout, ParseFrameHeader(f.data.get(), f.size));

  // The header travels inline (exact-size heap copy, freed after the call);
  // the payload lands in a separate aligned slot.
  auto header = std::make_unique<Bytes>(f.data.get(), f.data.get() + layout.header_size);
  std::shared_ptr<uint8_t> slot = AllocateAligned(layout.payload_size);
  std::memcpy(slot.get(), f.data.get() + layout.header_size, layout.payload_size);
  f.data.reset();  // the original frame is gone

  ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrameParts(header->data(), header->size(), slot.get(),
                                                        layout.payload_size, slot));
  header.reset();  // "only read during the call"
  EXPECT_EQ(d.flags, kFrameEndOfSequence);
  ASSERT_EQ(d.element.size(), e.size());
  EXPECT_TRUE(ElementsEqual(d.element, e));
  for (const Tensor& t : d.element) {
    EXPECT_GE(Addr(t.data()), Addr(slot.get()));
    EXPECT_LE(Addr(t.data()) + t.byte_size(), Addr(slot.get()) + layout.payload_size);
    EXPECT_TRUE(IsAligned64(t.data()));
    EXPECT_EQ(t.owner().get(), static_cast<const void*>(slot.get()));
  }
  ExpectInside(d.element, slot.get(), slot.get() + layout.payload_size);
}

TEST(FrameDecodeTest, DecodeFramePartsErrors) {
  Bytes b = EncodeBytes(
      {Tensor::FromVector(std::vector<int32_t>{1, 2}), Tensor::Strings({"ab", "c"})});
  ASSERT_EQ(b.size(), 256u);
  const size_t h = 128;
  Bytes header(b.begin(), b.begin() + h);
  Bytes payload(b.begin() + h, b.end());
  ASSERT_OK(DecodeFrameParts(header.data(), h, payload.data(), payload.size(), nullptr));

  // More header bytes given than the header declares.
  Bytes long_header = header;
  long_header.resize(h + 64);
  EXPECT_STATUS(DecodeFrameParts(long_header.data(), long_header.size(), payload.data(),
                                 payload.size(), nullptr),
                kInvalid, "header size field 128 != 192 header bytes given");
  // Fewer: truncated header.
  EXPECT_STATUS(DecodeFrameParts(header.data(), h - 1, payload.data(), payload.size(), nullptr),
                kInvalid, "truncated");
  // Payload of the wrong size.
  EXPECT_STATUS(DecodeFrameParts(header.data(), h, payload.data(), payload.size() - 64, nullptr),
                kInvalid, "frame declares 128 payload bytes; 64 present");
  Bytes long_payload = payload;
  long_payload.resize(payload.size() + 64);
  EXPECT_STATUS(DecodeFrameParts(header.data(), h, long_payload.data(), long_payload.size(),
                                 nullptr),
                kInvalid, "frame declares 128 payload bytes; 192 present");
  EXPECT_STATUS(DecodeFrameParts(header.data(), h, nullptr, payload.size(), nullptr), kInvalid,
                "null payload");
  EXPECT_STATUS(DecodeFrameParts(nullptr, h, payload.data(), payload.size(), nullptr), kInvalid,
                "truncated");

  // A frame with no payload may come with no payload buffer at all.
  Bytes empty = EncodeBytes({});
  ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrameParts(empty.data(), empty.size(), nullptr, 0,
                                                        nullptr));
  EXPECT_TRUE(d.element.empty());
  Bytes zero_size = EncodeBytes({Patterned(DType::kInt32, TensorShape({0}))});
  ASSERT_OK_AND_ASSIGN(DecodedFrame z, DecodeFrameParts(zero_size.data(), zero_size.size(),
                                                        nullptr, 0, nullptr));
  ASSERT_EQ(z.element.size(), 1u);
  EXPECT_EQ(z.element[0].shape(), TensorShape({0}));
}

// ---------------------------------------------------------------------------
// Randomized round trip

Tensor RandomTensor(std::mt19937& rng) {
  const DType dtype = kAllDTypes[std::uniform_int_distribution<int>(0, 13)(rng)];
  const int rank = std::uniform_int_distribution<int>(0, 4)(rng);
  std::vector<int64_t> dims;
  for (int r = 0; r < rank; ++r) {
    // Mostly small non-zero dims, sometimes zero.
    dims.push_back(std::uniform_int_distribution<int>(0, 9)(rng) == 0
                       ? 0
                       : std::uniform_int_distribution<int64_t>(1, rank <= 2 ? 9 : 4)(rng));
  }
  TensorShape shape(dims);
  if (dtype == DType::kString) {
    std::vector<std::string> values(static_cast<size_t>(shape.num_elements()));
    for (auto& s : values) {
      s.resize(std::uniform_int_distribution<size_t>(0, 12)(rng));
      for (auto& c : s) c = static_cast<char>(rng());
    }
    return Strs(values, shape);
  }
  return Patterned(dtype, shape, static_cast<uint32_t>(rng()));
}

Element RandomElement(std::mt19937& rng, int max_components) {
  Element e;
  const int n = std::uniform_int_distribution<int>(0, max_components)(rng);
  for (int i = 0; i < n; ++i) e.push_back(RandomTensor(rng));
  return e;
}

TEST(FrameFuzzTest, RandomRoundTrip) {
  std::mt19937 rng(0x5eed);
  for (int iter = 0; iter < 400; ++iter) {
    SCOPED_TRACE(iter);
    Element e = RandomElement(rng, 8);
    const uint16_t flags = static_cast<uint16_t>(rng() % 4);

    ASSERT_OK_AND_ASSIGN(OwnedFrame f, EncodeFrame(e, flags));
    ASSERT_OK_AND_ASSIGN(DecodedFrame d, DecodeFrame(f.data.get(), f.size, f.data));
    ASSERT_EQ(d.flags, flags);
    ASSERT_TRUE(ElementsEqual(d.element, e))
        << ElementDebugString(d.element) << " vs " << ElementDebugString(e);
    ASSERT_OK_AND_ASSIGN(FrameLayout layout, ComputeFrameLayout(e));
    for (const Tensor& t : d.element) {
      ASSERT_EQ((Addr(t.data()) - Addr(f.data.get() + layout.header_size)) % 64, 0u);
    }

    // Into a caller buffer with slack and garbage: the same bytes.
    Bytes buf(f.size + rng() % 100, static_cast<uint8_t>(rng()));
    ASSERT_OK(EncodeFrame(e, flags, absl::Span<uint8_t>(buf)));
    ASSERT_TRUE(std::equal(f.data.get(), f.data.get() + f.size, buf.begin()));

    // Header and payload apart.
    Bytes bytes = ToBytes(f);
    ASSERT_OK(DecodePartsCopy(bytes, layout.header_size));
    ASSERT_OK(DecodeCopy(bytes));
  }
}

// ---------------------------------------------------------------------------
// Corrupt frames

// {int32[2]{1,2}, string[2]{"ab","c"}}:
//   header: 24 + 32 + 32 = 88 -> H = 128; descriptors at 24 and 56
//   payload: int32 at 0 (8 bytes), string at 64 (24 + 3 bytes) -> 128
constexpr size_t kDesc0 = 24;
constexpr size_t kDesc1 = 56;
constexpr size_t kH = 128;

Bytes SmallFrame() {
  Bytes b = EncodeBytes({Tensor::FromVector(std::vector<int32_t>{1, 2}),
                         Tensor::Strings({"ab", "c"})});
  EXPECT_EQ(b.size(), 256u);
  EXPECT_EQ(Get<uint32_t>(b, 12), kH);
  EXPECT_EQ(Get<uint64_t>(b, kDesc1 + 8), 64u);
  return b;
}

TEST(FrameCorruptTest, SmallFrameIsValid) {
  Bytes b = SmallFrame();
  ASSERT_OK(DecodeCopy(b));
  ASSERT_OK(DecodePartsCopy(b, kH));
}

TEST(FrameCorruptTest, BadMagic) {
  Bytes b = SmallFrame();
  b[0] = 'X';
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "corrupt element frame: bad magic");
  b = SmallFrame();
  b[3] = 'r';
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "bad magic");
  Put<uint32_t>(b, 0, 0x53464c52);  // byte-swapped
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "bad magic");
}

TEST(FrameCorruptTest, BadVersion) {
  Bytes b = SmallFrame();
  Put<uint16_t>(b, 4, 2);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "unsupported version 2; this build reads version 1");
  Put<uint16_t>(b, 4, 0);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "unsupported version 0");
  Put<uint16_t>(b, 4, 0x0100);  // big-endian 1
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "unsupported version");
}

TEST(FrameCorruptTest, UnknownFlags) {
  for (uint16_t flags : {uint16_t{0x10}, uint16_t{0x11}, uint16_t{0x8000}, uint16_t{0xffff}}) {
    Bytes b = SmallFrame();
    Put<uint16_t>(b, 6, flags);
    EXPECT_STATUS(DecodeCopy(b), kInvalid, "unknown flags 0x");
    EXPECT_STATUS(ParseFrameHeader(b.data(), b.size()), kInvalid, "unknown flags");
  }
  Bytes b = SmallFrame();
  Put<uint16_t>(b, 6, 0x10);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "unknown flags 0x10");
  Put<uint16_t>(b, 6, kFrameLz4 | kFrameZstd);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "two codecs flagged");
  // The encoder refuses to write what the decoder would reject.
  Element e = {Tensor::Scalar<int32_t>(1)};
  EXPECT_STATUS(EncodeFrame(e, uint16_t{4}), kInvalid, "unknown frame flags 0x4");
}

TEST(FrameCorruptTest, TruncatedAtEveryPrefix) {
  const Bytes b = SmallFrame();
  for (size_t len = 0; len < b.size(); ++len) {
    SCOPED_TRACE(len);
    Bytes prefix(b.begin(), b.begin() + len);
    EXPECT_STATUS(DecodeCopy(prefix), kInvalid, "truncated");
  }
  // The header alone, split at every length.
  for (size_t len = 0; len < kH; ++len) {
    Bytes prefix(b.begin(), b.begin() + len);
    EXPECT_FALSE(DecodeFrameParts(prefix.data(), prefix.size(), b.data() + kH, b.size() - kH,
                                  nullptr)
                     .ok())
        << "len=" << len;
  }
  // The payload cut short at every length.
  for (size_t len = 0; len < b.size() - kH; ++len) {
    SCOPED_TRACE(len);
    Bytes payload(b.begin() + kH, b.begin() + kH + len);
    EXPECT_STATUS(DecodeFrameParts(b.data(), kH, payload.data(), payload.size(), nullptr),
                  kInvalid, "payload bytes");
  }
}

TEST(FrameCorruptTest, TruncatedBigFrameAtEveryPrefix) {
  const Bytes b = EncodeBytes(AllDTypesElement());
  ASSERT_OK(DecodeCopy(b));
  for (size_t len = 0; len < b.size(); ++len) {
    Bytes prefix(b.begin(), b.begin() + len);
    ASSERT_FALSE(DecodeCopy(prefix).ok()) << "len=" << len;
  }
}

TEST(FrameCorruptTest, FrameSizeMismatch) {
  Bytes b = SmallFrame();
  Put<uint64_t>(b, 16, 320);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame declares 320 bytes; 256 present (truncated)");
  Put<uint64_t>(b, 16, 192);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame declares 192 bytes; 256 present");
  Put<uint64_t>(b, 16, 64);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame size 64 < header size 128");
  Put<uint64_t>(b, 16, 0);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame size 0 < header size");
  Put<uint64_t>(b, 16, std::numeric_limits<uint64_t>::max());
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame declares");
  // Trailing bytes after a valid frame.
  b = SmallFrame();
  b.resize(b.size() + 64);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame declares 256 bytes; 320 present");
  b = SmallFrame();
  b.push_back(0);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "frame declares 256 bytes; 257 present");
}

TEST(FrameCorruptTest, HeaderSizeField) {
  for (uint32_t h : {0u, 8u, 24u, 100u, 127u, 129u, 0xffffffc0u + 1}) {
    SCOPED_TRACE(h);
    Bytes b = SmallFrame();
    Put<uint32_t>(b, 12, h);
    EXPECT_STATUS(DecodeCopy(b), kInvalid, "is not a multiple of 64 >= 24");
  }
  Bytes b = SmallFrame();
  Put<uint32_t>(b, 12, 320);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "truncated: header claims 320 bytes, 256 present");
  Put<uint32_t>(b, 12, 0xffffffc0u);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "truncated: header claims");
  // Too small for the descriptors it must hold.
  Put<uint32_t>(b, 12, 64);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "descriptor 1 runs past the header");
  // Larger than the real header: the payload area moves and no longer fits.
  Put<uint32_t>(b, 12, 192);
  EXPECT_FALSE(DecodeCopy(b).ok());
  Put<uint32_t>(b, 12, 256);  // = frame size: no payload area at all
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "outside the 0-byte payload area");
}

TEST(FrameCorruptTest, ComponentCount) {
  Bytes b = SmallFrame();
  Put<uint32_t>(b, 8, kMaxFrameComponents + 1);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "4097 components is too many");
  Put<uint32_t>(b, 8, 0xffffffffu);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "components is too many");
  // A third descriptor would be read from the zero padding: dtype 0.
  Put<uint32_t>(b, 8, 3);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 2: bad dtype 0");
  Put<uint32_t>(b, 8, kMaxFrameComponents);
  EXPECT_FALSE(DecodeCopy(b).ok());
  // Fewer components than encoded is self-consistent: only the first decodes.
  Put<uint32_t>(b, 8, 1);
  ASSERT_OK(DecodeCopy(b));

  // One rank-0 descriptor fills [24, 48) of a 64-byte header: a second one
  // (or a larger rank) would run past it.
  Bytes s = EncodeBytes({Tensor::Scalar<int64_t>(5)});
  ASSERT_EQ(Get<uint32_t>(s, 12), 64u);
  Put<uint32_t>(s, 8, 2);
  EXPECT_STATUS(DecodeCopy(s), kInvalid, "descriptor 1 runs past the header");
  s = EncodeBytes({Tensor::Scalar<int64_t>(5)});
  s[kDesc0 + 1] = 3;
  EXPECT_STATUS(DecodeCopy(s), kInvalid, "descriptor 0 runs past the header");
}

TEST(FrameCorruptTest, BadDTypeByte) {
  for (uint8_t dt : {uint8_t{0}, uint8_t{15}, uint8_t{16}, uint8_t{128}, uint8_t{255}}) {
    Bytes b = SmallFrame();
    b[kDesc0] = dt;
    EXPECT_STATUS(DecodeCopy(b), kInvalid, absl::StrCat("component 0: bad dtype ", dt));
    b = SmallFrame();
    b[kDesc1] = dt;
    EXPECT_STATUS(DecodeCopy(b), kInvalid, absl::StrCat("component 1: bad dtype ", dt));
  }
  // A valid dtype of another width no longer matches the payload size.
  Bytes b = SmallFrame();
  b[kDesc0] = static_cast<uint8_t>(DType::kInt64);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "needs 16 bytes; 8 given");
  b[kDesc0] = static_cast<uint8_t>(DType::kString);  // 8 bytes cannot hold 3 offsets
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "bytes of offsets");
  // The string component reinterpreted as bytes: [2] uint8 needs 2 bytes, not 27.
  b = SmallFrame();
  b[kDesc1] = static_cast<uint8_t>(DType::kUInt8);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "needs 2 bytes; 27 given");
}

TEST(FrameCorruptTest, RankTooLarge) {
  for (uint8_t rank : {uint8_t{33}, uint8_t{64}, uint8_t{255}}) {
    Bytes b = SmallFrame();
    b[kDesc0 + 1] = rank;
    EXPECT_STATUS(DecodeCopy(b), kInvalid, absl::StrCat("component 0: rank ", rank));
  }
}

TEST(FrameCorruptTest, ReservedBytesSet) {
  for (size_t desc : {kDesc0, kDesc1}) {
    for (size_t k = 2; k < 8; ++k) {
      SCOPED_TRACE(desc + k);
      Bytes b = SmallFrame();
      b[desc + k] = 1;
      EXPECT_STATUS(DecodeCopy(b), kInvalid, "reserved bytes set");
      b[desc + k] = 0x80;
      EXPECT_STATUS(DecodeCopy(b), kInvalid, "reserved bytes set");
    }
  }
}

TEST(FrameCorruptTest, PayloadOffsetMisaligned) {
  for (uint64_t off : {uint64_t{1}, uint64_t{8}, uint64_t{32}, uint64_t{63}, uint64_t{65}}) {
    Bytes b = SmallFrame();
    Put<uint64_t>(b, kDesc1 + 8, off);
    EXPECT_STATUS(DecodeCopy(b), kInvalid, absl::StrCat("payload offset ", off, " not 64-aligned"));
  }
  Bytes b = SmallFrame();
  Put<uint64_t>(b, kDesc0 + 8, 4);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 0: payload offset 4 not 64-aligned");
}

TEST(FrameCorruptTest, PayloadOutOfRange) {
  struct Case {
    size_t field;
    uint64_t value;
  };
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const Case cases[] = {
      {kDesc1 + 8, 128},                  // offset at the end, size 27
      {kDesc1 + 8, 192},                  // offset past the end
      {kDesc1 + 8, uint64_t{1} << 40},
      {kDesc1 + 8, kMax - 63},            // 64-aligned, near 2^64
      {kDesc1 + 16, 65},                  // 64 + 65 > 128
      {kDesc1 + 16, kMax},                // offset + size would wrap
      {kDesc1 + 16, kMax - 63},
      {kDesc0 + 16, 129},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.field, "=", c.value));
    Bytes b = SmallFrame();
    Put<uint64_t>(b, c.field, c.value);
    EXPECT_STATUS(DecodeCopy(b), kInvalid, "-byte payload area");
  }
}

TEST(FrameCorruptTest, OverlappingPayloads) {
  Bytes b = SmallFrame();
  Put<uint64_t>(b, kDesc1 + 8, 0);  // on top of component 0
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 1: payload overlaps the previous one");
  // Out of order: component 0 after component 1's start.
  b = SmallFrame();
  Put<uint64_t>(b, kDesc0 + 8, 64);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "overlaps");
  // Component 0 grown (with its shape) into component 1's payload.
  b = SmallFrame();
  Put<uint64_t>(b, kDesc0 + 16, 72);
  Put<int64_t>(b, kDesc0 + 24, 18);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "overlaps");
}

TEST(FrameCorruptTest, NegativeAndOverflowingDims) {
  Bytes b = SmallFrame();
  Put<int64_t>(b, kDesc0 + 24, -2);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 0: shape [-2] has a negative dimension");
  b = SmallFrame();
  Put<int64_t>(b, kDesc1 + 24, std::numeric_limits<int64_t>::min());
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 1: shape");

  Bytes r = EncodeBytes({Patterned(DType::kInt8, TensorShape({2, 3, 4}))});
  ASSERT_OK(DecodeCopy(r));
  Put<int64_t>(r, kDesc0 + 24, -2);
  Put<int64_t>(r, kDesc0 + 32, -3);  // product of dims positive: still rejected
  Put<int64_t>(r, kDesc0 + 40, 4);
  EXPECT_STATUS(DecodeCopy(r), kInvalid, "negative dimension");
  Put<int64_t>(r, kDesc0 + 24, int64_t{1} << 32);
  Put<int64_t>(r, kDesc0 + 32, int64_t{1} << 32);
  Put<int64_t>(r, kDesc0 + 40, 0);
  EXPECT_STATUS(DecodeCopy(r), kInvalid, "too many elements");
  Put<int64_t>(r, kDesc0 + 40, 1);
  EXPECT_STATUS(DecodeCopy(r), kInvalid, "too many elements");
}

TEST(FrameCorruptTest, ShapeSizeMismatch) {
  Bytes b = SmallFrame();
  Put<int64_t>(b, kDesc0 + 24, 3);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "int32 tensor of shape [3] needs 12 bytes; 8 given");
  b = SmallFrame();
  Put<int64_t>(b, kDesc0 + 24, 0);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "needs 0 bytes; 8 given");
  b = SmallFrame();
  Put<uint64_t>(b, kDesc0 + 16, 4);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "needs 8 bytes; 4 given");
  b = SmallFrame();
  Put<uint64_t>(b, kDesc0 + 16, 0);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "needs 8 bytes; 0 given");
  // String component with the wrong element count.
  b = SmallFrame();
  Put<int64_t>(b, kDesc1 + 24, 3);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "needs 32 bytes of offsets; only 27");
  b = SmallFrame();
  Put<int64_t>(b, kDesc1 + 24, 1);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "last offset 2 != size of its bytes 11");
  // String component with a size that cuts its bytes short.
  b = SmallFrame();
  Put<uint64_t>(b, kDesc1 + 16, 26);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 1: string tensor");
  // The rank byte changed: dims are read differently.
  b = SmallFrame();
  b[kDesc0 + 1] = 0;  // scalar: descriptor shrinks, descriptor 1 is misread
  EXPECT_FALSE(DecodeCopy(b).ok());
}

TEST(FrameCorruptTest, CorruptStringOffsets) {
  // The string payload starts at H + 64 = 192: offsets {0, 2, 3} then "abc".
  constexpr size_t kStr = kH + 64;
  Bytes b = SmallFrame();
  ASSERT_EQ(Get<uint64_t>(b, kStr), 0u);
  ASSERT_EQ(Get<uint64_t>(b, kStr + 8), 2u);
  ASSERT_EQ(Get<uint64_t>(b, kStr + 16), 3u);

  Put<uint64_t>(b, kStr, 1);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "component 1: string tensor offset 0 = 1");
  b = SmallFrame();
  Put<uint64_t>(b, kStr + 8, 4);  // beyond the 3 bytes
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "string tensor offset 1 = 4");
  b = SmallFrame();
  Put<uint64_t>(b, kStr + 8, std::numeric_limits<uint64_t>::max());
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "string tensor offset 1");
  b = SmallFrame();
  Put<uint64_t>(b, kStr + 16, 1);  // decreasing
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "string tensor offset 2 = 1 is out of order");
  b = SmallFrame();
  Put<uint64_t>(b, kStr + 8, 3);
  Put<uint64_t>(b, kStr + 16, 2);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "out of order");
  // Offsets that are consistent but do not cover the bytes.
  b = SmallFrame();
  Put<uint64_t>(b, kStr + 16, 2);
  Put<uint64_t>(b, kStr + 8, 1);
  EXPECT_STATUS(DecodeCopy(b), kInvalid, "last offset 2 != size of its bytes 3");
  // Changing the string bytes themselves is not corruption.
  b = SmallFrame();
  b[kStr + 24] = 'X';
  ASSERT_OK(DecodeCopy(b));
}

TEST(FrameCorruptTest, AllErrorsAreInvalidArgumentWithPrefix) {
  // Spot-check that decode errors identify themselves as frame corruption.
  Bytes b = SmallFrame();
  b[kDesc0] = 0;
  absl::Status s = DecodeCopy(b);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("corrupt element frame: "));
  b = SmallFrame();
  Put<uint64_t>(b, kH + 64, 1);
  s = DecodeCopy(b);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("corrupt element frame: "));
}

// ---------------------------------------------------------------------------
// Byte-flip fuzzing: decode must succeed or fail cleanly, never crash or read
// outside the frame (run under the asan preset too).

TEST(FrameFuzzTest, RandomByteFlips) {
  std::mt19937 rng(0xf1f1);
  int ok = 0, failed = 0;
  for (int base = 0; base < 60; ++base) {
    Element e = RandomElement(rng, 5);
    if (base % 10 == 0) e.push_back(Tensor::Strings({"x", "yy", ""}));
    const Bytes frame = EncodeBytes(e, static_cast<uint16_t>(rng() % 4));
    ASSERT_FALSE(frame.empty());
    const size_t h = Get<uint32_t>(frame, 12);
    for (int m = 0; m < 200; ++m) {
      Bytes b = frame;
      const int flips = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int k = 0; k < flips; ++k) {
        // Mostly hit the header, where every byte is validated.
        const size_t limit = (rng() % 4 != 0) ? h : b.size();
        const size_t pos = rng() % limit;
        switch (rng() % 3) {
          case 0: b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
          case 1: b[pos] = static_cast<uint8_t>(rng()); break;
          default: b[pos] = (rng() % 2) ? 0xff : 0x00; break;
        }
      }
      if (rng() % 8 == 0) b.resize(rng() % (b.size() + 65));  // truncate or extend
      absl::Status s = DecodeCopy(b);
      if (s.ok()) {
        ++ok;
      } else {
        ++failed;
        EXPECT_EQ(s.code(), kInvalid) << s;
      }
      if (b.size() >= h) {
        absl::Status p = DecodePartsCopy(b, h);
        if (!p.ok()) {
          EXPECT_EQ(p.code(), kInvalid) << p;
        }
      }
      if (HasFatalFailure()) return;
    }
  }
  // The mutations reached both outcomes.
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

TEST(FrameFuzzTest, InterestingValuesInEveryHeaderPosition) {
  // Write boundary values of each width at every header offset of a
  // multi-component frame.
  Element e = {Tensor::FromVector(std::vector<int16_t>{1, 2, 3}), Tensor::Strings({"ab", "", "c"}),
               Patterned(DType::kFloat32, TensorShape({2, 0, 3})),
               Patterned(DType::kUInt8, TensorShape({2, 2}))};
  const Bytes frame = EncodeBytes(e);
  const size_t h = Get<uint32_t>(frame, 12);
  const uint64_t values[] = {0, 1, 2, 7, 8, 14, 15, 24, 32, 33, 63, 64, 65, 127, 128, 255,
                             h, frame.size(), frame.size() - h, frame.size() + 64,
                             uint64_t{1} << 31, uint64_t{1} << 32, uint64_t{1} << 63,
                             ~uint64_t{0}, ~uint64_t{0} - 63, static_cast<uint64_t>(-2)};
  int failed = 0;
  for (size_t pos = 0; pos < h; ++pos) {
    for (uint64_t v : values) {
      for (size_t width : {1, 2, 4, 8}) {
        if (pos + width > frame.size()) continue;
        Bytes b = frame;
        std::memcpy(b.data() + pos, &v, width);  // little-endian low bytes
        absl::Status s = DecodeCopy(b);
        if (!s.ok()) {
          ++failed;
          EXPECT_EQ(s.code(), kInvalid) << s;
        }
        absl::Status p = DecodePartsCopy(b, h);
        if (!p.ok()) {
          EXPECT_EQ(p.code(), kInvalid) << p;
        }
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GT(failed, 0);
}

}  // namespace
}  // namespace sluice

// ---- compressed frames ----

namespace sluice {
namespace {

// A frame of `e` compressed with `codec` (the test fails when it does not
// compress), and its decoding.
std::optional<OwnedFrame> Compressed(const Element& e, FrameCodec codec, uint16_t flags = 0) {
  auto f = EncodeFrame(e, flags);
  EXPECT_OK(f.status());
  if (!f.ok()) return std::nullopt;
  auto layout = ParseFrameHeader(f->data.get(), f->size);
  EXPECT_OK(layout.status());
  auto data = FramePayloadDataBytes(f->data.get(), layout->header_size);
  EXPECT_OK(data.status());
  auto c = CompressFrame(f->data.get(), layout->header_size, f->data.get() + layout->header_size,
                         *data, codec);
  EXPECT_OK(c.status());
  return c.ok() ? *std::move(c) : std::nullopt;
}

TEST(FrameCompressionTest, CompressibleElementsRoundTripWithBothCodecs) {
  std::vector<int64_t> range(100000);
  for (size_t i = 0; i < range.size(); ++i) range[i] = static_cast<int64_t>(i);
  std::string text;
  while (text.size() < 50000) text += "the quick brown fox jumps over the lazy dog ";
  const Element e = {Tensor::FromVector<int64_t>(range), Tensor::Scalar<float>(2.5f),
                     Tensor::Strings({text, "", "x"})};
  auto plain = EncodeFrame(e);
  ASSERT_OK(plain.status());
  for (FrameCodec codec : {FrameCodec::kLz4, FrameCodec::kZstd}) {
    SCOPED_TRACE(FrameCodecName(codec));
    auto c = Compressed(e, codec, kFrameEndOfSequence);
    ASSERT_TRUE(c.has_value()) << "did not compress";
    EXPECT_LT(c->size, plain->size / 2);
    auto d = DecodeFrame(c->data.get(), c->size, c->data);
    ASSERT_OK(d.status());
    EXPECT_TRUE(ElementsEqual(d->element, e));
    EXPECT_EQ(d->flags, kFrameEndOfSequence);  // the codec's flag is the decoder's business
    // Decoded tensors are 64-byte aligned, in memory of their own.
    for (const Tensor& t : d->element) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kFrameAlignment, 0u);
    }
  }
  EXPECT_FALSE(Compressed(e, FrameCodec::kNone).has_value());
}

// A receiver's allocator (its registered arenas) gets the decompressed
// frame; one with nothing to spare (null) leaves it to the heap.
TEST(FrameCompressionTest, DecompressesIntoTheReceiversMemoryWhenItHasSome) {
  std::vector<int64_t> range(50000);
  for (size_t i = 0; i < range.size(); ++i) range[i] = static_cast<int64_t>(i % 100);
  const Element e = {Tensor::FromVector<int64_t>(range)};
  auto c = Compressed(e, FrameCodec::kZstd);
  ASSERT_TRUE(c.has_value());
  std::shared_ptr<uint8_t> arena = AllocateAligned(size_t{1} << 20, /*zeroed=*/true);
  std::vector<size_t> asked;
  DecompressAllocator from_arena = [&](size_t bytes) -> std::shared_ptr<uint8_t> {
    asked.push_back(bytes);
    return bytes <= (size_t{1} << 20) ? arena : nullptr;
  };
  auto d = DecodeFrame(c->data.get(), c->size, c->data, UINT64_MAX, from_arena);
  ASSERT_OK(d.status());
  EXPECT_TRUE(ElementsEqual(d->element, e));
  ASSERT_EQ(asked.size(), 1u);
  const uint8_t* data = static_cast<const uint8_t*>(d->element[0].data());
  EXPECT_GE(data, arena.get());
  EXPECT_LE(data + d->element[0].byte_size(), arena.get() + asked[0]);
  DecompressAllocator none = [](size_t) { return std::shared_ptr<uint8_t>(); };
  d = DecodeFrame(c->data.get(), c->size, c->data, UINT64_MAX, none);
  ASSERT_OK(d.status());
  EXPECT_TRUE(ElementsEqual(d->element, e));
  data = static_cast<const uint8_t*>(d->element[0].data());
  EXPECT_TRUE(data < arena.get() || data >= arena.get() + (size_t{1} << 20));
}

TEST(FrameCompressionTest, IncompressibleOrTinyPayloadsAreSentAsTheyAre) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> noise(20000);
  for (auto& v : noise) v = static_cast<int64_t>(rng());
  EXPECT_FALSE(Compressed({Tensor::FromVector<int64_t>(noise)}, FrameCodec::kLz4).has_value());
  EXPECT_FALSE(Compressed({Tensor::FromVector<int64_t>(noise)}, FrameCodec::kZstd).has_value());
  EXPECT_FALSE(Compressed({Tensor::Scalar<int64_t>(0)}, FrameCodec::kZstd).has_value());
}

// Every damaged compressed frame is an error, never a crash or a bad element.
TEST(FrameCompressionTest, DamagedCompressedFramesAreInvalidArgument) {
  std::vector<int32_t> v(50000, 3);
  const Element e = {Tensor::FromVector<int32_t>(v)};
  for (FrameCodec codec : {FrameCodec::kLz4, FrameCodec::kZstd}) {
    SCOPED_TRACE(FrameCodecName(codec));
    auto c = Compressed(e, codec);
    ASSERT_TRUE(c.has_value());
    const Bytes whole(c->data.get(), c->data.get() + c->size);
    const size_t h = ParseFrameHeader(whole.data(), whole.size())->header_size;
    // Truncated (the frame size no longer matches), then with its frame size
    // patched so the short payload reaches the codec.
    for (size_t cut : {h + 1, whole.size() - 1}) {
      Bytes b(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(cut));
      EXPECT_EQ(DecodeCopy(b).code(), kInvalid);
      Put<uint64_t>(b, 16, b.size());
      EXPECT_STATUS(DecodeCopy(b), kInvalid, "decompress");
    }
    // Garbage in the compressed bytes.
    Bytes garbage = whole;
    for (size_t i = h; i < garbage.size(); ++i) garbage[i] ^= 0x5a;
    EXPECT_EQ(DecodeCopy(garbage).code(), kInvalid);
    // A header that promises more than the payload holds, and a hostile size.
    Bytes bigger = whole;
    Put<uint64_t>(bigger, kFrameFixedHeaderSize + 16, v.size() * 4 + 64);
    EXPECT_STATUS(DecodeCopy(bigger), kInvalid, "decompress");
    Bytes hostile = whole;
    Put<uint64_t>(hostile, kFrameFixedHeaderSize + 16, uint64_t{1} << 40);
    EXPECT_STATUS(DecodeCopy(hostile), kInvalid, "payload bytes");
    // The receiver's bound holds for the decompressed element.
    EXPECT_STATUS(DecodeFrame(whole.data(), whole.size(), nullptr, v.size() * 4),
                  absl::StatusCode::kResourceExhausted, "once decompressed");
    EXPECT_OK(DecodeFrame(whole.data(), whole.size(), nullptr, v.size() * 4 + 4096).status());
    // Compressed frames never travel in parts.
    EXPECT_STATUS(DecodeFrameParts(whole.data(), h, whole.data() + h, whole.size() - h, nullptr),
                  kInvalid, "compressed frame arrived in parts");
  }
}

}  // namespace
}  // namespace sluice
