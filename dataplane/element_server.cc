// Served frames (element_server.h): encoding an element once for every
// data path, and writing it out whole where a transport copies anyway.
#include "sluice/dataplane/element_server.h"

#include <cstring>

#include "sluice/core/frame.h"
#include "sluice/core/status.h"

namespace sluice::internal {

void WriteFrame(const FrameBuffer& f, uint8_t* out) {
  std::memcpy(out, f.data, f.size);
  if (f.payload == nullptr) return;
  std::memcpy(out + f.size, f.payload, f.payload_size);
  std::memset(out + f.size + f.payload_size, 0, f.frame_size() - f.size - f.payload_size);
}

absl::Status CompressServedFrame(FrameCodec codec, FrameBuffer* frame) {
  if (codec == FrameCodec::kNone) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(FrameLayout layout, ParseFrameHeader(frame->data, frame->size));
  SLUICE_ASSIGN_OR_RETURN(uint64_t bytes, FramePayloadDataBytes(frame->data, layout.header_size));
  const uint8_t* payload =
      frame->payload != nullptr ? frame->payload : frame->data + layout.header_size;
  SLUICE_ASSIGN_OR_RETURN(std::optional<OwnedFrame> c,
                          CompressFrame(frame->data, layout.header_size, payload, bytes, codec));
  if (!c) return absl::OkStatus();
  FrameBuffer out;
  out.data = c->data.get();
  out.size = c->size;
  out.owner = std::move(c->data);
  out.position = frame->position;
  *frame = std::move(out);
  return absl::OkStatus();
}

size_t FrameBuffer::frame_size() const {
  if (payload == nullptr) return size;
  return size + (payload_size + kFrameAlignment - 1) / kFrameAlignment * kFrameAlignment;
}

absl::StatusOr<FrameBuffer> EncodeServedFrame(const Element& element,
                                              const FrameAllocator& alloc) {
  SLUICE_ASSIGN_OR_RETURN(FrameLayout layout, ComputeFrameLayout(element));
  if (element.size() == 1 && element[0].byte_size() >= kZeroCopyPayloadBytes) {
    // A split frame: the header here, the payload viewed in the tensor
    // (which the holder keeps alive until the send completes).
    struct Holder {
      Element element;
      std::vector<uint8_t> header;
    };
    auto holder = std::make_shared<Holder>();
    holder->element = element;
    holder->header.resize(layout.header_size);
    SLUICE_RETURN_IF_ERROR(EncodeFrameHeader(element, 0, absl::MakeSpan(holder->header)));
    FrameBuffer f;
    f.data = holder->header.data();
    f.size = holder->header.size();
    f.payload = static_cast<const uint8_t*>(element[0].data());
    f.payload_size = element[0].byte_size();
    f.owner = std::move(holder);
    return f;
  }
  SLUICE_ASSIGN_OR_RETURN(FrameBuffer f, alloc(layout.frame_size()));
  SLUICE_RETURN_IF_ERROR(EncodeFrame(element, 0, absl::Span<uint8_t>(f.data, f.size)));
  return f;
}

FrameAllocator HeapFrameAllocator() {
  return [](size_t size) -> absl::StatusOr<FrameBuffer> {
    auto mem = std::shared_ptr<uint8_t[]>(new uint8_t[size == 0 ? 1 : size]);
    FrameBuffer f;
    f.data = mem.get();
    f.size = size;
    f.owner = std::move(mem);
    return f;
  };
}

}  // namespace sluice::internal
