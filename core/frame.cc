#include "sluice/core/frame.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

size_t AlignUp(size_t v) { return (v + kFrameAlignment - 1) / kFrameAlignment * kFrameAlignment; }

template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

size_t DescriptorSize(size_t rank) { return 24 + 8 * rank; }

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt element frame: ", what));
}

}  // namespace

absl::StatusOr<FrameLayout> ComputeFrameLayout(const Element& element) {
  if (element.size() > kMaxFrameComponents) {
    return absl::InvalidArgumentError(absl::StrCat("element has ", element.size(),
                                                   " components; a frame holds at most ",
                                                   kMaxFrameComponents));
  }
  size_t header = kFrameFixedHeaderSize;
  size_t payload = 0;
  for (size_t i = 0; i < element.size(); ++i) {
    const Tensor& t = element[i];
    if (!t.valid()) {
      return absl::InvalidArgumentError(absl::StrCat("component ", i, " is an invalid tensor"));
    }
    if (static_cast<uint32_t>(t.shape().rank()) > kMaxFrameRank) {
      return absl::InvalidArgumentError(absl::StrCat("component ", i, " has rank ",
                                                     t.shape().rank(), "; frames allow at most ",
                                                     kMaxFrameRank));
    }
    header += DescriptorSize(t.shape().rank());
    payload = AlignUp(payload) + t.byte_size();
  }
  FrameLayout layout;
  layout.header_size = AlignUp(header);
  layout.payload_size = AlignUp(payload);
  return layout;
}

namespace {

// Writes the header of `element`'s frame (layout.header_size bytes) and,
// when `area` is not null, its payload area; both must be large enough.
absl::Status EncodeFrameImpl(const Element& element, uint16_t flags, const FrameLayout& layout,
                             uint8_t* p, uint8_t* area) {
  if (flags & ~(kFrameEndOfSequence | kFrameSkip)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown frame flags 0x", absl::Hex(flags)));
  }
  std::memset(p, 0, layout.header_size);
  Put<uint32_t>(p + 0, kFrameMagic);
  Put<uint16_t>(p + 4, kFrameVersion);
  Put<uint16_t>(p + 6, flags);
  Put<uint32_t>(p + 8, static_cast<uint32_t>(element.size()));
  Put<uint32_t>(p + 12, static_cast<uint32_t>(layout.header_size));
  Put<uint64_t>(p + 16, layout.frame_size());
  size_t desc = kFrameFixedHeaderSize;
  size_t payload = 0;
  for (const Tensor& t : element) {
    size_t off = AlignUp(payload);
    if (area != nullptr && off > payload) std::memset(area + payload, 0, off - payload);
    uint8_t* d = p + desc;
    d[0] = static_cast<uint8_t>(t.dtype());
    d[1] = static_cast<uint8_t>(t.shape().rank());
    Put<uint64_t>(d + 8, off);
    Put<uint64_t>(d + 16, t.byte_size());
    for (int r = 0; r < t.shape().rank(); ++r) Put<int64_t>(d + 24 + 8 * r, t.shape().dim(r));
    if (area != nullptr && t.byte_size() > 0) std::memcpy(area + off, t.data(), t.byte_size());
    payload = off + t.byte_size();
    desc += DescriptorSize(t.shape().rank());
  }
  if (area != nullptr && layout.payload_size > payload) {
    std::memset(area + payload, 0, layout.payload_size - payload);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeFrame(const Element& element, uint16_t flags, absl::Span<uint8_t> out) {
  auto layout = ComputeFrameLayout(element);
  if (!layout.ok()) return layout.status();
  if (out.size() < layout->frame_size()) {
    return absl::InvalidArgumentError(absl::StrCat("frame needs ", layout->frame_size(),
                                                   " bytes; buffer has ", out.size()));
  }
  return EncodeFrameImpl(element, flags, *layout, out.data(), out.data() + layout->header_size);
}

absl::Status EncodeFrameHeader(const Element& element, uint16_t flags, absl::Span<uint8_t> out) {
  auto layout = ComputeFrameLayout(element);
  if (!layout.ok()) return layout.status();
  if (out.size() < layout->header_size) {
    return absl::InvalidArgumentError(absl::StrCat("frame header needs ", layout->header_size,
                                                   " bytes; buffer has ", out.size()));
  }
  return EncodeFrameImpl(element, flags, *layout, out.data(), nullptr);
}

absl::StatusOr<OwnedFrame> EncodeFrame(const Element& element, uint16_t flags) {
  auto layout = ComputeFrameLayout(element);
  if (!layout.ok()) return layout.status();
  OwnedFrame frame;
  frame.size = layout->frame_size();
  frame.data = AllocateAligned(frame.size);
  if (frame.data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", frame.size, " bytes"));
  }
  absl::Status s = EncodeFrame(element, flags, absl::Span<uint8_t>(frame.data.get(), frame.size));
  if (!s.ok()) return s;
  return frame;
}

absl::StatusOr<FrameLayout> ParseFrameHeader(const uint8_t* header, size_t size) {
  if (header == nullptr || size < kFrameFixedHeaderSize) {
    return Corrupt(absl::StrCat("truncated: ", size, " bytes is shorter than the ",
                                kFrameFixedHeaderSize, "-byte fixed header"));
  }
  if (Get<uint32_t>(header) != kFrameMagic) return Corrupt("bad magic");
  uint16_t version = Get<uint16_t>(header + 4);
  if (version != kFrameVersion) {
    return Corrupt(absl::StrCat("unsupported version ", version, "; this build reads version ",
                                kFrameVersion));
  }
  FrameLayout layout;
  layout.flags = Get<uint16_t>(header + 6);
  if (layout.flags & ~(kFrameEndOfSequence | kFrameSkip | kFrameLz4 | kFrameZstd)) {
    return Corrupt(absl::StrCat("unknown flags 0x", absl::Hex(layout.flags)));
  }
  if ((layout.flags & kFrameLz4) && (layout.flags & kFrameZstd)) {
    return Corrupt("two codecs flagged");
  }
  uint32_t n = Get<uint32_t>(header + 8);
  if (n > kMaxFrameComponents) return Corrupt(absl::StrCat(n, " components is too many"));
  uint32_t h = Get<uint32_t>(header + 12);
  uint64_t total = Get<uint64_t>(header + 16);
  if (h < kFrameFixedHeaderSize || h % kFrameAlignment != 0) {
    return Corrupt(absl::StrCat("header size ", h, " is not a multiple of 64 >= 24"));
  }
  if (h > size) {
    return Corrupt(absl::StrCat("truncated: header claims ", h, " bytes, ", size, " present"));
  }
  if (total < h) return Corrupt(absl::StrCat("frame size ", total, " < header size ", h));
  layout.header_size = h;
  layout.payload_size = total - h;
  return layout;
}

absl::StatusOr<DecodedFrame> DecodeFrameParts(const uint8_t* header, size_t header_size,
                                              const uint8_t* payload, size_t payload_size,
                                              std::shared_ptr<const void> owner) {
  auto layout = ParseFrameHeader(header, header_size);
  if (!layout.ok()) return layout.status();
  if (layout->header_size != header_size) {
    return Corrupt(absl::StrCat("header size field ", layout->header_size, " != ", header_size,
                                " header bytes given"));
  }
  if (layout->payload_size != payload_size) {
    return Corrupt(absl::StrCat("frame declares ", layout->payload_size,
                                " payload bytes; ", payload_size, " present (truncated?)"));
  }
  if (payload == nullptr && payload_size != 0) return Corrupt("null payload");
  if (layout->flags & (kFrameLz4 | kFrameZstd)) {
    return Corrupt("a compressed frame arrived in parts");
  }
  uint32_t n = Get<uint32_t>(header + 8);
  DecodedFrame out;
  out.flags = layout->flags;
  out.element.reserve(n);
  size_t desc = kFrameFixedHeaderSize;
  uint64_t prev_end = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (desc + 24 > header_size) {
      return Corrupt(absl::StrCat("descriptor ", i, " runs past the header"));
    }
    const uint8_t* d = header + desc;
    uint8_t dtype = d[0];
    uint8_t rank = d[1];
    if (!IsValidDType(dtype)) return Corrupt(absl::StrCat("component ", i, ": bad dtype ", dtype));
    if (rank > kMaxFrameRank) return Corrupt(absl::StrCat("component ", i, ": rank ", rank));
    for (int k = 2; k < 8; ++k) {
      if (d[k] != 0) return Corrupt(absl::StrCat("component ", i, ": reserved bytes set"));
    }
    if (desc + DescriptorSize(rank) > header_size) {
      return Corrupt(absl::StrCat("descriptor ", i, " runs past the header"));
    }
    uint64_t off = Get<uint64_t>(d + 8);
    uint64_t sz = Get<uint64_t>(d + 16);
    std::vector<int64_t> dims(rank);
    for (int r = 0; r < rank; ++r) dims[r] = Get<int64_t>(d + 24 + 8 * r);
    auto shape = TensorShape::Make(std::move(dims));
    if (!shape.ok()) return Corrupt(absl::StrCat("component ", i, ": ", shape.status().message()));
    if (off % kFrameAlignment != 0) {
      return Corrupt(absl::StrCat("component ", i, ": payload offset ", off, " not 64-aligned"));
    }
    if (off < prev_end) {
      return Corrupt(absl::StrCat("component ", i, ": payload overlaps the previous one"));
    }
    if (off > payload_size || sz > payload_size - off) {
      return Corrupt(absl::StrCat("component ", i, ": payload [", off, ", +", sz,
                                  ") is outside the ", payload_size, "-byte payload area"));
    }
    auto t = Tensor::View(static_cast<DType>(dtype), *std::move(shape), payload + off, sz, owner);
    if (!t.ok()) return Corrupt(absl::StrCat("component ", i, ": ", t.status().message()));
    out.element.push_back(*std::move(t));
    prev_end = off + sz;
    desc += DescriptorSize(rank);
  }
  return out;
}

const char* FrameCodecName(FrameCodec codec) {
  switch (codec) {
    case FrameCodec::kLz4: return "lz4";
    case FrameCodec::kZstd: return "zstd";
    case FrameCodec::kNone: break;
  }
  return "none";
}

absl::StatusOr<uint64_t> FramePayloadDataBytes(const uint8_t* header, size_t header_size) {
  auto layout = ParseFrameHeader(header, header_size);
  if (!layout.ok()) return layout.status();
  const uint32_t n = Get<uint32_t>(header + 8);
  uint64_t end = 0;
  size_t desc = kFrameFixedHeaderSize;
  for (uint32_t i = 0; i < n; ++i) {
    if (desc + 24 > layout->header_size) return Corrupt("descriptors run past the header");
    const uint8_t rank = header[desc + 1];
    if (rank > kMaxFrameRank || desc + DescriptorSize(rank) > layout->header_size) {
      return Corrupt("descriptors run past the header");
    }
    const uint64_t off = Get<uint64_t>(header + desc + 8), sz = Get<uint64_t>(header + desc + 16);
    if (off > kMaxDecompressedPayloadBytes || sz > kMaxDecompressedPayloadBytes - off) {
      return Corrupt(absl::StrCat("component ", i, " ends past ", kMaxDecompressedPayloadBytes,
                                  " payload bytes"));
    }
    end = std::max(end, off + sz);
    desc += DescriptorSize(rank);
  }
  return end;
}

absl::StatusOr<std::optional<OwnedFrame>> CompressFrame(const uint8_t* header,
                                                        size_t header_size,
                                                        const uint8_t* payload,
                                                        size_t payload_bytes, FrameCodec codec) {
  if (codec == FrameCodec::kNone || payload_bytes < 256 ||
      payload_bytes > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
    return std::optional<OwnedFrame>();
  }
  const size_t bound = codec == FrameCodec::kLz4
                           ? static_cast<size_t>(LZ4_compressBound(static_cast<int>(payload_bytes)))
                           : ZSTD_compressBound(payload_bytes);
  OwnedFrame f;
  f.data = AllocateAligned(header_size + bound, /*zeroed=*/false);
  if (f.data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", header_size + bound, " bytes to compress a frame"));
  }
  uint8_t* out = f.data.get() + header_size;
  size_t compressed = 0;
  if (codec == FrameCodec::kLz4) {
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(payload),
                                       reinterpret_cast<char*>(out),
                                       static_cast<int>(payload_bytes), static_cast<int>(bound));
    if (n <= 0) return std::optional<OwnedFrame>();
    compressed = static_cast<size_t>(n);
  } else {
    // Level 1: zstd's fastest standard level, still well ahead of lz4 in ratio.
    const size_t n = ZSTD_compress(out, bound, payload, payload_bytes, 1);
    if (ZSTD_isError(n)) return std::optional<OwnedFrame>();
    compressed = n;
  }
  if (compressed > payload_bytes - payload_bytes / 8) return std::optional<OwnedFrame>();
  std::memcpy(f.data.get(), header, header_size);
  const uint16_t flags = Get<uint16_t>(header + 6) |
                         (codec == FrameCodec::kLz4 ? kFrameLz4 : kFrameZstd);
  Put<uint16_t>(f.data.get() + 6, flags);
  f.size = header_size + compressed;
  Put<uint64_t>(f.data.get() + 16, f.size);
  return std::optional<OwnedFrame>(std::move(f));
}

namespace {

// A compressed frame of exactly `size` bytes, decompressed into memory of
// its own and decoded from there.
absl::StatusOr<DecodedFrame> DecodeCompressed(const uint8_t* data, size_t size,
                                              const FrameLayout& layout,
                                              uint64_t max_decoded_bytes,
                                              const DecompressAllocator& alloc) {
  const size_t h = layout.header_size;
  auto data_bytes = FramePayloadDataBytes(data, h);
  if (!data_bytes.ok()) return data_bytes.status();
  const size_t d = *data_bytes;
  const size_t area = AlignUp(d);
  if (h + area > max_decoded_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a compressed element of ", h + area, " bytes once decompressed; this receiver accepts "
        "at most ", max_decoded_bytes, " (DistributeOptions::max_element_bytes)"));
  }
  // The header as an uncompressed frame's, followed by the payload area.
  const size_t bytes = h + std::max<size_t>(area, 1);
  std::shared_ptr<uint8_t> buf = alloc ? alloc(bytes) : nullptr;
  if (buf == nullptr) buf = AllocateAligned(bytes, /*zeroed=*/false);
  if (buf == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", h + area, " bytes to decompress a frame"));
  }
  std::memcpy(buf.get(), data, h);
  Put<uint16_t>(buf.get() + 6, layout.flags & ~(kFrameLz4 | kFrameZstd));
  Put<uint64_t>(buf.get() + 16, h + area);
  uint8_t* payload = buf.get() + h;
  const char* codec = (layout.flags & kFrameLz4) ? "lz4" : "zstd";
  size_t got = 0;
  if (layout.flags & kFrameLz4) {
    if (layout.payload_size > static_cast<size_t>(std::numeric_limits<int>::max()) ||
        d > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return Corrupt("an lz4 payload over 2 GiB");
    }
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(data + h),
                                      reinterpret_cast<char*>(payload),
                                      static_cast<int>(layout.payload_size), static_cast<int>(d));
    if (n < 0) return Corrupt("its lz4 payload does not decompress");
    got = static_cast<size_t>(n);
  } else {
    const size_t n = ZSTD_decompress(payload, d, data + h, layout.payload_size);
    if (ZSTD_isError(n)) {
      return Corrupt(absl::StrCat("its zstd payload does not decompress: ", ZSTD_getErrorName(n)));
    }
    got = n;
  }
  if (got != d) {
    return Corrupt(absl::StrCat("its ", codec, " payload decompresses to ", got, " bytes; the "
                                "header describes ", d));
  }
  std::memset(payload + d, 0, area - d);
  const uint8_t* base = buf.get();
  auto out = DecodeFrameParts(base, h, base + h, area, std::shared_ptr<const void>(buf, base));
  if (out.ok()) out->flags = layout.flags & ~(kFrameLz4 | kFrameZstd);
  return out;
}

}  // namespace

absl::StatusOr<DecodedFrame> DecodeFrame(const uint8_t* data, size_t size,
                                         std::shared_ptr<const void> owner,
                                         uint64_t max_decoded_bytes,
                                         const DecompressAllocator& alloc) {
  auto layout = ParseFrameHeader(data, size);
  if (!layout.ok()) return layout.status();
  if (layout->frame_size() != size) {
    return Corrupt(absl::StrCat("frame declares ", layout->frame_size(), " bytes; ", size,
                                " present", size < layout->frame_size() ? " (truncated)" : ""));
  }
  if (layout->flags & (kFrameLz4 | kFrameZstd)) {
    return DecodeCompressed(data, size, *layout, max_decoded_bytes, alloc);
  }
  return DecodeFrameParts(data, layout->header_size, data + layout->header_size,
                          layout->payload_size, std::move(owner));
}

}  // namespace sluice
