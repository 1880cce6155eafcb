// Batch(batch_size, drop_remainder): consecutive elements stacked along a
// new leading dimension.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  const auto& b = a.node->batch();
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Batch"));
  SLUICE_RETURN_IF_ERROR(CheckParallelCalls("Batch", b.num_parallel_calls()));
  if (b.batch_size() <= 0) {
    return Invalid("Batch", absl::StrCat("batch_size must be > 0; got ", b.batch_size()));
  }
  a.spec.known = in->spec.known;
  for (const auto& c : in->spec.components) {
    ComponentSpec o = c;
    if (c.shape) o.shape->insert(o.shape->begin(), b.drop_remainder() ? b.batch_size() : -1);
    a.spec.components.push_back(std::move(o));
  }
  int64_t n = in->cardinality;
  if (n >= 0) {
    a.cardinality = b.drop_remainder() ? n / b.batch_size()
                                       : (n + b.batch_size() - 1) / b.batch_size();
  } else {
    a.cardinality = n;
  }
  return absl::OkStatus();
}

// A parallel copy hands each pool thread at least this many bytes.
constexpr size_t kMinParallelCopyBytes = size_t{1} << 20;

// Copies parts[begin, end) into `out` at their offsets (parts are equal-sized).
void CopyParts(const std::vector<const Tensor*>& parts, size_t begin, size_t end, uint8_t* out) {
  for (size_t i = begin; i < end; ++i) {
    const size_t n = parts[i]->byte_size();
    if (n) std::memcpy(out + i * n, parts[i]->data(), n);
  }
}

// Stacks equal-shaped tensors along a new leading dimension, copying on up
// to `parallelism` threads (the caller's and the pool's) when large.
absl::StatusOr<Tensor> Stack(const std::vector<const Tensor*>& parts, size_t component,
                             int64_t parallelism) {
  const Tensor& first = *parts[0];
  std::vector<int64_t> dims = first.shape().dims();
  dims.insert(dims.begin(), static_cast<int64_t>(parts.size()));
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i]->dtype() != first.dtype() || parts[i]->shape() != first.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Batch: component ", component, " of batch element ", i, " is ",
          DTypeName(parts[i]->dtype()), parts[i]->shape().ToString(), " but element 0's is ",
          DTypeName(first.dtype()), first.shape().ToString(),
          "; Batch needs equal shapes (Map them to a common shape first)"));
    }
  }
  if (first.dtype() == DType::kString) {
    std::vector<std::string_view> strs;
    for (const Tensor* t : parts) {
      for (int64_t k = 0; k < t->num_elements(); ++k) strs.push_back(t->str(k));
    }
    return MakeStringTensor(strs, TensorShape(std::move(dims)));
  }
  // Uninitialized: the parts fill it (zeroing a 38 MiB image batch first
  // cost a tenth of an ImageNet pipeline's CPU).
  SLUICE_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(first.dtype(), TensorShape(std::move(dims)),
                                                       /*zeroed=*/false));
  const size_t total = out.byte_size();
  const size_t chunks = std::min<size_t>({static_cast<size_t>(std::max<int64_t>(1, parallelism)),
                                          parts.size(),
                                          std::max<size_t>(1, total / kMinParallelCopyBytes)});
  uint8_t* dst = out.mutable_data();
  std::vector<std::shared_ptr<PoolTask>> copies;
  for (size_t c = 1; c < chunks; ++c) {
    const size_t begin = parts.size() * c / chunks, end = parts.size() * (c + 1) / chunks;
    copies.push_back(std::make_shared<PoolTask>([&parts, begin, end, dst] {
      CopyParts(parts, begin, end, dst);
    }));
    Schedule(copies.back());
  }
  CopyParts(parts, 0, parts.size() / chunks, dst);
  for (auto& c : copies) c->Wait();  // runs here what no pool thread took
  return out;
}

class BatchIterator : public UnaryIterator {
 public:
  BatchIterator(AnalysisPtr a, std::unique_ptr<Iterator> in)
      : UnaryIterator(std::move(a), std::move(in)) {
    const int64_t n = node().batch().num_parallel_calls();
    parallelism_ = n == 0 ? 1 : ResolveParallelism(n);
  }
  Result Next() override {
    const auto& b = node().batch();
    std::vector<Element> batch;
    std::optional<uint64_t> key = kBatchKeySeed;
    while (static_cast<int64_t>(batch.size()) < b.batch_size()) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) break;
      key = CombineKeys(key, in_->ElementKey());
      if (!batch.empty() && e->size() != batch[0].size()) {
        return absl::InvalidArgumentError(absl::StrCat("Batch: elements have ", batch[0].size(),
                                                       " and ", e->size(), " components"));
      }
      batch.push_back(std::move(*e));
    }
    if (batch.empty() ||
        (b.drop_remainder() && static_cast<int64_t>(batch.size()) < b.batch_size())) {
      return End();
    }
    Element out;
    for (size_t c = 0; c < batch[0].size(); ++c) {
      std::vector<const Tensor*> parts;
      for (const auto& e : batch) parts.push_back(&e[c]);
      SLUICE_ASSIGN_OR_RETURN(Tensor t, Stack(parts, c, parallelism_));
      out.push_back(std::move(t));
    }
    key_ = key;
    return Some(std::move(out));
  }
  // Its elements' keys, in order, when they all have one: a batch of the
  // same elements is keyed the same wherever it was made.
  std::optional<uint64_t> ElementKey() const override { return key_; }
  // Nothing of its own between elements: its input's position.
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {});
  }

 private:
  static constexpr uint64_t kBatchKeySeed = 0xba7c4ba7c4ba7c40ull;
  int64_t parallelism_ = 1;
  std::optional<uint64_t> key_;
};

}  // namespace

extern const OpDef kBatchOp = {
    .name = "Batch",
    .inputs = &InputField<&proto::DatasetNode::batch>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_batch>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<BatchIterator>,
    .split_passing = SplitPassing::kUntracked,
};

}  // namespace sluice::internal
