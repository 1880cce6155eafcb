// Tests of the dispatcher journal: framing, recovery of torn and corrupt
// tails, and the writer's limits.
#include "sluice/control/journal.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/core/crc32c.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LittleEndian(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// Writes `records` to a new journal in `dir` (no fsync).
void WriteJournal(const std::string& dir, const std::vector<std::string>& records) {
  auto writer = JournalWriter::Open(dir, FsyncPolicy::kNone);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const std::string& r : records) ASSERT_OK((*writer)->Append(r));
}

// Byte offset of record `i` in a journal holding `records`.
uint64_t OffsetOf(const std::vector<std::string>& records, size_t i) {
  uint64_t off = kJournalHeaderBytes;
  for (size_t k = 0; k < i; ++k) off += kJournalRecordHeaderBytes + records[k].size();
  return off;
}

std::string RandomBytes(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(byte(rng));
  return s;
}

// Captures what sluice logs (spdlog's default logger) while it lives.
class LogCapture {
 public:
  LogCapture()
      : previous_(spdlog::default_logger()),
        sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64)) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string Text() const {
    std::string out;
    for (const std::string& line : sink_->last_formatted()) out += line;
    return out;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

class JournalTest : public ::testing::Test {
 protected:
  std::string Dir() const { return tmp_.File("work"); }
  std::string Path() const { return Dir() + "/journal"; }
  std::vector<std::string> Read() {
    auto records = ReadJournal(Dir());
    EXPECT_TRUE(records.ok()) << records.status();
    return records.ok() ? *records : std::vector<std::string>{};
  }

  sluice_test::TempDir tmp_;
};

TEST_F(JournalTest, FileBytesFollowTheByteTable) {
  WriteJournal(Dir(), {"123456789", ""});
  // CRC32C("123456789") = 0xE3069283 (the standard check value); of "" = 0.
  const std::string expected = std::string("SLUICEJN") + LittleEndian(1) + LittleEndian(9) +
                               LittleEndian(crc32c::Mask(0xE3069283u)) + "123456789" +
                               LittleEndian(0) + LittleEndian(crc32c::Mask(0));
  EXPECT_EQ(ReadBytes(Path()), expected);
}

TEST_F(JournalTest, RoundTripsManyRecordsIncludingEmptyAndLarge) {
  std::mt19937 rng(8);
  std::vector<std::string> records = {"", "x", std::string(1, '\0'), RandomBytes(rng, 3 << 20)};
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  records.push_back(all_bytes);
  for (int i = 0; i < 1000; ++i) {
    records.push_back(RandomBytes(rng, std::uniform_int_distribution<size_t>(0, 300)(rng)));
  }
  records.push_back("");
  WriteJournal(Dir(), records);
  EXPECT_EQ(Read(), records);
  EXPECT_EQ(std::filesystem::file_size(Path()), OffsetOf(records, records.size()));
}

TEST_F(JournalTest, RecordOfExactlyTheLimitIsAccepted) {
  std::string big(kMaxRecordBytes, 'b');
  big.front() = 'f';
  big.back() = 'l';
  WriteJournal(Dir(), {big, "after"});
  EXPECT_EQ(Read(), (std::vector<std::string>{big, "after"}));
}

TEST_F(JournalTest, OversizeRecordIsRejectedAndWritesNothing) {
  ASSERT_OK_AND_ASSIGN(auto writer, JournalWriter::Open(Dir(), FsyncPolicy::kNone));
  ASSERT_OK(writer->Append("one"));
  const auto size = std::filesystem::file_size(Path());
  EXPECT_STATUS(writer->Append(std::string(kMaxRecordBytes + 1, 'z')),
                absl::StatusCode::kInvalidArgument, "exceeds the limit");
  EXPECT_EQ(std::filesystem::file_size(Path()), size);
  ASSERT_OK(writer->Append("two"));
  writer.reset();
  EXPECT_THAT(Read(), ElementsAre("one", "two"));
}

TEST_F(JournalTest, ReopenedWriterAppendsAfterTheExistingRecords) {
  WriteJournal(Dir(), {"a", "b", "c"});
  WriteJournal(Dir(), {"d"});
  {
    // The default policy syncs every record.
    ASSERT_OK_AND_ASSIGN(auto writer, JournalWriter::Open(Dir()));
    ASSERT_OK(writer->Append("e"));
  }
  EXPECT_THAT(Read(), ElementsAre("a", "b", "c", "d", "e"));
}

TEST_F(JournalTest, RewriteReplacesTheRecordsAndKeepsTheLockAndAppending) {
  ASSERT_OK_AND_ASSIGN(auto writer, JournalWriter::Open(Dir()));
  for (const char* r : {"a", "b", "c", "d"}) ASSERT_OK(writer->Append(r));
  ASSERT_OK(writer->Rewrite({"snapshot"}));
  EXPECT_FALSE(std::filesystem::exists(Path() + ".compact"));
  EXPECT_EQ(std::filesystem::file_size(Path()), writer->size());
  ASSERT_OK(writer->Append("e"));
  // The new file is still locked by this writer.
  EXPECT_STATUS(JournalWriter::Open(Dir(), FsyncPolicy::kNone),
                absl::StatusCode::kFailedPrecondition, "lock");
  writer.reset();
  EXPECT_EQ(Read(), (std::vector<std::string>{"snapshot", "e"}));
}

TEST_F(JournalTest, MissingDirectoryOrFileIsAnEmptyJournalAndCreatesNothing) {
  EXPECT_TRUE(Read().empty());
  EXPECT_FALSE(std::filesystem::exists(Dir()));
  std::filesystem::create_directories(Dir());
  EXPECT_TRUE(Read().empty());
  EXPECT_FALSE(std::filesystem::exists(Path()));
}

TEST_F(JournalTest, WriterCreatesNestedDirectoriesAndAnEmptyJournal) {
  const std::string nested = Dir() + "/a/b";
  ASSERT_OK_AND_ASSIGN(auto writer, JournalWriter::Open(nested, FsyncPolicy::kNone));
  EXPECT_EQ(writer->path(), nested + "/journal");
  writer.reset();
  EXPECT_EQ(std::filesystem::file_size(nested + "/journal"), kJournalHeaderBytes);
  ASSERT_OK_AND_ASSIGN(auto records, ReadJournal(nested));
  EXPECT_TRUE(records.empty());
}

TEST_F(JournalTest, TornLastRecordAtEveryOffsetIsTruncatedAndEarlierRecordsSurvive) {
  const std::vector<std::string> records = {"first", "", "the last record, torn"};
  WriteJournal(Dir(), records);
  const std::string whole = ReadBytes(Path());
  const uint64_t last = OffsetOf(records, 2);
  for (uint64_t cut = last; cut < whole.size(); ++cut) {
    SCOPED_TRACE(cut);
    WriteBytes(Path(), whole.substr(0, cut));
    LogCapture log;
    EXPECT_THAT(Read(), ElementsAre("first", ""));
    EXPECT_EQ(std::filesystem::file_size(Path()), last);
    if (cut == last) {
      EXPECT_EQ(log.Text(), "");  // a clean end: nothing to drop
    } else {
      EXPECT_THAT(log.Text(), HasSubstr(Path()));
      EXPECT_THAT(log.Text(), HasSubstr(absl::StrCat("from offset ", last)));
      EXPECT_THAT(log.Text(), HasSubstr(cut - last < kJournalRecordHeaderBytes
                                            ? "torn record header"
                                            : "torn payload"));
    }
  }
  // A writer continues after the valid prefix.
  WriteBytes(Path(), whole.substr(0, whole.size() - 1));
  WriteJournal(Dir(), {"next"});
  EXPECT_THAT(Read(), ElementsAre("first", "", "next"));
}

TEST_F(JournalTest, TornFileHeaderIsAnEmptyJournalThatAWriterRewrites) {
  WriteJournal(Dir(), {});
  const std::string header = ReadBytes(Path());
  ASSERT_EQ(header.size(), kJournalHeaderBytes);
  for (size_t n = 1; n < kJournalHeaderBytes; ++n) {
    SCOPED_TRACE(n);
    WriteBytes(Path(), header.substr(0, n));
    LogCapture log;
    EXPECT_TRUE(Read().empty());
    EXPECT_EQ(std::filesystem::file_size(Path()), 0u);
    EXPECT_THAT(log.Text(), HasSubstr("torn file header"));
  }
  WriteJournal(Dir(), {"r"});
  EXPECT_THAT(Read(), ElementsAre("r"));
  EXPECT_EQ(ReadBytes(Path()).substr(0, kJournalHeaderBytes), header);
}

TEST_F(JournalTest, AnyFlippedBitInARecordDropsItAndEverythingAfter) {
  const std::vector<std::string> records = {"zero", "one", "two: the corrupt one", "three", "four"};
  WriteJournal(Dir(), records);
  const std::string whole = ReadBytes(Path());
  const uint64_t begin = OffsetOf(records, 2), end = OffsetOf(records, 3);
  for (uint64_t byte = begin; byte < end; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      SCOPED_TRACE(absl::StrCat("byte ", byte, " bit ", bit));
      std::string bad = whole;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      WriteBytes(Path(), bad);
      LogCapture log;
      EXPECT_THAT(Read(), ElementsAre("zero", "one"));
      EXPECT_EQ(std::filesystem::file_size(Path()), begin);
      EXPECT_THAT(log.Text(), HasSubstr(absl::StrCat("journal '", Path(), "': dropping ",
                                                     whole.size() - begin, " bytes from offset ",
                                                     begin)));
      if (byte >= begin + kJournalRecordHeaderBytes) {
        EXPECT_THAT(log.Text(), HasSubstr("CRC mismatch"));
      }
    }
  }
}

TEST_F(JournalTest, AbsurdLengthAndZeroFilledTailAreDropped) {
  WriteJournal(Dir(), {"kept"});
  const std::string good = ReadBytes(Path());
  {
    WriteBytes(Path(), good + LittleEndian(kMaxRecordBytes + 1) + LittleEndian(0) + "xyz");
    LogCapture log;
    EXPECT_THAT(Read(), ElementsAre("kept"));
    EXPECT_THAT(log.Text(), HasSubstr("exceeds the limit"));
  }
  {
    // What a file system may leave after a crash: the masked CRC of an empty
    // payload is not 0, so zeros are not a valid empty record.
    WriteBytes(Path(), good + std::string(4096, '\0'));
    LogCapture log;
    EXPECT_THAT(Read(), ElementsAre("kept"));
    EXPECT_THAT(log.Text(), HasSubstr("CRC mismatch"));
  }
  EXPECT_EQ(ReadBytes(Path()), good);
}

TEST_F(JournalTest, BadMagicOrVersionIsAnErrorAndTheFileIsLeftAlone) {
  std::filesystem::create_directories(Dir());
  const std::string not_journal = "NOTAJRNL" + LittleEndian(1) + "whatever follows";
  WriteBytes(Path(), not_journal);
  EXPECT_STATUS(ReadJournal(Dir()), absl::StatusCode::kFailedPrecondition, "not a sluice journal");
  EXPECT_STATUS(ReadJournal(Dir()), absl::StatusCode::kFailedPrecondition, Path());
  EXPECT_STATUS(JournalWriter::Open(Dir(), FsyncPolicy::kNone),
                absl::StatusCode::kFailedPrecondition, "not a sluice journal");
  EXPECT_EQ(ReadBytes(Path()), not_journal);

  WriteBytes(Path(), "S");  // a torn header must match the magic too
  EXPECT_STATUS(ReadJournal(Dir()), absl::StatusCode::kOk, "");
  WriteBytes(Path(), "X");
  EXPECT_STATUS(ReadJournal(Dir()), absl::StatusCode::kFailedPrecondition, "not a sluice journal");

  const std::string v2 = "SLUICEJN" + LittleEndian(2);
  WriteBytes(Path(), v2);
  EXPECT_STATUS(ReadJournal(Dir()), absl::StatusCode::kFailedPrecondition,
                "version 2; this build reads version 1");
  EXPECT_EQ(ReadBytes(Path()), v2);
}

TEST_F(JournalTest, OneWriterAtATime) {
  ASSERT_OK_AND_ASSIGN(auto writer, JournalWriter::Open(Dir(), FsyncPolicy::kNone));
  ASSERT_OK(writer->Append("held"));
  EXPECT_STATUS(JournalWriter::Open(Dir(), FsyncPolicy::kNone),
                absl::StatusCode::kFailedPrecondition, "locked by a journal writer or reader");
  EXPECT_STATUS(ReadJournal(Dir()), absl::StatusCode::kFailedPrecondition, "locked by a journal writer or reader");
  writer.reset();
  EXPECT_THAT(Read(), ElementsAre("held"));
}

TEST(ParseJournalTest, ReportsTheValidPrefixWithoutTouchingFiles) {
  EXPECT_EQ(ParseJournal("")->valid_bytes, 0u);
  EXPECT_EQ(ParseJournal("")->tail_problem, "");
  const std::string header = "SLUICEJN" + LittleEndian(1);
  const std::string rec = LittleEndian(2) + LittleEndian(crc32c::Mask(crc32c::Value("hi", 2))) + "hi";
  ASSERT_OK_AND_ASSIGN(ParsedJournal p, ParseJournal(header + rec + rec.substr(0, 9)));
  EXPECT_THAT(p.records, ElementsAre("hi"));
  EXPECT_EQ(p.valid_bytes, header.size() + rec.size());
  EXPECT_EQ(p.tail_problem, "torn payload (1 of 2 bytes)");
}

}  // namespace
}  // namespace sluice::internal
