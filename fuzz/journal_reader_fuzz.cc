// Fuzzes journal recovery: the input is written as `<tmp>/journal` and read
// back with ReadJournal, as a restarting dispatcher would. Beyond "never
// crash", it checks the recovery contract of control/journal.h:
//   - ReadJournal succeeds exactly when ParseJournal of the bytes does, and
//     returns the same records; on failure the file is left untouched;
//   - the file is cut to the valid prefix, byte for byte the input's;
//   - reading again returns the same records and changes nothing;
//   - a writer opened on the recovered file appends after those records.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "sluice/control/journal.h"
#include "spdlog/spdlog.h"

namespace {

using sluice::internal::FsyncPolicy;
using sluice::internal::JournalWriter;
using sluice::internal::ParseJournal;
using sluice::internal::ReadJournal;

// A scratch directory for the process, removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::error_code ec;
    std::string tmpl = (std::filesystem::temp_directory_path(ec) / "sluice_journal_fuzz_XXXXXX").string();
    SLUICE_FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
    spdlog::set_level(spdlog::level::off);  // every torn input would warn
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  SLUICE_FUZZ_CHECK(!f.fail());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir dir;
  const std::string path = dir.path() + "/journal";
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  WriteFile(path, input);

  auto parsed = ParseJournal(input);
  auto records = ReadJournal(dir.path());
  SLUICE_FUZZ_CHECK(records.ok() == parsed.ok());
  if (!records.ok()) {
    SLUICE_FUZZ_CHECK(ReadFile(path) == input);  // not a journal: left alone
    return 0;
  }
  SLUICE_FUZZ_CHECK(*records == parsed->records);
  SLUICE_FUZZ_CHECK(parsed->valid_bytes <= size);
  SLUICE_FUZZ_CHECK(parsed->tail_problem.empty() == (parsed->valid_bytes == size));
  SLUICE_FUZZ_CHECK(ReadFile(path) == input.substr(0, parsed->valid_bytes));

  auto again = ReadJournal(dir.path());
  SLUICE_FUZZ_CHECK(again.ok() && *again == *records);
  SLUICE_FUZZ_CHECK(std::filesystem::file_size(path) == parsed->valid_bytes);

  {
    auto writer = JournalWriter::Open(dir.path(), FsyncPolicy::kNone);
    SLUICE_FUZZ_CHECK(writer.ok());
    SLUICE_FUZZ_CHECK((*writer)->Append("appended after recovery").ok());
  }
  auto appended = ReadJournal(dir.path());
  SLUICE_FUZZ_CHECK(appended.ok());
  std::vector<std::string> expected = *records;
  expected.push_back("appended after recovery");
  SLUICE_FUZZ_CHECK(*appended == expected);
  return 0;
}
