// Image kernels behind sluice::image's expression functions (image.h):
// decoding (libjpeg-turbo's libjpeg API, libpng), crops, antialiased
// bilinear resizing, flips and normalization on uint8 [H, W, 3] tensors.
// Pure functions of their arguments; thread-safe. Internal to the dataset
// module. Errors are InvalidArgument with a message that does not name a
// file (the caller prefixes the path when it knows one).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "sluice/core/tensor.h"

namespace sluice::internal::image {

enum class ImageFormat : uint8_t { kJpeg, kPng };

struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  int64_t height = 0;
  int64_t width = 0;
};

// The format and size from the header alone (JPEG SOI + SOF, PNG IHDR):
// InvalidArgument for anything else or a header that is cut short.
absl::StatusOr<ImageInfo> PeekImage(std::string_view bytes);

// A rectangle in an image's full-resolution pixel coordinates.
struct Region {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// What a decode may skip, because the op after it crops and/or resizes.
struct DecodeRequest {
  // Only this part of the image is returned (the whole image when unset).
  // It must lie inside the image.
  std::optional<Region> region;
  // When > 0, a JPEG may be decoded at a reduced scale (libjpeg's DCT
  // scaling, M/8 with M in 1..8) as long as the returned region keeps at
  // least min_height x min_width pixels. PNG ignores it.
  int64_t min_height = 0;
  int64_t min_width = 0;
};

// Decodes a JPEG (baseline or progressive; grayscale and CMYK converted)
// or a PNG (any bit depth and color type; alpha dropped, 16-bit reduced to
// 8) into uint8 [H, W, 3] RGB, H x W being the request's region at the
// chosen scale. A JPEG region is decoded with jpeg_crop_scanline /
// jpeg_skip_scanlines so that rows and columns outside it cost little.
// Without a request, a JPEG's pixels equal libjpeg's own decode
// (JDCT_ISLOW, fancy upsampling: libjpeg's defaults) exactly.
// Corrupt or truncated data: InvalidArgument, never a crash; libjpeg's
// warnings about recoverable corruption are errors too.
absl::StatusOr<Tensor> DecodeImage(std::string_view bytes, const DecodeRequest& request = {});

// The rectangle `region` of `img` (uint8 [H, W, C]): a view when it is
// whole rows, else a copy. InvalidArgument when it does not lie inside.
absl::StatusOr<Tensor> Crop(const Tensor& img, const Region& region);

// Resizes uint8 [H, W, C] to [height, width, C] with a separable bilinear
// (triangle) filter whose support widens by the scale factor when
// downsampling (antialiasing, as PIL's BILINEAR and torchvision's
// antialias=True), rounding to nearest. Upsampling is plain bilinear with
// half-pixel centers. height, width >= 1.
absl::StatusOr<Tensor> Resize(const Tensor& img, int64_t height, int64_t width);

// Mirrors uint8 [H, W, C] left to right.
absl::StatusOr<Tensor> FlipHorizontal(const Tensor& img);
// A batch uint8 [B, H, W, C]: image b mirrored when flip[b], else copied.
absl::StatusOr<Tensor> FlipHorizontalBatch(const Tensor& batch, const std::vector<bool>& flip);

// uint8 [H, W, 3] -> float32 [3, H, W], (x / 255 - mean[c]) / stddev[c].
// stddev must be nonzero.
absl::StatusOr<Tensor> Normalize(const Tensor& img, const std::array<float, 3>& mean,
                                 const std::array<float, 3>& stddev);

// A small counter-based generator for the random image functions: seeded
// per element (expr.cc derives the seed from the pipeline seed and the
// element's key), so results do not depend on threads or workers.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t NextU64();           // splitmix64
  double Uniform(double lo, double hi);  // [lo, hi)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi], lo <= hi

 private:
  uint64_t state_;
};

// torchvision's RandomResizedCrop.get_params on an image of
// height x width: up to 10 tries of area fraction U(scale) and log-uniform
// aspect ratio; else the center crop whose ratio is clamped to `ratio`.
Region RandomResizedCropRegion(Rng& rng, int64_t height, int64_t width,
                               std::array<double, 2> scale = {0.08, 1.0},
                               std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0});

// torchvision's CenterCrop: the crop_height x crop_width box at the center
// (top = round((H - h) / 2), left likewise, as torchvision rounds); an image
// smaller than the crop is first padded with zeros on both sides, as
// torchvision pads.
absl::StatusOr<Tensor> CenterCrop(const Tensor& img, int64_t crop_height, int64_t crop_width);

// torchvision's Resize(shorter_side) output size: the shorter side becomes
// `shorter_side`, the other keeps the aspect ratio (truncated as
// torchvision does).
std::array<int64_t, 2> ResizedSize(int64_t height, int64_t width, int64_t shorter_side);

}  // namespace sluice::internal::image
