// sluice-perf files: distributed_epoch over a corpus of many small files
// (docs/perf.md), the dispatcher's side of an ImageNet-sized listing.
//
// The corpus is an image folder of N small files (DIR/c<class>/f<i>.bin,
// each starting with its index), made once and cached. Every row reads
// ImageFolder(DIR).Map({ReadFile(path), label}) for `epochs` epochs in one
// client process (`sluice-perf files-client`) that checks each epoch is
// exactly the corpus (count, and sums of the indices the files start
// with). Rows: the pipeline locally, then through Distribute in
// distributed_epoch over `workers` sluice-worker processes and a
// sluice-dispatcher process of its own (fault-tolerant, journal on disk),
// once per --file_split_files value (0: the dispatcher's automatic runs; 1:
// one file per split, as before runs). Per row: files/s (epochs after the
// first), and per epoch the splits the dispatcher created, its CPU seconds,
// the bytes its journal grew by and the bytes it wrote to storage, the
// client's and the workers' CPU seconds.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "perf/cluster.h"
#include "perf/measure.h"
#include "perf/report.h"
#include "perf/suite.h"
#include "sluice/client/distribute.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/image.h"

namespace sluice::perf {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kMarker[] = ".sluice_perf_files";
constexpr char kExtension[] = ".bin";

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string MarkerText(int64_t files, int64_t bytes, int64_t classes) {
  return absl::StrCat("sluice-perf files corpus v1 files=", files, " bytes=", bytes,
                      " classes=", classes, "\n");
}

// The pipeline every row reads.
Dataset FilesPipeline(const std::string& corpus) {
  using expr::x;
  return image::ImageFolder(corpus, {kExtension}).Map({io::ReadFile(x[0]), x[1]}, kAutotune);
}

// What one epoch delivered: files, bytes, and the sums of the index each
// file starts with (and of its square) -- equal to the corpus's exactly
// when no file was lost or repeated (short of an unlikely coincidence).
struct EpochCount {
  int64_t files = 0, bytes = 0;
  uint64_t index_sum = 0, index_square_sum = 0;
  bool operator==(const EpochCount& o) const {
    return files == o.files && bytes == o.bytes && index_sum == o.index_sum &&
           index_square_sum == o.index_square_sum;
  }
};

EpochCount Expected(int64_t files, int64_t file_bytes) {
  EpochCount c;
  c.files = files;
  c.bytes = files * file_bytes;
  for (int64_t i = 0; i < files; ++i) {
    c.index_sum += static_cast<uint64_t>(i);
    c.index_square_sum += static_cast<uint64_t>(i) * static_cast<uint64_t>(i);
  }
  return c;
}

std::string Describe(const EpochCount& c) {
  return absl::StrCat(c.files, " files, ", c.bytes, " bytes, index sums ", c.index_sum, "/",
                      c.index_square_sum);
}

absl::StatusOr<EpochCount> OneEpoch(const Dataset& ds) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Iterator> it, ds.MakeIterator());
  EpochCount c;
  while (true) {
    SLUICE_ASSIGN_OR_RETURN(std::optional<Element> e, it->Next());
    if (!e.has_value()) break;
    if (e->size() != 2 || e->front().dtype() != DType::kString ||
        e->front().num_elements() != 1) {
      return absl::InternalError(absl::StrCat("expected (bytes, label), got ",
                                              ElementDebugString(*e)));
    }
    const std::string_view bytes = e->front().str(0);
    uint64_t index = 0;
    if (bytes.size() >= sizeof(index)) std::memcpy(&index, bytes.data(), sizeof(index));
    ++c.files;
    c.bytes += static_cast<int64_t>(bytes.size());
    c.index_sum += index;
    c.index_square_sum += index * index;
  }
  return c;
}

// ---- the corpus ----

struct Corpus {
  std::string path;
  int64_t files = 0, file_bytes = 0, classes = 0;
  std::string origin;  // "made" or "reused"
};

absl::StatusOr<Corpus> PrepareCorpus(const FilesArgs& a, int64_t files, Progress* progress) {
  Corpus c;
  c.files = files;
  c.file_bytes = a.file_bytes;
  c.classes = std::min(a.classes, files);
  if (!a.corpus.empty()) {
    c.path = a.corpus;
  } else {
    const char* tmp = std::getenv("TMPDIR");
    c.path = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/sluice_perf_files_",
                          files, "x", c.file_bytes, "_", c.classes);
  }
  const std::string marker = MarkerText(files, c.file_bytes, c.classes);
  if (ReadWholeFile(c.path + "/" + kMarker) == marker) {
    c.origin = "reused";
    return c;
  }
  std::error_code ec;
  if (fs::exists(c.path, ec)) {
    if (!fs::is_directory(c.path, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--corpus ", c.path, " exists and is not a directory"));
    }
    // A folder this suite did not finish making (or made with other sizes):
    // only its own class folders are replaced; anything else there is an error.
    for (const auto& entry : fs::directory_iterator(c.path, ec)) {
      const std::string name = entry.path().filename().string();
      if (name != kMarker && !(name.size() > 1 && name[0] == 'c' && entry.is_directory())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--corpus ", c.path, " holds ", name,
            ", which this suite did not make: give an empty or missing folder"));
      }
    }
    fs::remove_all(c.path, ec);
    if (ec) return absl::InternalError(absl::StrCat("removing ", c.path, ": ", ec.message()));
  }
  std::vector<std::string> class_dirs;
  for (int64_t k = 0; k < c.classes; ++k) {
    class_dirs.push_back(absl::StrCat(c.path, "/c", absl::Dec(k, absl::kZeroPad4)));
    fs::create_directories(class_dirs.back(), ec);
    if (ec) return absl::InternalError(absl::StrCat("creating ", class_dirs.back(), ": ", ec.message()));
  }
  std::vector<char> buf(static_cast<size_t>(std::max<int64_t>(c.file_bytes, 8)));
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  const Clock::time_point t0 = Clock::now();
  for (int64_t i = 0; i < files; ++i) {
    for (size_t j = 0; j < buf.size(); j += 8) {  // splitmix64 filler
      uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      std::memcpy(buf.data() + j, &z, std::min<size_t>(8, buf.size() - j));
    }
    const uint64_t index = static_cast<uint64_t>(i);
    std::memcpy(buf.data(), &index, sizeof(index));
    const std::string path = absl::StrCat(class_dirs[static_cast<size_t>(i % c.classes)], "/f",
                                          absl::Dec(i, absl::kZeroPad8), kExtension);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::InternalError(absl::StrCat("creating ", path, ": ", strerror(errno)));
    const ssize_t n = write(fd, buf.data(), static_cast<size_t>(c.file_bytes));
    close(fd);
    if (n != c.file_bytes) {
      return absl::InternalError(absl::StrCat("writing ", path, ": ", strerror(errno)));
    }
    if ((i + 1) % 20000 == 0 && progress != nullptr) {
      progress->Step(absl::StrCat("corpus: ", i + 1, " of ", files, " files, ",
                                  Num(Since(t0), 1), " s"));
    }
  }
  SLUICE_RETURN_IF_ERROR(WriteFile(c.path + "/" + kMarker, marker));
  c.origin = "made";
  return c;
}

// ---- one row ----

struct Row {
  std::string name;
  int64_t file_split_files = -1;  // -1: local
  std::vector<double> epoch_seconds;
  double files_per_s = std::nan("");  // epochs after the first
  double client_cpu_s = std::nan(""), workers_cpu_s = std::nan("");  // per epoch
  double splits = std::nan(""), dispatcher_cpu_s = std::nan(""), journal_bytes = std::nan("");
  double journal_records = std::nan("");
  double journal_appended = std::nan("");  // growth of the journal file (nan: it was compacted)
  std::string error;
};

absl::StatusOr<Record> RunFilesChild(const FilesClientOptions& o, const TransportSpec& t,
                                     const ScratchDir& scratch, const std::string& name,
                                     double timeout_s) {
  const std::string out = scratch.File(name + ".record");
  std::vector<std::string> args = {"files-client", "--corpus", o.corpus,
                                   "--files", absl::StrCat(o.files),
                                   "--file_bytes", absl::StrCat(o.file_bytes),
                                   "--epochs", absl::StrCat(o.epochs), "--out", out};
  if (!o.service.empty()) {
    args.insert(args.end(), {"--service", o.service, "--protocol", o.protocol,
                             "--max_outstanding_requests", absl::StrCat(o.max_outstanding)});
  }
  return RunRecordChild(args, ChildEnv(t), out, scratch, name, timeout_s);
}

void FillFromRecord(const Record& r, int epochs, Row* row) {
  double later = 0;
  for (int e = 0; e < epochs; ++e) {
    row->epoch_seconds.push_back(RecordNumber(r, absl::StrCat("epoch", e, "_s"), std::nan("")));
    if (e > 0) later += row->epoch_seconds.back();
  }
  const double files = RecordNumber(r, "files_per_epoch");
  row->files_per_s = epochs > 1 ? files * (epochs - 1) / later : files / row->epoch_seconds[0];
  row->client_cpu_s = RecordNumber(r, "cpu_s") / epochs;
}

}  // namespace

absl::StatusOr<Record> RunFilesClient(const FilesClientOptions& o) {
  if (o.epochs < 1) return absl::InvalidArgumentError("--epochs must be at least 1");
  Dataset ds = FilesPipeline(o.corpus);
  if (!o.service.empty()) {
    DistributeOptions d;
    d.service = o.service;
    d.processing_mode = "distributed_epoch";
    d.data_transfer_protocol = o.protocol;
    d.max_outstanding_requests = o.max_outstanding;
    ds = ds.Apply(Distribute(d));
  }
  SLUICE_RETURN_IF_ERROR(ds.status());
  const EpochCount expected = Expected(o.files, o.file_bytes);
  Record r;
  const double c0 = SelfCpuSeconds();
  for (int e = 0; e < o.epochs; ++e) {
    const Clock::time_point t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(EpochCount got, OneEpoch(ds));
    r[absl::StrCat("epoch", e, "_s")] = absl::StrCat(Since(t0));
    if (!(got == expected)) {
      return absl::DataLossError(absl::StrCat("epoch ", e, " delivered ", Describe(got),
                                              "; the corpus is ", Describe(expected)));
    }
  }
  r["cpu_s"] = absl::StrCat(SelfCpuSeconds() - c0);
  r["files_per_epoch"] = absl::StrCat(expected.files);
  return r;
}

absl::Status RunFiles(const FilesArgs& a, const std::string& command) {
  const bool quick = a.common.quick;
  const int64_t files = a.files > 0 ? a.files : quick ? 20000 : 200000;
  const int epochs = a.epochs > 0 ? a.epochs : 2;
  if (a.file_bytes < 8) return absl::InvalidArgumentError("--file_bytes must be at least 8");
  if (a.classes < 1) return absl::InvalidArgumentError("--classes must be at least 1");
  if (a.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  for (int64_t f : a.file_split_files) {
    if (f < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--file_split_files ", f, ": files per split are 0 (the dispatcher's default) or more"));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(Binaries bin, LocateBinaries(a.common.worker_binary, a.common.plugin));
  SLUICE_ASSIGN_OR_RETURN(const std::string dispatcher,
                          LocateDispatcherBinary(a.dispatcher_binary));
  SLUICE_ASSIGN_OR_RETURN(TransportSpec t, ParseTransport(a.transport, a.shm_tls));
  const MachineInfo machine = DescribeMachine();
  SLUICE_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create("sluice_perf_files"));
  if (a.common.keep_logs) scratch.Keep();
  Progress progress("files", 2 + static_cast<int>(a.file_split_files.size()) +
                                 static_cast<int>(files / 20000));
  progress.Step(absl::StrCat("corpus of ", files, " files"));
  SLUICE_ASSIGN_OR_RETURN(Corpus corpus, PrepareCorpus(a, files, &progress));

  FilesClientOptions base;
  base.corpus = corpus.path;
  base.files = corpus.files;
  base.file_bytes = corpus.file_bytes;
  base.epochs = epochs;
  // Generous: one file per split over a loaded machine runs at a few
  // thousand files/s.
  const double timeout_s = 120 + static_cast<double>(files) * epochs / 500.0;
  std::vector<Row> rows;
  bool any_failed = false;

  progress.Step("local");
  {
    Row row;
    row.name = "local (ImageFolder + ReadFile, kAutotune)";
    absl::StatusOr<Record> r =
        RunFilesChild(base, TransportSpec{"local", "", ""}, scratch, "local", timeout_s);
    if (r.ok()) {
      FillFromRecord(*r, epochs, &row);
    } else {
      row.error = OneLine(r.status());
    }
    rows.push_back(row);
  }
  for (int64_t run : a.file_split_files) {
    Row row;
    row.file_split_files = run;
    row.name = absl::StrCat("distributed_epoch, ", a.workers, " worker(s), ",
                            run == 0 ? "automatic runs" : absl::StrCat(run, " file(s) a split"));
    progress.Step(row.name);
    const std::string name = absl::StrCat("split", run);
    ClusterOptions co = ClusterFor(bin, a.common, t, a.workers, scratch, name);
    co.dispatcher_binary = dispatcher;
    co.dispatcher_args = {"--file_split_files", absl::StrCat(run)};
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(co);
    absl::Status st = cluster.status();
    if (st.ok()) {
      const DispatcherProcess& d = *(*cluster)->dispatcher_process();
      const std::vector<int> pids = (*cluster)->worker_pids();
      auto workers_cpu = [&] {
        double s = 0;
        for (int pid : pids) s += ProcCpuSeconds(pid).value_or(0);
        return s;
      };
      const std::string journal = d.work_dir + "/journal";
      auto journal_size = [&] {
        std::error_code ec;
        const auto n = fs::file_size(journal, ec);
        return ec ? std::nan("") : static_cast<double>(n);
      };
      const double js0 = journal_size();
      const auto m0 = ReadMetrics(d.metrics_port);
      const double dcpu0 = ProcCpuSeconds(d.child->pid()).value_or(0);
      const int64_t dw0 = ProcWriteBytes(d.child->pid()).value_or(0);
      const double w0 = workers_cpu();
      FilesClientOptions o = base;
      o.service = (*cluster)->target();
      o.protocol = t.protocol;
      o.max_outstanding = a.max_outstanding;
      absl::StatusOr<Record> r = RunFilesChild(o, t, scratch, name + "-client", timeout_s);
      const auto m1 = ReadMetrics(d.metrics_port);
      st = r.status();
      if (r.ok()) {
        FillFromRecord(*r, epochs, &row);
        auto per_epoch = [&](double v) { return v / epochs; };
        const char* kSplits = "sluice_dispatcher_splits_created_total";
        const char* kRecords = "sluice_dispatcher_journal_records_total";
        row.splits = per_epoch(Metric(m1, kSplits, std::nan("")) - Metric(m0, kSplits, 0));
        const char* kCompactions = "sluice_dispatcher_journal_compactions_total";
        row.journal_records =
            per_epoch(Metric(m1, kRecords, std::nan("")) - Metric(m0, kRecords, 0));
        if (Metric(m1, kCompactions, -1) == Metric(m0, kCompactions, -1)) {
          row.journal_appended = per_epoch(journal_size() - js0);
        }
        row.dispatcher_cpu_s =
            per_epoch(ProcCpuSeconds(d.child->pid()).value_or(std::nan("")) - dcpu0);
        row.journal_bytes = per_epoch(static_cast<double>(
            ProcWriteBytes(d.child->pid()).value_or(dw0) - dw0));
        row.workers_cpu_s = per_epoch(workers_cpu() - w0);
        st = (*cluster)->CheckWorkersAlive();
      }
    }
    if (!st.ok()) row.error = OneLine(st);
    rows.push_back(row);
  }
  progress.Finish();

  for (const Row& r : rows) any_failed |= !r.error.empty();
  const double local = rows.front().files_per_s;
  std::printf("sluice-perf files%s\n", quick ? " --quick" : "");
  std::printf("machine: %s\n", machine.Describe().c_str());
  std::printf("corpus: %s (%s): %lld files of %lld bytes in %lld class folders\n",
              corpus.path.c_str(), corpus.origin.c_str(), static_cast<long long>(corpus.files),
              static_cast<long long>(corpus.file_bytes), static_cast<long long>(corpus.classes));
  std::printf("pipeline: ImageFolder(corpus).Map({ReadFile(path), label}, kAutotune); %d epochs "
              "a row, each checked to be the corpus exactly; files/s over the epochs after the "
              "first; the rest per epoch; %s, %d worker process(es), a sluice-dispatcher process "
              "(fault-tolerant, journal on disk)\n\n",
              epochs, t.name.c_str(), a.workers);
  std::printf("%-46s %10s %8s %7s %11s %10s %12s %11s %12s %10s\n", "row", "files/s",
              "of local", "splits", "files/split", "disp cpu s", "journal KiB", "written KiB",
              "client cpu s", "wrk cpu s");
  std::vector<std::string> row_json;
  for (const Row& r : rows) {
    JsonObject j;
    j.Add("row", r.name).Add("file_split_files", r.file_split_files);
    if (!r.error.empty()) {
      std::printf("%-46s FAILED: %s\n", r.name.c_str(), r.error.substr(0, 200).c_str());
      row_json.push_back(j.Add("error", r.error).str());
      continue;
    }
    const double files_per_split = r.splits > 0 ? static_cast<double>(files) / r.splits
                                                 : std::nan("");
    std::printf("%-46s %10s %8s %7s %11s %10s %12s %11s %12s %10s\n", r.name.c_str(),
                Count(r.files_per_s).c_str(), Pct(r.files_per_s / local).c_str(),
                Count(r.splits).c_str(), Num(files_per_split, 1).c_str(),
                Num(r.dispatcher_cpu_s, 3).c_str(), Num(r.journal_appended / 1024, 1).c_str(),
                Num(r.journal_bytes / 1024, 1).c_str(), Num(r.client_cpu_s, 3).c_str(),
                Num(r.workers_cpu_s, 3).c_str());
    j.Add("files_per_s", r.files_per_s).Add("of_local", r.files_per_s / local);
    j.AddRaw("epoch_seconds", absl::StrCat("[", absl::StrJoin(r.epoch_seconds, ","), "]"));
    j.Add("splits_per_epoch", r.splits).Add("files_per_split", files_per_split);
    j.Add("journal_records_per_epoch", r.journal_records);
    j.Add("dispatcher_cpu_s_per_epoch", r.dispatcher_cpu_s);
    j.Add("journal_appended_bytes_per_epoch", r.journal_appended);
    j.Add("dispatcher_written_bytes_per_epoch", r.journal_bytes);
    j.Add("client_cpu_s_per_epoch", r.client_cpu_s).Add("workers_cpu_s_per_epoch", r.workers_cpu_s);
    row_json.push_back(j.str());
  }
  // Issue #28's targets, on the first automatic-runs row, for an
  // ImageNet-like listing (a small one takes about 256 splits, to spread
  // over the workers).
  std::printf("\n");
  std::vector<std::string> notes;
  if (files < 65536) {
    notes.push_back("targets not checked: they are for listings of 65,536 files or more");
  }
  for (const Row& r : rows) {
    if (files < 65536 || r.file_split_files != 0 || !r.error.empty()) continue;
    // A listing that is not a multiple of 256 ends in a shorter split.
    const double allowed = std::ceil(static_cast<double>(files) / 256);
    const double of_local = r.files_per_s / local;
    notes.push_back(absl::StrCat("target: at most one split per 256 files (", Count(allowed),
                                 " an epoch): ", Count(r.splits), ": ",
                                 r.splits <= allowed ? "MET" : "MISSED"));
    notes.push_back(absl::StrCat("target: files/s within 10% of local: ", Pct(of_local), ": ",
                                 of_local >= 0.9 ? "MET" : "MISSED"));
    break;
  }
  notes.push_back("splits: sluice_dispatcher_splits_created_total (one GetSplit that hands out a "
                  "split each, besides one end-of-splits answer per task and epoch); journal "
                  "KiB: what the journal file grew by ('-' when it was compacted); written KiB: "
                  "what the dispatcher process wrote to storage (/proc/PID/io write_bytes: "
                  "whole pages, each fdatasync rewriting the journal's last page, and "
                  "compactions)");
  Report report;
  report.mode = "files";
  report.command = command;
  report.machine = machine;
  report.fields = {{"files", absl::StrCat(files)},
                   {"file_bytes", absl::StrCat(corpus.file_bytes)},
                   {"epochs", absl::StrCat(epochs)},
                   {"workers", absl::StrCat(a.workers)},
                   {"transport", JsonQuote(t.name)}};
  report.sections = {{"rows", row_json}};
  report.notes = notes;
  return FinishRun(a.common, report, any_failed, scratch);
}

}  // namespace sluice::perf
