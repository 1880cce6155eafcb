// Image kernels (image_kernels_internal.h).
//
// Decoding. libjpeg and libpng report errors by longjmp. Every function that
// calls setjmp here (the *Phase functions) is C-like: its parameters and
// locals are trivial, so the jump skips no destructor. The C++ code around
// them owns the decoder state (JpegDecoder, PngDecoder: RAII, destroyed on
// every path) and all buffers, which it allocates between phases.
//
// JPEG choices:
//   - Output is always RGB. Grayscale is replicated by libjpeg. CMYK and
//     YCCK are decoded as CMYK and converted here, as libjpeg-turbo's own
//     cmyk_to_rgb (cdjpeg) and Pillow do: an Adobe file stores inverted CMYK
//     (R = C * K / 255); a file without the Adobe marker plain CMYK
//     (R = (255 - C) * (255 - K) / 255).
//   - libjpeg warnings (recoverable corruption, premature end of data) are
//     errors, as TurboJPEG's TJFLAG_STOPONWARNING makes them.
//   - A region is decoded with jpeg_crop_scanline and jpeg_skip_scanlines,
//     and decoding stops (jpeg_abort_decompress) after its last row. The
//     columns asked of jpeg_crop_scanline are widened by one pixel on each
//     side that is not the image's edge: with fancy (triangle) chroma
//     upsampling, libjpeg treats the first and last decoded column as the
//     image edge, so the pixel next to a crop edge would differ from the
//     full decode. One pixel of margin keeps the region exact.
//   - Scaling: the smallest M/8 (M in 1..8) whose scaled region keeps the
//     requested minimum size. The scaled region's edges are the full-size
//     edges times M/8 rounded to nearest (half up); an edge on the image's
//     border maps to the scaled border (libjpeg's output size rounds up).
//
// PNG: libpng's classic API; 16-bit samples keep their high byte (as Pillow
// reads RGB;16B), alpha is dropped without compositing (Pillow's
// convert('RGB')), palettes and gray are expanded, tRNS is ignored, warnings
// are ignored (ancillary chunk problems), errors are InvalidArgument.
//
// Resize uses Pillow's BILINEAR coefficients (ImagingResample's
// precompute_coeffs: a triangle filter whose support widens by the scale
// when downsampling, normalized per output column/row) and its order: the
// horizontal pass, then the vertical one. Unlike Pillow it keeps the
// intermediate rows in float (a ring of as many rows as one output row
// has taps, made as they are first needed) and rounds once, half up, at
// the end, so results may differ from Pillow's by 1 where Pillow's
// intermediate rounding tips a value. Pixels are 4-lane float vectors in
// the horizontal pass (any channel count 1..4); the vertical pass runs
// over whole rows, 16 samples at a time.
#include "sluice/dataset/image_kernels_internal.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
#include <png.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/core/status.h"

namespace sluice::internal::image {
namespace {

// Decode limits (decompression bombs): per side, and the RGB output.
constexpr int64_t kMaxSide = 65535;
constexpr int64_t kMaxImageBytes = int64_t{1} << 30;

absl::StatusOr<Tensor> AllocateImage(int64_t height, int64_t width, int64_t channels) {
  return Tensor::Allocate(DType::kUInt8, TensorShape({height, width, channels}),
                          /*zeroed=*/false);
}

absl::Status CheckDecodeSize(int64_t height, int64_t width) {
  if (height <= 0 || width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image header gives an empty size ", height, "x", width));
  }
  if (height > kMaxSide || width > kMaxSide || height * width * 3 > kMaxImageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", height, "x", width, " pixels exceeds the decode limit (", kMaxSide,
        " pixels a side and 1 GiB of RGB pixels); is it a decompression bomb?"));
  }
  return absl::OkStatus();
}

// [H, W, C] of a uint8 image tensor.
struct Hwc {
  int64_t h = 0, w = 0, c = 0;
};

absl::StatusOr<Hwc> CheckImage(const Tensor& img, const char* op) {
  if (!img.valid() || img.dtype() != DType::kUInt8 || img.shape().rank() != 3 ||
      img.shape().dim(2) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": expects a uint8 [height, width, channels] image, got ",
                     img.valid() ? img.shape().ToString() : "an invalid tensor"));
  }
  return Hwc{img.shape().dim(0), img.shape().dim(1), img.shape().dim(2)};
}

absl::Status CheckRegion(const Region& r, int64_t height, int64_t width, const char* what) {
  if (r.height < 1 || r.width < 1 || r.top < 0 || r.left < 0 || r.top > height - r.height ||
      r.left > width - r.width) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": region (top=", r.top, ", left=", r.left,
                                                   ", height=", r.height, ", width=", r.width,
                                                   ") is empty or does not lie inside the ", height,
                                                   "x", width, " image"));
  }
  return absl::OkStatus();
}

uint32_t ReadBe16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t ReadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool LooksLikeJpeg(std::string_view b) {
  return b.size() >= 2 && static_cast<uint8_t>(b[0]) == 0xFF && static_cast<uint8_t>(b[1]) == 0xD8;
}
bool LooksLikePng(std::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0;
}

absl::StatusOr<ImageInfo> PeekJpeg(const uint8_t* b, size_t n) {
  const auto truncated = [] {
    return absl::InvalidArgumentError("JPEG header is cut short (no frame header)");
  };
  size_t pos = 2;  // after SOI
  while (true) {
    if (pos >= n) return truncated();
    if (b[pos] != 0xFF) {
      return absl::InvalidArgumentError("corrupt JPEG header: expected a marker");
    }
    while (pos < n && b[pos] == 0xFF) ++pos;  // fill bytes
    if (pos >= n) return truncated();
    const uint8_t m = b[pos++];
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue;  // TEM, RSTn, SOI: no length
    if (m == 0xD9 || m == 0xDA) {
      return absl::InvalidArgumentError("corrupt JPEG: no frame header before the image data");
    }
    if (pos + 2 > n) return truncated();
    const uint32_t len = ReadBe16(b + pos);
    if (len < 2) return absl::InvalidArgumentError("corrupt JPEG header: bad segment length");
    const bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof) {
      // length, precision, height, width, components
      if (len < 8) return absl::InvalidArgumentError("corrupt JPEG frame header");
      if (pos + 7 > n) return truncated();
      ImageInfo info;
      info.format = ImageFormat::kJpeg;
      info.height = ReadBe16(b + pos + 3);
      info.width = ReadBe16(b + pos + 5);
      if (info.height == 0 || info.width == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("JPEG frame header gives an empty size ", info.height, "x", info.width));
      }
      return info;
    }
    pos += len;
  }
}

absl::StatusOr<ImageInfo> PeekPng(const uint8_t* b, size_t n) {
  // signature, IHDR length (13), "IHDR", width, height
  if (n < 24) return absl::InvalidArgumentError("PNG header is cut short");
  if (ReadBe32(b + 8) != 13 || std::memcmp(b + 12, "IHDR", 4) != 0) {
    return absl::InvalidArgumentError("corrupt PNG: the first chunk is not IHDR");
  }
  const uint32_t w = ReadBe32(b + 16), h = ReadBe32(b + 20);
  if (w == 0 || h == 0 || w > 0x7fffffffu || h > 0x7fffffffu) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG: bad size ", h, "x", w));
  }
  return ImageInfo{ImageFormat::kPng, static_cast<int64_t>(h), static_cast<int64_t>(w)};
}

// ---------------------------------------------------------------------------
// JPEG
// ---------------------------------------------------------------------------

struct JpegErrorManager {
  jpeg_error_mgr pub;  // first: libjpeg sees a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Level < 0: a warning, i.e. corrupt data libjpeg could recover from; an
// error for us. Level >= 0: trace messages, ignored.
void JpegEmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) JpegErrorExit(cinfo);
}

void JpegOutputMessage(j_common_ptr) {}

// Owns one decompressor. Trivial members only, so that the phases may keep
// pointers into it across a longjmp.
class JpegDecoder final {
 public:
  JpegDecoder() {
    std::memset(&cinfo_, 0, sizeof(cinfo_));
    std::memset(&err_, 0, sizeof(err_));
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = JpegErrorExit;
    err_.pub.emit_message = JpegEmitMessage;
    err_.pub.output_message = JpegOutputMessage;
  }
  // jpeg_destroy is safe on a zeroed, partly or fully created decompressor.
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo_); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  jpeg_decompress_struct* cinfo() { return &cinfo_; }
  JpegErrorManager* err() { return &err_; }
  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrCat("corrupt or unsupported JPEG: ", err_.message));
  }

 private:
  jpeg_decompress_struct cinfo_;
  JpegErrorManager err_;
};

// Phase 1: create, attach the bytes and read the header.
bool JpegReadHeaderPhase(jpeg_decompress_struct* cinfo, JpegErrorManager* err, const uint8_t* data,
                         size_t size) {
  if (setjmp(err->jump)) return false;
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));  // NOLINT(runtime/int)
  jpeg_read_header(cinfo, TRUE);
  return true;
}

bool JpegCalcOutputDimensionsPhase(jpeg_decompress_struct* cinfo, JpegErrorManager* err,
                                   unsigned int scale_num) {
  if (setjmp(err->jump)) return false;
  cinfo->scale_num = scale_num;
  cinfo->scale_denom = 8;
  jpeg_calc_output_dimensions(cinfo);
  return true;
}

// What phase 2 decodes, in output (scaled) pixels. Trivially destructible.
struct JpegRows {
  unsigned int top = 0, bottom = 0;            // rows [top, bottom)
  unsigned int left = 0, right = 0;            // columns [left, right) returned
  unsigned int crop_left = 0, crop_right = 0;  // columns asked of jpeg_crop_scanline
  bool cmyk = false;
  bool adobe = false;
  uint8_t* out = nullptr;      // (bottom - top) x (right - left) x 3
  uint8_t* scratch = nullptr;  // kScratchRows x output_width x 4, when not direct
};

constexpr int kScratchRows = 8;

// Converts (CMYK) or copies (RGB) `n` decoded rows of `crop_width` pixels,
// starting at column `skip`, into RGB rows of `width` pixels.
void JpegConvertRows(const JpegRows& job, const uint8_t* scratch, unsigned int crop_width,
                     unsigned int skip, unsigned int width, unsigned int n, uint8_t* out) {
  for (unsigned int r = 0; r < n; ++r) {
    const uint8_t* __restrict src =
        scratch + static_cast<size_t>(r) * crop_width * (job.cmyk ? 4 : 3);
    uint8_t* __restrict dst = out + static_cast<size_t>(r) * width * 3;
    if (!job.cmyk) {
      std::memcpy(dst, src + static_cast<size_t>(skip) * 3, static_cast<size_t>(width) * 3);
      continue;
    }
    src += static_cast<size_t>(skip) * 4;
    for (unsigned int x = 0; x < width; ++x, src += 4, dst += 3) {
      const unsigned int k = job.adobe ? src[3] : 255u - src[3];
      for (int c = 0; c < 3; ++c) {
        const unsigned int v = job.adobe ? src[c] : 255u - src[c];
        dst[c] = static_cast<uint8_t>((v * k + 127) / 255);
      }
    }
  }
}

// Phase 2: decompress rows [top, bottom) and the chosen columns, then stop.
bool JpegDecodePhase(jpeg_decompress_struct* cinfo, JpegErrorManager* err, const JpegRows* job) {
  if (setjmp(err->jump)) return false;
  jpeg_start_decompress(cinfo);
  JDIMENSION xoffset = job->crop_left;
  JDIMENSION crop_width = job->crop_right - job->crop_left;
  if (xoffset > 0 || crop_width < cinfo->output_width) {
    jpeg_crop_scanline(cinfo, &xoffset, &crop_width);  // widens to iMCU columns
  }
  const unsigned int width = job->right - job->left;
  const unsigned int skip = job->left - xoffset;
  const bool direct = !job->cmyk && skip == 0 && crop_width == width;
  if (job->top > 0 && jpeg_skip_scanlines(cinfo, job->top) != job->top) {
    std::snprintf(err->message, sizeof(err->message), "cannot skip to row %u", job->top);
    return false;
  }
  const size_t out_row_bytes = static_cast<size_t>(width) * 3;
  const size_t scratch_row_bytes = static_cast<size_t>(crop_width) * (job->cmyk ? 4 : 3);
  JSAMPROW rows[kScratchRows];
  while (cinfo->output_scanline < job->bottom) {
    const unsigned int y = cinfo->output_scanline;
    const unsigned int n = std::min<unsigned int>(kScratchRows, job->bottom - y);
    uint8_t* out = job->out + (y - job->top) * out_row_bytes;
    for (unsigned int r = 0; r < n; ++r) {
      rows[r] = direct ? out + r * out_row_bytes : job->scratch + r * scratch_row_bytes;
    }
    const JDIMENSION got = jpeg_read_scanlines(cinfo, rows, n);
    if (got == 0) {
      std::snprintf(err->message, sizeof(err->message), "no data for row %u", y);
      return false;
    }
    if (!direct) JpegConvertRows(*job, job->scratch, crop_width, skip, width, got, out);
  }
  jpeg_abort_decompress(cinfo);  // nothing below the region is decoded
  return true;
}

// x * m / 8 rounded half up.
int64_t ScaleEdge(int64_t x, int64_t m) { return (x * m + 4) / 8; }

struct ScaledSpan {
  int64_t begin = 0, end = 0;
};

// [begin, end) of a full-size image of `size` pixels in the scaled one of
// `scaled_size`: rounded edges, the image's border kept, at least 1 pixel.
ScaledSpan ScaleSpan(int64_t begin, int64_t end, int64_t size, int64_t scaled_size, int64_t m) {
  ScaledSpan s;
  s.begin = std::min(ScaleEdge(begin, m), scaled_size - 1);
  s.end = end >= size ? scaled_size : std::min(ScaleEdge(end, m), scaled_size);
  if (s.end <= s.begin) s.end = s.begin + 1;
  return s;
}

absl::StatusOr<Tensor> DecodeJpeg(std::string_view bytes, const DecodeRequest& request) {
  JpegDecoder dec;
  jpeg_decompress_struct* cinfo = dec.cinfo();
  if (!JpegReadHeaderPhase(cinfo, dec.err(), reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size())) {
    return dec.Error();
  }
  const int64_t height = cinfo->image_height, width = cinfo->image_width;
  SLUICE_RETURN_IF_ERROR(CheckDecodeSize(height, width));
  const Region region = request.region.value_or(Region{0, 0, height, width});
  if (request.region.has_value()) {
    SLUICE_RETURN_IF_ERROR(CheckRegion(region, height, width, "JPEG decode"));
  }

  JpegRows job;
  job.cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  job.adobe = cinfo->saw_Adobe_marker;
  cinfo->out_color_space = job.cmyk ? JCS_CMYK : JCS_RGB;

  // The smallest scale M/8 that keeps the region at least the minimum size.
  ScaledSpan rows, cols;
  const bool may_scale = request.min_height > 0 || request.min_width > 0;
  for (int64_t m = may_scale ? 1 : 8; m <= 8; ++m) {
    if (!JpegCalcOutputDimensionsPhase(cinfo, dec.err(), static_cast<unsigned int>(m))) {
      return dec.Error();
    }
    rows = ScaleSpan(region.top, region.top + region.height, height, cinfo->output_height, m);
    cols = ScaleSpan(region.left, region.left + region.width, width, cinfo->output_width, m);
    if (m == 8 || (rows.end - rows.begin >= request.min_height &&
                   cols.end - cols.begin >= request.min_width)) {
      break;
    }
  }
  const int64_t out_width = cinfo->output_width;
  job.top = static_cast<unsigned int>(rows.begin);
  job.bottom = static_cast<unsigned int>(rows.end);
  job.left = static_cast<unsigned int>(cols.begin);
  job.right = static_cast<unsigned int>(cols.end);
  job.crop_left = job.left > 0 ? job.left - 1 : 0;
  job.crop_right = static_cast<unsigned int>(std::min<int64_t>(job.right + 1, out_width));

  SLUICE_ASSIGN_OR_RETURN(Tensor out,
                          AllocateImage(rows.end - rows.begin, cols.end - cols.begin, 3));
  std::unique_ptr<uint8_t[]> scratch;
  if (job.cmyk || job.left > 0 || job.right < out_width) {
    scratch = std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(kScratchRows) *
                                                        out_width * 4);
  }
  job.out = out.mutable_data();
  job.scratch = scratch.get();
  if (!JpegDecodePhase(cinfo, dec.err(), &job)) return dec.Error();
  return out;
}

// ---------------------------------------------------------------------------
// PNG
// ---------------------------------------------------------------------------

struct PngSource {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[256] = {};
};

void PngError(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", msg);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "data is cut short");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

// Owns a libpng read struct and its info struct.
class PngDecoder final {
 public:
  PngDecoder() = default;
  ~PngDecoder() {
    if (png_ != nullptr) png_destroy_read_struct(&png_, &info_, nullptr);
  }
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;

  bool Create(std::string_view bytes) {
    src_.data = reinterpret_cast<const uint8_t*>(bytes.data());
    src_.size = bytes.size();
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src_, PngError, PngWarning);
    if (png_ == nullptr) return false;
    info_ = png_create_info_struct(png_);
    if (info_ == nullptr) return false;
    png_set_read_fn(png_, &src_, PngRead);
    return true;
  }
  png_structp png() const { return png_; }
  png_infop info() const { return info_; }
  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrCat("corrupt or unsupported PNG: ", src_.message));
  }

 private:
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
  PngSource src_;
};

bool PngReadInfoPhase(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  return true;
}

// Sets the transforms to 8-bit RGB and reads every row (every pass when
// interlaced) into `out` (height x width x 3). Returns false on error; sets
// *bad_row_bytes when libpng's row size is not width * 3.
bool PngDecodePhase(png_structp png, png_infop info, uint8_t* out, bool* bad_row_bytes) {
  if (setjmp(png_jmpbuf(png))) return false;
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if ((color_type & PNG_COLOR_MASK_COLOR) == 0) {
    if (bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_gray_to_rgb(png);
  }
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  if (png_get_rowbytes(png, info) != row_bytes || png_get_channels(png, info) != 3 ||
      png_get_bit_depth(png, info) != 8) {
    *bad_row_bytes = true;
    return false;
  }
  for (int p = 0; p < passes; ++p) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, out + y * row_bytes, nullptr);
  }
  return true;
}

absl::StatusOr<Tensor> DecodePng(std::string_view bytes, const DecodeRequest& request) {
  PngDecoder dec;
  if (!dec.Create(bytes)) return absl::ResourceExhaustedError("cannot create a PNG decoder");
  if (!PngReadInfoPhase(dec.png(), dec.info())) return dec.Error();
  const int64_t height = png_get_image_height(dec.png(), dec.info());
  const int64_t width = png_get_image_width(dec.png(), dec.info());
  SLUICE_RETURN_IF_ERROR(CheckDecodeSize(height, width));
  if (request.region.has_value()) {
    SLUICE_RETURN_IF_ERROR(CheckRegion(*request.region, height, width, "PNG decode"));
  }
  SLUICE_ASSIGN_OR_RETURN(Tensor out, AllocateImage(height, width, 3));
  bool bad_row_bytes = false;
  if (!PngDecodePhase(dec.png(), dec.info(), out.mutable_data(), &bad_row_bytes)) {
    if (bad_row_bytes) {
      return absl::InvalidArgumentError("unsupported PNG: cannot convert it to 8-bit RGB");
    }
    return dec.Error();
  }
  if (request.region.has_value()) return Crop(out, *request.region);
  return out;
}

// ---------------------------------------------------------------------------
// Resize
// ---------------------------------------------------------------------------

// Four float lanes: one pixel of up to 4 channels, or 4 samples of a row.
// GCC/Clang vector extensions: SSE2 on x86-64, NEON on Arm, scalar code
// elsewhere.
typedef float F32x4 __attribute__((vector_size(16)));

inline F32x4 Load4(const float* p) {
  F32x4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store4(float* p, F32x4 v) { std::memcpy(p, &v, sizeof(v)); }

// Per output position o: input taps [first[o], first[o] + count[o]) with
// weights k[o * ksize + t] (normalized; zero past count[o]).
struct ResampleFilter {
  int ksize = 0;
  int max_count = 0;
  std::vector<int> first, count;
  std::vector<float> k;
  std::vector<F32x4> k4;  // k with each weight in 4 lanes
};

// Pillow's precompute_coeffs for the bilinear (triangle) filter.
ResampleFilter MakeFilter(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle's support is 1
  ResampleFilter f;
  f.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  f.first.resize(out_size);
  f.count.resize(out_size);
  f.k.assign(static_cast<size_t>(out_size) * f.ksize, 0.0f);
  std::vector<double> w(f.ksize);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int n = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double total = 0;
    for (int x = 0; x < n; ++x) {
      const double d = std::abs((x + xmin - center + 0.5) / filterscale);
      w[x] = d < 1.0 ? 1.0 - d : 0.0;
      total += w[x];
    }
    float* k = &f.k[static_cast<size_t>(o) * f.ksize];
    for (int x = 0; x < n; ++x) k[x] = static_cast<float>(total != 0.0 ? w[x] / total : 0.0);
    f.first[o] = xmin;
    f.count[o] = std::max(n, 0);
    f.max_count = std::max(f.max_count, f.count[o]);
  }
  f.k4.resize(f.k.size());
  for (size_t i = 0; i < f.k.size(); ++i) f.k4[i] = F32x4{f.k[i], f.k[i], f.k[i], f.k[i]};
  return f;
}

// uint8 -> float, n samples.
void WidenRow(const uint8_t* __restrict in, float* __restrict out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int u = 0; u < 16; ++u) out[i + u] = in[i + u];
  }
  for (; i < n; ++i) out[i] = in[i];
}

// float -> uint8, rounded half up and clamped.
inline uint8_t ToU8(float v) {
  return static_cast<uint8_t>(static_cast<int>(std::min(std::max(v + 0.5f, 0.0f), 255.0f)));
}

// 16 floats -> uint8 as ToU8 does. On x86 the saturating packs clamp (the
// generic narrowing GCC emits for SSE2 costs more than the filter itself).
inline void Narrow16(F32x4 a0, F32x4 a1, F32x4 a2, F32x4 a3, uint8_t* out) {
#if defined(__SSE2__)
  const __m128 half = _mm_set1_ps(0.5f);
  // Truncation is the floor here: a sum below -0.5 (impossible with these
  // nonnegative weights) would still clamp to 0.
  const __m128i i0 = _mm_cvttps_epi32(_mm_add_ps(a0, half));
  const __m128i i1 = _mm_cvttps_epi32(_mm_add_ps(a1, half));
  const __m128i i2 = _mm_cvttps_epi32(_mm_add_ps(a2, half));
  const __m128i i3 = _mm_cvttps_epi32(_mm_add_ps(a3, half));
  const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(i0, i1), _mm_packs_epi32(i2, i3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bytes);
#else
  float acc[16];
  Store4(acc, a0);
  Store4(acc + 4, a1);
  Store4(acc + 8, a2);
  Store4(acc + 12, a3);
  for (int u = 0; u < 16; ++u) out[u] = ToU8(acc[u]);
#endif
}

void NarrowRow(const float* __restrict in, uint8_t* __restrict out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Narrow16(Load4(in + i), Load4(in + i + 4), Load4(in + i + 8), Load4(in + i + 12), out + i);
  }
  for (; i < n; ++i) out[i] = ToU8(in[i]);
}

// One row through the horizontal filter: `in` holds in_w pixels of
// `channels` floats and `out` receives out_w pixels. Each pixel is one
// 4-lane vector: loads and stores of 4 floats run up to 4 floats past a
// pixel, so both rows have kRowSlack floats of slack (stores go in
// increasing order, each overwriting the last one's spill).
constexpr int kRowSlack = 4;
template <int C>
void HorizontalRowC(const float* __restrict in, float* __restrict out, const ResampleFilter& f) {
  const int out_w = static_cast<int>(f.first.size());
  const int ksize = f.ksize;
  const int* __restrict first = f.first.data();
  const int* __restrict count = f.count.data();
  const F32x4* __restrict kk = f.k4.data();
  for (int o = 0; o < out_w; ++o) {
    const float* p = in + static_cast<int64_t>(first[o]) * C;
    const F32x4* k = kk + static_cast<int64_t>(o) * ksize;
    const int n = count[o];
    F32x4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int t = 0; t < n; ++t) acc += k[t] * Load4(p + t * C);
    Store4(out + static_cast<int64_t>(o) * C, acc);
  }
}

void HorizontalRow(const float* in, float* out, int channels, const ResampleFilter& f) {
  switch (channels) {
    case 1:
      return HorizontalRowC<1>(in, out, f);
    case 2:
      return HorizontalRowC<2>(in, out, f);
    case 3:
      return HorizontalRowC<3>(in, out, f);
    default:
      return HorizontalRowC<4>(in, out, f);
  }
}

// out[j] = sum_t k[t] * rows[t][j], rounded to uint8, for j < len.
void VerticalRow(const float* const* rows, const float* k, int n, int64_t len,
                 uint8_t* __restrict out) {
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    F32x4 a0 = {0.0f, 0.0f, 0.0f, 0.0f}, a1 = a0, a2 = a0, a3 = a0;
    for (int t = 0; t < n; ++t) {
      const float* r = rows[t] + j;
      const float kt = k[t];
      a0 += kt * Load4(r);
      a1 += kt * Load4(r + 4);
      a2 += kt * Load4(r + 8);
      a3 += kt * Load4(r + 12);
    }
    Narrow16(a0, a1, a2, a3, out + j);
  }
  for (; j < len; ++j) {
    float acc = 0.0f;
    for (int t = 0; t < n; ++t) acc += k[t] * rows[t][j];
    out[j] = ToU8(acc);
  }
}

// Python's round(): half to even. NaN gives 0 and magnitudes are capped at
// 2^62 (only degenerate crop arguments get there), so the cast is defined.
int64_t RoundHalfEven(double x) {
  if (std::isnan(x)) return 0;
  x = std::clamp(x, -0x1p62, 0x1p62);
  if (std::abs(x - std::trunc(x)) == 0.5) return static_cast<int64_t>(2.0 * std::round(x / 2.0));
  return static_cast<int64_t>(std::round(x));
}

}  // namespace

// ---------------------------------------------------------------------------
// Public functions
// ---------------------------------------------------------------------------

absl::StatusOr<ImageInfo> PeekImage(std::string_view bytes) {
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (LooksLikeJpeg(bytes)) return PeekJpeg(b, bytes.size());
  if (LooksLikePng(bytes)) return PeekPng(b, bytes.size());
  return absl::InvalidArgumentError(
      absl::StrCat("not a JPEG or PNG image (", bytes.size(), " bytes; unknown signature)"));
}

absl::StatusOr<Tensor> DecodeImage(std::string_view bytes, const DecodeRequest& request) {
  // The header first: format, and the size limit before libjpeg or libpng
  // allocate anything for the image.
  SLUICE_ASSIGN_OR_RETURN(const ImageInfo info, PeekImage(bytes));
  SLUICE_RETURN_IF_ERROR(CheckDecodeSize(info.height, info.width));
  if (info.format == ImageFormat::kJpeg) return DecodeJpeg(bytes, request);
  return DecodePng(bytes, request);
}

absl::StatusOr<Tensor> Crop(const Tensor& img, const Region& region) {
  SLUICE_ASSIGN_OR_RETURN(const Hwc s, CheckImage(img, "crop"));
  SLUICE_RETURN_IF_ERROR(CheckRegion(region, s.h, s.w, "crop"));
  const int64_t row_bytes = s.w * s.c;
  if (region.left == 0 && region.width == s.w) {
    const size_t bytes = static_cast<size_t>(region.height * row_bytes);
    return Tensor::View(DType::kUInt8, TensorShape({region.height, s.w, s.c}),
                        img.data() + region.top * row_bytes, bytes, img.owner());
  }
  SLUICE_ASSIGN_OR_RETURN(Tensor out, AllocateImage(region.height, region.width, s.c));
  const int64_t out_row_bytes = region.width * s.c;
  const uint8_t* src = img.data() + region.top * row_bytes + region.left * s.c;
  uint8_t* dst = out.mutable_data();
  for (int64_t y = 0; y < region.height; ++y) {
    std::memcpy(dst + y * out_row_bytes, src + y * row_bytes, out_row_bytes);
  }
  return out;
}

absl::StatusOr<Tensor> Resize(const Tensor& img, int64_t height, int64_t width) {
  SLUICE_ASSIGN_OR_RETURN(const Hwc s, CheckImage(img, "resize"));
  if (s.c > 4) {
    return absl::InvalidArgumentError(absl::StrCat("resize: supports 1 to 4 channels, got ", s.c));
  }
  if (s.h < 1 || s.w < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize: the image is empty (", s.h, "x", s.w, ")"));
  }
  // The filters' tables grow with the sides: bound them as decoding does.
  if (height < 1 || width < 1 || height > kMaxSide || width > kMaxSide ||
      height * width * s.c > kMaxImageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("resize: output size ", height, "x", width,
                                                   " must be at least 1x1, at most ", kMaxSide,
                                                   " a side and 1 GiB"));
  }
  if (s.h > kMaxSide || s.w > kMaxSide) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize: input of ", s.h, "x", s.w, " pixels exceeds ", kMaxSide, " a side"));
  }
  const bool horizontal = width != s.w;
  const bool vertical = height != s.h;
  if (!horizontal && !vertical) return img;  // tensors are immutable: share it

  SLUICE_ASSIGN_OR_RETURN(Tensor out, AllocateImage(height, width, s.c));
  const int channels = static_cast<int>(s.c);
  const int64_t in_len = s.w * s.c;     // samples in an input row
  const int64_t out_len = width * s.c;  // samples in an output row
  const uint8_t* src = img.data();
  uint8_t* dst = out.mutable_data();

  // Rows in float: the widened input row, and the horizontal pass's rows in
  // a ring that holds the taps of one output row (rows are made when first
  // needed; the taps' first rows never decrease).
  const ResampleFilter fh =
      horizontal ? MakeFilter(static_cast<int>(s.w), static_cast<int>(width)) : ResampleFilter();
  const ResampleFilter fv =
      vertical ? MakeFilter(static_cast<int>(s.h), static_cast<int>(height)) : ResampleFilter();
  const int ring = vertical ? fv.max_count : 1;
  const int64_t stride = out_len + kRowSlack;
  auto wide = std::make_unique<float[]>(horizontal ? in_len + kRowSlack : 0);  // zeroed slack
  auto rows = std::make_unique<float[]>(ring * stride);
  const auto make_row = [&](int64_t y, float* row) {
    if (horizontal) {
      WidenRow(src + y * in_len, wide.get(), in_len);
      HorizontalRow(wide.get(), row, channels, fh);
    } else {
      WidenRow(src + y * in_len, row, in_len);
    }
  };
  if (!vertical) {
    for (int64_t y = 0; y < s.h; ++y) {
      make_row(y, rows.get());
      NarrowRow(rows.get(), dst + y * out_len, out_len);
    }
    return out;
  }
  std::vector<const float*> taps(fv.max_count);
  int64_t next = 0;  // the next input row to make
  for (int64_t o = 0; o < height; ++o) {
    const int first = fv.first[o], n = fv.count[o];
    for (int64_t y = std::max<int64_t>(next, first); y < first + n; ++y) {
      make_row(y, rows.get() + (y % ring) * stride);
    }
    next = std::max<int64_t>(next, first + n);
    for (int t = 0; t < n; ++t) taps[t] = rows.get() + ((first + t) % ring) * stride;
    VerticalRow(taps.data(), &fv.k[static_cast<size_t>(o) * fv.ksize], n, out_len,
                dst + o * out_len);
  }
  return out;
}

namespace {

// Mirrors an h x w x c image from `img` into `out` (not overlapping).
void FlipRows(const uint8_t* img, uint8_t* out, const Hwc& s) {
  const int64_t row_bytes = s.w * s.c;
  for (int64_t y = 0; y < s.h; ++y) {
    const uint8_t* __restrict src = img + y * row_bytes;
    uint8_t* __restrict dst = out + y * row_bytes;
    if (s.c == 3) {
      for (int64_t x = 0; x < s.w; ++x) {
        const uint8_t* p = src + (s.w - 1 - x) * 3;
        dst[x * 3 + 0] = p[0];
        dst[x * 3 + 1] = p[1];
        dst[x * 3 + 2] = p[2];
      }
    } else {
      for (int64_t x = 0; x < s.w; ++x) {
        std::memcpy(dst + x * s.c, src + (s.w - 1 - x) * s.c, s.c);
      }
    }
  }
}

}  // namespace

absl::StatusOr<Tensor> FlipHorizontal(const Tensor& img) {
  SLUICE_ASSIGN_OR_RETURN(const Hwc s, CheckImage(img, "flip_horizontal"));
  SLUICE_ASSIGN_OR_RETURN(Tensor out, AllocateImage(s.h, s.w, s.c));
  FlipRows(img.data(), out.mutable_data(), s);
  return out;
}

absl::StatusOr<Tensor> FlipHorizontalBatch(const Tensor& batch, const std::vector<bool>& flip) {
  const auto& d = batch.shape().dims();
  if (batch.dtype() != DType::kUInt8 || d.size() != 4 || static_cast<size_t>(d[0]) != flip.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flip_horizontal: needs a uint8 [B, H, W, C] batch; got ",
                     batch.DebugString(0)));
  }
  SLUICE_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(DType::kUInt8, batch.shape(),
                                                       /*zeroed=*/false));
  const Hwc s{d[1], d[2], d[3]};
  const size_t image_bytes = static_cast<size_t>(d[1] * d[2] * d[3]);
  for (size_t b = 0; b < flip.size(); ++b) {
    const uint8_t* src = batch.data() + b * image_bytes;
    uint8_t* dst = out.mutable_data() + b * image_bytes;
    if (flip[b]) {
      FlipRows(src, dst, s);
    } else {
      std::memcpy(dst, src, image_bytes);
    }
  }
  return out;
}

absl::StatusOr<Tensor> Normalize(const Tensor& img, const std::array<float, 3>& mean,
                                 const std::array<float, 3>& stddev) {
  // One image [H, W, 3], or a batch of them [B, H, W, 3] (normalized after
  // Distribute, so that uint8 crosses the wire instead of 4x the float32).
  const bool batch = img.valid() && img.shape().rank() == 4;
  if (!img.valid() || img.dtype() != DType::kUInt8 || (img.shape().rank() != 3 && !batch) ||
      img.shape().dim(img.shape().rank() - 1) != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "normalize: expects 3 channels, in a uint8 [height, width, 3] image or a "
        "[batch, height, width, 3] batch of them, got ",
        img.valid() ? absl::StrCat(DTypeName(img.dtype()), " ", img.shape().ToString())
                    : "an invalid tensor"));
  }
  const int64_t n = batch ? img.shape().dim(0) : 1;
  const Hwc s{img.shape().dim(batch ? 1 : 0), img.shape().dim(batch ? 2 : 1), 3};
  for (float sd : stddev) {
    if (sd == 0.0f || !std::isfinite(sd)) {
      return absl::InvalidArgumentError("normalize: stddev must be finite and nonzero");
    }
  }
  // A table per channel: exactly (x / 255 - mean) / stddev in float.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v)
      lut[c][v] = (static_cast<float>(v) / 255.0f - mean[c]) / stddev[c];
  }
  SLUICE_ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Allocate(DType::kFloat32,
                       batch ? TensorShape({n, 3, s.h, s.w}) : TensorShape({3, s.h, s.w}),
                       /*zeroed=*/false));
  const int64_t plane = s.h * s.w;
  for (int64_t k = 0; k < n; ++k) {
    float* __restrict r = reinterpret_cast<float*>(out.mutable_data()) + k * 3 * plane;
    float* __restrict g = r + plane;
    float* __restrict b = g + plane;
    const uint8_t* __restrict src = img.data() + k * 3 * plane;
    for (int64_t i = 0; i < plane; ++i) {
      r[i] = lut[0][src[3 * i + 0]];
      g[i] = lut[1][src[3 * i + 1]];
      b[i] = lut[2][src[3 * i + 2]];
    }
  }
  return out;
}

uint64_t Rng::NextU64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::Uniform(double lo, double hi) {
  const double u = static_cast<double>(NextU64() >> 11) * 0x1.0p-53;  // [0, 1)
  const double v = lo + (hi - lo) * u;
  return v < hi ? v : lo;  // rounding may reach hi
}

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  if (range == 0) return static_cast<int64_t>(NextU64());  // the whole int64 range
  // Lemire's nearly divisionless method: unbiased.
  unsigned __int128 m = static_cast<unsigned __int128>(NextU64()) * range;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < range) {
    const uint64_t threshold = (0 - range) % range;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(NextU64()) * range;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + static_cast<uint64_t>(m >> 64));
}

Region RandomResizedCropRegion(Rng& rng, int64_t height, int64_t width, std::array<double, 2> scale,
                               std::array<double, 2> ratio) {
  if (height < 1 || width < 1)
    return Region{0, 0, std::max<int64_t>(height, 0), std::max<int64_t>(width, 0)};
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    const int64_t w = RoundHalfEven(std::sqrt(target_area * aspect));
    const int64_t h = RoundHalfEven(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = rng.UniformInt(0, height - h);
      const int64_t left = rng.UniformInt(0, width - w);
      return Region{top, left, h, w};
    }
  }
  // Fallback: the center crop with the ratio clamped into range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double min_ratio = std::min(ratio[0], ratio[1]), max_ratio = std::max(ratio[0], ratio[1]);
  int64_t w = width, h = height;
  if (in_ratio < min_ratio) {
    h = RoundHalfEven(static_cast<double>(w) / min_ratio);
  } else if (in_ratio > max_ratio) {
    w = RoundHalfEven(static_cast<double>(h) * max_ratio);
  }
  // Rounding keeps h <= height and w <= width; the clamp guards degenerate
  // ratio arguments (e.g. zero or negative).
  h = std::clamp<int64_t>(h, 1, std::max<int64_t>(height, 1));
  w = std::clamp<int64_t>(w, 1, std::max<int64_t>(width, 1));
  return Region{(height - h) / 2, (width - w) / 2, h, w};
}

absl::StatusOr<Tensor> CenterCrop(const Tensor& img, int64_t crop_height, int64_t crop_width) {
  SLUICE_ASSIGN_OR_RETURN(const Hwc s, CheckImage(img, "center_crop"));
  if (crop_height < 1 || crop_width < 1 || crop_height > kMaxImageBytes ||
      crop_width > kMaxImageBytes || crop_height * crop_width * s.c > kMaxImageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("center_crop: size ", crop_height, "x",
                                                   crop_width,
                                                   " must be at least 1x1 and at most 1 GiB"));
  }
  if (crop_height <= s.h && crop_width <= s.w) {
    return Crop(img, Region{RoundHalfEven((s.h - crop_height) / 2.0),
                            RoundHalfEven((s.w - crop_width) / 2.0), crop_height, crop_width});
  }
  // Padded with zeros (torchvision pads (crop - size) // 2 before, the rest
  // after, then crops at round((padded - crop) / 2)) along each axis.
  struct Axis {
    int64_t dst = 0, src = 0, count = 0;
  };
  const auto axis = [](int64_t size, int64_t crop) {
    if (crop > size) return Axis{(crop - size) / 2, 0, size};
    return Axis{0, RoundHalfEven((size - crop) / 2.0), crop};
  };
  const Axis ay = axis(s.h, crop_height), ax = axis(s.w, crop_width);
  SLUICE_ASSIGN_OR_RETURN(
      Tensor out, Tensor::Allocate(DType::kUInt8, TensorShape({crop_height, crop_width, s.c})));
  for (int64_t y = 0; y < ay.count; ++y) {
    std::memcpy(out.mutable_data() + ((ay.dst + y) * crop_width + ax.dst) * s.c,
                img.data() + ((ay.src + y) * s.w + ax.src) * s.c, ax.count * s.c);
  }
  return out;
}

std::array<int64_t, 2> ResizedSize(int64_t height, int64_t width, int64_t shorter_side) {
  if (height <= 0 || width <= 0) return {shorter_side, shorter_side};
  if (width <= height) {
    const auto long_side = static_cast<int64_t>(static_cast<double>(shorter_side * height) /
                                                static_cast<double>(width));
    return {long_side, shorter_side};
  }
  const auto long_side =
      static_cast<int64_t>(static_cast<double>(shorter_side * width) / static_cast<double>(height));
  return {shorter_side, long_side};
}

}  // namespace sluice::internal::image
