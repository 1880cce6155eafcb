// Fuzzes WebDataset shard reading (dataset/webdataset.cc) on untrusted
// bytes, as a worker reads whatever shards a pipeline names. Beyond "never
// crash" (and no ASan report), it checks:
//   - a sample has one value per requested field, "__key__" its key;
//   - an error is DataLoss (truncated or corrupt: it names a byte offset)
//     or InvalidArgument (a missing or doubled field);
//   - passing over samples (restoring a checkpoint) meets the same samples:
//     Skip(k) then Next() gives what the k+1-th Next() gave.
// The input is read through a memfd, as the reader opens files by path.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "sluice/dataset/webdataset.h"

namespace {

constexpr int kMaxSamples = 64;

bool ExpectedError(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kDataLoss) {
    return s.message().find("byte offset") != absl::string_view::npos;
  }
  return s.code() == absl::StatusCode::kInvalidArgument;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("webdataset_fuzz", 0);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const bool skip_incomplete = size > 0 && (data[size - 1] & 1) != 0;
  auto fields = sluice::ParseWebDatasetFields({"jpg;png", "cls", "__key__"});
  SLUICE_FUZZ_CHECK(fields.ok());

  std::vector<std::string> keys;
  auto reader = sluice::WebDatasetShardReader::Open(path, *fields, skip_incomplete);
  if (!reader.ok()) {
    SLUICE_FUZZ_CHECK(ExpectedError(reader.status()));
    close(fd);
    return 0;
  }
  for (int i = 0; i < kMaxSamples; ++i) {
    auto s = (*reader)->Next();
    if (!s.ok()) {
      SLUICE_FUZZ_CHECK(ExpectedError(s.status()));
      break;
    }
    if (!s->has_value()) break;
    SLUICE_FUZZ_CHECK((*s)->values.size() == 3);
    SLUICE_FUZZ_CHECK((*s)->values[2] == (*s)->key);
    keys.push_back((*s)->key);
  }
  // Restoring after sample k: the sample read next is the one read then.
  if (!keys.empty() && !skip_incomplete) {
    const int64_t k = static_cast<int64_t>(size % keys.size());
    auto again = sluice::WebDatasetShardReader::Open(path, *fields, skip_incomplete);
    SLUICE_FUZZ_CHECK(again.ok());
    SLUICE_FUZZ_CHECK((*again)->Skip(k).ok());
    SLUICE_FUZZ_CHECK((*again)->index() == k);
    auto s = (*again)->Next();
    SLUICE_FUZZ_CHECK(s.ok() && s->has_value() && (*s)->key == keys[static_cast<size_t>(k)]);
  }
  close(fd);
  return 0;
}
