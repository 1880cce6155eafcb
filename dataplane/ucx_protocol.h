// The UCX element transfer protocol (active messages), version 8. Internal.
//
// Client -> worker: AM kGetElementAm, sent with UCP_AM_SEND_FLAG_REPLY, no
// data; its header (80 bytes, little-endian), the token, then the acks:
//   | offset | size | field                                            |
//   |--------|------|--------------------------------------------------|
//   | 0      | 4    | magic 'S' 'L' 'G' 'E'                            |
//   | 4      | 4    | version (kProtocolVersion)                       |
//   | 8      | 8    | request_id (client-chosen, echoed)               |
//   | 16     | 8    | task_id                                          |
//   | 24     | 8    | consumer_index (-1: none)                        |
//   | 32     | 8    | round (-1: none)                                 |
//   | 40     | 8    | wait_ms: how long the worker may wait            |
//   | 48     | 4    | max_elements per reply (>= 1)                    |
//   | 52     | 4    | max_bytes: frame bytes a batch may total         |
//   | 56     | 2    | token_len (<= kMaxAuthTokenBytes; 0: no token)   |
//   | 58     | 2    | ack_count (<= kMaxAcksPerRequest)                |
//   | 60     | 2    | max_outstanding: how many requests this consumer |
//   |        |      | may have in flight at once (>= 1; fair share)    |
//   | 62     | 2    | request flags: bit0 shared job (other consumers  |
//   |        |      | may read the task), bit1 eager small replies,    |
//   |        |      | bit2 resend (ElementRequest::resend), bit3/bit4  |
//   |        |      | lz4/zstd replies, bit5 leaving                   |
//   |        |      | (ElementRequest::leaving)                        |
//   | 64     | 8    | client_id: the consumer (iteration client; 0:    |
//   |        |      | anonymous); keys its sequence numbers            |
//   | 72     | 8    | delivered_seq: the consumer holds every element  |
//   |        |      | of the task below it (-1: says nothing)          |
//   | 80     | t    | the auth token (the service's shared secret)     |
//   | 80+t   | 16*n | acks (distributed_epoch): split_id, count (each  |
//   |        |      | 8 bytes): the client received count more         |
//   |        |      | elements of that split from the task             |
// A worker with an auth token answers a request whose token differs (by a
// constant-time compare) with an error reply, code Unauthenticated; a
// request with another version but the right magic gets an error reply,
// code FailedPrecondition, naming both versions; anything shorter or
// without magic is dropped. Version 3 added the token and the acks
// (version 2 had a 56-byte header); version 4 added max_outstanding, the
// request flags and client_id (version 3 had a 64-byte header) and the
// reply's seq; version 5 added delivered_seq, the resend flag and the
// reply's resent flag (version 4 had a 72-byte header); version 6 added
// compression flags; version 7 the split range of a reply's elements
// (the reply's bit7 and 72-byte batch entries: service checkpoints);
// version 8 the leaving flag.
//
// Worker -> client: AM kElementAm on the reply endpoint; header (64 bytes)
// followed by `inline_len` bytes:
//   | offset | size | field                                            |
//   |--------|------|--------------------------------------------------|
//   | 0      | 4    | magic 'S' 'L' 'E' 'L'                            |
//   | 4      | 2    | flags: bit0 end_of_sequence, bit1 not_ready,     |
//   |        |      | bit2 error, bit3 batch, bit4 split frame, bit5   |
//   |        |      | resent (ElementResult::resent), bit6 keyed: the  |
//   |        |      | element has a key (offset 56), bit7 split range: |
//   |        |      | the inline bytes end with the element's split's  |
//   |        |      | epoch, begin and end (3 x 8 bytes, not counted   |
//   |        |      | in a split frame's header)                       |
//   | 6      | 2    | reserved (0)                                     |
//   | 8      | 8    | request_id                                       |
//   | 16     | 4    | status code (absl::StatusCode) when bit2         |
//   | 20     | 4    | inline_len: bytes after this header (<= 1024)    |
//   | 24     | 8    | data_size: bytes of AM data                      |
//   | 32     | 8    | split_id of the element (-1: none)               |
//   | 40     | 8    | index of the element in its split (-1: none)     |
//   | 48     | 8    | seq: the consumer's sequence number of the first |
//   |        |      | element carried (the others follow it: seq+1,    |
//   |        |      | ...); with end_of_sequence the number handed to  |
//   |        |      | the consumer in all; otherwise -1 without        |
//   |        |      | elements or when the worker keeps no order       |
//   |        |      | (coordinated rounds)                             |
//   | 56     | 8    | the element's key (Iterator::ElementKey) if bit6 |
//   | 64     | m    | inline bytes: the error message (bit2) or the    |
//   |        |      | frame header (bit4)                              |
// The AM data is sent rendezvous (UCP_AM_SEND_FLAG_RNDV) so that it lands
// directly in the client's registered buffer, and is one of:
//  - no flag: one whole element frame (core/frame.h); the client decodes
//    it in place.
//  - bit4 (split frame): the payload area of one frame whose header came
//    inline, sent from the worker's tensor memory without a copy. The
//    client places the header in front of it (the header is 64-byte padded,
//    so the payload stays aligned) and zero-fills the frame's trailing
//    alignment padding (< 64 bytes), which is not sent.
//  - bit3 (batch): several small frames, as a batch blob:
//   | offset | size   | field                                          |
//   |--------|--------|------------------------------------------------|
//   | 0      | 4      | magic 'S' 'L' 'B' 'T'                          |
//   | 4      | 4      | count n (2..kMaxBatchElements)                 |
//   | 8      | 8      | reserved (0)                                   |
//   | 16     | 72 * n | entries: offset (from the blob's start, 64-    |
//   |        |        | byte aligned), frame size, split_id, index in  |
//   |        |        | split, key, keyed (1: the key is the           |
//   |        |        | element's; 0: it has none), the split's epoch, |
//   |        |        | begin and end (each 8 bytes)                   |
//   | ...    |        | the frames at their offsets, in task order     |
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::internal::ucx {

inline constexpr unsigned kGetElementAm = 11;
inline constexpr unsigned kElementAm = 12;
inline constexpr uint32_t kRequestMagic = 0x45474c53;  // "SLGE"
inline constexpr uint32_t kReplyMagic = 0x4c454c53;    // "SLEL"
inline constexpr uint32_t kBatchMagic = 0x54424c53;    // "SLBT"
inline constexpr uint32_t kProtocolVersion = 8;
inline constexpr uint32_t kMaxInline = 1024;
inline constexpr uint32_t kMaxBatchElements = 1024;

enum RequestFlags : uint16_t {
  kRequestSharedJob = 1u << 0,
  // The client takes replies of at most kEagerReplyBytes of data eagerly
  // (in the reply message, copied once into its arena) instead of by
  // rendezvous (RTS, RTR, data, acknowledgement: several messages and
  // thread wake-ups each). Workers that do not know the flag ignore it.
  kRequestEagerSmallReplies = 1u << 1,
  kRequestResend = 1u << 2,
  // ElementRequest::compression (at most one).
  kRequestLz4 = 1u << 3,
  kRequestZstd = 1u << 4,
  kRequestLeaving = 1u << 5,  // ElementRequest::leaving
};
inline constexpr size_t kEagerReplyBytes = 4096;

enum ReplyFlags : uint16_t {
  kReplyEndOfSequence = 1u << 0,
  kReplyNotReady = 1u << 1,
  kReplyError = 1u << 2,
  kReplyBatch = 1u << 3,
  kReplySplitFrame = 1u << 4,
  kReplyResent = 1u << 5,
  kReplyKeyed = 1u << 6,
  kReplySplitRange = 1u << 7,
};
// What kReplySplitRange appends to the inline bytes.
struct SplitRange {
  int64_t epoch;
  int64_t begin;
  int64_t end;
};
static_assert(sizeof(SplitRange) == 24);

struct RequestHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t request_id;
  int64_t task_id;
  int64_t consumer_index;
  int64_t round;
  int64_t wait_ms;
  uint32_t max_elements;
  uint32_t max_bytes;
  uint16_t token_len;
  uint16_t ack_count;
  uint16_t max_outstanding;
  uint16_t flags;  // RequestFlags
  int64_t client_id;
  int64_t delivered_seq;
};
static_assert(sizeof(RequestHeader) == 80);
static_assert(offsetof(RequestHeader, token_len) == 56 && offsetof(RequestHeader, flags) == 62 &&
              offsetof(RequestHeader, client_id) == 64 &&
              offsetof(RequestHeader, delivered_seq) == 72);
struct AckEntry {
  int64_t split_id;
  int64_t count;
};
static_assert(sizeof(AckEntry) == 16);

struct ReplyHeader {
  uint32_t magic;
  uint16_t flags;
  uint16_t reserved;
  uint64_t request_id;
  uint32_t code;
  uint32_t inline_len;
  uint64_t data_size;
  int64_t split_id;
  int64_t split_index;
  int64_t seq;
  uint64_t key;  // when kReplyKeyed
};
static_assert(sizeof(ReplyHeader) == 64);
static_assert(offsetof(ReplyHeader, split_id) == 32 && offsetof(ReplyHeader, seq) == 48 &&
              offsetof(ReplyHeader, key) == 56);

struct BatchHeader {
  uint32_t magic;
  uint32_t count;
  uint64_t reserved;
};
static_assert(sizeof(BatchHeader) == 16);

struct BatchEntry {
  uint64_t offset;
  uint64_t size;
  int64_t split_id;
  int64_t split_index;
  uint64_t key;
  uint64_t keyed;  // 1: `key` is the element's
  int64_t split_epoch;
  int64_t split_begin;
  int64_t split_end;
};
static_assert(sizeof(BatchEntry) == 72);

inline constexpr uint64_t AlignUp64(uint64_t v) { return (v + 63) / 64 * 64; }

}  // namespace sluice::internal::ucx
