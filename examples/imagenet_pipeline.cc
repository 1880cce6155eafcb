// An ImageNet-style training input pipeline on an in-process service:
//
//   ImageFolder(root)                    (path, label) per root/<class>/<image>
//     .Map(read, decode, RandomResizedCrop(224), flip, normalize)   on the workers
//     .Batch(64)                         float32 [64, 3, 224, 224] + int64 [64]
//     .Apply(Distribute(distributed_epoch))   each image once, over 2 workers
//
//   sluice_imagenet_pipeline ROOT [--workers N] [--batch B] [--epochs E] [--seed S]
//
// Make a synthetic corpus with sluice-make-jpeg-corpus (tools/), or point it
// at a real ImageNet-style folder.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "embedded_service.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: sluice_imagenet_pipeline ROOT [--workers N] [--batch B] [--epochs E] "
               "[--seed S]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using sluice::expr::x;
  namespace image = sluice::image;
  if (argc < 2 || argv[1][0] == '-') return Usage();
  const std::string root = argv[1];
  int workers = 2;
  int64_t batch = 64, epochs = 1;
  uint64_t seed = 0;
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc) return Usage();
    const std::string flag = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (v < 0 || (v == 0 && flag != "--seed")) return Usage();
    if (flag == "--workers") workers = static_cast<int>(v);
    else if (flag == "--batch") batch = v;
    else if (flag == "--epochs") epochs = v;
    else if (flag == "--seed") seed = static_cast<uint64_t>(v);
    else return Usage();
  }

  sluice_examples::EmbeddedService service;
  if (!service.Start(workers)) return 1;
  sluice::DistributeOptions opt;
  opt.service = service.dispatcher->target();
  opt.processing_mode = "distributed_epoch";

  auto ds = image::ImageFolder(root)
                .WithSeed(seed)
                .Map({image::Normalize(
                          image::RandomHorizontalFlip(image::RandomResizedCrop(
                              image::Decode(sluice::io::ReadFile(x[0])), 224, 224)),
                          {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}),
                      x[1]},
                     sluice::kAutotune)
                .Batch(batch)
                .Apply(sluice::Distribute(opt));
  if (!ds.status().ok()) {
    std::fprintf(stderr, "error: %s\n", ds.status().ToString().c_str());
    return 1;
  }
  std::printf("pipeline elements: %s\n", ds.element_spec().ToString().c_str());
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto it = ds.MakeIterator();
    if (!it.ok()) {
      std::fprintf(stderr, "error: %s\n", it.status().ToString().c_str());
      return 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    int64_t images = 0, batches = 0;
    std::map<int64_t, int64_t> per_label;
    while (true) {
      auto e = (*it)->Next();
      if (!e.ok()) {
        std::fprintf(stderr, "error: %s\n", e.status().ToString().c_str());
        return 1;
      }
      if (!e->has_value()) break;
      const sluice::Element& b = **e;
      const int64_t n = b[1].num_elements();
      for (int64_t i = 0; i < n; ++i) per_label[b[1].at<int64_t>(i)]++;
      images += n;
      if (batches++ % 10 == 0) {
        std::printf("epoch %lld batch %lld: images %s, labels %s\n",
                    static_cast<long long>(epoch), static_cast<long long>(batches - 1),
                    b[0].shape().ToString().c_str(), b[1].shape().ToString().c_str());
      }
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch %lld: %lld images in %lld batches, %.1f images/s, %zu classes:",
                static_cast<long long>(epoch), static_cast<long long>(images),
                static_cast<long long>(batches), images / s, per_label.size());
    for (const auto& [label, count] : per_label) {
      std::printf(" %lld:%lld", static_cast<long long>(label), static_cast<long long>(count));
    }
    std::printf("\n");
    if (images == 0) {
      std::fprintf(stderr, "error: no images under %s/<class>/\n", root.c_str());
      return 1;
    }
  }
  return 0;
}
