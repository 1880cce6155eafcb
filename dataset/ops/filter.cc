// Filter(predicate): the elements for which the predicate (one bool
// scalar) is true.
#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Filter"));
  SLUICE_ASSIGN_OR_RETURN(
      a.fn, CompiledFunction::Compile(a.node->filter().predicate(), in->spec, "Filter"));
  const ElementSpec& out = a.fn->output_spec();
  if (out.known) {
    bool ok = out.components.size() == 1 &&
              (!out.components[0].dtype || *out.components[0].dtype == DType::kBool) &&
              (!out.components[0].shape || out.components[0].shape->empty());
    if (!ok) {
      return Invalid("Filter", absl::StrCat("predicate must yield one bool scalar; it yields ",
                                            out.ToString()));
    }
  }
  a.spec = in->spec;
  a.cardinality =
      in->cardinality == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality;
  return absl::OkStatus();
}

class FilterIterator : public ForwardingIterator {
 public:
  FilterIterator(AnalysisPtr a, std::unique_ptr<Iterator> in, const IteratorContext& ctx)
      : ForwardingIterator(std::move(a), std::move(in)), seeder_(ctx, *a_) {}
  Result Next() override {
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      const uint64_t seed = a_->fn->random() ? seeder_.SeedFor(in_->ElementKey()) : 0;
      SLUICE_ASSIGN_OR_RETURN(Element keep, a_->fn->Apply(*e, seed));
      if (keep.size() != 1 || keep[0].dtype() != DType::kBool || !keep[0].shape().is_scalar()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Filter: predicate must yield one bool scalar; it yielded ", ElementDebugString(keep)));
      }
      if (keep[0].data()[0] != 0) return Some(std::move(*e));
    }
  }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {seeder_.untracked()});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {seeder_.untracked_position()});
  }

 private:
  ElementSeeder seeder_;
};

}  // namespace

extern const OpDef kFilterOp = {
    .name = "Filter",
    .inputs = &InputField<&proto::DatasetNode::filter>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_filter>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<FilterIterator>,
    .split_passing = SplitPassing::kTracked,
};

}  // namespace sluice::internal
