// ReadRecords(filenames): the records of TFRecord files as string scalars.
#include "sluice/dataset/ops/file_reader.h"
#include "sluice/dataset/tfrecord.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) { return AnalyzeReader(a, "ReadRecords"); }

class ReadRecordsIterator : public FileReaderIterator {
 public:
  using FileReaderIterator::FileReaderIterator;
  Result Next() override {
    while (true) {
      if (reader_ == nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto f, NextFile("ReadRecords"));
        if (!f) return End();
        SLUICE_ASSIGN_OR_RETURN(reader_, TFRecordReader::Open(*f));
      }
      SLUICE_ASSIGN_OR_RETURN(auto rec, reader_->Next());
      if (rec) return Emit({Tensor::String(*rec)});
      reader_.reset();
    }
  }
  // The open file and the offset of its next record.
  absl::Status SaveState(proto::IteratorState* state) const override {
    if (reader_ == nullptr) return SaveReader(state, "", {0});
    return SaveReader(state, reader_->path(), {static_cast<int64_t>(reader_->offset())});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    std::string open;
    int64_t offset = 0;
    SLUICE_RETURN_IF_ERROR(RestoreReader(state, &open, {&offset}));
    if (open.empty()) return absl::OkStatus();
    if (offset < 0) return CorruptCheckpoint("a negative ReadRecords offset");
    SLUICE_ASSIGN_OR_RETURN(reader_, TFRecordReader::Open(open));
    return reader_->Seek(static_cast<uint64_t>(offset));
  }

 private:
  std::unique_ptr<TFRecordReader> reader_;
};

}  // namespace

extern const OpDef kReadRecordsOp = {
    .name = "ReadRecords",
    .inputs = &FilenamesField<&proto::DatasetNode::read_records>,
    .mutable_inputs = &MutableFilenamesField<&proto::DatasetNode::mutable_read_records>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<ReadRecordsIterator>,
    .split_passing = SplitPassing::kTracked,
    .file_sharding = FileSharding::kReadsFiles,
};

}  // namespace sluice::internal
