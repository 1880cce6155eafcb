// Smoke test of sluice-perf (SLUICE_PERF_BIN): tiny configurations of its
// subcommands, run as a real process with real worker processes. Asserts
// what the tool reports (one row per size x transport, positive element
// counts, no client payload copies on UCX), never timing. Also the corpus
// tool of `images` (SLUICE_CORPUS_TOOL_BIN).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Scratch(const std::string& name) {
  std::string dir = ::testing::TempDir();
  if (dir.empty() || dir.back() != '/') dir += '/';
  return absl::StrCat(dir, "sluice_perf_smoke_", getpid(), "_", name);
}

// Runs sluice-perf with `args`; returns its exit code, output in *output.
// `env`: "NAME='value' " assignments put before the command.
int RunPerf(const std::string& args, std::string* output, const std::string& env = "") {
  const std::string log = Scratch("out.txt");
  const std::string cmd =
      absl::StrCat(env, "'", SLUICE_PERF_BIN, "' ", args, " > '", log, "' 2>&1");
  int status = std::system(cmd.c_str());
  *output = ReadFile(log);
  std::remove(log.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The JSON rows (one object per line, see sluice-perf) matching `pattern`.
std::vector<std::string> Rows(const std::string& json, const std::string& pattern) {
  std::vector<std::string> rows;
  std::istringstream in(json);
  std::string line;
  const std::regex re(pattern);
  while (std::getline(in, line)) {
    if (std::regex_search(line, re)) rows.push_back(line);
  }
  return rows;
}

long Field(const std::string& row, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(row, m, std::regex("\"" + key + "\":(-?[0-9]+)"))) return -1;
  return std::stol(m[1]);
}

// A number field (a JSON double such as 0.004 or 4.1e-03); -1 if absent.
double FieldDouble(const std::string& row, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(row, m, std::regex("\"" + key + "\":(-?[0-9.eE+-]+)"))) return -1;
  return std::stod(m[1]);
}

TEST(PerfSmokeTest, TransportReportsOneRowPerSizeAndTransport) {
  const std::string json = Scratch("transport.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("transport --sizes 64,4K --transports ucx-tcp,grpc "
                                      "--seconds 0.2 --latency_elements 5 --no_ceilings "
                                      "--no_python --json '",
                                      json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_THAT(text, ::testing::HasSubstr("\"mode\": \"transport\""));
  for (const std::string transport : {"ucx-tcp", "grpc"}) {
    for (long size : {64L, 4096L}) {
      auto rows = Rows(text, absl::StrCat("\"transport\":\"", transport,
                                          "\".*\"size_bytes\":", size, ","));
      ASSERT_EQ(rows.size(), 1u) << transport << " " << size << "\n" << text;
      EXPECT_GT(Field(rows[0], "elements"), 0) << rows[0];
      EXPECT_GT(Field(rows[0], "latency_samples"), 0) << rows[0];
      if (transport == "ucx-tcp") {
        // Replies of at most 4 KiB come eagerly over tcp (EagerReplies::kAuto:
        // a slow run, e.g. under ASan, batches fewer elements per reply):
        // each payload byte is copied at most once.
        EXPECT_LE(Field(rows[0], "client_payload_bytes_copied"), Field(rows[0], "bytes"))
            << rows[0];
        EXPECT_GT(Field(rows[0], "ucx_elements_received"), 0) << rows[0];
      }
    }
  }
  // The table a person reads.
  EXPECT_THAT(out, ::testing::HasSubstr("transport"));
  EXPECT_THAT(out, ::testing::HasSubstr("4 KiB"));
  EXPECT_THAT(out, ::testing::HasSubstr("python rows skipped: --no_python"));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("\"client\":\"python\"")));
}

// --max_bytes ends a timed pass at that many payload bytes (plus the
// element that crosses it), long before its --seconds; without it the pass
// would move what 32 GB/s moves in --seconds.
TEST(PerfSmokeTest, TransportPassesStopAtTheirByteCap) {
  const std::string json = Scratch("transport_max_bytes.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("transport --quick --sizes 1M --transports ucx-tcp "
                                      "--seconds 20 --max_bytes 8388608 --latency_elements 0 "
                                      "--no_ceilings --no_python --json '",
                                      json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  auto rows = Rows(text, "\"transport\":\"ucx-tcp\".*\"size_bytes\":1048576,");
  ASSERT_EQ(rows.size(), 1u) << text;
  EXPECT_GT(Field(rows[0], "bytes"), 0) << rows[0];
  EXPECT_LE(Field(rows[0], "bytes"), 9 * 1048576) << rows[0];
}

// The python rows (sluice from Python beside each C++ UCX row) and the torch
// DataLoader rows, in a tiny run: one row per size each, or the note saying
// why they were skipped (the module not built, torch not installed).
TEST(PerfSmokeTest, TransportReportsPythonAndTorchRows) {
  const std::string json = Scratch("transport_python.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("transport --quick --sizes 64,1M --transports ucx-tcp "
                                      "--seconds 0.2 --latency_elements 5 --no_ceilings --json '",
                                      json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  const bool python_skipped = text.find("python rows skipped: ") != std::string::npos;
  const bool torch_skipped = text.find("torch rows skipped: ") != std::string::npos;
  for (long size : {64L, 1048576L}) {
    auto cpp = Rows(text, absl::StrCat("\"client\":\"c\\+\\+\",\"transport\":\"ucx-tcp\".*"
                                       "\"size_bytes\":", size, ","));
    ASSERT_EQ(cpp.size(), 1u) << size << "\n" << text;
    auto py = Rows(text, absl::StrCat("\"client\":\"python\",\"transport\":\"ucx-tcp\".*"
                                      "\"size_bytes\":", size, ","));
    if (python_skipped) {
      EXPECT_TRUE(py.empty()) << text;
    } else {
      ASSERT_EQ(py.size(), 1u) << size << "\n" << text;
      EXPECT_GT(Field(py[0], "elements"), 0) << py[0];
      EXPECT_GT(Field(py[0], "latency_samples"), 0) << py[0];
      // As above: small replies over tcp may be copied once, never more.
      EXPECT_LE(Field(py[0], "client_payload_bytes_copied"), Field(py[0], "bytes")) << py[0];
      EXPECT_NE(py[0].find("\"ratio_vs_cpp\":"), std::string::npos) << py[0];
    }
    auto torch = Rows(text, absl::StrCat("\"client\":\"torch\",\"transport\":\"DataLoader\""
                                         ".*\"size_bytes\":", size, ","));
    if (torch_skipped) {
      EXPECT_TRUE(torch.empty()) << text;
    } else {
      ASSERT_EQ(torch.size(), 1u) << size << "\n" << text;
      EXPECT_GT(Field(torch[0], "elements"), 0) << torch[0];
      EXPECT_EQ(Field(torch[0], "num_workers"), 2) << torch[0];
    }
  }
  if (!python_skipped) {
    EXPECT_THAT(text, ::testing::HasSubstr("\"target\":\"python ucx-tcp 64 B: <= 2 us per element"));
    EXPECT_THAT(text, ::testing::HasSubstr("\"target\":\"python ucx-tcp 1 MiB: >= 90% of the C++"));
    EXPECT_THAT(out, ::testing::HasSubstr("python ucx-tcp"));
  }
  if (!torch_skipped) {
    EXPECT_THAT(out, ::testing::HasSubstr("torch  DataLoader"));
  }
}

TEST(PerfSmokeTest, PipelineReportsEachWorkerCount) {
  const std::string json = Scratch("pipeline.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("pipeline --workers 1,2 --max_outstanding_requests 2 "
                                      "--seconds 0.3 --work_us 100 --json '", json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  for (int w : {1, 2}) {
    auto rows = Rows(text, absl::StrCat("\"workers\":", w, ",\"max_outstanding_requests\":2,"));
    ASSERT_EQ(rows.size(), 1u) << text;
    EXPECT_GT(Field(rows[0], "elements"), 0) << rows[0];
  }
  // The machine's floor for the client's CPU per element, measured in the run.
  EXPECT_THAT(text, ::testing::ContainsRegex("\"client_cpu_us_floor\": [0-9.]+[,\n]")) << text;
  EXPECT_THAT(out, ::testing::HasSubstr("client us/elem floor on this machine: "));
}

// A row that asked for UCX but whose elements came over gRPC (a worker
// whose UCX data plane could not start serves over gRPC, and the client
// follows it) fails, saying so, rather than reporting gRPC's figures as
// UCX's. The worker here is a wrapper that turns the suite's
// `--data_transfer_protocol ucx` into grpc.
TEST(PerfSmokeTest, ARowAskedForUcxButCarriedByGrpcFails) {
  const std::string wrapper = Scratch("grpc_only_worker.sh");
  {
    std::ofstream f(wrapper);
    f << "#!/bin/bash\nargs=()\nfor a in \"$@\"; do [ \"$a\" = ucx ] && a=grpc; "
         "args+=(\"$a\"); done\nexec '"
      << SLUICE_WORKER_BIN << "' \"${args[@]}\"\n";
  }
  ASSERT_EQ(chmod(wrapper.c_str(), 0755), 0);
  std::string out;
  const int rc = RunPerf(absl::StrCat("pipeline --workers 1 --max_outstanding_requests 1 "
                                      "--seconds 0.3 --work_us 100 --worker_binary '",
                                      wrapper, "'"),
                         &out);
  std::remove(wrapper.c_str());
  EXPECT_NE(rc, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("asked for ucx, but none of its")) << out;
}

TEST(PerfSmokeTest, EngineReportsEachSection) {
  const std::string json = Scratch("engine.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("engine --quick --seconds 0.2 --work_us 100 --json '", json,
                                      "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_EQ(Rows(text, "\"expression\":\"x \\* 2.0f \\+ 1.0f\",.*\"anchor_ms\"").size(), 1u)
      << text;
  for (const char* calls : {"\"1\"", "\"2\"", "\"kAutotune\""}) {
    auto rows = Rows(text, absl::StrCat("\"num_parallel_calls\":", calls, ",\"elements_per_s\""));
    ASSERT_EQ(rows.size(), 1u) << calls << "\n" << text;
  }
  auto fresh = Rows(text, "\"transport\":\"ucx-shm\",\"prebuilt_gb_per_s\"");
  ASSERT_EQ(fresh.size(), 1u) << text;
  EXPECT_NE(fresh[0].find("fresh_gb_per_s"), std::string::npos);
}

// The dispatcher suite on a tiny fleet: every calls/s row and the fleet's
// figures are reported, every simulated worker registered, its tasks held,
// splits handed out, and no call failed.
TEST(PerfSmokeTest, DispatcherReportsRatesAndTheFleet) {
  const std::string json = Scratch("dispatcher.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("dispatcher --workers 20 --consumers 10 --jobs 2 "
                                      "--seconds 2 --rate_seconds 0.3 --callers 1,4 --json '",
                                      json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_THAT(text, ::testing::HasSubstr("\"mode\": \"dispatcher\""));
  for (const char* op : {"RegisterDataset", "GetOrCreateIteration", "GetSplit"}) {
    for (int callers : {1, 4}) {
      auto rows = Rows(text, absl::StrCat("\"op\":\"", op, "\",\"callers\":", callers, ","));
      ASSERT_EQ(rows.size(), 1u) << op << " x" << callers << "\n" << text;
      EXPECT_GT(Field(rows[0], "calls_per_s"), 0) << rows[0];
      EXPECT_NE(rows[0].find("\"error\":\"\""), std::string::npos) << rows[0];
    }
  }
  EXPECT_THAT(text, ::testing::HasSubstr("\"registered\":20,\"tasks\":40,"));
  EXPECT_THAT(text, ::testing::HasSubstr("\"errors\":0,\"error\":\"\""));
  auto fleet = Rows(text, "\"splits_per_s\":");
  ASSERT_EQ(fleet.size(), 1u) << text;
  EXPECT_GT(Field(fleet[0], "splits_per_s"), 0) << fleet[0];
  EXPECT_GT(Field(fleet[0], "rss_bytes"), 0) << fleet[0];
  EXPECT_THAT(out, ::testing::HasSubstr("worker heartbeat lateness"));
}

// --journal_sync_delay_us: every sync of the dispatcher's journal takes at
// least that long, so one caller, whose every GetSplit waits for a sync of
// its own, cannot exceed 1 / delay calls a second (about 2,000 here without
// it); the report names the delay.
TEST(PerfSmokeTest, DispatcherJournalSyncDelayEmulatesASlowerDisk) {
  const std::string json = Scratch("dispatcher_slow_sync.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("dispatcher --no_fleet --rate_seconds 0.5 --callers 1 "
                                      "--journal_sync_delay_us 50000 --json '", json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_THAT(text, ::testing::HasSubstr("\"journal_sync_delay_us\": 50000"));
  EXPECT_THAT(out, ::testing::HasSubstr("journal syncs made 50000 us longer"));
  auto rows = Rows(text, "\"op\":\"GetSplit\",\"callers\":1,");
  ASSERT_EQ(rows.size(), 1u) << text;
  EXPECT_GT(Field(rows[0], "calls_per_s"), 0) << rows[0];
  EXPECT_LE(Field(rows[0], "calls_per_s"), 20.0) << rows[0];
  EXPECT_NE(rows[0].find("\"error\":\"\""), std::string::npos) << rows[0];
}

// The images suite on a 32-image corpus, one worker, DataLoader(num_workers=0),
// one timed pass each: every section is reported; the torch row may be skipped (with a note)
// where torch is not installed.
TEST(PerfSmokeTest, ImagesQuickReportsEachSection) {
  const std::string json = Scratch("images.json");
  const std::string corpus = Scratch("images_corpus");
  std::string out;
  const int rc = RunPerf(absl::StrCat("images --quick --images 32 --classes 4 --workers 1 "
                                      "--torch_workers 0 --seconds 0 --corpus '",
                                      corpus, "' --json '", json, "'"),
                         &out);
  std::filesystem::remove_all(corpus);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_THAT(text, ::testing::HasSubstr("\"mode\": \"images\""));
  EXPECT_THAT(text, ::testing::HasSubstr("\"images\":32,\"classes\":4"));  // the corpus
  auto local = Rows(text, "\"kind\":\"sluice-local\"");
  ASSERT_EQ(local.size(), 1u) << text;
  EXPECT_EQ(Field(local[0], "images"), 32) << local[0];
  EXPECT_NE(local[0].find("\"cpu_ms_per_image\":"), std::string::npos) << local[0];
  EXPECT_GT(Field(local[0], "peak_rss_bytes"), 0) << local[0];
  auto dist = Rows(text, "\"kind\":\"sluice-distribute\",\"workers\":1,");
  ASSERT_EQ(dist.size(), 1u) << text;
  EXPECT_EQ(Field(dist[0], "images"), 32) << dist[0];  // distributed_epoch: each image once
  EXPECT_GT(Field(dist[0], "workers_peak_rss_bytes"), 0) << dist[0];
  auto uint8 = Rows(text, "\"kind\":\"sluice-distribute-uint8\",\"workers\":1,");
  ASSERT_EQ(uint8.size(), 1u) << text;
  EXPECT_EQ(Field(uint8[0], "images"), 32) << uint8[0];
  auto torch = Rows(text, "\"kind\":\"torch\",\"workers\":0,");
  if (torch.empty()) {
    EXPECT_THAT(text, ::testing::HasSubstr("torch rows skipped")) << text;
  } else {
    ASSERT_EQ(torch.size(), 1u) << text;
    EXPECT_EQ(Field(torch[0], "images"), 32) << torch[0];
    EXPECT_EQ(Rows(text, "\"target\":\"CPU/image: sluice local / DataLoader\\(num_workers=0\\)\"")
                  .size(),
              1u)
        << text;
  }
  EXPECT_EQ(Rows(text, "\"target\":\"CPU/image: sluice distribute 1 worker / local\"").size(), 1u)
      << text;
  // The table a person reads.
  EXPECT_THAT(out, ::testing::HasSubstr("sluice local"));
  EXPECT_THAT(out, ::testing::HasSubstr("sluice distribute, 1 worker"));
  EXPECT_THAT(out, ::testing::HasSubstr("targets"));
}

// --format webdataset: the corpus is made into shards (under TMPDIR) and
// every row, the tarfile-streaming DataLoader's included, reads each image
// once per pass.
TEST(PerfSmokeTest, ImagesReadFromWebDatasetShards) {
  const std::string json = Scratch("wds.json");
  const std::string tmp = Scratch("wds_tmp");
  std::filesystem::create_directories(tmp);
  std::string out;
  const int rc = RunPerf(absl::StrCat("images --quick --format webdataset --images 24 --classes 3 "
                                      "--samples_per_shard 5 --workers 1 --torch_workers 0 "
                                      "--seconds 0 --corpus '",
                                      tmp, "/corpus' --json '", json, "'"),
                         &out, "TMPDIR='" + tmp + "' ");
  std::string shards;
  for (const auto& e : std::filesystem::directory_iterator(tmp)) {
    if (e.path().filename().string().rfind("sluice-perf-webdataset-", 0) == 0) {
      shards = e.path().string();
    }
  }
  const bool five_shards = !shards.empty() && std::filesystem::exists(shards + "/shard-000004.tar") &&
                           !std::filesystem::exists(shards + "/shard-000005.tar");
  std::filesystem::remove_all(tmp);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(five_shards) << "24 images at 5 per shard, under TMPDIR: " << shards;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_THAT(text, ::testing::HasSubstr("\"format\": \"webdataset\""));
  for (const char* kind : {"\"kind\":\"sluice-local\"", "\"kind\":\"sluice-distribute\",",
                           "\"kind\":\"sluice-distribute-uint8\""}) {
    auto rows = Rows(text, kind);
    ASSERT_EQ(rows.size(), 1u) << kind << " in " << text;
    EXPECT_EQ(Field(rows[0], "images"), 24) << rows[0];
  }
  auto torch = Rows(text, "\"kind\":\"torch\",\"workers\":0,");
  if (torch.empty()) {
    EXPECT_THAT(text, ::testing::HasSubstr("torch rows skipped")) << text;
  } else {
    EXPECT_EQ(Field(torch[0], "images"), 24) << torch[0];
  }
  EXPECT_THAT(out, ::testing::HasSubstr("WebDataset(shard-*.tar"));
}

// One row per transport, kind and codec; text shrinks on the wire with lz4,
// random bytes do not.
TEST(PerfSmokeTest, CompressionReportsEveryRowAndTheWireBytes) {
  const std::string json = Scratch("compression.json");
  std::string out;
  const int rc = RunPerf(absl::StrCat("compression --quick --seconds 0.2 --size 262144 "
                                      "--transports grpc,ucx-tcp --workloads text,noise "
                                      "--codecs none,lz4 --json '", json, "'"),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  EXPECT_EQ(Rows(text, "\"transport\":\"").size(), 8u) << text;
  auto wire = [&](const std::string& row) {
    auto rows = Rows(text, row);
    EXPECT_EQ(rows.size(), 1u) << row << " in " << text;
    return rows.empty() ? -1.0 : FieldDouble(rows[0], "wire_bytes_per_payload_byte");
  };
  for (const char* t : {"grpc", "ucx-tcp"}) {
    const std::string p = absl::StrCat("\"transport\":\"", t, "\",\"workload\":\"");
    EXPECT_LT(wire(p + "text\",\"codec\":\"lz4\""), 0.1);
    EXPECT_GT(wire(p + "text\",\"codec\":\"none\""), 0.9);
    EXPECT_GT(wire(p + "noise\",\"codec\":\"lz4\""), 0.9);
  }
  EXPECT_THAT(out, ::testing::HasSubstr("client cpu s/GB"));
}

// `files`: a local row and one distributed_epoch row per --file_split_files,
// each epoch checked to be the corpus exactly, with the dispatcher's splits
// per epoch; a corpus that lost a file fails the rows instead of reporting
// a rate.
TEST(PerfSmokeTest, FilesReportsSplitsPerEpochAndChecksEveryEpoch) {
  const std::string corpus = Scratch("files_corpus");
  const std::string json = Scratch("files.json");
  const std::string args =
      absl::StrCat("files --quick --files 600 --classes 4 --file_bytes 64 --epochs 2 "
                   "--file_split_files 0,1 --corpus '", corpus, "' --json '", json, "'");
  std::string out;
  ASSERT_EQ(RunPerf(args, &out), 0) << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  ASSERT_EQ(Rows(text, "\"row\":\"").size(), 3u) << text;
  auto row = [&](int split_files) {
    auto rows = Rows(text, absl::StrCat("\"file_split_files\":", split_files, ","));
    EXPECT_EQ(rows.size(), 1u) << text;
    return rows.empty() ? std::string() : rows[0];
  };
  // 600 files: the automatic run is 600 / 256 = 2 files, so 300 splits an
  // epoch; one file a split is 600.
  EXPECT_EQ(FieldDouble(row(0), "splits_per_epoch"), 300) << text;
  EXPECT_EQ(FieldDouble(row(1), "splits_per_epoch"), 600) << text;
  EXPECT_GT(FieldDouble(row(0), "files_per_s"), 0) << text;
  EXPECT_GT(FieldDouble(row(-1), "files_per_s"), 0) << text;
  // The journal records the splits, not the listing with each of them.
  EXPECT_GT(FieldDouble(row(0), "journal_records_per_epoch"), 300) << text;
  EXPECT_THAT(out, ::testing::HasSubstr("targets not checked"));

  // A file gone from the corpus: every row fails, naming what it got. A
  // failed run keeps its scratch folder (the children's logs) under
  // $TMPDIR: here one of the test's own, removed after.
  ASSERT_EQ(std::system(absl::StrCat("rm -f '", corpus, "/c0001/f00000005.bin'").c_str()), 0);
  const std::string kept = Scratch("files_kept");
  std::filesystem::create_directories(kept);
  ASSERT_NE(RunPerf(args, &out, absl::StrCat("TMPDIR='", kept, "' ")), 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("599 files"));
  EXPECT_THAT(out, ::testing::HasSubstr("FAILED"));
  EXPECT_FALSE(std::filesystem::is_empty(kept)) << out;
  std::filesystem::remove_all(kept);
  std::remove(json.c_str());
  std::system(absl::StrCat("rm -rf '", corpus, "'").c_str());

  ASSERT_NE(RunPerf("files --file_split_files -1", &out), 0);
  EXPECT_THAT(out, ::testing::HasSubstr("--file_split_files -1"));
}

TEST(PerfSmokeTest, CheckpointReportsSavesAndAnExactRestore) {
  const std::string json = Scratch("checkpoint.json");
  std::string out;
  ASSERT_EQ(RunPerf(absl::StrCat("checkpoint --elements 20000 --split_elements 100 --saves 3 "
                                 "--json '", json, "'"),
                    &out),
            0)
      << out;
  const std::string text = ReadFile(json);
  std::remove(json.c_str());
  const std::vector<std::string> saves = Rows(text, "\"fraction\":");
  ASSERT_EQ(saves.size(), 3u) << text;
  // Later saves list more splits.
  EXPECT_GT(Field(saves[0], "bytes"), 0) << text;
  EXPECT_GT(Field(saves[2], "bytes"), Field(saves[0], "bytes")) << text;
  EXPECT_EQ(Field(saves[2], "delivered"), 18000) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("\"rest_exact\": true"));
  EXPECT_THAT(out, ::testing::HasSubstr("exactly the elements not delivered"));
  ASSERT_NE(RunPerf("checkpoint --split_elements 0", &out), 0);
}

TEST(PerfSmokeTest, JpegCorpusIsDeterministicAndChecksItsArguments) {
  const std::string a = Scratch("corpus_a"), b = Scratch("corpus_b");
  auto make = [](const std::string& args, std::string* output) {
    const std::string log = Scratch("corpus_out.txt");
    const int status = std::system(
        absl::StrCat("'", SLUICE_CORPUS_TOOL_BIN, "' ", args, " > '", log, "' 2>&1").c_str());
    *output = ReadFile(log);
    std::remove(log.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string out;
  ASSERT_EQ(make(absl::StrCat("--out '", a, "' --images 5 --classes 2 --seed 7"), &out), 0) << out;
  ASSERT_EQ(make(absl::StrCat("--out '", b, "' --images 5 --classes 2 --seed 7 --threads 1"), &out),
            0)
      << out;
  for (const char* f : {"/class_000/img_000000.jpg", "/class_001/img_000003.jpg",
                        "/class_000/img_000004.jpg", "/corpus.txt"}) {
    const std::string bytes = ReadFile(a + f);
    ASSERT_FALSE(bytes.empty()) << f;
    EXPECT_EQ(bytes, ReadFile(b + f)) << f;  // the same seed gives the same files
  }
  const std::string jpeg = ReadFile(a + "/class_000/img_000000.jpg");
  EXPECT_EQ(jpeg.substr(0, 2), "\xff\xd8");
  EXPECT_GT(jpeg.size(), 20000u);  // photo-like content, not a flat image
  EXPECT_THAT(ReadFile(a + "/corpus.txt"), ::testing::HasSubstr("images=5\n"));
  // A non-empty directory, and impossible arguments, are refused with a message.
  EXPECT_NE(make(absl::StrCat("--out '", a, "' --images 5 --classes 2"), &out), 0);
  EXPECT_THAT(out, ::testing::HasSubstr("is not empty"));
  EXPECT_NE(make(absl::StrCat("--out '", b, "x' --images 2 --classes 3"), &out), 0);
  EXPECT_THAT(out, ::testing::HasSubstr("every class needs at least one image"));
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
  std::filesystem::remove_all(b + "x");
}

TEST(PerfSmokeTest, BadArgumentsFailWithAMessage) {
  std::string out;
  EXPECT_NE(RunPerf("transport --transports carrier-pigeon --no_ceilings", &out), 0);
  EXPECT_THAT(out, ::testing::HasSubstr("unknown transport 'carrier-pigeon'"));
}

}  // namespace
