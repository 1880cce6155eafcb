// Helpers for image tests: synthetic RGB pixels and their JPEG encoding
// (TurboJPEG), and image files on disk.
#pragma once

#include <turbojpeg.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace sluice_test {

// height x width x 3 pixels: gradients plus a pseudo-random texture, so
// that JPEG does not compress them trivially. Deterministic for a seed.
inline std::vector<uint8_t> SyntheticRgb(int height, int width, uint32_t seed) {
  std::vector<uint8_t> px(static_cast<size_t>(height) * width * 3);
  uint32_t s = seed * 2654435761u + 1;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      s = s * 1664525u + 1013904223u;
      const int noise = static_cast<int>(s >> 27);  // 0..31
      uint8_t* p = &px[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>((x * 255 / (width > 1 ? width - 1 : 1) + noise) & 0xff);
      p[1] = static_cast<uint8_t>((y * 255 / (height > 1 ? height - 1 : 1) + noise) & 0xff);
      p[2] = static_cast<uint8_t>(((x + y) * 7 + seed * 31 + noise) & 0xff);
    }
  }
  return px;
}

// JPEG bytes of `rgb` (height x width x 3); empty on failure.
inline std::string EncodeJpeg(const std::vector<uint8_t>& rgb, int height, int width,
                              int quality = 90, int subsampling = TJSAMP_420) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  std::string out;
  if (tjCompress2(tj, rgb.data(), width, 0, height, TJPF_RGB, &buf, &size, subsampling, quality,
                  0) == 0) {
    out.assign(reinterpret_cast<const char*>(buf), size);
  }
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// What libjpeg itself decodes `jpeg` to (RGB, default flags), with its size.
inline std::vector<uint8_t> ReferenceDecode(const std::string& jpeg, int* height, int* width) {
  tjhandle tj = tjInitDecompress();
  int subsamp = 0, colorspace = 0;
  std::vector<uint8_t> px;
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  if (tjDecompressHeader3(tj, data, jpeg.size(), width, height, &subsamp, &colorspace) == 0) {
    px.resize(static_cast<size_t>(*height) * *width * 3);
    if (tjDecompress2(tj, data, jpeg.size(), px.data(), *width, 0, *height, TJPF_RGB, 0) != 0) {
      px.clear();
    }
  }
  tjDestroy(tj);
  return px;
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace sluice_test
