// TFRecord files: the record framing TensorFlow writes, so existing training
// data can be read (and test data written).
//
//   | size | field                                  |
//   |------|----------------------------------------|
//   | 8    | length n, little-endian uint64         |
//   | 4    | masked CRC-32C of the 8 length bytes   |
//   | n    | data                                   |
//   | 4    | masked CRC-32C of the data             |
//
// Compression is not supported (uncompressed files only).
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice {

class TFRecordReader {
 public:
  static absl::StatusOr<std::unique_ptr<TFRecordReader>> Open(const std::string& path);
  ~TFRecordReader();
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // The next record, nullopt at a clean end of file; DataLoss for a
  // truncated record or a CRC mismatch (naming the file and offset).
  absl::StatusOr<std::optional<std::string>> Next();
  // Where the next record starts, and going back there (checkpoints).
  uint64_t offset() const { return offset_; }
  absl::Status Seek(uint64_t offset);
  const std::string& path() const { return path_; }

 private:
  TFRecordReader(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  std::string path_;
  std::FILE* f_;
  uint64_t offset_ = 0;
};

// Writes `records` to `path` in TFRecord framing (replacing the file).
absl::Status WriteTFRecordFile(const std::string& path, const std::vector<std::string>& records);

}  // namespace sluice
