// Fuzzes image decoding (dataset/image_kernels.cc) on untrusted bytes, as a
// worker decodes whatever files a pipeline names. Beyond "never crash" (and
// no ASan report), it checks:
//   - a successful decode is uint8 [H, W, 3], H and W those the header
//     announces (PeekImage);
//   - decoding a region (chosen from the input's first bytes) of an image
//     whose whole decodes gives exactly the region's size unscaled, and at
//     least the requested minimum when a scale is allowed;
//   - an error is InvalidArgument.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "sluice/dataset/image_kernels_internal.h"

namespace image = sluice::internal::image;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto info = image::PeekImage(bytes);
  auto full = image::DecodeImage(bytes);
  if (!full.ok()) {
    SLUICE_FUZZ_CHECK(full.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  SLUICE_FUZZ_CHECK(info.ok());
  SLUICE_FUZZ_CHECK(full->dtype() == sluice::DType::kUInt8);
  SLUICE_FUZZ_CHECK(full->shape().rank() == 3 && full->shape().dim(2) == 3);
  SLUICE_FUZZ_CHECK(full->shape().dim(0) == info->height && full->shape().dim(1) == info->width);
  if (size < 4 || info->height < 1 || info->width < 1) return 0;
  // A region from the first bytes (their value, not their place, matters).
  image::Region r;
  r.top = data[0] % info->height;
  r.left = data[1] % info->width;
  r.height = 1 + data[2] % (info->height - r.top);
  r.width = 1 + data[3] % (info->width - r.left);
  auto exact = image::DecodeImage(bytes, {r, 0, 0});
  if (exact.ok()) {
    SLUICE_FUZZ_CHECK(exact->shape().dim(0) == r.height && exact->shape().dim(1) == r.width);
  } else {
    SLUICE_FUZZ_CHECK(exact.status().code() == absl::StatusCode::kInvalidArgument);
  }
  const int64_t min_h = (r.height + 3) / 4, min_w = (r.width + 3) / 4;
  auto scaled = image::DecodeImage(bytes, {r, min_h, min_w});
  if (scaled.ok()) {
    SLUICE_FUZZ_CHECK(scaled->shape().dim(0) >= min_h && scaled->shape().dim(1) >= min_w);
    SLUICE_FUZZ_CHECK(scaled->shape().dim(0) <= r.height && scaled->shape().dim(1) <= r.width);
  } else {
    SLUICE_FUZZ_CHECK(scaled.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
