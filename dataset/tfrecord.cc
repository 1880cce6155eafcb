#include "sluice/dataset/tfrecord.h"

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "sluice/core/crc32c.h"

namespace sluice {
namespace {

// Records larger than this are treated as corruption rather than allocated.
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 32;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TFRecordReader>> TFRecordReader::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no such file '", path, "'"));
    return Errno("cannot open", path);
  }
  return std::unique_ptr<TFRecordReader>(new TFRecordReader(path, f));
}

TFRecordReader::~TFRecordReader() { std::fclose(f_); }

absl::Status TFRecordReader::Seek(uint64_t offset) {
  if (offset > static_cast<uint64_t>(std::numeric_limits<long>::max()) ||
      std::fseek(f_, static_cast<long>(offset), SEEK_SET) != 0) {
    return Errno("cannot seek in", path_);
  }
  offset_ = offset;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> TFRecordReader::Next() {
  uint8_t head[12];
  size_t got = std::fread(head, 1, sizeof(head), f_);
  if (got == 0 && std::feof(f_)) return std::optional<std::string>();
  if (got != sizeof(head)) {
    if (std::ferror(f_)) return Errno("cannot read", path_);
    return absl::DataLossError(absl::StrCat("truncated record header in '", path_,
                                            "' at offset ", offset_));
  }
  uint64_t len;
  uint32_t len_crc;
  std::memcpy(&len, head, 8);
  std::memcpy(&len_crc, head + 8, 4);
  if (crc32c::Unmask(len_crc) != crc32c::Value(head, 8)) {
    return absl::DataLossError(absl::StrCat("corrupt record length (CRC mismatch) in '", path_,
                                            "' at offset ", offset_));
  }
  if (len > kMaxRecordBytes) {
    return absl::DataLossError(absl::StrCat("record of ", len, " bytes in '", path_,
                                            "' at offset ", offset_, " exceeds the 4 GiB limit"));
  }
  std::string data(len, '\0');
  uint32_t data_crc;
  if (std::fread(data.data(), 1, len, f_) != len || std::fread(&data_crc, 1, 4, f_) != 4) {
    if (std::ferror(f_)) return Errno("cannot read", path_);
    return absl::DataLossError(absl::StrCat("truncated record in '", path_, "' at offset ",
                                            offset_));
  }
  if (crc32c::Unmask(data_crc) != crc32c::Value(data.data(), data.size())) {
    return absl::DataLossError(absl::StrCat("corrupt record data (CRC mismatch) in '", path_,
                                            "' at offset ", offset_));
  }
  offset_ += 16 + len;
  return std::optional<std::string>(std::move(data));
}

absl::Status WriteTFRecordFile(const std::string& path, const std::vector<std::string>& records) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Errno("cannot create", path);
  bool ok = true;
  for (const std::string& r : records) {
    uint8_t head[12];
    uint64_t len = r.size();
    std::memcpy(head, &len, 8);
    uint32_t len_crc = crc32c::Mask(crc32c::Value(head, 8));
    std::memcpy(head + 8, &len_crc, 4);
    uint32_t data_crc = crc32c::Mask(crc32c::Value(r.data(), r.size()));
    ok = ok && std::fwrite(head, 1, 12, f) == 12 &&
         std::fwrite(r.data(), 1, r.size(), f) == r.size() &&
         std::fwrite(&data_crc, 1, 4, f) == 4;
  }
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return Errno("cannot write", path);
  return absl::OkStatus();
}

}  // namespace sluice
