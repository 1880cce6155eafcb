// sluice::image and sluice::io in pipelines: the functions through Map,
// decoding only what a crop needs, errors naming files, seeds that follow
// elements (not threads or order), and ImageFolder's labels. The kernels
// themselves are tested against reference pixels in image_kernels_test.cc.
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "sluice/dataset/dataset.h"
#include "sluice/dataset/image.h"
#include "sluice/dataset/image_kernels_internal.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/dataset/image_test_util.h"

namespace sluice {
namespace {

using ::sluice_test::Collect;
using ::sluice_test::SyntheticRgb;
using ::sluice_test::TjDecodeFull;
using ::sluice_test::TjEncode;
using ::sluice_test::TempDir;
using expr::x;

constexpr std::array<float, 3> kMean = {0.485f, 0.456f, 0.406f};
constexpr std::array<float, 3> kStd = {0.229f, 0.224f, 0.225f};

// JPEG string scalars of `n` distinct synthetic images.
std::vector<Element> Jpegs(int n, int height = 48, int width = 64) {
  std::vector<Element> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({Tensor::String(TjEncode(SyntheticRgb(height, width, i), height, width))});
  }
  return out;
}

std::string Bytes(const Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data()), t.byte_size());
}

TEST(ImageTest, DecodeInAMapIsLibjpegsDecode) {
  const std::string jpeg = TjEncode(SyntheticRgb(37, 53, 1), 37, 53);
  Dataset ds = Dataset::FromTensors({{Tensor::String(jpeg)}}).Map(image::Decode(x));
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(uint8[?,?,3])");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  ASSERT_EQ(out.size(), 1u);
  std::vector<uint8_t> ref = TjDecodeFull(jpeg, TJPF_RGB);
  ASSERT_EQ(out[0][0].shape().dims(), (std::vector<int64_t>{37, 53, 3}));
  EXPECT_EQ(Bytes(out[0][0]), std::string(ref.begin(), ref.end()));
}

TEST(ImageTest, TrainingPipelineGivesNormalizedFloatImagesOfTheCropSize) {
  Dataset ds = Dataset::FromTensors(Jpegs(5))
                   .WithSeed(1)
                   .Map(image::Normalize(image::RandomHorizontalFlip(image::RandomResizedCrop(
                                             image::Decode(x), 32, 24)),
                                         kMean, kStd),
                        kAutotune)
                   .Batch(5);
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(float32[?,3,32,24])");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0][0].shape().dims(), (std::vector<int64_t>{5, 3, 32, 24}));
  const float* v = reinterpret_cast<const float*>(out[0][0].data());
  for (int64_t i = 0; i < out[0][0].num_elements(); ++i) {
    ASSERT_GE(v[i], (0 - 0.485f) / 0.229f - 1e-4f);
    ASSERT_LE(v[i], (1 - 0.406f) / 0.225f + 1e-4f);
  }
}

// Normalizing the batch (as after Distribute, so that uint8 crosses the
// wire) gives exactly what normalizing each image before Batch gives.
TEST(ImageTest, NormalizeAfterBatchEqualsNormalizeBeforeIt) {
  auto cropped = [] {
    return Dataset::FromTensors(Jpegs(5)).WithSeed(1).Map(
        image::RandomHorizontalFlip(image::RandomResizedCrop(image::Decode(x), 32, 24)));
  };
  Dataset before = cropped().Map(image::Normalize(x, kMean, kStd)).Batch(5);
  Dataset after = cropped().Batch(5).Map(image::Normalize(x, kMean, kStd));
  ASSERT_OK(after.status());
  EXPECT_EQ(after.element_spec().ToString(), "(float32[?,3,32,24])");
  ASSERT_OK_AND_ASSIGN(auto want, Collect(before));
  ASSERT_OK_AND_ASSIGN(auto got, Collect(after));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(want.size(), 1u);
  EXPECT_TRUE(ElementsEqual(got[0], want[0]));
}

// The crop taken over from Decode (region decode) gives the pixels of
// decoding everything and then cropping: with an output larger than the
// region no DCT scaling applies, and libjpeg's region decode is exact.
TEST(ImageTest, CropOfADecodeDecodesOnlyTheRegionWithTheSamePixels) {
  Dataset src = Dataset::FromTensors(Jpegs(8)).WithSeed(3);
  Dataset fused = src.Map(image::RandomResizedCrop(image::Decode(x), 96, 128));
  // A Cast to the same dtype keeps the decode a step of its own.
  Dataset whole = src.Map(image::RandomResizedCrop(image::Decode(x).Cast(DType::kUInt8), 96, 128));
  ASSERT_OK_AND_ASSIGN(auto a, Collect(fused));
  ASSERT_OK_AND_ASSIGN(auto b, Collect(whole));
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i][0].shape().dims(), (std::vector<int64_t>{96, 128, 3}));
    ASSERT_EQ(a[i][0].shape().dims(), b[i][0].shape().dims());
    int max_diff = 0;
    for (int64_t j = 0; j < a[i][0].num_elements(); ++j) {
      max_diff = std::max(max_diff, std::abs(int{a[i][0].data()[j]} - int{b[i][0].data()[j]}));
    }
    EXPECT_EQ(max_diff, 0) << "element " << i;
  }
}

TEST(ImageTest, ResizeOfADecodeMayDecodeScaledDown) {
  const std::string jpeg = TjEncode(SyntheticRgb(200, 300, 4), 200, 300);
  Dataset ds = Dataset::FromTensors({{Tensor::String(jpeg)}}).Map(image::Resize(image::Decode(x), 50));
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  // torchvision's Resize(50) of 200 x 300: 50 x 75.
  EXPECT_EQ(out[0][0].shape().dims(), (std::vector<int64_t>{50, 75, 3}));
  Dataset unfused = Dataset::FromTensors({{Tensor::String(jpeg)}})
                        .Map(image::Resize(image::Decode(x).Cast(DType::kUInt8), 50));
  ASSERT_OK_AND_ASSIGN(auto ref, Collect(unfused));
  ASSERT_EQ(ref[0][0].shape().dims(), out[0][0].shape().dims());
  // Decoding at 1/4 scale and resizing is close to resizing the whole.
  double diff = 0;
  for (int64_t i = 0; i < out[0][0].num_elements(); ++i) {
    diff += std::abs(int{out[0][0].data()[i]} - int{ref[0][0].data()[i]});
  }
  EXPECT_LT(diff / out[0][0].num_elements(), 8.0);
}

TEST(ImageTest, CenterCropAndResizeLikeTorchvisionsEvalTransform) {
  Dataset ds = Dataset::FromTensors(Jpegs(2, 120, 90))
                   .Map(image::CenterCrop(image::Resize(image::Decode(x), 64), 56, 56));
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(uint8[56,56,3])");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  for (const auto& e : out) EXPECT_EQ(e[0].shape().dims(), (std::vector<int64_t>{56, 56, 3}));
}

TEST(ImageTest, CorruptImagesAreInvalidArgumentNamingTheFile) {
  TempDir dir;
  std::string jpeg = TjEncode(SyntheticRgb(40, 40, 9), 40, 40);
  sluice_test::WriteBytes(dir.File("cut.jpg"), jpeg.substr(0, jpeg.size() / 2));
  sluice_test::WriteBytes(dir.File("junk.jpg"), "this is not an image at all");
  for (const char* name : {"cut.jpg", "junk.jpg"}) {
    const std::string path = dir.File(name);
    Dataset ds = Dataset::FromTensors({{Tensor::String(path)}})
                     .Map(image::RandomResizedCrop(image::Decode(io::ReadFile(x)), 16, 16));
    EXPECT_STATUS(Collect(ds), absl::StatusCode::kInvalidArgument, path);
    Dataset plain = Dataset::FromTensors({{Tensor::String(path)}}).Map(image::Decode(io::ReadFile(x)));
    EXPECT_STATUS(Collect(plain), absl::StatusCode::kInvalidArgument, path);
  }
  Dataset missing = Dataset::FromTensors({{Tensor::String(dir.File("none.jpg"))}})
                        .Map(image::Decode(io::ReadFile(x)));
  EXPECT_STATUS(Collect(missing), absl::StatusCode::kNotFound, dir.File("none.jpg"));
  Dataset bytes = Dataset::FromTensors({{Tensor::String("\xff\xd8\xff garbage")}}).Map(image::Decode(x));
  EXPECT_STATUS(Collect(bytes), absl::StatusCode::kInvalidArgument, "image.decode");
}

TEST(ImageTest, WrongInputsAreDefinitionErrors) {
  Dataset floats = Dataset::FromTensors({{Tensor::FromVector<float>({1, 2, 3})}});
  EXPECT_STATUS(floats.Map(image::Decode(x)).status(), absl::StatusCode::kInvalidArgument,
                "image.decode");
  EXPECT_STATUS(floats.Map(image::RandomHorizontalFlip(x)).status(),
                absl::StatusCode::kInvalidArgument, "uint8");
  Dataset jpegs = Dataset::FromTensors(Jpegs(1));
  EXPECT_STATUS(jpegs.Map(image::RandomResizedCrop(image::Decode(x), 0, 10)).status(),
                absl::StatusCode::kInvalidArgument, "size");
  EXPECT_STATUS(jpegs.Map(image::RandomResizedCrop(image::Decode(x), 8, 8, {0.9, 0.1})).status(),
                absl::StatusCode::kInvalidArgument, "scale");
  EXPECT_STATUS(jpegs.Map(image::RandomHorizontalFlip(image::Decode(x), 1.5)).status(),
                absl::StatusCode::kInvalidArgument, "p must be");
  EXPECT_STATUS(jpegs.Map(image::Normalize(image::Decode(x), kMean, {1, 0, 1})).status(),
                absl::StatusCode::kInvalidArgument, "stddev");
  // Elementwise ops compose with the functions' results.
  Dataset scaled = jpegs.Map(image::Decode(x).Cast(DType::kFloat32) * (1.0 / 255));
  ASSERT_OK(scaled.status());
  EXPECT_EQ(scaled.element_spec().ToString(), "(float32[?,?,3])");
}

// The flips of each element, keyed by the element's first byte (distinct
// per image here).
std::map<std::string, std::string> FlipsByImage(const Dataset& ds) {
  std::map<std::string, std::string> out;
  auto elements = Collect(ds);
  EXPECT_OK(elements.status());
  if (!elements.ok()) return out;
  for (const auto& e : *elements) out[Bytes(e[0])] = Bytes(e[1]);
  return out;
}

// Small distinct images, as uint8 [4, 6, 3].
std::vector<Element> SmallImages(int n) {
  std::vector<Element> out;
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> px = SyntheticRgb(4, 6, i + 100);
    auto t = Tensor::FromVector<uint8_t>(px, TensorShape({4, 6, 3}));
    out.push_back({*t});
  }
  return out;
}

TEST(ImageTest, SeedsFollowTheElementNotTheOrderOrTheThreads) {
  Dataset src = Dataset::FromTensors(SmallImages(64)).WithSeed(11);
  const Function f = {x, image::RandomHorizontalFlip(x)};
  auto reference = FlipsByImage(src.Map(f));
  ASSERT_EQ(reference.size(), 64u);
  int flipped = 0;
  for (const auto& [in, out] : reference) flipped += in != out;
  EXPECT_GT(flipped, 10);
  EXPECT_LT(flipped, 54);
  // The same seed, another iterator, a parallel Map, a shuffle before it.
  EXPECT_EQ(FlipsByImage(src.Map(f)), reference);
  EXPECT_EQ(FlipsByImage(src.Map(f, 4)), reference);
  EXPECT_EQ(FlipsByImage(src.Map(f, kAutotune, /*deterministic=*/false)), reference);
  EXPECT_EQ(FlipsByImage(src.Shuffle(64, 5).Map(f)), reference);
  EXPECT_EQ(FlipsByImage(src.Prefetch(3).Map(f)), reference);
  // A second Map of the same function draws differently from the first:
  // flipping twice does not always give the input back.
  auto twice = FlipsByImage(
      src.Map({x, image::RandomHorizontalFlip(x)}).Map({x[0], image::RandomHorizontalFlip(x[1])}));
  int changed = 0;
  for (const auto& [in, out] : twice) changed += in != out;
  EXPECT_GT(changed, 5);
  // Another seed draws differently.
  EXPECT_NE(FlipsByImage(Dataset::FromTensors(SmallImages(64)).WithSeed(12).Map(f)), reference);
}

TEST(ImageTest, EpochsUnderRepeatDrawAnew) {
  Dataset ds = Dataset::FromTensors(SmallImages(32))
                   .WithSeed(5)
                   .Repeat(2)
                   .Map(image::RandomHorizontalFlip(x));
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  ASSERT_EQ(out.size(), 64u);
  int differ = 0;
  for (int i = 0; i < 32; ++i) differ += !ElementsEqual(out[i], out[32 + i]);
  EXPECT_GT(differ, 0);
  // And the same again from a new iterator.
  ASSERT_OK_AND_ASSIGN(auto again, Collect(ds));
  for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(ElementsEqual(out[i], again[i]));
}

// As torchvision's: every image under a class directory, at any depth, is
// labeled by that class directory.
TEST(ImageTest, ImageFolderLabelsByClassDirectoryAtAnyDepth) {
  TempDir dir;
  for (const char* d : {"dog", "cat", "empty", "cat/tabby/young"}) {
    std::filesystem::create_directories(dir.File(d));
  }
  const std::string jpeg = TjEncode(SyntheticRgb(8, 8, 1), 8, 8);
  for (const char* f : {"cat/1.jpg", "cat/2.JPEG", "cat/tabby/3.jpg", "cat/tabby/young/4.jpg",
                        "dog/a.png", "dog/notes.txt", "top.jpg"}) {
    sluice_test::WriteBytes(dir.File(f), jpeg);
  }
  ASSERT_OK_AND_ASSIGN(auto classes, image::FolderClasses(dir.path()));
  EXPECT_EQ(classes, (std::vector<std::string>{"cat", "dog", "empty"}));
  Dataset ds = image::ImageFolder(dir.path());
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(string[], int64[])");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  std::vector<std::pair<std::string, int64_t>> got;
  for (const auto& e : out) got.emplace_back(std::string(e[0].str(0)), e[1].at<int64_t>(0));
  EXPECT_EQ(got,
            (std::vector<std::pair<std::string, int64_t>>{{dir.File("cat/1.jpg"), 0},
                                                         {dir.File("cat/2.JPEG"), 0},
                                                         {dir.File("cat/tabby/3.jpg"), 0},
                                                         {dir.File("cat/tabby/young/4.jpg"), 0},
                                                         {dir.File("dog/a.png"), 1}}));
  // A root given with a trailing slash lists the same.
  ASSERT_OK_AND_ASSIGN(auto slash, Collect(image::ImageFolder(dir.path() + "/")));
  EXPECT_EQ(slash.size(), out.size());
  TempDir flat;
  EXPECT_STATUS(image::ImageFolder(flat.path()).status(), absl::StatusCode::kNotFound,
                "no class subdirectories");
  EXPECT_STATUS(image::ImageFolder(dir.File("missing")).status(), absl::StatusCode::kNotFound,
                "missing");
}

// A batch [B, H, W, 3] (after Batch, or uint8 after Distribute): each image
// flips on its own draw; p = 0 and p = 1 leave all and flip all.
TEST(ImageTest, RandomHorizontalFlipOfABatchFlipsEachImageOnItsOwnDraw) {
  const std::vector<Element> images = SmallImages(16);
  auto flipped = [](const Tensor& t) { return *internal::image::FlipHorizontal(t); };
  for (double p : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(p);
    Dataset ds = Dataset::FromTensors(images).Batch(16).WithSeed(4).Map(
        image::RandomHorizontalFlip(x, p));
    ASSERT_OK(ds.status());
    EXPECT_EQ(ds.element_spec().ToString(), "(uint8[?,4,6,3])");
    ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
    ASSERT_EQ(out.size(), 1u);
    const Tensor& batch = out[0][0];
    int same = 0, mirrored = 0;
    for (int64_t b = 0; b < 16; ++b) {
      const size_t bytes = 4 * 6 * 3;
      const std::string got(reinterpret_cast<const char*>(batch.data()) + b * bytes, bytes);
      const Tensor& in = images[static_cast<size_t>(b)][0];
      const Tensor mirror = flipped(in);
      if (got == std::string(reinterpret_cast<const char*>(in.data()), bytes)) ++same;
      if (got == std::string(reinterpret_cast<const char*>(mirror.data()), bytes)) ++mirrored;
    }
    EXPECT_EQ(same + mirrored, 16);  // none of the synthetic images is symmetric
    if (p == 0.0) {
      EXPECT_EQ(same, 16);
    } else if (p == 1.0) {
      EXPECT_EQ(mirrored, 16);
    } else {
      EXPECT_TRUE(same > 0 && mirrored > 0) << same << " kept, " << mirrored;
    }
  }
  EXPECT_STATUS(Dataset::FromTensors({{Tensor::Scalar<float>(1)}}).Batch(1).Batch(1).Batch(1)
                    .Batch(1).Map(image::RandomHorizontalFlip(x)).status(),
                absl::StatusCode::kInvalidArgument, "uint8");
}

TEST(ImageTest, TheSeedTravelsWithTheDefinition) {
  Dataset ds = Dataset::FromTensors(SmallImages(16)).WithSeed(99).Map(image::RandomHorizontalFlip(x));
  ASSERT_OK_AND_ASSIGN(std::string bytes, ds.Serialize());
  ASSERT_OK_AND_ASSIGN(Dataset back, Dataset::Deserialize(bytes));
  ASSERT_OK_AND_ASSIGN(auto a, Collect(ds));
  ASSERT_OK_AND_ASSIGN(auto b, Collect(back));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(ElementsEqual(a[i], b[i]));
  EXPECT_NE(ds.Fingerprint(),
            Dataset::FromTensors(SmallImages(16)).WithSeed(98).Map(image::RandomHorizontalFlip(x))
                .Fingerprint());
}

}  // namespace
}  // namespace sluice
