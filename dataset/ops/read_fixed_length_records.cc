// ReadFixedLengthRecords(filenames, record_bytes, header_bytes,
// footer_bytes): fixed-size records as string scalars.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/file_reader.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  const auto& r = a.node->read_fixed_length_records();
  SLUICE_RETURN_IF_ERROR(AnalyzeReader(a, "ReadFixedLengthRecords"));
  if (r.record_bytes() <= 0) return Invalid("ReadFixedLengthRecords", "record_bytes must be > 0");
  if (r.header_bytes() < 0 || r.footer_bytes() < 0) {
    return Invalid("ReadFixedLengthRecords", "header_bytes and footer_bytes must be >= 0");
  }
  return absl::OkStatus();
}

class FixedLengthIterator : public FileReaderIterator {
 public:
  using FileReaderIterator::FileReaderIterator;
  ~FixedLengthIterator() override {
    if (f_) std::fclose(f_);
  }
  Result Next() override {
    const auto& r = node().read_fixed_length_records();
    while (true) {
      if (f_ == nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto name, NextFile("ReadFixedLengthRecords"));
        if (!name) return End();
        SLUICE_RETURN_IF_ERROR(Open(*name, r));
      }
      if (remaining_ > 0) {
        std::string rec(r.record_bytes(), '\0');
        if (std::fread(rec.data(), 1, rec.size(), f_) != rec.size()) {
          return absl::DataLossError(absl::StrCat("ReadFixedLengthRecords: short read in '",
                                                  path_, "'"));
        }
        --remaining_;
        return Emit({Tensor::String(rec)});
      }
      std::fclose(f_);
      f_ = nullptr;
    }
  }
  // The open file, its records left and where the next one starts.
  absl::Status SaveState(proto::IteratorState* state) const override {
    if (f_ == nullptr) return SaveReader(state, "", {0, 0});
    return SaveReader(state, path_, {remaining_, static_cast<int64_t>(std::ftell(f_))});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    std::string open;
    int64_t remaining = 0, position = 0;
    SLUICE_RETURN_IF_ERROR(RestoreReader(state, &open, {&remaining, &position}));
    if (open.empty()) return absl::OkStatus();
    if (remaining < 0 || position < 0) return CorruptCheckpoint("a negative record position");
    SLUICE_RETURN_IF_ERROR(Open(open, node().read_fixed_length_records()));
    if (std::fseek(f_, static_cast<long>(position), SEEK_SET) != 0) {
      return absl::DataLossError(absl::StrCat("ReadFixedLengthRecords: cannot seek in '", path_,
                                              "': ", std::strerror(errno)));
    }
    remaining_ = remaining;
    return absl::OkStatus();
  }

 private:
  absl::Status Open(const std::string& name, const proto::DatasetNode::ReadFixedLengthRecords& r) {
    path_ = name;
    f_ = std::fopen(name.c_str(), "rb");
    if (f_ == nullptr) {
      return absl::NotFoundError(absl::StrCat("ReadFixedLengthRecords: cannot open '", name,
                                              "': ", std::strerror(errno)));
    }
    std::fseek(f_, 0, SEEK_END);
    int64_t size = std::ftell(f_);
    int64_t body = size - r.header_bytes() - r.footer_bytes();
    if (body < 0 || body % r.record_bytes() != 0) {
      return absl::DataLossError(absl::StrCat(
          "ReadFixedLengthRecords: '", name, "' has ", size, " bytes, which is not header ",
          r.header_bytes(), " + footer ", r.footer_bytes(), " + a multiple of ",
          r.record_bytes()));
    }
    remaining_ = body / r.record_bytes();
    std::fseek(f_, r.header_bytes(), SEEK_SET);
    return absl::OkStatus();
  }

  std::string path_;
  std::FILE* f_ = nullptr;
  int64_t remaining_ = 0;
};

}  // namespace

extern const OpDef kReadFixedLengthRecordsOp = {
    .name = "ReadFixedLengthRecords",
    .inputs = &FilenamesField<&proto::DatasetNode::read_fixed_length_records>,
    .mutable_inputs = &MutableFilenamesField<&proto::DatasetNode::mutable_read_fixed_length_records>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<FixedLengthIterator>,
    .split_passing = SplitPassing::kTracked,
    .file_sharding = FileSharding::kReadsFiles,
};

}  // namespace sluice::internal
