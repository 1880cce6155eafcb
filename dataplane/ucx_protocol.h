// The UCX element transfer protocol (active messages). Internal.
//
// Client -> worker: AM kGetElementAm, sent with UCP_AM_SEND_FLAG_REPLY, no
// data; its header (48 bytes, little-endian):
//   | offset | size | field                                  |
//   |--------|------|----------------------------------------|
//   | 0      | 4    | magic 'S' 'L' 'G' 'E'                  |
//   | 4      | 4    | version (2)                            |
//   | 8      | 8    | request_id (client-chosen, echoed)     |
//   | 16     | 8    | task_id                                |
//   | 24     | 8    | consumer_index (-1: none)              |
//   | 32     | 8    | round (-1: none)                       |
//   | 40     | 8    | wait_ms: how long the worker may wait  |
//
// Worker -> client: AM kElementAm on the reply endpoint; header (48 bytes
// plus an optional error message):
//   | offset | size | field                                            |
//   |--------|------|--------------------------------------------------|
//   | 0      | 4    | magic 'S' 'L' 'E' 'L'                            |
//   | 4      | 2    | flags: bit0 end_of_sequence, bit1 not_ready,     |
//   |        |      |        bit2 error                                |
//   | 6      | 2    | reserved (0)                                     |
//   | 8      | 8    | request_id                                       |
//   | 16     | 4    | status code (absl::StatusCode) when bit2         |
//   | 20     | 4    | message length m (<= 1024)                       |
//   | 24     | 8    | frame size (bytes of data that follow)           |
//   | 32     | 8    | split_id (int64; -1: untracked)            [v2] |
//   | 40     | 8    | split_index (int64; -1: untracked)         [v2] |
//   | 48     | m    | error message                                    |
// Version 2 added split_id/split_index (distributed_epoch deduplication):
// the element's split and its index in the split's output.
// The AM data is the whole element frame (core/frame.h), sent rendezvous
// (UCP_AM_SEND_FLAG_RNDV) so that it lands directly in the client's
// registered slot: the client decodes it in place.
#pragma once

#include <cstdint>

namespace sluice::internal::ucx {

inline constexpr unsigned kGetElementAm = 11;
inline constexpr unsigned kElementAm = 12;
inline constexpr uint32_t kRequestMagic = 0x45474c53;  // "SLGE"
inline constexpr uint32_t kReplyMagic = 0x4c454c53;    // "SLEL"
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr uint32_t kMaxErrorMessage = 1024;

enum ReplyFlags : uint16_t {
  kReplyEndOfSequence = 1u << 0,
  kReplyNotReady = 1u << 1,
  kReplyError = 1u << 2,
};

struct RequestHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t request_id;
  int64_t task_id;
  int64_t consumer_index;
  int64_t round;
  int64_t wait_ms;
};
static_assert(sizeof(RequestHeader) == 48);

struct ReplyHeader {
  uint32_t magic;
  uint16_t flags;
  uint16_t reserved;
  uint64_t request_id;
  uint32_t code;
  uint32_t message_len;
  uint64_t frame_size;
  int64_t split_id;
  int64_t split_index;
};
static_assert(sizeof(ReplyHeader) == 48);

}  // namespace sluice::internal::ucx
