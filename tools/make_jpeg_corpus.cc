// sluice-make-jpeg-corpus: a synthetic ImageNet-like JPEG folder for
// benchmarks (sluice-perf images) and tests.
//
//   sluice-make-jpeg-corpus --out DIR --images N --classes K
//       [--width 500 --height 375 --quality 90 --seed S --threads T]
//
// Writes DIR/class_XXX/img_XXXXXX.jpg (image i in class i % K, so every
// class has an image when K <= N) and, last, DIR/corpus.txt: key=value lines
// with the parameters and totals. A corpus.txt therefore marks a complete
// corpus. DIR must be new or empty.
//
// The images look like photos to a JPEG coder: sizes within +-15 % of
// width x height, one in five in portrait orientation, content made of a
// smooth gradient, a few dozen shapes with their own shading, two scales of
// value-noise texture and per-pixel grain, encoded by TurboJPEG at
// `quality` with 4:2:0 chroma subsampling. At the defaults a file is about
// 60-120 KB, as ImageNet photos of that size at q90. Every image is a
// function of (seed, index) only: the same arguments give the same bytes,
// whatever --threads.
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string out;
  int64_t images = 0;
  int64_t classes = 0;
  int width = 500;
  int height = 375;
  int quality = 90;
  uint64_t seed = 0;
  int threads = 0;  // 0: the hardware's, at most 8
};

// SplitMix64: small, fast and the same on every platform (the standard
// library's distributions are not), which keeps the corpus reproducible.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  int64_t Int(int64_t n) { return static_cast<int64_t>(Uniform() * static_cast<double>(n)); }
  // Approximately standard normal (Irwin-Hall of 4), cheap enough per pixel.
  float Gauss() {
    const uint64_t a = Next();
    const uint64_t b = Next();
    const double s = static_cast<double>(a >> 32) + static_cast<double>(a & 0xffffffffu) +
                     static_cast<double>(b >> 32) + static_cast<double>(b & 0xffffffffu);
    return static_cast<float>((s * 0x1.0p-32 - 2.0) * 1.7320508);  // var(U) = 1/12
  }

 private:
  uint64_t state_;
};

// A random field on a grid of `cell`-pixel cells, bilinearly interpolated.
class ValueNoise {
 public:
  ValueNoise(Rng& rng, int width, int height, int cell)
      : cell_(cell), gw_(width / cell + 2), gh_(height / cell + 2) {
    grid_.resize(static_cast<size_t>(gw_) * gh_);
    for (float& v : grid_) v = static_cast<float>(rng.Uniform(-1.0, 1.0));
  }
  float At(int x, int y) const {
    const float fx = static_cast<float>(x) / cell_, fy = static_cast<float>(y) / cell_;
    const int ix = static_cast<int>(fx), iy = static_cast<int>(fy);
    const float tx = fx - ix, ty = fy - iy;
    const float* r0 = &grid_[static_cast<size_t>(iy) * gw_ + ix];
    const float* r1 = r0 + gw_;
    const float top = r0[0] + (r0[1] - r0[0]) * tx;
    const float bottom = r1[0] + (r1[1] - r1[0]) * tx;
    return top + (bottom - top) * ty;
  }

 private:
  int cell_, gw_, gh_;
  std::vector<float> grid_;
};

struct Shape {
  enum class Kind : uint8_t { kEllipse, kRectangle };
  Kind kind;
  float cx, cy, rx, ry, cos_a, sin_a;
  float color[3];
  float shade;  // brightness change across the shape
};

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Image `index` of the corpus, a function of (seed, index) only.
Image Render(const Args& a, int64_t index) {
  Rng rng(a.seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull +
          0x5851f42d4c957f2dull);
  Image im;
  im.width = std::max(16, static_cast<int>(std::lround(a.width * rng.Uniform(0.85, 1.15))));
  im.height = std::max(16, static_cast<int>(std::lround(a.height * rng.Uniform(0.85, 1.15))));
  if (rng.Uniform() < 0.2) std::swap(im.width, im.height);
  const int w = im.width, h = im.height;

  // Background: a gradient between two colors along a random direction.
  float c0[3], c1[3];
  for (int c = 0; c < 3; ++c) {
    c0[c] = static_cast<float>(rng.Uniform(20, 235));
    c1[c] = static_cast<float>(rng.Uniform(20, 235));
  }
  const double angle = rng.Uniform(0, 2 * M_PI);
  const float gx = static_cast<float>(std::cos(angle)), gy = static_cast<float>(std::sin(angle));
  const float span = std::fabs(gx) * w + std::fabs(gy) * h;

  std::vector<Shape> shapes(static_cast<size_t>(12 + rng.Int(20)));
  for (Shape& s : shapes) {
    s.kind = rng.Uniform() < 0.5 ? Shape::Kind::kEllipse : Shape::Kind::kRectangle;
    s.cx = static_cast<float>(rng.Uniform(0, w));
    s.cy = static_cast<float>(rng.Uniform(0, h));
    s.rx = static_cast<float>(rng.Uniform(0.03, 0.3) * std::min(w, h));
    s.ry = static_cast<float>(rng.Uniform(0.03, 0.3) * std::min(w, h));
    const double t = rng.Uniform(0, M_PI);
    s.cos_a = static_cast<float>(std::cos(t));
    s.sin_a = static_cast<float>(std::sin(t));
    for (float& c : s.color) c = static_cast<float>(rng.Uniform(0, 255));
    s.shade = static_cast<float>(rng.Uniform(-60, 60));
  }
  // Texture at two scales (foliage, fabric) and grain.
  const ValueNoise coarse(rng, w, h, 24), fine(rng, w, h, 2);
  const float coarse_amp = static_cast<float>(rng.Uniform(10, 30));
  const float fine_amp = static_cast<float>(rng.Uniform(10, 26));
  const float grain = static_cast<float>(rng.Uniform(5, 9));

  im.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    uint8_t* row = &im.rgb[static_cast<size_t>(y) * w * 3];
    for (int x = 0; x < w; ++x) {
      const float t =
          std::clamp(((x - w / 2.0f) * gx + (y - h / 2.0f) * gy) / span + 0.5f, 0.0f, 1.0f);
      float px[3] = {c0[0] + (c1[0] - c0[0]) * t, c0[1] + (c1[1] - c0[1]) * t,
                     c0[2] + (c1[2] - c0[2]) * t};
      for (const Shape& s : shapes) {  // later shapes cover earlier ones
        const float dx = x - s.cx, dy = y - s.cy;
        const float u = (dx * s.cos_a + dy * s.sin_a) / s.rx;
        const float v = (-dx * s.sin_a + dy * s.cos_a) / s.ry;
        const bool inside = s.kind == Shape::Kind::kEllipse
                                ? u * u + v * v <= 1.0f
                                : std::fabs(u) <= 1 && std::fabs(v) <= 1;
        if (!inside) continue;
        for (int c = 0; c < 3; ++c) px[c] = s.color[c] + s.shade * u;
      }
      const float texture = coarse_amp * coarse.At(x, y) + fine_amp * fine.At(x, y);
      const float luma_grain = grain * rng.Gauss();
      for (int c = 0; c < 3; ++c) {
        const float value = px[c] + texture + luma_grain + 0.5f * grain * rng.Gauss();
        row[x * 3 + c] = static_cast<uint8_t>(std::clamp(std::lround(value), 0l, 255l));
      }
    }
  }
  return im;
}

// One TurboJPEG compressor (its handle is freed with it).
class Compressor final {
 public:
  Compressor() : handle_(tjInitCompress()) {}
  ~Compressor() {
    if (handle_ != nullptr) tjDestroy(handle_);
  }
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  // JPEG bytes of `im`, or an empty vector with *error set.
  std::vector<uint8_t> Encode(const Image& im, int quality, std::string* error) {
    if (handle_ == nullptr) {
      *error = "tjInitCompress failed";
      return {};
    }
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(handle_, im.rgb.data(), im.width, 0, im.height, TJPF_RGB, &jpeg, &size,
                    TJSAMP_420, quality, 0) != 0) {
      *error = std::string("tjCompress2: ") + tjGetErrorStr2(handle_);
      if (jpeg != nullptr) tjFree(jpeg);
      return {};
    }
    std::vector<uint8_t> bytes(jpeg, jpeg + size);
    tjFree(jpeg);
    return bytes;
  }

 private:
  tjhandle handle_;
};

std::string ClassDir(const Args& a, int64_t cls) {
  char name[32];
  std::snprintf(name, sizeof(name), "class_%03lld", static_cast<long long>(cls));
  return a.out + "/" + name;
}

std::string ImagePath(const Args& a, int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "/img_%06lld.jpg", static_cast<long long>(index));
  return ClassDir(a, index % a.classes) + name;
}

bool WriteBytes(const std::string& path, const void* data, size_t size, std::string* error) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  const bool ok = std::fwrite(data, 1, size, f) == size;
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !ok) {
    *error = "cannot write " + path + ": " + std::strerror(ok ? errno : write_errno);
    return false;
  }
  return true;
}

// Argument errors, or "" when the arguments are usable.
std::string CheckArgs(const Args& a) {
  if (a.images < 1) return "--images must be at least 1";
  if (a.classes < 1) return "--classes must be at least 1";
  if (a.classes > a.images) {
    return "--classes " + std::to_string(a.classes) + " > --images " + std::to_string(a.images) +
           ": every class needs at least one image (torchvision's ImageFolder rejects an empty "
           "class)";
  }
  if (a.width < 16 || a.width > 8192 || a.height < 16 || a.height > 8192) {
    return "--width and --height must be within 16..8192";
  }
  if (a.quality < 1 || a.quality > 100) return "--quality must be within 1..100";
  if (a.threads < 0) return "--threads must be 0 (automatic) or more";
  return "";
}

// Creates DIR and the class directories; DIR must be new or empty.
std::string PrepareDirectories(const Args& a) {
  std::error_code ec;
  if (fs::exists(a.out, ec)) {
    if (!fs::is_directory(a.out, ec)) return a.out + " exists and is not a directory";
    if (!fs::is_empty(a.out, ec)) {
      return a.out +
             " is not empty: pass a new or empty directory (a corpus is never written "
             "over other files)";
    }
  }
  fs::create_directories(a.out, ec);
  if (ec) return "cannot create " + a.out + ": " + ec.message();
  for (int64_t c = 0; c < a.classes; ++c) {
    fs::create_directory(ClassDir(a, c), ec);
    if (ec) return "cannot create " + ClassDir(a, c) + ": " + ec.message();
  }
  return "";
}

int Run(const Args& a) {
  if (std::string e = CheckArgs(a); !e.empty()) {
    std::fprintf(stderr, "sluice-make-jpeg-corpus: %s\n", e.c_str());
    return 2;
  }
  if (std::string e = PrepareDirectories(a); !e.empty()) {
    std::fprintf(stderr, "sluice-make-jpeg-corpus: %s\n", e.c_str());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  const int threads = static_cast<int>(std::min<int64_t>(
      a.images, a.threads > 0 ? a.threads
                              : std::clamp<int>(
                                    static_cast<int>(std::thread::hardware_concurrency()), 1, 8)));
  std::atomic<int64_t> next{0}, done{0}, bytes{0}, pixels_w{0}, pixels_h{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::string error;  // the first failure; guarded by error_mu
  auto work = [&] {
    Compressor compressor;
    for (int64_t i = next++; i < a.images && !failed; i = next++) {
      const Image im = Render(a, i);
      std::string e;
      const std::vector<uint8_t> jpeg = compressor.Encode(im, a.quality, &e);
      if (jpeg.empty() || !WriteBytes(ImagePath(a, i), jpeg.data(), jpeg.size(), &e)) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!failed.exchange(true)) error = e;
        return;
      }
      bytes += static_cast<int64_t>(jpeg.size());
      pixels_w += im.width;
      pixels_h += im.height;
      ++done;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  // Progress for large corpora, on stderr, about every 2 seconds.
  if (a.images >= 256) {
    auto last = std::chrono::steady_clock::now();
    while (done < a.images && !failed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (std::chrono::steady_clock::now() - last >= std::chrono::seconds(2)) {
        last = std::chrono::steady_clock::now();
        std::fprintf(stderr, "sluice-make-jpeg-corpus: %lld/%lld images\n",
                     static_cast<long long>(done.load()), static_cast<long long>(a.images));
      }
    }
  }
  for (std::thread& t : pool) t.join();
  if (failed) {
    std::fprintf(stderr, "sluice-make-jpeg-corpus: %s\n", error.c_str());
    return 1;
  }
  const double n = static_cast<double>(a.images);
  char stamp[1024];
  std::snprintf(stamp, sizeof(stamp),
                "tool=sluice-make-jpeg-corpus\nimages=%lld\nclasses=%lld\nwidth=%d\nheight=%d\n"
                "quality=%d\nseed=%llu\ntotal_bytes=%lld\nmean_bytes=%.0f\nmean_width=%.1f\n"
                "mean_height=%.1f\n",
                static_cast<long long>(a.images), static_cast<long long>(a.classes), a.width,
                a.height, a.quality, static_cast<unsigned long long>(a.seed),
                static_cast<long long>(bytes.load()), static_cast<double>(bytes.load()) / n,
                static_cast<double>(pixels_w.load()) / n, static_cast<double>(pixels_h.load()) / n);
  std::string e;
  if (!WriteBytes(a.out + "/corpus.txt", stamp, std::strlen(stamp), &e)) {
    std::fprintf(stderr, "sluice-make-jpeg-corpus: %s\n", e.c_str());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "wrote %lld images in %lld classes to %s: %.1f MiB, mean %.1f KB, mean %.0fx%.0f, "
      "in %.1f s\n",
      static_cast<long long>(a.images), static_cast<long long>(a.classes), a.out.c_str(),
      static_cast<double>(bytes.load()) / (1 << 20), static_cast<double>(bytes.load()) / n / 1e3,
      static_cast<double>(pixels_w.load()) / n, static_cast<double>(pixels_h.load()) / n, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "sluice-make-jpeg-corpus: write a synthetic ImageNet-like JPEG folder "
      "(DIR/class_XXX/img_XXXXXX.jpg)"};
  Args a;
  app.add_option("--out", a.out, "the corpus directory (new or empty)")->required();
  app.add_option("--images", a.images, "number of images")->required();
  app.add_option("--classes", a.classes, "number of classes (subdirectories), at most --images")
      ->required();
  app.add_option("--width", a.width, "mean width; each image varies by up to 15 %")
      ->capture_default_str();
  app.add_option("--height", a.height, "mean height; one image in five is portrait")
      ->capture_default_str();
  app.add_option("--quality", a.quality, "JPEG quality (4:2:0 subsampling)")->capture_default_str();
  app.add_option("--seed", a.seed, "the same seed gives the same files")->capture_default_str();
  app.add_option("--threads", a.threads, "encoding threads (0: the cpus', at most 8)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return Run(a);
}
