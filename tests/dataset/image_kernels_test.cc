// Tests of the image kernels (dataset/image_kernels_internal.h) against
// reference values: JPEG decodes against TurboJPEG's own decode (same
// libjpeg-turbo, same defaults) byte for byte, for every chroma subsampling,
// progressive and grayscale; region decodes against crops of the full
// decode; scaled decodes against TurboJPEG's scaled decode; PNG decodes of
// every color type and bit depth against the pixels written; corrupt,
// truncated and oversized inputs; and the pixel kernels (crop, resize,
// flip, normalize, center crop) and crop geometry (RandomResizedCrop,
// Resize(int) sizes) against values worked out by hand from Pillow's and
// torchvision's definitions.
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sluice/dataset/image_kernels_internal.h"
#include "tests/dataset/image_test_util.h"
#include "tests/test_util.h"

namespace sluice::internal::image {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

using ::sluice_test::SyntheticRgb;
using ::sluice_test::TjDecode;
using ::sluice_test::TjDecodeFull;
using ::sluice_test::TjEncode;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

std::vector<uint8_t> Pixels(const Tensor& t) {
  return std::vector<uint8_t>(t.data(), t.data() + t.byte_size());
}

std::vector<int64_t> Dims(const Tensor& t) { return t.shape().dims(); }

Tensor Image(int64_t h, int64_t w, int64_t c, std::vector<uint8_t> px) {
  auto t = Tensor::FromVector<uint8_t>(px, TensorShape({h, w, c}));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// The crop [top, top + h) x [left, left + w) of packed h0 x w0 x c pixels.
std::vector<uint8_t> CropOf(const std::vector<uint8_t>& px, int w0, int c, const Region& r) {
  std::vector<uint8_t> out;
  for (int64_t y = r.top; y < r.top + r.height; ++y) {
    const auto* row = px.data() + (y * w0 + r.left) * c;
    out.insert(out.end(), row, row + r.width * c);
  }
  return out;
}

// PNG writer (libpng classic API): rows of `px` are packed at `bit_depth`
// (16-bit samples big-endian, as PNG stores them).
std::string EncodePng(int h, int w, int color_type, int bit_depth, const std::vector<uint8_t>& px,
                      bool interlace = false, const std::vector<png_color>& palette = {}) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    ADD_FAILURE() << "png write failed";
    png_destroy_write_struct(&png, &info);
    return std::string();
  }
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep data, size_t n) {
        static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<char*>(data), n);
      },
      nullptr);
  png_set_IHDR(png, info, w, h, bit_depth, color_type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) {
    png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  }
  png_write_info(png, info);
  const size_t row_bytes = px.size() / h;
  std::vector<png_bytep> rows(h);
  for (int y = 0; y < h; ++y) rows[y] = const_cast<png_bytep>(px.data() + y * row_bytes);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

uint32_t Crc32(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void PutBe32(std::string& s, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[pos + i] = static_cast<char>(v >> (24 - 8 * i));
}

// Offset just past the SOS segment (the first entropy-coded byte).
size_t EntropyStart(const std::string& jpeg) {
  for (size_t i = 2; i + 3 < jpeg.size(); ++i) {
    if (static_cast<uint8_t>(jpeg[i]) == 0xFF && static_cast<uint8_t>(jpeg[i + 1]) == 0xDA) {
      const size_t len =
          (static_cast<uint8_t>(jpeg[i + 2]) << 8) | static_cast<uint8_t>(jpeg[i + 3]);
      return i + 2 + len;
    }
  }
  ADD_FAILURE() << "no SOS marker";
  return jpeg.size();
}

// Offset of the SOF0/SOF2 segment's marker.
size_t SofOffset(const std::string& jpeg) {
  for (size_t i = 2; i + 1 < jpeg.size(); ++i) {
    const auto m = static_cast<uint8_t>(jpeg[i + 1]);
    if (static_cast<uint8_t>(jpeg[i]) == 0xFF && (m == 0xC0 || m == 0xC2)) return i;
  }
  ADD_FAILURE() << "no SOF marker";
  return 0;
}

struct Sampling {
  int subsamp;
  int flags;
  const char* name;
};

void PrintTo(const Sampling& s, std::ostream* os) { *os << s.name; }

const Sampling kSamplings[] = {
    {TJSAMP_444, 0, "444"},
    {TJSAMP_420, 0, "420"},
    {TJSAMP_422, 0, "422"},
    {TJSAMP_440, 0, "440"},
    {TJSAMP_411, 0, "411"},
    {TJSAMP_420, TJFLAG_PROGRESSIVE, "420_progressive"},
    {TJSAMP_444, TJFLAG_PROGRESSIVE, "444_progressive"},
};

// ---------------------------------------------------------------------------
// PeekImage
// ---------------------------------------------------------------------------

TEST(PeekImageTest, JpegAndPngSizes) {
  const std::string jpeg = TjEncode(SyntheticRgb(47, 61), 47, 61, TJPF_RGB, TJSAMP_420);
  ASSERT_OK_AND_ASSIGN(ImageInfo info, PeekImage(jpeg));
  EXPECT_EQ(info.format, ImageFormat::kJpeg);
  EXPECT_EQ(info.height, 47);
  EXPECT_EQ(info.width, 61);

  const std::string png = EncodePng(5, 7, PNG_COLOR_TYPE_RGB, 8, SyntheticRgb(5, 7));
  ASSERT_OK_AND_ASSIGN(info, PeekImage(png));
  EXPECT_EQ(info.format, ImageFormat::kPng);
  EXPECT_EQ(info.height, 5);
  EXPECT_EQ(info.width, 7);

  EXPECT_STATUS(PeekImage(""), kInvalid, "not a JPEG or PNG");
  EXPECT_STATUS(PeekImage("GIF89a......"), kInvalid, "not a JPEG or PNG");
  EXPECT_STATUS(PeekImage(jpeg.substr(0, 2)), kInvalid, "cut short");
  EXPECT_STATUS(PeekImage(jpeg.substr(0, SofOffset(jpeg) + 5)), kInvalid, "cut short");
  EXPECT_STATUS(PeekImage(png.substr(0, 20)), kInvalid, "cut short");
}

// ---------------------------------------------------------------------------
// JPEG decoding
// ---------------------------------------------------------------------------

class JpegSamplingTest : public ::testing::TestWithParam<Sampling> {};

TEST_P(JpegSamplingTest, FullDecodeEqualsTurboJpeg) {
  for (const auto& [h, w] :
       {std::pair{47, 61}, std::pair{16, 16}, std::pair{1, 1}, std::pair{9, 130}}) {
    const std::string jpeg =
        TjEncode(SyntheticRgb(h, w), h, w, TJPF_RGB, GetParam().subsamp, 90, GetParam().flags);
    ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(jpeg));
    EXPECT_EQ(Dims(img), (std::vector<int64_t>{h, w, 3}));
    EXPECT_EQ(Pixels(img), TjDecodeFull(jpeg, TJPF_RGB)) << h << "x" << w;
  }
}

// libjpeg-turbo's region decode (jpeg_crop_scanline + jpeg_skip_scanlines)
// with the one-pixel column margin the decoder adds is exact: every region
// equals the same rectangle of the full decode.
TEST_P(JpegSamplingTest, RegionDecodeEqualsCropOfFullDecode) {
  constexpr int h = 83, w = 101;
  const std::string jpeg =
      TjEncode(SyntheticRgb(h, w, 7), h, w, TJPF_RGB, GetParam().subsamp, 90, GetParam().flags);
  const std::vector<uint8_t> full = TjDecodeFull(jpeg, TJPF_RGB);
  std::vector<Region> regions = {
      {0, 0, h, w},         {0, 0, 1, 1},  {h - 1, w - 1, 1, 1}, {16, 16, 16, 16}, {17, 33, 20, 31},
      {1, 1, h - 2, w - 2}, {0, 15, h, 2}, {40, 0, 3, w},        {31, 47, 52, 54}, {8, 7, 9, 10}};
  std::mt19937 gen(3);
  for (int i = 0; i < 40; ++i) {
    Region r;
    r.top = std::uniform_int_distribution<int64_t>(0, h - 1)(gen);
    r.left = std::uniform_int_distribution<int64_t>(0, w - 1)(gen);
    r.height = std::uniform_int_distribution<int64_t>(1, h - r.top)(gen);
    r.width = std::uniform_int_distribution<int64_t>(1, w - r.left)(gen);
    regions.push_back(r);
  }
  for (const Region& r : regions) {
    DecodeRequest req;
    req.region = r;
    ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(jpeg, req));
    ASSERT_EQ(Dims(img), (std::vector<int64_t>{r.height, r.width, 3}));
    EXPECT_EQ(Pixels(img), CropOf(full, w, 3, r))
        << "region top=" << r.top << " left=" << r.left << " h=" << r.height << " w=" << r.width;
  }
}

// Scaled decodes: without a region the result is TurboJPEG's scaled decode;
// with one, the rounded scaled rectangle of it.
TEST_P(JpegSamplingTest, ScaledDecode) {
  constexpr int h = 120, w = 161;
  const std::string jpeg =
      TjEncode(SyntheticRgb(h, w, 5), h, w, TJPF_RGB, GetParam().subsamp, 90, GetParam().flags);
  // Half size: 60 x 81 (libjpeg rounds the output size up).
  int sh = 60, sw = 81;
  const std::vector<uint8_t> half = TjDecode(jpeg, TJPF_RGB, &sh, &sw);
  ASSERT_EQ(sh, 60);
  ASSERT_EQ(sw, 81);
  DecodeRequest req;
  req.min_height = 60;
  req.min_width = 80;
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{60, 81, 3}));
  EXPECT_EQ(Pixels(img), half);

  // A region that 1/2 keeps above the minimum (and 3/8 would not):
  // rows [10, 50) -> [5, 25), columns [12, 62) -> [6, 31).
  req.region = Region{10, 12, 40, 50};
  req.min_height = 20;
  req.min_width = 25;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{20, 25, 3}));
  EXPECT_EQ(Pixels(img), CropOf(half, sw, 3, Region{5, 6, 20, 25}));

  // Edges round half up. Rows [3, 40), columns [5, 60): at 3/8, rows
  // [1.125, 15) -> [1, 15) and columns [1.875, 22.5) -> [2, 23); at 1/2,
  // rows [1.5, 20) -> [2, 20) and columns [2.5, 30) -> [3, 30).
  req.region = Region{3, 5, 37, 55};
  req.min_height = 14;
  req.min_width = 20;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{14, 21, 3}));  // 3/8
  req.min_height = 15;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{18, 27, 3}));  // 1/2
  EXPECT_EQ(Pixels(img), CropOf(half, sw, 3, Region{2, 3, 18, 27}));

  // A region touching the bottom right keeps the scaled image's border:
  // rows [89, 120) -> [44.5, 60) -> [45, 60), columns [120, 161) -> [60, 81).
  req.region = Region{h - 31, w - 41, 31, 41};
  req.min_height = 15;
  req.min_width = 20;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{15, 21, 3}));
  EXPECT_EQ(Pixels(img), CropOf(half, sw, 3, Region{45, 60, 15, 21}));

  // A minimum only full size meets: no scaling.
  req.region = Region{0, 0, 50, 50};
  req.min_height = 50;
  req.min_width = 1;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{50, 50, 3}));
  EXPECT_EQ(Pixels(img), CropOf(TjDecodeFull(jpeg, TJPF_RGB), w, 3, Region{0, 0, 50, 50}));

  // The smallest scale, 1/8, whenever the minimum allows it.
  req.region.reset();
  req.min_height = 1;
  req.min_width = 1;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(jpeg, req));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{15, 21, 3}));
  int eh = 15, ew = 21;
  EXPECT_EQ(Pixels(img), TjDecode(jpeg, TJPF_RGB, &eh, &ew));
}

INSTANTIATE_TEST_SUITE_P(Samplings, JpegSamplingTest, ::testing::ValuesIn(kSamplings),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(JpegTest, GrayscaleComesOutAsThreeEqualChannels) {
  constexpr int h = 47, w = 61;
  std::vector<uint8_t> gray(h * w);
  for (int i = 0; i < h * w; ++i) gray[i] = static_cast<uint8_t>((i * 37) % 251);
  const std::string jpeg = TjEncode(gray, h, w, TJPF_GRAY, TJSAMP_GRAY);
  const std::vector<uint8_t> ref = TjDecodeFull(jpeg, TJPF_GRAY);
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(jpeg));
  ASSERT_EQ(Dims(img), (std::vector<int64_t>{h, w, 3}));
  for (int i = 0; i < h * w; ++i) {
    ASSERT_EQ(img.data()[3 * i + 0], ref[i]) << i;
    ASSERT_EQ(img.data()[3 * i + 1], ref[i]) << i;
    ASSERT_EQ(img.data()[3 * i + 2], ref[i]) << i;
  }
  DecodeRequest req;
  req.region = Region{5, 9, 30, 40};
  ASSERT_OK_AND_ASSIGN(Tensor part, DecodeImage(jpeg, req));
  EXPECT_EQ(Pixels(part), CropOf(Pixels(img), w, 3, *req.region));
}

// An Adobe CMYK JPEG (TurboJPEG writes the Adobe marker and stores inverted
// CMYK, as Photoshop does) becomes RGB = C * K / 255 of the stored values,
// as libjpeg-turbo's cmyk_to_rgb and Pillow convert it.
TEST(JpegTest, AdobeCmykIsConvertedToRgb) {
  constexpr int h = 16, w = 24;
  std::vector<uint8_t> cmyk(h * w * 4);
  for (size_t i = 0; i < cmyk.size(); ++i) cmyk[i] = static_cast<uint8_t>(40 + (i * 13) % 200);
  const std::string jpeg = TjEncode(cmyk, h, w, TJPF_CMYK, TJSAMP_444, 95);
  const std::vector<uint8_t> stored = TjDecodeFull(jpeg, TJPF_CMYK);
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(jpeg));
  ASSERT_EQ(Dims(img), (std::vector<int64_t>{h, w, 3}));
  for (int i = 0; i < h * w; ++i) {
    const double k = stored[4 * i + 3];
    for (int c = 0; c < 3; ++c) {
      const auto want = static_cast<int>(stored[4 * i + c] * k / 255.0 + 0.5);
      ASSERT_EQ(img.data()[3 * i + c], want) << "pixel " << i << " channel " << c;
    }
  }
  DecodeRequest req;
  req.region = Region{3, 5, 9, 11};
  ASSERT_OK_AND_ASSIGN(Tensor part, DecodeImage(jpeg, req));
  EXPECT_EQ(Pixels(part), CropOf(Pixels(img), w, 3, *req.region));
}

TEST(JpegTest, RegionMustLieInside) {
  const std::string jpeg = TjEncode(SyntheticRgb(20, 30), 20, 30, TJPF_RGB, TJSAMP_420);
  for (const Region& r : {Region{0, 0, 21, 30}, Region{0, 0, 20, 31}, Region{-1, 0, 5, 5},
                          Region{5, 5, 0, 5}, Region{19, 29, 2, 1}}) {
    DecodeRequest req;
    req.region = r;
    EXPECT_STATUS(DecodeImage(jpeg, req), kInvalid, "does not lie inside");
  }
}

// ---------------------------------------------------------------------------
// PNG decoding
// ---------------------------------------------------------------------------

TEST(PngTest, Rgb8) {
  const std::vector<uint8_t> px = SyntheticRgb(13, 17);
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(EncodePng(13, 17, PNG_COLOR_TYPE_RGB, 8, px)));
  EXPECT_EQ(Dims(img), (std::vector<int64_t>{13, 17, 3}));
  EXPECT_EQ(Pixels(img), px);
  // Interlaced (Adam7) gives the same pixels.
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(EncodePng(13, 17, PNG_COLOR_TYPE_RGB, 8, px, true)));
  EXPECT_EQ(Pixels(img), px);
  // A region is the crop; the request's minimum size does not scale PNGs.
  DecodeRequest req;
  req.region = Region{2, 3, 5, 7};
  req.min_height = 1;
  req.min_width = 1;
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(EncodePng(13, 17, PNG_COLOR_TYPE_RGB, 8, px), req));
  EXPECT_EQ(Pixels(img), CropOf(px, 17, 3, *req.region));
}

TEST(PngTest, RgbaDropsAlpha) {
  constexpr int h = 6, w = 9;
  const std::vector<uint8_t> rgb = SyntheticRgb(h, w);
  std::vector<uint8_t> rgba;
  for (int i = 0; i < h * w; ++i) {
    rgba.insert(rgba.end(),
                {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], static_cast<uint8_t>(i * 7)});
  }
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(EncodePng(h, w, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba)));
  EXPECT_EQ(Pixels(img), rgb);
}

TEST(PngTest, GrayAndGrayAlphaReplicated) {
  constexpr int h = 5, w = 11;
  std::vector<uint8_t> gray(h * w), gray_alpha, want;
  for (int i = 0; i < h * w; ++i) {
    gray[i] = static_cast<uint8_t>(i * 4 + 3);
    gray_alpha.insert(gray_alpha.end(), {gray[i], static_cast<uint8_t>(255 - i)});
    want.insert(want.end(), {gray[i], gray[i], gray[i]});
  }
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(EncodePng(h, w, PNG_COLOR_TYPE_GRAY, 8, gray)));
  EXPECT_EQ(Pixels(img), want);
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(EncodePng(h, w, PNG_COLOR_TYPE_GRAY_ALPHA, 8, gray_alpha)));
  EXPECT_EQ(Pixels(img), want);
}

TEST(PngTest, SixteenBitKeepsHighByte) {
  constexpr int h = 4, w = 5;
  std::vector<uint8_t> rgb16, gray16, want_rgb, want_gray;
  for (int i = 0; i < h * w * 3; ++i) {
    const uint16_t v = static_cast<uint16_t>(i * 2311 + 17);
    rgb16.insert(rgb16.end(), {static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)});
    want_rgb.push_back(static_cast<uint8_t>(v >> 8));
  }
  for (int i = 0; i < h * w; ++i) {
    const uint16_t v = static_cast<uint16_t>(i * 3001 + 200);
    gray16.insert(gray16.end(), {static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)});
    want_gray.insert(want_gray.end(), 3, static_cast<uint8_t>(v >> 8));
  }
  ASSERT_OK_AND_ASSIGN(Tensor img, DecodeImage(EncodePng(h, w, PNG_COLOR_TYPE_RGB, 16, rgb16)));
  EXPECT_EQ(Pixels(img), want_rgb);
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(EncodePng(h, w, PNG_COLOR_TYPE_GRAY, 16, gray16)));
  EXPECT_EQ(Pixels(img), want_gray);
}

TEST(PngTest, PaletteAndLowBitDepthGray) {
  constexpr int h = 3, w = 8;
  const std::vector<png_color> palette = {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}, {255, 0, 7}};
  // 2 bits per index, 4 pixels a byte: indices 0,1,2,3,3,2,1,0 per row.
  const std::vector<uint8_t> packed = {0x1B, 0xE4, 0x1B, 0xE4, 0x1B, 0xE4};
  std::vector<uint8_t> want;
  for (int y = 0; y < h; ++y) {
    for (int idx : {0, 1, 2, 3, 3, 2, 1, 0}) {
      want.insert(want.end(), {palette[idx].red, palette[idx].green, palette[idx].blue});
    }
  }
  ASSERT_OK_AND_ASSIGN(
      Tensor img, DecodeImage(EncodePng(h, w, PNG_COLOR_TYPE_PALETTE, 2, packed, false, palette)));
  EXPECT_EQ(Pixels(img), want);

  // 1-bit gray: 0 -> 0, 1 -> 255. Rows 0xA5 = 1,0,1,0,0,1,0,1.
  ASSERT_OK_AND_ASSIGN(img, DecodeImage(EncodePng(1, 8, PNG_COLOR_TYPE_GRAY, 1, {0xA5})));
  std::vector<uint8_t> want_bits;
  for (int b : {1, 0, 1, 0, 0, 1, 0, 1}) want_bits.insert(want_bits.end(), 3, b ? 255 : 0);
  EXPECT_EQ(Pixels(img), want_bits);
}

// ---------------------------------------------------------------------------
// Corrupt and hostile input: InvalidArgument, never a crash
// ---------------------------------------------------------------------------

TEST(CorruptInputTest, EmptyAndRandomBytes) {
  EXPECT_STATUS(DecodeImage(""), kInvalid, "not a JPEG or PNG");
  std::mt19937 gen(11);
  for (int i = 0; i < 50; ++i) {
    std::string bytes(std::uniform_int_distribution<int>(0, 300)(gen), '\0');
    for (char& c : bytes) c = static_cast<char>(gen());
    EXPECT_EQ(DecodeImage(bytes).status().code(), kInvalid);
    // With a valid signature in front.
    EXPECT_EQ(DecodeImage("\xFF\xD8" + bytes).status().code(), kInvalid);
    EXPECT_EQ(DecodeImage("\xFF\xD8\xFF\xE0" + bytes).status().code(), kInvalid);
    EXPECT_EQ(DecodeImage(std::string("\x89PNG\r\n\x1a\n", 8) + bytes).status().code(), kInvalid);
  }
}

TEST(CorruptInputTest, TruncatedJpeg) {
  for (const Sampling& s : {kSamplings[1], kSamplings[5]}) {
    const std::string jpeg =
        TjEncode(SyntheticRgb(47, 61), 47, 61, TJPF_RGB, s.subsamp, 90, s.flags);
    const size_t header_end = EntropyStart(jpeg);
    const size_t n = jpeg.size();
    for (size_t cut : {size_t{2}, size_t{3}, size_t{20}, SofOffset(jpeg) + 6, header_end,
                       header_end + 1, n / 2, n - 10, n - 2, n - 1}) {
      const std::string truncated = jpeg.substr(0, cut);
      EXPECT_EQ(DecodeImage(truncated).status().code(), kInvalid) << s.name << " cut at " << cut;
      DecodeRequest req;
      req.region = Region{0, 0, 8, 8};
      const absl::Status st = DecodeImage(truncated, req).status();
      // A region whose rows all come before the cut may decode.
      EXPECT_TRUE(st.ok() || st.code() == kInvalid) << st;
    }
    // The message carries libjpeg's explanation.
    EXPECT_STATUS(DecodeImage(jpeg.substr(0, n / 2)), kInvalid, "JPEG");
  }
}

TEST(CorruptInputTest, CorruptEntropyData) {
  const std::string jpeg = TjEncode(SyntheticRgb(47, 61), 47, 61, TJPF_RGB, TJSAMP_420);
  const size_t start = EntropyStart(jpeg);
  // A run of 1 bits (0xFF bytes, stuffed as FF 00) is no Huffman code.
  std::string bad = jpeg;
  for (size_t i = 0; i < 16; i += 2) {
    bad[start + 40 + i] = '\xFF';
    bad[start + 41 + i] = '\0';
  }
  EXPECT_STATUS(DecodeImage(bad), kInvalid, "Corrupt JPEG data");

  // Random bit flips: decoded or InvalidArgument, never a crash. Most flips
  // still parse as valid Huffman codes (libjpeg cannot tell), so only a few
  // are errors.
  std::mt19937 gen(5);
  int errors = 0;
  for (int i = 0; i < 200; ++i) {
    std::string flipped = jpeg;
    for (int f = 0; f < 4; ++f) {
      const size_t pos = std::uniform_int_distribution<size_t>(start, jpeg.size() - 3)(gen);
      flipped[pos] = static_cast<char>(flipped[pos] ^ (1 << (gen() % 8)));
    }
    const absl::Status st = DecodeImage(flipped).status();
    EXPECT_TRUE(st.ok() || st.code() == kInvalid) << st;
    errors += !st.ok();
    DecodeRequest req;
    req.region = Region{10, 20, 20, 30};
    req.min_height = 5;
    req.min_width = 5;
    const absl::Status st2 = DecodeImage(flipped, req).status();
    EXPECT_TRUE(st2.ok() || st2.code() == kInvalid) << st2;
  }
  EXPECT_GT(errors, 0);
}

// Bytes flipped anywhere (headers included) in JPEGs and PNGs.
TEST(CorruptInputTest, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> px = SyntheticRgb(33, 41);
  const std::vector<std::string> inputs = {
      TjEncode(px, 33, 41, TJPF_RGB, TJSAMP_420),
      TjEncode(px, 33, 41, TJPF_RGB, TJSAMP_444, 90, TJFLAG_PROGRESSIVE),
      EncodePng(33, 41, PNG_COLOR_TYPE_RGB, 8, px),
      EncodePng(33, 41, PNG_COLOR_TYPE_RGB, 8, px, /*interlace=*/true)};
  std::mt19937 gen(9);
  for (const std::string& input : inputs) {
    for (int i = 0; i < 300; ++i) {
      std::string m = input;
      const int flips = 1 + static_cast<int>(gen() % 3);
      for (int f = 0; f < flips; ++f) {
        const size_t pos = std::uniform_int_distribution<size_t>(0, m.size() - 1)(gen);
        m[pos] = static_cast<char>(gen());
      }
      if (gen() % 4 == 0) m.resize(std::uniform_int_distribution<size_t>(0, m.size())(gen));
      DecodeRequest req;
      if (gen() % 2 == 0) {
        req.region = Region{3, 4, 20, 25};
        req.min_height = gen() % 2 == 0 ? 5 : 0;
      }
      const absl::Status st = DecodeImage(m, req).status();
      EXPECT_TRUE(st.ok() || st.code() == kInvalid) << st;
    }
  }
}

TEST(CorruptInputTest, TruncatedAndCorruptPng) {
  const std::vector<uint8_t> px = SyntheticRgb(20, 30);
  const std::string png = EncodePng(20, 30, PNG_COLOR_TYPE_RGB, 8, px);
  for (size_t cut : {size_t{8}, size_t{30}, size_t{40}, png.size() / 2, png.size() - 20}) {
    EXPECT_EQ(DecodeImage(png.substr(0, cut)).status().code(), kInvalid) << "cut at " << cut;
  }
  EXPECT_STATUS(DecodeImage(png.substr(0, png.size() / 2)), kInvalid, "PNG");
  // A flipped byte in the image data fails the chunk's CRC.
  std::string bad = png;
  bad[png.size() / 2] = static_cast<char>(bad[png.size() / 2] ^ 0x10);
  EXPECT_STATUS(DecodeImage(bad), kInvalid, "PNG");
}

TEST(CorruptInputTest, HugeDimensionsRejectedBeforeDecoding) {
  // PNG claiming 70000 x 70000 (valid IHDR CRC).
  std::string png = EncodePng(2, 2, PNG_COLOR_TYPE_RGB, 8, SyntheticRgb(2, 2));
  PutBe32(png, 16, 70000);
  PutBe32(png, 20, 70000);
  PutBe32(png, 29, Crc32(reinterpret_cast<const uint8_t*>(png.data()) + 12, 17));
  ASSERT_OK_AND_ASSIGN(ImageInfo info, PeekImage(png));
  EXPECT_EQ(info.height, 70000);
  EXPECT_STATUS(DecodeImage(png), kInvalid, "decode limit");

  // PNG of 20000 x 20000: within 65535 a side, over 1 GiB of RGB.
  PutBe32(png, 16, 20000);
  PutBe32(png, 20, 20000);
  PutBe32(png, 29, Crc32(reinterpret_cast<const uint8_t*>(png.data()) + 12, 17));
  EXPECT_STATUS(DecodeImage(png), kInvalid, "decode limit");

  // JPEG whose frame header claims 65500 x 65500.
  std::string jpeg = TjEncode(SyntheticRgb(16, 16), 16, 16, TJPF_RGB, TJSAMP_420);
  const size_t sof = SofOffset(jpeg);
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = static_cast<char>(0xFF);
    jpeg[at + 1] = static_cast<char>(0xDC);
  }
  EXPECT_STATUS(DecodeImage(jpeg), kInvalid, "decode limit");
}

// ---------------------------------------------------------------------------
// Crop, Resize, FlipHorizontal, Normalize, CenterCrop
// ---------------------------------------------------------------------------

// 3 x 4 x 2 image whose value is 10 * y + x + 100 * c.
Tensor Grid() {
  std::vector<uint8_t> px;
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 4; ++x)
      px.insert(px.end(), {uint8_t(10 * y + x), uint8_t(100 + 10 * y + x)});
  }
  return Image(3, 4, 2, px);
}

TEST(CropTest, WholeRowsAreAViewElseACopy) {
  const Tensor img = Grid();
  ASSERT_OK_AND_ASSIGN(Tensor rows, Crop(img, Region{1, 0, 2, 4}));
  EXPECT_EQ(Dims(rows), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_EQ(rows.data(), img.data() + 8);  // shares the buffer
  EXPECT_EQ(rows.owner(), img.owner());
  EXPECT_EQ(Pixels(rows), (std::vector<uint8_t>{10, 110, 11, 111, 12, 112, 13, 113,  //
                                                20, 120, 21, 121, 22, 122, 23, 123}));
  ASSERT_OK_AND_ASSIGN(Tensor box, Crop(img, Region{1, 2, 2, 1}));
  EXPECT_EQ(Dims(box), (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(Pixels(box), (std::vector<uint8_t>{12, 112, 22, 122}));
  EXPECT_STATUS(Crop(img, Region{2, 0, 2, 4}), kInvalid, "does not lie inside");
  EXPECT_STATUS(Crop(img, Region{0, 3, 1, 2}), kInvalid, "does not lie inside");
  EXPECT_STATUS(Crop(Tensor::FromVector<float>({1.0f}), Region{0, 0, 1, 1}), kInvalid,
                "uint8 [height, width, channels]");
}

TEST(ResizeTest, HandComputedAntialiasedBilinear) {
  // 2x2 -> 1x1: the filter spans both pixels with weights 1/2, 1/2 on each
  // axis: rows (0+100)/2 = 50 and (200+60)/2 = 130, then (50+130)/2 = 90.
  ASSERT_OK_AND_ASSIGN(Tensor t, Resize(Image(2, 2, 1, {0, 100, 200, 60}), 1, 1));
  EXPECT_EQ(Dims(t), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{90}));

  // 4 -> 2 wide: support 2 around centers 1 and 3: taps {0,1,2} with
  // triangle weights 3/4, 3/4, 1/4 (normalized 3/7, 3/7, 1/7), and {1,2,3}
  // with 1/7, 3/7, 3/7: 200/7 = 28.6 -> 29 and 640/7 = 91.4 -> 91 (plain
  // bilinear would give 20 and 100).
  ASSERT_OK_AND_ASSIGN(t, Resize(Image(1, 4, 1, {0, 40, 80, 120}), 1, 2));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{29, 91}));
  // The same along the height, on 3 channels at once.
  ASSERT_OK_AND_ASSIGN(
      t, Resize(Image(4, 1, 3, {0, 1, 2, 40, 41, 42, 80, 81, 82, 120, 121, 122}), 2, 1));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{29, 30, 31, 91, 92, 93}));

  // 2 -> 4 wide: plain bilinear with half-pixel centers 0.25, 0.75, 1.25,
  // 1.75 and clamped edges: 0, 25, 75, 100.
  ASSERT_OK_AND_ASSIGN(t, Resize(Image(1, 2, 1, {0, 100}), 1, 4));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{0, 25, 75, 100}));
  // 2x2 -> 4x4 = outer product of those weights, rounded half up:
  // row 1 is 3/4 row 0 + 1/4 row 2.
  ASSERT_OK_AND_ASSIGN(t, Resize(Image(2, 2, 1, {0, 100, 200, 40}), 4, 4));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{0, 25, 75, 100,    //
                                             50, 59, 76, 85,    //
                                             150, 126, 79, 55,  //
                                             200, 160, 80, 40}));

  // Identity: the same pixels (shared, tensors being immutable).
  const Tensor grid = Grid();
  ASSERT_OK_AND_ASSIGN(t, Resize(grid, 3, 4));
  EXPECT_EQ(Pixels(t), Pixels(grid));

  EXPECT_STATUS(Resize(grid, 0, 4), kInvalid, "at least 1x1");
  EXPECT_STATUS(Resize(grid, 1, 70000), kInvalid, "at most 65535");
  EXPECT_STATUS(Resize(Image(1, 1, 5, {1, 2, 3, 4, 5}), 2, 2), kInvalid, "1 to 4 channels");
}

// A direct double-precision evaluation of the same filter: Pillow's
// coefficients, the horizontal pass then the vertical one, one rounding at
// the end (Pillow would also round the intermediate rows to uint8).
std::vector<uint8_t> ReferenceResize(const std::vector<uint8_t>& in, int h, int w, int c, int oh,
                                     int ow) {
  const auto weights = [](int in_size, int out_size, int o, int* first) {
    const double scale = static_cast<double>(in_size) / out_size;
    const double fs = std::max(scale, 1.0);
    const double center = (o + 0.5) * scale;
    const int lo = std::max(static_cast<int>(center - fs + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + fs + 0.5), in_size);
    std::vector<double> k;
    double total = 0;
    for (int x = lo; x < hi; ++x) {
      k.push_back(std::max(0.0, 1.0 - std::abs((x - center + 0.5) / fs)));
      total += k.back();
    }
    for (double& v : k) v /= total;
    *first = lo;
    return k;
  };
  std::vector<double> tmp(static_cast<size_t>(h) * ow * c);
  for (int y = 0; y < h; ++y) {
    for (int o = 0; o < ow; ++o) {
      int first = 0;
      const std::vector<double> k = weights(w, ow, o, &first);
      for (int ch = 0; ch < c; ++ch) {
        double s = 0;
        for (size_t t = 0; t < k.size(); ++t) {
          s += k[t] * in[(static_cast<size_t>(y) * w + first + t) * c + ch];
        }
        tmp[(static_cast<size_t>(y) * ow + o) * c + ch] = s;
      }
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(oh) * ow * c);
  for (int o = 0; o < oh; ++o) {
    int first = 0;
    const std::vector<double> k = weights(h, oh, o, &first);
    for (int j = 0; j < ow * c; ++j) {
      double s = 0;
      for (size_t t = 0; t < k.size(); ++t) s += k[t] * tmp[(first + t) * ow * c + j];
      out[static_cast<size_t>(o) * ow * c + j] =
          static_cast<uint8_t>(std::clamp(std::floor(s + 0.5), 0.0, 255.0));
    }
  }
  return out;
}

TEST(ResizeTest, MatchesDirectEvaluationOnEveryChannelCount) {
  std::mt19937 gen(17);
  const std::array<int, 4> sizes[] = {{37, 50, 22, 22}, {50, 37, 101, 80},    {9, 9, 9, 5},
                                      {8, 13, 8, 40},   {1, 7, 3, 2},         {64, 1, 7, 1},
                                      {3, 3, 1, 1},     {375, 500, 224, 224}, {17, 5, 17, 3}};
  for (int c = 1; c <= 4; ++c) {
    for (const auto& [h, w, oh, ow] : sizes) {
      std::vector<uint8_t> in(static_cast<size_t>(h) * w * c);
      for (uint8_t& v : in) v = static_cast<uint8_t>(gen());
      ASSERT_OK_AND_ASSIGN(Tensor t, Resize(Image(h, w, c, in), oh, ow));
      ASSERT_EQ(Dims(t), (std::vector<int64_t>{oh, ow, c}));
      const std::vector<uint8_t> want = ReferenceResize(in, h, w, c, oh, ow);
      // float sums may land on the other side of a .5 than double ones.
      int max_diff = 0;
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const int d = std::abs(int{t.data()[i]} - int{want[i]});
        max_diff = std::max(max_diff, d);
        differ += d != 0;
      }
      EXPECT_LE(max_diff, 1) << h << "x" << w << "x" << c << " -> " << oh << "x" << ow;
      EXPECT_LE(differ, std::max<size_t>(want.size() / 100, 8))
          << h << "x" << w << "x" << c << " -> " << oh << "x" << ow;
    }
  }
}

TEST(FlipHorizontalTest, MirrorsPixels) {
  ASSERT_OK_AND_ASSIGN(Tensor t, FlipHorizontal(Image(2, 3, 3,
                                                      {1, 2, 3, 4, 5, 6, 7, 8, 9,  //
                                                       10, 11, 12, 13, 14, 15, 16, 17, 18})));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{7, 8, 9, 4, 5, 6, 1, 2, 3,  //
                                             16, 17, 18, 13, 14, 15, 10, 11, 12}));
  ASSERT_OK_AND_ASSIGN(t, FlipHorizontal(Grid()));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{3,  103, 2,  102, 1,  101, 0,  100,  //
                                             13, 113, 12, 112, 11, 111, 10, 110,  //
                                             23, 123, 22, 122, 21, 121, 20, 120}));
}

TEST(NormalizeTest, ChannelsFirstFloat) {
  const std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  const std::array<float, 3> stddev = {0.229f, 0.224f, 0.225f};
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Normalize(Image(1, 2, 3, {0, 128, 255, 51, 102, 204}), mean, stddev));
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(Dims(t), (std::vector<int64_t>{3, 1, 2}));
  const auto v = t.values<float>();
  const float want[6] = {(0.0f - 0.485f) / 0.229f,         (0.2f - 0.485f) / 0.229f,
                         (128.0f / 255 - 0.456f) / 0.224f, (0.4f - 0.456f) / 0.224f,
                         (1.0f - 0.406f) / 0.225f,         (0.8f - 0.406f) / 0.225f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(v[i], want[i], 1e-6) << i;
  EXPECT_STATUS(Normalize(Grid(), mean, stddev), kInvalid, "3 channels");
  EXPECT_STATUS(Normalize(Image(1, 1, 3, {1, 2, 3}), mean, {1.0f, 0.0f, 1.0f}), kInvalid,
                "nonzero");
}

// A batch [B, H, W, 3] normalizes each image as Normalize of it alone would,
// into [B, 3, H, W].
TEST(NormalizeTest, ABatchNormalizesEachImageIntoBatchChannelsFirst) {
  const std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  const std::array<float, 3> stddev = {0.229f, 0.224f, 0.225f};
  const std::vector<uint8_t> a = {0, 128, 255, 51, 102, 204}, b = {9, 8, 7, 250, 1, 77};
  std::vector<uint8_t> both = a;
  both.insert(both.end(), b.begin(), b.end());
  ASSERT_OK_AND_ASSIGN(Tensor batch, Tensor::FromVector<uint8_t>(both).Reshape({2, 1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(Tensor out, Normalize(batch, mean, stddev));
  EXPECT_EQ(Dims(out), (std::vector<int64_t>{2, 3, 1, 2}));
  ASSERT_OK_AND_ASSIGN(Tensor one, Normalize(Image(1, 2, 3, a), mean, stddev));
  ASSERT_OK_AND_ASSIGN(Tensor two, Normalize(Image(1, 2, 3, b), mean, stddev));
  const auto v = out.values<float>();
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(v[i], one.values<float>()[i]) << i;
    EXPECT_EQ(v[6 + i], two.values<float>()[i]) << i;
  }
  ASSERT_OK_AND_ASSIGN(Tensor gray, Tensor::FromVector<uint8_t>({1, 2}).Reshape({2, 1, 1, 1}));
  EXPECT_STATUS(Normalize(gray, mean, stddev), kInvalid, "[batch, height, width, 3]");
  ASSERT_OK_AND_ASSIGN(Tensor rank5,
                       Tensor::FromVector<uint8_t>({1, 2, 3}).Reshape({1, 1, 1, 1, 3}));
  EXPECT_STATUS(Normalize(rank5, mean, stddev), kInvalid, "[height, width, 3]");
}

// Value 10 * y + x of an h x w x 1 image.
Tensor Ramp(int h, int w) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) px.push_back(static_cast<uint8_t>(10 * y + x));
  }
  return Image(h, w, 1, px);
}

TEST(CenterCropTest, TorchvisionOffsetsAndPadding) {
  // 5x5 -> 2x2: top = left = round(1.5) = 2.
  ASSERT_OK_AND_ASSIGN(Tensor t, CenterCrop(Ramp(5, 5), 2, 2));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{22, 23, 32, 33}));
  // 4x7 -> 3x2: top = round(0.5) = 0, left = round(2.5) = 2 (half to even).
  ASSERT_OK_AND_ASSIGN(t, CenterCrop(Ramp(4, 7), 3, 2));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{2, 3, 12, 13, 22, 23}));
  // 6x6 -> 3x3: top = left = round(1.5) = 2.
  ASSERT_OK_AND_ASSIGN(t, CenterCrop(Ramp(6, 6), 3, 3));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{22, 23, 24, 32, 33, 34, 42, 43, 44}));
  // Same size: the image.
  ASSERT_OK_AND_ASSIGN(t, CenterCrop(Ramp(3, 4), 3, 4));
  EXPECT_EQ(Pixels(t), Pixels(Ramp(3, 4)));
  // Smaller than the crop: zeros, (crop - size) // 2 before.
  // 2x3 -> 4x6: one row above, one column left.
  ASSERT_OK_AND_ASSIGN(t, CenterCrop(Ramp(2, 3), 4, 6));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{0, 0,  0,  0,  0, 0,  //
                                             0, 0,  1,  2,  0, 0,  //
                                             0, 10, 11, 12, 0, 0,  //
                                             0, 0,  0,  0,  0, 0}));
  // 1x1 -> 2x2: the odd pixel of padding goes after.
  ASSERT_OK_AND_ASSIGN(t, CenterCrop(Image(1, 1, 1, {9}), 2, 2));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{9, 0, 0, 0}));
  // Padded on one axis, cropped on the other: 3x10 -> 5x4: a row of zeros
  // above and below; columns from round(3) = 3.
  ASSERT_OK_AND_ASSIGN(t, CenterCrop(Ramp(3, 10), 5, 4));
  EXPECT_EQ(Pixels(t), (std::vector<uint8_t>{0,  0,  0,  0,   //
                                             3,  4,  5,  6,   //
                                             13, 14, 15, 16,  //
                                             23, 24, 25, 26,  //
                                             0,  0,  0,  0}));
  EXPECT_STATUS(CenterCrop(Ramp(3, 3), 0, 2), kInvalid, "at least 1x1");
}

// ---------------------------------------------------------------------------
// Random crop geometry and sizes
// ---------------------------------------------------------------------------

TEST(RngTest, DeterministicAndInRange) {
  Rng a(42), b(42), c(43);
  std::vector<uint64_t> va, vb, vc;
  for (int i = 0; i < 8; ++i) {
    va.push_back(a.NextU64());
    vb.push_back(b.NextU64());
    vc.push_back(c.NextU64());
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  // splitmix64's published first output for seed 0.
  EXPECT_EQ(Rng(0).NextU64(), 0xE220A8397B1DCDAFull);
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const double u = a.Uniform(-2.0, 3.0);
    EXPECT_GE(u, -2.0);
    EXPECT_LT(u, 3.0);
    const int64_t k = a.UniformInt(-3, 3);
    EXPECT_GE(k, -3);
    EXPECT_LE(k, 3);
    seen.insert(k);
    EXPECT_EQ(a.UniformInt(5, 5), 5);
  }
  EXPECT_EQ(seen.size(), 7u);
}

TEST(RandomResizedCropTest, InsideAndWithinScaleAndRatio) {
  for (const auto& [h, w] :
       {std::pair{375, 500}, std::pair{500, 375}, std::pair{224, 224}, std::pair{100, 1000}}) {
    std::set<std::array<int64_t, 4>> distinct;
    for (uint64_t seed = 0; seed < 500; ++seed) {
      Rng rng(seed);
      const Region r = RandomResizedCropRegion(rng, h, w);
      ASSERT_GE(r.top, 0);
      ASSERT_GE(r.left, 0);
      ASSERT_GE(r.height, 1);
      ASSERT_GE(r.width, 1);
      ASSERT_LE(r.top + r.height, h);
      ASSERT_LE(r.left + r.width, w);
      distinct.insert({r.top, r.left, r.height, r.width});
      Rng again(seed);
      const Region r2 = RandomResizedCropRegion(again, h, w);
      EXPECT_EQ(std::make_tuple(r.top, r.left, r.height, r.width),
                std::make_tuple(r2.top, r2.left, r2.height, r2.width));
      const bool fallback = r.top == (h - r.height) / 2 && r.left == (w - r.width) / 2 &&
                            (r.height == h || r.width == w);
      if (fallback) continue;
      // w and h are rounded: allow half a pixel on each.
      const double area = static_cast<double>(r.height) * r.width / (static_cast<double>(h) * w);
      const double slack = 0.5 / r.height + 0.5 / r.width;
      EXPECT_GE(area, 0.08 * (1 - 2 * slack));
      EXPECT_LE(area, 1.0);
      const double ratio = static_cast<double>(r.width) / r.height;
      EXPECT_GE(ratio, 3.0 / 4.0 * (1 - 2 * slack));
      EXPECT_LE(ratio, 4.0 / 3.0 * (1 + 2 * slack));
    }
    EXPECT_GT(distinct.size(), 100u) << h << "x" << w;
  }
}

TEST(RandomResizedCropTest, FallbackIsTorchvisionCenterCrop) {
  // No try fits a 1-pixel-high image: the ratio is clamped to 4/3, so
  // h = 1, w = round(4/3) = 1, at ((1 - 1) // 2, (1000 - 1) // 2).
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Rng rng(seed);
    const Region r = RandomResizedCropRegion(rng, 1, 1000);
    EXPECT_EQ(std::make_tuple(r.top, r.left, r.height, r.width), std::make_tuple(0, 499, 1, 1));
    Rng rng2(seed);
    const Region t = RandomResizedCropRegion(rng2, 1000, 1);
    EXPECT_EQ(std::make_tuple(t.top, t.left, t.height, t.width), std::make_tuple(499, 0, 1, 1));
  }
  // 3 x 1000 with scale (0.99, 1): no try fits (a 0.99 area crop would be
  // ~3 x 1000, ratio > 4/3): h = 3, w = round(3 * 4/3) = 4, left = 498.
  Rng rng(1);
  const Region r = RandomResizedCropRegion(rng, 3, 1000, {0.99, 1.0});
  EXPECT_EQ(std::make_tuple(r.top, r.left, r.height, r.width), std::make_tuple(0, 498, 3, 4));
  // No try can fit 1.5 times the area; a ratio range that holds the
  // image's gives the whole image.
  Rng rng3(1);
  const Region whole = RandomResizedCropRegion(rng3, 3, 1000, {1.5, 1.5}, {0.1, 1000.0});
  EXPECT_EQ(std::make_tuple(whole.top, whole.left, whole.height, whole.width),
            std::make_tuple(0, 0, 3, 1000));
}

TEST(ResizedSizeTest, MatchesTorchvision) {
  EXPECT_EQ(ResizedSize(375, 500, 256), (std::array<int64_t, 2>{256, 341}));
  EXPECT_EQ(ResizedSize(500, 375, 256), (std::array<int64_t, 2>{341, 256}));
  EXPECT_EQ(ResizedSize(256, 256, 224), (std::array<int64_t, 2>{224, 224}));
  EXPECT_EQ(ResizedSize(333, 500, 256), (std::array<int64_t, 2>{256, 384}));  // 384.38
  EXPECT_EQ(ResizedSize(100, 300, 256), (std::array<int64_t, 2>{256, 768}));
}

}  // namespace
}  // namespace sluice::internal::image
