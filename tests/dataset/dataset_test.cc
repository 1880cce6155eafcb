// Tests of the dataset builder, every op of the local executor, validation,
// serialization, UDFs and plugins.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "dataset/dataset.pb.h"
#include "sluice/core/crc32c.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/tfrecord.h"
#include "sluice/dataset/udf.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice {
namespace {

using ::sluice_test::Collect;
using ::sluice_test::CollectScalars;
using ::sluice_test::TempDir;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;
using expr::x;

std::vector<int64_t> Iota(int64_t n, int64_t start = 0, int64_t step = 1) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(start + i * step);
  return v;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> Strings(const std::vector<Element>& elements) {
  std::vector<std::string> out;
  for (const auto& e : elements) out.emplace_back(e[0].str(0));
  return out;
}

// ---- the seed example and sources -----------------------------------------

TEST(DatasetTest, SeedPipelineYields1_2_5_10_17) {
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(5).Map(x * x).Map(x + 1)));
  EXPECT_THAT(v, ElementsAre(1, 2, 5, 10, 17));
}

TEST(DatasetTest, RangeForms) {
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(4)), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(2, 11, 3)), ElementsAre(2, 5, 8));
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(5, 0, -2)), ElementsAre(5, 3, 1));
  EXPECT_TRUE(CollectScalars<int64_t>(Dataset::Range(3, 3))->empty());
  EXPECT_TRUE(CollectScalars<int64_t>(Dataset::Range(5, 0))->empty());
  EXPECT_EQ(Dataset::Range(2, 11, 3).Cardinality(), 3);
  EXPECT_EQ(Dataset::Range(5, 0, -2).Cardinality(), 3);
  EXPECT_EQ(Dataset::Range(-3).Cardinality(), 0);
  EXPECT_STATUS(Dataset::Range(0, 10, 0).status(), absl::StatusCode::kInvalidArgument,
                "Range: step must not be 0");
}

TEST(DatasetTest, RangeNearInt64LimitsStops) {
  int64_t max = std::numeric_limits<int64_t>::max();
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(max - 5, max, 4)));
  EXPECT_THAT(v, ElementsAre(max - 5, max - 1));
}

TEST(DatasetTest, FromTensorsKeepsElementsAndSpec) {
  std::vector<Element> in = {{Tensor::FromVector<float>({1, 2}), Tensor::String("a")},
                             {Tensor::FromVector<float>({3, 4, 5}), Tensor::String("bc")}};
  Dataset ds = Dataset::FromTensors(in);
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(ElementsEqual(out[0], in[0]));
  EXPECT_TRUE(ElementsEqual(out[1], in[1]));
  EXPECT_EQ(ds.element_spec().ToString(), "(float32[?], string[])");
  EXPECT_EQ(ds.Cardinality(), 2);
}

TEST(DatasetTest, FromTensorsRejectsInconsistentElements) {
  EXPECT_STATUS(Dataset::FromTensors({{Tensor::Scalar<int32_t>(1)}, {Tensor::Scalar<float>(1)}})
                    .status(),
                absl::StatusCode::kInvalidArgument, "element 1 component 0 is float32");
  EXPECT_STATUS(Dataset::FromTensors({{Tensor::Scalar<int32_t>(1)},
                                      {Tensor::Scalar<int32_t>(1), Tensor::Scalar<int32_t>(2)}})
                    .status(),
                absl::StatusCode::kInvalidArgument, "element 1 has 2 components");
  EXPECT_STATUS(Dataset::FromTensors({{Tensor()}}).status(), absl::StatusCode::kInvalidArgument,
                "invalid tensor");
}

TEST(DatasetTest, ListFilesIsSortedAndMissingPatternIsNotFound) {
  TempDir dir;
  for (const char* n : {"b.rec", "a.rec", "c.txt", "c.rec"}) WriteBytes(dir.File(n), "");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(Dataset::ListFiles(dir.File("*.rec"))));
  EXPECT_THAT(Strings(out), ElementsAre(dir.File("a.rec"), dir.File("b.rec"), dir.File("c.rec")));
  EXPECT_STATUS(Collect(Dataset::ListFiles(dir.File("*.none"))), absl::StatusCode::kNotFound,
                "no files match");
  EXPECT_STATUS(Dataset::ListFiles("").status(), absl::StatusCode::kInvalidArgument,
                "empty pattern");
}

// recursive: a matching directory stands for every file under it, sorted
// with the other matches by path.
TEST(DatasetTest, ListFilesRecursiveWalksMatchingDirectories) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("a/deep/er"));
  std::filesystem::create_directories(dir.File("b"));
  for (const char* n : {"a/1", "a/deep/2", "a/deep/er/3", "b/4", "top"}) WriteBytes(dir.File(n), "");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(Dataset::ListFiles(dir.File("*"), /*recursive=*/true)));
  EXPECT_THAT(Strings(out), ElementsAre(dir.File("a/1"), dir.File("a/deep/2"),
                                        dir.File("a/deep/er/3"), dir.File("b/4"), dir.File("top")));
  // Without it, directories are matches like files.
  ASSERT_OK_AND_ASSIGN(out, Collect(Dataset::ListFiles(dir.File("*"))));
  EXPECT_THAT(Strings(out), ElementsAre(dir.File("a"), dir.File("b"), dir.File("top")));
  // The split source lists the same (distributed_epoch).
  ASSERT_OK_AND_ASSIGN(internal::SplitPositions p,
                       internal::SplitSourcePositions(
                           Dataset::ListFiles(dir.File("a"), true).def().root()));
  EXPECT_THAT(p.files, ElementsAre(dir.File("a/1"), dir.File("a/deep/2"), dir.File("a/deep/er/3")));
}

// ---- TFRecord ----------------------------------------------------------------

TEST(TFRecordTest, ByteLayoutMatchesTheTFRecordFormat) {
  TempDir dir;
  ASSERT_OK(WriteTFRecordFile(dir.File("one.tfrecord"), {"abc"}));
  std::string bytes = ReadBytes(dir.File("one.tfrecord"));
  ASSERT_EQ(bytes.size(), 8u + 4 + 3 + 4);
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  EXPECT_EQ(len, 3u);
  uint32_t len_crc, data_crc;
  std::memcpy(&len_crc, bytes.data() + 8, 4);
  std::memcpy(&data_crc, bytes.data() + 15, 4);
  // Masking as TensorFlow defines it: rotate right by 15, add a constant.
  uint32_t raw = crc32c::Value(bytes.data(), 8);
  EXPECT_EQ(len_crc, ((raw >> 15) | (raw << 17)) + 0xa282ead8u);
  EXPECT_EQ(crc32c::Unmask(data_crc), crc32c::Value("abc", 3));
  EXPECT_EQ(bytes.substr(12, 3), "abc");
}

TEST(TFRecordTest, ReadRecordsAcrossFilesIncludingEmptyRecords) {
  TempDir dir;
  std::string big(100000, 'z');
  ASSERT_OK(WriteTFRecordFile(dir.File("a.tfrecord"), {"one", "", "two"}));
  ASSERT_OK(WriteTFRecordFile(dir.File("b.tfrecord"), {big}));
  ASSERT_OK(WriteTFRecordFile(dir.File("c.tfrecord"), {}));
  Dataset ds = Dataset::ReadRecords(
      {dir.File("a.tfrecord"), dir.File("c.tfrecord"), dir.File("b.tfrecord")});
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  EXPECT_THAT(Strings(out), ElementsAre("one", "", "two", big));
  EXPECT_EQ(ds.element_spec().ToString(), "(string[])");
}

TEST(TFRecordTest, ReadRecordsFromListFiles) {
  TempDir dir;
  ASSERT_OK(WriteTFRecordFile(dir.File("2.tfrecord"), {"c"}));
  ASSERT_OK(WriteTFRecordFile(dir.File("1.tfrecord"), {"a", "b"}));
  ASSERT_OK_AND_ASSIGN(auto out,
                       Collect(Dataset::ReadRecords(Dataset::ListFiles(dir.File("*.tfrecord")))));
  EXPECT_THAT(Strings(out), ElementsAre("a", "b", "c"));
}

TEST(TFRecordTest, CorruptionIsDataLoss) {
  TempDir dir;
  ASSERT_OK(WriteTFRecordFile(dir.File("ok.tfrecord"), {"hello", "world"}));
  std::string good = ReadBytes(dir.File("ok.tfrecord"));

  std::string bad_data = good;
  bad_data[13] ^= 1;  // inside "hello"
  WriteBytes(dir.File("bad_data.tfrecord"), bad_data);
  EXPECT_STATUS(Collect(Dataset::ReadRecords({dir.File("bad_data.tfrecord")})),
                absl::StatusCode::kDataLoss, "corrupt record data");

  std::string bad_len = good;
  bad_len[0] ^= 1;
  WriteBytes(dir.File("bad_len.tfrecord"), bad_len);
  EXPECT_STATUS(Collect(Dataset::ReadRecords({dir.File("bad_len.tfrecord")})),
                absl::StatusCode::kDataLoss, "corrupt record length");

  for (size_t cut : {size_t{5}, size_t{14}, good.size() - 1}) {
    WriteBytes(dir.File("short.tfrecord"), good.substr(0, cut));
    EXPECT_STATUS(Collect(Dataset::ReadRecords({dir.File("short.tfrecord")})),
                  absl::StatusCode::kDataLoss, "truncated");
  }
  EXPECT_STATUS(Collect(Dataset::ReadRecords({dir.File("missing.tfrecord")})),
                absl::StatusCode::kNotFound, "missing.tfrecord");
}

TEST(TFRecordTest, FilenamesMustBeStrings) {
  EXPECT_STATUS(Dataset::ReadRecords(Dataset::Range(3)).status(),
                absl::StatusCode::kInvalidArgument, "filenames must be strings");
  EXPECT_STATUS(Dataset::ReadRecords(std::vector<std::string>{}).status(),
                absl::StatusCode::kInvalidArgument, "at least one file");
}

TEST(FixedLengthRecordsTest, SkipsHeaderAndFooter) {
  TempDir dir;
  WriteBytes(dir.File("f.bin"), "HHabcdefFFF");
  ASSERT_OK_AND_ASSIGN(auto out, Collect(Dataset::ReadFixedLengthRecords({dir.File("f.bin")}, 2, 2, 3)));
  EXPECT_THAT(Strings(out), ElementsAre("ab", "cd", "ef"));
  EXPECT_STATUS(Collect(Dataset::ReadFixedLengthRecords({dir.File("f.bin")}, 4, 2, 3)),
                absl::StatusCode::kDataLoss, "not header 2 + footer 3 + a multiple of 4");
  EXPECT_STATUS(Dataset::ReadFixedLengthRecords({dir.File("f.bin")}, 0).status(),
                absl::StatusCode::kInvalidArgument, "record_bytes must be > 0");
}

// ---- transforms --------------------------------------------------------------

TEST(DatasetTest, BatchStacksAndHandlesRemainder) {
  ASSERT_OK_AND_ASSIGN(auto out, Collect(Dataset::Range(7).Batch(3)));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0][0].shape(), TensorShape({3}));
  EXPECT_THAT(std::vector<int64_t>(out[1][0].values<int64_t>().begin(),
                                   out[1][0].values<int64_t>().end()),
              ElementsAre(3, 4, 5));
  EXPECT_EQ(out[2][0].shape(), TensorShape({1}));
  EXPECT_EQ(Dataset::Range(7).Batch(3).Cardinality(), 3);
  EXPECT_EQ(Dataset::Range(7).Batch(3, true).Cardinality(), 2);
  ASSERT_OK_AND_ASSIGN(auto dropped, Collect(Dataset::Range(7).Batch(3, /*drop_remainder=*/true)));
  EXPECT_EQ(dropped.size(), 2u);
  EXPECT_EQ(Dataset::Range(7).Batch(3, true).element_spec().ToString(), "(int64[3])");
  EXPECT_EQ(Dataset::Range(7).Batch(3).element_spec().ToString(), "(int64[?])");
}

TEST(DatasetTest, BatchOfVectorsAndStrings) {
  Dataset ds = Dataset::FromTensors({{Tensor::FromVector<int32_t>({1, 2}), Tensor::String("a")},
                                     {Tensor::FromVector<int32_t>({3, 4}), Tensor::String("bb")}})
                   .Batch(2);
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0][0].shape(), TensorShape({2, 2}));
  EXPECT_THAT(std::vector<int32_t>(out[0][0].values<int32_t>().begin(),
                                   out[0][0].values<int32_t>().end()),
              ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(out[0][1].shape(), TensorShape({2}));
  EXPECT_EQ(out[0][1].str(0), "a");
  EXPECT_EQ(out[0][1].str(1), "bb");
}

TEST(DatasetTest, BatchRejectsUnequalShapes) {
  Dataset ds = Dataset::FromTensors({{Tensor::FromVector<int32_t>({1, 2})},
                                     {Tensor::FromVector<int32_t>({3})}})
                   .Batch(2);
  EXPECT_STATUS(Collect(ds), absl::StatusCode::kInvalidArgument, "Batch needs equal shapes");
  EXPECT_STATUS(Dataset::Range(3).Batch(0).status(), absl::StatusCode::kInvalidArgument,
                "batch_size must be > 0");
}

TEST(DatasetTest, UnbatchInvertsBatchWithoutCopyingNumericRows) {
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(10).Batch(4).Unbatch()));
  EXPECT_THAT(v, ElementsAreArray(Iota(10)));
  Tensor m = *Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, TensorShape({3, 2}));
  ASSERT_OK_AND_ASSIGN(auto rows, Collect(Dataset::FromTensors({{m}}).Unbatch()));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2][0].shape(), TensorShape({2}));
  EXPECT_EQ(rows[2][0].at<float>(1), 6.0f);
  // FromTensors holds its own copy of m; rows view that copy, 8 bytes apart.
  EXPECT_EQ(rows[1][0].data(), rows[0][0].data() + 8);
  EXPECT_STATUS(Dataset::Range(3).Unbatch().status(), absl::StatusCode::kInvalidArgument,
                "Unbatch needs rank >= 1");
}

TEST(DatasetTest, UnbatchStringsAndMismatchedLeadingDims) {
  Tensor s = Tensor::Strings({"p", "q", "r"});
  ASSERT_OK_AND_ASSIGN(auto out, Collect(Dataset::FromTensors({{s}}).Unbatch()));
  EXPECT_THAT(Strings(out), ElementsAre("p", "q", "r"));
  Dataset bad = Dataset::FromTensors(
      {{Tensor::FromVector<int32_t>({1, 2}), Tensor::FromVector<int32_t>({1, 2, 3})}});
  EXPECT_STATUS(Collect(bad.Unbatch()), absl::StatusCode::kInvalidArgument,
                "disagree on dimension 0");
}

TEST(DatasetTest, ShuffleIsAPermutationAndSeedIsReproducible) {
  Dataset ds = Dataset::Range(100).Shuffle(10, 7, /*reshuffle_each_iteration=*/false);
  ASSERT_OK_AND_ASSIGN(auto a, CollectScalars<int64_t>(ds));
  ASSERT_OK_AND_ASSIGN(auto b, CollectScalars<int64_t>(ds));
  EXPECT_THAT(a, UnorderedElementsAreArray(Iota(100)));
  EXPECT_NE(a, Iota(100));
  EXPECT_EQ(a, b);  // same seed, no reshuffle: same order every iteration
  ASSERT_OK_AND_ASSIGN(auto c, CollectScalars<int64_t>(
                                   Dataset::Range(100).Shuffle(10, 7, false)));
  EXPECT_EQ(a, c);  // and for an independently built identical pipeline
  // A buffer of 10 can move an element at most 9 positions earlier.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(a[i], static_cast<int64_t>(i) + 9);
}

TEST(DatasetTest, ReshuffleEachIterationAndEachEpoch) {
  Dataset ds = Dataset::Range(50).Shuffle(50, 3, /*reshuffle_each_iteration=*/true);
  ASSERT_OK_AND_ASSIGN(auto a, CollectScalars<int64_t>(ds));
  ASSERT_OK_AND_ASSIGN(auto b, CollectScalars<int64_t>(ds));
  EXPECT_THAT(b, UnorderedElementsAreArray(a));
  EXPECT_NE(a, b);
  ASSERT_OK_AND_ASSIGN(auto epochs, CollectScalars<int64_t>(ds.Repeat(2)));
  ASSERT_EQ(epochs.size(), 100u);
  std::vector<int64_t> e0(epochs.begin(), epochs.begin() + 50), e1(epochs.begin() + 50, epochs.end());
  EXPECT_THAT(e0, UnorderedElementsAreArray(Iota(50)));
  EXPECT_THAT(e1, UnorderedElementsAreArray(Iota(50)));
  EXPECT_NE(e0, e1);
  EXPECT_STATUS(Dataset::Range(3).Shuffle(0).status(), absl::StatusCode::kInvalidArgument,
                "buffer_size must be > 0");
}

TEST(DatasetTest, RepeatTakeSkip) {
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(3).Repeat(2)), ElementsAre(0, 1, 2, 0, 1, 2));
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(2).Repeat().Take(5)),
              ElementsAre(0, 1, 0, 1, 0));
  EXPECT_TRUE(CollectScalars<int64_t>(Dataset::Range(3).Repeat(0))->empty());
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(5).Skip(3)), ElementsAre(3, 4));
  EXPECT_TRUE(CollectScalars<int64_t>(Dataset::Range(5).Skip(-1))->empty());
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(3).Take(-1)), ElementsAre(0, 1, 2));
  EXPECT_TRUE(CollectScalars<int64_t>(Dataset::Range(3).Take(0))->empty());
  EXPECT_EQ(Dataset::Range(3).Repeat().Cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::Range(3).Repeat(4).Cardinality(), 12);
  EXPECT_EQ(Dataset::Range(3).Repeat().Take(7).Cardinality(), 7);
  EXPECT_EQ(Dataset::Range(10).Skip(4).Cardinality(), 6);
  EXPECT_EQ(Dataset::Range(10).Take(40).Cardinality(), 10);
  EXPECT_STATUS(Dataset::Range(3).Repeat(-2).status(), absl::StatusCode::kInvalidArgument,
                "count must be >= -1");
}

TEST(DatasetTest, RepeatForeverOfAnEmptyDatasetEnds) {
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(0).Repeat()));
  EXPECT_TRUE(v.empty());
  ASSERT_OK_AND_ASSIGN(auto w, CollectScalars<int64_t>(Dataset::Range(9).Filter(x > 100).Repeat()));
  EXPECT_TRUE(w.empty());
}

// A predicate over a 3-element input that keeps the elements of odd passes
// only (it counts its calls): passes 0, 2, ... yield nothing.
std::atomic<int64_t> g_keep_odd_pass_calls{0};
absl::StatusOr<Element> KeepOddPasses(const Element&) {
  const int64_t pass = g_keep_odd_pass_calls.fetch_add(1) / 3;
  return Element{Tensor::Scalar<bool>(pass % 2 == 1)};
}
SLUICE_REGISTER_UDF(test_keep_odd_passes, KeepOddPasses,
                    {.num_inputs = 1, .output_dtypes = {{DType::kBool}}});

TEST(DatasetTest, FiniteRepeatRunsEveryRepetitionEvenEmptyOnes) {
  // tf.data's repeat(count) runs all `count` repetitions: passes 0 and 2
  // are empty, 1 and 3 are whole.
  g_keep_odd_pass_calls = 0;
  Dataset odd = Dataset::Range(3).Filter(Udf("test_keep_odd_passes"));
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(odd.Repeat(4)));
  EXPECT_THAT(v, ElementsAre(0, 1, 2, 0, 1, 2));
  // Repeat forever ends on an empty repetition (its input reads no service).
  g_keep_odd_pass_calls = 3;  // pass 1 (whole), then pass 2 (empty)
  ASSERT_OK_AND_ASSIGN(auto w, CollectScalars<int64_t>(odd.Repeat()));
  EXPECT_THAT(w, ElementsAre(0, 1, 2));
}

// Stands in for the client library: iterations 0 and 1 of the job are
// already finished (a late consumer reads nothing), later ones yield 0..3.
class LateJoinerIterations final : public internal::ServiceReader {
 public:
  absl::StatusOr<std::unique_ptr<Iterator>> MakeIterator(const proto::DatasetNode::DataService&,
                                                         int64_t repetition,
                                                         const std::string*) const override {
    return Dataset::Range(repetition < 2 ? 0 : 4).MakeIterator();
  }
};

// A DataService node reading dataset "1" through `reader`.
Dataset ServiceDataset(std::shared_ptr<const internal::ServiceReader> reader) {
  proto::DatasetNode n;
  n.mutable_data_service()->set_dataset_id("1");
  n.mutable_data_service()->set_max_outstanding_requests(1);
  return internal::MakeDataServiceDataset(std::move(n), nullptr, std::move(reader));
}

TEST(DatasetTest, RepeatOverAServiceDatasetGoesOnPastEmptyIterations) {
  auto service = [] { return ServiceDataset(std::make_shared<LateJoinerIterations>()); };
  ASSERT_OK(service().status());
  ASSERT_OK_AND_ASSIGN(auto finite, CollectScalars<int64_t>(service().Repeat(4)));
  EXPECT_THAT(finite, ElementsAre(0, 1, 2, 3, 0, 1, 2, 3));
  // Forever, with the service further down the input (tf.data looks
  // through the inputs, not into Interleave functions).
  ASSERT_OK_AND_ASSIGN(auto forever,
                       CollectScalars<int64_t>(service().Take(100).Repeat().Take(10)));
  EXPECT_THAT(forever, ElementsAre(0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
}

TEST(DatasetTest, AServiceDatasetRebuiltFromItsDefinitionHasNoReader) {
  Dataset service = ServiceDataset(std::make_shared<LateJoinerIterations>()).Map(x + 1);
  ASSERT_OK(service.status());
  ASSERT_OK_AND_ASSIGN(Dataset rebuilt, Dataset::FromDef(service.def()));
  EXPECT_STATUS(rebuilt.MakeIterator(), absl::StatusCode::kFailedPrecondition,
                "rebuilt from its definition");
  EXPECT_STATUS(ServiceDataset(nullptr).MakeIterator(), absl::StatusCode::kFailedPrecondition,
                "build it in this process");
}

TEST(DatasetTest, ApplyChainsATransformation) {
  auto square_then_take = [](int64_t n) {
    return [n](const Dataset& d) { return d.Map(x * x).Take(n); };
  };
  Dataset ds = Dataset::Range(5).Apply(square_then_take(3)).Map(x + 1);
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(ds));
  EXPECT_THAT(v, ElementsAre(1, 2, 5));
  // An error is kept, and the transformation is not called on it.
  bool called = false;
  Dataset failed = Dataset::Range(3).Shard(0, 0).Apply([&](const Dataset& d) {
    called = true;
    return d;
  });
  EXPECT_STATUS(failed.status(), absl::StatusCode::kInvalidArgument, "num_shards must be > 0");
  EXPECT_FALSE(called);
  EXPECT_STATUS(Dataset::Range(3).Apply(nullptr).status(), absl::StatusCode::kInvalidArgument,
                "Apply: the transformation is empty");
}

TEST(DatasetTest, ShardTakesEveryNth) {
  EXPECT_THAT(*CollectScalars<int64_t>(Dataset::Range(20).Shard(5, 1)), ElementsAre(1, 6, 11, 16));
  EXPECT_EQ(Dataset::Range(20).Shard(5, 1).Cardinality(), 4);
  EXPECT_EQ(Dataset::Range(22).Shard(5, 1).Cardinality(), 5);
  EXPECT_EQ(Dataset::Range(1).Shard(5, 3).Cardinality(), 0);
  EXPECT_STATUS(Dataset::Range(3).Shard(2, 2).status(), absl::StatusCode::kInvalidArgument,
                "index must be in [0, 2)");
  EXPECT_STATUS(Dataset::Range(3).Shard(0, 0).status(), absl::StatusCode::kInvalidArgument,
                "num_shards must be > 0");
}

TEST(DatasetTest, PrefetchPreservesOrderAndErrors) {
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(1000).Prefetch(4)));
  EXPECT_EQ(v, Iota(1000));
  Dataset failing = Dataset::Range(5).Map(x / (x - 3)).Prefetch(2);
  ASSERT_OK_AND_ASSIGN(auto it, failing.MakeIterator());
  for (int i = 0; i < 3; ++i) ASSERT_OK((*it).Next());
  EXPECT_STATUS(it->Next(), absl::StatusCode::kInvalidArgument, "division by zero");
  EXPECT_STATUS(it->Next(), absl::StatusCode::kInvalidArgument, "division by zero");
  EXPECT_STATUS(Dataset::Range(3).Prefetch(0).status(), absl::StatusCode::kInvalidArgument,
                "buffer_size must be > 0");
}

TEST(DatasetTest, PrefetchIteratorDestroyedMidStreamJoinsItsThread) {
  for (int round = 0; round < 20; ++round) {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(1000000).Repeat().Prefetch(8).MakeIterator());
    ASSERT_OK(it->Next());
    it.reset();  // must return (joining the producer), not hang
  }
}

TEST(DatasetTest, InterleaveMatchesTfDataOrder) {
  // tf.data: range(1,4).interleave(lambda v: repeat(v, 2), cycle_length=2,
  // block_length=1) -> 1 2 1 2 3 3.
  auto fn = [](const Dataset& e) { return e.Repeat(2); };
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(1, 4).Interleave(fn, 2)));
  EXPECT_THAT(v, ElementsAre(1, 2, 1, 2, 3, 3));
  // cycle 3, block 2 over range(1, 6), each repeated 3 times: an exhausted
  // slot is refilled only when the cycle comes back to it.
  auto fn3 = [](const Dataset& e) { return e.Repeat(3); };
  ASSERT_OK_AND_ASSIGN(auto w, CollectScalars<int64_t>(Dataset::Range(1, 6).Interleave(fn3, 3, 2)));
  EXPECT_THAT(w, ElementsAre(1, 1, 2, 2, 3, 3, 1, 2, 3, 4, 4, 5, 5, 4, 5));
  EXPECT_STATUS(Dataset::Range(3).Interleave(fn, 0).status(), absl::StatusCode::kInvalidArgument,
                "cycle_length and block_length must be > 0");
}

TEST(DatasetTest, InterleaveOverFiles) {
  TempDir dir;
  ASSERT_OK(WriteTFRecordFile(dir.File("a.tfrecord"), {"a0", "a1", "a2"}));
  ASSERT_OK(WriteTFRecordFile(dir.File("b.tfrecord"), {"b0"}));
  ASSERT_OK(WriteTFRecordFile(dir.File("c.tfrecord"), {"c0", "c1"}));
  Dataset ds = Dataset::ListFiles(dir.File("*.tfrecord"))
                   .Interleave([](const Dataset& f) { return Dataset::ReadRecords(f); }, 2);
  ASSERT_OK_AND_ASSIGN(auto out, Collect(ds));
  EXPECT_THAT(Strings(out), ElementsAre("a0", "b0", "a1", "a2", "c0", "c1"));
  // The function's own errors name Interleave.
  EXPECT_STATUS(Dataset::Range(3)
                    .Interleave([](const Dataset& f) { return Dataset::ReadRecords(f); }, 2)
                    .status(),
                absl::StatusCode::kInvalidArgument, "Interleave function: ReadRecords");
}

TEST(DatasetTest, EnumerateAndZip) {
  ASSERT_OK_AND_ASSIGN(auto out, Collect(Dataset::Range(10, 13).Enumerate(5)));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2][0].at<int64_t>(0), 7);
  EXPECT_EQ(out[2][1].at<int64_t>(0), 12);
  Dataset z = Dataset::Zip({Dataset::Range(5), Dataset::Range(100, 103).Map(x * 2),
                            Dataset::Range(1).Repeat()});
  ASSERT_OK_AND_ASSIGN(auto zs, Collect(z));
  ASSERT_EQ(zs.size(), 3u);
  EXPECT_EQ(zs[1].size(), 3u);
  EXPECT_EQ(zs[1][0].at<int64_t>(0), 1);
  EXPECT_EQ(zs[1][1].at<int64_t>(0), 202);
  EXPECT_EQ(zs[1][2].at<int64_t>(0), 0);
  EXPECT_EQ(z.Cardinality(), 3);
  EXPECT_EQ(z.element_spec().ToString(), "(int64[], int64[], int64[])");
  EXPECT_EQ(Dataset::Zip({Dataset::Range(1).Repeat(), Dataset::Range(1).Repeat()}).Cardinality(),
            kInfiniteCardinality);
  EXPECT_STATUS(Dataset::Zip({}).status(), absl::StatusCode::kInvalidArgument, "Zip");
}

TEST(DatasetTest, CardinalityPropagates) {
  EXPECT_EQ(Dataset::Range(10).Map(x + 1).Cardinality(), 10);
  EXPECT_EQ(Dataset::Range(10).Filter(x > 1).Cardinality(), kUnknownCardinality);
  EXPECT_EQ(Dataset::Range(10).Repeat().Filter(x > 1).Cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::Range(10).Prefetch(2).Shuffle(3).Enumerate().Cardinality(), 10);
  EXPECT_EQ(Dataset::ListFiles("/nonexistent/*").Cardinality(), kUnknownCardinality);
}

// ---- errors, serialization, fingerprints ---------------------------------------

TEST(DatasetTest, FirstDefinitionErrorSticksThroughLaterSteps) {
  Dataset bad = Dataset::Range(5).Shard(2, 7).Map(x + 1).Batch(2);
  EXPECT_STATUS(bad.status(), absl::StatusCode::kInvalidArgument, "Shard");
  EXPECT_STATUS(bad.MakeIterator(), absl::StatusCode::kInvalidArgument, "Shard");
  EXPECT_STATUS(bad.Serialize(), absl::StatusCode::kInvalidArgument, "Shard");
}

TEST(DatasetTest, IteratorKeepsReturningEndAndErrors) {
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(1).MakeIterator());
  ASSERT_OK_AND_ASSIGN(auto first, it->Next());
  EXPECT_TRUE(first.has_value());
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(auto e, it->Next());
    EXPECT_FALSE(e.has_value());
  }
}

TEST(DatasetTest, IteratorOutlivesItsDataset) {
  std::unique_ptr<Iterator> it;
  {
    Dataset ds = Dataset::Range(3).Map(x * 10);
    ASSERT_OK_AND_ASSIGN(it, ds.MakeIterator());
  }
  for (int64_t want : {0, 10, 20}) {
    auto e = it->Next();
    ASSERT_TRUE(e.ok() && e->has_value());
    EXPECT_EQ((**e)[0].at<int64_t>(0), want);
  }
}

Dataset ComplexPipeline(const std::string& pattern) {
  return Dataset::ListFiles(pattern)
      .Interleave([](const Dataset& f) { return Dataset::ReadRecords(f).Repeat(2); }, 2)
      .Enumerate()
      .Filter(x[0] % 3 != 1)
      .Map({x[0] * 2, x[1]})
      .Shuffle(4, 11, false)
      .Batch(2)
      .Prefetch(2);
}

TEST(DatasetTest, SerializeDeserializeRoundTripRunsTheSamePipeline) {
  TempDir dir;
  ASSERT_OK(WriteTFRecordFile(dir.File("a.tfrecord"), {"a0", "a1"}));
  ASSERT_OK(WriteTFRecordFile(dir.File("b.tfrecord"), {"b0", "b1", "b2"}));
  Dataset ds = ComplexPipeline(dir.File("*.tfrecord"));
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(std::string bytes, ds.Serialize());
  ASSERT_OK_AND_ASSIGN(Dataset copy, Dataset::Deserialize(bytes));
  EXPECT_EQ(copy.Fingerprint(), ds.Fingerprint());
  EXPECT_EQ(copy.element_spec().ToString(), ds.element_spec().ToString());
  ASSERT_OK_AND_ASSIGN(auto a, Collect(ds));
  ASSERT_OK_AND_ASSIGN(auto b, Collect(copy));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(ElementsEqual(a[i], b[i])) << i;
}

// Protobuf parses 100 nested messages by default; a local pipeline may nest
// deeper (each chained op is two levels) and still come back.
TEST(DatasetTest, ADeepPipelineSerializesAndComesBack) {
  Dataset ds = Dataset::Range(3);
  for (int i = 0; i < 300; ++i) ds = ds.Map(x + 1);
  ASSERT_OK_AND_ASSIGN(std::string bytes, ds.Serialize());
  ASSERT_OK_AND_ASSIGN(Dataset copy, Dataset::Deserialize(bytes));
  EXPECT_EQ(copy.Fingerprint(), ds.Fingerprint());
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(copy));
  EXPECT_THAT(v, ::testing::ElementsAre(300, 301, 302));
}

TEST(DatasetTest, FingerprintIsStableAndSensitive) {
  uint64_t f1 = Dataset::Range(10).Map(x * 2).Batch(3).Fingerprint();
  uint64_t f2 = Dataset::Range(10).Map(x * 2).Batch(3).Fingerprint();
  EXPECT_EQ(f1, f2);
  EXPECT_NE(f1, Dataset::Range(10).Map(x * 3).Batch(3).Fingerprint());
  EXPECT_NE(f1, Dataset::Range(10).Map(x * 2).Batch(3, true).Fingerprint());
  EXPECT_NE(f1, Dataset::Range(11).Map(x * 2).Batch(3).Fingerprint());
}

TEST(DatasetTest, FromDefRejectsBadDefinitions) {
  EXPECT_STATUS(Dataset::Deserialize("\xff\xff\xff garbage"), absl::StatusCode::kInvalidArgument,
                "cannot parse");
  proto::DatasetDef def = Dataset::Range(3).def();
  def.set_version(2);
  EXPECT_STATUS(Dataset::FromDef(def), absl::StatusCode::kInvalidArgument, "version 2");
  proto::DatasetDef empty;
  empty.set_version(1);
  EXPECT_STATUS(Dataset::FromDef(empty), absl::StatusCode::kInvalidArgument, "empty node");
  proto::DatasetDef ph;
  ph.set_version(1);
  ph.mutable_root()->mutable_placeholder();
  EXPECT_STATUS(Dataset::FromDef(ph), absl::StatusCode::kInvalidArgument,
                "only valid inside an Interleave");
  // A definition that a (malicious or stale) client could send with a bad op.
  proto::DatasetDef map = Dataset::Range(3).Map(x + 1).def();
  map.mutable_root()->mutable_map()->mutable_fn()->mutable_outputs(0)->mutable_binary()->set_op(
      static_cast<proto::BinaryOp>(99));
  EXPECT_STATUS(Dataset::FromDef(map), absl::StatusCode::kInvalidArgument, "unknown binary op 99");
  proto::DatasetDef range0 = Dataset::Range(3).def();
  range0.mutable_root()->mutable_range()->set_step(0);
  EXPECT_STATUS(Dataset::FromDef(range0), absl::StatusCode::kInvalidArgument, "step must not be 0");
}

// ---- UDFs and plugins --------------------------------------------------------------

absl::StatusOr<Element> AddOne(const Element& in) {
  auto v = in[0].at<int64_t>(0);
  return Element{Tensor::Scalar<int64_t>(v + 1)};
}
SLUICE_REGISTER_UDF(test_add_one, AddOne,
                    {.num_inputs = 1, .output_dtypes = {{DType::kInt64}}});

absl::StatusOr<Element> SumPair(const Element& in) {
  return Element{Tensor::Scalar<int64_t>(in[0].at<int64_t>(0) + in[1].at<int64_t>(0))};
}
SLUICE_REGISTER_UDF(test_sum_pair, SumPair, {.num_inputs = 2});

absl::StatusOr<Element> FailOnThree(const Element& in) {
  if (in[0].at<int64_t>(0) == 3) return absl::FailedPreconditionError("three is not allowed");
  return in;
}
SLUICE_REGISTER_UDF(test_fail_on_three, FailOnThree, {});

absl::StatusOr<Element> LiesAboutDtype(const Element& in) {
  return Element{Tensor::Scalar<float>(1.0f)};
}
SLUICE_REGISTER_UDF(test_lies, LiesAboutDtype,
                    {.num_inputs = 1, .output_dtypes = {{DType::kInt64}}});

TEST(UdfTest, MapWithRegisteredUdfAndTypedOutputs) {
  Dataset ds = Dataset::Range(3).Map(Udf("test_add_one")).Map(x * 10);
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(int64[...])");
  EXPECT_THAT(*CollectScalars<int64_t>(ds), ElementsAre(10, 20, 30));
  ASSERT_OK_AND_ASSIGN(auto sums, CollectScalars<int64_t>(
                                      Dataset::Range(3).Enumerate(4).Map(Udf("test_sum_pair"))));
  EXPECT_THAT(sums, ElementsAre(4, 6, 8));
  // Untyped outputs defer checks: the spec is unknown after the UDF.
  EXPECT_FALSE(Dataset::Range(3).Map(Udf("test_fail_on_three")).element_spec().known);
}

TEST(UdfTest, UnknownNameAndWrongArityFailAtDefinition) {
  EXPECT_STATUS(Dataset::Range(3).Map(Udf("no_such_fn")).status(),
                absl::StatusCode::kInvalidArgument, "Map: unknown function 'no_such_fn'");
  EXPECT_STATUS(Dataset::Range(3).Map(Udf("test_sum_pair")).status(),
                absl::StatusCode::kInvalidArgument, "UDF 'test_sum_pair' takes 2 input components");
  EXPECT_STATUS(Dataset::Range(3).Filter(Udf("test_add_one")).status(),
                absl::StatusCode::kInvalidArgument, "Filter: predicate must yield one bool");
}

TEST(UdfTest, UdfErrorsAndContractViolationsSurface) {
  EXPECT_STATUS(Collect(Dataset::Range(5).Map(Udf("test_fail_on_three"))),
                absl::StatusCode::kFailedPrecondition, "three is not allowed");
  EXPECT_STATUS(Collect(Dataset::Range(5).Map(Udf("test_lies"))), absl::StatusCode::kInternal,
                "does not match its declared output dtypes");
}

TEST(UdfTest, DuplicateRegistrationIsRejected) {
  EXPECT_STATUS(RegisterUdf("test_add_one", {}, AddOne), absl::StatusCode::kAlreadyExists,
                "already registered");
  EXPECT_STATUS(RegisterUdf("", {}, AddOne), absl::StatusCode::kInvalidArgument, "non-empty name");
}

TEST(PluginTest, LoadPluginRegistersItsUdfs) {
  EXPECT_STATUS(Dataset::Range(3).Map(Udf("plugin_double")).status(),
                absl::StatusCode::kInvalidArgument, "unknown function 'plugin_double'");
  ASSERT_OK(LoadPlugin(SLUICE_TEST_PLUGIN));
  ASSERT_OK(LoadPlugin(SLUICE_TEST_PLUGIN));  // loading again is a no-op
  ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(4).Map(Udf("plugin_double"))));
  EXPECT_THAT(v, ElementsAre(0, 2, 4, 6));
  // A second plugin claiming the same name is reported, not silently merged.
  EXPECT_STATUS(LoadPlugin(SLUICE_TEST_PLUGIN_DUP), absl::StatusCode::kAlreadyExists,
                "UDF 'plugin_double' is already registered");
}

TEST(PluginTest, BadPluginPathsAreClearErrors) {
  EXPECT_STATUS(LoadPlugin("/nonexistent/libnothing.so"), absl::StatusCode::kNotFound,
                "does not exist");
  TempDir dir;
  WriteBytes(dir.File("not_a_library.so"), "just text");
  EXPECT_STATUS(LoadPlugin(dir.File("not_a_library.so")), absl::StatusCode::kInvalidArgument,
                "cannot load plugin");
}

// ---- element keys (docs/datasets.md, "Randomness") ----

using Keyed = std::vector<std::pair<std::string, uint64_t>>;

// Each element (as text) with its key; a failure for an element without one.
Keyed Keys(const Dataset& ds) {
  Keyed out;
  auto it = ds.MakeIterator();
  EXPECT_OK(it.status());
  if (!it.ok()) return out;
  while (true) {
    auto e = (*it)->Next();
    EXPECT_OK(e.status());
    if (!e.ok() || !e->has_value()) break;
    const std::optional<uint64_t> key = (*it)->ElementKey();
    EXPECT_TRUE(key.has_value()) << "no key for " << ElementDebugString(**e);
    out.emplace_back(ElementDebugString(**e), key.value_or(0));
  }
  return out;
}

Keyed Concat(std::initializer_list<Keyed> parts) {
  Keyed out;
  for (const Keyed& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

void ExpectDistinctKeys(const Keyed& k) {
  std::set<uint64_t> keys;
  for (const auto& [e, key] : k) keys.insert(key);
  EXPECT_EQ(keys.size(), k.size());
}

// Batch, Unbatch and Zip derive their elements' keys from their inputs'
// (a batch of the same elements, a row of the same batch, a tuple of the
// same parts is keyed the same), so the same elements get the same keys
// however the input was divided (here with Take and Skip, which keep keys).
TEST(ElementKeyTest, BatchUnbatchAndZipKeepKeysWhateverHowTheInputIsDivided) {
  auto range = [](int64_t skip, int64_t take) { return Dataset::Range(12).Skip(skip).Take(take); };
  const Keyed batches = Keys(range(0, 12).Batch(3));
  ASSERT_EQ(batches.size(), 4u);
  ExpectDistinctKeys(batches);
  EXPECT_EQ(batches, Concat({Keys(range(0, 6).Batch(3)), Keys(range(6, 6).Batch(3))}));
  const Keyed rows = Keys(range(0, 12).Batch(4).Unbatch());
  ASSERT_EQ(rows.size(), 12u);
  ExpectDistinctKeys(rows);
  EXPECT_EQ(rows, Concat({Keys(range(0, 8).Batch(4).Unbatch()), Keys(range(8, 4).Batch(4).Unbatch())}));
  auto zip = [&](int64_t skip, int64_t take) {
    return Dataset::Zip({range(skip, take), range(skip, take).Map(x * 2)});
  };
  const Keyed tuples = Keys(zip(0, 12));
  ASSERT_EQ(tuples.size(), 12u);
  ExpectDistinctKeys(tuples);
  EXPECT_EQ(tuples, Concat({Keys(zip(0, 5)), Keys(zip(5, 7))}));
  // A row's key is not its batch's, nor a tuple's its first part's.
  EXPECT_NE(rows[0].second, Keys(range(0, 12).Batch(4))[0].second);
  EXPECT_NE(tuples[0].second, Keys(range(0, 12))[0].second);
}

// Interleave keys an element from the input element that opened its slot
// and the element's key in that slot's dataset (its Placeholder passes the
// input element's key on): the same with the input sharded, and with the
// slots read in parallel.
TEST(ElementKeyTest, InterleaveKeysByInputElementAndPositionInItsDataset) {
  auto fn = [](const Dataset& d) { return d.Repeat(3).Map(x * 10); };
  auto sorted = [](Keyed k) {
    std::sort(k.begin(), k.end());
    return k;
  };
  const Keyed whole = Keys(Dataset::Range(6).Interleave(fn, 2));
  ASSERT_EQ(whole.size(), 18u);
  ExpectDistinctKeys(whole);
  const Keyed sharded = Concat({Keys(Dataset::Range(6).Shard(2, 0).Interleave(fn, 2)),
                                Keys(Dataset::Range(6).Shard(2, 1).Interleave(fn, 3))});
  EXPECT_EQ(sorted(sharded), sorted(whole));
  EXPECT_EQ(Keys(Dataset::Range(6).Interleave(fn, 2, 1, /*num_parallel_calls=*/2)), whole);
  // Files read in an Interleave: records keyed by (file name's key, index).
  TempDir dir;
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(dir.File(absl::StrCat("r", f)));
    ASSERT_OK(WriteTFRecordFile(files.back(), {absl::StrCat(f, "a"), absl::StrCat(f, "b")}));
  }
  const Dataset names = Dataset::FromTensors({{Tensor::String(files[0])},
                                              {Tensor::String(files[1])},
                                              {Tensor::String(files[2])}});
  auto read = [](const Dataset& f) { return Dataset::ReadRecords(f); };
  const Keyed records = Keys(names.Interleave(read, 2));
  ASSERT_EQ(records.size(), 6u);
  ExpectDistinctKeys(records);
  EXPECT_EQ(sorted(Concat({Keys(names.Shard(2, 0).Interleave(read, 1)),
                           Keys(names.Shard(2, 1).Interleave(read, 2))})),
            sorted(records));
}

}  // namespace
}  // namespace sluice
