// Skip(count): all but the first `count` elements (-1: none).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "sluice/dataset/ops/op.h"

namespace sluice::internal {
namespace {

absl::Status Analyze(Analysis& a, const ElementSpec*) {
  SLUICE_ASSIGN_OR_RETURN(const Analysis* in, FirstInput(a, "Skip"));
  int64_t c = a.node->skip().count();
  if (c < -1) return Invalid("Skip", absl::StrCat("count must be >= -1; got ", c));
  a.spec = in->spec;
  int64_t n = in->cardinality;
  if (c == -1) a.cardinality = n == kInfiniteCardinality ? kInfiniteCardinality : 0;
  else if (n < 0) a.cardinality = n;
  else a.cardinality = std::max<int64_t>(0, n - c);
  return absl::OkStatus();
}

class SkipIterator : public ForwardingIterator {
 public:
  using ForwardingIterator::ForwardingIterator;
  Result Next() override {
    int64_t c = node().skip().count();
    while (c == -1 || skipped_ < c) {
      SLUICE_ASSIGN_OR_RETURN(auto e, in_->Next());
      if (!e) return End();
      ++skipped_;
    }
    return in_->Next();
  }
  absl::Status SaveState(proto::IteratorState* state) const override {
    return SaveWithInput(state, {skipped_});
  }
  absl::Status RestoreState(const proto::IteratorState& state) override {
    return RestoreWithInput(state, {&skipped_});
  }

 private:
  int64_t skipped_ = 0;
};

}  // namespace

extern const OpDef kSkipOp = {
    .name = "Skip",
    .inputs = &InputField<&proto::DatasetNode::skip>,
    .mutable_inputs = &MutableInputField<&proto::DatasetNode::mutable_skip>,
    .analyze = &Analyze,
    .make_iterator = &MakeUnaryIterator<SkipIterator>,
    .split_passing = SplitPassing::kTracked,
    .counts_across_splits = true,
};

}  // namespace sluice::internal
