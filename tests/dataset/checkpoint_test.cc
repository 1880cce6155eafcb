// Checkpoints of local iterators (Iterator::Save, Dataset::MakeIterator
// with a checkpoint; docs/datasets.md, "Checkpoints"): an iterator restored
// from a checkpoint returns exactly what the saved one would have returned
// next, wherever it was saved; a checkpoint of another pipeline or a
// damaged one is InvalidArgument; an op that cannot save says so.
#include <fstream>
#include <string>
#include <vector>

#include "dataset/dataset.pb.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/tfrecord.h"
#include "sluice/dataset/webdataset.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using expr::x;

std::vector<std::string> Rest(Iterator& it) {
  std::vector<std::string> out;
  while (true) {
    auto e = it.Next();
    EXPECT_OK(e.status());
    if (!e.ok() || !e->has_value()) return out;
    out.push_back(ElementDebugString(**e));
  }
}

// Saves after every prefix length 0..n (n: the whole output, then past the
// end) and checks that the restored iterator continues as the saved one.
void ExpectResumesEverywhere(const Dataset& ds) {
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(auto probe, ds.MakeIterator());
  const size_t n = Rest(*probe).size();
  for (size_t k = 0; k <= n + 1; ++k) {
    SCOPED_TRACE(absl::StrCat("saved after ", k, " of ", n, " elements"));
    ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
    for (size_t i = 0; i < k; ++i) ASSERT_OK(it->Next().status());
    ASSERT_OK_AND_ASSIGN(std::string checkpoint, it->Save());
    const std::vector<std::string> want = Rest(*it);
    ASSERT_OK_AND_ASSIGN(auto restored, ds.MakeIterator(checkpoint));
    EXPECT_EQ(Rest(*restored), want);
    // A checkpoint of a restored iterator is as good.
    ASSERT_OK_AND_ASSIGN(auto again, ds.MakeIterator(checkpoint));
    if (!want.empty()) ASSERT_OK(again->Next().status());
    ASSERT_OK_AND_ASSIGN(std::string second, again->Save());
    ASSERT_OK_AND_ASSIGN(auto twice, ds.MakeIterator(second));
    EXPECT_EQ(Rest(*twice), want.empty() ? want : std::vector<std::string>(want.begin() + 1,
                                                                           want.end()));
  }
}

TEST(CheckpointTest, SourcesAndElementwiseOpsResumeWhereTheyWereSaved) {
  ExpectResumesEverywhere(Dataset::Range(10));
  ExpectResumesEverywhere(Dataset::Range(3, -9, -4));
  ExpectResumesEverywhere(Dataset::Range(50).Map(x * 2).Filter(x % 3 == 0));
  ExpectResumesEverywhere(
      Dataset::FromTensors({{Tensor::String("a")}, {Tensor::String("b")}, {Tensor::String("c")}}));
  ExpectResumesEverywhere(Dataset::Zip({Dataset::Range(10), Dataset::Range(10, 17)}).Enumerate(100));
  ExpectResumesEverywhere(Dataset::Range(30).Shard(3, 1).Take(6).Skip(2));
}

TEST(CheckpointTest, BatchesAndTheRowsOfAnUnbatchedOneResume) {
  ExpectResumesEverywhere(Dataset::Range(23).Batch(5));
  ExpectResumesEverywhere(Dataset::Range(23).Batch(5, /*drop_remainder=*/true).Unbatch());
}

// A shuffle buffer is saved as data with its generator's state: even an
// unseeded shuffle, reshuffled every epoch, continues in the same order.
TEST(CheckpointTest, ShuffleAndRepeatContinueInTheSameRandomOrder) {
  ExpectResumesEverywhere(Dataset::Range(40).Shuffle(16).Take(30));
  ExpectResumesEverywhere(Dataset::Range(7).Shuffle(4).Repeat(3));
  ExpectResumesEverywhere(Dataset::Range(9).Shuffle(5, 42).Batch(2).Repeat(2).Unbatch());
}

// What runs ahead on other threads is saved as the results it produced
// (Prefetch's buffer, a parallel Map's calls in flight), the input at the
// position after them.
TEST(CheckpointTest, PrefetchAndParallelMapSaveWhatTheyHoldAhead) {
  ExpectResumesEverywhere(Dataset::Range(25).Prefetch(4));
  ExpectResumesEverywhere(Dataset::Range(25).Map(x * 3, 4).Prefetch(kAutotune));
  ExpectResumesEverywhere(Dataset::Range(25).Shuffle(6).Map(x + 1, kAutotune).Batch(4));
  ExpectResumesEverywhere(Dataset::Range(12).Map(x * 2, 3, /*deterministic=*/true).Repeat(2));
  // An error the input reached, held ahead, comes after a restore too.
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(5).Map(x / (x - 3), 4).Prefetch(8).MakeIterator());
  ASSERT_OK(it->Next().status());
  absl::SleepFor(absl::Milliseconds(50));  // let the prefetch reach the error
  ASSERT_OK_AND_ASSIGN(std::string checkpoint, it->Save());
  ASSERT_OK_AND_ASSIGN(auto restored,
                       Dataset::Range(5).Map(x / (x - 3), 4).Prefetch(8).MakeIterator(checkpoint));
  int ok = 0;
  absl::Status end;
  for (;;) {
    auto e = restored->Next();
    if (!e.ok()) {
      end = e.status();
      break;
    }
    if (!e->has_value()) break;
    ++ok;
  }
  EXPECT_EQ(ok, 2);
  EXPECT_FALSE(end.ok());
}

TEST(CheckpointTest, ListFilesResumesAtItsPositionInTheSortedList) {
  sluice_test::TempDir dir;
  for (int i = 0; i < 6; ++i) std::ofstream(dir.File(absl::StrCat("f", i))) << i;
  ExpectResumesEverywhere(Dataset::ListFiles(dir.path() + "/f*"));
}

// Readers save the file they have open, where its next record starts, and
// the files named but not opened yet.
TEST(CheckpointTest, RecordReadersResumeAtTheRecordTheyWereAt) {
  sluice_test::TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(dir.File(absl::StrCat("r", f)));
    std::vector<std::string> recs;
    for (int r = 0; r <= f + 1; ++r) recs.push_back(absl::StrCat("file ", f, " record ", r));
    ASSERT_OK(WriteTFRecordFile(files.back(), recs));
  }
  ExpectResumesEverywhere(Dataset::ReadRecords(files));
  // File names in one vector element: the rest of it is held by the reader.
  ExpectResumesEverywhere(Dataset::ReadRecords(Dataset::FromTensors({{Tensor::Strings(files)}})));
  for (int f = 0; f < 2; ++f) {
    std::ofstream(dir.File(absl::StrCat("fixed", f))) << "HH" << "aaaabbbbcccc" << "F";
  }
  ExpectResumesEverywhere(Dataset::ReadFixedLengthRecords(
      {dir.File("fixed0"), dir.File("fixed1")}, 4, /*header_bytes=*/2, /*footer_bytes=*/1));
}

// WebDataset saves the shard it has open and how many samples of it it
// read (incomplete ones passed over included).
TEST(CheckpointTest, WebDatasetResumesAtTheSampleItWasAt) {
  sluice_test::TempDir dir;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int i = 0; i <= s + 1; ++i) {
      members.emplace_back(absl::StrCat(s, "_", i, ".txt"), absl::StrCat("shard ", s, " ", i));
      if (i != 1) members.emplace_back(absl::StrCat(s, "_", i, ".cls"), absl::StrCat(i));
    }
    ASSERT_OK(WriteWebDatasetShard(dir.File(absl::StrCat("w", s, ".tar")), members));
  }
  ExpectResumesEverywhere(
      Dataset::WebDataset(dir.path() + "/w*.tar", {"cls", "txt"}, /*skip_incomplete=*/true));
  ExpectResumesEverywhere(Dataset::WebDataset(dir.path() + "/w*.tar", {"txt", "__key__"}));
}

// Interleave saves each open slot as the input element that opened it
// (its dataset is made again from it), that dataset's position and what a
// parallel fill read ahead.
TEST(CheckpointTest, InterleaveResumesEverySlotOfItsCycle) {
  auto fn = [](const Dataset& d) { return d.Repeat(3).Enumerate(); };
  ExpectResumesEverywhere(Dataset::Range(5).Interleave(fn, /*cycle_length=*/2, /*block=*/2));
  ExpectResumesEverywhere(Dataset::Range(7).Interleave(fn, 3, 1, /*num_parallel_calls=*/3));
  ExpectResumesEverywhere(
      Dataset::Range(6).Shuffle(3).Interleave([](const Dataset& d) { return d.Shuffle(2).Repeat(2); },
                                              2, 3, kAutotune));
  sluice_test::TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(dir.File(absl::StrCat("r", f)));
    ASSERT_OK(WriteTFRecordFile(files.back(), {absl::StrCat(f, "a"), absl::StrCat(f, "b"),
                                               absl::StrCat(f, "c")}));
  }
  ExpectResumesEverywhere(Dataset::ListFiles(dir.path() + "/r*").Interleave(
      [](const Dataset& d) { return Dataset::ReadRecords(d); }, 2, 1, 2));
}

TEST(CheckpointTest, ACheckpointOfAnotherPipelineOrADamagedOneIsInvalidArgument) {
  const Dataset ds = Dataset::Range(10).Map(x + 1);
  ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
  ASSERT_OK(it->Next().status());
  ASSERT_OK_AND_ASSIGN(std::string checkpoint, it->Save());
  EXPECT_STATUS(Dataset::Range(10).Map(x + 2).MakeIterator(checkpoint),
                absl::StatusCode::kInvalidArgument, "another pipeline");
  EXPECT_STATUS(ds.MakeIterator(checkpoint.substr(0, checkpoint.size() / 2)),
                absl::StatusCode::kInvalidArgument, "checkpoint");
  EXPECT_STATUS(ds.MakeIterator("not a checkpoint at all"), absl::StatusCode::kInvalidArgument,
                "checkpoint");
  proto::IteratorCheckpoint c;
  ASSERT_TRUE(c.ParseFromString(checkpoint));
  proto::IteratorCheckpoint version = c;
  version.set_format_version(99);
  EXPECT_STATUS(ds.MakeIterator(version.SerializeAsString()), absl::StatusCode::kInvalidArgument,
                "format version 99");
  proto::IteratorCheckpoint wrong_op = c;
  wrong_op.mutable_root()->set_op("Shuffle");
  EXPECT_STATUS(ds.MakeIterator(wrong_op.SerializeAsString()), absl::StatusCode::kInvalidArgument,
                "saved Shuffle where the pipeline has Map");
  proto::IteratorCheckpoint no_input = c;
  no_input.mutable_root()->clear_inputs();
  EXPECT_STATUS(ds.MakeIterator(no_input.SerializeAsString()),
                absl::StatusCode::kInvalidArgument, "0 input(s)");
}

// (Distribute, which cannot save yet, is checked in service_test.)
TEST(CheckpointTest, AFailedIteratorCannotSave) {
  ASSERT_OK_AND_ASSIGN(auto failing, Dataset::Range(10).Map(x / (x - 1)).MakeIterator());
  ASSERT_OK(failing->Next().status());
  ASSERT_FALSE(failing->Next().ok());
  EXPECT_STATUS(failing->Save(), absl::StatusCode::kFailedPrecondition, "failed");
}

}  // namespace
}  // namespace sluice
