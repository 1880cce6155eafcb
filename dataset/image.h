// Image decoding and augmentation as functions of the expression language
// (expr.h): they serialize into the dataset definition and run on workers
// without plugins.
//
//   using sluice::expr::x;
//   namespace image = sluice::image;
//   auto ds = image::ImageFolder("/data/train")                 // (path, label)
//       .WithSeed(42)
//       .Map({image::Normalize(image::RandomHorizontalFlip(image::RandomResizedCrop(
//                 image::Decode(sluice::io::ReadFile(x[0])), 224, 224)),
//             {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}),
//             x[1]},
//            sluice::kAutotune)
//       .Batch(64, /*drop_remainder=*/true);
//
// Images are uint8 [H, W, 3] (RGB) until Normalize makes them float32
// [3, H, W]. A crop or resize applied directly to Decode(...) decodes only
// what it needs: the crop's rows and columns, at the smallest of libjpeg's
// DCT scales (1/8 .. 8/8) that keeps at least the output size (as DALI's
// region decoding). Its pixels may so differ slightly from decoding the
// whole image and then cropping; the crop box is the same.
//
// Random functions draw from a seed derived from the pipeline's seed
// (Dataset::WithSeed; without one, a random seed per iterator), the
// element's position in its source (and its epoch under Repeat) and the
// function's place in the pipeline: with a seed, the same elements come
// out whatever the number of workers or threads (docs/datasets.md,
// "Randomness").
//
// Errors: corrupt or truncated images are InvalidArgument naming the file
// when the bytes came from io::ReadFile.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"

namespace sluice {
namespace io {

// A file's whole contents as a string scalar; `path` is a string scalar.
// NotFound / PermissionDenied / Unavailable naming the path when it cannot
// be read.
expr::Expr ReadFile(const expr::Expr& path);

}  // namespace io

namespace image {

// JPEG (libjpeg-turbo) or PNG (libpng) bytes -> uint8 [H, W, 3].
expr::Expr Decode(const expr::Expr& bytes);

// torchvision's RandomResizedCrop: a random box of area fraction in
// `scale` and aspect ratio (log-uniform) in `ratio`, resized to
// height x width with an antialiased bilinear filter.
expr::Expr RandomResizedCrop(const expr::Expr& img, int64_t height, int64_t width,
                             std::array<double, 2> scale = {0.08, 1.0},
                             std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0});

// Resizes so that the shorter side is `shorter_side` (torchvision's
// Resize(int)), antialiased bilinear.
expr::Expr Resize(const expr::Expr& img, int64_t shorter_side);

// The centered height x width box (torchvision's CenterCrop: zero padding
// when the image is smaller).
expr::Expr CenterCrop(const expr::Expr& img, int64_t height, int64_t width);

// Mirrors left to right with probability p. Also a batch uint8
// [B, H, W, C]: each image with probability p (each draws its own).
expr::Expr RandomHorizontalFlip(const expr::Expr& img, double p = 0.5);

// uint8 [H, W, 3] -> float32 [3, H, W]: (x / 255 - mean) / stddev per channel.
// Also a batch, uint8 [B, H, W, 3] -> float32 [B, 3, H, W]: apply it after
// Batch and after Distribute, so that uint8 crosses the wire (a quarter of
// the bytes) and the client normalizes.
expr::Expr Normalize(const expr::Expr& img, std::array<float, 3> mean,
                     std::array<float, 3> stddev);

// ---- labels by directory (torchvision's ImageFolder) ----

// The file extensions ImageFolder takes (lower case, with the dot).
inline const std::vector<std::string>& DefaultImageExtensions() {
  static const std::vector<std::string> kExtensions = {".jpg", ".jpeg", ".png"};
  return kExtensions;
}

// The class names of an image folder: its subdirectories, sorted. NotFound
// when `root` has none.
absl::StatusOr<std::vector<std::string>> FolderClasses(const std::string& root);

// The label of `path` (a string scalar): the index in `classes` of its
// parent directory's name or, given `root`, of the first directory below
// `root` on its path, as an int64 scalar; -1 when that directory is not a
// class, the path is not under `root`, or the extension (case-insensitive)
// is not one of `extensions`.
expr::Expr FolderLabel(const expr::Expr& path, const std::vector<std::string>& classes,
                       const std::vector<std::string>& extensions = DefaultImageExtensions(),
                       const std::string& root = "");

// (path, label) for every image file under root/<class>/, at any depth,
// sorted by path, as torchvision's ImageFolder: ListFiles(root/*,
// recursive) labeled by FolderLabel by root, files with other extensions
// filtered out. The classes are listed now; the error of a root without
// subdirectories is the dataset's status().
Dataset ImageFolder(const std::string& root,
                    const std::vector<std::string>& extensions = DefaultImageExtensions());

}  // namespace image
}  // namespace sluice
