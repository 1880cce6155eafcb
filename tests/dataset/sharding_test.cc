// Static sharding: the rewrite workers apply for processing_mode file,
// data, file_or_data and hint (dataset_internal.h).
#include <string>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/tfrecord.h"
#include "sluice/dataset/webdataset.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice {
namespace {

using internal::ApplyStaticSharding;
using internal::StaticSharding;
using ::sluice_test::Collect;
using ::sluice_test::CollectScalars;
using ::sluice_test::TempDir;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using expr::x;

// `ds` rewritten for shard `index` of `n`, rebuilt as a Dataset.
absl::StatusOr<Dataset> Sharded(const Dataset& ds, StaticSharding policy, int64_t n,
                                int64_t index) {
  SLUICE_ASSIGN_OR_RETURN(proto::DatasetDef def,
                          ApplyStaticSharding(ds.def(), policy, n, index));
  return Dataset::FromDef(def);
}

// Records of every file, "f<file>r<record>", written to `dir` as f00..f<n-1>.
std::string WriteFiles(const TempDir& dir, int n, int records) {
  for (int f = 0; f < n; ++f) {
    std::vector<std::string> recs;
    for (int r = 0; r < records; ++r) recs.push_back(absl::StrCat("f", f, "r", r));
    std::string name = absl::StrCat("f", f < 10 ? "0" : "", f);
    EXPECT_OK(WriteTFRecordFile(dir.File(name), recs));
  }
  return dir.File("f*");
}

std::vector<std::string> Strings(const std::vector<Element>& v) {
  std::vector<std::string> out;
  for (const Element& e : v) out.emplace_back(e[0].str(0));
  return out;
}

TEST(StaticShardingTest, DataKeepsEveryNthOutputElement) {
  ASSERT_OK_AND_ASSIGN(Dataset ds,
                       Sharded(Dataset::Range(100), StaticSharding::kData, 5, 1));
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(ds));
  std::vector<int64_t> want;
  for (int64_t i = 1; i < 100; i += 5) want.push_back(i);
  EXPECT_THAT(v, ElementsAreArray(want));
  // The shard is of the pipeline's output (after Filter), not its source.
  ASSERT_OK_AND_ASSIGN(Dataset odd, Sharded(Dataset::Range(20).Filter(x % 2 == 1),
                                            StaticSharding::kData, 2, 0));
  EXPECT_THAT(*CollectScalars<int64_t>(odd), ElementsAre(1, 5, 9, 13, 17));
}

TEST(StaticShardingTest, FileReadsOnlyItsFiles) {
  TempDir dir;
  std::string pattern = WriteFiles(dir, 10, 2);
  Dataset ds = Dataset::ReadRecords(Dataset::ListFiles(pattern));
  ASSERT_OK_AND_ASSIGN(Dataset s3, Sharded(ds, StaticSharding::kFile, 5, 3));
  ASSERT_OK_AND_ASSIGN(auto got, Collect(s3));
  EXPECT_THAT(Strings(got), ElementsAre("f3r0", "f3r1", "f8r0", "f8r1"));
  // File names given as a list, and files interleaved: the same files.
  std::vector<std::string> files;
  for (int f = 0; f < 10; ++f) files.push_back(dir.File(absl::StrCat("f0", f)));
  ASSERT_OK_AND_ASSIGN(Dataset listed,
                       Sharded(Dataset::ReadRecords(files), StaticSharding::kFile, 5, 3));
  EXPECT_THAT(Strings(*Collect(listed)), ElementsAre("f3r0", "f3r1", "f8r0", "f8r1"));
  Dataset interleaved = Dataset::FromTensors([&] {
                          std::vector<Element> names;
                          for (const auto& f : files) names.push_back({Tensor::String(f)});
                          return names;
                        }())
                            .Interleave([](const Dataset& f) { return Dataset::ReadRecords(f); },
                                        2, 1);
  ASSERT_OK_AND_ASSIGN(Dataset il, Sharded(interleaved, StaticSharding::kFile, 5, 3));
  EXPECT_THAT(Strings(*Collect(il)), ElementsAre("f3r0", "f8r0", "f3r1", "f8r1"));
  // FILE_OR_DATA picks files when there are some.
  ASSERT_OK_AND_ASSIGN(Dataset either, Sharded(ds, StaticSharding::kFileOrData, 5, 3));
  EXPECT_THAT(Strings(*Collect(either)), ElementsAre("f3r0", "f3r1", "f8r0", "f8r1"));
}

// WebDataset shards are sharded as the files of ReadRecords are.
TEST(StaticShardingTest, FileShardsWebDatasetShards) {
  TempDir dir;
  for (int f = 0; f < 4; ++f) {
    ASSERT_OK(WriteWebDatasetShard(dir.File(absl::StrCat("w", f, ".tar")),
                                   {{absl::StrCat(f, "_a.txt"), absl::StrCat("w", f, "a")},
                                    {absl::StrCat(f, "_b.txt"), absl::StrCat("w", f, "b")}}));
  }
  ASSERT_OK_AND_ASSIGN(Dataset s1, Sharded(Dataset::WebDataset(dir.File("w*.tar"), {"txt"}),
                                           StaticSharding::kFile, 2, 1));
  EXPECT_THAT(Strings(*Collect(s1)), ElementsAre("w1a", "w1b", "w3a", "w3b"));
}

TEST(StaticShardingTest, FewerFilesThanWorkersIsAnError) {
  TempDir dir;
  std::string pattern = WriteFiles(dir, 3, 1);
  EXPECT_STATUS(ApplyStaticSharding(Dataset::ReadRecords(Dataset::ListFiles(pattern)).def(),
                                    StaticSharding::kFile, 5, 0),
                absl::StatusCode::kInvalidArgument, "3 file(s) for 5 workers");
  EXPECT_STATUS(ApplyStaticSharding(Dataset::ReadRecords({"a", "b"}).def(),
                                    StaticSharding::kFile, 3, 0),
                absl::StatusCode::kInvalidArgument, "2 file(s) for 3 workers");
  // A pattern matching nothing is the glob's own error.
  EXPECT_STATUS(ApplyStaticSharding(Dataset::ListFiles(dir.File("none*")).def(),
                                    StaticSharding::kFile, 2, 0),
                absl::StatusCode::kNotFound, "no files match");
}

TEST(StaticShardingTest, FileWithoutFileSourceIsAnErrorAndFileOrDataFallsBackToData) {
  EXPECT_STATUS(ApplyStaticSharding(Dataset::Range(10).def(), StaticSharding::kFile, 2, 0),
                absl::StatusCode::kInvalidArgument, "no file source");
  ASSERT_OK_AND_ASSIGN(Dataset ds,
                       Sharded(Dataset::Range(10), StaticSharding::kFileOrData, 3, 2));
  EXPECT_THAT(*CollectScalars<int64_t>(ds), ElementsAre(2, 5, 8));
}

TEST(StaticShardingTest, HintFillsEveryPlaceholder) {
  Dataset ds = Dataset::Range(10).Shard(kShardHint, kShardHint).Map(x * 10);
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(Dataset s1, Sharded(ds, StaticSharding::kHint, 3, 1));
  EXPECT_THAT(*CollectScalars<int64_t>(s1), ElementsAre(10, 40, 70));
  // A hint inside an Interleave function is filled in too.
  Dataset inner = Dataset::Range(2).Interleave(
      [](const Dataset&) { return Dataset::Range(6).Shard(kShardHint, kShardHint); },
      1, 1);
  ASSERT_OK(inner.status());
  ASSERT_OK_AND_ASSIGN(Dataset s0, Sharded(inner, StaticSharding::kHint, 2, 0));
  EXPECT_THAT(*CollectScalars<int64_t>(s0), ElementsAre(0, 2, 4, 0, 2, 4));
}

TEST(StaticShardingTest, HintMisuseIsAClearError) {
  EXPECT_STATUS(ApplyStaticSharding(Dataset::Range(10).def(), StaticSharding::kHint, 2, 0),
                absl::StatusCode::kInvalidArgument, "no Shard(kShardHint, kShardHint)");
  Dataset hinted = Dataset::Range(10).Shard(kShardHint, kShardHint);
  EXPECT_STATUS(ApplyStaticSharding(hinted.def(), StaticSharding::kData, 2, 0),
                absl::StatusCode::kInvalidArgument, "only processing_mode=hint");
  EXPECT_TRUE(internal::ContainsShardHint(hinted.def().root()));
  EXPECT_FALSE(internal::ContainsShardHint(Dataset::Range(3).Shard(2, 1).def().root()));
  // Locally a hint cannot run, and half a hint does not validate.
  EXPECT_STATUS(Collect(hinted), absl::StatusCode::kFailedPrecondition, "placeholder");
  EXPECT_STATUS(Dataset::Range(10).Shard(kShardHint, 0).status(),
                absl::StatusCode::kInvalidArgument, "both num_shards and index");
  EXPECT_STATUS(ApplyStaticSharding(Dataset::Range(3).def(), StaticSharding::kData, 2, 2),
                absl::StatusCode::kInvalidArgument, "shard 2 of 2");
}

}  // namespace
}  // namespace sluice
