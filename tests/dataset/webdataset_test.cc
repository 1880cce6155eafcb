// WebDataset tar shards (Dataset::WebDataset, dataset/webdataset.h): members
// sharing a key form a sample, the requested fields come back in the order
// asked, and every way a shard can be wrong is an error naming it.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/webdataset.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using Members = std::vector<std::pair<std::string, std::string>>;
using sluice_test::Collect;
using sluice_test::TempDir;

// Each element as its components' bytes.
absl::StatusOr<std::vector<std::vector<std::string>>> Strings(const Dataset& ds) {
  SLUICE_ASSIGN_OR_RETURN(auto elements, Collect(ds));
  std::vector<std::vector<std::string>> out;
  for (const Element& e : elements) {
    std::vector<std::string> row;
    for (const Tensor& t : e) row.emplace_back(t.str(0));
    out.push_back(std::move(row));
  }
  return out;
}

// Shard s holds samples s*10+i, i < n: "<key>.jpg", "<key>.cls", "<key>.json".
std::string WriteShard(const TempDir& dir, int s, int n) {
  Members m;
  for (int i = 0; i < n; ++i) {
    const std::string key = absl::StrCat("s", s, "_", i);
    m.emplace_back(key + ".jpg", "jpeg bytes of " + key);
    m.emplace_back(key + ".cls", std::to_string(s * 10 + i));
    m.emplace_back(key + ".json", "{}");
  }
  const std::string path = dir.File(absl::StrCat("shard-", s, ".tar"));
  EXPECT_OK(WriteWebDatasetShard(path, m));
  return path;
}

TEST(WebDatasetTest, YieldsOneElementPerSampleWithTheFieldsInTheOrderAsked) {
  TempDir dir;
  WriteShard(dir, 0, 3);
  WriteShard(dir, 1, 2);
  Dataset ds = Dataset::WebDataset(dir.File("shard-*.tar"), {"cls", "jpg"});
  ASSERT_OK(ds.status());
  EXPECT_EQ(ds.element_spec().ToString(), "(string[], string[])");
  ASSERT_OK_AND_ASSIGN(auto got, Strings(ds));
  const std::vector<std::vector<std::string>> want = {
      {"0", "jpeg bytes of s0_0"}, {"1", "jpeg bytes of s0_1"},   {"2", "jpeg bytes of s0_2"},
      {"10", "jpeg bytes of s1_0"}, {"11", "jpeg bytes of s1_1"}};
  EXPECT_EQ(got, want);
  // The same from a list of shards and from a dataset of shard names.
  const std::vector<std::string> shards = {dir.File("shard-0.tar"), dir.File("shard-1.tar")};
  EXPECT_EQ(*Strings(Dataset::WebDataset(shards, {"cls", "jpg"})), want);
  EXPECT_EQ(*Strings(Dataset::WebDataset(Dataset::FromTensors({{Tensor::Strings(shards)}}),
                                         {"cls", "jpg"})),
            want);
}

// Keys and fields follow the webdataset library: the key ends at the first
// '.' of the base name, fields compare in lower case, alternatives take
// the first present, "__key__" is the key, and members that cannot be
// fields (no '.', top-level __metadata__) are passed over.
TEST(WebDatasetTest, KeysFieldsAlternativesAndMembersPassedOver) {
  TempDir dir;
  const std::string shard = dir.File("a.tar");
  ASSERT_OK(WriteWebDatasetShard(shard, {{"__info__", "meta"},
                                         {"README", "no field"},
                                         {"dir/x.seg.PNG", "x seg"},
                                         {"dir/x.JPG", "x jpg"},
                                         {"./dir/y.png", "y png"},
                                         {"./dir/y.jpg", "y jpg"},
                                         {"./dir/y.seg.png", "y seg"}}));
  ASSERT_OK_AND_ASSIGN(auto got,
                       Strings(Dataset::WebDataset(shard, {"__key__", "png;jpg", "seg.png"})));
  EXPECT_EQ(got, (std::vector<std::vector<std::string>>{{"dir/x", "x jpg", "x seg"},
                                                        {"dir/y", "y png", "y seg"}}));
  // The alternatives' order decides, not the members'.
  ASSERT_OK_AND_ASSIGN(got, Strings(Dataset::WebDataset(shard, {"jpg;png"})));
  EXPECT_EQ(got, (std::vector<std::vector<std::string>>{{"x jpg"}, {"y jpg"}}));
}

TEST(WebDatasetTest, ASampleWithoutAFieldIsInvalidArgumentUnlessSkipped) {
  TempDir dir;
  const std::string shard = dir.File("a.tar");
  ASSERT_OK(WriteWebDatasetShard(shard, {{"k0.jpg", "a"},
                                         {"k0.cls", "0"},
                                         {"k1.jpg", "b"},
                                         {"k1.txt", "caption"},
                                         {"k2.jpg", "c"},
                                         {"k2.cls", "2"}}));
  EXPECT_STATUS(Strings(Dataset::WebDataset(shard, {"jpg", "cls"})).status(),
                absl::StatusCode::kInvalidArgument,
                "sample 'k1' of shard '" + shard + "' (header at byte offset 2048) has no 'cls' "
                "member (it has: jpg, txt)");
  ASSERT_OK_AND_ASSIGN(auto got, Strings(Dataset::WebDataset(shard, {"jpg", "cls"},
                                                             /*skip_incomplete=*/true)));
  EXPECT_EQ(got, (std::vector<std::vector<std::string>>{{"a", "0"}, {"c", "2"}}));
}

TEST(WebDatasetTest, BadFieldsAreInvalidArgumentWhenBuilt) {
  EXPECT_STATUS(Dataset::WebDataset("/x/*.tar", {}).status(), absl::StatusCode::kInvalidArgument,
                "name at least one field");
  EXPECT_STATUS(Dataset::WebDataset("/x/*.tar", {"jpg", "jpg"}).status(),
                absl::StatusCode::kInvalidArgument, "'jpg' is named twice");
  // Fields compare in lower case, as members' do.
  EXPECT_STATUS(Dataset::WebDataset("/x/*.tar", {"jpg", "JPG"}).status(),
                absl::StatusCode::kInvalidArgument, "'JPG' is named twice");
  EXPECT_STATUS(Dataset::WebDataset("/x/*.tar", {"jpg;"}).status(),
                absl::StatusCode::kInvalidArgument, "is not an extension");
  EXPECT_STATUS(Dataset::WebDataset("/x/*.tar", {".jpg"}).status(),
                absl::StatusCode::kInvalidArgument, "is not an extension");
  EXPECT_STATUS(Dataset::WebDataset(Dataset::Range(3), {"jpg"}).status(),
                absl::StatusCode::kInvalidArgument, "WebDataset: filenames must be strings");
}

TEST(WebDatasetTest, TwoMembersOfOneFieldInASampleAreInvalidArgument) {
  TempDir dir;
  const std::string shard = dir.File("a.tar");
  ASSERT_OK(WriteWebDatasetShard(shard, {{"k0.jpg", "a"}, {"k0.jpg", "b"}}));
  EXPECT_STATUS(Strings(Dataset::WebDataset(shard, {"jpg"})).status(),
                absl::StatusCode::kInvalidArgument, "sample 'k0' of shard '" + shard +
                                                        "' has two 'jpg' members");
}

// Truncated anywhere, a shard is DataLoss naming it and a byte offset;
// bytes that are no tar at all too; an empty file has no samples.
TEST(WebDatasetTest, TruncatedCorruptMissingAndEmptyShards) {
  TempDir dir;
  const std::string whole = WriteShard(dir, 0, 4);
  std::string bytes;
  {
    std::ifstream in(whole, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 4096u);
  int data_loss = 0;
  for (size_t cut : {size_t{100}, size_t{512}, size_t{700}, size_t{1536}, bytes.size() - 1536,
                     bytes.size() - 1100}) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut));
    const std::string part = dir.File(absl::StrCat("cut", cut, ".tar"));
    std::ofstream(part, std::ios::binary) << bytes.substr(0, cut);
    auto got = Strings(Dataset::WebDataset(part, {"jpg", "cls"}));
    ASSERT_FALSE(got.ok()) << "read " << got->size() << " samples";
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_THAT(std::string(got.status().message()),
                testing::HasSubstr("shard '" + part + "' is truncated or corrupt at byte offset"));
    ++data_loss;
  }
  EXPECT_EQ(data_loss, 6);
  const std::string junk = dir.File("junk.tar");
  std::ofstream(junk, std::ios::binary) << std::string(3000, 'z');
  EXPECT_STATUS(Strings(Dataset::WebDataset(junk, {"jpg"})).status(), absl::StatusCode::kDataLoss,
                "shard '" + junk + "' is truncated or corrupt");
  EXPECT_STATUS(Strings(Dataset::WebDataset(std::vector<std::string>{dir.File("none.tar")},
                                            {"jpg"}))
                    .status(),
                absl::StatusCode::kNotFound, "no such shard");
  const std::string empty = dir.File("empty.tar");
  std::ofstream(empty, std::ios::binary).flush();
  ASSERT_OK_AND_ASSIGN(auto none, Strings(Dataset::WebDataset(empty, {"jpg"})));
  EXPECT_TRUE(none.empty());
}

// A member larger than the reader allocates up front (64 MiB) arrives whole.
TEST(WebDatasetTest, AMemberLargerThanTheUpfrontAllocationArrivesWhole) {
  TempDir dir;
  std::string big((size_t{64} << 20) + 12345, '\0');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>(i / 4096);
  const std::string shard = dir.File("big.tar");
  ASSERT_OK(WriteWebDatasetShard(shard, {{"k.bin", big}, {"k.cls", "7"}}));
  ASSERT_OK_AND_ASSIGN(auto got, Strings(Dataset::WebDataset(shard, {"bin", "cls"})));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0][0].size(), big.size());
  EXPECT_TRUE(got[0][0] == big);
  EXPECT_EQ(got[0][1], "7");
}

TEST(WebDatasetTest, CompressedShardsAreReadAsTheyAre) {
  TempDir dir;
  const std::string tar = WriteShard(dir, 0, 3);
  ASSERT_EQ(std::system(("gzip -k " + tar).c_str()), 0);
  ASSERT_OK_AND_ASSIGN(auto plain, Strings(Dataset::WebDataset(tar, {"jpg", "cls"})));
  ASSERT_OK_AND_ASSIGN(auto gz, Strings(Dataset::WebDataset(tar + ".gz", {"jpg", "cls"})));
  EXPECT_EQ(gz, plain);
  EXPECT_EQ(gz.size(), 3u);
}

// A sample's key (Iterator::ElementKey) comes from its shard's and its
// index there: the same however the shards are divided between readers.
TEST(WebDatasetTest, ElementKeysDependOnTheShardAndSampleNotOnHowShardsAreDivided) {
  TempDir dir;
  std::vector<std::string> shards;
  for (int s = 0; s < 4; ++s) shards.push_back(WriteShard(dir, s, 3));
  auto keys = [](const Dataset& ds) {
    std::vector<std::pair<std::string, uint64_t>> out;
    auto it = ds.MakeIterator();
    EXPECT_OK(it.status());
    while (true) {
      auto e = (*it)->Next();
      EXPECT_OK(e.status());
      if (!e.ok() || !e->has_value()) return out;
      const auto key = (*it)->ElementKey();
      EXPECT_TRUE(key.has_value());
      out.emplace_back(std::string((**e)[0].str(0)), key.value_or(0));
    }
  };
  Dataset files = Dataset::FromTensors({{Tensor::Strings(shards)}}).Unbatch();
  auto whole = keys(Dataset::WebDataset(files, {"__key__"}));
  ASSERT_EQ(whole.size(), 12u);
  std::vector<std::pair<std::string, uint64_t>> divided;
  for (int i = 0; i < 2; ++i) {
    for (auto& k : keys(Dataset::WebDataset(files.Shard(2, i), {"__key__"}))) divided.push_back(k);
  }
  std::sort(whole.begin(), whole.end());
  std::sort(divided.begin(), divided.end());
  EXPECT_EQ(divided, whole);
  // Keys differ between samples (and so do the draws of a random op).
  std::set<uint64_t> distinct;
  for (auto& [name, key] : whole) distinct.insert(key);
  EXPECT_EQ(distinct.size(), whole.size());
}

}  // namespace
}  // namespace sluice
