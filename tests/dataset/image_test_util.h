// Helpers for image tests: synthetic RGB pixels, their JPEG encoding and
// libjpeg's own decode of it (TurboJPEG), and image files on disk.
#pragma once

#include <turbojpeg.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace sluice_test {

// A gradient with noise: every 8x8 block differs, chroma varies.
inline std::vector<uint8_t> SyntheticRgb(int h, int w, uint32_t seed = 1) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> noise(-20, 20);
  std::vector<uint8_t> px(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const int base[3] = {x * 255 / std::max(w - 1, 1), y * 255 / std::max(h - 1, 1),
                           (x + y) * 127 / std::max(h + w - 2, 1) + 64};
      for (int c = 0; c < 3; ++c) {
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(base[c] + noise(gen), 0, 255));
      }
    }
  }
  return px;
}

// tjCompress2 of packed pixels (pixel format `pf`).
inline std::string TjEncode(const std::vector<uint8_t>& px, int h, int w, int pf = TJPF_RGB,
                            int subsamp = TJSAMP_420, int quality = 90, int flags = 0) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int)
  const int rc = tjCompress2(tj, px.data(), w, 0, h, pf, &buf, &size, subsamp, quality, flags);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  std::string out(reinterpret_cast<const char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// tjDecompress2 with flags 0 into pixel format `pf`; `width`/`height` 0
// for full size, else the scaled size TurboJPEG picks (the largest scaling
// factor that fits).
inline std::vector<uint8_t> TjDecode(const std::string& jpeg, int pf, int* height, int* width) {
  tjhandle tj = tjInitDecompress();
  int w = 0, h = 0, subsamp = 0, cs = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  EXPECT_EQ(tjDecompressHeader3(tj, data, jpeg.size(), &w, &h, &subsamp, &cs), 0);
  int n = 0;
  tjscalingfactor* factors = tjGetScalingFactors(&n);
  int out_w = w, out_h = h;
  if (*width > 0) {
    for (int i = 0; i < n; ++i) {  // listed largest first
      const int sw = TJSCALED(w, factors[i]), sh = TJSCALED(h, factors[i]);
      if (sw <= *width && sh <= *height) {
        out_w = sw;
        out_h = sh;
        break;
      }
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(out_w) * out_h * tjPixelSize[pf]);
  EXPECT_EQ(tjDecompress2(tj, data, jpeg.size(), out.data(), out_w, 0, out_h, pf, 0), 0)
      << tjGetErrorStr2(tj);
  tjDestroy(tj);
  *width = out_w;
  *height = out_h;
  return out;
}

inline std::vector<uint8_t> TjDecodeFull(const std::string& jpeg, int pf) {
  int h = 0, w = 0;
  return TjDecode(jpeg, pf, &h, &w);
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace sluice_test
