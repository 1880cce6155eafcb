#include "sluice/core/compress.h"

#include <zstd.h>

#include "absl/strings/str_cat.h"

namespace sluice {

std::string ZstdCompress(std::string_view data, int level) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), level);
  // Only a destination smaller than the bound fails; it is the bound.
  out.resize(ZSTD_isError(n) ? 0 : n);
  return out;
}

absl::StatusOr<std::string> ZstdDecompress(std::string_view compressed, uint64_t max_bytes) {
  const unsigned long long size = ZSTD_getFrameContentSize(compressed.data(), compressed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::DataLossError(
        absl::StrCat("not a zstd frame that says its size (", compressed.size(), " bytes)"));
  }
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("zstd frame decompresses to ", size, " bytes, more than ", max_bytes));
  }
  std::string out(static_cast<size_t>(size), '\0');
  const size_t n = ZSTD_decompress(out.data(), out.size(), compressed.data(), compressed.size());
  if (ZSTD_isError(n) || n != size) {
    return absl::DataLossError(absl::StrCat(
        "zstd frame does not decompress: ",
        ZSTD_isError(n) ? ZSTD_getErrorName(n) : "shorter than it says"));
  }
  return out;
}

}  // namespace sluice
