// sluice-make-webdataset: WebDataset tar shards from an image folder (the
// output of sluice-make-jpeg-corpus, or any ROOT/<class>/<image> tree), for
// benchmarks (sluice-perf images --format webdataset) and tests.
//
//   sluice-make-webdataset --corpus DIR --out DIR [--samples_per_shard 1000 --seed S]
//
// Writes OUT/shard-000000.tar, ... and, last, OUT/webdataset.txt (key=value
// lines: shards, samples, classes, bytes), which therefore marks a complete
// set. OUT must be new or empty. The images are shuffled (seeded: the same
// arguments give the same shards), as WebDataset shards are written, so a
// shard mixes classes. Sample i of the shuffle has key "%08d" of i and two
// members: <key>.jpg (the image file's bytes, whatever its format) and
// <key>.cls (its class index as decimal text, classes numbered in sorted
// order of their directory names, as torchvision's ImageFolder does).
// A shard is assembled in memory before it is written (samples_per_shard
// images at a time).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "sluice/dataset/webdataset.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string corpus, out;
  int64_t samples_per_shard = 1000;
  uint64_t seed = 0;
};

struct Image {
  std::string path;
  int64_t label = 0;
};

bool IsImage(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The images under ROOT/<class>/, labelled by sorted class name; an error
// message when there are none or ROOT cannot be read.
std::string ListImages(const std::string& root, std::vector<Image>* images, int64_t* classes) {
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory()) dirs.push_back(e.path());
  }
  if (ec) return "cannot read " + root + ": " + ec.message();
  std::sort(dirs.begin(), dirs.end());
  for (size_t c = 0; c < dirs.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dirs[c], ec)) {
      if (e.is_regular_file() && IsImage(e.path())) files.push_back(e.path().string());
    }
    if (ec) return "cannot read " + dirs[c].string() + ": " + ec.message();
    std::sort(files.begin(), files.end());
    for (auto& f : files) images->push_back({std::move(f), static_cast<int64_t>(c)});
  }
  *classes = static_cast<int64_t>(dirs.size());
  if (images->empty()) {
    return "no images (.jpg, .jpeg, .png) under " + root +
           "/<class>/: make a corpus with sluice-make-jpeg-corpus";
  }
  return "";
}

std::string ReadFile(const std::string& path, std::string* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot read " + path;
  bytes->assign(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) return "cannot read " + path;
  return "";
}

std::string ShardPath(const Args& a, int64_t s) {
  char name[32];
  std::snprintf(name, sizeof(name), "/shard-%06lld.tar", static_cast<long long>(s));
  return a.out + name;
}

int Fail(const std::string& msg, int rc) {
  std::fprintf(stderr, "sluice-make-webdataset: %s\n", msg.c_str());
  return rc;
}

int Run(const Args& a) {
  if (a.samples_per_shard < 1) return Fail("--samples_per_shard must be at least 1", 2);
  std::error_code ec;
  if (fs::exists(a.out, ec) && (!fs::is_directory(a.out, ec) || !fs::is_empty(a.out, ec))) {
    return Fail(a.out + " is not a new or empty directory (shards are never written over other "
                        "files)",
                1);
  }
  fs::create_directories(a.out, ec);
  if (ec) return Fail("cannot create " + a.out + ": " + ec.message(), 1);
  std::vector<Image> images;
  int64_t classes = 0;
  if (std::string e = ListImages(a.corpus, &images, &classes); !e.empty()) return Fail(e, 1);
  std::mt19937_64 rng(a.seed);
  std::shuffle(images.begin(), images.end(), rng);

  const int64_t n = static_cast<int64_t>(images.size());
  const int64_t shards = (n + a.samples_per_shard - 1) / a.samples_per_shard;
  int64_t bytes = 0;
  for (int64_t s = 0; s < shards; ++s) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int64_t i = s * a.samples_per_shard; i < std::min(n, (s + 1) * a.samples_per_shard);
         ++i) {
      char key[24];
      std::snprintf(key, sizeof(key), "%08lld", static_cast<long long>(i));
      std::string jpeg;
      if (std::string e = ReadFile(images[static_cast<size_t>(i)].path, &jpeg); !e.empty()) {
        return Fail(e, 1);
      }
      bytes += static_cast<int64_t>(jpeg.size());
      members.emplace_back(std::string(key) + ".jpg", std::move(jpeg));
      members.emplace_back(std::string(key) + ".cls",
                           std::to_string(images[static_cast<size_t>(i)].label));
    }
    if (auto st = sluice::WriteWebDatasetShard(ShardPath(a, s), members); !st.ok()) {
      return Fail(std::string(st.message()), 1);
    }
    std::fprintf(stderr, "sluice-make-webdataset: shard %lld/%lld written\n",
                 static_cast<long long>(s + 1), static_cast<long long>(shards));
  }
  std::ofstream meta(a.out + "/webdataset.txt");
  meta << "corpus=" << a.corpus << "\nshards=" << shards << "\nsamples=" << n
       << "\nclasses=" << classes << "\nimage_bytes=" << bytes
       << "\nsamples_per_shard=" << a.samples_per_shard << "\nseed=" << a.seed << "\n";
  meta.close();
  if (!meta) return Fail("cannot write " + a.out + "/webdataset.txt", 1);
  std::printf("%lld samples of %lld classes in %lld shard(s) under %s\n",
              static_cast<long long>(n), static_cast<long long>(classes),
              static_cast<long long>(shards), a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"WebDataset tar shards (<key>.jpg, <key>.cls) from an image folder"};
  Args a;
  app.add_option("--corpus", a.corpus, "ROOT/<class>/<image> folder (sluice-make-jpeg-corpus)")
      ->required();
  app.add_option("--out", a.out, "new or empty output directory")->required();
  app.add_option("--samples_per_shard", a.samples_per_shard, "samples per tar shard");
  app.add_option("--seed", a.seed, "seed of the shuffle");
  CLI11_PARSE(app, argc, argv);
  return Run(a);
}
