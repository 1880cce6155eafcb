// WebDataset(filenames, fields, skip_incomplete): the samples of WebDataset
// tar shards (dataset/webdataset.h), one string scalar per requested field.
// A reader as ReadRecords is: shards split, shard and key as its files do.
#include "sluice/dataset/ops/file_reader.h"
#include "sluice/dataset/webdataset.h"

namespace sluice::internal {
namespace {

constexpr char kOp[] = "WebDataset";

std::vector<std::string> FieldsOf(const proto::DatasetNode& node) {
  const auto& f = node.web_dataset().fields();
  return {f.begin(), f.end()};
}

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_RETURN_IF_ERROR(AnalyzeReader(a, kOp));
  SLUICE_RETURN_IF_ERROR(ParseWebDatasetFields(FieldsOf(*a.node)).status());
  a.spec.components.assign(static_cast<size_t>(a.node->web_dataset().fields_size()),
                           ScalarSpec(DType::kString));
  return absl::OkStatus();
}

class WebDatasetIterator : public FileReaderIterator {
 public:
  WebDatasetIterator(AnalysisPtr a, std::unique_ptr<Iterator> files)
      : FileReaderIterator(std::move(a), std::move(files)),
        fields_(*ParseWebDatasetFields(FieldsOf(node()))) {}  // checked by Analyze

  Result Next() override {
    while (true) {
      if (reader_ == nullptr) {
        SLUICE_ASSIGN_OR_RETURN(auto f, NextFile(kOp));
        if (!f) return End();
        SLUICE_RETURN_IF_ERROR(Open(*f));
      }
      SLUICE_ASSIGN_OR_RETURN(auto sample, reader_->Next());
      if (sample) {
        Element e;
        e.reserve(sample->values.size());
        for (const std::string& v : sample->values) e.push_back(Tensor::String(v));
        return Emit(std::move(e));
      }
      reader_.reset();
    }
  }
  // The open shard and how many samples of it were read (restoring passes
  // over them without reading their data).
  absl::Status SaveState(proto::IteratorState* state) const override {
    if (reader_ == nullptr) return SaveReader(state, "", {0});
    return SaveReader(state, reader_->path(), {reader_->index()});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    std::string open;
    int64_t samples = 0;
    SLUICE_RETURN_IF_ERROR(RestoreReader(state, &open, {&samples}));
    if (open.empty()) return absl::OkStatus();
    if (samples < 0) return CorruptCheckpoint("a negative WebDataset sample index");
    SLUICE_RETURN_IF_ERROR(Open(open));
    return reader_->Skip(samples);
  }

 private:
  absl::Status Open(const std::string& shard) {
    SLUICE_ASSIGN_OR_RETURN(reader_, WebDatasetShardReader::Open(
                                         shard, fields_, node().web_dataset().skip_incomplete()));
    return absl::OkStatus();
  }

  const std::vector<WebDatasetFieldSpec> fields_;
  std::unique_ptr<WebDatasetShardReader> reader_;
};

}  // namespace

extern const OpDef kWebDatasetOp = {
    .name = kOp,
    .inputs = &FilenamesField<&proto::DatasetNode::web_dataset>,
    .mutable_inputs = &MutableFilenamesField<&proto::DatasetNode::mutable_web_dataset>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<WebDatasetIterator>,
    .split_passing = SplitPassing::kTracked,
    .file_sharding = FileSharding::kReadsFiles,
};

}  // namespace sluice::internal
