// sluice-perf images: the ImageNet-style input pipeline (docs/perf.md),
// side by side in one run with torchvision's DataLoader on the same JPEG
// corpus:
//
//   ImageFolder(root).WithSeed(seed)
//     .Map({Normalize(RandomHorizontalFlip(RandomResizedCrop(
//               Decode(ReadFile(x[0])), 224, 224)), mean, std), x[1]}, kAutotune)
//     .Batch(64)
//
// --format webdataset reads the same images from WebDataset tar shards
// (sluice-make-webdataset; <key>.jpg and <key>.cls) instead:
//
//   WebDataset(shards, {"jpg", "cls"}).WithSeed(seed)
//     .Map({Normalize(RandomHorizontalFlip(RandomResizedCrop(Decode(x[0]), ...)), ...), x[1]})
//
// and the torch rows stream the shards with the standard library's tarfile
// and decode with PIL in an IterableDataset (shards divided between the
// DataLoader workers), the webdataset library's own method.
//
// Rows: "sluice local" (the pipeline in one process), "sluice distribute,
// W workers" (the same pipeline on W sluice-worker processes,
// processing_mode distributed_epoch so each image is produced once, read by
// one client process), the first W again with uint8 batches over the wire
// and Normalize on the client (the same elements), and "torch DataLoader,
// num_workers=K"
// (perf/torch_images.py under Debian's python3). Each row is one child
// process (plus its workers) that makes a warm-up pass over the corpus and
// then timed passes (each a fresh iterator read to the end and destroyed;
// whole passes until --seconds, at least one).
//
// What is counted: images/s is the timed passes' images over their wall
// clock; CPU is user+sys of every process of the row (the client's
// getrusage, each worker's /proc/<pid>/stat; for torch, the script's own
// RUSAGE_SELF + RUSAGE_CHILDREN of its reaped DataLoader workers) over the
// timed passes; peak RSS is the sum of each process's peak (VmHWM). The
// in-process dispatcher of the distribute rows is not counted (it hands out
// splits and does nothing per image).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "perf/suite.h"
#include "sluice/client/distribute.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/image.h"
#include "sluice/dataset/thread_pool.h"

namespace sluice::perf {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::array<float, 3> kMean = {0.485f, 0.456f, 0.406f};
constexpr std::array<float, 3> kStd = {0.229f, 0.224f, 0.225f};
// torch_images.py exits with this when torch or torchvision cannot be imported.
constexpr int kTorchMissingExit = 3;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// With `normalize_after_batch` the images stay uint8 [224, 224, 3] through
// Batch and Normalize runs on the batch (Normalized() below): behind a
// Distribute, uint8 crosses the wire (a quarter of the bytes) and the client
// normalizes. The elements are the same either way.
// `webdataset` non-empty: the shards there instead of the folder `corpus`
// (labels are then the .cls members' bytes).
Dataset ImagesPipeline(const std::string& corpus, const std::string& webdataset, int64_t batch,
                       uint64_t seed, bool normalize_after_batch) {
  using expr::x;
  const expr::Expr bytes = webdataset.empty() ? io::ReadFile(x[0]) : x[0];
  expr::Expr img =
      image::RandomHorizontalFlip(image::RandomResizedCrop(image::Decode(bytes), 224, 224));
  if (!normalize_after_batch) img = image::Normalize(img, kMean, kStd);
  const Dataset source = webdataset.empty()
                             ? image::ImageFolder(corpus)
                             : Dataset::WebDataset(webdataset + "/shard-*.tar", {"jpg", "cls"});
  return source.WithSeed(seed).Map({img, x[1]}, kAutotune).Batch(batch, /*drop_remainder=*/false);
}
Dataset Normalized(const Dataset& batches) {
  using expr::x;
  return batches.Map({image::Normalize(x[0], kMean, kStd), x[1]});
}

struct PassCount {
  int64_t images = 0, batches = 0;
};

// One pass: a fresh iterator read to the end, then destroyed.
absl::StatusOr<PassCount> OnePass(const Dataset& ds) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Iterator> it, ds.MakeIterator());
  PassCount n;
  while (true) {
    SLUICE_ASSIGN_OR_RETURN(std::optional<Element> e, it->Next());
    if (!e.has_value()) break;
    if (e->size() != 2 || e->front().shape().dims().size() != 4) {
      return absl::InternalError(absl::StrCat("expected (float32[B, 3, 224, 224], labels[B]), got ",
                                              e->size(), " component(s), the first ",
                                              e->empty() ? "-" : e->front().DebugString(2)));
    }
    n.images += e->front().shape().dim(0);
    ++n.batches;
  }
  return n;
}

// ---- the corpus ----

struct Corpus {
  std::string path;
  int64_t images = 0;
  int64_t classes = 0;
  int64_t total_bytes = 0;
  double mean_width = 0, mean_height = 0;  // 0: not known (not made by the tool)
  std::string origin;                      // "made", "reused" or "given"
};

// An extension ImageFolder takes (image::DefaultImageExtensions, lower case).
bool IsImageFile(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  const std::vector<std::string>& exts = image::DefaultImageExtensions();
  return std::find(exts.begin(), exts.end(), ext) != exts.end();
}

// Counts root/<class>/<image> as ImageFolder lists them.
absl::StatusOr<Corpus> ScanCorpus(const std::string& root) {
  Corpus c;
  c.path = root;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    if (!d.is_directory()) continue;
    ++c.classes;
    for (const fs::directory_entry& f : fs::directory_iterator(d.path(), ec)) {
      if (!f.is_regular_file() || !IsImageFile(f.path())) continue;
      ++c.images;
      c.total_bytes += static_cast<int64_t>(f.file_size(ec));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", root, ": ", ec.message()));
  if (c.images == 0) {
    return absl::NotFoundError(absl::StrCat(root, " holds no images in class subdirectories ",
                                            "(root/<class>/<image>.jpg)"));
  }
  const Record stamp = ParseRecord(ReadWholeFile(root + "/corpus.txt"));
  c.mean_width = RecordNumber(stamp, "mean_width");
  c.mean_height = RecordNumber(stamp, "mean_height");
  return c;
}

// Runs a corpus tool (`name`, its log `name`.log in scratch) to its end.
absl::Status RunTool(const std::string& name, const std::string& tool,
                     const std::vector<std::string>& args, absl::Duration timeout,
                     const ScratchDir& scratch) {
  ChildProcess gen(name, scratch.File(name + ".log"));
  SLUICE_RETURN_IF_ERROR(gen.Start(tool, args));
  absl::StatusOr<int> st = gen.Wait(timeout);
  if (!st.ok()) {
    return absl::DeadlineExceededError(
        absl::StrCat(st.status().message(), "; log:\n", gen.LogTail()));
  }
  if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
    return absl::InternalError(
        absl::StrCat(tool, " ", DescribeWaitStatus(*st), ": ", gen.LogTail()));
  }
  return absl::OkStatus();
}

absl::Status MakeCorpus(const std::string& tool, const std::string& dir, int64_t images,
                        int64_t classes, uint64_t seed, const ScratchDir& scratch) {
  return RunTool("corpus", tool,
                 {"--out", dir, "--images", absl::StrCat(images), "--classes",
                  absl::StrCat(classes), "--seed", absl::StrCat(seed)},
                 absl::Seconds(120 + images / 10), scratch);
}

// --corpus DIR: used as it is when it holds images, else made there.
// Without it: a corpus cached under $TMPDIR by size and seed (made once,
// complete when its corpus.txt exists).
absl::StatusOr<Corpus> PrepareCorpus(const ImagesArgs& a, int64_t images, int64_t classes,
                                     const ScratchDir& scratch, std::vector<std::string>* notes) {
  std::error_code ec;
  std::string dir = a.corpus;
  if (!dir.empty() && fs::is_directory(dir, ec) && !fs::is_empty(dir, ec)) {
    SLUICE_ASSIGN_OR_RETURN(Corpus c, ScanCorpus(dir));
    c.origin = "given";
    if (a.images > 0 && a.images != c.images) {
      notes->push_back(absl::StrCat("--corpus ", dir, " holds ", c.images, " images; --images ",
                                    a.images, " is ignored"));
    }
    return c;
  }
  bool cached = false;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/sluice-perf-jpeg-corpus-n",
                       images, "-k", classes, "-s", a.seed);
    cached = true;
    const Record stamp = ParseRecord(ReadWholeFile(dir + "/corpus.txt"));
    if (RecordNumber(stamp, "images") == static_cast<double>(images)) {
      SLUICE_ASSIGN_OR_RETURN(Corpus c, ScanCorpus(dir));
      if (c.images == images) {
        c.origin = "reused";
        return c;
      }
    }
    fs::remove_all(dir, ec);  // an incomplete corpus of ours (interrupted run)
  }
  SLUICE_ASSIGN_OR_RETURN(
      std::string tool,
      Locate("sluice-make-jpeg-corpus", "--corpus_tool", a.corpus_tool,
             {SelfDir() + "/sluice-make-jpeg-corpus",
              SelfDir() + "/../tools/sluice-make-jpeg-corpus", SLUICE_PERF_BUILD_CORPUS_TOOL}));
  SLUICE_RETURN_IF_ERROR(MakeCorpus(tool, dir, images, classes, a.seed, scratch));
  SLUICE_ASSIGN_OR_RETURN(Corpus c, ScanCorpus(dir));
  c.origin = "made";
  if (cached) notes->push_back(absl::StrCat("the corpus is kept for later runs in ", dir));
  return c;
}

// The corpus's images as WebDataset shards (--format webdataset), made
// once with sluice-make-webdataset and cached under $TMPDIR by corpus and
// shard size (complete when its webdataset.txt counts the corpus's images).
absl::StatusOr<std::string> PrepareShards(const ImagesArgs& a, const Corpus& c,
                                          const ScratchDir& scratch,
                                          std::vector<std::string>* notes) {
  const int64_t per_shard =
      a.samples_per_shard > 0 ? a.samples_per_shard : std::max<int64_t>(1, (c.images + 15) / 16);
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = absl::StrCat(
      tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/sluice-perf-webdataset-",
      fs::path(c.path).filename().string(), "-",
      absl::Hex(std::hash<std::string>()(fs::absolute(c.path).string())), "-n", c.images, "-p",
      per_shard);
  const Record stamp = ParseRecord(ReadWholeFile(dir + "/webdataset.txt"));
  if (RecordNumber(stamp, "samples") == static_cast<double>(c.images)) return dir;
  std::error_code ec;
  fs::remove_all(dir, ec);  // an incomplete set of ours (interrupted run)
  SLUICE_ASSIGN_OR_RETURN(
      std::string tool,
      Locate("sluice-make-webdataset", "--webdataset_tool", a.webdataset_tool,
             {SelfDir() + "/sluice-make-webdataset", SelfDir() + "/../tools/sluice-make-webdataset",
              SLUICE_PERF_BUILD_WEBDATASET_TOOL}));
  SLUICE_RETURN_IF_ERROR(RunTool("webdataset", tool,
                                 {"--corpus", c.path, "--out", dir, "--samples_per_shard",
                                  absl::StrCat(per_shard), "--seed", absl::StrCat(a.seed)},
                                 absl::Seconds(120 + c.images / 100), scratch));
  notes->push_back(absl::StrCat("the WebDataset shards are kept for later runs in ", dir));
  return dir;
}

// ---- rows ----

struct Row {
  std::string name;
  // "sluice-local", "sluice-distribute", "sluice-distribute-uint8" (uint8
  // over the wire, normalized by the client), "torch"
  std::string kind;
  int workers = 0;   // W or num_workers; 0 for local
  int64_t images = 0, batches = 0, passes = 0;
  double seconds = 0, cpu_s = 0;
  double client_cpu_s = 0, workers_cpu_s = 0;
  int64_t peak_rss = 0, client_rss = 0, workers_rss = 0;
  std::string error;       // the measurement failed
  std::string extra_json;  // more fields (torch versions), already ",\"k\":v" pairs

  bool ok() const { return error.empty() && images > 0 && seconds > 0; }
  double images_per_s() const { return ok() ? images / seconds : std::nan(""); }
  double cpu_ms_per_image() const { return ok() ? cpu_s * 1e3 / images : std::nan(""); }
  std::string processes() const { return workers == 0 ? "1" : absl::StrCat("1+", workers); }
};

void FillFromRecord(const Record& r, Row* row) {
  row->images = static_cast<int64_t>(RecordNumber(r, "images"));
  row->batches = static_cast<int64_t>(RecordNumber(r, "batches"));
  row->passes = static_cast<int64_t>(RecordNumber(r, "passes"));
  row->seconds = RecordNumber(r, "seconds");
  row->cpu_s = RecordNumber(r, "cpu_s");
  row->client_cpu_s = RecordNumber(r, "client_cpu_s");
  row->workers_cpu_s = RecordNumber(r, "workers_cpu_s");
  row->peak_rss = static_cast<int64_t>(RecordNumber(r, "peak_rss_bytes"));
  row->client_rss = static_cast<int64_t>(RecordNumber(r, "client_rss_bytes"));
  row->workers_rss = static_cast<int64_t>(RecordNumber(r, "workers_rss_bytes"));
}

// Generous: a warm-up pass, then passes for min_seconds, at 10 images/s or more.
double ChildTimeout(const Corpus& c, double min_seconds) {
  return 120 + 2 * min_seconds + 0.2 * static_cast<double>(c.images);
}

// Runs `sluice-perf images-client` and returns its record.
absl::StatusOr<Record> RunImagesChild(const ImagesClientOptions& o,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      const ScratchDir& scratch, const std::string& name,
                                      double timeout_s) {
  const std::string out = scratch.File(name + ".record");
  std::vector<std::string> args = {"images-client", "--corpus", o.corpus,
                                   "--normalize_on_client", o.normalize_on_client ? "1" : "0",
                                   "--batch", absl::StrCat(o.batch),
                                   "--seed", absl::StrCat(o.seed),
                                   "--min_seconds", absl::StrCat(o.min_seconds),
                                   "--out", out};
  if (!o.service.empty()) {
    args.insert(args.end(), {"--service", o.service, "--protocol", o.protocol,
                             "--max_outstanding_requests", absl::StrCat(o.max_outstanding)});
  }
  if (!o.worker_pids.empty()) {
    args.insert(args.end(), {"--worker_pids", absl::StrJoin(o.worker_pids, ",")});
  }
  if (!o.webdataset.empty()) args.insert(args.end(), {"--webdataset", o.webdataset});
  return RunRecordChild(args, env, out, scratch, name, timeout_s);
}

struct TorchOutcome {
  Row row;
  bool missing = false;  // torch could not be imported: skip the torch rows
  std::string missing_why;
  std::string versions;  // "torch 2.x, torchvision 0.y, 1 intra-op thread(s)"
};

TorchOutcome RunTorchRow(const std::string& python, const std::string& script, const Corpus& c,
                         const std::string& webdataset, int num_workers, double min_seconds,
                         const ImagesArgs& a, const ScratchDir& scratch) {
  TorchOutcome t;
  t.row.name = absl::StrCat("torch DataLoader, num_workers=", num_workers);
  t.row.kind = "torch";
  t.row.workers = num_workers;
  const std::string name = absl::StrCat("torch-", num_workers);
  const std::string out = scratch.File(name + ".json");
  ChildProcess child(name, scratch.File(name + ".log"));
  std::vector<std::string> args = {script, "--root", c.path, "--num_workers",
                                   absl::StrCat(num_workers), "--batch", absl::StrCat(a.batch),
                                   "--seed", absl::StrCat(a.seed), "--min_seconds",
                                   absl::StrCat(min_seconds), "--out", out};
  if (!webdataset.empty()) args.insert(args.end(), {"--webdataset", webdataset});
  absl::Status st = child.Start(python, args);
  absl::StatusOr<int> ws =
      st.ok() ? child.Wait(absl::Seconds(ChildTimeout(c, min_seconds))) : st;
  const std::string json = ReadWholeFile(out);
  const Record r = ParseJsonRecord(json);
  auto text = [&r](const std::string& key, std::string fallback) {
    auto it = r.find(key);
    return it == r.end() ? fallback : it->second;
  };
  if (!ws.ok()) {
    t.row.error = absl::StrCat(name, ": ", OneLine(ws.status()), "; log: ", child.LogTail(1500));
    return t;
  }
  if (WIFEXITED(*ws) && WEXITSTATUS(*ws) == kTorchMissingExit) {
    t.missing = true;
    t.missing_why = text("message", child.LogTail(300));
    return t;
  }
  if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0 || json.empty()) {
    t.row.error = absl::StrCat(name, ": ", python, " ", script, " ", DescribeWaitStatus(*ws),
                               "; log: ", child.LogTail(1500));
    return t;
  }
  t.row.images = static_cast<int64_t>(RecordNumber(r, "images"));
  t.row.batches = static_cast<int64_t>(RecordNumber(r, "batches"));
  t.row.passes = static_cast<int64_t>(RecordNumber(r, "passes"));
  t.row.seconds = RecordNumber(r, "seconds");
  t.row.cpu_s = RecordNumber(r, "cpu_seconds");
  t.row.client_cpu_s = RecordNumber(r, "cpu_self_seconds");
  t.row.workers_cpu_s = RecordNumber(r, "cpu_children_seconds");
  t.row.peak_rss = static_cast<int64_t>(RecordNumber(r, "peak_rss_bytes"));
  t.row.client_rss = static_cast<int64_t>(RecordNumber(r, "main_peak_rss_bytes"));
  t.row.workers_rss = static_cast<int64_t>(RecordNumber(r, "workers_peak_rss_bytes"));
  const std::string torch_v = text("torch", "?");
  const std::string vision_v = text("torchvision", "?");
  const int threads = static_cast<int>(RecordNumber(r, "torch_threads"));
  t.versions = absl::StrCat("torch ", torch_v, ", torchvision ", vision_v, ", ", threads,
                            " intra-op thread(s) in the main process");
  t.row.extra_json =
      absl::StrCat(",\"torch\":", JsonQuote(torch_v), ",\"torchvision\":", JsonQuote(vision_v),
                   ",\"torch_threads\":", threads);
  return t;
}

// ---- targets ----

struct Target {
  std::string name;
  double value = std::nan("");
  double goal = 0;
  bool at_most = true;   // value <= goal, else value >= goal
  bool ratio_x = false;  // shown as "2.31x"
  bool measured() const { return std::isfinite(value); }
  bool met() const { return measured() && (at_most ? value <= goal : value >= goal); }
  std::string ValueText() const { return ratio_x ? Times(value) : Num(value, 2); }
  std::string GoalText() const {
    return absl::StrCat(at_most ? "<= " : ">= ", ratio_x ? Times(goal) : Num(goal, 2));
  }
};

std::string Workers(int w) { return absl::StrCat(w, w == 1 ? " worker" : " workers"); }

}  // namespace

absl::StatusOr<Record> RunImagesClient(const ImagesClientOptions& o) {
  Dataset ds = ImagesPipeline(o.corpus, o.webdataset, o.batch, o.seed, o.normalize_on_client);
  if (!o.service.empty()) {
    DistributeOptions d;
    d.service = o.service;
    d.processing_mode = "distributed_epoch";
    d.data_transfer_protocol = o.protocol;
    d.max_outstanding_requests = o.max_outstanding;
    ds = ds.Apply(Distribute(d));
  }
  if (o.normalize_on_client) ds = Normalized(ds);
  SLUICE_RETURN_IF_ERROR(ds.status());
  SLUICE_RETURN_IF_ERROR(OnePass(ds).status());  // warm-up: page cache, pools, workers
  auto workers_cpu = [&]() -> absl::StatusOr<double> {
    double s = 0;
    for (int pid : o.worker_pids) {
      SLUICE_ASSIGN_OR_RETURN(double c, ProcCpuSeconds(pid));
      s += c;
    }
    return s;
  };
  SLUICE_ASSIGN_OR_RETURN(const double w0, workers_cpu());
  const double c0 = SelfCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  PassCount n;
  int64_t passes = 0;
  double seconds = 0;
  do {  // whole passes until min_seconds
    SLUICE_ASSIGN_OR_RETURN(PassCount p, OnePass(ds));
    n.images += p.images;
    n.batches += p.batches;
    ++passes;
    seconds = Since(t0);
  } while (seconds < o.min_seconds);
  const double client_cpu = SelfCpuSeconds() - c0;
  SLUICE_ASSIGN_OR_RETURN(const double w1, workers_cpu());
  SLUICE_ASSIGN_OR_RETURN(const int64_t client_rss, ProcPeakRss("self"));
  int64_t workers_rss = 0;
  for (int pid : o.worker_pids) {
    SLUICE_ASSIGN_OR_RETURN(int64_t r, ProcPeakRss(absl::StrCat(pid)));
    workers_rss += r;
  }
  Record r;
  r["images"] = absl::StrCat(n.images);
  r["batches"] = absl::StrCat(n.batches);
  r["passes"] = absl::StrCat(passes);
  r["seconds"] = absl::StrCat(seconds);
  r["client_cpu_s"] = absl::StrCat(client_cpu);
  r["workers_cpu_s"] = absl::StrCat(w1 - w0);
  r["cpu_s"] = absl::StrCat(client_cpu + w1 - w0);
  r["client_rss_bytes"] = absl::StrCat(client_rss);
  r["workers_rss_bytes"] = absl::StrCat(workers_rss);
  r["peak_rss_bytes"] = absl::StrCat(client_rss + workers_rss);
  r["thread_pool_threads"] = absl::StrCat(ThreadPoolSize());
  return r;
}

absl::Status RunImages(const ImagesArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  if (a.batch < 1) return absl::InvalidArgumentError("--batch must be at least 1");
  for (int w : a.workers) {
    if (w < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers ", w, ": a distribute row needs at least 1 worker"));
    }
  }
  for (int k : a.torch_workers) {
    if (k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--torch_workers ", k, ": num_workers is 0 (no worker processes) or more"));
    }
  }
  const int64_t images = a.images > 0 ? a.images : quick ? 128 : 1024;
  const double min_seconds = a.seconds >= 0 ? a.seconds : quick ? 1.0 : 3.0;
  const int64_t classes =
      a.classes > 0 ? std::min(a.classes, images) : std::min<int64_t>(images, 10);
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  SLUICE_ASSIGN_OR_RETURN(TransportSpec transport, ParseTransport(a.transport, a.shm_tls));
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf_images"));
  if (a.common.keep_logs) scratch.Keep();
  const bool webdataset = a.format == "webdataset";
  Progress progress("images", 2 + static_cast<int>(a.workers.size() + a.torch_workers.size()) +
                                  (a.workers.empty() ? 0 : 1) + (webdataset ? 1 : 0));
  std::vector<std::string> notes;
  bool any_failed = false;

  progress.Step(a.corpus.empty() ? absl::StrCat("corpus of ", images, " JPEGs")
                                 : absl::StrCat("corpus ", a.corpus));
  SLUICE_ASSIGN_OR_RETURN(Corpus corpus, PrepareCorpus(a, images, classes, scratch, &notes));
  std::string shards;
  if (webdataset) {
    progress.Step("WebDataset shards of the corpus");
    SLUICE_ASSIGN_OR_RETURN(shards, PrepareShards(a, corpus, scratch, &notes));
  }

  std::vector<Row> rows;
  std::string pool_threads = "?";
  ImagesClientOptions base;
  base.corpus = corpus.path;
  base.webdataset = shards;
  base.batch = a.batch;
  base.seed = a.seed;
  base.min_seconds = min_seconds;
  const double timeout_s = ChildTimeout(corpus, min_seconds);
  const std::string local_name = "sluice local (kAutotune)";
  progress.Step(local_name);
  {
    Row row;
    row.name = local_name;
    row.kind = "sluice-local";
    TransportSpec none{"local", "", ""};
    absl::StatusOr<Record> r =
        RunImagesChild(base, ChildEnv(none), scratch, "sluice-local", timeout_s);
    if (r.ok()) {
      FillFromRecord(*r, &row);
      pool_threads = r->count("thread_pool_threads") ? r->at("thread_pool_threads") : "?";
    } else {
      row.error = OneLine(r.status());
    }
    rows.push_back(row);
  }
  // Each worker count as the pipeline is (float32 over the wire), then, for
  // the first count, with uint8 over the wire normalized on the client.
  std::vector<std::pair<int, bool>> distribute_rows;
  for (int w : a.workers) distribute_rows.emplace_back(w, false);
  if (!a.workers.empty()) distribute_rows.emplace_back(a.workers.front(), true);
  for (const auto& [w, uint8_wire] : distribute_rows) {
    Row row;
    row.name = absl::StrCat("sluice distribute, ", Workers(w),
                            uint8_wire ? ", uint8" : "");
    row.kind = uint8_wire ? "sluice-distribute-uint8" : "sluice-distribute";
    row.workers = w;
    progress.Step(absl::StrCat(row.name, " (", transport.name, ")"));
    const std::string name = absl::StrCat("sluice-distribute-", w, uint8_wire ? "-uint8" : "");
    absl::StatusOr<std::unique_ptr<Cluster>> cluster =
        Cluster::Start(ClusterFor(bin, a.common, transport, w, scratch, name));
    absl::Status st = cluster.status();
    if (st.ok()) {
      ImagesClientOptions o = base;
      o.normalize_on_client = uint8_wire;
      o.service = (*cluster)->target();
      o.protocol = transport.protocol;
      o.max_outstanding = a.max_outstanding;
      o.worker_pids = (*cluster)->worker_pids();
      absl::StatusOr<Record> r =
          RunImagesChild(o, ChildEnv(transport), scratch, name, timeout_s);
      st = r.status();
      if (r.ok()) FillFromRecord(*r, &row);
      if (st.ok()) st = (*cluster)->CheckWorkersAlive();
    }
    if (!st.ok()) row.error = OneLine(st);
    rows.push_back(row);
  }
  // The torch rows, skipped (with a note) when torch cannot be imported.
  std::string python = a.python;
  if (python.find('/') == std::string::npos) python = FindOnPath(python);
  absl::StatusOr<std::string> script =
      Locate("perf/torch_images.py", "--torch_script", a.torch_script,
             {SelfDir() + "/torch_images.py",
              SelfDir() + "/../" SLUICE_PERF_INSTALL_DATADIR "/sluice/torch_images.py",
              SLUICE_PERF_TORCH_SCRIPT});
  std::string torch_skip;
  if (python.empty() || access(python.c_str(), X_OK) != 0) {
    torch_skip = absl::StrCat("no python at ", a.python, " (--python)");
  } else if (!script.ok()) {
    torch_skip = std::string(script.status().message());
  }
  std::string torch_versions;
  for (int k : a.torch_workers) {
    progress.Step(absl::StrCat("torch DataLoader, num_workers=", k));
    if (!torch_skip.empty()) continue;
    TorchOutcome t = RunTorchRow(python, *script, corpus, shards, k, min_seconds, a, scratch);
    if (t.missing) {
      torch_skip = absl::StrCat(python, " cannot import torch/torchvision: ", t.missing_why);
      continue;
    }
    if (torch_versions.empty()) torch_versions = t.versions;
    rows.push_back(t.row);
  }
  if (!torch_skip.empty() && !a.torch_workers.empty()) {
    notes.push_back(absl::StrCat("torch rows skipped: ", torch_skip));
  }
  progress.Finish();
  for (const Row& r : rows) {
    if (r.error.empty()) continue;
    any_failed = true;
    std::fprintf(stderr, "sluice-perf: images row '%s' failed: %s\n", r.name.c_str(),
                 r.error.c_str());
  }
  for (const Row& r : rows) {
    if (r.error.empty() && r.images != corpus.images * r.passes) {
      notes.push_back(absl::StrCat(r.name, " delivered ", r.images, " images in ", r.passes,
                                   " timed pass(es) over a corpus of ", corpus.images));
    }
  }

  // ---- the table ----
  std::printf("sluice-perf images%s\n", quick ? " --quick" : "");
  std::printf("machine: %s; sluice thread pool: %s thread(s)\n", machine.Describe().c_str(),
              pool_threads.c_str());
  std::printf("corpus: %s (%s): %lld images in %lld classes, mean %.1f KB", corpus.path.c_str(),
              corpus.origin.c_str(), static_cast<long long>(corpus.images),
              static_cast<long long>(corpus.classes),
              static_cast<double>(corpus.total_bytes) / std::max<int64_t>(1, corpus.images) / 1e3);
  if (corpus.mean_width > 0) std::printf(", mean %.0fx%.0f", corpus.mean_width, corpus.mean_height);
  if (webdataset) std::printf("\nshards: %s", shards.c_str());
  std::printf(
      "\npipeline: %s -> Map(Normalize(RandomHorizontalFlip(RandomResizedCrop("
      "Decode(%s), 224, 224))), kAutotune) -> Batch(%lld); distribute: "
      "distributed_epoch over %s, max_outstanding_requests %lld\n",
      webdataset ? "WebDataset(shard-*.tar, {jpg, cls})" : "ImageFolder",
      webdataset ? "x[0]" : "ReadFile", static_cast<long long>(a.batch), transport.name.c_str(),
      static_cast<long long>(a.max_outstanding));
  if (webdataset) {
    std::printf("torch rows: an IterableDataset streaming the shards with tarfile (shards "
                "divided between the DataLoader workers), PIL decode, the same transforms\n");
  }
  if (!torch_versions.empty()) std::printf("torch: %s\n", torch_versions.c_str());
  std::printf("timed: whole passes over the corpus for at least %.1f s after a warm-up pass; "
              "CPU and RSS summed over the row's processes (procs: client+workers)\n\n",
              min_seconds);
  std::printf("%-34s %6s %7s %8s %9s %11s %13s\n", "row", "procs", "images", "seconds", "images/s",
              "cpu ms/img", "peak RSS MiB");
  std::vector<std::string> row_json;
  for (const Row& r : rows) {
    JsonObject j;
    j.Add("row", r.name).Add("kind", r.kind).Add("workers", r.workers);
    if (!r.error.empty()) {
      std::printf("%-34s  FAILED: %s\n", r.name.c_str(), r.error.substr(0, 200).c_str());
      row_json.push_back(j.Add("error", r.error).str());
      continue;
    }
    std::printf("%-34s %6s %7lld %8s %9s %11s %13s\n", r.name.c_str(), r.processes().c_str(),
                static_cast<long long>(r.images), Num(r.seconds, 2).c_str(),
                Num(r.images_per_s(), 1).c_str(), Num(r.cpu_ms_per_image(), 2).c_str(),
                Num(static_cast<double>(r.peak_rss) / (1 << 20), 0).c_str());
    std::string obj = j.Add("images", r.images)
                          .Add("batches", r.batches)
                          .Add("passes", r.passes)
                          .Add("seconds", r.seconds)
                          .Add("images_per_s", r.images_per_s())
                          .Add("cpu_s", r.cpu_s)
                          .Add("cpu_ms_per_image", r.cpu_ms_per_image())
                          .Add("client_cpu_s", r.client_cpu_s)
                          .Add("workers_cpu_s", r.workers_cpu_s)
                          .Add("peak_rss_bytes", r.peak_rss)
                          .Add("client_peak_rss_bytes", r.client_rss)
                          .Add("workers_peak_rss_bytes", r.workers_rss)
                          .str();
    obj.insert(obj.size() - 1, r.extra_json);
    row_json.push_back(obj);
  }

  // ---- the targets ----
  auto find = [&](const std::string& kind, int workers) -> const Row* {
    for (const Row& r : rows) {
      if (r.kind == kind && r.workers == workers && r.ok()) return &r;
    }
    return nullptr;
  };
  const Row* local = find("sluice-local", 0);
  const Row* torch0 = find("torch", 0);
  std::vector<Target> targets;
  std::vector<std::string> unmeasured;
  auto ratio = [](const Row* num, const Row* den, double (Row::*f)() const) {
    return num != nullptr && den != nullptr ? (num->*f)() / (den->*f)() : std::nan("");
  };
  targets.push_back({"CPU/image: sluice local / DataLoader(num_workers=0)",
                     ratio(local, torch0, &Row::cpu_ms_per_image), 0.5, true, false});
  // Issue #17's goals for the folder; #28's for WebDataset shards against
  // the tarfile streaming DataLoader.
  const double speed_goal = webdataset ? 3.0 : 2.0;
  targets.push_back({"images/s: sluice local / DataLoader(num_workers=0)",
                     ratio(local, torch0, &Row::images_per_s), speed_goal, false, true});
  for (int w : a.workers) {
    const Row* dist = find("sluice-distribute", w);
    if (std::find(a.torch_workers.begin(), a.torch_workers.end(), w) != a.torch_workers.end()) {
      targets.push_back({absl::StrCat("images/s: sluice distribute ", Workers(w),
                                      " / DataLoader(num_workers=", w, ")"),
                         ratio(dist, find("torch", w), &Row::images_per_s), speed_goal, false,
                         true});
    } else {
      unmeasured.push_back(absl::StrCat("sluice distribute, ", Workers(w),
                                        " has no DataLoader(num_workers=", w,
                                        ") row to compare with (--torch_workers)"));
    }
    targets.push_back({absl::StrCat("CPU/image: sluice distribute ", Workers(w), " / local"),
                       ratio(dist, local, &Row::cpu_ms_per_image), 1.10, true, false});
    if (w == a.workers.front()) {
      targets.push_back({absl::StrCat("CPU/image: sluice distribute ", Workers(w),
                                      ", uint8 / local"),
                         ratio(find("sluice-distribute-uint8", w), local, &Row::cpu_ms_per_image),
                         1.10, true, false});
    }
  }
  std::printf(
      "\ntargets (issue %s; equal process counts: local vs num_workers=0, W workers vs "
      "num_workers=W)\n",
      webdataset ? "#28, WebDataset shards" : "#17");
  std::printf("%-66s %8s %9s\n", "ratio", "value", "target");
  std::vector<std::string> target_json, met, missed, not_measured;
  for (const Target& t : targets) {
    const std::string verdict = !t.measured() ? "not measured" : t.met() ? "MET" : "MISSED";
    std::printf("%-66s %8s %9s  %s\n", t.name.c_str(), t.ValueText().c_str(), t.GoalText().c_str(),
                verdict.c_str());
    (!t.measured() ? not_measured : t.met() ? met : missed).push_back(t.name);
    target_json.push_back(JsonObject()
                              .Add("target", t.name)
                              .Add("value", t.value)
                              .Add("goal", t.goal)
                              .Add("comparison", t.at_most ? "<=" : ">=")
                              .Add("result", verdict)
                              .str());
  }
  std::printf("\n");
  notes.push_back(absl::StrCat("targets met: ", met.empty() ? "none" : absl::StrJoin(met, "; ")));
  if (!missed.empty())
    notes.push_back(absl::StrCat("targets missed: ", absl::StrJoin(missed, "; ")));
  if (!not_measured.empty()) {
    notes.push_back(absl::StrCat("targets not measured: ", absl::StrJoin(not_measured, "; ")));
  }
  for (const std::string& u : unmeasured) notes.push_back(u);
  notes.push_back(
      "RSS sums count pages shared between processes (libraries; a DataLoader "
      "worker's copy-on-write pages of its parent) once per process");

  Report report;
  report.mode = "images";
  report.command = command;
  report.machine = machine;
  report.fields = {{"corpus", JsonObject()
                                  .Add("path", corpus.path)
                                  .Add("origin", corpus.origin)
                                  .Add("images", corpus.images)
                                  .Add("classes", corpus.classes)
                                  .Add("total_bytes", corpus.total_bytes)
                                  .Add("mean_width", corpus.mean_width)
                                  .Add("mean_height", corpus.mean_height)
                                  .str()},
                   {"format", JsonQuote(a.format)},
                   {"shards", JsonQuote(shards)},
                   {"batch", absl::StrCat(a.batch)},
                   {"seed", absl::StrCat(a.seed)},
      {"min_seconds", absl::StrCat(min_seconds)},
                   {"transport", JsonQuote(transport.name)},
                   {"max_outstanding_requests", absl::StrCat(a.max_outstanding)},
                   {"task_buffer_elements", absl::StrCat(a.common.task_buffer_elements)},
                   {"thread_pool_threads", JsonQuote(pool_threads)},
                   {"torch", JsonQuote(torch_versions.empty() ? "skipped" : torch_versions)}};
  report.sections = {{"rows", row_json}, {"targets", target_json}};
  report.notes = notes;
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
