// Enumerate(start): an int64 scalar counter prepended to each element.
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Enumerate"));
  a.spec.known = in->spec.known;
  a.spec.components.push_back(ScalarSpec(DType::kInt64));
  for (const auto& c : in->spec.components) a.spec.components.push_back(c);
  a.cardinality = in->cardinality;
  return absl::OkStatus();
}

class EnumerateIterator : public ForwardingIterator {
 public:
  EnumerateIterator(AnalysisPtr a, std::unique_ptr<Iterator> in)
      : ForwardingIterator(std::move(a), std::move(in)), next_(node().enumerate().start()) {}
  Result Next() override {
    SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
    if (!e) return End();
    Element out;
    out.reserve(e->size() + 1);
    out.push_back(Tensor::Scalar<int64_t>(next_++));
    for (auto& t : *e) out.push_back(std::move(t));
    return Some(std::move(out));
  }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {next_});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {&next_});
  }

 private:
  int64_t next_;
};

}  // namespace

extern const OpDef kEnumerateOp = {
    .name = "Enumerate",
    .inputs = &InputField<&proto::DatasetNode::enumerate>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_enumerate>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<EnumerateIterator>,
    .split_passing = SplitPassing::kUntracked,
};

}  // namespace sluice::internal
