#include "sluice/control/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sluice/core/crc32c.h"
#include "sluice/core/status.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {
namespace {

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

uint32_t MaskedCrc(std::string_view payload) {
  return crc32c::Mask(crc32c::Value(payload.data(), payload.size()));
}

std::string FileHeader() {
  std::string h(kJournalMagic);
  h.resize(kJournalHeaderBytes);
  PutU32(kJournalVersion, h.data() + kJournalMagic.size());
  return h;
}

std::string JournalPath(const std::string& dir) {
  return (std::filesystem::path(dir) / kJournalFileName).string();
}

// Reads errno first thing; callers call it right after the failed call.
absl::Status ErrnoError(const std::string& path, const std::string& what) {
  const int err = errno;
  return absl::ErrnoToStatus(err, absl::StrCat("journal '", path, "': ", what));
}

// Checks that `bytes` starts with the file header, or with a prefix of it
// when shorter (a header torn by a crash while the file was created).
absl::Status CheckFileHeader(std::string_view bytes) {
  const std::string expected = FileHeader();
  const size_t n = std::min(bytes.size(), expected.size());
  const size_t magic_n = std::min(n, kJournalMagic.size());
  if (bytes.substr(0, magic_n) != kJournalMagic.substr(0, magic_n)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not a sluice journal (its first bytes are not the magic \"", std::string(kJournalMagic),
        "\"); move it aside or use another directory"));
  }
  if (bytes.substr(0, n) != std::string_view(expected).substr(0, n)) {
    std::string version = n == expected.size()
                              ? absl::StrCat(GetU32(bytes.data() + kJournalMagic.size()))
                              : std::string("(torn, not ") + std::to_string(kJournalVersion) + ")";
    return absl::FailedPreconditionError(absl::StrCat("the file header has version ", version,
                                                      "; this build reads version ",
                                                      kJournalVersion));
  }
  return absl::OkStatus();
}

// An open, locked journal file whose bad tail, if any, has been truncated.
struct RecoveredFile {
  int fd = -1;  // owned by the caller from here on
  uint64_t size = 0;
  std::vector<std::string> records;
};

// Reads all of `fd` from offset 0.
absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError(path, "fstat failed");
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("journal '", path, "' is not a regular file"));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t r = pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError(path, "read failed");
    if (r == 0) break;  // shrank while we read: use what is there
    done += static_cast<size_t>(r);
  }
  bytes.resize(done);
  return bytes;
}

// Locks, reads and recovers the open journal `fd` (closed on error).
absl::StatusOr<RecoveredFile> Recover(int fd, const std::string& path) {
  auto fail = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "journal '", path,
          "' is in use: locked by a journal writer or reader (is another dispatcher using this "
          "directory?)")));
    }
    return fail(ErrnoError(path, "flock failed"));
  }
  absl::StatusOr<std::string> bytes = ReadAll(fd, path);
  if (!bytes.ok()) return fail(bytes.status());
  absl::StatusOr<ParsedJournal> parsed = ParseJournal(*bytes);
  if (!parsed.ok()) {
    return fail(absl::Status(parsed.status().code(),
                             absl::StrCat("journal '", path, "': ", parsed.status().message())));
  }
  if (parsed->valid_bytes < bytes->size()) {
    spdlog::warn("journal '{}': dropping {} bytes from offset {}: {}", path,
                 bytes->size() - parsed->valid_bytes, parsed->valid_bytes, parsed->tail_problem);
    if (ftruncate(fd, static_cast<off_t>(parsed->valid_bytes)) != 0) {
      return fail(ErrnoError(path, absl::StrCat("cannot truncate to ", parsed->valid_bytes, " bytes")));
    }
    // Durable before anything is appended after the cut.
    if (fdatasync(fd) != 0) return fail(ErrnoError(path, "fdatasync after truncation failed"));
  }
  return RecoveredFile{fd, parsed->valid_bytes, std::move(parsed->records)};
}

// Writes all of `iov` at `offset`, resuming after short writes.
// Appends `record` with its header (length, masked CRC) to `out`.
void AppendFramed(std::string_view record, std::string* out) {
  char header[kJournalRecordHeaderBytes];
  PutU32(static_cast<uint32_t>(record.size()), header);
  PutU32(MaskedCrc(record), header + 4);
  out->append(header, sizeof(header));
  out->append(record);
}

bool PwriteAll(int fd, uint64_t offset, iovec* iov, int iovcnt) {
  while (iovcnt > 0) {
    ssize_t w = pwritev(fd, iov, iovcnt, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    offset += static_cast<uint64_t>(w);
    size_t left = static_cast<size_t>(w);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

absl::Status SyncDir(const std::string& dir) {
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError(dir, "cannot open its directory to sync it");
  int rc = fsync(dfd);
  int saved = errno;
  close(dfd);
  errno = saved;
  return rc == 0 ? absl::OkStatus() : ErrnoError(dir, "fsync of its directory failed");
}

}  // namespace

absl::StatusOr<ParsedJournal> ParseJournal(std::string_view bytes) {
  SLUICE_RETURN_IF_ERROR(CheckFileHeader(bytes));
  ParsedJournal out;
  if (bytes.size() < kJournalHeaderBytes) {
    if (!bytes.empty()) {
      out.tail_problem = absl::StrCat("torn file header (", bytes.size(), " of ",
                                      kJournalHeaderBytes, " bytes)");
    }
    return out;
  }
  uint64_t off = kJournalHeaderBytes;
  while (off < bytes.size()) {
    const uint64_t left = bytes.size() - off;
    if (left < kJournalRecordHeaderBytes) {
      out.tail_problem = absl::StrCat("torn record header (", left, " of ",
                                      kJournalRecordHeaderBytes, " bytes)");
      break;
    }
    const uint32_t length = GetU32(bytes.data() + off);
    const uint32_t stored_crc = GetU32(bytes.data() + off + 4);
    if (length > kMaxRecordBytes) {
      out.tail_problem = absl::StrCat("record length ", length, " exceeds the limit of ",
                                      kMaxRecordBytes, " bytes");
      break;
    }
    if (left - kJournalRecordHeaderBytes < length) {
      out.tail_problem = absl::StrCat("torn payload (", left - kJournalRecordHeaderBytes, " of ",
                                      length, " bytes)");
      break;
    }
    std::string_view payload = bytes.substr(off + kJournalRecordHeaderBytes, length);
    const uint32_t crc = MaskedCrc(payload);
    if (crc != stored_crc) {
      out.tail_problem = absl::StrCat("CRC mismatch in a record of ", length, " bytes (stored 0x",
                                      absl::Hex(stored_crc, absl::kZeroPad8), ", computed 0x",
                                      absl::Hex(crc, absl::kZeroPad8), ")");
      break;
    }
    out.records.emplace_back(payload);
    off += kJournalRecordHeaderBytes + length;
  }
  out.valid_bytes = off;
  return out;
}

absl::StatusOr<std::vector<std::string>> ReadJournal(const std::string& dir) {
  const std::string path = JournalPath(dir);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::vector<std::string>{};
    return ErrnoError(path, "cannot open");
  }
  SLUICE_ASSIGN_OR_RETURN(RecoveredFile file, Recover(fd, path));
  close(file.fd);
  return std::move(file.records);
}

absl::StatusOr<std::unique_ptr<JournalWriter>> JournalWriter::Open(const std::string& dir,
                                                                   FsyncPolicy policy) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::Status(absl::ErrnoToStatusCode(ec.value()),
                        absl::StrCat("journal directory '", dir, "': cannot create: ", ec.message()));
  }
  const std::string path = JournalPath(dir);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(path, "cannot open or create");
  SLUICE_ASSIGN_OR_RETURN(RecoveredFile file, Recover(fd, path));
  std::unique_ptr<JournalWriter> writer(
      new JournalWriter(dir, path, file.fd, file.size, policy));
  if (file.size == 0) {  // new, empty, or only a torn header: (re)write the header
    std::string header = FileHeader();
    iovec iov{header.data(), header.size()};
    if (!PwriteAll(writer->fd_, 0, &iov, 1)) return ErrnoError(path, "cannot write the file header");
    if (policy == FsyncPolicy::kEveryRecord) {
      if (fdatasync(writer->fd_) != 0) return ErrnoError(path, "fdatasync failed");
      SLUICE_RETURN_IF_ERROR(SyncDir(dir));  // make the new file's name durable
    }
    writer->size_ = header.size();
  }
  return writer;
}

JournalWriter::JournalWriter(std::string dir, std::string path, int fd, uint64_t size,
                             FsyncPolicy policy)
    : dir_(std::move(dir)), path_(std::move(path)), fd_(fd), policy_(policy), size_(size) {}

absl::Status JournalWriter::Rewrite(const std::vector<std::string>& records) {
  SLUICE_RETURN_IF_ERROR(WriteCompacted(records));
  return InstallCompacted({});
}

absl::Status JournalWriter::WriteCompacted(const std::vector<std::string>& records) {
  SLUICE_RETURN_IF_ERROR(broken_);
  DropCompacted();
  const std::string tmp = path_ + ".compact";
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(tmp, "cannot create");
  auto fail = [&](absl::Status s) {
    close(fd);
    unlink(tmp.c_str());
    return s;
  };
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return fail(ErrnoError(tmp, "flock failed"));
  std::string bytes = FileHeader();
  for (const std::string& r : records) {
    if (r.size() > kMaxRecordBytes) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "journal '", path_, "': a compacted record of ", r.size(), " bytes exceeds the limit")));
    }
    AppendFramed(r, &bytes);
  }
  iovec iov{bytes.data(), bytes.size()};
  if (!PwriteAll(fd, 0, &iov, 1)) return fail(ErrnoError(tmp, "cannot write"));
  if (policy_ == FsyncPolicy::kEveryRecord) {
    ++syncs_;
    if (fdatasync(fd) != 0) return fail(ErrnoError(tmp, "fdatasync failed"));
  }
  compact_fd_ = fd;
  compact_size_ = bytes.size();
  return absl::OkStatus();
}

void JournalWriter::DropCompacted() {
  if (compact_fd_ < 0) return;
  close(compact_fd_);
  unlink((path_ + ".compact").c_str());
  compact_fd_ = -1;
}

absl::Status JournalWriter::InstallCompacted(const std::vector<std::string>& tail) {
  if (compact_fd_ < 0) return absl::FailedPreconditionError("no compacted journal was written");
  const std::string tmp = path_ + ".compact";
  auto fail = [&](absl::Status s) {
    DropCompacted();
    return s;
  };
  if (!broken_.ok()) return fail(broken_);
  if (!tail.empty()) {
    std::string bytes;
    for (const std::string& r : tail) AppendFramed(r, &bytes);
    iovec iov{bytes.data(), bytes.size()};
    if (!PwriteAll(compact_fd_, compact_size_, &iov, 1)) {
      return fail(ErrnoError(tmp, "cannot write"));
    }
    compact_size_ += bytes.size();
    if (policy_ == FsyncPolicy::kEveryRecord) {
      ++syncs_;
      if (fdatasync(compact_fd_) != 0) return fail(ErrnoError(tmp, "fdatasync failed"));
    }
  }
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    return fail(ErrnoError(tmp, absl::StrCat("cannot rename it to ", path_)));
  }
  // From here the new file is the journal, whatever happens next.
  close(fd_);
  fd_ = compact_fd_;
  size_ = compact_size_;
  compact_fd_ = -1;
  if (policy_ == FsyncPolicy::kEveryRecord) {
    absl::Status s = SyncDir(dir_);
    if (!s.ok()) {
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          "journal '", path_, "': the directory sync after compaction failed (", s.message(),
          "); reopen the journal"));
      return s;
    }
  }
  return absl::OkStatus();
}

JournalWriter::~JournalWriter() {
  DropCompacted();
  close(fd_);
}

absl::Status JournalWriter::Append(std::string_view record) {
  return AppendBatch({std::string(record)});
}

absl::Status JournalWriter::AppendBatch(const std::vector<std::string>& records) {
  SLUICE_RETURN_IF_ERROR(broken_);
  size_t bytes = 0;
  for (const std::string& record : records) {
    if (record.size() > kMaxRecordBytes) {
      return absl::InvalidArgumentError(absl::StrCat("journal '", path_, "': a record of ",
                                                     record.size(), " bytes exceeds the limit of ",
                                                     kMaxRecordBytes, " bytes"));
    }
    bytes += kJournalRecordHeaderBytes + record.size();
  }
  if (records.empty()) return absl::OkStatus();
  std::string framed;
  framed.reserve(bytes);
  for (const std::string& record : records) {
    AppendFramed(record, &framed);
  }
  iovec iov = {framed.data(), framed.size()};
  if (fault_hook_) fault_hook_(Stage::kBeforeWrite);
  if (!PwriteAll(fd_, size_, &iov, 1)) {
    absl::Status s = ErrnoError(path_, absl::StrCat("cannot append ", records.size(),
                                                    " record(s) at offset ", size_));
    // Cut the partial batch off so a later append does not follow it.
    if (ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          "journal '", path_, "': an append failed and the partial record could not be removed; "
          "reopen the journal to recover it"));
    }
    return s;
  }
  if (fault_hook_) fault_hook_(Stage::kBeforeSync);
  if (policy_ == FsyncPolicy::kEveryRecord) {
    ++syncs_;
    if (fdatasync(fd_) != 0) {
      absl::Status s = ErrnoError(path_, "fdatasync failed");
      // After a failed sync the kernel may have dropped the dirty pages:
      // what the file holds is unknown.
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          "journal '", path_, "': an earlier fdatasync failed (", s.message(),
          "); reopen the journal to recover it"));
      return s;
    }
  }
  size_ += framed.size();
  return absl::OkStatus();
}

}  // namespace sluice::internal
