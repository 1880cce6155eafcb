// The element frame: one contiguous, self-describing region per element.
//
// Encoding copies each component's bytes once into the frame; decoding
// returns Tensors that view the frame's memory (no copy). Frames arriving
// from the network are untrusted: DecodeFrame validates every field and
// returns InvalidArgument/DataLoss for anything inconsistent, never reading
// outside [data, data + size).
//
// Layout (all integers little-endian):
//
//   Frame header
//   | offset | size | field                                                    |
//   |--------|------|----------------------------------------------------------|
//   | 0      | 4    | magic: bytes 'S' 'L' 'F' 'R'                              |
//   | 4      | 2    | version: 1                                                |
//   | 6      | 2    | flags: bit 0 end_of_sequence, bit 1 skip, others 0        |
//   | 8      | 4    | num_components N (<= kMaxFrameComponents)                 |
//   | 12     | 4    | header_size H: offset of the payload area, multiple of 64 |
//   | 16     | 8    | frame_size: H + payload area size                         |
//   | 24     | ...  | N component descriptors, back to back                     |
//   | ...    | ...  | zero padding up to H                                      |
//
//   Component descriptor (24 + 8 * rank bytes)
//   | offset | size   | field                                                  |
//   |--------|--------|--------------------------------------------------------|
//   | 0      | 1      | dtype (DType wire value)                               |
//   | 1      | 1      | rank r (<= kMaxFrameRank)                              |
//   | 2      | 6      | reserved, zero                                         |
//   | 8      | 8      | payload offset, relative to H, multiple of 64          |
//   | 16     | 8      | payload size in bytes                                  |
//   | 24     | 8 * r  | dims, int64 each, >= 0                                 |
//
//   Payload area: component payloads in order, each starting 64-byte aligned
//   (relative to H), zero padded; they never overlap. A string component's
//   payload is its tensor storage (uint64 offsets then bytes, see tensor.h).
//
// The header [0, H) and the payload area [H, frame_size) may travel
// separately (the data plane sends the header inline and the payload by
// rendezvous into a client slot); DecodeFrameParts reassembles the views.
//
// Compressed frames (flag bit 2: LZ4 block, bit 3: zstd) carry, after the
// same header, the first D bytes of the payload area compressed, D being
// where the last component's payload ends (what follows is zero padding):
// frame_size is H + the compressed size. DecodeFrame decompresses them
// into memory of its own (a copy: what compression costs the receiver);
// they never travel split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sluice/core/tensor.h"

namespace sluice {

inline constexpr uint32_t kFrameMagic = 0x52464c53;  // "SLFR" little-endian
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr uint32_t kMaxFrameComponents = 4096;
inline constexpr uint32_t kMaxFrameRank = 32;
inline constexpr size_t kFrameAlignment = 64;
inline constexpr size_t kFrameFixedHeaderSize = 24;

enum FrameFlags : uint16_t {
  kFrameEndOfSequence = 1u << 0,
  kFrameSkip = 1u << 1,
  kFrameLz4 = 1u << 2,
  kFrameZstd = 1u << 3,
};

// Wire compression of frames (DistributeOptions::compression).
enum class FrameCodec : uint8_t { kNone = 0, kLz4 = 1, kZstd = 2 };
// "none", "lz4", "zstd".
const char* FrameCodecName(FrameCodec codec);
// A compressed frame decompresses to at most this many payload bytes (a
// corrupt or hostile header cannot make the receiver allocate more).
inline constexpr uint64_t kMaxDecompressedPayloadBytes = uint64_t{4} << 30;

struct FrameLayout {
  uint16_t flags = 0;
  size_t header_size = 0;   // H
  size_t payload_size = 0;  // frame_size - H
  size_t frame_size() const { return header_size + payload_size; }
};

// Layout the frame of `element` would have. Fails for invalid tensors.
absl::StatusOr<FrameLayout> ComputeFrameLayout(const Element& element);

// Encodes into `out`, which must hold at least layout.frame_size() bytes.
absl::Status EncodeFrame(const Element& element, uint16_t flags, absl::Span<uint8_t> out);

// Encodes only the header (layout.header_size bytes) into `out`: the payload
// area is written by someone else (e.g. received straight into place).
absl::Status EncodeFrameHeader(const Element& element, uint16_t flags, absl::Span<uint8_t> out);

// An encoded frame in memory it owns (64-byte aligned).
struct OwnedFrame {
  std::shared_ptr<uint8_t> data;
  size_t size = 0;
};
absl::StatusOr<OwnedFrame> EncodeFrame(const Element& element, uint16_t flags = 0);

// Validates the fixed header and returns the layout. `size` is the number of
// bytes available at `header`; at least the full header must be present.
absl::StatusOr<FrameLayout> ParseFrameHeader(const uint8_t* header, size_t size);

struct DecodedFrame {
  uint16_t flags = 0;
  Element element;
};

// Memory of at least `bytes`, 64-byte aligned, for a frame to be
// decompressed into (a receiver's registered arenas); null: none to spare
// (the heap is used).
using DecompressAllocator = std::function<std::shared_ptr<uint8_t>(size_t bytes)>;

// Decodes a contiguous frame of exactly `size` bytes. The tensors view
// `data`; `owner` keeps it alive. A compressed frame is decompressed into
// memory of its own, from `alloc` when given and it has some (the tensors
// view that); one that would decompress to more than `max_decoded_bytes`
// is ResourceExhausted (a receiver's bound, DistributeOptions::
// max_element_bytes, holds for what an element becomes).
absl::StatusOr<DecodedFrame> DecodeFrame(const uint8_t* data, size_t size,
                                         std::shared_ptr<const void> owner,
                                         uint64_t max_decoded_bytes = UINT64_MAX,
                                         const DecompressAllocator& alloc = nullptr);

// Where the last component's payload ends in the payload area of the frame
// whose header (header_size bytes) is at `header`: the bytes compression
// keeps.
absl::StatusOr<uint64_t> FramePayloadDataBytes(const uint8_t* header, size_t header_size);

// The frame whose header is at `header` (uncompressed) and whose payload
// area's first `payload_bytes` are at `payload` (FramePayloadDataBytes),
// compressed with `codec` into a frame of its own; nullopt when that would
// not save at least an eighth of the payload (incompressible data, JPEG
// bytes: send it as it is).
absl::StatusOr<std::optional<OwnedFrame>> CompressFrame(const uint8_t* header,
                                                        size_t header_size,
                                                        const uint8_t* payload,
                                                        size_t payload_bytes, FrameCodec codec);

// Decodes a frame whose header and payload area live apart (never a
// compressed one). The tensors view
// `payload`; `owner` keeps it alive. The header is only read during the call.
absl::StatusOr<DecodedFrame> DecodeFrameParts(const uint8_t* header, size_t header_size,
                                              const uint8_t* payload, size_t payload_size,
                                              std::shared_ptr<const void> owner);

}  // namespace sluice
