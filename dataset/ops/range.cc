// Range(start, stop, step): int64 scalars; a split source.
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

// Number of elements (as Python's len(range(...))); 0 for step 0.
int64_t RangeLength(const proto::DatasetNode::Range& r) {
  __int128 span = static_cast<__int128>(r.stop()) - r.start();
  if (r.step() == 0 || (r.step() > 0 && span <= 0) || (r.step() < 0 && span >= 0)) return 0;
  __int128 step = r.step();
  if (step < 0) {
    span = -span;
    step = -step;
  }
  return static_cast<int64_t>((span + step - 1) / step);
}

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  if (a.node->range().step() == 0) return Invalid("Range", "step must not be 0");
  a.spec.components = {ScalarSpec(DType::kInt64)};
  a.cardinality = RangeLength(a.node->range());
  return absl::OkStatus();
}

class RangeIterator : public NodeIterator {
 public:
  using NodeIterator::NodeIterator;
  Result Next() override {
    const auto& r = node().range();
    if (!started_) {
      cur_ = r.start();
      started_ = true;
    }
    if ((r.step() > 0 && cur_ >= r.stop()) || (r.step() < 0 && cur_ <= r.stop()) || done_) {
      return End();
    }
    int64_t v = cur_;
    if (__builtin_add_overflow(cur_, r.step(), &cur_)) done_ = true;
    key_ = SourceKey(0, position_++);
    return Some({Tensor::Scalar<int64_t>(v)});
  }
  std::optional<uint64_t> ElementKey() const override { return key_; }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveValues(state, {position_, int64_t{started_}, int64_t{done_}, cur_});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    int64_t started = 0, done = 0;
    SLUICE_RETURN_IF_ERROR(RestoreValues(state, {&position_, &started, &done, &cur_}));
    started_ = started != 0;
    done_ = done != 0;
    return absl::OkStatus();
  }

 private:
  int64_t position_ = 0;
  std::optional<uint64_t> key_;
  bool started_ = false, done_ = false;
  int64_t cur_ = 0;
};

// Splits are runs of positions; position p is start + p * step.
absl::StatusOr<SplitPositions> Positions(const proto::DatasetNode& node) {
  SplitPositions p;
  p.positions = RangeLength(node.range());
  p.multi_position_splits = true;
  return p;
}

absl::StatusOr<Element> ElementAt(const Analysis& a, const Split&, int64_t pos) {
  const auto& r = a.node->range();
  return Element{Tensor::Scalar<int64_t>(static_cast<int64_t>(
      static_cast<__int128>(r.start()) + static_cast<__int128>(pos) * r.step()))};
}

const SplitSourceTraits kSplits = {.positions = &Positions, .element_at = &ElementAt};

}  // namespace

extern const OpDef kRangeOp = {
    .name = "Range",
    .analyze = &Analyze,
    .make_iterator = &MakeSourceIterator<RangeIterator>,
    .split_source = &kSplits,
};

}  // namespace sluice::internal
